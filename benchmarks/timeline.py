"""Where a multi-GPU call's time goes: one call of each contender under PyTorch's profiler on
every rank, its GPU kernels as spans on a common clock, drawn as a timeline and summed by kind.

Used by ``benchmarks/multi_gpu.py --timeline``.  Every rank profiles the same call (after the
ranks are in step: CUDA synchronize, then a barrier), so the spans show which rank waits for
which and how much of the call is product, communication or neither.  The profiler's GPU
timestamps come from one host clock, shared by the processes of one machine; each call's spans
are shifted so that its earliest kernel on any rank starts at 0.  A fused kernel is one span:
what happens inside it is read from the "alone" contenders of the same table (the same product
without communication), as the RESULTS section beside the timeline says.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

#: kernel name fragments -> the kind a span is counted as (first match wins)
KINDS = [("nccl", "NCCL"), ("symm_mem", "symm_mem"), ("two_shot", "symm_mem"), ("multimem", "symm_mem"),
         ("nvjet", "cuBLAS"), ("gemm", "GEMM"), ("cutlass", "GEMM"), ("sm90_xmma", "GEMM"), ("flash", "attention"),
         ("fmha", "attention"), ("attn", "attention"), ("grouped", "GEMM"), ("elementwise", "copy/fill"),
         ("memset", "copy/fill"), ("fill", "copy/fill"), ("copy", "copy/fill"), ("index", "copy/fill")]


#: kernel names counted as tkc's: the examples' kernels (their entries are named as in the file)
OURS = {p.stem for p in (Path(__file__).resolve().parents[1] / "examples").glob("*.tk")}


@dataclass
class Span:
    """One GPU kernel of one rank: microseconds from the call's start."""

    rank: int
    name: str
    start: float
    end: float

    @property
    def kind(self) -> str:
        if self.name in OURS:
            return "tkc"
        low = self.name.lower()
        return next((kind for frag, kind in KINDS if frag in low), "other")


def _kernels(fn: Callable[[], Any]) -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of the GPU kernels of one call of ``fn`` on this rank, on the
    profiler's clock."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return [(e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]


def capture(contenders: dict[str, Callable[[], Any]]) -> dict[str, list[Span]] | None:
    """Every contender's call as spans, on rank 0 (None elsewhere); a contender that fails is
    left out.  Every rank must call this alike."""
    mine: dict[str, list[tuple[str, float, float]]] = {}
    _kernels(torch.cuda.synchronize)  # the profiler's first session starts CUPTI: 0.1 s on some ranks
    for name, fn in contenders.items():
        try:
            fn()  # warm: compiled, allocated, NCCL's channels up
            mine[name] = _kernels(fn)
        except Exception:  # a contender that failed was already reported by its timing
            mine[name] = []
    every: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else None  # type: ignore[assignment]
    dist.gather_object(mine, every, dst=0)
    if dist.get_rank() != 0:
        return None
    out: dict[str, list[Span]] = {}
    for name in contenders:
        raw = [(r, k) for r, per in enumerate(every) for k in per.get(name, [])]
        if not raw:
            continue
        t0 = min(s for _, (_, s, _) in raw)
        out[name] = sorted((Span(r, n, s - t0, e - t0) for r, (n, s, e) in raw), key=lambda s: (s.rank, s.start))
    return out


def summary(spans: dict[str, list[Span]]) -> str:
    """One line a contender: the call's length once every rank is in it (from the last rank's
    first kernel to the last kernel's end; the host releases the ranks up to hundreds of µs
    apart, which a collective's first kernel absorbs) and from the first kernel on any rank;
    for the rank that finishes last, the µs of each kind of kernel and of the time it had no
    kernel running (before its first, between them)."""
    lines = []
    for name, ss in spans.items():
        ranks = sorted({s.rank for s in ss})
        length = max(s.end for s in ss)
        late = max(min(s.start for s in ss if s.rank == r) for r in ranks)
        slowest = max(ranks, key=lambda r: max(s.end for s in ss if s.rank == r))
        mine = [s for s in ss if s.rank == slowest]
        kinds: dict[str, float] = {}
        for s in mine:
            kinds[s.kind] = kinds.get(s.kind, 0.0) + s.end - s.start
        busy = _covered([(s.start, s.end) for s in mine])
        idle = max(s.end for s in mine) - busy
        parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
        starts = ", ".join(f"{min(s.start for s in ss if s.rank == r):.0f}" for r in ranks)
        lines.append(f"- {name}: {length - late:.0f} µs with every rank in ({length:.0f} from the first kernel); "
                     f"rank {slowest} (last to finish): {parts}, idle before and between its kernels {idle:.0f}; "
                     f"first kernel starts (µs, rank by rank): {starts}")
    return "\n".join(lines)


def _covered(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of ``intervals``."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def draw(rows: Sequence[tuple[str, dict[str, list[Span]]]], path: Path) -> bool:
    """One PNG, a panel per row (title, spans by contender): a lane per (contender, rank), each
    kernel a bar coloured by kind.  False (and no file) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [(t, s) for t, s in rows if s]
    if not rows:
        return False
    colours = {"tkc": "tab:red", "NCCL": "tab:blue", "cuBLAS": "tab:green", "GEMM": "tab:olive",
               "symm_mem": "tab:purple", "attention": "tab:cyan", "copy/fill": "tab:gray", "other": "tab:brown"}
    lanes = [sum(len({s.rank for s in ss}) for ss in spans.values()) for _, spans in rows]
    fig, axes = plt.subplots(len(rows), 1, figsize=(11, sum(0.22 * n + 0.9 for n in lanes)), squeeze=False,
                             gridspec_kw={"height_ratios": [n + 3 for n in lanes]})
    for ax, (title, spans) in zip(axes[:, 0], rows):
        labels, y, seen = [], 0, set()
        for name, ss in spans.items():
            for r in sorted({s.rank for s in ss}):
                for s in (s for s in ss if s.rank == r):
                    kind = s.kind if s.kind in colours else "other"
                    ax.barh(y, s.end - s.start, left=s.start, height=0.8, color=colours[kind],
                            label=kind if kind not in seen else None, edgecolor="black", linewidth=0.2)
                    seen.add(kind)
                labels.append(f"{name} r{r}")
                y += 1
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel("µs from the call's first kernel", fontsize=7)
        ax.set_title(title, fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
