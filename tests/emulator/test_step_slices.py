"""Slices with a step on tensor loads and stores (``x[r:r+BM, 0:D:2]``, the even columns of
interleaved RoPE): the interpreter against numpy's strided slices on random inputs with tails
(runtime sizes, odd phases, offsets before the tensor), the emulator against the interpreter,
ptxas without spills, and on a GPU the same as the interpreter.  They are read and written
thread by thread (not TMA), so a stepped ``@`` operand goes through registers to shared memory."""

from __future__ import annotations

import numpy as np
import pytest
from device_checks import assert_refused, interpret_and_emulate, interpret_and_run_on_gpu, lowered

from tkc.compiler import compile_kernel
from tkc.errors import TkcTypeError
from tkc.interpreter import random_args, run_kernel

# Interleaved RoPE on pairs (x[2k], x[2k+1]), loads and stores with a step of 2.
ROPE = """@kernel
def rope(x: {dt}[M, D], c: {dt}[M, H], s: {dt}[M, H], y: {dt}[M, D], BM: const = 16, D: const = 64,
         H: const = 32):
    grid(cdiv(M, BM))
    i = program_id(0)
    r = i * BM
    ev = x[r:r+BM, 0:D:2]
    od = x[r:r+BM, 1:D:2]
    cc = c[r:r+BM, 0:H]
    ss = s[r:r+BM, 0:H]
    y[r:r+BM, 0:D:2] = ev * cc - od * ss
    y[r:r+BM, 1:D:2] = ev * ss + od * cc
"""
# Every STEP-th column from an odd phase, over a runtime width (tails on both axes).
COLS = """@kernel
def cols(x: f32[M, N], y: f32[M, W], BM: const = 16, BN: const = 64, STEP: const = 2):
    grid(cdiv(M, BM), cdiv(W, BN))
    i = program_id(0)
    j = program_id(1)
    y[i*BM:(i+1)*BM, j*BN:(j+1)*BN] = x[i*BM:(i+1)*BM, j*STEP*BN+1:(j+1)*STEP*BN+1:STEP]
"""
# Every other row, starting 3 rows before the block (offsets before the tensor: floor phases).
ROWS = """@kernel
def rows(x: f32[M, N], y: f32[R, N], BM: const = 16, BN: const = 64):
    grid(cdiv(R, BM), cdiv(N, BN))
    i = program_id(0)
    j = program_id(1)
    r = 2 * i * BM - 3
    y[i*BM:(i+1)*BM, j*BN:(j+1)*BN] = x[r:r+2*BM:2, j*BN:(j+1)*BN]
"""
# The even columns of a as the A operand of a product (read thread by thread, then staged).
MMA = """@kernel
def mm(a: bf16[M, K2], b: bf16[K, N], c: f32[M, N], BM: const = 64, BN: const = 64, BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    i = program_id(0)
    j = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        acc += a[i*BM:(i+1)*BM, 2*k*BK:2*(k+1)*BK:2] @ b[k*BK:(k+1)*BK, j*BN:(j+1)*BN]
    c[i*BM:(i+1)*BM, j*BN:(j+1)*BN] = acc
"""


def _rope_ref(x, c, s):
    y = np.empty_like(x)
    ev, od = x[:, 0::2], x[:, 1::2]
    y[:, 0::2], y[:, 1::2] = ev * c - od * s, ev * s + od * c
    return y


def _cols_ref(x, step, w):
    out = np.zeros((x.shape[0], w), np.float64)
    picked = x[:, 1::step][:, :w]
    out[:, :picked.shape[1]] = picked
    return out


def _rows_ref(x, r, bm=16):
    out = np.zeros((r, x.shape[1]), np.float64)
    for i in range(r):
        src = 2 * (i // bm) * bm - 3 + 2 * (i % bm)
        if 0 <= src < x.shape[0]:
            out[i] = x[src]
    return out


def _mm_ref(a, b):
    k = b.shape[0]
    even = np.zeros((a.shape[0], k), np.float64)
    part = a[:, 0::2][:, :k]
    even[:, :part.shape[1]] = part
    return even @ b


CASES = {
    # name: (source, constants, dims, reference(args) -> expected last output)
    "rope_f32": (ROPE.format(dt="f32"), {}, {"M": 70}, lambda a: _rope_ref(*a[:3])),
    "rope_bf16": (ROPE.format(dt="bf16"), {"BM": 64}, {"M": 100}, lambda a: _rope_ref(*a[:3])),
    "cols_step2": (COLS, {}, {"M": 40, "N": 150, "W": 90}, lambda a: _cols_ref(a[0], 2, 90)),
    "cols_step3": (COLS, {"STEP": 3}, {"M": 40, "N": 200, "W": 80}, lambda a: _cols_ref(a[0], 3, 80)),
    "rows_from_before": (ROWS, {}, {"M": 60, "N": 100, "R": 40}, lambda a: _rows_ref(a[0], 40)),
    "mma_operand": (MMA, {}, {"M": 70, "K2": 260, "K": 130, "N": 72}, lambda a: _mm_ref(a[0], a[1])),
}


def _compile(name: str, stop: str):
    src, consts, *_ = CASES[name]
    return compile_kernel(src, consts=consts, stop=stop, cache=False)


def _tol(name: str) -> float:
    return 3e-2 if "bf16" in name or "mma" in name else 1e-5


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_matches_numpy_slices(name: str, seed: int) -> None:
    args = random_args(_compile(name, "tkir").kernel_op, CASES[name][2], seed)
    ins = [np.asarray(a, np.float64) for a in args]
    run_kernel(_compile(name, "tkir").kernel_op, args)
    want = CASES[name][3](ins)
    np.testing.assert_allclose(np.asarray(args[-1], np.float64), want, rtol=_tol(name), atol=_tol(name))


@pytest.mark.parametrize("name", list(CASES))
def test_emulator_matches_interpreter_without_spills(name: str) -> None:
    tile_ir = _compile(name, "tkir").kernel_op
    want, got = interpret_and_emulate(tile_ir, lowered(lambda stop: _compile(name, stop)).kernel_op,
                                      random_args(tile_ir, CASES[name][2], 2), 2)
    tol = 1e-4 if "mma" in name else 1e-6  # wgmma adds the products in another order
    np.testing.assert_allclose(got[-1], want[-1], rtol=tol, atol=tol)


def test_a_stepped_load_is_read_by_threads_not_tma() -> None:
    text = _compile("mma_operand", "hopper").asm["hopper"]
    assert "steps = [1, 2]" in text and "hopper.to_smem" not in text  # lowered: stored by threads
    assert "tma_maps = [[1, " in text  # a tensor map for b (parameter 1) only


@pytest.mark.parametrize("index, message", [
    ("0:D:0", "slice step on axis 1 must be a positive compile-time integer, got the constant 0"),
    ("0:D:i", "slice step on axis 1 must be a positive compile-time integer, got a scalar i32"),
    ("0:D:3", "extent 22 on axis 1 is not 1, 2, 4, 8 or a multiple of 16"),
])
def test_bad_steps_are_located(index: str, message: str) -> None:
    src = CASES["rope_f32"][0].replace("ev = x[r:r+BM, 0:D:2]", f"ev = x[r:r+BM, {index}]")
    assert_refused(src, TkcTypeError, message, 7, stop="tkir")


def test_a_register_tiles_step_keeps_whole_groups_of_16() -> None:
    """A step on a register tile picks registers (tests/emulator/test_tile_slices.py); one that
    would leave a tile of fewer than 16 elements on the axis is refused at the slice."""
    src = CASES["rope_f32"][0].replace("ev = x[r:r+BM, 0:D:2]", "ev = x[r:r+BM, 0:D:2][:, ::4]")
    assert_refused(src, TkcTypeError, "a slice of a tile keeps a multiple of 16 elements of an axis, got 8", 7,
                   stop="tkir")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_on_gpu_as_in_the_interpreter(name: str) -> None:
    _, want, got = interpret_and_run_on_gpu(lambda stop: _compile(name, stop), CASES[name][2])
    # bf16 outputs: the GPU may contract x * c - y * s into an fma, one bf16 ulp off the interpreter
    tol = 1e-3 if "mma" in name else 1e-2 if "bf16" in name else 1e-5
    np.testing.assert_allclose(got[-1], np.asarray(want[-1], np.float64), rtol=tol, atol=tol)
