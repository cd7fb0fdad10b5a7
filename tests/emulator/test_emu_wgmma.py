"""wgmma (``tkc/emulator/wgmma.py``) on TMA-loaded shared memory, read through real
descriptors (``SharedLayout.descriptor``) and accumulated into the real fragment layout:
equals numpy A @ B exactly for small-integer inputs (f32 sums exact) and to f32 accuracy for
random ones; K-major and MN-major operands, N in {64, 128, 256}, fp8, A from registers."""

from __future__ import annotations

import numpy as np
import pytest

from tkc.dtypes import bf16, f8e4m3, f8e5m2, round_to
from tkc.emulator.mbarrier import MBarrier
from tkc.emulator.smem import SharedMemory
from tkc.emulator.tma import tma_load
from tkc.emulator.wgmma import fragment_to_tile, tile_to_fragment, wgmma
from tkc.errors import TkcEmulatorError
from tkc.ir.layouts import SharedLayout, WgmmaAccumulator, WgmmaOperandA

BK = 64
A_BASE, B_BASE = 0, 65536


def load(smem, g, layout, base):
    bar = MBarrier("full", 1)
    bar.arrive_expect_tx(layout.size_bytes)
    tma_load(g, (0, 0), layout.tma_box().dims, layout, smem, base, bar)
    assert bar.phase == 1


def run_ss(a_mk, b_kn, n, a_major="k", b_major="k", dtype=bf16, dtype_b=None):
    """One 64 x n x BK tile product, all K-steps, through TMA and descriptors."""
    dtype_b = dtype_b or dtype
    bk = a_mk.shape[1]
    smem = SharedMemory(2 * 65536)
    if a_major == "k":
        la = SharedLayout(64, bk, dtype, "k", 128)
        load(smem, a_mk, la, A_BASE)
    else:
        la = SharedLayout(bk, 64, dtype, "mn", 128)
        load(smem, np.ascontiguousarray(a_mk.T), la, A_BASE)
    if b_major == "k":
        lb = SharedLayout(n, bk, dtype_b, "k", 128)
        load(smem, np.ascontiguousarray(b_kn.T), lb, B_BASE)
    else:
        lb = SharedLayout(bk, n, dtype_b, "mn", 128)
        load(smem, b_kn, lb, B_BASE)
    acc = np.zeros((128, n // 2), np.float32)
    for s in range(la.k_steps):
        wgmma(acc, smem, la.descriptor(A_BASE, s), lb.descriptor(B_BASE, s), n=n, k=la.k_per_step,
              dtype=dtype, dtype_b=dtype_b, trans_a=a_major == "mn", trans_b=b_major == "mn", scale_d=s > 0)
    return fragment_to_tile(acc, WgmmaAccumulator(n))


def ints(rng, shape, dt=bf16):
    return round_to(rng.integers(-8, 9, shape), dt)


@pytest.mark.parametrize("n", [64, 128, 256])
@pytest.mark.parametrize("b_major", ["k", "mn"])
def test_exact_small_integers(n, b_major):
    rng = np.random.default_rng(n)
    a, b = ints(rng, (64, BK)), ints(rng, (BK, n))
    np.testing.assert_array_equal(run_ss(a, b, n, b_major=b_major), a @ b)


def test_mn_major_a():
    rng = np.random.default_rng(5)
    a, b = ints(rng, (64, BK)), ints(rng, (BK, 128))
    np.testing.assert_array_equal(run_ss(a, b, 128, a_major="mn", b_major="mn"), a @ b)


@pytest.mark.parametrize("b_major", ["k", "mn"])
def test_random_within_f32_tolerance(b_major):
    rng = np.random.default_rng(6)
    a = round_to(rng.standard_normal((64, BK)), bf16)
    b = round_to(rng.standard_normal((BK, 128)), bf16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(run_ss(a, b, 128, b_major=b_major), ref, rtol=1e-5, atol=1e-5)


def test_fp8_mixed():
    rng = np.random.default_rng(7)
    a = ints(rng, (64, 128), f8e4m3)
    b = ints(rng, (128, 64), f8e5m2)
    np.testing.assert_array_equal(run_ss(a, b, 64, dtype=f8e4m3, dtype_b=f8e5m2), a @ b)


def test_wrong_descriptor_reads_wrong_values():
    """A descriptor built for 64B swizzle over a 128B-swizzled tile reads other bytes."""
    rng = np.random.default_rng(8)
    a, b = ints(rng, (64, BK)), ints(rng, (BK, 64))
    smem = SharedMemory(2 * 65536)
    la, lb = SharedLayout(64, BK, bf16, "k", 128), SharedLayout(64, BK, bf16, "k", 128)
    load(smem, a, la, A_BASE)
    load(smem, np.ascontiguousarray(b.T), lb, B_BASE)
    wrong = SharedLayout(64, BK, bf16, "k", 64)
    acc = np.zeros((128, 32), np.float32)
    wgmma(acc, smem, wrong.descriptor(A_BASE, 0), lb.descriptor(B_BASE, 0), n=64, k=16, dtype=bf16)
    assert not np.array_equal(fragment_to_tile(acc, WgmmaAccumulator(64)), a[:, :16] @ b[:16])


def test_a_from_registers():
    rng = np.random.default_rng(9)
    a, b = ints(rng, (64, BK)), ints(rng, (BK, 128))
    smem = SharedMemory(65536)
    lb = SharedLayout(BK, 128, bf16, "mn", 128)
    load(smem, b, lb, 0)
    a_frag = tile_to_fragment(a, WgmmaOperandA(BK))  # the whole 64 x BK operand: 4 K-steps
    acc = np.zeros((128, 64), np.float32)
    for s in range(BK // 16):
        regs = a_frag[:, 2 * np.array(WgmmaOperandA(BK).step_registers(s))[:, None] + np.arange(2)].reshape(128, 8)
        wgmma(acc, smem, regs, lb.descriptor(0, s), n=128, k=16, dtype=bf16, trans_b=True)
    np.testing.assert_array_equal(fragment_to_tile(acc, WgmmaAccumulator(128)), a @ b)
    with pytest.raises(TkcEmulatorError, match="not bf16"):
        wgmma(acc, smem, regs + np.float32(1e-3), lb.descriptor(0, 0), n=128, k=16, dtype=bf16, trans_b=True)


def test_scale_d_and_negation():
    rng = np.random.default_rng(10)
    a, b = ints(rng, (64, 16)), ints(rng, (16, 64))
    smem = SharedMemory(65536)
    la, lb = SharedLayout(64, 64, bf16, "k", 128), SharedLayout(64, 64, bf16, "k", 128)
    pad = np.zeros((64, 64), np.float32)
    load(smem, np.hstack([a, pad[:, :48]]), la, 0)
    load(smem, np.hstack([b.T, pad[:, :48]]), lb, 8192)
    acc = tile_to_fragment(np.full((64, 64), 5.0, np.float32), WgmmaAccumulator(64))
    wgmma(acc, smem, la.descriptor(0, 0), lb.descriptor(8192, 0), n=64, k=16, dtype=bf16, scale_a=-1)
    np.testing.assert_array_equal(fragment_to_tile(acc, WgmmaAccumulator(64)), 5 - a @ b)
    wgmma(acc, smem, la.descriptor(0, 0), lb.descriptor(8192, 0), n=64, k=16, dtype=bf16, scale_d=False)
    np.testing.assert_array_equal(fragment_to_tile(acc, WgmmaAccumulator(64)), a @ b)


def test_fragment_helpers_roundtrip():
    for layout in (WgmmaAccumulator(256), WgmmaOperandA(64), WgmmaAccumulator(64, 2)):
        tile = np.arange(np.prod(layout.shape), dtype=np.float32).reshape(layout.shape)
        frag = tile_to_fragment(tile, layout)
        assert frag.shape == (layout.threads, layout.regs)
        np.testing.assert_array_equal(fragment_to_tile(frag, layout), tile)
    # PTX-FACTS §1: thread 37 (warp 1, lane 5), register 3 -> row 16 + 1 + 8, col 2*1 + 1
    assert tile_to_fragment(tile := np.arange(64 * 64).reshape(64, 64), WgmmaAccumulator(64))[37, 3] == tile[25, 3]


def test_operand_checks():
    smem = SharedMemory(65536)
    acc = np.zeros((128, 32), np.float32)
    with pytest.raises(TkcEmulatorError, match="K=16"):
        wgmma(acc, smem, 0, 0, n=64, k=32, dtype=bf16)
    with pytest.raises(TkcEmulatorError, match="N=12"):
        wgmma(acc, smem, 0, 0, n=12, k=16, dtype=bf16)
    with pytest.raises(TkcEmulatorError, match="shape"):
        wgmma(acc, smem, 0, 0, n=128, k=16, dtype=bf16)
    with pytest.raises(TkcEmulatorError, match="MN-major operands are f16/bf16 only"):
        wgmma(acc, smem, 0, 0, n=64, k=32, dtype=f8e4m3, trans_b=True)
    la = SharedLayout(64, 64, bf16, "k", 128)
    smem.write_tile(0, la, np.ones((64, 64)), writer="st.shared A")
    smem.write_tile(8192, la, np.ones((64, 64)), writer="st.shared B")
    with pytest.raises(TkcEmulatorError, match="'wgmma \\(A\\)' \\(async proxy\\) .*'st.shared A'"):
        wgmma(acc, smem, la.descriptor(0, 0), la.descriptor(8192, 0), n=64, k=16, dtype=bf16)
    smem.fence_proxy_async()
    wgmma(acc, smem, la.descriptor(0, 0), la.descriptor(8192, 0), n=64, k=16, dtype=bf16)
    assert (acc == 16).all()
