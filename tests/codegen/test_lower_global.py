"""``hopper.load``/``hopper.store`` codegen: the runs read off a layout, and the vector
accesses they become in the examples' PTX."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache

import numpy as np
import pytest

from tkc.codegen.lower import kernel_to_llvm, kernel_to_ptx
from tkc.codegen.runs import vector_runs
from tkc.codegen.ptxas import assemble
from tkc.ir.layouts import Blocked, Slice, WgmmaAccumulator, choose_blocked
from tkc.ir.parser import parse_module

from test_lower import _example


def _uniform(regs: int, n: int) -> tuple[tuple[int, int], ...]:
    return tuple((i, n) for i in range(0, regs, n))


SOFTMAX_LAYOUT = Blocked((16, 512), 8, (1, 32), (4, 1))
ACC = WgmmaAccumulator(64)

RUNS = [
    # bf16 runs of 8 columns are 16 B: one run per vec.
    ("blocked vec=8 bf16", SOFTMAX_LAYOUT, 2, _uniform(64, 8)),
    # f32: 16 B is 4 elements, so each run of 8 columns is two aligned runs of 4.
    ("blocked vec=8 f32", SOFTMAX_LAYOUT, 4, _uniform(64, 4)),
    ("blocked vec=4 bf16", Blocked((16, 256), 4, (1, 32), (4, 1)), 2, _uniform(32, 4)),
    ("blocked vec=16 bytes", Blocked((4, 512), 16, (1, 32), (4, 1)), 1, _uniform(16, 16)),
    ("blocked vec=1", Blocked((64, 64), 1, (1, 32), (4, 1)), 2, _uniform(32, 1)),
    # A row block narrower than the thread grid: columns wrap modulo 8 (replicas) and stay aligned.
    ("blocked replicated", Blocked((8,), 4, (32,), (4,)), 2, ((0, 4),)),
    # Runs of 3 columns start at odd columns: only single elements are aligned.
    ("blocked vec=3", Blocked((96,), 3, (32,), (4,)), 4, _uniform(3, 1)),
    # The accumulator holds column pairs (2l%4, +1) of two rows per 8 columns.
    ("accumulator bf16", ACC, 2, _uniform(32, 2)),
    ("accumulator f32", ACC, 4, _uniform(32, 2)),
    # Reduced over rows: the column pairs remain; over columns: rows r and r+8, no run.
    ("slice of accumulator axis=0", Slice(ACC, 0), 2, _uniform(16, 2)),
    ("slice of accumulator axis=1", Slice(ACC, 1), 2, _uniform(2, 1)),
    ("keep slice of accumulator axis=1", Slice(ACC, 1, keep=True), 2, _uniform(2, 1)),
    ("keep slice of accumulator axis=0", Slice(ACC, 0, keep=True), 2, _uniform(16, 2)),
    # layernorm's weight row: the parent's runs of 8, once per column repeat.
    ("slice of blocked axis=0", Slice(SOFTMAX_LAYOUT, 0), 2, _uniform(16, 8)),
    ("slice of blocked axis=1", Slice(SOFTMAX_LAYOUT, 1), 2, _uniform(4, 1)),
]


@pytest.mark.parametrize("layout,elem_bytes,want", [r[1:] for r in RUNS], ids=[r[0] for r in RUNS])
def test_vector_runs(layout, elem_bytes: int, want: tuple) -> None:
    assert vector_runs(layout, elem_bytes) == want


def test_runs_of_a_chosen_replicated_layout_are_aligned() -> None:
    lay = choose_blocked((2, 8), 2, 128)  # 16 elements over 128 threads
    runs = vector_runs(lay, 2)
    assert sum(n for _, n in runs) == lay.regs
    t = np.arange(lay.threads)
    for first, n in runs:
        col = lay.coords(t, first)[-1]
        assert (col % n == 0).all()


# --------------------------------------------------------------------------- PTX of the examples


@cache
def _ptx(name: str, consts: tuple = ()) -> str:
    return kernel_to_ptx(_example(name, dict(consts)).kernel())


def _accesses(ptx: str) -> Counter:
    """Global accesses by kind; the streaming cache operator of stores is left out."""
    return Counter(a.replace(".cs.", ".") for a in re.findall(r"(?:ld|st)\.global[.\w]*", ptx))


@pytest.mark.parametrize("name,consts", [("softmax.tk", ()), ("layernorm.tk", ()), ("attn.tk", (("tma_store", False),)),
                                         ("gemm.tk", (("tma_store", False),))])
def test_stores_stream(name: str, consts: tuple) -> None:
    """Every store evicts first (``.cs``): a kernel never reads back what it writes, and
    what it reads stays in L2 instead."""
    stores = re.findall(r"st\.global[.\w]*", _ptx(name, consts))
    assert stores and all(s.startswith("st.global.cs.") for s in stores), Counter(stores)


@pytest.mark.parametrize("name,loads,load_ops,stores,store_ops", [
    # 1 x 4096 blocks over 128 threads: 4 runs of 8 bf16 columns a thread for each access.
    # The one-block branch loads x once and stores y; the two-sweep branch loads x twice
    # and stores y.
    ("softmax.tk", 3 * 4, 3, 2 * 4, 2),
    # The one-block branch loads x, the weight and the bias; the two-sweep branch loads x's
    # block 0 (its mean shifts the sums), x in the loop and its last block after it, then
    # x, the weight and the bias again.  4 runs each.
    ("layernorm.tk", 9 * 4, 9, 2 * 4, 2),
    # 16 x 256 blocks: 4 rows x 1 run; the weight row is 1 run.
    ("rmsnorm.py", 2 * 4 + 1, 3, 4, 1),
])
def test_norms_move_16_bytes_per_access(name: str, loads: int, load_ops: int, stores: int,
                                        store_ops: int) -> None:
    got = _accesses(_ptx(name))
    # One vector access a run on the side by runs (a box in the tensor, or past its end by
    # whole runs), and one in each op's edge loop (for the runs of a tile at the tensor's edge
    # that are still whole in bounds).
    assert got["ld.global.v4.b32"] == loads + load_ops, got
    assert got["st.global.v4.b32"] == stores + store_ops, got
    # The element path of a run, once in each op's edge loop: 8 element accesses.
    assert got["ld.global.b16"] == 8 * load_ops and got["st.global.b16"] == 8 * store_ops, got


@pytest.mark.parametrize("name,consts,loads", [
    ("softmax.tk", (), 4), ("layernorm.tk", (), 4),
    # 16 x 1024 blocks: 4 rows x 4 runs a thread
    ("softmax.tk", (("BM", 16), ("BN", 1024)), 16), ("layernorm.tk", (("BM", 16), ("BN", 1024)), 16),
    ("rmsnorm.py", (), 4)])
def test_a_tile_inside_the_tensor_loads_without_branches(name: str, consts: tuple, loads: int) -> None:
    """The side by runs: the x block's vector loads back to back (each predicated on its
    run inside the asm that issues it), no branch between them, so they are all in flight
    together."""
    lines = [ln.strip() for ln in _ptx(name, consts).splitlines()]
    straight = 0
    best = 0
    for ln in lines:
        if re.match(r"(\{ .*@p )?ld\.global\.v4\.b32", ln):
            straight += 1
            best = max(best, straight)
        elif "bra" in ln.split() or ln.startswith("@") or ln.endswith(":"):
            straight = 0
    assert best >= loads


@pytest.mark.parametrize("name,most", [("softmax.tk", 160), ("layernorm.tk", 170)])
def test_edge_path_addresses_do_not_hold_registers_across_the_loop(ptxas, name: str, most: int) -> None:
    """The edge path's per-element addresses are built on its side of the branch; hoisted
    out of the loop by LLVM they held every register a thread may have (231 and 234 at
    16 x 512 tiles), which left room for two programs per SM instead of three."""
    usage = assemble(_ptx(name, (("BN", 512),)), "sm_90a").kernels[name.split(".")[0]]
    assert usage.spill_stores == 0 and usage.registers <= most, usage


@pytest.mark.parametrize("name,consts,pairs", [
    # 128 x 256 bf16 over two consumer warpgroups: 128 values a thread, in pairs (when the
    # epilogue is not a TMA store)
    ("gemm.tk", (("tma_store", False),), 64),
    ("gemm_fp8.tk", (("tma_store", False),), 32),
    ("attn.tk", (("D", 64), ("tma_store", False)), 16),  # the output block keeps its last axis (batch, head squeezed)
    ("attn.tk", (("D", 128), ("tma_store", False)), 32),
])
def test_epilogues_store_bf16_pairs(name: str, consts: tuple, pairs: int) -> None:
    got = _accesses(_ptx(name, consts))
    # One a pair on the side by runs (an output tile in the tensor or past its end by whole
    # pairs), one in the edge loop (whose element path is 2 b16).
    assert got["st.global.b32"] == pairs + 1 and got["st.global.b16"] == 2, got


def test_fast_path_checks_stride_offset_and_alignment() -> None:
    """The run-time test of the vector path reads every stride, the last offset and the
    base address; without it the vector access would be wrong for a strided tensor."""
    kernel = _example("softmax.tk", {}).kernel()
    ll = str(kernel_to_llvm(kernel))
    assert re.search(r"icmp eq i64 %\"x\.stride1\", 1", ll), "last-axis stride must be tested against 1"
    assert re.search(r"and i64 %\"x\.stride0\", 7", ll), "the row stride must be a multiple of the run"
    assert re.search(r"ptrtoint ptr addrspace\(1\) %\"x\" to i64", ll), "the base address must be aligned"


SQUEEZED_LAST = """
tile.kernel @col {threads = 128, smem_bytes = 0, tma_maps = []} {
^(%x: tensor<bf16[M, N]>, %y: tensor<bf16[M, N]>):
  %c0 = tile.constant {value = 0} : i32
  %t = hopper.load %x, %c0, %c0 {box = [256, 1], squeeze = [1]} : tile<256xbf16, reg, COLUMN>
  hopper.store %y, %t, %c0, %c0 {box = [256, 1], squeeze = [1]}
  tile.return
}
""".replace("COLUMN", "#blocked<256, vec=2, lanes=32, warps=4>")


def test_a_squeezed_last_axis_is_accessed_element_by_element() -> None:
    """A column of a row-major tensor: consecutive values are a row stride apart."""
    kernel = parse_module(SQUEEZED_LAST).kernel()
    got = _accesses(kernel_to_ptx(kernel))
    # Two values a thread on the side by runs (a run is one value, so every box takes it here:
    # LLVM drops the edge loops).
    assert got == Counter({"ld.global.b16": 2, "st.global.b16": 2}), got


def test_each_dtype_packs_its_runs() -> None:
    """The elementwise fixture's #blocked<256, vec=2> tiles: runs of 2 of every dtype."""
    from pathlib import Path

    path = Path(__file__).parent / "kernels" / "elementwise.tkir"
    got = _accesses(kernel_to_ptx(parse_module(path.read_text(), str(path)).kernel()))
    # Every vector access twice: on the side by runs (the loads' runs outside reading -1 and
    # 1.0) and in the edge loop (one run each).
    assert got["ld.global.v2.b32"] == 2 * 2, got  # the i32 and f32 loads: 8 B
    assert got["st.global.v2.b32"] == 2 * 1, got  # the i32 store
    # f16 and bf16 pairs are one b32 (their element paths b16); fp8 and i1 pairs one b16
    # (their element paths u8), i32 elements b32.
    assert got["st.global.b32"] == 2 * 2 + 2 and got["st.global.b16"] == 2 * 2 + 2 * 2, got
    assert got["st.global.u8"] == 2 * 2, got


@pytest.mark.parametrize("name,consts,ops", [
    ("softmax.tk", (), 5), ("layernorm.tk", (), 11), ("gemm.tk", (("tma_store", False),), 1),
    ("attn.tk", (("D", 128), ("tma_store", False)), 1)])
def test_the_edge_path_is_one_rolled_loop_an_access(name: str, consts: tuple, ops: int) -> None:
    """The edge path is written once an op, not once a run: each global tile access has one
    loop marked not to unroll (its runs are all of one length in the examples), and the
    element accesses appear once a loop."""
    ptx = _ptx(name, consts)
    assert ptx.count('.pragma "nounroll"') == ops
    got = _accesses(ptx)
    assert got["ld.global.b16"] + got["st.global.b16"] <= 8 * ops, got


def test_the_gemm_epilogue_is_stmatrix_and_a_tma_store() -> None:
    """Each consumer thread writes its 128 values with 16 stmatrix.x4 (16 columns each), and
    thread 0 copies the 128 x 256 tile out in four 64-column slices, one TMA box and one bulk
    group each: no global store and no edge path at all (TMA clips at the tensor's edges)."""
    ptx = _ptx("gemm.tk")
    assert ptx.count("stmatrix.sync.aligned.m8n8.x4.shared.b16") == 16
    assert ptx.count("cp.async.bulk.tensor.2d.global.shared::cta") == 4
    assert ptx.count("cp.async.bulk.commit_group") == 4
    # Before each slice is written (the first: every copy done; the others: all but the
    # newest), and once at the end.
    assert ptx.count("cp.async.bulk.wait_group.read \t0;") == 2
    assert ptx.count("cp.async.bulk.wait_group.read \t1;") == 3
    assert "st.global" not in ptx and "__local_depot" not in ptx
