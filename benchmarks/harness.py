"""Timing on the GPU the same way for every contender, and writing the results down.

Owns: the benchmark timing settings (tkc.runtime.timing's method with a 256 MB L2 flush
before every call and 0.1 s of warm-up; contenders in turns or in alternation; checked against
an independent timer and triton.testing.do_bench by benchmarks/timer_check.py), the
measurement of host overhead per call, the device description, the command line of a script
of row groups, and the three outputs of a run: the table printed last, the section appended
to benchmarks/RESULTS.md, and the PNG plots.
Knows nothing about what is being timed.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tkc.runtime import timing
from tkc.runtime.timing import WARMUP_S, Timing, interleaved_medians

L2_FLUSH_BYTES = 256 * 1024 * 1024


def gpu_time(fn: Callable[[], Any], runs: int = 50, warmup: int = 5, flush: bool = True) -> Timing:
    """Median GPU time of ``fn`` with a cold L2 before every run, warm-up included, after at
    least ``WARMUP_S`` of warm-up (tkc.runtime.timing)."""
    return timing.gpu_time(fn, runs, warmup, L2_FLUSH_BYTES if flush else 0, warmup_s=WARMUP_S)


def in_turns(contenders: dict[str, Callable[[], Any]], runs: int, rounds: int = 3) -> dict[str, float]:
    """Seconds per call of each contender, timed in turns: ``rounds`` rounds, each timing every
    contender once over ``runs / rounds`` calls (at least 10; ``gpu_time``), round ``r``
    starting with contender ``r``; each contender's median round.  A power-limited GPU moves
    its clock by 10% and more within a run, and timing one contender after the other would
    put that drift into their ratio (a run read cuBLAS at 684 TFLOP/s and tkc at 531 in one
    row, 694 and 691 minutes later); in turns, a slow stretch costs every contender alike and
    the median drops it."""
    per_round = max(runs // rounds, 10)
    names = list(contenders)
    timers = [lambda fn=contenders[n]: gpu_time(fn, per_round).median_s for n in names]
    return dict(zip(names, interleaved_medians(timers, rounds)))


def alternating_times(contenders: dict[str, Callable[[], Any]], calls: int) -> dict[str, list[float]]:
    """Seconds of each of ``calls`` calls of every contender, the contenders alternating call by
    call, each call after a 256 MB clear of L2, after ``WARMUP_S`` of such cycles
    (tkc.runtime.timing.alternating_times).  Every contender then runs at the clock the whole
    row sets, whatever that clock remembers: the fair comparison where a warm-up is shorter
    than the clock's memory (benchmarks/timer_check.py measures it)."""
    names = list(contenders)
    times = timing.alternating_times([contenders[n] for n in names], calls, L2_FLUSH_BYTES, WARMUP_S)
    return dict(zip(names, times))


def in_alternation(contenders: dict[str, Callable[[], Any]], runs: int) -> dict[str, float]:
    """Seconds per call of each contender, the median of ``runs`` calls taken in alternation
    (``alternating_times``); what ``in_turns`` answers, with no round to favour anyone."""
    return {name: statistics.median(t) for name, t in alternating_times(contenders, runs).items()}


def host_time(fn: Callable[[], Any], calls: int = 200) -> float:
    """Seconds of CPU time per call of ``fn`` (enqueue only; the GPU keeps up or queues)."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t
    torch.cuda.synchronize()
    return elapsed / calls


def device_description() -> str:
    p = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10).stdout.split("\n")[0].strip() or "?"
    except (OSError, subprocess.SubprocessError):
        driver = "?"
    return (f"{p.name} ({p.multi_processor_count} SMs, {p.total_memory // 2**20} MiB), torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}, driver {driver}")


@dataclass
class Row:
    """One line of a table: a problem, a metric per contender, and the unit."""

    group: str
    problem: str
    unit: str  # "TFLOP/s", "GB/s", "s", "us"
    values: dict[str, float | None] = field(default_factory=dict)
    notes: str = ""


def ratio_text(row: Row, ours: str, peers: Sequence[str], higher_is_better: bool = True) -> str:
    mine = row.values.get(ours)
    out = []
    for p in peers:
        v = row.values.get(p)
        if mine and v:
            out.append(f"{(mine / v if higher_is_better else v / mine):.2f}x {p}")
    return ", ".join(out)


def table(rows: Sequence[Row], ours: str = "tkc") -> str:
    """A markdown table per group: problem, every contender's number, tkc's ratio to each."""
    lines: list[str] = []
    for group in dict.fromkeys(r.group for r in rows):
        grp = [r for r in rows if r.group == group]
        names = list(dict.fromkeys(k for r in grp for k in r.values))
        unit = grp[0].unit
        better = unit not in ("s", "us")
        lines += [f"### {group} ({unit}, {'higher' if better else 'lower'} is better)", "",
                  "| problem | " + " | ".join(names) + " | tkc vs each |",
                  "|---|" + "---|" * (len(names) + 1)]
        for r in grp:
            cells = [("-" if r.values.get(n) is None else f"{r.values[n]:.4g}") for n in names]
            peers = [n for n in names if n != ours]
            lines.append(f"| {r.problem} | " + " | ".join(cells) + f" | {ratio_text(r, ours, peers, better)} |")
            if r.notes:
                lines.append(f"| ↳ {r.notes} |" + " |" * (len(names) + 1))
        lines.append("")
    return "\n".join(lines)


def group_args(script: str, groups: Sequence[str], more: Callable[[argparse.ArgumentParser], Any] | None = None,
               quick: str = "one shape per kernel, fewer runs") -> tuple[argparse.Namespace, list[str]]:
    """The command line of a benchmark script of row groups (``--quick``, ``--no-record``,
    ``--only``, and what ``more`` adds to the parser) and the groups it names; exits, saying
    why, on an unknown group or without a CUDA GPU."""
    ap = argparse.ArgumentParser()
    if more is not None:
        more(ap)
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    ap.add_argument("--only", default=",".join(groups), help="comma-separated groups: " + ", ".join(groups))
    args = ap.parse_args()
    only = args.only.split(",")
    unknown = [g for g in only if g not in groups]
    if unknown:
        sys.exit(f"unknown group(s) {', '.join(unknown)}; known: {', '.join(groups)}")
    if not torch.cuda.is_available():
        sys.exit(f"benchmarks/{script} needs a CUDA GPU (torch.cuda.is_available() is False)")
    return args, only


def run_command(script: str, quick: bool, only: str, groups: Sequence[str]) -> str:
    """The command line a benchmark script records with its rows: ``--quick`` and ``--only``
    as given (``--only`` when it names fewer than all of ``groups``)."""
    command = f"python benchmarks/{script}" + (" --quick" if quick else "")
    return command + (f" --only {only}" if len(only.split(",")) < len(groups) else "")


def report(script: str, args: argparse.Namespace, groups: Sequence[str], rows: Sequence[Row],
           extra: str = "") -> None:
    """Print a benchmark script's table and, unless ``--no-record``, append it to
    benchmarks/RESULTS.md under the command that made it."""
    print(table(rows))
    if not args.no_record:
        append_results(Path(__file__).parent / "RESULTS.md", run_command(script, args.quick, args.only, groups),
                       rows, extra)


def run_groups(script: str, groups: dict[str, Callable[[list, int], list[Row]]], sizes: list,
               quick_sizes: list) -> None:
    """The whole of a benchmark script of row groups, each ``groups[name](sizes, runs)``: its
    command line (:func:`group_args`), 60 runs a row (30 and ``quick_sizes`` with ``--quick``),
    then :func:`report`."""
    args, only = group_args(script, list(groups))
    runs, chosen = (30, quick_sizes) if args.quick else (60, sizes)
    report(script, args, list(groups), [r for g in only for r in groups[g](chosen, runs)])


def append_results(path: Path, command: str, rows: Sequence[Row], extra: str = "") -> None:
    """Add a dated section (newest first, after the file's introduction) to RESULTS.md."""
    text = path.read_text() if path.exists() else "# GPU results\n"
    head, sep, rest = text.partition("\n## ")
    date = datetime.date.today().isoformat()
    section = (f"## {date} (benchmark harness) — {device_description()}\n\n```\n{command}\n```\n\n"
               + (extra + "\n\n" if extra else "") + table(rows) + "\n")
    path.write_text(head.rstrip("\n") + "\n\n" + section + (sep.lstrip("\n") + rest if sep else ""))


def plot(rows: Sequence[Row], groups: Sequence[str], path: Path, ours: str = "tkc") -> bool:
    """One PNG with a panel per group: each contender's metric over the group's problems.
    False (and no file) when matplotlib is missing or no group has rows."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [(g, [r for r in rows if r.group == g]) for g in groups]
    panels = [(g, grp) for g, grp in panels if grp]
    if not panels:
        return False
    cols = min(2, len(panels))
    n_rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(7 * cols, 3.6 * n_rows), squeeze=False)
    for ax, (group, grp) in zip(axes.flat, panels):
        names = list(dict.fromkeys(k for r in grp for k in r.values))
        width = 0.8 / len(names)
        for i, n in enumerate(names):
            ys = [r.values.get(n) or 0 for r in grp]
            ax.bar([x + i * width for x in range(len(grp))], ys, width, label=n,
                   color="tab:red" if n == ours else None)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(grp))])
        ax.set_xticklabels([r.problem for r in grp], rotation=20, ha="right", fontsize=7)
        ax.set_ylabel(grp[0].unit)
        ax.set_title(group, fontsize=9)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
