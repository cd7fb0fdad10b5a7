"""Hopper layouts (``tkc/ir/layouts.py``) against the PTX-FACTS formulas, computed here again
independently: shared offsets are a bijection with the swizzle bits of §2, descriptors hit the
§2 values and read back the same addresses as ``offset``, register fragments cover their tile
exactly once (§1), reductions and the stmatrix epilogue (§6) agree with the accumulator, and
every layout round-trips through the textual IR inside a tile type.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tkc.dtypes import bf16, f8e4m3, f16, f32
from tkc.ir.layouts import (
    Blocked,
    SharedLayout,
    Slice,
    WgmmaAccumulator,
    WgmmaOperandA,
    choose_blocked,
    choose_swizzle,
    descriptor_address,
    first_holders,
    reduce_plan,
)
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.types import TileType
from tkc.ir.verifier import verify

ACC_NS = (8, 64, 128, 256)


def grid(rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    return np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")


def swizzle_by_bits(addr: int, sw: int) -> int:
    """PTX-FACTS §2 read literally, one bit at a time: bits [4:6] ^= [7:9] (128B),
    [4:5] ^= [7:8] (64B), 4 ^= 7 (32B)."""
    nbits = {0: 0, 32: 1, 64: 2, 128: 3}[sw]
    for b in range(nbits):
        addr ^= ((addr >> (7 + b)) & 1) << (4 + b)
    return addr


@st.composite
def shared_layouts(draw: st.DrawFn) -> SharedLayout:
    dt = draw(st.sampled_from([bf16, f16, f8e4m3, f32]))
    sw = draw(st.sampled_from([0, 32, 64, 128]))
    atom_elems = (sw or 16) // (dt.bits // 8)
    return SharedLayout(8 * draw(st.integers(1, 16)), atom_elems * draw(st.integers(1, 4)), dt,
                        draw(st.sampled_from(["k", "mn"])), sw)


# --------------------------------------------------------------------------- shared tiles
@settings(max_examples=60, deadline=None)
@given(shared_layouts())
def test_offset_is_a_bijection_onto_the_tile(lay: SharedLayout) -> None:
    r, c = grid(lay.rows, lay.cols)
    off = lay.offset(r, c)
    eb = lay.elem_bytes
    assert off.min() >= 0 and off.max() + eb <= lay.size_bytes
    assert np.all(off % eb == 0)
    assert len(np.unique(off)) == off.size  # every element its own bytes, no gaps
    # 16-byte chunks of a row stay contiguous and 16-B aligned: the swizzle moves chunks only.
    per16 = 16 // eb
    chunks = off.reshape(lay.rows, lay.cols // per16, per16)
    assert np.all(chunks[..., 0] % 16 == 0)
    assert np.all(np.diff(chunks, axis=-1) == eb)


@settings(max_examples=60, deadline=None)
@given(shared_layouts())
def test_offset_is_boxes_of_row_major_atoms_with_the_bit_swizzle(lay: SharedLayout) -> None:
    eb, atom = lay.elem_bytes, lay.swizzle or 16
    per_row = atom // eb
    for row in range(0, lay.rows, 3):
        for col in range(0, lay.cols, 5):
            linear = (col // per_row) * lay.rows * atom + row * atom + (col % per_row) * eb
            assert int(lay.offset(row, col)) == swizzle_by_bits(linear, lay.swizzle)


def test_sw128_rows_permute_chunks_by_row_mod_8() -> None:
    lay = SharedLayout(64, 64, bf16)
    for row in range(16):
        chunk_of = [int(lay.offset(row, 8 * j)) % 128 // 16 for j in range(8)]
        assert chunk_of == [j ^ (row % 8) for j in range(8)]


def test_wide_inner_dim_is_boxes_back_to_back() -> None:
    lay = SharedLayout(64, 128, bf16, "mn")  # PTX-FACTS §2: two 64x64 boxes
    assert int(lay.offset(0, 64)) == 8192
    r, c = grid(64, 64)
    assert np.array_equal(lay.offset(r, c) + 8192, lay.offset(r, c + 64))
    box = lay.tma_box()
    assert box.dims == (64, 64) and box.count == (2, 1) and box.inner_stride == 8192
    assert lay.tma_swizzle_enum() == 3 and lay.alignment == 1024 and lay.size_bytes == 16384


@pytest.mark.parametrize(("sw", "enum", "align", "box_inner"), [(0, 0, 128, 8), (32, 1, 256, 16),
                                                                (64, 2, 512, 32), (128, 3, 1024, 64)])
def test_tma_box_and_alignment(sw: int, enum: int, align: int, box_inner: int) -> None:
    lay = SharedLayout(512, 128, bf16, "k", sw)
    box = lay.tma_box()
    assert box.dims == (box_inner, 256) and box.count == (128 // box_inner, 2)
    assert box_inner * 2 <= (sw or 256)  # §3: boxDim[0] bytes <= swizzle span
    assert (box.dims[0] * 2) % 16 == 0
    assert box.outer_stride == 256 * (sw or 16)
    assert lay.tma_swizzle_enum() == enum and lay.alignment == align


@pytest.mark.parametrize(("extent", "dtype", "sw"), [(64, bf16, 128), (128, bf16, 128), (32, bf16, 64),
                                                     (96, bf16, 64), (16, bf16, 32), (48, bf16, 32),
                                                     (8, bf16, 0), (24, bf16, 0), (128, f8e4m3, 128),
                                                     (32, f32, 128), (8, f32, 32), (64, f8e4m3, 64)])
def test_choose_swizzle(extent: int, dtype, sw: int) -> None:
    assert choose_swizzle(extent, dtype) == sw
    SharedLayout(64, extent, dtype, "k", sw)  # the choice always makes a valid layout


@pytest.mark.parametrize("kwargs", [dict(rows=60, cols=64), dict(rows=64, cols=40),
                                    dict(rows=64, cols=64, swizzle=16), dict(rows=64, cols=64, major="m")])
def test_bad_shared_layouts_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SharedLayout(dtype=bf16, **kwargs)


# --------------------------------------------------------------------------- descriptors
def test_k_major_sw128_descriptor_matches_ptx_facts() -> None:
    lay = SharedLayout(64, 64, bf16, "k", 128)
    for addr in (0, 0x400, 0x8000, 0x1fc00):
        d0 = lay.descriptor(addr)
        assert d0 == 0x4000004000010000 | (addr >> 4)
        assert [lay.descriptor(addr, k) - d0 for k in range(4)] == [0, 2, 4, 6]
    assert lay.k_steps == 4
    fp8 = SharedLayout(64, 128, f8e4m3, "k", 128)  # k32 steps also add 32 B
    assert fp8.k_steps == 4 and fp8.descriptor(0, 1) - fp8.descriptor(0) == 2


def test_mn_major_descriptor_matches_ptx_facts() -> None:
    lay = SharedLayout(64, 128, bf16, "mn", 128)  # K=64 rows, N=128 as two 64x64 boxes
    d0 = lay.descriptor(0)
    assert (d0 >> 16) & 0x3FFF == 512  # LBO 8192 B
    assert (d0 >> 32) & 0x3FFF == 64  # SBO 1024 B
    assert d0 >> 62 == 1
    assert [lay.descriptor(0, k) - d0 for k in range(4)] == [0, 128, 256, 384]


def test_descriptor_rejects_misaligned_base_and_fp8_mn_major() -> None:
    with pytest.raises(ValueError):
        SharedLayout(64, 64, bf16).descriptor(0x200)
    with pytest.raises(ValueError):
        SharedLayout(64, 128, f8e4m3, "mn").descriptor(0)
    with pytest.raises(ValueError):
        SharedLayout(64, 64, bf16).descriptor(0, 4)


@settings(max_examples=60, deadline=None)
@given(shared_layouts(), st.data())
def test_descriptor_reads_back_the_tile_layout(lay: SharedLayout, data: st.DataObject) -> None:
    """What wgmma reads through the descriptor (the canonical layout, decoded from its fields)
    is where ``offset`` put each element, for every K-step and M/N block (8-bit MN-major: as
    tcgen05's ``kind::f8f6f4`` reads it)."""
    assume(lay.k_steps > 0 and (lay.major == "k" or lay.elem_bytes in (1, 2)))  # wgmma or tcgen05 reads it
    base = lay.alignment * data.draw(st.integers(0, 8))
    k_step = data.draw(st.integers(0, lay.k_steps - 1))
    kk = lay.k_per_step
    k0 = k_step * kk
    if lay.major == "k":
        mn_start = 8 * data.draw(st.integers(0, lay.rows // 8 - 1))
        m, k = grid(lay.rows - mn_start, kk)
        want = base + lay.offset(mn_start + m, k0 + k)
    else:
        mn_start = lay.box_cols * data.draw(st.integers(0, lay.cols // lay.box_cols - 1))
        m, k = grid(lay.cols - mn_start, kk)
        want = base + lay.offset(k0 + k, mn_start + m)
    desc = lay.descriptor(base, k_step, mn_start, mn_8bit=lay.elem_bytes == 1)
    assert np.array_equal(descriptor_address(desc, lay.major, m, k, lay.dtype), want)


# --------------------------------------------------------------------------- register fragments
def acc_formula(t: int, i: int) -> tuple[int, int]:
    """PTX-FACTS §1, verbatim."""
    w, lane = t // 32, t % 32
    return 16 * w + lane // 4 + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (lane % 4) + (i & 1)


def assert_covers_once_and_owner_inverts(acc: WgmmaAccumulator) -> None:
    """Every element held by exactly one (thread, value), and ``owner`` finds it."""
    t, i = grid(acc.threads, acc.regs)
    r, c = acc.coords(t, i)
    seen = np.zeros(acc.shape, dtype=int)
    np.add.at(seen, (r, c), 1)
    assert np.all(seen == 1)
    t2, i2 = acc.owner(r, c)
    assert np.array_equal(t2, t) and np.array_equal(i2, i)


@pytest.mark.parametrize("n", ACC_NS)
@pytest.mark.parametrize("wg", [1, 2])
def test_accumulator_covers_its_tile_once(n: int, wg: int) -> None:
    acc = WgmmaAccumulator(n, wg)
    assert acc.regs == n // 2 and acc.shape == (64 * wg, n)
    assert_covers_once_and_owner_inverts(acc)
    for tt, ii in [(0, 0), (5, 3), (37, 2), (127, n // 2 - 1)]:
        assert tuple(int(x) for x in acc.coords(tt, ii)) == acc_formula(tt, ii)
    if wg == 2:
        assert tuple(int(x) for x in acc.coords(165, 2)) == (64 + acc_formula(37, 2)[0], acc_formula(37, 2)[1])


@pytest.mark.parametrize("n", [8, 64, 128])
@pytest.mark.parametrize("wg", [1, 2])
@pytest.mark.parametrize("slices", [2, 3, 4])
def test_slices_of_a_warpgroup_are_m64_fragments(n: int, wg: int, slices: int) -> None:
    """With ``slices=S`` warpgroup g holds rows [64 S g, 64 S (g + 1)): values [m n/2, (m + 1) n/2)
    are the §1 fragment of its rows 64 m on, so each part is what one m64 wgmma writes."""
    acc = WgmmaAccumulator(n, wg, slices)
    rows = 64 * slices
    assert acc.shape == (rows * wg, n) and acc.regs == slices * n // 2 and acc.slice_regs == n // 2
    assert acc.threads == 128 * wg
    assert_covers_once_and_owner_inverts(acc)
    for tt in (0, 37, 127, 128 * wg - 1):
        g, local = divmod(tt, 128)
        for ii in (0, n // 2 - 1):
            for m in range(slices):
                row, col = acc_formula(local, ii)
                assert tuple(int(x) for x in acc.coords(tt, m * (n // 2) + ii)) == (rows * g + 64 * m + row, col)
    assert str(acc) == f"#wgmma_acc<{n}{', wg=2' if wg == 2 else ''}, slices={slices}>"
    with pytest.raises(ValueError, match="1 to 4 slices"):
        WgmmaAccumulator(n, wg, 5)


def test_fragment_ranges_are_checked() -> None:
    with pytest.raises(ValueError):
        WgmmaAccumulator(64).coords(128, 0)
    with pytest.raises(ValueError, match="reg out of range"):
        WgmmaAccumulator(64).coords(0, 32)
    with pytest.raises(ValueError):
        WgmmaAccumulator(64).owner(0, 64)
    with pytest.raises(ValueError):
        WgmmaAccumulator(12)
    with pytest.raises(ValueError):
        WgmmaOperandA(24)


@pytest.mark.parametrize("k", [16, 64])
def test_operand_a_is_k_steps_of_the_64x16_fragment(k: int) -> None:
    a = WgmmaOperandA(k)
    assert a.k_steps == k // 16 and a.regs == k // 2
    t, i = grid(128, k // 2)
    r, c = a.coords(t, i)
    seen = np.zeros((64, k), dtype=int)
    np.add.at(seen, (r, c), 1)
    assert np.all(seen == 1)
    for s in range(a.k_steps):
        b32 = a.step_registers(s)
        assert len(b32) == 4
        vals = np.array([2 * j + h for j in b32 for h in (0, 1)])  # 8 bf16 values in 4 b32 registers
        rs, cs = a.coords(np.arange(128)[:, None], vals[None, :])
        step_r, step_c = WgmmaOperandA(16).coords(np.arange(128)[:, None], np.arange(8)[None, :])
        assert np.array_equal(rs, step_r) and np.array_equal(cs, 16 * s + step_c)
    assert np.array_equal(np.stack(a.owner(r, c)), np.stack([t, i]))


def test_operand_a_of_two_slices_gives_each_slice_its_k_steps() -> None:
    """``#wgmma_a<K, slices=2>``: slice m's K-step s is the four b32 registers holding rows
    64 m .. 64 m + 63 of that step, the ones an accumulator of two slices converts into."""
    a = WgmmaOperandA(32, 1, 2)
    assert a.shape == (128, 32) and a.regs == 32
    for m in range(2):
        for s in range(a.k_steps):
            vals = np.array([2 * j + h for j in a.step_registers(s, m) for h in (0, 1)])
            rs, cs = a.coords(np.arange(128)[:, None], vals[None, :])
            step_r, step_c = WgmmaOperandA(16).coords(np.arange(128)[:, None], np.arange(8)[None, :])
            assert np.array_equal(rs, 64 * m + step_r) and np.array_equal(cs, 16 * s + step_c)
    with pytest.raises(ValueError, match="slice 2 out of range"):
        a.step_registers(0, 2)


@pytest.mark.parametrize("acc", [WgmmaAccumulator(64, 2), WgmmaAccumulator(32, 2, 2), WgmmaAccumulator(64, 1, 2),
                                 WgmmaAccumulator(32, 1, 3)],
                         ids=str)
def test_stmatrix_epilogue_stores_every_accumulator_value_in_place(acc: WgmmaAccumulator) -> None:
    """Simulate stmatrix.x4 per PTX-FACTS §6: lane t addresses row t%8 of matrix t/8; register j
    of lane t holds matrix j, row t/4, elements 2(t%4) and +1.  Slice m's instructions address
    64 m rows lower."""
    plan = acc.stmatrix_x4()
    stored = np.zeros(acc.shape, dtype=int)
    lane_rows, _ = acc.stmatrix_lane(np.arange(acc.threads))
    assert np.array_equal(lane_rows, plan.rows)
    for warp in range(acc.threads // 32):
        lanes = 32 * warp + np.arange(32)
        for m in range(acc.slices):
            for s in range(acc.n // 16):
                for j in range(4):
                    for r8 in range(8):
                        addr_lane = lanes[8 * j + r8]
                        row, col0 = plan.rows[addr_lane] + 64 * m, plan.cols[s, addr_lane]
                        for e in range(8):
                            src = lanes[4 * r8 + e // 2]
                            reg = plan.regs[m, s, j, e % 2]
                            assert tuple(int(x) for x in acc.coords(src, reg)) == (row, col0 + e)
                            stored[row, col0 + e] += 1
    assert np.all(stored == 1)
    assert plan.regs[0, 1].tolist() == [[8, 9], [10, 11], [12, 13], [14, 15]]  # P[4..7] = d[8..15]
    for m in range(1, acc.slices):
        assert plan.regs[m, 0, 0].tolist() == [m * acc.slice_regs, m * acc.slice_regs + 1]


# --------------------------------------------------------------------------- blocked layouts
def blocked_formula(lay: Blocked, t: int, i: int) -> tuple[int, ...]:
    """The ``Blocked`` docstring read literally, for one thread and value."""
    rank2 = len(lay.shape) == 2
    rows, cols = lay.shape if rank2 else (1, lay.shape[0])
    tr, tc = lay.lanes if rank2 else (1, 32)
    wr, wc = lay.warps if rank2 else (1, lay.warps[0])
    v = lay.vec
    grid_r, grid_c = tr * wr, v * tc * wc
    reps_c = max(cols // grid_c, 1)
    rep_r, rep_c, e = i // (reps_c * v), i // v % reps_c, i % v
    w, lane = t // 32, t % 32
    row = (rep_r * grid_r + (w // wc) * tr + lane // tc) % rows
    col = (rep_c * grid_c + ((w % wc) * tc + lane % tc) * v) % cols + e
    return (row, col) if rank2 else (col,)


BLOCKED = [
    Blocked((16, 512), 8, (1, 32), (4, 1)),
    Blocked((128, 64), 8, (4, 8), (4, 1)),
    Blocked((64, 96), 8, (8, 4), (4, 1)),  # 3 column repeats: extents need not be powers of two
    Blocked((8, 8), 1, (4, 8), (2, 2)),  # grid 16 x 16 wraps: 4 replicas of each element
    Blocked((2, 8), 1, (4, 8), (1, 4)),
    Blocked((1, 128), 1, (1, 32), (1, 4)),
    Blocked((64, 1), 1, (32, 1), (2, 2)),
    Blocked((256, 256), 4, (1, 32), (8, 1)),
    Blocked((512,), 4, (32,), (4,)),
    Blocked((64,), 1, (32,), (4,)),  # two replicas
    Blocked((8,), 2, (32,), (8,)),
]


@pytest.mark.parametrize("lay", BLOCKED, ids=str)
def test_blocked_follows_its_formula_and_covers_the_tile_evenly(lay: Blocked) -> None:
    t, i = grid(lay.threads, lay.regs)
    got = lay.coords(t, i)
    rng = np.random.default_rng(0)
    for tt, ii in zip(rng.integers(0, lay.threads, 50), rng.integers(0, lay.regs, 50)):
        assert tuple(int(c[tt, ii]) for c in got) == blocked_formula(lay, int(tt), int(ii))
    seen = np.zeros(lay.shape, dtype=int)
    np.add.at(seen, got, 1)
    copies = lay.threads * lay.regs // math.prod(lay.shape)
    assert copies >= 1 and np.all(seen == copies)
    # a thread never holds an element twice, and its runs are vec contiguous columns
    flat = np.ravel_multi_index(got, lay.shape)
    assert all(len(set(row)) == lay.regs for row in flat.tolist())
    runs = got[-1].reshape(lay.threads, -1, lay.vec)
    assert np.all(np.diff(runs, axis=-1) == 1) and np.all(runs[..., 0] % lay.vec == 0)


def test_blocked_known_values() -> None:
    lay = Blocked((16, 512), 8, (1, 32), (4, 1))
    assert lay.threads == 128 and lay.regs == 4 * 2 * 8
    # thread 33: warp 1 (warp row 1), lane 1 (lane col 1); value 9 = rep (0, 1), element 1
    assert tuple(int(x) for x in lay.coords(33, 9)) == (1, 256 + 8 + 1)
    # thread 127: warp row 3, lane col 31; value 63 = rep (3, 1), element 7
    assert tuple(int(x) for x in lay.coords(127, 63)) == (4 * 3 + 3, 256 + 31 * 8 + 7)
    one = Blocked((512,), 4, (32,), (4,))
    assert one.regs == 4 and int(one.coords(40, 2)[0]) == (32 + 8) * 4 + 2
    wrap = Blocked((8, 8), 1, (4, 8), (2, 2))
    # thread 100: warp 3 = (1, 1), lane 4 = (0, 4): row 4 % 8, col (8 + 4) % 8
    assert tuple(int(x) for x in wrap.coords(100, 0)) == (4, 4)
    assert tuple(int(x) for x in wrap.coords(68, 0)) == (4, 4)  # warp 2 = (1, 0): a replica


@pytest.mark.parametrize(("args", "msg"), [
    (((16, 16, 16), 1, (1, 32), (4, 1)), "rank 1 or 2"),
    (((16, 512), 8, (32,), (4, 1)), "one entry per axis"),
    (((16, 512), 0, (1, 32), (4, 1)), "positive"),
    (((16, 512), 8, (2, 32), (4, 1)), "32 lanes"),
    (((16, 512), 8, (1, 32), (2, 1)), "whole warpgroups"),
    (((16, 500), 8, (1, 32), (4, 1)), "vec=8 do not divide the 500 columns"),
    (((12, 512), 8, (1, 32), (8, 1)), "8 rows"),
    (((16, 48), 1, (1, 32), (4, 1)), "32 columns, which neither divides nor is a multiple of 48"),
    (((768,), 4, (32,), (4,)), "512 columns"),
])
def test_bad_blocked_layouts_are_rejected(args: tuple, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        Blocked(*args)


def test_blocked_accepts_lists_and_compares_by_value() -> None:
    assert Blocked([16, 512], 8, [1, 32], [4, 1]) == Blocked((16, 512), 8, (1, 32), (4, 1))
    assert hash(Blocked([512], 4, [32], [4])) == hash(Blocked((512,), 4, (32,), (4,)))


POW2_SHAPES = [(r, c) for r in (1, 2, 8, 16, 64, 256) for c in (1, 4, 8, 32, 128, 512, 1024)] + \
    [(c,) for c in (1, 8, 64, 128, 512, 4096)]


@pytest.mark.parametrize("threads", [128, 256])
@pytest.mark.parametrize("elem_bytes", [1, 2, 4])
def test_choose_blocked_gives_valid_busy_layouts(threads: int, elem_bytes: int) -> None:
    for shape in POW2_SHAPES + [(16, 512), (16, 256), (128, 64), (64, 96), (48, 64)]:
        lay = choose_blocked(shape, elem_bytes, threads)
        assert lay.shape == shape and lay.threads == threads
        assert lay.vec * elem_bytes <= 16
        size = math.prod(shape)
        if size >= threads:
            assert lay.threads * lay.regs == size  # every thread busy, no replicas
            if size & (size - 1) == 0:  # and vec as wide as that allows
                assert lay.vec == min(16 // elem_bytes, size // threads, shape[-1])
        else:
            assert lay.regs == lay.vec == 1  # replicas, each thread holding one element
        if len(shape) == 2 and size & (size - 1) == 0:
            # lanes go along a row as far as it has runs, so a warp reads contiguous memory
            assert lay.lanes[1] == min(32, shape[1] // lay.vec)
            # warps stay on rows whenever the rows can take them all
            if shape[0] % (lay.lanes[0] * threads // 32) == 0:
                assert lay.warps == (threads // 32, 1)


def test_choose_blocked_known_choices() -> None:
    assert str(choose_blocked((16, 512), 2, 128)) == "#blocked<16x512, vec=8, lanes=1x32, warps=4x1>"
    assert str(choose_blocked((128, 64), 2, 128)) == "#blocked<128x64, vec=8, lanes=4x8, warps=4x1>"
    assert str(choose_blocked((512,), 4, 128)) == "#blocked<512, vec=4, lanes=32, warps=4>"
    assert str(choose_blocked((64,), 4, 128)) == "#blocked<64, vec=1, lanes=32, warps=4>"
    assert str(choose_blocked((1, 128), 4, 128)) == "#blocked<1x128, vec=1, lanes=1x32, warps=1x4>"
    assert str(choose_blocked((8, 8), 4, 128)) == "#blocked<8x8, vec=1, lanes=4x8, warps=2x2>"


@pytest.mark.parametrize(("shape", "elem_bytes", "threads", "msg"), [
    ((12, 12), 2, 128, "a 12x12 tile does not spread over the program.s 128 threads"),
    ((3, 5), 4, 128, "a 3x5 tile does not spread"),
    ((24,), 4, 128, "a 24 tile does not spread.*e.g. 32"),
    ((2, 2, 2), 4, 128, "rank-1 or rank-2"),
    ((0, 8), 4, 128, "positive"),
    ((8, 8), 4, 96, "multiple of 128"),
    ((8, 8), 32, 128, "between 1 and 16"),
])
def test_choose_blocked_rejects_impossible_tiles(shape: tuple, elem_bytes: int, threads: int, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        choose_blocked(shape, elem_bytes, threads)


# --------------------------------------------------------------------------- slices
ACCS = [WgmmaAccumulator(64), WgmmaAccumulator(128, 2), WgmmaAccumulator(8), WgmmaOperandA(32)]
PARENTS = ACCS + [b for b in BLOCKED if len(b.shape) == 2]
SLICES = [Slice(p, a, keep) for p in PARENTS for a in (0, 1) for keep in (False, True)]


@pytest.mark.parametrize("sl", SLICES, ids=str)
def test_slice_slot_holds_the_kept_coordinate_of_its_parent_values(sl: Slice) -> None:
    parent, a = sl.parent, sl.axis
    shape = list(parent.shape)
    shape[a] = 1
    assert sl.shape == (tuple(shape) if sl.keep else tuple(shape[:a] + shape[a + 1:]))
    assert sl.threads == parent.threads
    t, i = grid(parent.threads, parent.regs)
    slots = np.array([sl.slot_of(j) for j in range(parent.regs)])
    assert sorted(set(slots.tolist())) == list(range(sl.regs))
    assert [int(np.argmax(slots == s)) for s in range(sl.regs)] == sorted(  # first-appearance order
        int(np.argmax(slots == s)) for s in range(sl.regs))
    pc = list(parent.coords(t, i))
    pc[a] = np.zeros_like(pc[a])
    want = pc if sl.keep else pc[:a] + pc[a + 1:]
    got = sl.coords(t, slots[i])
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    # a thread's slots are distinct elements, and together the threads cover the whole slice
    flat = np.ravel_multi_index(sl.coords(*grid(sl.threads, sl.regs)), sl.shape)
    assert all(len(set(row)) == sl.regs for row in flat.tolist())
    assert set(flat.ravel().tolist()) == set(range(math.prod(sl.shape)))


@pytest.mark.parametrize("wg", [1, 2])
def test_row_slice_of_an_accumulator(wg: int) -> None:
    acc = WgmmaAccumulator(64, wg)
    rows = Slice(acc, 1)
    assert rows.regs == 2 and rows.shape == (64 * wg,)
    assert [rows.slot_of(i) for i in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]  # (i >> 1) & 1
    plan = reduce_plan(acc, 1)
    assert plan.result == rows and plan.shuffle_xor == (1, 2) and plan.warp_xor == ()
    for row in range(64 * wg):
        t, s = np.nonzero(rows.coords(*grid(rows.threads, 2))[0] == row)
        assert len(set((t // 4).tolist())) == 1 and len(t) == 4  # the 4 threads of one quad
        assert len(set(s.tolist())) == 1


@pytest.mark.parametrize("n", [8, 64])
@pytest.mark.parametrize("wg", [1, 2])
def test_column_slice_of_an_accumulator(n: int, wg: int) -> None:
    acc = WgmmaAccumulator(n, wg)
    cols = Slice(acc, 0)
    assert cols.regs == n // 4 and cols.shape == (n,)
    assert [cols.slot_of(i) for i in range(acc.regs)] == [2 * (i >> 2) + (i & 1) for i in range(acc.regs)]
    plan = reduce_plan(acc, 0)
    assert plan.shuffle_xor == (4, 8, 16) and plan.warp_xor == ((1, 2) if wg == 1 else (1, 2, 4))
    held = cols.coords(*grid(cols.threads, cols.regs))[0]
    for col in range(n):
        t, _ = np.nonzero(held == col)
        assert len(t) == 8 * 4 * wg  # every thread holding the column: 8 per warp
        for w in range(4 * wg):  # within a warp the holders are one xor-orbit of 4, 8, 16
            lanes = t[t // 32 == w] % 32
            assert set(lanes.tolist()) == {int(lanes[0]) ^ m for m in range(0, 32, 4)}


def test_slice_errors() -> None:
    with pytest.raises(ValueError, match="would be a scalar"):
        Slice(Blocked((512,), 4, (32,), (4,)), 0)
    with pytest.raises(ValueError, match="axis 2 out of range"):
        Slice(WgmmaAccumulator(64), 2)
    with pytest.raises(ValueError, match="not a register layout"):
        Slice(SharedLayout(64, 64, bf16), 0)
    with pytest.raises(ValueError, match="reg out of range"):
        Slice(WgmmaAccumulator(64), 1).coords(0, 2)
    assert Slice(WgmmaAccumulator(64), 1) == Slice(WgmmaAccumulator(64), 1)
    assert Slice(WgmmaAccumulator(64), 1) != Slice(WgmmaAccumulator(64), 1, keep=True)


# --------------------------------------------------------------------------- thread parts
class Sym:
    """What codegen passes to ``thread_coords``: a value that supports only ``+ - * // % & >> ^``
    with an int (or another Sym) on the right, and ``int + Sym``.  Anything else - a
    comparison, truth test, numpy call, int on the left of ``*`` - raises."""

    __array_ufunc__ = None  # numpy must not absorb a Sym into an object array
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, v: np.ndarray) -> None:
        self.v = v

    def _op(self, other: object, f) -> Sym:
        if isinstance(other, Sym):
            return Sym(f(self.v, other.v))
        if type(other) is not int:
            raise TypeError(f"Sym op with {type(other).__name__}")
        return Sym(f(self.v, other))

    def __add__(self, o: object) -> Sym:
        return self._op(o, lambda a, b: a + b)

    def __radd__(self, o: object) -> Sym:
        return self._op(o, lambda a, b: b + a)

    def __sub__(self, o: object) -> Sym:
        return self._op(o, lambda a, b: a - b)

    def __mul__(self, o: object) -> Sym:
        return self._op(o, lambda a, b: a * b)

    def __floordiv__(self, o: object) -> Sym:
        return self._op(o, lambda a, b: a // b)

    def __mod__(self, o: object) -> Sym:
        return self._op(o, lambda a, b: a % b)

    def __and__(self, o: object) -> Sym:
        return self._op(o, lambda a, b: a & b)

    def __rshift__(self, o: object) -> Sym:
        return self._op(o, lambda a, b: a >> b)

    def __xor__(self, o: object) -> Sym:
        return self._op(o, lambda a, b: a ^ b)

    def _refuse(self, *args: object) -> None:
        raise TypeError("not supported by codegen symbols")

    __bool__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse  # type: ignore[assignment]
    __index__ = __int__ = __array__ = __neg__ = __or__ = __lshift__ = __truediv__ = _refuse


ALL_LAYOUTS = ACCS + BLOCKED + SLICES


@pytest.mark.parametrize("lay", ALL_LAYOUTS, ids=str)
def test_thread_coords_work_on_codegen_symbols_and_split_coords(lay) -> None:
    t = np.arange(lay.threads)
    sym = lay.thread_coords(Sym(t))
    num = lay.thread_coords(t)
    assert len(sym) == len(num) == len(lay.shape)
    for s, n in zip(sym, num):
        got = s.v if isinstance(s, Sym) else s
        assert isinstance(got, (np.ndarray, int)), "constant parts are python ints"
        assert np.array_equal(np.broadcast_to(got, t.shape), np.broadcast_to(n, t.shape))
    tt, i = grid(lay.threads, lay.regs)
    for a, c in enumerate(lay.coords(tt, i)):
        parts = np.array([lay.reg_coords(j)[a] for j in range(lay.regs)])
        assert all(type(lay.reg_coords(j)[a]) is int for j in range(lay.regs))
        assert np.array_equal(c, np.broadcast_to(num[a], t.shape)[:, None] + parts[None, :])


def test_sym_refuses_what_codegen_cannot_do() -> None:
    s = Sym(np.arange(4))
    for bad in (lambda: 2 * s, lambda: s < 1, lambda: bool(s), lambda: np.asarray(s) + 1,
                lambda: s + np.int64(1), lambda: s | 1, lambda: np.maximum(s, 1)):
        with pytest.raises(TypeError):
            bad()


# --------------------------------------------------------------------------- reductions
def simulate(lay, axis: int, tile: np.ndarray, op) -> np.ndarray:
    """Execute ``reduce_plan`` the way docs/hopper.md says the emulator and codegen do:
    combine each group in thread, then each lane butterfly, then each warp exchange."""
    plan = reduce_plan(lay, axis)
    t, i = grid(lay.threads, lay.regs)
    vals = tile[lay.coords(t, i)]
    acc = np.stack([op.reduce(vals[:, list(g)], axis=1) for g in plan.groups], axis=1)
    tid = np.arange(lay.threads)
    for m in plan.shuffle_xor:
        acc = op(acc, acc[tid ^ m])
    for m in plan.warp_xor:
        acc = op(acc, acc[tid ^ (32 * m)])
    return acc


REDUCIBLE = ACCS + [WgmmaAccumulator(256, 2)] + BLOCKED + [
    choose_blocked(s, eb, th) for s in [(16, 512), (128, 64), (8, 8), (2, 8), (1, 128), (64, 1), (64,), (8,)]
    for eb in (1, 4) for th in (128, 256)]


@pytest.mark.parametrize("lay", REDUCIBLE, ids=str)
@pytest.mark.parametrize("op", [np.add, np.maximum], ids=["sum", "max"])
def test_reduce_plan_reduces_exactly(lay, op) -> None:
    """Every thread ends with the exact reduction of each of its result slots: a missing mask
    leaves a partial result, an extra one (a replica combined) counts elements twice."""
    rng = np.random.default_rng(1)
    tile = rng.integers(1, 1 << 20, lay.shape)
    for axis in range(len(lay.shape)):
        got = simulate(lay, axis, tile, op)
        plan = reduce_plan(lay, axis)
        if plan.result is None:
            assert got.shape == (lay.threads, 1) and np.all(got == op.reduce(tile, axis=None))
            continue
        want = op.reduce(tile, axis=axis)
        t, s = grid(plan.result.threads, plan.result.regs)
        assert np.array_equal(got, want[plan.result.coords(t, s)])
        assert plan.result == Slice(lay, axis)
        assert sorted(i for g in plan.groups for i in g) == list(range(lay.regs))
        assert all(list(g) == sorted(g) for g in plan.groups)
        assert list(plan.shuffle_xor) == sorted(plan.shuffle_xor) and list(plan.warp_xor) == sorted(plan.warp_xor)


def test_reduce_plan_of_blocked_layouts() -> None:
    rows = reduce_plan(Blocked((16, 512), 8, (1, 32), (4, 1)), 1)
    assert rows.shuffle_xor == (1, 2, 4, 8, 16) and rows.warp_xor == ()  # a row stays in one warp
    assert rows.groups == (tuple(range(16)), tuple(range(16, 32)), tuple(range(32, 48)), tuple(range(48, 64)))
    cols = reduce_plan(Blocked((16, 512), 8, (1, 32), (4, 1)), 0)
    assert cols.shuffle_xor == () and cols.warp_xor == (1, 2) and cols.result.regs == 16
    # 4 warps over 8 rows: warps 0 and 2 hold the same rows, so only the lane masks apply
    wrap = reduce_plan(Blocked((8, 8), 1, (4, 8), (2, 2)), 1)
    assert wrap.shuffle_xor == (1, 2, 4) and wrap.warp_xor == ()
    scalar = reduce_plan(Blocked((64,), 1, (32,), (4,)), 0)
    assert scalar.result is None and scalar.groups == ((0,),)
    assert scalar.shuffle_xor == (1, 2, 4, 8, 16) and scalar.warp_xor == (1,)  # warps 2, 3 replicate 0, 1


def test_a_warps_group_is_the_warps_that_differ_from_it_in_the_plans_warp_bits() -> None:
    # (codegen and the emulator combine a group's partials in this order, one round trip)
    scalar = reduce_plan(Blocked((64,), 1, (32,), (4,)), 0)
    assert scalar.group_offsets == (0, 1)  # warps 2, 3 replicate 0, 1: a group of two
    cols = reduce_plan(Blocked((16, 512), 8, (1, 32), (4, 1)), 0)
    assert cols.group_offsets == (0, 1, 2, 3)
    assert reduce_plan(Blocked((16, 512), 8, (1, 32), (4, 1)), 1).group_offsets == (0,)
    # bits that are not the lowest: warps 2x4 over [rows, cols], summed down the rows
    down = reduce_plan(Blocked((64, 64), 2, (8, 4), (2, 4)), 0)
    assert down.warp_xor == (4,) and down.group_offsets == (0, 4)


def test_reduce_plan_rejects_what_a_butterfly_cannot_do() -> None:
    # three warpgroups: the warp partner w ^ 8 of warps 4..7 does not exist
    with pytest.raises(ValueError, match="cannot combine it along axis 0 by shuffles"):
        reduce_plan(WgmmaAccumulator(64, 3), 0)
    assert reduce_plan(WgmmaAccumulator(64, 3), 1).shuffle_xor == (1, 2)  # rows stay in a quad
    with pytest.raises(ValueError, match="cannot combine it along axis 0"):
        reduce_plan(Blocked((3, 128), 1, (1, 32), (3, 4)), 0)
    with pytest.raises(ValueError, match="axis 2 out of range"):
        reduce_plan(WgmmaAccumulator(64), 2)


# --------------------------------------------------------------------------- textual form
LAYOUTS = [
    SharedLayout(64, 64, bf16, "k", 128),
    SharedLayout(64, 128, bf16, "mn", 128),
    SharedLayout(128, 32, f8e4m3, "k", 32),
    SharedLayout(64, 8, f16, "k", 0),
    WgmmaAccumulator(128),
    WgmmaAccumulator(256, 2),
    WgmmaOperandA(64),
    *BLOCKED,
    *SLICES,
    Slice(Slice(WgmmaAccumulator(64, 2), 1, keep=True), 0),
    WgmmaAccumulator(128, 2, 2),
    WgmmaOperandA(64, 1, 2),
    Slice(WgmmaAccumulator(128, 1, 2), 1),
]


@pytest.mark.parametrize("lay", LAYOUTS, ids=str)
def test_layout_round_trips_inside_a_tile_type(lay: object) -> None:
    dt = lay.dtype if isinstance(lay, SharedLayout) else f32
    space = "smem" if isinstance(lay, SharedLayout) else "reg"
    shape = (lay.rows, lay.cols) if isinstance(lay, SharedLayout) else lay.shape
    ty = TileType(shape, dt, space, lay)
    text = f"tile.kernel @k {{\n  %x = tile.constant {{value = 0.0}} : {ty}\n  tile.return\n}}\n"
    m = parse_module(text)
    verify(m)
    assert print_module(m, locs=False) == text
    assert m.ops[0].body.ops[0].results[0].type == ty


def test_layout_text_forms() -> None:
    assert str(Slice(WgmmaAccumulator(128, 2), 1)) == "#slice<#wgmma_acc<128, wg=2>, axis=1>"
    assert (str(Slice(Blocked((16, 512), 8, (1, 32), (4, 1)), 0, keep=True))
            == "#slice<#blocked<16x512, vec=8, lanes=1x32, warps=4x1>, axis=0, keep>")
    text = "%x = tile.constant {value = 0.0} : tile<128xf32, reg, #slice<#wgmma_acc<128,wg=2>,axis=1>>\n"
    ty = parse_module(text).ops[0].results[0].type
    assert ty.layout == Slice(WgmmaAccumulator(128, 2), 1)
    assert str(ty) == "tile<128xf32, reg, #slice<#wgmma_acc<128, wg=2>, axis=1>>"


@pytest.mark.parametrize("bad", ["#smem<64x64xbf16, k, sw16>", "#smem<64x64xbf17, k, sw128>", "#smem<64x64>",
                                 "#wgmma_acc<12>", "#wgmma_acc<64, wg=0>", "#wgmma_acc<64, slices=5>",
                                 "#wgmma_acc<64, slices=2, wg=2>",
                                 "#blocked<12x12, vec=1, lanes=32x1, warps=4x1>",
                                 "#blocked<16x512, vec=8, lanes=2x32, warps=4x1>",
                                 "#blocked<16x512, vec=8, lanes=1x32>",
                                 "#slice<#wgmma_acc<64>, axis=2>", "#slice<#wgmma_acc<64>>",
                                 "#slice<#wgmma_acc<64>, axis=1, kept>",
                                 "#slice<#blocked<512, vec=4, lanes=32, warps=4>, axis=0>",
                                 "#slice<#smem<64x64xbf16, k, sw128>, axis=0>", "#slice<#nope<1>, axis=0>",
                                 "#slice<#wgmma_acc<12>, axis=0>"])
def test_bad_layout_text_is_a_syntax_error(bad: str) -> None:
    from tkc.errors import TkcSyntaxError

    with pytest.raises(TkcSyntaxError, match="bad layout"):
        parse_module(f"%x = tile.constant {{value = 0.0}} : tile<64x64xf32, reg, {bad}>\n")


def test_removed_vector_layouts_are_unknown() -> None:
    from tkc.errors import TkcSyntaxError

    with pytest.raises(TkcSyntaxError, match="unknown layout"):
        parse_module("%x = tile.constant {value = 0.0} : tile<64xf32, reg, #acc_rows<64>>\n")


def test_register_map() -> None:
    from tkc.ir.layouts import register_map

    acc, a = WgmmaAccumulator(128, 2), WgmmaOperandA(128, 2)
    assert register_map(acc, a) == tuple(range(acc.regs))  # an accumulator is already an A fragment
    # Row slices of accumulators of different widths hold the same rows in the same slots.
    assert register_map(Slice(WgmmaAccumulator(128, 2), 1), Slice(WgmmaAccumulator(64, 2), 1)) == (0, 1)
    # A blocked tile of the same shape puts elements on other threads.
    assert register_map(acc, choose_blocked((128, 128), 4, 256)) is None
    assert register_map(acc, WgmmaAccumulator(64, 2)) is None  # another shape


# ------------------------------------------------------------------ first holders
@pytest.mark.parametrize("layout", [
    Blocked((1, 16384), 8, (1, 32), (1, 4)), Blocked((16, 256), 4, (1, 32), (4, 1)),
    Blocked((1, 64), 1, (1, 32), (1, 4)), WgmmaAccumulator(64, 1),
    Slice(Blocked((1, 16384), 8, (1, 32), (1, 8)), 1), Slice(Blocked((16, 256), 4, (1, 32), (4, 1)), 1),
    Slice(Blocked((16, 256), 4, (1, 32), (4, 1)), 0), Slice(Blocked((64, 64), 2, (4, 8), (2, 2)), 1),
    Slice(Blocked((1, 3072), 8, (1, 32), (1, 12)), 1),  # 384 threads: not a power of two
], ids=str)
def test_first_holders_pick_each_element_exactly_once(layout):
    """Every element has exactly one first holder, and it is the lowest (thread, value) that
    holds it: what lets an exchange send each element once and count its bytes."""
    holders = first_holders(layout)
    assert holders is not None and len(holders) == layout.regs
    t = np.arange(layout.threads)[:, None]
    coords = np.stack([np.broadcast_to(c, (layout.threads, layout.regs))
                       for c in layout.coords(t, np.arange(layout.regs)[None, :])])
    sends = np.array([[(thread & m) == bits for m, bits in holders] for thread in range(layout.threads)])
    sent = [tuple(coords[:, thread, i]) for thread, i in zip(*np.nonzero(sends))]
    assert sorted(sent) == sorted(set(map(tuple, coords.reshape(len(layout.shape), -1).T)))
    first = {}
    for thread in range(layout.threads):
        for i in range(layout.regs):
            first.setdefault(tuple(coords[:, thread, i]), (thread, i))
    assert sorted(first.values()) == sorted(zip(*map(list, np.nonzero(sends))))


def test_first_holders_of_a_row_statistic_are_thread_zero():
    stat = Slice(Blocked((1, 16384), 8, (1, 32), (1, 4)), 1)
    assert first_holders(stat) == ((127, 0),)
    assert first_holders(Blocked((1, 64), 1, (1, 32), (1, 4))) == ((64, 0),)  # threads 64-127 repeat
    assert set(first_holders(WgmmaAccumulator(64, 1))) == {(0, 0)}  # no replicas: every thread
    assert first_holders(Slice(Blocked((1, 3072), 8, (1, 32), (1, 12)), 1)) == ((511, 0),)
