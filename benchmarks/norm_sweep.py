"""Softmax and LayerNorm over long rows: every block width, warp count and L2 prefetch
distance (the pin ``prefetch``) the harness could pick, and optionally programs an SM (the pin
``ctas_per_sm``), side by side with the copy bandwidth.

    python benchmarks/norm_sweep.py                        # rows of 16k and 64k, prefetch 0/1/2/4
    python benchmarks/norm_sweep.py --widths 4096,65536 --prefetch 0,2 --ops layernorm
    python benchmarks/norm_sweep.py --ctas 1,2,3,4          # each also with 2-4 programs an SM
    python benchmarks/norm_sweep.py --split --ctas 1,2,3    # also the rows over a cluster (*_split.tk)

Each kernel is compiled ahead (in parallel, into the disk cache), checked against torch with
its output poisoned, then timed in turns with the copy (``harness.in_turns``: L2 flushed,
median round).  Prints GB/s of one read + one write and the share of copy, best first per row.
Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import in_turns  # noqa: E402
from run import EXAMPLES, close, norm_call, norm_configs, randn  # noqa: E402

from tkc.compiler import compile_kernel  # noqa: E402
from tkc.runtime.launch import launch  # noqa: E402


def _compile(job: tuple[str, dict]) -> None:
    compile_kernel(EXAMPLES / job[0], job[1])


def configs(op: str, N: int, distances: list[int], ctas: list[int], split: bool) -> list[tuple[str, dict]]:
    """(example, constants): the harness's block widths and warps, each also with every nonzero
    prefetch distance where the row takes more than one block (a one-block row has no loop to
    prefetch in), and each of those with every ``ctas_per_sm`` above 1 (registers capped so
    that many programs share an SM; the harness itself tries 3 on its 4-warp configurations).
    With ``split``, also ``op``_split.tk with the row over 2 or 4 programs of a cluster, one
    block each, at 4, 8 and 16 warps and every ``ctas_per_sm``."""
    base = norm_configs(op, N, prefetch=tuple(d for d in distances if d))
    more = [{**c, "ctas_per_sm": n} for c in base if "ctas_per_sm" not in c for n in ctas if n > 1]
    out = [(f"{op}.tk", c) for c in base + [c for c in more if c not in base]]
    if split:
        out += [(f"{op}_split.tk", {"BN": N // cl, "cluster": cl, "warps": w, **({"ctas_per_sm": n} if n > 1 else {})})
                for cl in (2, 4) for w in (4, 8, 16) for n in ctas if 8 <= N // cl // (32 * w) <= 256]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", default="16384,65536")
    ap.add_argument("--ops", default="softmax,layernorm")
    ap.add_argument("--prefetch", default="0,1,2,4", help="distances to try (0: none)")
    ap.add_argument("--ctas", default="1", help="ctas_per_sm values to try (1: the default)")
    ap.add_argument("--split", action="store_true", help="also the rows over a cluster (*_split.tk)")
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    widths = [int(n) for n in args.widths.split(",")]
    ops = args.ops.split(",")
    distances = [int(d) for d in args.prefetch.split(",")]
    ctas = [int(n) for n in args.ctas.split(",")]
    jobs = [job for N in widths for op in ops for job in configs(op, N, distances, ctas, args.split)]
    with concurrent.futures.ProcessPoolExecutor() as pool:
        list(pool.map(_compile, jobs))
    total = 1 << 26
    for N in widths:
        M = total // N
        x, y = randn(M, N), torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        w, b = randn(N), randn(N)
        moved = 2 * x.numel() * x.element_size()
        for op in ops:
            kargs, reference = norm_call(op, x, w, b, y)
            ref = reference()
            contenders = {"copy": lambda: y.copy_(x)}
            for example, c in configs(op, N, distances, ctas, args.split):
                compiled = compile_kernel(EXAMPLES / example, c)
                y.fill_(float("nan"))
                launch(compiled, kargs)
                wrong = close(y, ref, 3e-2)
                name = " ".join([example] * (example != f"{op}.tk") + [f"{k}={v}" for k, v in c.items()])
                if wrong:
                    print(f"{op} {M}x{N} {name}: {wrong}", flush=True)
                    continue
                contenders[name] = lambda compiled=compiled: launch(compiled, kargs)
            times = in_turns(contenders, args.runs)
            gbs = {k: moved / s / 1e9 for k, s in times.items()}
            print(f"\n{op} {M}x{N}: copy {gbs['copy']:.0f} GB/s", flush=True)
            for k, v in sorted(gbs.items(), key=lambda kv: -kv[1]):
                if k != "copy":
                    print(f"  {k:40s} {v:7.0f} GB/s  {v / gbs['copy']:.3f}x copy", flush=True)


if __name__ == "__main__":
    main()
