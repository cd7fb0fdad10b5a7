"""The candidate multi-GPU GEMMs of benchmarks/ranks_candidates (not yet timed on GPUs) on
simulated ranks: the interpreter (two interleavings) and the emulator of their lowered hopper
IR against torch at 2 and 4 ranks, shapes with tails, so they stay right until they are measured
against examples/ and replace it or go."""

from __future__ import annotations

from pathlib import Path

import pytest
import rank_cases as cases
from device_checks import HAVE_PTXAS, assert_no_spills

import tkc
from tkc.compiler import compile_kernel
from tkc.emulator import emulate_ranks

CANDIDATES = Path(__file__).parents[2] / "benchmarks" / "ranks_candidates"
TILES = {"BM": 32, "BN": 32, "BK": 32}
HOPPER = {"BM": 64, "BN": 64, "BK": 32}


# 4 programs on the CPU: the default has every program push; PUSHERS=1 leaves three that
# only multiply, and start LEAD tiles ahead of the pusher
PUSHERS = [{}, {"PUSHERS": 1, "LEAD": 1}, {"PUSHERS": 2, "LEAD": 2}]


@pytest.mark.parametrize("name", ["allgather_gemm.tk", "gemm_reducescatter.tk"])
def test_candidates_compile_without_spills(name: str) -> None:
    c = compile_kernel(CANDIDATES / name, {}, stop="cubin" if HAVE_PTXAS else "ptx", cache=False)
    if HAVE_PTXAS:
        assert_no_spills(c)
    assert "multimem" not in c.asm["ptx"]  # NVLink multicast stays off


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("pushers", PUSHERS)
def test_allgather_gemm_interpreted(ranks: int, seed: int, pushers: dict) -> None:
    case = cases.allgather_gemm(ranks, seed, M=40, K=72, N=48)
    tkc.interpret_ranks(tkc.load(CANDIDATES / "allgather_gemm.tk"), case.args, seed=seed, **TILES, **pushers)
    case.check()


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_gemm_reducescatter_interpreted(ranks: int, seed: int) -> None:
    case = cases.gemm_reducescatter(ranks, seed, MS=40, K=24, N=72, BM=TILES["BM"], BN=TILES["BN"])
    tkc.interpret_ranks(tkc.load(CANDIDATES / "gemm_reducescatter.tk"), case.args, seed=seed, **TILES)
    case.check()


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("pushers", PUSHERS[1:])
def test_allgather_gemm_emulated(ranks: int, pushers: dict) -> None:
    case = cases.allgather_gemm(ranks, ranks, M=80, K=72, N=48)
    k = compile_kernel(CANDIDATES / "allgather_gemm.tk", {**HOPPER, **pushers}, stop="hopper", cache=False).kernel_op
    emulate_ranks(k, case.args, seed=ranks)
    case.check()


@pytest.mark.parametrize("ranks", [2, 4])
def test_gemm_reducescatter_emulated(ranks: int) -> None:
    case = cases.gemm_reducescatter(ranks, ranks, MS=80, K=72, N=48, BM=HOPPER["BM"], BN=HOPPER["BN"])
    k = compile_kernel(CANDIDATES / "gemm_reducescatter.tk", HOPPER, stop="hopper", cache=False).kernel_op
    emulate_ranks(k, case.args, seed=ranks)
    case.check()
