"""sm_100a products of 64 rows: ``tcgen05.mma`` with M = 64 (the PTX ISA's data-path layout F:
warp w's 16 rows in its lanes 32 w to 32 w + 15), read with ``tcgen05.ld.16x256b`` as one
warpgroup's wgmma accumulator fragment.  The examples whose products have 64 rows (linear
attention, Based, Mamba-2's SSD, the FFT convolution's kernels, paged decode, attention
backward at 64 x 64 tiles, a 64-row GEMM) against
the interpreter in the emulator on shapes with tails, ptxas -arch=sm_100a without spills, the
layout's formulas, and the protocol errors of a product read at once."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import tkc.ops.fftconv as fc
from device_checks import interpret_and_emulate, needs_blackwell, needs_ptxas
from tkc.compiler import compile_kernel
from tkc.emulator import emulate
from tkc.errors import TkcEmulatorError
from tkc.interpreter import random_args
from tkc.ir.dialects import blackwell
from tkc.ir.layouts import WgmmaAccumulator
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify
from tkc.runner import run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SM100 = "sm_100a"


# ---------------------------------------------------------------- the layout
def test_layout_f_lanes() -> None:
    """M = 64: rows 16 w .. 16 w + 15 in lanes 32 w .. 32 w + 15; M = 128: row i in lane i."""
    lanes = blackwell.accumulator_lanes(64)
    assert list(lanes[:18]) == [*range(16), 32, 33] and lanes[63] == 111
    assert np.all(lanes // 32 == np.arange(64) // 16)
    assert list(blackwell.accumulator_lanes(128)) == list(range(128))


@pytest.mark.parametrize("n", [8, 16, 64, 136])
def test_16x256b_is_the_wgmma_fragment(n: int) -> None:
    """tcgen05.ld.16x256b.x(n/8) gives lane l register r the element (l/4 + 8 (r/2 % 2),
    r % 2 + 2 (l % 4) + 8 (r / 4)) of its warp's 16 rows: #wgmma_acc<n>'s registers."""
    layout = WgmmaAccumulator(n)
    for t in range(128):
        lane, w = t % 32, t // 32
        row0, col0 = layout.thread_coords(t)
        for r in range(layout.regs):
            dr, dc = layout.reg_coords(r)
            assert (row0 + dr, col0 + dc) == (16 * w + lane // 4 + 8 * (r // 2 % 2),
                                              r % 2 + 2 * (lane % 4) + 8 * (r // 4))


# ---------------------------------------------------------------- the emulator
RANDOM = [
    ("linear_attn.tk", None, {}, {"B": 1, "H": 2, "N": 100}),
    ("linear_attn.tk", None, {"DV": 128}, {"B": 1, "H": 1, "N": 150, "DV": 128}),
    ("mamba2_ssd.tk", None, {}, {"B": 1, "T": 150, "H": 2, "G": 1}),
    ("mamba2_ssd.tk", None, {"N": 64}, {"B": 1, "T": 100, "H": 2, "G": 2}),
    ("paged_decode.tk", "paged_decode", {}, {"B": 2, "HQ": 16, "NT": 300, "KVH": 2, "MAXP": 5}),
    ("paged_decode.tk", "paged_decode", {"P": 16, "D": 64}, {"B": 2, "HQ": 8, "NT": 200, "KVH": 1, "MAXP": 9}),
    ("fftconv.tk", "fft_cols", {"P": 32, "KP": 16, "BP": 1}, {"B": 3, "B2": 2, "H": 1, "R": 32, "Q": 128}),
    ("fftconv.tk", "ifft_cols", {"P": 32, "KP": 16, "BP": 1}, {"B": 3, "B2": 2, "H": 1, "R": 32, "Q": 128}),
    ("based.tk", "based", {}, {"B": 1, "H": 2, "N": 100}),
    ("based.tk", "based_states", {}, {"B": 1, "H": 2, "N": 150, "P": 2}),
    ("based.tk", "based_split", {}, {"B": 1, "H": 2, "N": 150, "P": 2}),
    ("gemm.tk", None, {"BM": 64}, {"M": 200, "N": 264, "K": 136}),
    ("gemm.tk", None, {"BM": 64, "BN": 64, "BK": 32}, {"M": 130, "N": 72, "K": 104}),
]


@pytest.mark.parametrize(("example", "kernel", "consts", "dims"), RANDOM, ids=str)
def test_emulated_agrees_with_the_interpreter(example: str, kernel: str | None, consts: dict, dims: dict) -> None:
    tile_ir = compile_kernel(EXAMPLES / example, consts, kernel=kernel, stop="tkir", cache=False).kernel_op
    # Paged decode's page table: valid pages (and some past the cache: TMA reads zeros).
    args = random_args(tile_ir, dims, 1, int_range=(0, 12) if example == "paged_decode.tk" else (-8, 8))
    result = run(tile_ir, args, "emulate", check=True, seed=1, target=SM100)
    assert result.backend == "emulate" and result.ok, result.checked


@pytest.mark.gpu
@needs_blackwell
@pytest.mark.parametrize(("example", "kernel", "consts", "dims"), RANDOM, ids=str)
def test_on_a_blackwell_gpu(example: str, kernel: str | None, consts: dict, dims: dict) -> None:
    """The same runs on the hardware: the first check of layout F and 16x256b against it."""
    tile_ir = compile_kernel(EXAMPLES / example, consts, kernel=kernel, stop="tkir", cache=False).kernel_op
    args = random_args(tile_ir, dims, 1, int_range=(0, 12) if example == "paged_decode.tk" else (-8, 8))
    result = run(tile_ir, args, "gpu", check=True, target=SM100)
    assert result.ok, result.checked


def _fft_args(name: str, N: int) -> list:
    """fftconv's and fft_rows' arguments with the real DFT matrices (on N(0, 1) matrices their
    outputs reach 1e4, where the order of the sums decides): B = 3 over programs of two rows."""
    p = fc.plan(N)
    g = torch.Generator().manual_seed(5)
    u = torch.randn(3, 1, N, generator=g).to(torch.bfloat16)
    c, kf = fc.constants(p), fc.response(torch.randn(1, N, generator=g) / N ** 0.5, p)
    if name == "fftconv":
        R = p.N1 // 2
        norm = torch.linalg.vector_norm(u, dim=-1, dtype=torch.float32)
        args = [u.view(3, 1, R, p.M2), norm, kf, c["f1"], c["f2"], c["tw"],
                torch.zeros(3, 1, R, p.M2, dtype=torch.bfloat16)]
    else:
        z = torch.randn(3, 1, 2 * p.P, p.Q1, 64, generator=g).to(torch.bfloat16)
        args = [z, kf, c["fq"], c["f2"], c["tq"], c["tl"], torch.zeros_like(z)]
    return [a.float().numpy().copy() for a in args]


@pytest.mark.parametrize(("name", "N"), [("fftconv", 1024), ("fftconv", 4096), ("fft_rows", 8192)])
def test_fft_passes_emulated_agree_with_the_interpreter(name: str, N: int) -> None:
    p = fc.plan(N)
    consts = {"N1": p.N1, "M2": p.M2, "BP": 1} if name == "fftconv" else {"P": p.P, "Q1": p.Q1, "BB": 2}
    tile_ir = compile_kernel(EXAMPLES / "fftconv.tk", consts, kernel=name, stop="tkir", cache=False).kernel_op
    lowered = compile_kernel(EXAMPLES / "fftconv.tk", consts, kernel=name, target=SM100, stop="hopper",
                             cache=False).kernel_op
    want, got = interpret_and_emulate(tile_ir, lowered, _fft_args(name, N), 2)
    w, g = want[-1], got[-1]
    np.testing.assert_allclose(g, w, rtol=2e-2, atol=2e-2 * np.abs(w).max())
    assert np.abs(g - w).mean() <= 1e-3 * np.abs(w).mean()


# ---------------------------------------------------------------- protocols
def _linear_attn() -> str:
    return compile_kernel(EXAMPLES / "linear_attn.tk", {}, target=SM100, stop="hopper", cache=False).asm["hopper"]


def _emulate(text: str, dims: dict) -> None:
    module = parse_module(text, "sm100.tkir")
    verify(module)
    kernel = module.kernel()
    emulate(kernel, random_args(kernel, dims, 0), seed=0)


def test_products_read_at_once_take_columns_and_barriers_of_their_own() -> None:
    """Linear attention's four products (S = Q K^T, S V, the state's share, the state's
    update): 64-row MMAs into four 64-column ranges of one allocation, each committed onto a
    barrier of its own, read by 16x256b; the register operands staged through shared memory."""
    text = _linear_attn()
    assert len(re.findall(r"blackwell.tmem_alloc \{cols = 256\}", text)) == 1
    assert len(re.findall(r"blackwell.mma .*\{m = 64, n = 64\}", text)) == 4 and "hopper.wgmma" not in text
    assert len(set(re.findall(r"blackwell.commit (%acc_full\w*)", text))) == 4
    assert len(re.findall(r"blackwell.tmem_load .*#wgmma_acc<64>", text)) == 4


def test_reading_a_64_row_product_before_its_commits_barrier() -> None:
    text = _linear_attn()
    wait = re.search(r"\n *hopper.mbarrier_wait %acc_full, [^\n]*", text).group(0)
    with pytest.raises(TkcEmulatorError, match="reads tensor memory before waiting for a commit of the MMAs"):
        _emulate(text.replace(wait, "", 1), {"B": 1, "H": 1, "N": 100})


def test_reading_a_64_row_product_as_128_rows() -> None:
    """A 64-row MMA writes half the lanes: reading the columns as a 128-row accumulator reads
    lanes it never wrote."""
    text = compile_kernel(EXAMPLES / "gemm.tk", {"BM": 64, "BN": 64}, target=SM100, stop="hopper",
                          cache=False).asm["hopper"]
    load = re.search(r"(%\w+) = blackwell.tmem_load (%\w+), (%\w+) : tile<64x64xf32, reg, #wgmma_acc<64>>", text)
    probe = (f"\n    %probe = blackwell.tmem_load {load.group(2)}, {load.group(3)} : "
             f"tile<128x64xf32, reg, #tmem_acc<64>>")
    at = text.index(load.group(0)) + len(load.group(0))
    with pytest.raises(TkcEmulatorError, match="lanes and columns no MMA has written"):
        _emulate(text[:at] + probe + text[at:], {"M": 64, "N": 64, "K": 64})


def test_backward_sums_stay_in_tensor_memory() -> None:
    """attn_bwd's dV and dK (``acc += a @ b`` over the key block's loop, from zero) accumulate
    in tensor memory and are read once behind the loop; the products read at once beside them
    (S^T, dP^T, dQ's share) set two epilogue warpgroups, not four (beside the producer
    warpgroup that attn_bwd takes at D = 128)."""
    c = compile_kernel(EXAMPLES / "attn_train.tk", {}, kernel="attn_bwd", target=SM100, stop="hopper", cache=False)
    kernel = c.kernel_op
    assert kernel.attributes["consts"]["warp_specialize"] and kernel.attributes["threads"] == 128 + 256
    loop = next(op for op in kernel.walk() if op.name == "tile.for" and any(
        x.name == "blackwell.mma" for x in op.walk()))
    inside = [op for op in loop.walk() if op.name == "blackwell.tmem_load"]
    behind = [op for op in loop.parent.ops if op.name == "blackwell.tmem_load"]
    assert len(behind) == 2 and all(op.result.type.shape == (128, 128) for op in behind)
    assert len(inside) == 3  # S^T, dP^T and dQ's share, each read where it is computed
    accumulating = [op for op in loop.walk() if op.name == "blackwell.mma"
                    and getattr(op.accumulate, "owner", None) is not None and op.accumulate.owner.name == "tile.cmp"]
    assert len(accumulating) == 2


def test_reading_a_sum_without_waiting_for_its_last_commit() -> None:
    """dK's wait in the loop dropped: its sum is read behind the loop before anything says the
    last MMA into it is done."""
    text = compile_kernel(EXAMPLES / "attn_train.tk", {}, kernel="attn_bwd", target=SM100, stop="hopper",
                          cache=False).asm["hopper"]
    lines = text.split("\n")
    last = max(i for i, x in enumerate(lines) if "blackwell.mma" in x)
    wait = next(i for i in range(last, len(lines)) if "hopper.mbarrier_wait" in lines[i])
    with pytest.raises(TkcEmulatorError, match="reads tensor memory before waiting for a commit"):
        _emulate("\n".join(lines[:wait] + lines[wait + 1:]), {"B": 1, "H": 2, "KVH": 1, "N": 200})


# ---------------------------------------------------------------- ptxas
PTXAS = [
    ("linear_attn.tk", None, {}), ("linear_attn.tk", None, {"DV": 128}), ("mamba2_ssd.tk", None, {}),
    ("mamba2_ssd.tk", None, {"N": 64}), ("paged_decode.tk", "paged_decode", {}),
    ("paged_decode.tk", "paged_decode", {"P": 16}), ("paged_decode.tk", "paged_decode", {"P": 8}),
    ("fftconv.tk", "fftconv", {}), ("fftconv.tk", "fft_cols", {}), ("fftconv.tk", "fft_rows", {}),
    ("fftconv.tk", "ifft_cols", {}), ("fftconv.tk", "fft_cols", {"P": 64, "KP": 32}),
    ("fftconv.tk", "fft_rows", {"P": 16, "Q1": 32}), ("gemm.tk", None, {"BM": 64}),
    ("attn_train.tk", "attn_bwd", {"BM": 64, "BN": 64, "D": 64}), ("attn_train.tk", "attn_bwd", {}),
    ("attn_train.tk", "attn_bwd", {"causal": True}), ("varlen_attn_train.tk", "varlen_attn_bwd", {}),
    # Spilled (700 B, 240 B) while LLVM hoisted every shared address out of the loop: Based's 34
    # products a chunk (its column sums' cross-warp addresses), the backward at D = 64's dS
    # stored an element at a time (64 registers of addresses beside S, dP and delta).
    ("based.tk", "based", {}), ("based.tk", "based_states", {}), ("based.tk", "based_split", {}),
    ("attn_train.tk", "attn_bwd", {"D": 64}),
    ("attn_train.tk", "attn_bwd", {"D": 64, "causal": True}),
]


@needs_ptxas
@pytest.mark.parametrize(("example", "kernel", "consts"), PTXAS, ids=str)
def test_ptxas_sm_100a_accepts_without_spills(example: str, kernel: str | None, consts: dict) -> None:
    c = compile_kernel(EXAMPLES / example, consts, kernel=kernel, target=SM100, stop="cubin", cache=False,
                       ptxas=True)
    ptx = c.asm["ptx"]
    assert ".target sm_100a" in ptx and "wgmma" not in ptx
    load = "32x32b" if example.startswith(("attn_train", "varlen")) and consts.get("BM") != 64 else "16x256b"
    for instr in ("tcgen05.alloc.cta_group::1", "tcgen05.mma.cta_group::1.kind::f16", "tcgen05.commit.cta_group::1",
                  f"tcgen05.ld.sync.aligned.{load}", "tcgen05.dealloc.cta_group::1"):
        assert instr in ptx, instr
    r = c.resources
    assert r is not None and r.spill_stores == 0 and r.spill_loads == 0, r
