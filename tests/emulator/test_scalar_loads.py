"""A scalar read from a tensor at runtime indices (``n = lens[b]``, or ``lens[b]`` written in place)
as a slice offset, a loop bound and a condition, in a kernel without products and in a warp-specialized GEMM: the
interpreter and the emulator agree, ptxas takes it, and on a GPU it matches the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from device_checks import require_gpu, assert_no_spills, run_on_gpu, needs_ptxas
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.interpreter import random_args, run_kernel

# A row of x picked by an index (an index past the end reads as zeros).
GATHER = """@kernel
def rows(x: f32[M, N], ids: i32[B], y: f32[B, N], BN: const = 64):
    grid(B)
    b = program_id(0)
    n = ids[b]
    for j in range(cdiv(N, BN)):
        y[b:b+1, j*BN:(j+1)*BN] = x[n:n+1, j*BN:(j+1)*BN] * 2.0
"""
# The first lens[b] columns of row b summed block by block; a row of length 0 stores nothing.
SEGMENT = """@kernel
def seg(x: f32[M, N], lens: i32[B], y: f32[B, N], BN: const = 64):
    grid(B)
    b = program_id(0)
    n = lens[b]
    acc = zeros([BN], f32)
    for j in range(cdiv(n, BN)):
        acc += x[b, j*BN:(j+1)*BN]
    if n > 0:
        y[b, 0:BN] = acc
"""
# A GEMM whose K loop runs to a length read from a tensor (producer and consumer warpgroups
# both read it).
GEMM_K = """@kernel
def gemmk(a: bf16[M, K], b: bf16[K, N], c: bf16[M, N], ks: i32[S], BM: const = 128, BN: const = 128,
          BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    kk = ks[0]
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(kk, BK)):
        acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc.to(bf16)
"""
# The element read written straight into range() and an index (not first bound to a name).
INLINE = """@kernel
def inline(x: f32[M, N], lens: i32[B], ids: i32[B], y: f32[B, N], BN: const = 64):
    grid(B)
    b = program_id(0)
    acc = zeros([BN], f32)
    for j in range(0, lens[b], 16):
        acc += x[ids[b], 0:BN]
    y[b, 0:BN] = acc
    for j in range(lens[b] // BN):
        y[b, j*BN:(j+1)*BN] = x[ids[b], j*BN:(j+1)*BN] + y[b, j*BN:(j+1)*BN]
"""
CASES = {
    "gather": (GATHER, {"M": 40, "N": 150, "B": 7}, (-2, 45)),   # indices before, past and inside x
    "segment": (SEGMENT, {"M": 5, "N": 150, "B": 5}, (0, 150)),  # lengths 0 (nothing stored) to N
    "gemm_k": (GEMM_K, {"M": 130, "N": 136, "K": 200, "S": 1}, (1, 200)),
    "inline": (INLINE, {"M": 160, "N": 150, "B": 5}, (0, 150)),
}


def _both(src: str, dims: dict, int_range: tuple[int, int], seed: int) -> tuple[list, list]:
    tile_ir = compile_kernel(src, stop="tkir", cache=False).kernel_op
    hopper = compile_kernel(src, stop="hopper", cache=False).kernel_op
    args = random_args(tile_ir, dims, seed, int_range)
    want = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_kernel(tile_ir, want)
    emulate(hopper, got, seed=seed)
    return want, got


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_and_emulator_agree(name: str, seed: int) -> None:
    src, dims, int_range = CASES[name]
    want, got = _both(src, dims, int_range, seed)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_the_gathered_rows_are_the_indexed_ones() -> None:
    src, dims, _ = CASES["gather"]
    tile_ir = compile_kernel(src, stop="tkir", cache=False).kernel_op
    x = np.arange(40 * 150, dtype=np.float32).reshape(40, 150)
    ids = np.array([3, -1, 39, 40, 0, 7, 1000], np.int32)
    y = np.full((7, 150), np.nan, np.float32)
    run_kernel(tile_ir, [x, ids, y])
    want = np.where(((ids >= 0) & (ids < 40))[:, None], 2 * x[np.clip(ids, 0, 39)], 0)
    np.testing.assert_array_equal(y, want)


@needs_ptxas
@pytest.mark.parametrize("name", list(CASES))
def test_assembles_without_spills(name: str) -> None:
    assert_no_spills(compile_kernel(CASES[name][0], stop="cubin", cache=False))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_on_gpu_as_in_the_interpreter(name: str) -> None:
    require_gpu()
    src, dims, int_range = CASES[name]
    c = compile_kernel(src, cache=False)
    args = random_args(c.kernel_op, dims, 5, int_range)
    want = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_kernel(compile_kernel(src, stop="tkir", cache=False).kernel_op, want)
    params = c.kernel_op.regions[0].block.args
    for w, g, p in zip(want, run_on_gpu(c, args), params):
        if isinstance(w, np.ndarray):
            np.testing.assert_allclose(g, np.asarray(w, np.float32), rtol=2e-2, atol=2e-2, err_msg=p.name_hint)
