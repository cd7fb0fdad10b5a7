"""Scans along an axis of a register tile (``cumsum``/``cumprod``): the interpreter against
torch on random inputs with tails, the emulator against the interpreter on compiled kernels
(blocked tiles along either axis, 1-D tiles, wgmma accumulators), ptxas without spills, and
on a GPU the same as the interpreter.

The interpreter accumulates in float64 and rounds once; the GPU adds in f32 in its layout's
order, so a prefix of n terms may differ by about ``log2(n) * 2**-24 * sum(|x|)`` (plus one
rounding of a narrower dtype): the tolerances below are that bound, not a guess."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from device_checks import assert_refused, interpret_and_emulate, interpret_and_run_on_gpu, lowered

from tkc import dtypes
from tkc.compiler import compile_kernel
from tkc.errors import TkcTypeError, TkcUnsupportedError
from tkc.interpreter import random_args, run_kernel

# Each program scans one BM x BN block of x along AX (elements past the tensor read as 0); the
# arg reductions below store, across the block, the index along AX of each line's extreme.
BLOCK = """@kernel
def scan(x: {dt}[M, N], y: {out}[M, N], BM: const = 16, BN: const = 64, AX: const = 1):
    grid(cdiv(M, BM), cdiv(N, BN))
    i = program_id(0)
    j = program_id(1)
    t = x[i*BM:(i+1)*BM, j*BN:(j+1)*BN]
    y[i*BM:(i+1)*BM, j*BN:(j+1)*BN] = {call}
"""
# A 1-D tile; the builtin form.
ROW = """@kernel
def scan1(x: f32[N], y: f32[N], BN: const = 2048):
    grid(cdiv(N, BN))
    i = program_id(0)
    y[i*BN:(i+1)*BN] = cumsum(x[i*BN:(i+1)*BN], 0)
"""
# The scan of a product's accumulator (chunked linear attention: the running sum of q k^T).
MMA = """@kernel
def scanmm(q: bf16[M, K], k: bf16[N, K], y: f32[M, N], BM: const = 64, BN: const = 64, AX: const = 0):
    grid(cdiv(M, BM), cdiv(N, BN))
    i = program_id(0)
    j = program_id(1)
    s = q[i*BM:(i+1)*BM, 0:64] @ k[j*BN:(j+1)*BN, 0:64].T
    y[i*BM:(i+1)*BM, j*BN:(j+1)*BN] = s.cumsum(AX)
"""


def _block(dt: str = "f32", call: str = "t.cumsum(AX)", out: str | None = None) -> str:
    """``BLOCK`` storing ``call``; ``out``: y's dtype (x's by default)."""
    return BLOCK.format(dt=dt, call=call, out=out or dt)


CASES = {
    # name: (source, constants, dims)
    "rows_16x64": (_block(), {"AX": 1}, {"M": 70, "N": 100}),
    "cols_16x64": (_block(), {"AX": 0}, {"M": 70, "N": 100}),
    "rows_64x64": (_block(), {"BM": 64, "AX": 1}, {"M": 70, "N": 100}),
    "cols_64x64": (_block(), {"BM": 64, "AX": 0}, {"M": 70, "N": 100}),
    "cols_64x16": (_block(), {"BM": 64, "BN": 16, "AX": 0}, {"M": 70, "N": 40}),
    "builtin_neg_axis": (_block(call="cumsum(t, -2)"), {}, {"M": 40, "N": 70}),
    "bf16_rows": (_block("bf16"), {"AX": 1}, {"M": 33, "N": 130}),
    "f16_cols": (_block("f16"), {"BM": 64, "AX": 0}, {"M": 100, "N": 64}),
    "i32_cols": (_block("i32"), {"BM": 64, "AX": 0}, {"M": 100, "N": 80}),
    "i32_rows": (_block("i32"), {"AX": 1}, {"M": 20, "N": 80}),
    "cumprod_rows": (_block(call="(t * 0.25 + 1.0).cumprod(AX)"), {"AX": 1}, {"M": 20, "N": 100}),
    "row_2048": (ROW, {}, {"N": 3000}),
    "mma_cols": (MMA, {"AX": 0}, {"M": 100, "N": 70, "K": 64}),
    "mma_rows": (MMA, {"AX": 1}, {"M": 100, "N": 70, "K": 64}),
}


def _compile(name: str, stop: str):
    src, consts, _ = CASES[name]
    return compile_kernel(src, consts=consts, stop=stop, cache=False)


def _blocks(a: torch.Tensor, block: tuple[int, ...]) -> tuple[torch.Tensor, tuple[int, ...]]:
    """``a`` zero-padded to whole blocks and split as (n0, b0, n1, b1, ...)."""
    pad = [(-s) % b for s, b in zip(a.shape, block)]
    flat = [p for q in reversed(pad) for p in (0, q)]
    a = torch.nn.functional.pad(a, flat)
    split = [x for s, b in zip(a.shape, block) for x in (s // b, b)]
    return a.reshape(split), a.shape


def _reference(name: str, args: list) -> np.ndarray:
    """What torch computes for the case, in float64, block by block."""
    src, consts, _ = CASES[name]
    x = torch.from_numpy(np.asarray(args[0], np.float64))
    if name.startswith("mma"):
        k = torch.from_numpy(np.asarray(args[1], np.float64))
        x = x @ k.T
    if name == "row_2048":
        block, axis = (2048,), 0
    elif name.startswith("mma"):
        block, axis = (64, 64), consts["AX"]
    else:
        block = (consts.get("BM", 16), consts.get("BN", 64))
        axis = consts.get("AX", 0) % 2
    if "cumprod" in name:
        x = x * 0.25 + 1.0
    b, padded = _blocks(x, block)
    fn = torch.cumprod if "cumprod" in name else torch.cumsum
    out = fn(b, dim=2 * axis + 1).reshape(padded)
    return out[tuple(slice(0, s) for s in x.shape)].numpy()


def _bound(name: str, args: list, want: np.ndarray) -> np.ndarray:
    """How far an f32 scan in any order may be from the exact prefix, elementwise."""
    src, consts, _ = CASES[name]
    n = 2048 if name == "row_2048" else 64
    out_dt = dtypes.from_name(src.split("y: ")[1].split("[")[0])
    if out_dt.is_int:
        return np.zeros_like(want)
    mag = np.abs(_reference(name, [np.abs(np.asarray(a, np.float64)) for a in args]))
    ulp = 2.0 ** -{"f32": 23, "bf16": 7, "f16": 10}[out_dt.name]
    return (math.log2(n) + 2) * 2.0 ** -24 * mag + 2 * ulp * np.abs(want) + 1e-30


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_matches_torch(name: str, seed: int) -> None:
    kernel = _compile(name, "tkir").kernel_op
    args = random_args(kernel, CASES[name][2], seed)
    run_kernel(kernel, args)
    want = _reference(name, args)
    got = np.asarray(args[-1], np.float64)
    assert np.all(np.abs(got - want) <= _bound(name, args, want)), np.abs(got - want).max()


@pytest.mark.parametrize("name", list(CASES))
def test_emulator_matches_interpreter_without_spills(name: str) -> None:
    tile_ir, hopper = _compile(name, "tkir").kernel_op, lowered(lambda stop: _compile(name, stop)).kernel_op
    args = random_args(tile_ir, CASES[name][2], 3)
    want, got = interpret_and_emulate(tile_ir, hopper, args, 3)
    bound = _bound(name, args, np.asarray(want[-1], np.float64))
    diff = np.abs(np.asarray(got[-1], np.float64) - np.asarray(want[-1], np.float64))
    assert np.all(diff <= 2 * bound), diff.max()


@pytest.mark.parametrize("name", ["cols_64x64", "mma_rows"])
def test_hopper_ir_round_trips_and_verifies(name: str) -> None:
    from tkc.ir.parser import parse_module
    from tkc.ir.printer import print_module
    from tkc.ir.verifier import verify

    text = print_module(parse_module(_compile(name, "hopper").asm["hopper"]))
    assert "hopper.scan" in text
    again = parse_module(text)
    verify(again)
    assert print_module(again) == text


def test_integer_scans_wrap() -> None:
    kernel = _compile("i32_rows", "tkir").kernel_op
    x = np.full((20, 80), 2**30, np.int32)
    y = np.zeros_like(x)
    run_kernel(kernel, [x, y])
    want = (np.cumsum(x.astype(np.int64), axis=1) % 2**32).astype(np.uint32).view(np.int32)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("src, message", [
    ("t.to(bool).cumsum(1)", "cumsum() of a bool tile; cast it with .to(i32)"),
    ("t.cumsum(2)", "axis 2 is out of range"),
    ("t.cumsum(AXIS)", "must be a compile-time integer constant"),
    ("cumsum(1.0, 0)", "cumsum() needs a tile"),
    ("t.cumsum()", "missing the argument 'axis'"),
])
def test_errors_name_the_call(src: str, message: str) -> None:
    assert_refused(_block(call=src.replace("AXIS", "j")), TkcTypeError, re.escape(message), 7, stop="tkir")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_on_gpu_as_in_the_interpreter(name: str) -> None:
    args, want, got = interpret_and_run_on_gpu(lambda stop: _compile(name, stop), CASES[name][2])
    bound = _bound(name, args, np.asarray(want[-1], np.float64))
    assert np.all(np.abs(got[-1] - np.asarray(want[-1], np.float64)) <= 2 * bound)


# ---------------------------------------------------------------- argmax / argmin
# A 1-D tile reduced to one index per program (kept as a 1-element tile).
ARG1 = """@kernel
def arg1(x: f32[N], y: i32[B], BN: const = 256):
    grid(cdiv(N, BN))
    i = program_id(0)
    y[i:i+1] = argmin(x[i*BN:(i+1)*BN], 0, keepdim=True)
"""
ARG_CASES = {
    # name: (source, constants, dims, kind, axis)
    "argmax_rows": (_block("f32", "t.argmax(AX, keepdim=True)", "i32"), {"AX": 1}, {"M": 70, "N": 100},
                    "argmax", 1),
    "argmax_cols_64": (_block("f32", "t.argmax(AX, keepdim=True)", "i32"), {"BM": 64, "AX": 0},
                       {"M": 70, "N": 100}, "argmax", 0),
    "argmin_rows_bf16": (_block("bf16", "argmin(t, 1, keepdim=True)", "i32"), {}, {"M": 40, "N": 130},
                         "argmin", 1),
    "argmin_cols_i32": (_block("i32", "t.argmin(0, keepdim=True)", "i32"), {"BM": 64},
                        {"M": 100, "N": 64}, "argmin", 0),
    "argmin_1d": (ARG1, {}, {"N": 1000, "B": 4}, "argmin", 0),
    # one-row tiles (softmax.tk's BM = 1): along the row, and across the one row (index 0)
    "argmax_one_row": (_block("f32", "t.argmax(AX, keepdim=True)", "i32"), {"BM": 1, "AX": 1},
                       {"M": 5, "N": 100}, "argmax", 1),
    "argmin_across_one_row": (_block("f32", "t.argmin(AX, keepdim=True)", "i32"), {"BM": 1, "AX": 0},
                              {"M": 5, "N": 100}, "argmin", 0),
}


def _arg_compile(name: str, stop: str):
    src, consts, *_ = ARG_CASES[name]
    return compile_kernel(src, consts=consts, stop=stop, cache=False)


def _arg_args(name: str, seed: int) -> list:
    """Random inputs with ties (values on a coarse grid) and NaNs in some lines."""
    kernel = _arg_compile(name, "tkir").kernel_op
    args = random_args(kernel, ARG_CASES[name][2], seed, int_range=(-3, 3))
    x = args[0]
    if x.dtype.kind == "f":
        rng = np.random.default_rng(seed)
        x[...] = np.round(x * 2) / 2
        x[rng.random(x.shape) < 0.01] = np.nan
    return args


def _arg_reference(name: str, x: np.ndarray) -> np.ndarray:
    src, consts, dims, kind, axis = ARG_CASES[name]
    fn = torch.argmax if kind == "argmax" else torch.argmin
    t = torch.from_numpy(np.asarray(x, np.float64))
    if name == "argmin_1d":
        b, _ = _blocks(t, (256,))
        return fn(b, dim=1).numpy()
    block = (consts.get("BM", 16), consts.get("BN", 64))
    b, padded = _blocks(t, block)
    idx = fn(b, dim=2 * axis + 1, keepdim=True).expand(b.shape).reshape(padded)
    return idx[tuple(slice(0, s) for s in t.shape)].numpy()


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(ARG_CASES))
def test_arg_reductions_match_torch(name: str, seed: int) -> None:
    args = _arg_args(name, seed)
    run_kernel(_arg_compile(name, "tkir").kernel_op, args)
    np.testing.assert_array_equal(args[1], _arg_reference(name, args[0]))


@pytest.mark.parametrize("name", list(ARG_CASES))
def test_arg_reductions_emulator_matches_interpreter_without_spills(name: str) -> None:
    hopper = lowered(lambda stop: _arg_compile(name, stop)).kernel_op
    want, got = interpret_and_emulate(_arg_compile(name, "tkir").kernel_op, hopper, _arg_args(name, 4), 4)
    np.testing.assert_array_equal(got[1], want[1])


def test_an_argmax_left_for_lower_to_hopper_names_the_missing_pass() -> None:
    assert_refused(_block("f32", "t.argmax(AX, keepdim=True)", "i32"), TkcUnsupportedError,
                   "an argmax reaches lower-to-hopper: is the decompose pass in the pipeline before it", 7,
                   stop="hopper", hopper_pipeline="select-layouts,lower-to-hopper")


def test_argmax_of_bool_is_refused_in_the_language() -> None:
    assert_refused(_block("f32", "(t > 0.0).argmax(1, keepdim=True)", "i32"), TkcTypeError,
                   r"argmax\(\) of a bool tile; cast it with .to\(i32\)", 7, stop="tkir")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ARG_CASES))
def test_arg_reductions_on_gpu_as_in_the_interpreter(name: str) -> None:
    _, want, got = interpret_and_run_on_gpu(lambda stop: _arg_compile(name, stop), _arg_args(name, 6))
    np.testing.assert_array_equal(got[1], want[1])


# A scan of a reduction's result (a #slice layout with replicated lanes) and the argmax of a
# product's accumulator (#wgmma_acc), in one kernel.
MIXED = """@kernel
def mixed(x: f32[M, N], w: bf16[M, N], y: f32[M], z: i32[M], BM: const = 64):
    grid(cdiv(M, BM))
    i = program_id(0)
    t = x[i*BM:(i+1)*BM, 0:64]
    y[i*BM:(i+1)*BM] = t.sum(1).cumsum(0)
    acc = w[i*BM:(i+1)*BM, 0:64] @ w[i*BM:(i+1)*BM, 0:64].T
    z[i*BM:(i+1)*BM] = acc.argmax(1)
"""


def test_scan_of_a_reduction_and_argmax_of_a_product() -> None:
    def compile_to(stop: str):
        return compile_kernel(MIXED, stop=stop, cache=False)

    tile_ir = compile_to("tkir").kernel_op
    args = random_args(tile_ir, {"M": 100, "N": 64}, 0)
    want, got = interpret_and_emulate(tile_ir, lowered(compile_to).kernel_op, args, 0)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[3], want[3])
    x = np.asarray(args[0], np.float64)[:, :64]
    blocks = np.zeros((128, 64))
    blocks[:100] = x
    ref = np.cumsum(blocks.sum(1).reshape(2, 64), axis=1).reshape(-1)[:100]
    np.testing.assert_allclose(want[2], ref, rtol=1e-5, atol=1e-4)


# Both in the epilogue of a warp-specialized GEMM: two consumer warpgroups (the scan's warp
# steps cross them) beside a producer.
GEMM = """@kernel
def gemm_scan(a: bf16[M, K], b: bf16[K, N], c: f32[M, N], BM: const = 128, BN: const = 64, BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    i = program_id(0)
    j = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        acc += a[i*BM:(i+1)*BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, j*BN:(j+1)*BN]
    c[i*BM:(i+1)*BM, j*BN:(j+1)*BN] = acc.cumsum(0) + acc.argmax(1, keepdim=True).to(f32)
"""


def test_in_a_warp_specialized_gemm() -> None:
    def compile_to(stop: str):
        return compile_kernel(GEMM, stop=stop, cache=False)

    hopper = lowered(compile_to)
    assert hopper.asm["hopper"].count("hopper.role") == 2
    tile_ir = compile_to("tkir").kernel_op
    args = random_args(tile_ir, {"M": 200, "N": 104, "K": 152}, 0)
    want, got = interpret_and_emulate(tile_ir, hopper.kernel_op, args, 0)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=2e-4)


def test_a_scan_over_a_warp_count_that_is_no_power_of_two_is_refused_in_words() -> None:
    src = GEMM.replace("BM: const = 128", "BM: const = 192").replace(
        " + acc.argmax(1, keepdim=True).to(f32)", "")
    assert_refused(src, TkcUnsupportedError, r"cumsum\(\) along axis 0 of this 192x64 f32 tile cannot be computed by "
                   r"this program's 384 threads: .* power-of-two number of warps", 9, stop="hopper")
