"""benchmarks/timer_check.py without a GPU: its statistics, its timing methods on a fake
power-capped GPU (tests/fake_gpu.py), and the report and verdicts it prints."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest
from fake_gpu import FakeStream

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import timer_check as tc  # noqa: E402

from tkc.runtime.timing import interleaved_medians  # noqa: E402


class NoClock:
    def mhz(self, t0: float, t1: float) -> list[float]:
        return []

    def since(self, t0: float, t1: float) -> list[tuple[float, float]]:
        return []

    def samples_since(self, t0: float, t1: float) -> list[tuple[float, float, float, int]]:
        return []


def test_the_rotation_is_the_one_the_harness_takes() -> None:
    names = ["tkc", "cuDNN", "flash", "mem-efficient"]
    seen: list[str] = []
    interleaved_medians([lambda n=n: seen.append(n) or 1.0 for n in names], 3)
    assert [n for r in tc.rotation(names, 3) for n in r] == seen
    # run.py's order: tkc follows mem-efficient in rounds 2 and 3, cuDNN follows tkc in 1 and 3.
    assert tc.predecessors(names, 3) == {"tkc": [None, "mem-efficient", "mem-efficient"],
                                         "cuDNN": ["tkc", "mem-efficient", "tkc"],
                                         "flash": ["cuDNN", "cuDNN", "tkc"],
                                         "mem-efficient": ["flash", "flash", "flash"]}
    assert tc.ordered(names, "tkc first") == names
    assert tc.ordered(names, "peer first") == ["cuDNN", "flash", "mem-efficient", "tkc"]


def test_the_statistics() -> None:
    assert tc.min_of_medians([[3.0, 1.0, 2.0], [0.5, 9.0, 9.0], [2.5, 2.5]]) == 2.0
    assert tc.spread([1.0, 1.1, 0.9]) == pytest.approx(0.2)
    # 1.5 ms calls for the first 50 ms, then 1 ms: settled after 50 ms, bins by start time.
    calls, t = [], 0.0
    while t < 300:
        s = 1.5e-3 if t < 50 else 1e-3
        calls.append((t, s))
        t += s * 1e3
    assert tc.tail_median(calls) == 1e-3
    assert tc.settle_ms(calls) == pytest.approx(50, abs=10)
    bins = tc.bin_trace(calls, [0, 20, 100, 1000])
    assert [(lo, m) for lo, _, m, _ in bins] == [(0, 1.5e-3), (20, 1e-3), (100, 1e-3)]
    assert sum(n for *_, n in bins) == len(calls)
    assert tc.calls_median(calls, 5, 16) == 1.5e-3
    assert tc.calls_after(calls, 100, 16) == 1e-3


def fake(monkeypatch: pytest.MonkeyPatch, tau: float) -> tuple[FakeStream, dict, object]:
    """tkc and cuDNN equally fast and equally hungry; flash and mem-efficient slower and lighter."""
    s = FakeStream(tau=tau, k=0.2)
    monkeypatch.setitem(sys.modules, "torch", s.torch())
    monkeypatch.setattr(tc.harness, "torch", sys.modules["torch"])
    fns = {"tkc": s.kernel(lambda now: 1e-3), "cuDNN": s.kernel(lambda now: 1e-3),
           "flash": s.kernel(lambda now: 2e-3, 0.8), "mem-efficient": s.kernel(lambda now: 4e-3, 0.2)}
    return s, fns, sys.modules["torch"].empty(1)


def ratios(fns: dict, cache: object, method: str) -> list[float]:
    out = []
    for order in tc.ORDERS:
        r = tc.run_method(method, {n: fns[n] for n in tc.ordered(list(fns), order)}, NoClock(), cache)
        assert set(r["rounds"]) == set(fns)
        out.append(r["seconds"]["cuDNN"] / r["seconds"]["tkc"])
    return out


def test_the_methods_on_a_gpu_whose_clock_remembers_30_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old harness reads the same kernel 3% apart by who ran before it; a 0.1 s warm-up (3
    memories) and alternating call by call read them alike."""
    _, fns, cache = fake(monkeypatch, 0.03)
    assert max(abs(r - 1) for r in ratios(fns, cache, "harness@eaa649b")) > 0.03
    assert all(abs(r - 1) < 0.01 for r in ratios(fns, cache, "harness"))
    assert all(abs(r - 1) < 0.01 for r in ratios(fns, cache, "alternating"))


def test_alternating_holds_when_the_clock_remembers_longer_than_the_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    _, fns, cache = fake(monkeypatch, 0.3)
    assert all(abs(r - 1) < 0.01 for r in ratios(fns, cache, "alternating"))


def test_a_trace_covers_the_time_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    s, fns, cache = fake(monkeypatch, 0.03)
    t = tc.trace(fns["flash"], cache, 0.05, NoClock(), chunk=4)
    assert 0.05 <= t["calls"][-1][0] / 1e3 <= 0.05 + 8 * 2.5e-3  # at most two chunks past
    assert all(s > 2e-3 for _, s in t["calls"])


def synthetic(ratio_legacy: float) -> tuple[list[dict], list[dict], dict]:
    """A problem whose old harness reads tkc ``ratio_legacy`` x cuDNN and every other method 1.0x;
    cuDNN's traces slow for 50 ms from idle and after tkc; tkc's queued window 100 us over its kernels."""
    def method(tkc: float, peer: float) -> dict:
        return {"seconds": {"tkc": tkc, "cuDNN": peer}, "rounds": {"tkc": [tkc] * 3, "cuDNN": [peer, peer * 1.1, peer]},
                "clock": {"tkc": [1700.0, 1980.0], "cuDNN": [1695.0]}, "wall_s": 1.0}
    methods = {m: {o: method(1e-3, 1e-3) for o in tc.ORDERS} for m in tc.METHODS}
    methods["harness@eaa649b"] = {o: method(1e-3, ratio_legacy * 1e-3) for o in tc.ORDERS}
    problem = {"name": "attention B1 H16 N16384 D128", "kind": "attention", "flops": 2.2e12, "tkc": "attn.tk",
               "note": "", "contenders": ["tkc", "cuDNN"], "methods": methods}

    def calls(slow_ms: float) -> list[tuple[float, float]]:
        out, t = [], 0.0
        while t < 1000:
            s = 3.6e-3 if t < slow_ms else 3.2e-3
            out.append((t, s))
            t += s * 1e3
        return out
    traces = [{"contender": "cuDNN", "after": "idle", "calls": calls(50), "clock": [(1.0, 1200.0), (900.0, 1700.0)],
               "samples": [(1.0, 1200.0, 150.0, 0), (900.0, 1700.0, 690.0, 4)]},
              {"contender": "mem-efficient", "after": "-", "predecessor_only": True, "calls": calls(0), "clock": []},
              {"contender": "cuDNN", "after": "mem-efficient", "calls": calls(0), "clock": []},
              {"contender": "cuDNN", "after": "tkc", "calls": calls(80), "clock": []},
              {"contender": "tkc", "after": "idle", "calls": calls(0), "clock": []}]
    inside = {"tkc": {"queued_us": 3300.0, "synced_us": 3310.0, "host_us": 10.0, "flush_us": 85.0,
                      "kernel_us": 3200.0, "kernels": "attn (1 a call)"},
              "cuDNN": {"queued_us": 3300.0, "synced_us": 3340.0, "host_us": 120.0, "flush_us": 85.0}}
    return [problem], traces, inside


def test_the_report_says_what_the_numbers_say() -> None:
    problems, traces, inside = synthetic(1.14)
    text = tc.report(problems, traces, inside, "a GPU", "pynvml", "1980 MHz", 100.0)
    for heading in ("### tkc / peer", "### attention B1 H16 N16384 D128", "### Back-to-back", "### Inside",
                    "### Verdicts"):
        assert heading in text
    assert "| harness@eaa649b | tkc first | 2200.0 | 1929.8 | 1.140 |" in text
    assert "| harness@eaa649b, min of rounds | tkc first |" in text
    assert "| 50 ms | 1200 (1200-1200) | 1700 (1700-1700) | 690 | 0x4 |" in text  # cuDNN from idle
    lines = [x for x in text.splitlines() if x.startswith("- ")]

    def line(start: str) -> str:
        (got,) = [x for x in lines if x.startswith("- " + start)]
        return got
    assert "DISAGREES" in line("agreement, harness@eaa649b vs independent")
    assert "DISAGREES" in line("agreement, harness@eaa649b vs do_bench")
    assert "(agrees), a contender's time by at most 0.0%" in line("agreement, harness vs do_bench")
    assert "time by at most 14.0%" in line("agreement, harness@eaa649b vs independent")  # cuDNN 1.14 ms vs 1
    assert "agrees" in line("agreement, harness vs independent")
    assert "cuDNN after tkc, 80 ms" in line("warm-up") and "long enough" in line("warm-up")
    assert line("agreement, pairs").endswith(
        ": harness ~ independent, harness ~ do_bench, harness ~ alternating, "
        "independent ~ do_bench, independent ~ alternating, do_bench ~ alternating")
    assert "SUPPORTED" in line("clock ramp, cuDNN from idle")
    assert "not supported" in line("clock ramp, tkc from idle")
    assert "SUPPORTED" in line("order, cuDNN:") and "removes it" in line("order, cuDNN:")
    assert "INSIDE the window" in line("timed region, tkc:")
    assert "exceeds the flush by 35 us" in line("timed region, cuDNN:") and "unknown" in line("timed region, cuDNN:")
    assert "too few rounds" in line("rounds, harness@eaa649b")  # cuDNN's rounds moved 10%
    assert line("clock, harness:").endswith("SM 1700 (1695-1980) MHz over its timed regions")
    problems, traces, inside = synthetic(1.0)
    text = tc.report(problems, traces, inside, "a GPU", "pynvml", "", 1.0)
    assert "DISAGREES" not in text


def test_the_numbers_do_not_hang_on_a_missing_contender() -> None:
    problems, traces, inside = synthetic(1.0)
    for order in tc.ORDERS:
        del problems[0]["methods"]["do_bench"][order]["seconds"]["cuDNN"]
    assert tc.ratio_of(problems[0], "do_bench", "tkc first") is None
    verdicts = tc.verdicts(problems, traces, inside)
    assert "agreement, harness vs do_bench: no row timed by both" in verdicts
    assert "do_bench" not in [v for v in verdicts if v.startswith("agreement, pairs")][0]
    assert "| attention B1 H16 N16384 D128 vs cuDNN |" in tc.summary_table(problems)
    assert statistics.median([1.0]) == 1.0
