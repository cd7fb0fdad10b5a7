"""Scheduler (``tkc/emulator/scheduler.py``) running a producer/consumer ring: a 64x128x256
bf16 GEMM through a 2-stage ring of TMA-loaded stages with full/empty mbarriers equals numpy
under 20 seeds, and each broken protocol is caught with a message that names what went wrong."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tkc.dtypes import bf16, round_to
from tkc.emulator.mbarrier import MBarrier, MBarrierError, PhaseError
from tkc.emulator.scheduler import DeadlockError, Wait, Yield, run
from tkc.emulator.smem import RaceError, SharedMemory
from tkc.emulator.tma import tma_load
from tkc.emulator.wgmma import fragment_to_tile, wgmma
from tkc.errors import TkcEmulatorError
from tkc.ir.layouts import SharedLayout, WgmmaAccumulator

M, N, K, BK, STAGES = 64, 128, 256, 64, 2
LA = SharedLayout(M, BK, bf16, "k", 128)
LB = SharedLayout(BK, N, bf16, "mn", 128)
STAGE_BYTES = LA.size_bytes + LB.size_bytes
TX = LA.size_bytes + LB.size_bytes


def gemm(a, b, seed, producer_bug=None, consumer_bug=None):
    """Run the ring; returns C (64 x 128).  ``*_bug`` selects one broken protocol."""
    smem = SharedMemory(STAGES * STAGE_BYTES)
    for s in range(STAGES):
        smem.add_region(f"stage[{s}]", s * STAGE_BYTES, STAGE_BYTES)
    full = [MBarrier(f"full[{s}]", 1) for s in range(STAGES)]
    empty = [MBarrier(f"empty[{s}]", 1) for s in range(STAGES)]
    acc = np.zeros((128, N // 2), np.float32)

    def producer():
        phase = 0
        for kt in range(K // BK):
            s = kt % STAGES
            if producer_bug != "no-empty-wait":
                yield Wait(empty[s], phase ^ 1, f"wait empty[{s}] for k-tile {kt}")
            if producer_bug == "forgot-expect-tx":
                full[s].arrive()
            elif producer_bug == "tx-too-small":
                full[s].arrive_expect_tx(TX - 2)
            elif producer_bug == "tx-too-large":
                full[s].arrive_expect_tx(TX + 1024)
            else:
                full[s].arrive_expect_tx(TX)
            base = s * STAGE_BYTES
            tma_load(a, (kt * BK, 0), LA.tma_box().dims, LA, smem, base, full[s], op=f"tma A k-tile {kt}")
            yield Yield("between TMA issues")
            tma_load(b, (0, kt * BK), LB.tma_box().dims, LB, smem, base + LA.size_bytes, full[s],
                     op=f"tma B k-tile {kt}")
            yield Yield("after TMA issue")
            if s == STAGES - 1:
                phase ^= 1

    def consumer():
        phase = 0
        for kt in range(K // BK):
            s = kt % STAGES
            parity = 1 - phase if consumer_bug == "wrong-parity" else phase
            yield Wait(full[s], parity, f"wait full[{s}] for k-tile {kt}")
            base = s * STAGE_BYTES
            lease = smem.begin_read(f"stage[{s}]", reader=f"consumer wgmma k-tile {kt}")
            for ks in range(LA.k_steps):
                wgmma(acc, smem, LA.descriptor(base, ks), LB.descriptor(base + LA.size_bytes, ks), n=N, k=16,
                      dtype=bf16, trans_b=True, op=f"wgmma k-tile {kt} step {ks}")
            yield Yield("wgmma.wait_group 0")
            lease.release()
            empty[s].arrive()
            if s == STAGES - 1 and consumer_bug != "no-flip":
                phase ^= 1

    run({"producer": producer(), "consumer": consumer()}, seed)
    return fragment_to_tile(acc, WgmmaAccumulator(N))


@pytest.fixture(scope="module")
def ab():
    rng = np.random.default_rng(11)
    return round_to(rng.integers(-8, 9, (M, K)), bf16), round_to(rng.integers(-8, 9, (K, N)), bf16)


@pytest.mark.parametrize("seed", range(20))
def test_ring_gemm(ab, seed):
    a, b = ab
    np.testing.assert_array_equal(gemm(a, b, seed), a @ b)


def test_ring_gemm_random_values():
    rng = np.random.default_rng(12)
    a = round_to(rng.standard_normal((M, K)), bf16)
    b = round_to(rng.standard_normal((K, N)), bf16)
    np.testing.assert_allclose(gemm(a, b, 0), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


def test_wrong_initial_parity_is_caught(ab):
    """The consumer starts at parity 1: phase -1 counts as complete at init, so the wait passes at
    once (as on the GPU) and wgmma reads a stage no TMA has written yet: caught, every seed."""
    for seed in range(10):
        with pytest.raises(TkcEmulatorError, match=r"role 'consumer'.*full\[\d\]|nothing has written"):
            gemm(*ab, seed, consumer_bug="wrong-parity")


def test_no_flip_deadlock_or_phase_error(ab):
    """Consumer never flips its parity: on the second round it waits parity 0 of full[0] again.
    Depending on the interleaving the barrier is in phase 1 (the GPU would pass at once on stale
    data: PhaseError) or phase 2 with no third load coming (deadlock)."""
    seen = set()
    for seed in range(20):
        with pytest.raises((DeadlockError, PhaseError)) as info:
            gemm(*ab, seed, consumer_bug="no-flip")
        msg = str(info.value)
        assert "full[0]" in msg and "parity 0" in msg and "'consumer'" in msg
        if isinstance(info.value, DeadlockError):
            assert "role 'consumer' blocked at 'wait full[0] for k-tile 2': waits for parity 0 of mbarrier " \
                   "'full[0]' in phase 2 (parity 0)" in msg
        seen.add(type(info.value))
    assert seen == {DeadlockError, PhaseError}


def test_forgot_expect_tx(ab):
    """arrive instead of arrive.expect_tx: the phase completes before the data lands.  The
    consumer then either reads a stage the TMA has not written yet, or (when the copies won
    the race) the stray complete_tx leaves the next phase at a negative tx-count forever, or
    underflows it once that phase's arrival is in."""
    seen = set()
    for seed in range(20):
        with pytest.raises(TkcEmulatorError) as info:
            gemm(*ab, seed, producer_bug="forgot-expect-tx")
        msg = str(info.value)
        if isinstance(info.value, DeadlockError):
            assert "deadlock: no role can run" in msg
            assert f"waits for parity 1 of mbarrier 'full[0]' in phase 1 (parity 1), 0/1 arrivals pending, " \
                   f"tx-count {-TX} bytes" in msg
        elif isinstance(info.value, MBarrierError):
            assert re.search(r"role 'producer': tx underflow: tma [AB] k-tile \d completes", msg), msg
        else:
            assert re.search(r"role 'consumer': 'wgmma k-tile \d step 0 \([AB]\)' reads 'stage\[\d\]' .*which "
                             r"nothing has written", msg), msg
        seen.add(type(info.value))
    assert len(seen) >= 2  # several interleavings, several symptoms, all caught


def test_expect_tx_too_small_underflows(ab):
    with pytest.raises(MBarrierError, match=r"role 'producer': tx underflow: tma B k-tile 0 completes 16384 "
                                            r"bytes on mbarrier 'full\[0\]'"):
        gemm(*ab, 0, producer_bug="tx-too-small")


def test_expect_tx_too_large_deadlocks(ab):
    with pytest.raises(DeadlockError, match=r"role 'consumer' blocked at 'wait full\[0\] for k-tile 0': waits "
                                            r"for parity 0 of mbarrier 'full\[0\]' in phase 0 \(parity 0\), "
                                            r"0/1 arrivals pending, tx-count 1024 bytes"):
        gemm(*ab, 0, producer_bug="tx-too-large")


def test_overwrite_before_release_is_a_race(ab):
    """The producer skips its empty-barrier wait.  It overwrites a stage the consumer still holds
    (race), or one the consumer has not read yet (lost data), or laps the full barrier (phase
    error); in an interleaving where the consumer always released in time, C is right."""
    seen = set()
    for seed in range(20):
        try:
            c = gemm(*ab, seed, producer_bug="no-empty-wait")
        except (RaceError, PhaseError) as e:
            msg = str(e)
            if isinstance(e, RaceError):
                assert re.search(r"role 'producer': (race on 'stage\[\d\]' \[0x[0-9a-f]+, 0x[0-9a-f]+\): 'tma [AB] "
                                 r"k-tile \d' writes it while 'consumer wgmma k-tile \d' is still reading it|lost data "
                                 r"in 'stage\[\d\]' .*'tma [AB] k-tile \d' overwrites what 'tma [AB] k-tile \d' wrote)",
                                 msg), msg
            else:
                assert "role 'consumer'" in msg and "full[" in msg and "wrong phase" in msg, msg
            seen.add(type(e))
        else:
            np.testing.assert_array_equal(c, ab[0] @ ab[1])
    assert RaceError in seen


def test_deadlock_names_every_blocked_role():
    a, b = MBarrier("a", 1), MBarrier("b", 1)

    def r1():
        yield Wait(a, 0, "wait a")
        b.arrive()

    def r2():
        yield Wait(b, 0, "wait b")
        a.arrive()

    with pytest.raises(DeadlockError) as info:
        run({"r1": r1(), "r2": r2()}, 0)
    assert str(info.value).splitlines()[1:] == [
        "  role 'r1' blocked at 'wait a': waits for parity 0 of mbarrier 'a' in phase 0 (parity 0), "
        "1/1 arrivals pending, tx-count 0 bytes",
        "  role 'r2' blocked at 'wait b': waits for parity 0 of mbarrier 'b' in phase 0 (parity 0), "
        "1/1 arrivals pending, tx-count 0 bytes",
    ]


def test_interleavings_differ_by_seed():
    def role(log, name):
        for i in range(5):
            log.append((name, i))
            yield Yield()

    logs = []
    for seed in range(4):
        log: list = []
        run([("x", role(log, "x")), ("y", role(log, "y"))], seed)
        logs.append(tuple(log))
    assert len(set(logs)) > 1
    with pytest.raises(TkcEmulatorError, match="yielded 3"):
        run({"bad": (x for x in [3])}, 0)
