"""Timing GPU work: the one method tkc uses (``tkc run --repeat``, ``tkc.autotune``, the
benchmark harness).

CUDA events around each call, warm-up first, the median of the runs.  With ``flush_bytes``,
a buffer that size is cleared before every timed call so each run starts with a cold L2 (and
the call's CPU-side work overlaps the clearing, so the events time the GPU work alone, as
triton.testing.do_bench does).  Must not: choose what is timed or how often (callers do).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any, NamedTuple


class Timing(NamedTuple):
    median_s: float
    runs: int
    spread: float  # (p80 - p20) / median: how noisy the runs were


def gpu_time(fn: Callable[[], Any], runs: int = 50, warmup: int = 5, flush_bytes: int = 0) -> Timing:
    """Median GPU time of ``fn``, which enqueues work on torch's current stream."""
    import torch

    cache = torch.empty(flush_bytes, dtype=torch.int8, device="cuda") if flush_bytes else None
    for _ in range(warmup):
        fn()
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
