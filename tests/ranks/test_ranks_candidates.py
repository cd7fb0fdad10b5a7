"""Candidates for the multi-GPU examples (benchmarks/ranks_candidates/, timed beside them with
``multi_gpu.py --also``): the same inputs and torch references as the examples they would
replace, on simulated ranks, and ptxas without spills."""

from __future__ import annotations

from pathlib import Path

import pytest

import rank_cases as cases
import tkc
from device_checks import HAVE_PTXAS, assert_no_spills
from tkc.compiler import compile_kernel
from tkc.emulator import emulate_ranks

CANDIDATES = Path(__file__).parents[2] / "benchmarks" / "ranks_candidates"
TILES = {"BM": 32, "BN": 32, "BK": 32, "PUSHERS": 1}


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_gemm_allreduce_with_pushers(ranks: int, seed: int) -> None:
    case = cases.gemm_allreduce(ranks, seed, MS=40, K=72, N=48, BM=TILES["BM"], BN=TILES["BN"])
    tkc.interpret_ranks(tkc.load(CANDIDATES / "gemm_allreduce.tk"), case.args, seed=seed, **TILES)
    case.check()


def test_gemm_allreduce_with_pushers_lowered() -> None:
    consts = {"BM": 64, "BN": 64, "BK": 32, "PUSHERS": 1}
    case = cases.gemm_allreduce(3, 0, MS=128, K=64, N=96, BM=consts["BM"], BN=consts["BN"])
    k = compile_kernel(CANDIDATES / "gemm_allreduce.tk", consts, stop="hopper", cache=False).kernel_op
    emulate_ranks(k, case.args, seed=0)
    case.check()
    c = compile_kernel(CANDIDATES / "gemm_allreduce.tk", {}, stop="cubin" if HAVE_PTXAS else "ptx", cache=False)
    if HAVE_PTXAS:
        assert_no_spills(c)
