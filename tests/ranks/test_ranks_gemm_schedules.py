"""examples/allgather_gemm.tk's schedules beyond its defaults on
simulated ranks: fewer pushing programs (PUSHERS) and the others starting LEAD tiles ahead,
in the interpreter (two interleavings) and the emulator of the lowered hopper IR against torch
at 2 and 4 ranks, shapes with tails (test_ranks_examples.py runs the defaults, test_ranks_compile.py compiles them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import rank_cases as cases

import tkc
from tkc.compiler import compile_kernel
from tkc.emulator import emulate_ranks

EXAMPLES = Path(__file__).parents[2] / "examples"
TILES = {"BM": 32, "BN": 32, "BK": 32}
HOPPER = {"BM": 64, "BN": 64, "BK": 32}


# 4 programs on the CPU (the default has every program push): PUSHERS=1 leaves three that
# only multiply, and start LEAD tiles ahead of the pusher
PUSHERS = [{"PUSHERS": 1, "LEAD": 1}, {"PUSHERS": 2, "LEAD": 2}]


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("pushers", PUSHERS)
def test_allgather_gemm_interpreted(ranks: int, seed: int, pushers: dict) -> None:
    case = cases.allgather_gemm(ranks, seed, M=40, K=72, N=48)
    tkc.interpret_ranks(tkc.load(EXAMPLES / "allgather_gemm.tk"), case.args, seed=seed, **TILES, **pushers)
    case.check()


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("pushers", PUSHERS)
def test_allgather_gemm_emulated(ranks: int, pushers: dict) -> None:
    case = cases.allgather_gemm(ranks, ranks, M=80, K=72, N=48)
    k = compile_kernel(EXAMPLES / "allgather_gemm.tk", {**HOPPER, **pushers}, stop="hopper", cache=False).kernel_op
    emulate_ranks(k, case.args, seed=ranks)
    case.check()

