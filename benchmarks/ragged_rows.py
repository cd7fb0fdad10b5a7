"""Row kernels on rows shorter than their block (loads and stores by runs, each run predicated), beside
the same kernel on rows of the block's width, torch, and a copy.

    python benchmarks/ragged_rows.py                  # LayerNorm and softmax, four widths each
    python benchmarks/ragged_rows.py --quick          # 4000 columns in blocks of 4096 only

Each row is 2^26 elements (M = 2^26 // N rows); the kernel runs at `BN` = N rounded up to 512
(4000 -> 4096, 5000 -> 5120), so every row's box reaches past the row by whole runs, as
``tkc.ops.layer_norm``'s blocks of 4096 do for any width.  Outputs are checked against torch
before timing; contenders are timed in turns (``harness.in_turns``: L2 cleared before each call,
median round).  GB/s count x read and y written.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from harness import Row, in_turns, run_groups  # noqa: E402
from tk_kernels import checked  # noqa: E402

from tkc.compiler import compile_kernel  # noqa: E402
from tkc.runtime.launch import launch  # noqa: E402

EPS = 1e-5
WIDTHS = [4000, 5000, 3000, 4096]


def block(N: int) -> int:
    return -(-N // 512) * 512


def rows(widths: list[int], runs: int, op: str) -> list[Row]:
    out = []
    for N in widths:
        M = (1 << 26) // N
        g = torch.Generator(device="cuda").manual_seed(N)
        x = torch.randn(M, N, device="cuda", generator=g).to(torch.bfloat16)
        w, b = (torch.randn(N, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
        y, dst = torch.empty_like(x), torch.empty_like(x)
        row = Row("ragged_rows", f"{op}, {M}x{N} bf16, BN={block(N)}", "GB/s")
        if op == "LayerNorm":
            k = compile_kernel(ROOT / "examples" / "layernorm.tk", {"BN": block(N)})
            args = [x, w, b, y, EPS]
            peer = lambda: torch.nn.functional.layer_norm(x, (N,), w, b, EPS)  # noqa: E731
        else:
            k = compile_kernel(ROOT / "examples" / "softmax.tk", {"BN": block(N)})
            args = [x, y]
            peer = lambda: torch.softmax(x, -1)  # noqa: E731
        launch(k, args)
        if not checked(row, y, peer(), 2e-2):
            out.append(row)
            continue
        t = in_turns({"tkc": lambda: launch(k, args), f"torch {op}": peer, "copy": lambda: dst.copy_(x)}, runs)
        row.values = {n: 2 * M * N * 2 / s / 1e9 for n, s in t.items()}
        out.append(row)
        print(f"  {row.problem}: {row.values}", flush=True)
    return out


GROUPS = {"layernorm": lambda s, r: rows(s, r, "LayerNorm"), "softmax": lambda s, r: rows(s, r, "softmax")}


def main() -> None:
    run_groups("ragged_rows.py", GROUPS, WIDTHS, WIDTHS[:1])


if __name__ == "__main__":
    main()
