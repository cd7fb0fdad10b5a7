"""A GEMM whose output tensor is new at every call, as in every PyTorch program, against cuBLAS.

    python benchmarks/fresh_output.py          # 4096^3 bf16; prints TFLOP/s per contender

Contenders, timed in turns (benchmarks/harness.py ``in_turns``, cold L2 before every call):
``c = torch.empty(...); launch(gemm.tk, [a, b, c])``, the same launch into one ``c`` kept
across calls, and ``torch.matmul(a, b)`` (cuBLAS, which allocates its output too).  The
allocation and the launch are inside the timed region, so a launch that redoes its checks
for a new tensor shows here as lost TFLOP/s.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import device_description, in_turns  # noqa: E402

from tkc.compiler import compile_kernel  # noqa: E402
from tkc.runtime.launch import launch  # noqa: E402


def main(n: int = 4096, runs: int = 60) -> None:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    gemm = compile_kernel(HERE.parent / "examples" / "gemm.tk", {})

    def fresh() -> torch.Tensor:
        out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        launch(gemm, [a, b, out])
        return out

    got = fresh()
    torch.cuda.synchronize()
    err = (got.float() - a.float() @ b.float()).abs().max().item()
    contenders = {"tkc, new output each call": fresh, "tkc, same output": lambda: launch(gemm, [a, b, c]),
                  "torch.matmul(a, b) (cuBLAS)": lambda: torch.matmul(a, b)}
    print(device_description())
    print(f"gemm.tk {n}^3 bf16, max abs error of the new-output result against fp32: {err:.3g}")
    for name, s in in_turns(contenders, runs).items():
        print(f"  {name:<30} {2 * n ** 3 / s / 1e12:7.1f} TFLOP/s  ({s * 1e6:.1f} us)")


if __name__ == "__main__":
    main()
