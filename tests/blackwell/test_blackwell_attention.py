"""Attention forward on sm_100a: S = Q K^T into tensor memory, tcgen05.ld for the online
softmax, P through shared memory into the second MMA, O rescaled in registers.  The emulator
against the interpreter (causal and not, D 64 and 128, tails), the broken protocols of the
two products as emulator errors, and ptxas -arch=sm_100a acceptance without spills."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from device_checks import needs_blackwell, needs_ptxas
from tkc.compiler import compile_kernel
from tkc.emulator import emulate
from tkc.errors import TkcEmulatorError, TkcVerifyError
from tkc.ir.dialects import blackwell
from tkc.interpreter import random_args
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify
from tkc.runner import run

ROOT = Path(__file__).resolve().parents[2]
ATTN = ROOT / "examples" / "attn.tk"
SM100 = "sm_100a"
CONFIGS = [{}, {"causal": True}, {"D": 64}, {"D": 64, "causal": True}]


def lowered(consts: dict | None = None) -> str:
    return compile_kernel(ATTN, consts or {}, target=SM100, stop="hopper", cache=False).asm["hopper"]


def emulate_text(text: str, dims: dict[str, int]) -> None:
    module = parse_module(text, "attn.sm100.tkir")
    verify(module)
    kernel = module.kernel()
    emulate(kernel, random_args(kernel, dims, 0), seed=0)


@pytest.mark.parametrize(("consts", "dims", "seed"), [
    ({}, {"B": 1, "H": 2, "N": 330}, 0),                          # three key blocks, a tail
    ({"causal": True}, {"B": 2, "H": 1, "N": 300}, 1),
    ({"D": 64}, {"B": 1, "H": 2, "N": 200}, 2),                   # S 128 wide, O 64: two widths
    ({"D": 64, "causal": True}, {"B": 1, "H": 1, "N": 390}, 3),
], ids=str)
def test_attention_emulated_agrees_with_the_interpreter(consts: dict, dims: dict, seed: int) -> None:
    kernel = compile_kernel(ATTN, consts, stop="tkir", cache=False).kernel_op
    args = random_args(kernel, dims, seed)
    result = run(kernel, args, "emulate", check=True, seed=seed, target=SM100)
    assert result.backend == "emulate" and result.ok, result.checked


def test_one_allocation_holds_both_products() -> None:
    """S and O take columns 0-127 and 128-255 of one 256-column allocation (a CTA allocates
    once), each product commits onto its own barrier, and the role's wait for K moved into
    the MMA (only the MMA warp waits for the tiles)."""
    text = lowered({"D": 64})
    assert len(re.findall(r"blackwell.tmem_alloc \{cols = 256\}", text)) == 1
    assert len(re.findall(r"blackwell.mma ", text)) == 2 and "hopper.wgmma" not in text
    assert len(re.findall(r"= tile.add %tmem, %", text)) == 1  # O's columns: %tmem + 128
    consumers = text[text.index('name = "consumers"'):]
    assert not re.search(r"hopper.mbarrier_wait %(?!acc_full)\w+, %phase", consumers)  # K and V: in blackwell.mma
    assert len(re.findall(r"blackwell.commit %acc_full", text)) == 2


@needs_ptxas
def test_o_is_added_as_its_product_arrives() -> None:
    """P V is loaded with O alpha as its addend (no tile.add behind the load), 8 registers a
    tcgen05.ld, each waited for before the next; the MMA's descriptors are summed inside its
    asm (not 64-bit invariants LLVM hoists out of the loop)."""
    text = lowered({"D": 64})
    load = re.search(r"(%\w+) = blackwell.tmem_load %\w+, %\w+, %\w+ :", text)
    assert load and not re.search(rf"tile.add [^\n]*{load.group(1)}\b", text)
    with pytest.raises(TkcVerifyError, match="at most one addend"):
        verify(parse_module(text.replace(load.group(0), load.group(0)[:-2] + ", %acc_2 :", 1)))
    ptx = compile_kernel(ATTN, {"D": 64}, target=SM100, stop="ptx", cache=False).asm["ptx"]
    o = ptx[ptx.rindex("tcgen05.commit"):]
    loads = re.findall(r"tcgen05.ld.sync.aligned.32x32b.x(\d+).b32 \{[^}]*\}, \[%r\d+(?:\+(\d+))?\];", o)
    assert [int(x) for x, _ in loads[:4]] == [8] * 4 and [int(c or 0) for _, c in loads[:4]] == [0, 8, 16, 24]
    between = o[o.index("tcgen05.ld"):].split("tcgen05.ld.sync")[1:4]
    assert all("tcgen05.wait::ld" in chunk for chunk in between)
    assert "add.s64 da, da, " in ptx


DIMS = {"B": 1, "H": 1, "N": 200}


def _wait_for(text: str, barrier: str) -> str:
    m = re.search(rf"\n *hopper.mbarrier_wait {barrier}, %\w+[^\n]*", text)
    assert m, f"the wait for {barrier}"
    return m.group(0)


def test_reading_s_before_its_commits_barrier() -> None:
    text = lowered()
    broken = text.replace(_wait_for(text, "%acc_full"), "", 1)
    with pytest.raises(TkcEmulatorError, match="reads tensor memory before waiting for a commit of the MMAs"):
        emulate_text(broken, DIMS)


IN_FLIGHT = ("reads tensor memory (that .* is still writing \\(no tcgen05.commit after it\\)"
             "|before waiting for a commit)")


def test_reading_o_while_its_mma_is_in_flight() -> None:
    """The commit moved behind the load (and the wait for it gone): the product is read
    before anything says it is done (by the MMA warp's warpgroup while it is in flight, or by
    the other warpgroup, which nothing holds back, before it is even issued)."""
    lines = lowered().split("\n")
    commit = next(i for i, x in enumerate(lines) if "blackwell.commit %acc_full_1" in x)
    load = next(i for i, x in enumerate(lines) if i > commit and "blackwell.tmem_load" in x)
    assert "hopper.mbarrier_wait %acc_full_1" in lines[commit + 1]
    broken = lines[:commit] + lines[commit + 2:load + 1] + [lines[commit]] + lines[load + 1:]
    with pytest.raises(TkcEmulatorError, match=IN_FLIGHT):
        emulate_text("\n".join(broken), DIMS)


def test_p_stored_while_the_second_mma_reads_it() -> None:
    """P stored again behind the MMA that reads it, before its commit: the tensor core may
    still be reading the shared tile, so the store is a race (the emulator sees it in the
    order the warpgroups ran: a store under the MMA's read, or the MMA reading a store of
    the other warpgroup that no fence and barrier ordered)."""
    lines = lowered().split("\n")
    store = next(i for i, x in enumerate(lines) if "hopper.smem_store" in x and "fence_proxy_async" in lines[i + 1])
    mma = next(i for i, x in enumerate(lines) if "blackwell.commit %acc_full_1" in lines[i + 1])
    assert "blackwell.mma" in lines[mma]
    broken = lines[:mma + 1] + [lines[store]] + lines[mma + 1:]
    with pytest.raises(TkcEmulatorError, match="race|written by .*hopper.smem_store.* with no fence"):
        emulate_text("\n".join(broken), DIMS)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_attention_emulated_agrees_with_the_interpreter(causal: bool) -> None:
    """Sequences of 1, 170 and 64 tokens packed one after another (cu_seqlens), D = 128."""
    torch = pytest.importorskip("torch")
    from tkc.interpreter import run_kernel

    path = ROOT / "examples" / "varlen_attn.tk"
    lengths, H, D = [1, 170, 64], 2, 128
    g = torch.Generator().manual_seed(1)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    q, k, v = (torch.randn(H, int(cu[-1]), D, generator=g).bfloat16() for _ in range(3))
    args = [q, k, v, torch.full_like(q, float("nan")), cu, D ** -0.5, max(lengths)]
    want = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    run_kernel(compile_kernel(path, {"causal": causal}, stop="tkir", cache=False).kernel_op, want)
    emulate(compile_kernel(path, {"causal": causal}, target=SM100, stop="hopper", cache=False).kernel_op, args)
    torch.testing.assert_close(args[3].float(), want[3].float(), rtol=1e-2, atol=1e-2)


@needs_ptxas
@pytest.mark.parametrize("consts", CONFIGS, ids=str)
def test_ptxas_sm_100a_accepts_attention_without_spills(consts: dict) -> None:
    c = compile_kernel(ATTN, consts, target=SM100, stop="cubin", cache=False, ptxas=True)
    ptx = c.asm["ptx"]
    assert ".target sm_100a" in ptx and "wgmma" not in ptx
    assert ptx.count("tcgen05.mma.cta_group::1.kind::f16") >= 2 and "tcgen05.alloc.cta_group::1" in ptx
    r = c.resources
    assert r is not None and r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0


@needs_ptxas
def test_ptxas_sm_100a_accepts_varlen_attention_without_spills() -> None:
    c = compile_kernel(ROOT / "examples" / "varlen_attn.tk", {"causal": True}, target=SM100, stop="cubin",
                       cache=False, ptxas=True)
    r = c.resources
    assert r is not None and r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0


# ---------------------------------------------------------------- FP8 attention: V read MN-major
ATTN_FP8 = ROOT / "examples" / "attn_fp8.tk"


@pytest.mark.parametrize(("consts", "dims"), [
    ({}, {"B": 1, "H": 2, "N": 200}), ({"causal": True}, {"B": 1, "H": 1, "N": 300}),
    ({"D": 64}, {"B": 2, "H": 1, "N": 150}), ({"D": 256, "causal": True}, {"B": 1, "H": 1, "N": 140}),
], ids=str)
def test_fp8_attention_emulated_agrees_with_the_interpreter(consts: dict, dims: dict) -> None:
    kernel = compile_kernel(ATTN_FP8, consts, stop="tkir", cache=False).kernel_op
    result = run(kernel, random_args(kernel, dims, 3), "emulate", check=True, seed=3, target=SM100)
    assert result.backend == "emulate" and result.ok, result.checked


def test_fp8_attention_reads_v_as_tma_copies_it() -> None:
    """tcgen05's kind::f8f6f4 transposes B: V's tile goes to P V as TMA copied it (MN-major,
    no hopper.transpose_smem), and the instruction descriptor says so (bit 16)."""
    c = compile_kernel(ATTN_FP8, {}, target=SM100, stop="hopper", cache=False)
    text = c.asm["hopper"]
    assert "hopper.transpose_smem" not in text and "hopper.smem_copy" not in text
    assert re.search(r"%v_smem = hopper.smem_alloc .*#smem<128x128xf8e4m3, mn, sw128>", text)
    pv = next(op for op in c.kernel_op.walk() if op.name == "blackwell.mma" and op.b.type.layout.major == "mn")
    idesc = blackwell.instr_descriptor(pv.operand_layout("a"), pv.operand_layout("b"), pv.m, pv.n)
    assert idesc >> 16 & 1 and not idesc >> 15 & 1 and (idesc >> 7) & 7 == 0  # e4m3 A, K-major; B MN-major


def test_a_row_goes_to_shared_memory_16_bytes_a_store() -> None:
    """A #tmem_acc thread's consecutive columns: 8 bf16 or 16 fp8 values a 16-byte store into
    a K-major tile whose swizzle keeps each run contiguous (P, the epilogue tile); one store an
    element where it does not (an MN-major tile)."""
    from tkc import dtypes
    from tkc.codegen.lower_blackwell import _row_runs
    from tkc.ir.layouts import SharedLayout, TmemAccumulator

    acc = TmemAccumulator(128, 2)
    assert _row_runs(acc, SharedLayout(128, 128, dtypes.bf16, "k", 128), 0) == 8
    assert _row_runs(acc, SharedLayout(128, 128, dtypes.f8e4m3, "k", 128), 0) == 16
    assert _row_runs(acc, SharedLayout(128, 128, dtypes.f8e4m3, "k", 128), 8) == 1  # starts mid-run
    assert _row_runs(acc, SharedLayout(128, 128, dtypes.bf16, "mn", 128), 0) == 1
    assert _row_runs(TmemAccumulator(16, 2), SharedLayout(128, 16, dtypes.f8e4m3, "k", 0), 0) == 1  # 8 a thread


@needs_ptxas
@pytest.mark.parametrize("consts", [{}, {"causal": True}, {"D": 64}, {"D": 64, "causal": True}, {"D": 256},
                                    {"D": 256, "causal": True}], ids=str)
def test_ptxas_sm_100a_accepts_fp8_attention_without_spills(consts: dict) -> None:
    c = compile_kernel(ATTN_FP8, consts, target=SM100, stop="cubin", cache=False, ptxas=True)
    ptx = c.asm["ptx"]
    assert ".target sm_100a" in ptx and "wgmma" not in ptx and ptx.count("tcgen05.mma.cta_group::1.kind::f8f6f4") >= 2
    assert "st.shared.v4.b32" in ptx  # P and O's tile, 16 bytes a store
    r = c.resources
    assert r is not None and r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0


# ---------------------------------------------------------------- a Blackwell GPU (none here yet)
@pytest.mark.gpu
@needs_blackwell
@pytest.mark.parametrize("consts", CONFIGS, ids=str)
def test_attention_on_a_blackwell_gpu(consts: dict) -> None:
    kernel = compile_kernel(ATTN, consts, stop="tkir", cache=False).kernel_op
    args = random_args(kernel, {"B": 2, "H": 3, "N": 1000}, 0)
    result = run(kernel, args, "gpu", check=True, target=SM100)
    assert result.ok, result.checked
