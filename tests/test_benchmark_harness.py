"""The benchmark harness's own logic that runs without a GPU: retiming a measurement that
disagrees with tkc.autotune's."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from harness import steady  # noqa: E402


def _measures(*seconds: float):
    it = iter(seconds)
    calls = []

    def measure() -> float:
        calls.append(1)
        return next(it)
    return measure, calls


def test_a_measurement_close_to_autotune_is_kept():
    measure, calls = _measures(1.1e-3)
    assert steady(measure, 1.0e-3) == (1.1e-3, "") and len(calls) == 1
    measure, calls = _measures(2.0e-3)
    assert steady(measure, None) == (2.0e-3, "") and len(calls) == 1


def test_a_far_measurement_is_retimed_and_named():
    # A clock drop: 2.5x slower once, then back to what autotune saw.
    measure, calls = _measures(2.5e-3, 1.02e-3, 0.99e-3)
    seconds, note = steady(measure, 1.0e-3)
    assert len(calls) == 3 and seconds == 1.02e-3
    assert note == "retimed: 2500.0, 1020.0, 990.0 us, tkc.autotune had 1000.0 us"
    # Faster than autotune by as much is retimed too; the median stands even if all disagree.
    measure, calls = _measures(0.5e-3, 0.6e-3, 0.55e-3)
    assert steady(measure, 1.0e-3)[0] == 0.55e-3
