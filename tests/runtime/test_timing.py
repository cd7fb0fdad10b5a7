"""tkc.runtime.timing.gpu_time without a GPU: a fake torch whose stream is a clock that each
flush and each call moves on, so the events read what a GPU would (tests/fake_gpu.py)."""

from __future__ import annotations

import sys

import pytest
from fake_gpu import FakeStream

from tkc.runtime import timing


@pytest.fixture
def stream(monkeypatch: pytest.MonkeyPatch) -> FakeStream:
    s = FakeStream()
    monkeypatch.setitem(sys.modules, "torch", s.torch())
    return s


def test_the_flush_precedes_every_call_and_stays_outside_the_window(stream: FakeStream) -> None:
    t = timing.gpu_time(stream.kernel(lambda now: 1e-3), runs=4, warmup=2, flush_bytes=256)
    assert t.median_s == pytest.approx(1e-3)  # not 1e-3 + the flush's 85 us
    assert stream.log == ["flush", "call"] * 2 + ["flush", "record", "call", "record"] * 4


def test_without_a_flush_the_calls_run_back_to_back(stream: FakeStream) -> None:
    timing.gpu_time(stream.kernel(lambda now: 1e-3), runs=2, warmup=1)
    assert stream.log == ["call", "record", "call", "record", "record", "call", "record"]


def test_the_warmup_lasts_warmup_s_of_gpu_time(stream: FakeStream) -> None:
    timing.gpu_time(stream.kernel(lambda now: 1e-3), runs=3, warmup=5, flush_bytes=256, warmup_s=0.1)
    records = [i for i, what in enumerate(stream.log) if what == "record"]
    assert len(records) == 2 + 2 * 3  # the warm-up's own pair, then one pair a timed run
    warm = stream.log[:records[2] - 1]  # up to the first timed run's flush
    assert warm.count("call") == warm.count("flush")
    # 0.1 s of 1.085 ms calls: 93 (92.2 rounded up), the five timed first among them.
    assert warm.count("call") == 93
    assert stream.log[records[2]:].count("call") == 3


def test_a_ramping_clock_is_timed_after_it_settles(stream: FakeStream) -> None:
    """A GPU that runs calls 1.5x slower for its first 50 ms (a clock ramping up from idle, or
    held down by the contender before): five calls of warm-up time the ramp, 0.1 s does not."""
    def ramp(now: float) -> float:
        return 1.5e-3 if now - ramp.start < 0.05 else 1e-3
    ramp.start = 0.0
    assert timing.gpu_time(stream.kernel(ramp), runs=20, warmup=5).median_s == pytest.approx(1.5e-3)
    ramp.start = stream.now
    assert timing.gpu_time(stream.kernel(ramp), runs=20, warmup=5, warmup_s=0.1).median_s == pytest.approx(1e-3)


def test_a_warmup_of_work_that_takes_no_time_ends(stream: FakeStream, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "MAX_WARMUP_CALLS", 50)
    t = timing.gpu_time(stream.kernel(lambda now: 0.0), runs=3, warmup=0, warmup_s=1.0)
    assert t.median_s == 0.0
    assert stream.log.count("call") == 1 + 50 + 3
