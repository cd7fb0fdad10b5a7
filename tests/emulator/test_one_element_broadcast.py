"""A one-element 1-D tile broadcast to a row (``o[0:BN] = v[r:r+1] + ...``, an atomic of a
row by a one-element tile, ``maximum`` of a [16] tile and a row's max): every thread holds the
element, so each value of the row copies it.  A rank-1 tile has no keep slice to broadcast from;
select-layouts once refused these with a Python error.  The interpreter and the emulator agree,
ptxas takes them on both targets, and on a GPU they match the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from device_checks import HAVE_PTXAS, interpret_and_emulate, interpret_and_run_on_gpu
from tkc.compiler import compile_kernel
from tkc.interpreter import random_args

ATOMIC = """@kernel
def k(v: f32[M], o: f32[N], BN: const = 64):
    grid(M)
    r = program_id(0)
    atomic_add(o[0:BN], v[r:r+1])
"""
MIXED = """@kernel
def k(v: f32[M], x: bf16[M, N], o: f32[N], y: f32[N], z: bf16[N], BN: const = 256):
    grid(1)
    o[0:BN] = v[0:1] + zeros([BN], f32)
    acc = zeros([16], f32)
    y[0:16] = maximum(acc, x[0:1, 0:BN].to(f32).max(1))
    z[0:BN] = (x[1:2, 0:BN].to(f32).sum(1) * ones([BN], f32)).to(bf16)
"""
CASES = {"atomic": (ATOMIC, (1,)), "mixed": (MIXED, (2, 3, 4))}
DIMS = {"M": 3, "N": 200}


@pytest.mark.parametrize("name", list(CASES))
def test_the_emulator_agrees_with_the_interpreter(name: str) -> None:
    src, outs = CASES[name]
    tile_ir = compile_kernel(src, stop="tkir", cache=False).kernel_op
    hopper = compile_kernel(src, stop="hopper", cache=False).kernel_op
    want, got = interpret_and_emulate(tile_ir, hopper, random_args(tile_ir, DIMS, 2), seed=0)
    for i in outs:
        np.testing.assert_allclose(np.asarray(got[i], np.float64), np.asarray(want[i], np.float64), rtol=1e-6)


@pytest.mark.skipif(not HAVE_PTXAS, reason="needs ptxas")
@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("name", list(CASES))
def test_ptxas_takes_it(name: str, target: str) -> None:
    c = compile_kernel(CASES[name][0], target=target, stop="cubin", cache=False)
    assert c.resources.spill_stores == 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_on_the_gpu_as_the_interpreter(name: str) -> None:
    src, outs = CASES[name]
    _, want, got = interpret_and_run_on_gpu(lambda stop: compile_kernel(src, stop=stop, cache=False), DIMS)
    for i in outs:
        np.testing.assert_allclose(np.asarray(got[i], np.float64), np.asarray(want[i], np.float64), rtol=1e-5)
