"""The pin overlap_epilogue on sm_100a (the pass overlap-epilogue): a persistent GEMM's MMAs
issued by the producer's thread into one of two accumulators in tensor memory, so a tile's
epilogue runs while the next tile multiplies.  The emulator against the interpreter with
several tiles a program (both halves used twice), the halves' protocol broken as emulator
errors, ptxas without spills, and the kernels the pass leaves as they are."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from device_checks import needs_ptxas
from tkc.compiler import compile_kernel
from tkc.errors import TkcEmulatorError
from tkc.interpreter import random_args
from tkc.runner import run

from test_blackwell import SM100, broken_ir, emulate_text, emulator_errors, lowered, tile_kernel

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ON = {"overlap_epilogue": True}
#: Four tiles a program on the emulator's 4 SMs: each half of tensor memory holds two tiles.
DIMS = {"M": 1000, "N": 1024, "K": 144}


@pytest.mark.parametrize(("name", "consts", "dims", "seed"), [
    ("gemm", {}, DIMS, 0),
    ("gemm", {"tma_store": False}, {"M": 520, "N": 600, "K": 200}, 1),
    ("gemm", {"stages": 2}, {"M": 900, "N": 704, "K": 64}, 2),  # one K step: every tile's first MMA is its last
    ("gemm", {"BN": 128, "tma_store": False}, {"M": 1000, "N": 600, "K": 144}, 4),
    ("gemm_fp8", {}, {"M": 700, "N": 520, "K": 272}, 3),
])
def test_the_overlapped_gemm_agrees_with_the_interpreter(name: str, consts: dict, dims: dict, seed: int) -> None:
    kernel = tile_kernel({**ON, **consts}, EXAMPLES / f"{name}.tk")
    result = run(kernel, random_args(kernel, dims, seed), "emulate", check=True, seed=seed, target=SM100)
    assert result.ok, result.checked


def test_the_producer_issues_the_mmas_into_two_halves() -> None:
    text = lowered(ON)
    producer = text[text.index('name = "producer"'):text.index('name = "consumers"')]
    consumers = text[text.index('name = "consumers"'):]
    # the CTA's tensor memory, twice the one accumulator's columns
    assert re.search(r"%tmem = blackwell.tmem_alloc \{cols = 512\}", text)
    assert "blackwell.mma" in producer and "blackwell.mma" not in consumers
    assert "blackwell.tmem_load" in consumers
    assert re.search(r"%acc_full = hopper.mbarrier_alloc \{offset = \d+, stages = 2\}", text)
    assert re.search(r"hopper.mbarrier_init %acc_empty \{count = 2\}", text)  # the epilogue's two warpgroups
    assert re.search(r'hopper.role \{name = "producer", first = 0, warpgroups = 1, regs = 136, warps = 1\}', text)
    assert re.search(r'hopper.role \{name = "consumers", first = 1, warpgroups = 2, regs = 184\}', text)
    # each MMA is issued before the refill of the stage the MMA before it read
    k_loop = producer[producer.index("blackwell.mma"):]
    assert k_loop.index("blackwell.commit") < k_loop.index("tile.if")


def test_without_the_producers_wait_a_tile_overwrites_a_half_the_epilogue_reads() -> None:
    # the producer's wait for its half (the first stage of %acc_empty in program order)
    wait = r"(= hopper.stage %acc_empty, %\w+ : mbarrier[^\n]*)\n *hopper.mbarrier_wait [^\n]*"
    errors = emulator_errors(broken_ir(ON, lambda t: re.sub(wait, r"\1", t, count=1)), DIMS)
    # the next tile's MMA writes the half under the epilogue's loads, or the producer runs a
    # whole phase of %acc_full ahead of the epilogue's wait
    assert errors and all("reads tensor memory" in e or "completed without this waiter seeing" in e
                          for e in errors), errors


def test_an_epilogue_that_never_frees_its_half_deadlocks() -> None:
    broken = broken_ir(ON, lambda t: re.sub(r"\n *hopper.mbarrier_arrive %\d+[^\n]*", "", t, count=1))
    with pytest.raises(TkcEmulatorError, match="deadlock"):
        emulate_text(broken, DIMS)


@needs_ptxas
@pytest.mark.parametrize(("name", "consts"), [("gemm", {}), ("gemm", {"BN": 128, "tma_store": False}),
                                             ("gemm_fp8", {})])
def test_the_overlapped_gemm_assembles_without_spills(name: str, consts: dict) -> None:
    c = compile_kernel(EXAMPLES / f"{name}.tk", {**ON, **consts}, target=SM100, stop="cubin", cache=False, ptxas=True)
    assert c.resources.spill_stores == 0, c.resources


@pytest.mark.parametrize(("name", "consts"), [
    ("gemm", {"cluster": 2}),         # in clusters ptxas spilled with the MMAs in the producer
    ("gemm", {"cta_pairs": True}),
    ("attn", {}),                     # products read at once
    ("gemm_allreduce", {}),           # a multi-GPU kernel's producer runs its waits too
    ("gemm", {"ctas_per_sm": 2, "BN": 128, "stages": 2}),  # two programs' accumulators pass the SM's 512 columns
    # epilogues with register work beside the conversion spilled with the epilogue's smaller share
    ("gemm_swiglu", {}),
    ("gemm_fp8_scaled", {}),
    ("gemm_bias_gelu", {"persistent": True}),
    ("gemm_residual", {"persistent": True}),
])
def test_kernels_the_pass_leaves_as_they_are(name: str, consts: dict) -> None:
    def ir(extra: dict) -> str:
        return compile_kernel(EXAMPLES / f"{name}.tk", {**consts, **extra}, target=SM100, stop="hopper",
                              cache=False).asm["hopper"]

    assert ir(ON).replace("overlap_epilogue = true, ", "").replace(", overlap_epilogue = true", "") \
        .replace("{overlap_epilogue = true}", "{}") == ir({})


def test_the_pin_changes_nothing_on_sm_90a() -> None:
    on = compile_kernel(EXAMPLES / "gemm.tk", ON, stop="ptx", cache=False).asm["ptx"]
    off = compile_kernel(EXAMPLES / "gemm.tk", {}, stop="ptx", cache=False).asm["ptx"]
    assert on == off
