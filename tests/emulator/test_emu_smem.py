"""Shared memory (``tkc/emulator/smem.py``): element bit patterns, tiles written through a
``SharedLayout`` land on the bytes computed here independently from the PTX-FACTS §2 swizzle,
and the bookkeeping errors (alignment, bounds, uninitialized reads, missing proxy fence,
stage read leases)."""

from __future__ import annotations

import numpy as np
import pytest

from tkc.dtypes import bf16, f8e4m3, f8e5m2, f16, f32, i32, round_to
from tkc.emulator.smem import RaceError, SharedMemory, decode, encode
from tkc.errors import TkcEmulatorError
from tkc.ir.layouts import SharedLayout


@pytest.mark.parametrize("dt", [f32, f16, bf16, f8e4m3, f8e5m2])
def test_encode_decode_roundtrip(dt):
    rng = np.random.default_rng(0)
    x = round_to(rng.standard_normal(1000) * 8, dt)
    back = decode(encode(x, dt), dt)
    np.testing.assert_array_equal(back, x)
    assert np.array_equal(np.signbit(decode(encode(np.array([-0.0]), dt), dt)), [True])


@pytest.mark.parametrize("dt", [f8e4m3, f8e5m2])
def test_fp8_every_code(dt):
    codes = np.arange(256, dtype=np.uint8)
    vals = decode(codes[:, None], dt)
    keep = ~np.isnan(vals) & ~np.isinf(vals)
    np.testing.assert_array_equal(encode(vals[keep], dt)[:, 0], codes[keep])


def test_known_bit_patterns():
    assert encode(1.0, bf16).tolist() == [0x80, 0x3F]
    assert encode(1.0, f16).tolist() == [0x00, 0x3C]
    assert encode(1.0, f8e4m3).tolist() == [0x38]
    assert encode(1.0, f8e5m2).tolist() == [0x3C]
    assert encode(-2.0, f32).tolist() == [0, 0, 0, 0xC0]
    assert encode(448.0, f8e4m3).tolist() == [0x7E]
    assert encode(-7, i32).tolist() == [0xF9, 0xFF, 0xFF, 0xFF]


LAYOUTS = [
    SharedLayout(64, 64, bf16, "k", 128),
    SharedLayout(64, 128, bf16, "mn", 128),
    SharedLayout(32, 64, f16, "k", 64),
    SharedLayout(16, 32, bf16, "k", 32),
    SharedLayout(16, 16, bf16, "k", 0),
    SharedLayout(64, 128, f8e4m3, "k", 128),
    SharedLayout(8, 64, f32, "k", 128),
]


def bytes_by_hand(layout: SharedLayout, r: int, c: int) -> int:
    """PTX-FACTS §2 read literally: boxes one swizzle atom wide stored back to back, each a
    row-major rows x atom array; then bits [4:4+n) ^= bits [7:7+n) (n = log2(swizzle / 16))."""
    eb = layout.dtype.bits // 8
    atom = layout.swizzle or 16
    per_box = atom // eb
    lin = (c // per_box) * layout.rows * atom + r * atom + (c % per_box) * eb
    nbits = {0: 0, 32: 1, 64: 2, 128: 3}[layout.swizzle]
    for b in range(nbits):
        if (lin >> (7 + b)) & 1:
            lin ^= 1 << (4 + b)
    return lin


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_tile_roundtrip_and_bytes(layout):
    rng = np.random.default_rng(1)
    vals = round_to(rng.integers(-60, 60, (layout.rows, layout.cols)) / 4, layout.dtype)
    base = 2 * max(layout.alignment, 1024)
    smem = SharedMemory(base + layout.size_bytes + 1024)
    smem.write_tile(base, layout, vals)
    np.testing.assert_array_equal(smem.read_tile(base, layout), vals)
    eb = layout.dtype.bits // 8
    for r, c in [(0, 0), (1, 0), (0, 1), (7, layout.cols - 1), (layout.rows - 1, layout.cols // 2 + 1),
                 (3, 5), (layout.rows - 1, layout.cols - 1)]:
        a = base + bytes_by_hand(layout, r, c)
        assert smem.data[a:a + eb].tobytes() == encode(vals[r, c], layout.dtype).tobytes(), (r, c)
    # every byte of the tile was written exactly once: nothing outside it
    assert not smem.data[:base].any() and not smem.data[base + layout.size_bytes:].any()


def test_wrong_swizzle_reads_wrong_values():
    sw128 = SharedLayout(64, 64, bf16, "k", 128)
    sw64 = SharedLayout(64, 64, bf16, "k", 64)
    smem = SharedMemory(16384)
    vals = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) % 200
    smem.write_tile(0, sw128, vals)
    assert not np.array_equal(smem.read_tile(0, sw64), vals)


def test_alignment_and_bounds():
    layout = SharedLayout(64, 64, bf16, "k", 128)
    smem = SharedMemory(16384)
    with pytest.raises(TkcEmulatorError, match=r"at 0x200 is not 1024-B aligned"):
        smem.write_tile(512, layout, np.zeros((64, 64)))
    with pytest.raises(TkcEmulatorError, match="outside the 16384-B shared memory"):
        smem.write_tile(12288, layout, np.zeros((64, 64)))
    with pytest.raises(TkcEmulatorError, match="not 2-B aligned"):
        smem.read_elements(np.array([3]), bf16, reader="ld")


def test_uninitialized_read():
    layout = SharedLayout(8, 64, bf16, "k", 128)
    smem = SharedMemory(4096)
    smem.add_region("A[0]", 0, 1024)
    with pytest.raises(TkcEmulatorError, match=r"'my-ld' reads 'A\[0\]' .* which nothing has written"):
        smem.read_tile(0, layout, reader="my-ld")


def test_async_read_needs_proxy_fence():
    layout = SharedLayout(8, 64, bf16, "k", 128)
    smem = SharedMemory(4096)
    smem.write_tile(0, layout, np.ones((8, 64)), writer="epilogue st.shared")
    smem.read_tile(0, layout)  # generic reads see generic writes
    with pytest.raises(TkcEmulatorError, match="written by 'epilogue st.shared' through the generic proxy"):
        smem.read_tile(0, layout, reader="tma_store", proxy="async")
    smem.fence_proxy_async()
    smem.read_tile(0, layout, reader="tma_store", proxy="async")
    smem.write_tile(0, layout, np.ones((8, 64)), writer="tma", proxy="async")
    smem.read_tile(0, layout, reader="wgmma", proxy="async")
    assert smem.last_writer(5) == "tma" and smem.last_writer(2000) is None


def test_read_lease_race():
    layout = SharedLayout(8, 64, bf16, "k", 128)
    smem = SharedMemory(4096)
    smem.add_region("stage0", 0, 1024)
    smem.add_region("stage1", 1024, 1024)
    lease = smem.begin_read("stage0", reader="consumer: wgmma k-tile 0")
    smem.write_tile(1024, layout, np.ones((8, 64)), writer="tma k-tile 1")  # other stage: fine
    with pytest.raises(RaceError, match=r"race on 'stage0' \[0x0, 0x400\): 'tma k-tile 2' writes it while "
                                        r"'consumer: wgmma k-tile 0' is still reading it"):
        smem.write_tile(0, layout, np.ones((8, 64)), writer="tma k-tile 2")
    lease.release()
    smem.write_tile(0, layout, np.ones((8, 64)), writer="tma k-tile 2")
    with pytest.raises(TkcEmulatorError, match="released twice"):
        lease.release()
    with pytest.raises(TkcEmulatorError, match="overlaps region 'stage1'"):
        smem.add_region("bad", 1500, 100)


def test_lost_async_write():
    layout = SharedLayout(8, 64, bf16, "k", 128)
    smem = SharedMemory(4096)
    smem.add_region("stage0", 0, 1024)
    smem.write_tile(0, layout, np.ones((8, 64)), writer="tma k-tile 0", proxy="async")
    with pytest.raises(RaceError, match=r"lost data in 'stage0' \[0x0, 0x1\): 'tma k-tile 2' overwrites what "
                                        r"'tma k-tile 0' wrote there before anything read it"):
        smem.write_tile(0, layout, np.ones((8, 64)), writer="tma k-tile 2", proxy="async")
    smem.read_tile(0, layout, reader="wgmma", proxy="async")
    smem.write_tile(0, layout, np.ones((8, 64)), writer="tma k-tile 2", proxy="async")
    lax = SharedMemory(4096, check_lost_writes=False)
    lax.write_tile(0, layout, np.ones((8, 64)), writer="tma", proxy="async")
    lax.write_tile(0, layout, np.ones((8, 64)), writer="tma", proxy="async")
