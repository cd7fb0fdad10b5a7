"""TMA (``tkc/emulator/tma.py``): boxes land through the layout, out-of-bounds elements are
zero-filled and still counted in complete_tx, stores write only the in-bounds part."""

from __future__ import annotations

import numpy as np
import pytest

from tkc.dtypes import bf16, f8e4m3, round_to
from tkc.emulator.mbarrier import MBarrier
from tkc.emulator.smem import SharedMemory
from tkc.emulator.tma import tma_load, tma_store
from tkc.errors import TkcEmulatorError
from tkc.ir.layouts import SharedLayout


def padded_window(g: np.ndarray, row0: int, col0: int, rows: int, cols: int) -> np.ndarray:
    out = np.zeros((rows, cols), np.float32)
    for r in range(rows):
        for c in range(cols):
            if 0 <= row0 + r < g.shape[0] and 0 <= col0 + c < g.shape[1]:
                out[r, c] = g[row0 + r, col0 + c]
    return out


@pytest.mark.parametrize("layout", [SharedLayout(64, 128, bf16, "k", 128), SharedLayout(64, 128, bf16, "mn", 64),
                                    SharedLayout(32, 128, f8e4m3, "k", 128)], ids=str)
@pytest.mark.parametrize("row0,col0", [(0, 0), (40, 100), (-8, -16), (90, 0)])
def test_load_with_oob_fill(layout, row0, col0):
    rng = np.random.default_rng(2)
    g = round_to(rng.integers(1, 50, (100, 170)), layout.dtype)
    smem = SharedMemory(2048 + layout.size_bytes)
    bar = MBarrier("full", 1)
    bar.arrive_expect_tx(layout.size_bytes)
    tma_load(g, (col0, row0), layout.tma_box().dims, layout, smem, 1024, bar)
    assert bar.phase == 1 and bar.tx == 0  # OOB bytes counted too
    np.testing.assert_array_equal(smem.read_tile(1024, layout),
                                  padded_window(g, row0, col0, layout.rows, layout.cols))
    assert smem.last_writer(1024) == "tma_load"


def test_store_with_tails():
    layout = SharedLayout(64, 64, bf16, "k", 128)
    rng = np.random.default_rng(3)
    tile = round_to(rng.integers(-9, 9, (64, 64)), bf16)
    smem = SharedMemory(8192)
    smem.write_tile(0, layout, tile, writer="epilogue")
    smem.fence_proxy_async()
    g = np.full((100, 90), -1.0, np.float32)
    tma_store(smem, 0, layout, g, (60, 70), layout.tma_box().dims)
    expect = np.full((100, 90), -1.0, np.float32)
    expect[70:100, 60:90] = tile[:30, :30]
    np.testing.assert_array_equal(g, expect)
    g2 = np.full((10, 10), -1.0, np.float32)
    tma_store(smem, 0, layout, g2, (-60, -60), layout.tma_box().dims)
    np.testing.assert_array_equal(g2[:4, :4], tile[60:, 60:])
    assert (g2[4:] == -1).all() and (g2[:, 4:] == -1).all()


def test_store_without_fence_is_an_error():
    layout = SharedLayout(64, 64, bf16, "k", 128)
    smem = SharedMemory(8192)
    smem.write_tile(0, layout, np.zeros((64, 64)), writer="epilogue")
    with pytest.raises(TkcEmulatorError, match="'tma_store' .*no fence.proxy.async"):
        tma_store(smem, 0, layout, np.zeros((64, 64), np.float32), (0, 0), (64, 64))


def test_box_mismatch_and_alignment():
    layout = SharedLayout(64, 128, bf16, "k", 128)
    smem = SharedMemory(65536)
    bar = MBarrier("full", 1)
    g = np.zeros((64, 128), np.float32)
    with pytest.raises(TkcEmulatorError, match=r"tensor-map box \(128, 64\) does not match .*TMA box is \(64, 64\)"):
        tma_load(g, (0, 0), (128, 64), layout, smem, 0, bar)
    with pytest.raises(TkcEmulatorError, match="not 1024-B aligned"):
        tma_load(g, (0, 0), (64, 64), layout, smem, 128, bar)
    with pytest.raises(TkcEmulatorError, match="signed 32-bit"):
        tma_load(g, (2**31, 0), (64, 64), layout, smem, 0, bar)
