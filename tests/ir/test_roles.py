"""``hopper.role`` narrowed to a few warps (``warps``): what it may hold, and its code.

The producer of a warp-specialized kernel issues every copy from one thread, so one warp runs
its loops; a role narrowed that way must hold nothing that needs every thread (a register
tile, a wgmma, a store from registers), and the verifier says which op does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tkc.codegen.lower import kernel_to_llvm, kernel_to_ptx
from tkc.errors import TkcVerifyError
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify

# The hand-written warp-specialized GEMM with its producer on every warp of its warpgroup.
WS = (Path(__file__).parents[1] / "data" / "hopper" / "gemm_ws.tkir").read_text().replace(", warps = 1", "")
PRODUCER = 'name = "producer", first = 0, warpgroups = 1, regs = 40'
CONSUMERS = 'name = "consumers", first = 1, warpgroups = 2, regs = 232'


def narrowed(role: str, warps: int) -> str:
    assert role in WS
    return WS.replace(role, f"{role}, warps = {warps}")


def test_a_producer_on_one_warp_verifies_and_prints_back() -> None:
    module = parse_module(narrowed(PRODUCER, 1), "gemm_ws.tkir")
    verify(module)
    text = print_module(module)
    assert f"{PRODUCER}, warps = 1" in text
    verify(parse_module(text, "again.tkir"))


def test_consumers_on_one_warp_are_refused_at_the_first_op_that_needs_every_thread() -> None:
    module = parse_module(narrowed(CONSUMERS, 1), "gemm_ws.tkir")
    with pytest.raises(TkcVerifyError, match=r"in role 'consumers' with warps = 1: '[a-z_.]+' needs every "
                                             r"thread of the role") as e:
        verify(module)
    line = WS.splitlines()[e.value.loc.line - 1]
    assert ", reg, #" in line or "hopper.wgmma" in line, line


@pytest.mark.parametrize("warps", [0, 5])
def test_warps_outside_the_role_are_refused(warps: int) -> None:
    with pytest.raises(TkcVerifyError, match=rf"warps = {warps}: a role of 1 warpgroup\(s\) has 1 to 4 warps"):
        verify(parse_module(narrowed(PRODUCER, warps), "gemm_ws.tkir"))


def test_the_narrowed_role_sets_its_budget_in_every_warp_then_runs_on_the_first() -> None:
    """setmaxnreg is executed by every warp of the warpgroup (``.sync.aligned``); only then are
    warps 1..3 of the producer sent past its body (role thread index < 32)."""
    llvm = str(kernel_to_llvm(parse_module(narrowed(PRODUCER, 1), "gemm_ws.tkir").kernel()))
    budget = llvm.index('call void @"llvm.nvvm.setmaxnreg.dec.sync.aligned.u32"(i32 40)')
    narrow = re.search(r'= icmp ult i32 %"tid", 32\n\s*br i1 %"[.0-9]+", label %"role.producer.warps.then", '
                       r'label %"role.producer.warps.end"', llvm)
    assert narrow and budget < narrow.start(), llvm[budget:budget + 400]
    assert "role.producer.warps" not in str(kernel_to_llvm(parse_module(WS, "gemm_ws.tkir").kernel()))
    assert "mbarrier.try_wait" in kernel_to_ptx(parse_module(narrowed(PRODUCER, 1), "gemm_ws.tkir").kernel())
