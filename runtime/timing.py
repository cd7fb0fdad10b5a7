"""Timing GPU work: the one method tkc uses (``tkc run --repeat``, ``tkc.autotune``, the
benchmark harness).

CUDA events around each call, warm-up first, the median of the runs.  With ``flush_bytes``,
a buffer that size is cleared before every call, warm-up included, so each run starts with a
cold L2 and the warm-up draws the power the timed runs will (the call's CPU-side work overlaps
the clearing, and the start event is behind the clearing on the stream, so the events time
the GPU work alone, as triton.testing.do_bench does).  With ``warmup_s``, the warm-up lasts at
least that many seconds of GPU time whatever ``warmup`` says: a power-capped GPU's clock
follows what ran in the last tens of milliseconds, so a count of calls warms a 3 ms kernel
and not a 30 us one.  Must not: choose what is timed or how often (callers do).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

MAX_WARMUP_CALLS = 100_000  # a warm-up of a kernel that takes no GPU time ends here
#: Seconds of warm-up before timed calls that compare kernels (tkc.autotune, the harness): a
#: power-capped GPU's clock follows its last tens of milliseconds of work and more
#: (benchmarks/timer_check.py measures how long it takes to settle).
WARMUP_S = 0.1


class Timing(NamedTuple):
    median_s: float
    runs: int
    spread: float  # (p80 - p20) / median: how noisy the runs were


def gpu_time(fn: Callable[[], Any], runs: int = 50, warmup: int = 5, flush_bytes: int = 0,
             warmup_s: float = 0.0) -> Timing:
    """Median GPU time of ``fn``, which enqueues work on torch's current stream."""
    import torch

    cache = torch.empty(flush_bytes, dtype=torch.int8, device="cuda") if flush_bytes else None

    def call() -> None:
        if cache is not None:
            cache.zero_()
        fn()

    if warmup_s > 0:
        first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        first.record()
    for _ in range(warmup):
        call()
    if warmup_s > 0:
        # Time the first calls (at least one) and repeat them until warmup_s has passed.
        if not warmup:
            call()
        last.record()
        torch.cuda.synchronize()
        done = first.elapsed_time(last) / 1e3
        per_call = done / max(warmup, 1)
        more = MAX_WARMUP_CALLS if per_call <= 0 else math.ceil((warmup_s - done) / per_call)
        for _ in range(min(max(more, 0), MAX_WARMUP_CALLS)):
            call()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for s, e in zip(starts, ends):
        if cache is not None:
            cache.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends))
    med = statistics.median(times)
    lo, hi = times[len(times) // 5], times[(4 * len(times)) // 5]
    return Timing(med, runs, (hi - lo) / med if med else 0.0)


def alternating_times(fns: Sequence[Callable[[], Any]], calls: int, flush_bytes: int = 0,
                      warmup_s: float = 0.0) -> list[list[float]]:
    """Seconds of each of ``calls`` calls of every function of ``fns``, the functions
    alternating call by call (cycle ``c`` starting at function ``c``), each call after a
    clear of ``flush_bytes`` and timed by CUDA events, after ``warmup_s`` of such cycles.
    Every function then runs at the clock the whole set of calls holds the GPU at, whatever
    that clock remembers of what ran before: the fair comparison on a power-capped GPU, where
    a function timed after another inherits the clock that one left (benchmarks/RESULTS.md,
    benchmarks/timer_check.py)."""
    import torch

    n = len(fns)
    cache = torch.empty(flush_bytes, dtype=torch.int8, device="cuda") if flush_bytes else None

    def cycle(c: int, events: list[list] | None) -> None:
        for k in range(n):
            i = (c + k) % n
            if cache is not None:
                cache.zero_()
            if events is None:
                fns[i]()
                continue
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fns[i]()
            e.record()
            events[i].append((s, e))

    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first.record()
    cycle(0, None)
    last.record()
    torch.cuda.synchronize()
    per_cycle = first.elapsed_time(last) / 1e3
    more = MAX_WARMUP_CALLS if per_cycle <= 0 else math.ceil(warmup_s / per_cycle)
    for c in range(1, 1 + min(more, MAX_WARMUP_CALLS)):
        cycle(c, None)
    events: list[list] = [[] for _ in range(n)]
    for c in range(calls):
        cycle(c, events)
    torch.cuda.synchronize()
    return [[s.elapsed_time(e) / 1e3 for s, e in ev] for ev in events]


def interleaved_medians(timers: Sequence[Callable[[], float]], rounds: int) -> list[float]:
    """Each timer's median over ``rounds`` rounds, every round calling each timer once.

    A GPU under load lowers its clock as it heats (an H100 at its power limit runs 15-25%
    below its boost clock), so timing them one after another favours whichever ran while the
    GPU was cool.  Taking turns, with round ``r`` starting at timer ``r``,
    spreads that drift over all of them alike."""
    n = len(timers)
    samples: list[list[float]] = [[] for _ in range(n)]
    for r in range(rounds):
        for k in range(n):
            i = (r + k) % n
            samples[i].append(timers[i]())
    return [statistics.median(s) for s in samples]
