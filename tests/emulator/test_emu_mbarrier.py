"""mbarrier (``tkc/emulator/mbarrier.py``): phases complete when arrivals and tx both reach 0
(PTX-FACTS §4), try_wait.parity answers like the hardware, and every misuse is an error."""

from __future__ import annotations

import pytest

from tkc.emulator.mbarrier import MBarrier, MBarrierError, PhaseError


def test_phase_flips_on_arrivals():
    b = MBarrier("bar", 2)
    assert (b.phase, b.parity, b.pending) == (0, 0, 2)
    assert b.try_wait(1, "w")  # phase -1 counts as complete at init
    assert not b.try_wait(0, "w")
    b.arrive()
    assert not b.try_wait(0, "w") and b.pending == 1
    b.arrive()
    assert (b.phase, b.parity, b.pending) == (1, 1, 2)
    assert b.try_wait(0, "w")
    b.arrive(2)
    assert b.parity == 0 and b.try_wait(1, "w")


def test_tx_and_arrivals_both_needed():
    b = MBarrier("full", 1)
    b.arrive_expect_tx(100)
    assert b.phase == 0 and b.tx == 100
    b.complete_tx(60)
    assert b.phase == 0
    b.complete_tx(40)
    assert b.phase == 1 and b.tx == 0 and b.pending == 1
    # a copy may complete before the arrival that expects it (tx goes negative meanwhile)
    b.complete_tx(32)
    assert b.tx == -32 and b.phase == 1
    b.arrive_expect_tx(32)
    assert b.phase == 2
    # expect_tx without arriving, then arrive
    b.expect_tx(8)
    b.arrive()
    assert b.phase == 2
    b.complete_tx(8)
    assert b.phase == 3


def test_use_before_init():
    b = MBarrier("bar")
    for call in (b.arrive, lambda: b.expect_tx(4), lambda: b.complete_tx(4), lambda: b.try_wait(0)):
        with pytest.raises(MBarrierError, match="on mbarrier 'bar' before mbarrier.init"):
            call()
    b.init(1)
    b.arrive()
    with pytest.raises(MBarrierError, match="'bar' initialized twice"):
        b.init(1)


def test_too_many_arrivals():
    b = MBarrier("empty[0]", 2)
    b.arrive()
    with pytest.raises(MBarrierError, match=r"arrive\(2\) on mbarrier 'empty\[0\]' in phase 0 .*1/2 arrivals "
                                            r"pending.*more arrivals than the count"):
        b.arrive(2)


def test_tx_underflow():
    b = MBarrier("full[1]", 1)
    b.arrive_expect_tx(8192)
    with pytest.raises(MBarrierError, match=r"tx underflow: tma_load k=3 completes 16384 bytes on mbarrier "
                                            r"'full\[1\]' .*tx-count 8192"):
        b.complete_tx(16384, by="tma_load k=3")


def test_wait_ahead_is_a_phase_error():
    b = MBarrier("full[0]", 1)
    b.arrive()
    assert b.try_wait(0, "consumer")  # phase 0
    # the consumer did not flip its parity: parity 0 again targets phase 2, but the barrier is in
    # phase 1; the GPU would pass at once on phase 0's completion
    with pytest.raises(PhaseError, match=r"'consumer' waits for parity 0 of mbarrier 'full\[0\]' in phase 1.*"
                                         r"targets phase 2, which is ahead.*pass at once"):
        b.try_wait(0, "consumer")


def test_wait_behind_is_a_phase_error():
    b = MBarrier("full[0]", 1)
    b.arrive()
    b.arrive()
    b.arrive()  # phases 0, 1, 2 complete
    with pytest.raises(PhaseError, match=r"'late' waits for parity 0 \(phase 0\).*phases 0..2 completed"):
        b.try_wait(0, "late")
    b2 = MBarrier("x", 1)
    assert b2.try_wait(1, "w")  # phase -1
    b2.arrive()
    b2.arrive()  # phases 0, 1: w never waited phase 0
    with pytest.raises(PhaseError, match="behind|phases 0..1 completed"):
        b2.try_wait(0, "w")


def test_waiters_are_tracked_separately():
    b = MBarrier("bar", 1)
    assert not b.wait_status(0, "a")
    b.arrive()
    assert b.try_wait(0, "a") and b.try_wait(0, "b")
    assert not b.try_wait(1, "a")  # phase 1 not complete: blocks, no error
    b.arrive()
    assert b.try_wait(1, "a")
    with pytest.raises(MBarrierError, match="parity 2"):
        b.try_wait(2, "a")
