"""One benchmark with two compilers on the same GPU, in turns: a git revision of tkc and the
working tree.

    python benchmarks/compare_revisions.py --base HEAD~1 -- python3 benchmarks/attn_train.py --no-record --only long
    python benchmarks/compare_revisions.py --base 0a3825d --column tkc -- python3 benchmarks/run.py --only gemm

A change to the passes or codegen is measured against the code before it: ``--base`` (any
revision ``git archive`` takes) and this tree are each installed into a folder of their own
(``pip install --no-deps --target``; ``--tree-site`` reuses an install of the tree that exists
already; ``--base-tree DIR`` takes the base from a folder instead of git, for a machine that has
the working tree but not its history: ``git archive REV pyproject.toml README.md tkc runtime examples |
tar -x -C DIR`` where the history is), then the command runs ``--rounds`` times each way,
base and tree alternating in the order base, tree, tree, base, ... (so neither side always runs
on a GPU warmed by the other),
with ``PYTHONPATH`` naming that side's install first and a kernel cache of its own.  The
command must import tkc from ``PYTHONPATH``: the benchmarks under ``benchmarks/`` do (they put
``benchmarks/`` on ``sys.path``, not the repository); the examples they compile are this
tree's for both sides.

Every markdown table row the command prints (``| problem | number | ...``) is read, and the
first number after the problem, or the column named ``--column``, is compared: the output is
one table of each row's numbers on each side and the ratio of the tree's mean to the base's.
Each side's full output goes to ``--out`` (default ``compare-out/``), one file a run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What an install of tkc needs from a revision (examples/: the shipped operators' kernels
#: in tkc/ops/kernels are links to its files).
PACKAGE = ["pyproject.toml", "README.md", "tkc", "runtime", "examples"]


def install(source: Path, site: Path) -> None:
    """``pip install`` the package at ``source`` (no dependencies) into ``site``."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-cache-dir",
           "--target", str(site), "--upgrade", str(source)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def export(rev: str, dest: Path) -> None:
    """The package files of revision ``rev`` of this repository, unpacked into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *PACKAGE], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


_NUMBER = re.compile(r"^-?\d+(\.\d+)?(e-?\d+)?$")


def rows(text: str, column: str | None = None) -> dict[str, float]:
    """The number of each markdown table row of ``text``, keyed by its first cell (the
    problem): the first numeric cell after it, or the one under the header cell ``column``
    (a header is the row above a ``|---|`` line).  A problem seen twice keeps the first."""
    out: dict[str, float] = {}
    header: list[str] | None = None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if i + 1 < len(lines) and set(lines[i + 1].replace("|", "").strip()) <= {"-", ":"} \
                and lines[i + 1].startswith("|"):
            header = cells
            continue
        if set("".join(cells)) <= {"-", ":"}:
            continue
        if column is not None and header is not None and column in header:
            at = header.index(column)
            picked = cells[at] if at < len(cells) and _NUMBER.match(cells[at]) else None
        else:
            picked = next((c for c in cells[1:] if _NUMBER.match(c)), None)
        if picked is not None and cells[0] not in out:
            out[cells[0]] = float(picked)
    return out


def merge(base_runs: list[dict[str, float]], tree_runs: list[dict[str, float]]) -> str:
    """A markdown table: each problem's number in every run of each side, and the tree's mean
    over the base's mean (rows missing from a run are left out of its mean)."""
    problems = list(dict.fromkeys(p for run in base_runs + tree_runs for p in run))
    head = ["problem", *[f"base {i + 1}" for i in range(len(base_runs))],
            *[f"tree {i + 1}" for i in range(len(tree_runs))], "tree / base"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in problems:
        b = [run[p] for run in base_runs if p in run]
        t = [run[p] for run in tree_runs if p in run]
        ratio = f"{(sum(t) / len(t)) / (sum(b) / len(b)):.3f}x" if b and t and sum(b) else "-"
        cells = [str(run.get(p, "-")) for run in base_runs] + [str(run.get(p, "-")) for run in tree_runs]
        lines.append("| " + " | ".join([p, *cells, ratio]) + " |")
    return "\n".join(lines)


def run_side(cmd: list[str], site: Path, cache: Path, log: Path, timeout: float | None) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    env["TKC_CACHE_DIR"] = str(cache)
    try:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        text = res.stdout + res.stderr
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        text += f"\n(stopped after {timeout} s)\n"
    log.write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: compare_revisions.py [options] -- COMMAND ... (see --help)")
    split = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="the git revision to compare against (default HEAD)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of the command each side (default 2)")
    ap.add_argument("--column", default=None, help="the header of the column to compare (default: the "
                                                   "first number after the problem)")
    ap.add_argument("--base-tree", type=Path, default=None,
                    help="the base's package files in a folder (instead of --base's git archive)")
    ap.add_argument("--tree-site", type=Path, default=None, help="an install of this tree to use as it is")
    ap.add_argument("--timeout", type=float, default=None, help="seconds a run may take")
    ap.add_argument("--out", type=Path, default=Path("compare-out"), help="folder for each run's output")
    args = ap.parse_args(argv[:split])
    cmd = argv[split + 1:]
    if not cmd or args.rounds < 1:
        raise SystemExit("compare_revisions.py: give a command after -- and at least one round")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tkc-compare-") as tmp:
        work = Path(tmp)
        base = args.base_tree
        if base is None:
            base = work / "base"
            export(args.base, base)
        install(base, work / "site-base")
        tree_site = args.tree_site
        if tree_site is None:
            tree_site = work / "site-tree"
            install(ROOT, tree_site)
        sides = {"base": work / "site-base", "tree": tree_site}
        runs: dict[str, list[dict[str, float]]] = {"base": [], "tree": []}
        order = [s for r in range(args.rounds) for s in (("base", "tree") if r % 2 == 0 else ("tree", "base"))]
        for n, side in enumerate(order):
            log = args.out / f"{n + 1:02d}-{side}.txt"
            text = run_side(cmd, sides[side], work / f"cache-{side}", log, args.timeout)
            found = rows(text, args.column)
            runs[side].append(found)
            print(f"run {n + 1} ({side}): {len(found)} rows, output in {log}", flush=True)
    print(f"\nbase {args.base_tree or args.base} against this tree, in turns ({' '.join(order)}): "
          f"{' '.join(cmd)}\n")
    print(merge(runs["base"], runs["tree"]))


if __name__ == "__main__":
    main()
