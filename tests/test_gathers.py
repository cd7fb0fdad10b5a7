"""Tiles gathered by a tile of indices (``x[idx, c:c+D]``): rows, columns and a squeezed
batch axis, with indices before, inside and past the tensor, against numpy in the
interpreter, the emulator against the interpreter, ptxas without spills, the GPU against
the interpreter; a gather where the language has none is a located error."""

from __future__ import annotations

import numpy as np
import pytest

from device_checks import assert_no_spills, assert_refused, interpret_and_run_on_gpu, needs_ptxas
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.errors import TkcError
from tkc.interpreter import random_args, run_kernel

# Rows of x picked by ids, times 2 (f32: runs of 4), BB ids a program.
ROWS = """@kernel
def rows(x: f32[M, N], ids: i32[B], y: f32[B, N], BB: const = 32, BN: const = 64):
    grid(cdiv(B, BB), cdiv(N, BN))
    pb = program_id(0)
    pn = program_id(1)
    idx = ids[pb*BB:(pb+1)*BB]
    y[pb*BB:(pb+1)*BB, pn*BN:(pn+1)*BN] = x[idx, pn*BN:(pn+1)*BN] * 2.0
"""
# Pages of a bf16 cache: batch b's rows picked by its block table row (a squeezed axis, runs
# of 8), summed over the picked rows.
PAGES = """@kernel
def pages(cache: bf16[H, P, D], table: i32[H, T], out: f32[H, D], BT: const = 16):
    grid(H)
    h = program_id(0)
    rows = load(cache[h, table[h, 0:BT], 0:64], other=1.0).to(f32)
    out[h, 0:64] = rows.sum(0)
"""
# Columns picked by an index tile (the gathered axis is the last one: one access per value).
COLS = """@kernel
def cols(x: f32[M, N], perm: i32[N], y: f32[M, N], BM: const = 16, BN: const = 32):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    y[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = x[pm*BM:(pm+1)*BM, perm[pn*BN:(pn+1)*BN]]
"""
CASES = {
    "rows": (ROWS, {"M": 40, "N": 150, "B": 70}, (-2, 44)),
    "pages": (PAGES, {"H": 3, "P": 50, "D": 64, "T": 16}, (-1, 51)),
    "cols": (COLS, {"M": 30, "N": 100}, (-3, 102)),
}


def _reference(name: str, args: list) -> np.ndarray:
    if name == "rows":
        x, ids, _ = args
        ok = (ids >= 0) & (ids < x.shape[0])
        return np.where(ok[:, None], 2 * x[np.clip(ids, 0, x.shape[0] - 1)], 0)
    if name == "pages":
        cache, table, _ = args
        ok = (table >= 0) & (table < cache.shape[1])
        picked = cache[np.arange(cache.shape[0])[:, None], np.clip(table, 0, cache.shape[1] - 1)]
        return np.where(ok[:, :, None], picked.astype(np.float64), 1.0).sum(1)
    x, perm, _ = args
    ok = (perm >= 0) & (perm < x.shape[1])
    return np.where(ok[None, :], x[:, np.clip(perm, 0, x.shape[1] - 1)], 0)


def _args(name: str, seed: int) -> list:
    src, dims, int_range = CASES[name]
    return random_args(compile_kernel(src, stop="tkir", cache=False).kernel_op, dims, seed, int_range)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_matches_numpy(name: str, seed: int) -> None:
    args = _args(name, seed)
    run_kernel(compile_kernel(CASES[name][0], stop="tkir", cache=False).kernel_op, args)
    np.testing.assert_allclose(args[2], _reference(name, args), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CASES))
def test_emulator_matches_interpreter(name: str, seed: int) -> None:
    want, got = _args(name, seed), _args(name, seed)
    run_kernel(compile_kernel(CASES[name][0], stop="tkir", cache=False).kernel_op, want)
    emulate(compile_kernel(CASES[name][0], stop="hopper", cache=False).kernel_op, got, seed=seed)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-6, atol=1e-5)


def test_runs_of_a_gathered_row_are_vector_loads() -> None:
    ptx = compile_kernel(PAGES, stop="ptx", cache=False).asm["ptx"]
    assert "ld.global.v4.b32" in ptx  # 8 bf16 of a picked row at once


@needs_ptxas
@pytest.mark.parametrize("name", list(CASES))
def test_assembles_without_spills(name: str) -> None:
    assert_no_spills(compile_kernel(CASES[name][0], stop="cubin", cache=False))


@pytest.mark.parametrize("body, message", [
    ("y[idx, 0:16] = x[0:16, 0:16]", r"storing through a tile of indices \(a scatter\) is not supported"),
    ("atomic_add(y[idx, 0:16], x[0:16, 0:16])", r"atomic_add\(\) through a tile of indices"),
    ("t = x[idx, idx]", r"one axis of a tensor may be indexed by a tile"),
    ("t = x[idx.to(f32), 0:16]", r"a tensor index must be an i32 or i64 scalar or a 1-D i32 tile"),
])
def test_misuse_is_a_located_error(body: str, message: str) -> None:
    src = ("@kernel\ndef k(x: f32[M, N], ids: i32[M], y: f32[M, N]):\n    grid(1)\n    idx = ids[0:16]\n"
           f"    {body}\n")
    assert_refused(src, TkcError, message, 5, stop="tkir")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_on_gpu_as_in_the_interpreter(name: str) -> None:
    _, want, got = interpret_and_run_on_gpu(lambda stop: compile_kernel(CASES[name][0], stop=stop, cache=False),
                                            _args(name, 5))
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-4)
