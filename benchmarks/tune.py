"""Sweep each example's tile sizes and pins with tkc.autotune on benchmark-sized inputs.

    python benchmarks/tune.py                # every example; prints each setting's time, best first
    python benchmarks/tune.py --only softmax,gemm

What the examples' defaults should be comes from here: a default changes when a setting
wins on the benchmark shapes (benchmarks/run.py) without losing elsewhere.
"""

from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path

import torch

import tkc
from run import norm_configs  # the harness's grid, so a sweep and a benchmark run agree

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def grid(**axes: list) -> list[dict]:
    keys = list(axes)
    return [dict(zip(keys, values)) for values in itertools.product(*axes.values())]


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def cases() -> dict[str, list[tuple[str, list, list[dict], float]]]:
    """example -> [(problem, args, configs, work)], work = flops or bytes for the rate column."""
    out: dict[str, list] = {}
    out["gemm"] = []
    for M in (4096, 8192):
        N = K = M
        a, b, c = randn(M, K), randn(K, N), randn(M, N)
        configs = grid(BN=[128, 256], stages=[3, 4], persistent=[True, False], tma_store=[True, False]) \
            if M == 4096 else grid(BN=[256], stages=[3, 4], persistent=[True], tma_store=[True, False])
        out["gemm"].append((f"{M}x{N}x{K}", [a, b, c], configs, 2 * M * N * K))
    out["attn"] = []
    for D, N in ((128, 16384), (128, 2048), (64, 16384)):
        B, H = 16384 // N, 2048 // D
        q, k, v, o = (randn(B, H, N, D) for _ in range(4))
        for causal in (False, True):
            out["attn"].append((f"B{B} H{H} N{N} D{D}{' causal' if causal else ''}", [q, k, v, o, 1 / math.sqrt(D)],
                                grid(D=[D], causal=[causal], BM=[128, 192] if D == 64 else [128], BN=[128],
                                     pingpong=[False], issue_ahead=[True, False]),
                                4 * B * H * N * N * D // (2 if causal else 1)))
    # The norms at the harness's widths and block grid; the rate counts one read and one write of x.
    for op in ("softmax", "layernorm"):
        rows = []
        for m, n in ((16384, 4096), (4096, 16384), (1024, 65536)):
            x, y = randn(m, n), randn(m, n)
            args = [x, y] if op == "softmax" else [x, randn(n), randn(n), y, 1e-5]
            rows.append((f"{m}x{n}", args, [{"BM": 16, "BN": 1024}] + norm_configs(op, n), 4 * m * n))
        out[op] = rows
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="gemm,attn,softmax,layernorm")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    for name, problems in cases().items():
        if name not in args.only.split(","):
            continue
        for problem, kargs, configs, work in problems:
            res = tkc.autotune(EXAMPLES / f"{name}.tk", kargs, configs, runs=args.runs, cache=False, progress=None)
            unit, scale = ("TFLOP/s", 1e12) if name in ("gemm", "attn") else ("GB/s", 1e9)
            print(f"\n{name} {problem}: best {res.consts} at {res.seconds * 1e6:.1f} us")
            for consts, s, why in sorted(res.timings, key=lambda t: t[1] or math.inf):
                rate = f"{work / s / scale:8.1f} {unit}" if s else f"skipped: {why}"
                print(f"  {str(consts):60s} {rate}")


if __name__ == "__main__":
    main()
