"""The harness's timing method against an independent timer and triton.testing.do_bench, in
one run on one GPU, with the SM clock sampled throughout.

    python3 benchmarks/timer_check.py            # about 2 minutes; the table also to $OUT/timer_check.md

Why: on an H100 and an H200 a separate script read cuDNN at 675-681 TFLOP/s for attention at
D=128 and 16k tokens where the harness read 600-642, and tkc's best pinned schedule at 0.99x
and 1.006x cuDNN where the harness said 1.14x.  This script times the same contenders five
ways, each with the contenders in both orders (tkc first, as benchmarks/run.py has them, and
tkc last), and prints what each hypothesis predicts next to what was measured:

- ``harness@eaa649b``: benchmarks/run.py's method before this change, reproduced here
  (``legacy_gpu_time``): three rounds taken in turns (``tkc.runtime.timing.interleaved_medians``),
  each contender's round 5 warm-up calls with no flush, then 16 calls, each after a 256 MB
  clear of L2, all enqueued before one synchronize; the median round.
- ``harness``: ``harness.in_turns`` of this tree, exactly as run.py calls it (50 runs).
- ``independent``: written here from scratch: each contender alone in its round, 5 flushed
  warm-up calls, then 20 calls, each a 256 MB clear, a start event, the call, an end event and
  a synchronize on it; the minimum over 3 rounds of the median of 20.
- ``do_bench``: ``triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")``,
  one call per contender (its own 256 MB clear before each call; a warm-up of 25 ms, then
  100 ms of timed calls).
- ``alternating``: the candidate ``harness.alternating_times``: the contenders alternate call
  by call (each cycle starting one contender later), after 0.1 s of such cycles, so a clock
  that drifts on any scale longer than one call costs every contender alike; the median of 30
  calls each (``harness.in_alternation`` answers as ``in_turns`` does).

The ``... min of rounds`` rows are the same calls as the row above them, the minimum round
instead of the median.  Then four experiments on the 16k-token row:

- clock ramp and predecessor: cuDNN and tkc, each run back to back for 1 s (flushes between)
  from an idle GPU, after 0.5 s of the memory-efficient SDPA (the slowest, lightest
  contender), and after 1 s of the other; per-call times against time since the start, with
  the SM clock (pynvml, else ``nvidia-smi -lms``) beside;
- inside the timed region: the kernels each contender's call launches (torch.profiler) against
  its event window, the flush's own GPU time, and the host time of a call.

What reading the code found (before any GPU run):

1. The flush is not inside the window: ``cache.zero_()`` is enqueued before ``s.record()`` on
   the same stream, and an event completes only when the work before it on its stream has.
2. Host work is inside the window only where the GPU waits for it: the harness enqueues all
   of a round's calls before it synchronizes, so after the first call the GPU is always
   behind the host (a 16k-token attention is 3 ms; a call's host work, tens of microseconds);
   the median drops the first.  A method that synchronizes after every call (the independent
   timer here, and the one of the issue) times ``max(0, host time of the call - flush time)``
   of idle GPU in every window: the flush (about 85 us for 256 MB) hides at most that much
   host work.  The experiment prints both per contender.
3. The harness warmed each contender with 5 calls and no flush: 16 ms of a 16k-token
   attention, 0.2 ms of a 30 us kernel; a power-capped H100 runs attention at 1695 MHz and a
   light kernel at 1980 (benchmarks/RESULTS.md), so the first calls of a round run at the
   clock the contender before left.
4. The rounds rotate the contenders but do not balance who comes before whom: with run.py's
   order (tkc, cuDNN, flash, mem-efficient), tkc follows mem-efficient (the slowest and
   lightest, 12 ms a call, about 250 ms a round) in rounds 2 and 3, cuDNN follows tkc in
   rounds 1 and 3; the median round is then tkc's after a light kernel and cuDNN's after a
   heavy one: the direction of the disagreement (harness 1.14x, independent 0.99-1.006x).
5. Three rounds: the median of three is as noisy as one round where rounds move 10% (cuDNN
   662 636 577 636 587 in one earlier re-check).
6. A pinned schedule is timed against peers the same way; autotune's choice among schedules
   uses the same rotation (five rounds), with 2 warm-up calls.

A model says what to look for (tests/test_timer_check.py, on tests/fake_gpu.py: a GPU whose
calls run up to 20% slower as the power drawn over the last ``tau`` seconds rises; tkc and
cuDNN identical kernels, flash and mem-efficient slower and lighter; a fresh model GPU per
method, tkc first then peer first).  cuDNN / tkc read:

| tau | harness@eaa649b | harness (0.1 s warm-up) | independent | alternating |
|---|---|---|---|---|
| 30 ms | 1.034 / 1.047 | 1.002 / 1.002 | 1.064 / 1.000 | 1.003 / 1.003 |
| 100 ms | 0.996 / 1.020 | 1.020 / 1.025 | 1.039 / 1.003 | 1.001 / 1.001 |
| 300 ms | 0.984 / 1.006 | 0.997 / 1.018 | 1.016 / 1.000 | 1.000 / 1.000 |

So a warm-up fixes the method only where it is longer than the clock's memory; alternating
call by call fixes it whatever the memory; and an independent timer that times each
contender alone is as exposed as the old harness.  The trace table's "settled after" column
measures the memory of the GPU at hand.

Change made from the reading: ``tkc.runtime.timing.gpu_time`` warms up with the flush as the
timed calls have it and takes ``warmup_s`` (a warm-up of at least that much GPU time);
``harness.gpu_time`` passes ``WARMUP_S`` = 0.1 s.  Whether that is enough, or the harness
should alternate call by call (``harness.in_alternation`` in run.py in place of ``in_turns``),
is what the verdicts decide.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(HERE))

import harness  # noqa: E402
from tkc.runtime.timing import interleaved_medians  # noqa: E402

L2_FLUSH_BYTES = 256 * 1024 * 1024
RUNS = 50  # benchmarks/run.py's default: three rounds of 16
ROUNDS = 3
IND_RUNS, IND_ROUNDS, IND_WARMUP = 20, 3, 5
DO_BENCH_ARGS = {"warmup": 25, "rep": 100, "return_mode": "median"}
ALT_CYCLES = 30
TRACE_S, PRED_S, IDLE_S = 1.0, 0.5, 2.0
TOL = 0.02  # a difference under 2% is not called a difference
ORDERS = ("tkc first", "peer first")
METHODS = ("harness@eaa649b", "harness", "independent", "do_bench", "alternating")
PEER = {"attention": "cuDNN", "gemm": "torch (cuBLAS)"}


# ------------------------------------------------------------------ statistics (no GPU)

def min_of_medians(rounds: Sequence[Sequence[float]]) -> float:
    """The independent timer's estimate: the fastest round's median."""
    return min(statistics.median(r) for r in rounds)


def spread(values: Sequence[float]) -> float:
    """(max - min) / median: how far the rounds of one contender moved."""
    return (max(values) - min(values)) / statistics.median(values) if values else 0.0


def ordered(names: Sequence[str], order: str) -> list[str]:
    """``names`` as given (tkc first) or with tkc moved to the end (peer first)."""
    if order == "tkc first":
        return list(names)
    return [n for n in names if n != "tkc"] + [n for n in names if n == "tkc"]


def rotation(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The order ``interleaved_medians`` times contenders in: round r starts at contender r."""
    n = len(names)
    return [[names[(r + k) % n] for k in range(n)] for r in range(rounds)]


def predecessors(names: Sequence[str], rounds: int) -> dict[str, list[str | None]]:
    """Which contender ran just before each contender's round, round by round (None: the
    first round of the first contender, after whatever ran before the call)."""
    seq = [n for r in rotation(names, rounds) for n in r]
    out: dict[str, list[str | None]] = {n: [] for n in names}
    for i, n in enumerate(seq):
        out[n].append(seq[i - 1] if i else None)
    return out


def bin_trace(calls: Sequence[tuple[float, float]],
              edges_ms: Sequence[float]) -> list[tuple[float, float, float | None, int]]:
    """Calls (start in ms since the trace began, seconds) grouped by start time:
    (from ms, to ms, median seconds or None, count) per bin."""
    out = []
    for lo, hi in zip(edges_ms, edges_ms[1:]):
        got = [s for t, s in calls if lo <= t < hi]
        out.append((lo, hi, statistics.median(got) if got else None, len(got)))
    return out


def tail_median(calls: Sequence[tuple[float, float]], fraction: float = 0.3) -> float:
    """The median call of the last ``fraction`` of the trace's time: its settled speed."""
    end = calls[-1][0]
    return statistics.median([s for t, s in calls if t >= end * (1 - fraction)])


def settle_ms(calls: Sequence[tuple[float, float]], tol: float = TOL, width_ms: float = 10.0) -> float:
    """How long after the start the calls settle: the start of the first 10 ms bin from which
    every later bin's median is within ``tol`` of the tail's."""
    final = tail_median(calls)
    end = calls[-1][0]
    edges = [i * width_ms for i in range(int(end // width_ms) + 2)]
    bins = [(lo, m) for lo, _, m, _ in bin_trace(calls, edges) if m is not None]
    settled = end
    for lo, m in reversed(bins):
        if abs(m / final - 1) > tol:
            break
        settled = lo
    return settled


def calls_median(calls: Sequence[tuple[float, float]], first: int, count: int) -> float:
    """The median of calls ``first`` .. ``first + count - 1`` (a round after its warm-up)."""
    return statistics.median(s for _, s in calls[first:first + count])


def calls_after(calls: Sequence[tuple[float, float]], ms: float, count: int) -> float:
    """The median of the ``count`` calls that start after ``ms`` (a round after a timed warm-up)."""
    return statistics.median([s for t, s in calls if t >= ms][:count])


def rel(a: float, b: float) -> float:
    return a / b - 1


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def mhz_text(samples: Sequence[float]) -> str:
    if not samples:
        return "-"
    return f"{statistics.median(samples):.0f} ({min(samples):.0f}-{max(samples):.0f})"


# ------------------------------------------------------------------------ the table

def method_rows(problem: dict) -> list[tuple[str, str, dict[str, float], dict[str, list[float]], float]]:
    """(method, order, seconds per contender, clock samples per contender, round spread) for
    every row of a problem's table, the min-of-rounds rows derived from the harness rows."""
    rows = []
    for method in METHODS:
        for order in ORDERS:
            r = problem["methods"].get(method, {}).get(order)
            if r is None:
                continue
            spreads = [spread(v) for v in r["rounds"].values() if len(v) > 1]
            rows.append((method, order, r["seconds"], r["clock"], max(spreads, default=0.0)))
            if method.startswith("harness"):
                mins = {n: min(v) for n, v in r["rounds"].items()}
                rows.append((method + ", min of rounds", order, mins, r["clock"], max(spreads, default=0.0)))
    return rows


def problem_table(problem: dict) -> str:
    names = problem["contenders"]
    peer = PEER[problem["kind"]]
    note = "; " + problem["note"] if problem["note"] else ""
    head = (f"### {problem['name']} (TFLOP/s; tkc: {problem['tkc']}{note})\n\n| method | order | "
            + " | ".join(names) + f" | tkc / {peer} | SM MHz, tkc | SM MHz, {peer} | rounds spread |\n|---|---|"
            + "---|" * (len(names) + 4))
    lines = [head]
    for method, order, secs, clock, spr in method_rows(problem):
        cells = [f"{problem['flops'] / secs[n] / 1e12:.1f}" if secs.get(n) else "-" for n in names]
        ratio = f"{secs[peer] / secs['tkc']:.3f}" if secs.get("tkc") and secs.get(peer) else "-"
        lines.append(f"| {method} | {order} | " + " | ".join(cells) + f" | {ratio} | "
                     f"{mhz_text(clock.get('tkc', []))} | {mhz_text(clock.get(peer, []))} | {spr:.1%} |")
    return "\n".join(lines) + "\n"


def ratio_of(problem: dict, method: str, order: str) -> float | None:
    r = problem["methods"].get(method, {}).get(order)
    peer = PEER[problem["kind"]]
    if r is None or not r["seconds"].get("tkc") or not r["seconds"].get(peer):
        return None
    return r["seconds"][peer] / r["seconds"]["tkc"]


def summary_table(problems: Sequence[dict]) -> str:
    lines = ["### tkc / peer, each method, both orders (tkc first / peer first)\n",
             "| problem | " + " | ".join(METHODS) + " |", "|---|" + "---|" * len(METHODS)]
    for p in problems:
        cells = []
        for m in METHODS:
            got = [ratio_of(p, m, o) for o in ORDERS]
            cells.append(" / ".join("-" if g is None else f"{g:.3f}" for g in got))
        lines.append(f"| {p['name']} vs {PEER[p['kind']]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def trace_table(traces: Sequence[dict], flops: float) -> str:
    edges = [0, 5, 20, 50, 100, 200, 400, 700, 1000, 1e9]
    lines = ["### Back-to-back calls after idle and after another contender (TFLOP/s by time since the "
             "start, ms; SM MHz median)\n",
             "| contender | after | "
             + " | ".join(f"{a:g}-{b:g}" if b < 1e9 else f"{a:g}-" for a, b in zip(edges, edges[1:]))
             + " | settled after | SM MHz first 50 ms | SM MHz last 300 ms | W last 300 ms | throttle reasons |",
             "|---|---|" + "---|" * (len(edges) + 4)]
    for t in traces:
        if t.get("predecessor_only"):
            continue
        cells = [f"{flops / m / 1e12:.0f}" if m else "-" for _, _, m, _ in bin_trace(t["calls"], edges)]
        end = t["calls"][-1][0]
        early = [c for ms, c in t["clock"] if ms < 50]
        late = [c for ms, c in t["clock"] if ms >= end - 300]
        watts = [w for ms, _, w, _ in t.get("samples", []) if ms >= end - 300 and w >= 0]
        why = 0
        for *_, r in t.get("samples", []):
            why |= max(r, 0)
        lines.append(f"| {t['contender']} | {t['after']} | " + " | ".join(cells)
                     + f" | {settle_ms(t['calls']):.0f} ms | {mhz_text(early)} | {mhz_text(late)} | "
                     f"{fmt(statistics.median(watts) if watts else None, '.0f')} | {why:#x} |")
    return "\n".join(lines) + "\n"


def inside_table(inside: dict) -> str:
    lines = ["### Inside the timed region (16k-token row; us a call)\n",
             "| contender | event window, queued | event window, synchronized each call | kernels (profiler) | "
             "window - kernels | host time of a call | flush (256 MB clear) | kernels launched |",
             "|---|---|---|---|---|---|---|---|"]
    for name, d in inside.items():
        k = d.get("kernel_us")
        extra = None if k is None else d["queued_us"] - k
        lines.append(f"| {name} | {d['queued_us']:.1f} | {d['synced_us']:.1f} | {fmt(k, '.1f')} | "
                     f"{fmt(extra, '.1f')} | {d['host_us']:.1f} | {d['flush_us']:.1f} | {d.get('kernels', '-')} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- the verdicts

def verdicts(problems: Sequence[dict], traces: Sequence[dict], inside: dict) -> list[str]:
    """One line per hypothesis, from the numbers."""
    out = []
    main = problems[0]
    peer = PEER[main["kind"]]

    # Agreement: each method's tkc/peer ratio and peer TFLOP/s against the independent timer's.
    def mean_ratio(p: dict, m: str) -> float | None:
        got = [r for o in ORDERS if (r := ratio_of(p, m, o)) is not None]
        return statistics.mean(got) if got else None

    def peer_tflops(p: dict, m: str) -> float | None:
        got = [p["flops"] / r["seconds"][PEER[p["kind"]]] / 1e12 for o in ORDERS
               if (r := p["methods"].get(m, {}).get(o)) and r["seconds"].get(PEER[p["kind"]])]
        return statistics.mean(got) if got else None

    def times_apart(p: dict, m: str, ref: str) -> float:
        """The largest difference of one contender's seconds between two methods (same order)."""
        worst = 0.0
        for o in ORDERS:
            a, b = p["methods"].get(m, {}).get(o), p["methods"].get(ref, {}).get(o)
            if a and b:
                worst = max([worst] + [abs(rel(a["seconds"][n], b["seconds"][n])) for n in a["seconds"]
                                       if a["seconds"][n] and b["seconds"].get(n)])
        return worst

    def ratio_gap(m: str, ref: str) -> float | None:
        """The largest difference of tkc/peer between two methods over the rows (None: no row has both)."""
        gaps = [abs(rel(a, b)) for p in problems if (a := mean_ratio(p, m)) and (b := mean_ratio(p, ref))]
        return max(gaps) if gaps else None

    # No method is the truth (a timer can be biased the same way as another): each pair is
    # compared, and the pairs that agree on every row are listed.
    pairs = [(m, "independent") for m in METHODS if m != "independent"]
    pairs += [(m, "do_bench") for m in ("harness@eaa649b", "harness", "alternating")]
    for m, ref in pairs:
        worst = ratio_gap(m, ref)
        if worst is None:
            out.append(f"agreement, {m} vs {ref}: no row timed by both")
            continue
        apart = max(times_apart(p, m, ref) for p in problems)
        mr, rr, pt, rt = mean_ratio(main, m), mean_ratio(main, ref), peer_tflops(main, m), peer_tflops(main, ref)
        out.append(f"agreement, {m} vs {ref}: tkc/peer ratios differ by at most {worst:.1%} over the rows "
                   f"({'agrees' if worst <= TOL else 'DISAGREES'}), a contender's time by at most {apart:.1%}; "
                   f"{main['name']}: tkc/{peer} {fmt(mr)} vs {fmt(rr)}, {peer} {fmt(pt, '.0f')} vs {fmt(rt, '.0f')} "
                   "TFLOP/s")
    close = [f"{a} ~ {b}" for i, a in enumerate(METHODS) for b in METHODS[i + 1:]
             if (g := ratio_gap(a, b)) is not None and g <= TOL]
    out.append("agreement, pairs within 2% on every row's tkc/peer: " + (", ".join(close) or "none"))

    # Clock ramp: a legacy round after idle (calls 5-20) against the settled speed.
    for t in traces:
        if t["after"] != "idle":
            continue
        calls = t["calls"]
        first, final = calls_median(calls, 5, 16), tail_median(calls)
        warm_ms = calls[5][0] if len(calls) > 5 else 0.0
        slow = rel(first, final)
        out.append(f"clock ramp, {t['contender']} from idle: a round after 5 warm-up calls ({warm_ms:.0f} ms) runs "
                   f"{slow:+.1%} against the settled speed, which it reaches after {settle_ms(calls):.0f} ms: "
                   + ("SUPPORTED (the first contender of a run is timed on a ramping clock)" if slow > TOL
                      else "not supported (5 calls are enough here)"))

    # How long a warm-up must be: the slowest settling of any contender after anything.
    settles = [(settle_ms(t["calls"]), t["contender"], t["after"]) for t in traces if not t.get("predecessor_only")]
    if settles:
        ms, who, after = max(settles)
        out.append(f"warm-up: the slowest to settle was {who} after {after}, {ms:.0f} ms; harness.WARMUP_S is "
                   f"{harness.WARMUP_S * 1e3:.0f} ms: " + ("long enough" if ms <= harness.WARMUP_S * 1e3 else
                                                    "TOO SHORT: the clock remembers longer than the warm-up"))

    # Order: the same contender right after a light kernel and right after a heavy one.
    by = {(t["contender"], t["after"]): t["calls"] for t in traces}
    for who, heavy in (("cuDNN", "tkc"), ("tkc", "cuDNN")):
        light = by.get((who, "mem-efficient"))
        hot = by.get((who, heavy))
        if light and hot:
            d = rel(calls_median(light, 5, 16), calls_median(hot, 5, 16))
            d_new = rel(calls_after(light, 100, 16), calls_after(hot, 100, 16))
            out.append(f"order, {who}: a round of 16 after 5 warm-up calls takes {d:+.1%} after mem-efficient "
                       f"against after {heavy}; after a 0.1 s warm-up {d_new:+.1%}: "
                       + ("SUPPORTED (the predecessor sets the clock a round is timed at)" if abs(d) > TOL
                          else "not supported") + ("; the 0.1 s warm-up removes it" if abs(d) > TOL >= abs(d_new)
                                                   else "; the 0.1 s warm-up does not remove it" if abs(d_new) > TOL
                                                   else ""))
    for m in METHODS:
        got = [(p["name"], ratio_of(p, m, "tkc first"), ratio_of(p, m, "peer first")) for p in problems]
        diffs = [(n, abs(rel(a, b))) for n, a, b in got if a and b]
        if diffs:
            name, worst = max(diffs, key=lambda d: d[1])
            out.append(f"order, {m}: tkc/peer moves by up to {worst:.1%} between the two orders ({name}): "
                       + ("order-dependent" if worst > TOL else "order does not matter"))

    # Inside the timed region and the flush.
    for name, d in inside.items():
        k = d.get("kernel_us")
        extra = d["queued_us"] - k if k is not None else None
        gap = d["host_us"] - d["flush_us"]
        out.append(f"timed region, {name}: queued window - kernels = "
                   + ("unknown (no profile)" if extra is None else
                      f"{extra:.1f} us ({extra / d['queued_us']:.1%}; the flush is {d['flush_us']:.0f} us: "
                      + ("INSIDE the window" if extra > d["flush_us"] / 2 else "outside") + ")")
                   + f"; host work {d['host_us']:.0f} us a call "
                   + (f"exceeds the flush by {gap:.0f} us: a timer that synchronizes every call times that idle GPU"
                      if gap > 0 else "hides behind the flush")
                   + f" (synchronized window {d['synced_us'] - d['queued_us']:+.1f} us against queued)")

    # Too few rounds: how far the legacy harness's rounds moved.
    for m in ("harness@eaa649b", "harness"):
        spreads = [spread(v) for p in problems for o in ORDERS
                   if (r := p["methods"].get(m, {}).get(o)) for v in r["rounds"].values()]
        if spreads:
            out.append(f"rounds, {m}: a contender's three rounds spread by up to {max(spreads):.1%} "
                       f"(median {statistics.median(spreads):.1%}): "
                       + ("too few rounds for a 2% comparison" if statistics.median(spreads) > TOL
                          else "enough for a 2% comparison"))

    # The clock each method ran at.
    for m in METHODS:
        mhz = [c for p in problems for o in ORDERS if (r := p["methods"].get(m, {}).get(o))
               for v in r["clock"].values() for c in v]
        if mhz:
            out.append(f"clock, {m}: SM {mhz_text(mhz)} MHz over its timed regions")
    return out


# ------------------------------------------------------------------- on the GPU

class ClockSampler:
    """The SM clock, power and throttle reasons every few ms, in a thread (pynvml; else
    ``nvidia-smi -lms``), stamped with time.perf_counter()."""

    def __init__(self, period_s: float = 0.004) -> None:
        self.period_s = period_s
        self.samples: list[tuple[float, float, float, int]] = []
        self.source = "none"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None

    def start(self, device_index: int = 0) -> None:
        try:
            self._start_nvml(device_index)
        except Exception as e:  # noqa: BLE001 - no pynvml: nvidia-smi instead
            print(f"  (pynvml unavailable: {e}; sampling with nvidia-smi -lms)", flush=True)
            self._start_smi(device_index)

    def _start_nvml(self, device_index: int) -> None:
        import pynvml as nv

        nv.nvmlInit()
        handle = nv.nvmlDeviceGetHandleByIndex(nvml_index(device_index))
        reasons = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                   or nv.nvmlDeviceGetCurrentClocksThrottleReasons)

        def read(f: Callable[[], float]) -> float:
            try:
                return f()
            except nv.NVMLError:  # not reported on this GPU: the clock still is
                return -1.0

        def loop() -> None:
            while not self._stop.is_set():
                t = time.perf_counter()
                self.samples.append((t, float(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)),
                                     read(lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1e3),
                                     int(read(lambda: reasons(handle)))))
                time.sleep(self.period_s)
        self.source = "pynvml"
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def _start_smi(self, device_index: int) -> None:
        self._proc = subprocess.Popen(
            ["nvidia-smi", "-i", str(nvml_index(device_index)), "--format=csv,noheader,nounits", "-lms", "20",
             "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active"], stdout=subprocess.PIPE, text=True)

        def loop() -> None:
            assert self._proc is not None and self._proc.stdout is not None
            for line in self._proc.stdout:
                try:
                    mhz, watts, why = (x.strip() for x in line.split(","))
                    self.samples.append((time.perf_counter(), float(mhz), float(watts), int(why, 16)))
                except ValueError:
                    continue
        self.source = "nvidia-smi -lms 20"
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def mhz(self, t0: float, t1: float) -> list[float]:
        return [c for t, c, _, _ in list(self.samples) if t0 <= t <= t1]

    def samples_since(self, t0: float, t1: float) -> list[tuple[float, float, float, int]]:
        """(ms since t0, MHz, W, throttle reasons) for the samples between t0 and t1."""
        return [((t - t0) * 1e3, c, w, r) for t, c, w, r in list(self.samples) if t0 <= t <= t1]

    def since(self, t0: float, t1: float) -> list[tuple[float, float]]:
        """(ms since t0, MHz) for the samples between t0 and t1."""
        return [((t - t0) * 1e3, c) for t, c, _, _ in list(self.samples) if t0 <= t <= t1]


def nvml_index(device_index: int) -> int:
    """NVML's number for torch's device ``device_index`` (CUDA_VISIBLE_DEVICES renumbers)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if device_index < len(visible) and visible[device_index].isdigit():
        return int(visible[device_index])
    return device_index


def do_bench_s(fn: Callable[[], Any]) -> float:
    """triton.testing.do_bench's median, in seconds (``quantiles`` where it has no return_mode)."""
    from triton.testing import do_bench

    try:
        return do_bench(fn, **DO_BENCH_ARGS) / 1e3
    except TypeError:
        return do_bench(fn, warmup=DO_BENCH_ARGS["warmup"], rep=DO_BENCH_ARGS["rep"], quantiles=[0.5])[0] / 1e3


def legacy_gpu_time(fn: Callable[[], Any], runs: int, cache: Any) -> float:
    """tkc.runtime.timing.gpu_time(fn, runs, 5, 256 MB) as it was at eaa649b: five warm-up
    calls without a flush, then every call flushed and timed, one synchronize at the end."""
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for s, e in zip(starts, ends):
        cache.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends))


def independent_times(fn: Callable[[], Any], cache: Any, runs: int = IND_RUNS, warmup: int = IND_WARMUP) -> list[float]:
    """Each call alone: clear L2, start event, the call, end event, wait for it."""
    import torch

    for _ in range(warmup):
        cache.zero_()
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(runs):
        cache.zero_()
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return times


def run_method(method: str, contenders: dict[str, Callable[[], Any]], sampler: ClockSampler, cache: Any) -> dict:
    """Seconds per call of each contender by one method; its rounds and the SM clock sampled
    while each contender ran."""
    import torch

    names = list(contenders)
    rounds: dict[str, list[float]] = {n: [] for n in names}
    clock: dict[str, list[float]] = {n: [] for n in names}

    def timed(name: str, f: Callable[[], float]) -> float:
        t0 = time.perf_counter()
        s = f()
        clock[name] += sampler.mhz(t0, time.perf_counter())
        rounds[name].append(s)
        return s

    wall = time.perf_counter()
    if method == "harness@eaa649b":
        per_round = max(RUNS // ROUNDS, 10)
        timers = [lambda n=n: timed(n, lambda: legacy_gpu_time(contenders[n], per_round, cache)) for n in names]
        seconds = dict(zip(names, interleaved_medians(timers, ROUNDS)))
    elif method == "harness":
        name_of = {id(fn): n for n, fn in contenders.items()}
        original = harness.gpu_time

        def recording(fn: Callable[[], Any], runs: int = 50, warmup: int = 5, flush: bool = True) -> Any:
            t = None

            def go() -> float:
                nonlocal t
                t = original(fn, runs, warmup, flush)
                return t.median_s
            timed(name_of[id(fn)], go)
            return t
        harness.gpu_time = recording
        try:
            seconds = harness.in_turns(contenders, RUNS)
        finally:
            harness.gpu_time = original
    elif method == "independent":
        for _ in range(IND_ROUNDS):
            for n in names:
                timed(n, lambda n=n: statistics.median(independent_times(contenders[n], cache)))
        seconds = {n: min(rounds[n]) for n in names}
    elif method == "do_bench":
        for n in names:
            timed(n, lambda n=n: do_bench_s(contenders[n]))
        seconds = {n: rounds[n][0] for n in names}
    elif method == "alternating":
        t0 = time.perf_counter()
        times = harness.alternating_times(contenders, ALT_CYCLES)
        mhz = sampler.mhz(t0, time.perf_counter())
        for n in names:
            rounds[n] += [statistics.median(times[n][i::3]) for i in range(3)]  # three interleaved thirds
            clock[n] += mhz
        seconds = {n: statistics.median(times[n]) for n in names}
    else:
        raise ValueError(method)
    torch.cuda.synchronize()
    return {"seconds": seconds, "rounds": rounds, "clock": clock, "wall_s": time.perf_counter() - wall}


def trace(fn: Callable[[], Any], cache: Any, seconds: float, sampler: ClockSampler, chunk: int = 8) -> dict:
    """``fn`` back to back (each call after a flush, timed by events) for ``seconds`` of GPU
    time from now; the calls as (ms since the start, seconds) and the clock as (ms, MHz).
    At most two chunks are queued at a time, so the sampler thread is never starved."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    begin = torch.cuda.Event(enable_timing=True)
    begin.record()
    done: list[tuple[Any, Any]] = []
    last: list[tuple[Any, Any]] | None = None
    while True:
        evs = []
        for _ in range(chunk):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            cache.zero_()
            s.record()
            fn()
            e.record()
            evs.append((s, e))
        done += evs
        if last is not None:
            last[-1][1].synchronize()
            if begin.elapsed_time(last[-1][1]) / 1e3 >= seconds:
                break
        last = evs
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    return {"calls": [(begin.elapsed_time(s), s.elapsed_time(e) / 1e3) for s, e in done],
            "clock": sampler.since(t0, t1), "samples": sampler.samples_since(t0, t1)}


def traces(contenders: dict[str, Callable[[], Any]], cache: Any, sampler: ClockSampler, out: list[dict]) -> None:
    """cuDNN and tkc back to back from idle, after mem-efficient and after each other, into ``out``."""
    import torch


    def one(who: str, after: str, seconds: float = TRACE_S, predecessor_only: bool = False) -> None:
        print(f"  trace: {who} after {after}", flush=True)
        t = trace(contenders[who], cache, seconds, sampler)
        out.append({"contender": who, "after": after, "predecessor_only": predecessor_only, **t})

    light = "mem-efficient"
    for who, other in (("cuDNN", "tkc"), ("tkc", "cuDNN")):
        torch.cuda.synchronize()
        time.sleep(IDLE_S)
        one(who, "idle")
        one(light, "-", PRED_S, predecessor_only=True)
        one(who, light)
        one(other, who)
        one(who, other)


def inside_window(contenders: dict[str, Callable[[], Any]], cache: Any) -> dict:
    """Per contender: the event window queued (as the harness) and synchronized each call (as
    the independent timer), the kernels one call launches (torch.profiler), the host time of
    a call and the flush's GPU time."""
    import torch

    def flush_us() -> float:
        times = []
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            cache.zero_()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        return statistics.median(times)

    def kernels(fn: Callable[[], Any], calls: int = 3) -> list[tuple[str, float]]:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        return [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]

    out: dict[str, dict] = {}
    try:
        flush_names = {n for n, _ in kernels(cache.zero_, 1)}
    except Exception as e:  # noqa: BLE001 - no profiler: windows and host times only
        print(f"  (torch.profiler failed: {type(e).__name__}: {e})", flush=True)
        flush_names = None
    for name, fn in contenders.items():
        d = {"queued_us": legacy_gpu_time(fn, 10, cache) * 1e6,
             "synced_us": statistics.median(independent_times(fn, cache, runs=10)) * 1e6,
             "host_us": harness.host_time(fn, 50) * 1e6, "flush_us": flush_us()}
        if flush_names is not None:
            try:
                ks = [(k, us) for k, us in kernels(fn) if k not in flush_names]
                d["kernel_us"] = sum(us for _, us in ks) / 3
                d["kernels"] = ", ".join(sorted({k[:40] for k, _ in ks})) + f" ({len(ks) // 3} a call)"
            except Exception as e:  # noqa: BLE001 - a contender the profiler cannot follow keeps its windows
                print(f"  (torch.profiler failed on {name}: {type(e).__name__}: {e})", flush=True)
        out[name] = d
        print(f"  inside: {name}: {d}", flush=True)
    return out


def problems_on_gpu() -> list[dict]:
    """The rows: attention at 16k tokens (plain and causal) and 4k x 4, GEMM 8192^3; each
    with its contenders in benchmarks/run.py's order and tkc's pinned kernel compiled."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tkc.compiler import compile_kernel
    from tkc.errors import TkcError
    from tkc.runtime.launch import launch

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    backends = {"cuDNN": SDPBackend.CUDNN_ATTENTION, "flash (FA2)": SDPBackend.FLASH_ATTENTION,
                "mem-efficient": SDPBackend.EFFICIENT_ATTENTION}
    out = []
    for B, N, causal in ((1, 16384, False), (1, 16384, True), (4, 4096, False)):
        H, D = 16, 128
        q, k, v = randn(B, H, N, D), randn(B, H, N, D), randn(B, H, N, D)
        o = torch.empty_like(q)
        scale = 1 / math.sqrt(D)
        consts = {"D": D, "causal": causal, "defer_last": True, "BN": 192}
        pins = "attn.tk D=128, defer_last, BN=192"
        try:
            compiled = compile_kernel(EXAMPLES / "attn.tk", consts)
        except TkcError as e:  # not expected (benchmarks/run.py tries these pins): say so, time defer_last alone
            print(f"  attn.tk {consts}: {e.message.splitlines()[0]}; timing without BN=192", flush=True)
            del consts["BN"]
            pins = "attn.tk D=128, defer_last (BN=192 did not compile)"
            compiled = compile_kernel(EXAMPLES / "attn.tk", consts)
        run = (lambda c=compiled, a=[q, k, v, o, scale]: launch(c, a))
        o.fill_(float("nan"))
        run()
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        err = (o.float() - ref.float()).abs().max().item()
        contenders: dict[str, Callable[[], Any]] = {"tkc": run}
        for name, be in backends.items():
            def sdpa(be=be, q=q, k=k, v=v, causal=causal, scale=scale) -> None:
                with sdpa_kernel([be]):
                    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
            try:
                sdpa()
                contenders[name] = sdpa
            except RuntimeError as e:
                print(f"  {name} does not run B{B} N{N}: {str(e).splitlines()[0]}", flush=True)
        out.append({"name": f"attention B{B} H{H} N{N} D{D}{' causal' if causal else ''}", "kind": "attention",
                    "flops": 4 * B * H * N * N * D // (2 if causal else 1), "contenders": list(contenders),
                    "fns": contenders, "tkc": pins,
                    "note": f"tkc's output max error {err:.3g}"
                    + (" WRONG" if not err < 2e-2 * ref.abs().max().item() else "")})
    a, b = randn(8192, 8192), randn(8192, 8192)
    c = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
    compiled = compile_kernel(EXAMPLES / "gemm.tk", {})
    run = (lambda: launch(compiled, [a, b, c]))
    run()
    err = (c.float() - (a.float() @ b.float())).abs().max().item()
    out.append({"name": "GEMM 8192^3 bf16", "kind": "gemm", "flops": 2 * 8192 ** 3,
                "contenders": ["tkc", "torch (cuBLAS)"], "tkc": "gemm.tk defaults",
                "fns": {"tkc": run, "torch (cuBLAS)": lambda: torch.matmul(a, b, out=c)},
                "note": f"tkc's output max error {err:.3g}"})
    return out


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        sys.exit("benchmarks/timer_check.py needs a CUDA GPU (torch.cuda.is_available() is False)")

    started = time.perf_counter()
    print(harness.device_description(), flush=True)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=power.limit,clocks.max.sm,clocks.sm,temperature.gpu",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    print(f"power limit, max SM clock, SM clock now, temperature: {smi}", flush=True)
    sampler = ClockSampler()
    sampler.start()
    cache = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    problems = problems_on_gpu()
    print(f"compiled and checked in {time.perf_counter() - started:.0f} s", flush=True)
    for p in problems:
        for i, order in enumerate(ORDERS):
            fns = {n: p["fns"][n] for n in ordered(p["contenders"], order)}
            # The methods run forwards in one order and backwards in the other, so that no
            # method always comes first.
            for m in (METHODS if i == 0 else METHODS[::-1]):
                p.setdefault("methods", {}).setdefault(m, {})
                try:
                    r = run_method(m, fns, sampler, cache)
                except Exception as e:  # noqa: BLE001 - one method failing (no triton, say) leaves the others
                    print(f"  {p['name']}, {m}, {order}: FAILED {type(e).__name__}: {e}", flush=True)
                    continue
                p["methods"][m][order] = r
                got = ", ".join(f"{n} {p['flops'] / s / 1e12:.1f}" for n, s in r["seconds"].items())
                print(f"  {p['name']}, {m}, {order}: {got} ({r['wall_s']:.1f} s)", flush=True)
    main_fns = problems[0]["fns"]
    trs: list[dict] = []
    inside: dict = {}
    try:
        traces(main_fns, cache, sampler, trs)
        inside = inside_window(main_fns, cache)
    except Exception as e:  # noqa: BLE001 - the tables above still get written
        print(f"  experiments FAILED {type(e).__name__}: {e}", flush=True)
    sampler.stop()
    smi = subprocess.run(["nvidia-smi", "--format=csv,noheader",
                          "--query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"],
                         capture_output=True, text=True).stdout.strip()
    text = report(problems, trs, inside, harness.device_description(), sampler.source, smi,
                  time.perf_counter() - started)
    print()
    print(text)
    out = os.environ.get("OUT")
    if out:
        Path(out, "timer_check.md").write_text(text)
        kept = [{k: v for k, v in p.items() if k != "fns"} for p in problems]
        Path(out, "timer_check.json").write_text(json.dumps({"problems": kept, "traces": trs, "inside": inside}))


def report(problems: Sequence[dict], trs: Sequence[dict], inside: dict, device: str, source: str, smi: str,
           wall_s: float) -> str:
    """The markdown: the summary, a table per row, the traces, the timed region, the verdicts."""
    parts = [f"Timer check on {device}; SM clock from {source}; after the run: {smi}; {wall_s:.0f} s in all.\n",
             summary_table(problems)]
    parts += [problem_table(p) for p in problems]
    parts.append(trace_table(trs, problems[0]["flops"]))
    parts.append(inside_table(inside))
    lines = [f"- {v}" for v in verdicts(problems, trs, inside)]
    parts.append("### Verdicts (computed from the numbers above)\n\n" + "\n".join(lines) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    main()
