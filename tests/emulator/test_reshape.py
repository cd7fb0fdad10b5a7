"""``x.reshape(shape)`` of a register tile (row-major, like torch and numpy): the interpreter
against numpy on random inputs with tails, the emulator against the interpreter on compiled
kernels (blocked tiles, a wgmma accumulator, a reduction's result), ptxas without spills, and
on a GPU the same as the interpreter.  On sm_90a a reshape moves no value: a reshape that
would is refused at its line, in the language's words."""

from __future__ import annotations

import numpy as np
import pytest
from device_checks import assert_refused, interpret_and_emulate, interpret_and_run_on_gpu, lowered

from tkc.compiler import compile_kernel
from tkc.errors import TkcTypeError, TkcUnsupportedError
from tkc.interpreter import random_args, run_kernel

# A BR x BC block of x, reshaped to OUT_R x OUT_C, stored at block i of y (y's rows of OUT_C).
BLOCK = """@kernel
def rs(x: {dt}[M, N], y: {dt}[P, Q], BR: const = 32, BC: const = 64, OR: const = 64, OC: const = 32):
    grid(cdiv(M, BR))
    i = program_id(0)
    t = x[i*BR:(i+1)*BR, 0:BC]
    y[i*OR:(i+1)*OR, 0:OC] = {call}
"""
# Flattened into a 1-D tensor.
FLAT = """@kernel
def flat(x: f32[M, N], z: f32[T], BR: const = 64, BC: const = 32):
    grid(cdiv(M, BR))
    i = program_id(0)
    z[i*BR*BC:(i+1)*BR*BC] = x[i*BR:(i+1)*BR, 0:BC].reshape(BR * BC)
"""
# A product's accumulator, and a reduction's result, reshaped.
MMA = """@kernel
def mm(a: bf16[M, K], b: bf16[K, N], y: f32[P, Q], s: f32[R, C]):
    grid(cdiv(M, 64))
    i = program_id(0)
    acc = a[i*64:(i+1)*64, 0:64] @ b[0:64, 0:64]
    y[i*32:(i+1)*32, 0:128] = acc.reshape([32, 128])
    s[i*64:(i+1)*64, 0:1] = acc.sum(1).reshape(64, 1)
"""


def _block_ref(x: np.ndarray, br: int, bc: int, out: tuple[int, int], rows: int) -> np.ndarray:
    """Each zero-padded BR x BC block of x's first BC columns, reshaped, stacked."""
    n = -(-x.shape[0] // br)
    pad = np.zeros((n * br, bc))
    pad[:x.shape[0]] = x[:, :bc]
    return pad.reshape(n, br * bc).reshape(n * out[0], out[1])[:rows]


CASES = {
    # name: (source, constants, dims, reference(args) -> outputs from the second argument on)
    "rows_32x64_to_64x32": (BLOCK.format(dt="f32", call="t.reshape([OR, OC]) * 2.0"), {},
                            {"M": 70, "N": 64, "P": 140, "Q": 32},
                            lambda a: [2 * _block_ref(a[0], 32, 64, (64, 32), 140)]),
    "bf16_64x64_to_16x256": (BLOCK.format(dt="bf16", call="t.reshape(OR, OC)"),
                             {"BR": 64, "BC": 64, "OR": 16, "OC": 256}, {"M": 100, "N": 64, "P": 25, "Q": 256},
                             lambda a: [_block_ref(a[0], 64, 64, (16, 256), 25)]),
    "i32_16x64_to_64x16": (BLOCK.format(dt="i32", call="t.reshape([OR, OC]) + 1"),
                           {"BR": 16, "BC": 64, "OR": 64, "OC": 16}, {"M": 40, "N": 64, "P": 160, "Q": 16},
                           lambda a: [_block_ref(a[0], 16, 64, (64, 16), 160) + 1]),
    "48x64_flat": (FLAT, {"BR": 48, "BC": 64}, {"M": 100, "N": 64, "T": 100 * 64},
                   lambda a: [_block_ref(a[0], 48, 64, (48 * 64, 1), 100 * 64)[:, 0]]),
    "flat_64x32": (FLAT, {}, {"M": 130, "N": 32, "T": 130 * 32},
                   lambda a: [_block_ref(a[0], 64, 32, (64 * 32, 1), 130 * 32)[:, 0]]),
    "mma_acc": (MMA, {}, {"M": 100, "K": 64, "N": 64, "P": 50, "Q": 128, "R": 100, "C": 1},
                lambda a: [_block_ref(a[0] @ a[1], 64, 64, (32, 128), 50),
                           _block_ref((a[0] @ a[1]).sum(1, keepdims=True), 64, 1, (64, 1), 100)]),
}


def _compile(name: str, stop: str):
    src, consts, *_ = CASES[name]
    return compile_kernel(src, consts=consts, stop=stop, cache=False)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_matches_numpy(name: str, seed: int) -> None:
    kernel = _compile(name, "tkir").kernel_op
    args = random_args(kernel, CASES[name][2], seed)
    ins = [np.asarray(a, np.float64) for a in args]
    run_kernel(kernel, args)
    tol = 1e-3 if name == "mma_acc" else 0
    for got, want in zip(args[-len(CASES[name][3](ins)):], CASES[name][3](ins)):
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(CASES))
def test_emulator_matches_interpreter_without_spills(name: str) -> None:
    tile_ir = _compile(name, "tkir").kernel_op
    want, got = interpret_and_emulate(tile_ir, lowered(lambda stop: _compile(name, stop)).kernel_op,
                                      random_args(tile_ir, CASES[name][2], 2), 2)
    tol = 1e-5 if name == "mma_acc" else 0  # wgmma adds the products in another order
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def test_reshapes_move_no_value() -> None:
    text = _compile("mma_acc", "hopper").asm["hopper"]
    assert "#reshape<#wgmma_acc<64>, 32x128>" in text and "hopper.convert_layout" not in text


def test_a_reshape_that_would_move_values_is_refused_at_its_line() -> None:
    assert_refused(BLOCK.format(dt="f32", call="t.reshape([OR, OC])"), TkcUnsupportedError,
                   r"cannot reshape this 48x64 f32 tile to 64x48 in registers.*flattening to one axis always works", 6,
                   consts={"BR": 48, "BC": 64, "OR": 64, "OC": 48}, stop="hopper")


@pytest.mark.parametrize("call, message", [
    ("t.reshape([64, 64])", r"cannot reshape tile<32x64xf32> \(2048 elements\) to \[64, 64\] \(4096 elements\)"),
    ("t.reshape([2048, 1]).reshape([OR, OC])", None),
    ("t.reshape([64, 24])", "extent 24 on axis 1 is not 1, 2, 4, 8 or a multiple of 16"),
    ("t.reshape(n)", "a tile extent must be a compile-time integer constant"),
])
def test_bad_shapes_are_located(call: str, message: str | None) -> None:
    src = BLOCK.format(dt="f32", call=call).replace("t = x", "n = i\n    t = x")
    if message is None:  # fine in the language: checked here so that the cases above are the errors
        compile_kernel(src, stop="tkir", cache=False)
        return
    assert_refused(src, TkcTypeError, message, 7, stop="tkir")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_on_gpu_as_in_the_interpreter(name: str) -> None:
    _, want, got = interpret_and_run_on_gpu(lambda stop: _compile(name, stop), CASES[name][2])
    tol = 1e-3 if name == "mma_acc" else 0
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, np.asarray(w, np.float64), rtol=tol, atol=tol)
