"""Hopper layouts (``tkc/ir/layouts.py``) against the PTX-FACTS formulas, computed here again
independently: shared offsets are a bijection with the swizzle bits of §2, descriptors hit the
§2 values and read back the same addresses as ``offset``, register fragments cover their tile
exactly once (§1), reductions and the stmatrix epilogue (§6) agree with the accumulator, and
every layout round-trips through the textual IR inside a tile type.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tkc.dtypes import bf16, f8e4m3, f16, f32
from tkc.ir.layouts import (
    ColVector,
    RowVector,
    SharedLayout,
    WgmmaAccumulator,
    WgmmaOperandA,
    choose_swizzle,
    descriptor_address,
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
    is where ``offset`` put each element, for every K-step and M/N block."""
    assume(lay.k_steps > 0 and (lay.major == "k" or lay.elem_bytes == 2))  # wgmma can read it
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
    desc = lay.descriptor(base, k_step, mn_start)
    assert np.array_equal(descriptor_address(desc, lay.major, m, k, lay.dtype), want)


# --------------------------------------------------------------------------- register fragments
def acc_formula(t: int, i: int) -> tuple[int, int]:
    """PTX-FACTS §1, verbatim."""
    w, lane = t // 32, t % 32
    return 16 * w + lane // 4 + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (lane % 4) + (i & 1)


@pytest.mark.parametrize("n", ACC_NS)
@pytest.mark.parametrize("wg", [1, 2])
def test_accumulator_covers_its_tile_once(n: int, wg: int) -> None:
    acc = WgmmaAccumulator(n, wg)
    assert acc.regs_per_thread == n // 2 and acc.shape == (64 * wg, n)
    t, i = grid(acc.threads, acc.regs_per_thread)
    r, c = acc.coords(t, i)
    seen = np.zeros(acc.shape, dtype=int)
    np.add.at(seen, (r, c), 1)
    assert np.all(seen == 1)
    t2, i2 = acc.owner(r, c)
    assert np.array_equal(t2, t) and np.array_equal(i2, i)
    for tt, ii in [(0, 0), (5, 3), (37, 2), (127, n // 2 - 1)]:
        assert tuple(int(x) for x in acc.coords(tt, ii)) == acc_formula(tt, ii)
    if wg == 2:
        assert tuple(int(x) for x in acc.coords(165, 2)) == (64 + acc_formula(37, 2)[0], acc_formula(37, 2)[1])


def test_fragment_ranges_are_checked() -> None:
    with pytest.raises(ValueError):
        WgmmaAccumulator(64).coords(128, 0)
    with pytest.raises(ValueError):
        WgmmaAccumulator(64).owner(0, 64)
    with pytest.raises(ValueError):
        WgmmaAccumulator(12)
    with pytest.raises(ValueError):
        WgmmaOperandA(24)


@pytest.mark.parametrize("k", [16, 64])
def test_operand_a_is_k_steps_of_the_64x16_fragment(k: int) -> None:
    a = WgmmaOperandA(k)
    assert a.k_steps == k // 16 and a.regs_per_thread == k // 2
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


@pytest.mark.parametrize("wg", [1, 2])
def test_row_vector_matches_accumulator_rows(wg: int) -> None:
    rv, acc = RowVector(wg), WgmmaAccumulator(64, wg)
    t, i = grid(acc.threads, acc.regs_per_thread)
    r, _ = acc.coords(t, i)
    assert np.array_equal(rv.coords(t, rv.slot_of_acc_reg(i)), r)
    threads, slot = rv.owners(np.arange(rv.length))
    for row in range(rv.length):
        quad = threads[row]
        assert len(set(quad // 4)) == 1  # one quad of one warp
        assert {int(q) ^ m for q in quad for m in (0, *rv.shuffle_xor_masks, 3)} == set(quad.tolist())
        assert np.all(rv.coords(quad, slot[row]) == row)
    holders = np.zeros(rv.length, dtype=int)
    np.add.at(holders, rv.coords(*grid(rv.threads, 2)), 1)
    assert np.all(holders == 4)


@pytest.mark.parametrize("n", [8, 64])
def test_col_vector_matches_accumulator_cols(n: int) -> None:
    cv, acc = ColVector(n), WgmmaAccumulator(n)
    t, i = grid(acc.threads, acc.regs_per_thread)
    _, c = acc.coords(t, i)
    assert np.array_equal(cv.coords(t, cv.slot_of_acc_reg(i)), c)
    threads, slot = cv.owners(np.arange(n))
    for col in range(n):
        assert np.all(cv.coords(threads[col], slot[col]) == col)
        lanes = threads[col] % 32
        # within a warp the holders are one xor-orbit of the masks 4, 8, 16
        assert set(lanes.tolist()) == {int(lanes[0]) ^ m for m in range(0, 32, 4)}
    assert cv.values_per_thread == n // 4


def test_stmatrix_epilogue_stores_every_accumulator_value_in_place() -> None:
    """Simulate stmatrix.x4 per PTX-FACTS §6: lane t addresses row t%8 of matrix t/8; register j
    of lane t holds matrix j, row t/4, elements 2(t%4) and +1."""
    acc = WgmmaAccumulator(64, 2)
    plan = acc.stmatrix_x4()
    stored = np.full(acc.shape, -1)
    for warp in range(acc.threads // 32):
        lanes = 32 * warp + np.arange(32)
        for s in range(acc.n // 16):
            for j in range(4):
                for r8 in range(8):
                    addr_lane = lanes[8 * j + r8]
                    row, col0 = plan.rows[addr_lane], plan.cols[s, addr_lane]
                    for e in range(8):
                        src = lanes[4 * r8 + e // 2]
                        reg = plan.regs[s, j, e % 2]
                        assert tuple(int(x) for x in acc.coords(src, reg)) == (row, col0 + e)
                        stored[row, col0 + e] = 1
    assert np.all(stored == 1)
    assert plan.regs[1].tolist() == [[8, 9], [10, 11], [12, 13], [14, 15]]  # P[4..7] = d[8..15]


# --------------------------------------------------------------------------- textual form
LAYOUTS = [
    SharedLayout(64, 64, bf16, "k", 128),
    SharedLayout(64, 128, bf16, "mn", 128),
    SharedLayout(128, 32, f8e4m3, "k", 32),
    SharedLayout(64, 8, f16, "k", 0),
    WgmmaAccumulator(128),
    WgmmaAccumulator(256, 2),
    WgmmaOperandA(64),
    RowVector(),
    RowVector(2),
    ColVector(128),
    ColVector(64, 2),
]


def shape_of_layout(lay: object) -> tuple[int, ...]:
    if isinstance(lay, SharedLayout):
        return lay.rows, lay.cols
    if isinstance(lay, (WgmmaAccumulator, WgmmaOperandA)):
        return lay.shape
    return (lay.length,)


@pytest.mark.parametrize("lay", LAYOUTS, ids=str)
def test_layout_round_trips_inside_a_tile_type(lay: object) -> None:
    dt = lay.dtype if isinstance(lay, SharedLayout) else f32
    space = "smem" if isinstance(lay, SharedLayout) else "reg"
    ty = TileType(shape_of_layout(lay), dt, space, lay)
    text = f"tile.kernel @k {{\n  %x = tile.constant {{value = 0.0}} : {ty}\n  tile.return\n}}\n"
    m = parse_module(text)
    verify(m)
    assert print_module(m, locs=False) == text
    assert m.ops[0].body.ops[0].results[0].type == ty


@pytest.mark.parametrize("bad", ["#smem<64x64xbf16, k, sw16>", "#smem<64x64xbf17, k, sw128>", "#smem<64x64>",
                                 "#wgmma_acc<12>", "#wgmma_acc<64, wg=0>", "#acc_rows<32>", "#acc_cols<x>"])
def test_bad_layout_text_is_a_syntax_error(bad: str) -> None:
    from tkc.errors import TkcSyntaxError

    with pytest.raises(TkcSyntaxError, match="bad layout"):
        parse_module(f"%x = tile.constant {{value = 0.0}} : tile<64x64xf32, reg, {bad}>\n")
