"""GEMM time against K at a fixed M x N, tkc beside torch.matmul (cuBLAS): the slope is the
mainloop's cost per unit of K, the intercept what a launch pays once (launch, ring fill, the
tiles' epilogues, the tail wave).  Two kernels with the same slope differ only in that fixed
cost, whatever their ratio at one K.

    python benchmarks/gemm_k_sweep.py            # M = N = 4096, K = 256 ... 8192
    python benchmarks/gemm_k_sweep.py -D cluster=2 --mn 8192

Timing: harness.in_turns (CUDA events, L2 flushed, contenders in turns).  Prints one line a K,
then each contender's least-squares line over the K >= 2048 points (where both are tensor
bound) and its asymptotic TFLOP/s.  The ratio at each K is fair (the contenders take turns);
the line is not when the clock drifts from one K to the next (a power-limited GPU slows as a
sweep goes on, and larger K come later): a negative intercept says the fit read drift.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import in_turns  # noqa: E402

from tkc.compiler import compile_kernel  # noqa: E402
from tkc.runtime.launch import launch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mn", type=int, default=4096, help="M = N")
    ap.add_argument("-D", dest="consts", action="append", default=[], metavar="NAME=VALUE",
                    help="a pin or constant of examples/gemm.tk (int or true/false)")
    ap.add_argument("--runs", type=int, default=60)
    args = ap.parse_args()
    consts = {}
    for item in args.consts:
        name, value = item.split("=", 1)
        consts[name] = {"true": True, "false": False}.get(value.lower(), None)
        if consts[name] is None:
            consts[name] = int(value)
    compiled = compile_kernel(HERE.parent / "examples" / "gemm.tk", consts)
    mn = args.mn
    points: dict[str, list[tuple[int, float]]] = {"tkc": [], "cuBLAS": []}
    for k in (256, 512, 1024, 2048, 4096, 8192):
        a = torch.randn(mn, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, mn, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(mn, mn, device="cuda", dtype=torch.bfloat16)
        launch(compiled, [a, b, c])
        err = (c.float() - a.float() @ b.float()).abs().max().item()
        if err > 2e-2 * (a.float() @ b.float()).abs().max().item():
            raise SystemExit(f"K={k}: tkc's result is wrong (max error {err:.3g})")
        t = in_turns({"tkc": lambda: launch(compiled, [a, b, c]),
                      "cuBLAS": lambda: torch.matmul(a, b, out=c)}, args.runs)
        for name, s in t.items():
            points[name].append((k, s * 1e6))
        print(f"K={k}: " + ", ".join(f"{n} {s * 1e6:.1f} us ({2 * mn * mn * k / s / 1e12:.0f} TFLOP/s)"
                                     for n, s in t.items()), flush=True)
    for name, pts in points.items():
        xs, ys = zip(*[p for p in pts if p[0] >= 2048])
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        fixed = my - slope * mx
        print(f"{name}: {fixed:.1f} us + {slope * 1e3:.2f} ns per unit of K "
              f"(asymptotically {2 * mn * mn / (slope * 1e-6) / 1e12:.0f} TFLOP/s)")


if __name__ == "__main__":
    main()
