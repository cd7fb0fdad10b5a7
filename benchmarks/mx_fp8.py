"""MXFP8 quantization and dequantization (examples/mx_fp8.tk): bf16 [M, K] to e4m3 values and
one E8M0 scale a 32-block, and back, beside the same OCP MX rule in torch eager and under
``torch.compile`` (compiled for each shape), timed in alternation on one GPU (a 256 MB L2 clear before each call,
harness.in_alternation).  Memory-bound: GB/s counts the bytes read and written (2 + 1 + 1/32
a value), with a copy of x (torch's ``clone``) as the bandwidth bar.

    python benchmarks/mx_fp8.py [--quick] [--no-record]

Every contender's outputs are checked against torch eager's first (e4m3 and E8M0 bytes equal;
dequantization exact).  Needs a CUDA GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks"))
sys.path.append(str(ROOT / "tests"))

import torch  # noqa: E402

import tkc  # noqa: E402
from harness import Row, append_results, group_args, in_alternation, run_command, table  # noqa: E402
from mx_reference import dequantize as dequantize_torch  # noqa: E402  (the torch oracle the tests check against)
from mx_reference import quantize as quantize_torch  # noqa: E402

GROUPS = ["mx_fp8"]
QUANTIZE = tkc.load(ROOT / "examples" / "mx_fp8.tk", "mx_quantize")
DEQUANTIZE = tkc.load(ROOT / "examples" / "mx_fp8.tk", "mx_dequantize")


def rows(quick: bool) -> list[Row]:
    out = []
    for M, K in ((8192, 8192),) if quick else ((8192, 8192), (16384, 4096), (4096, 14336), (65536, 1024)):
        torch._dynamo.reset()  # each shape compiled afresh (a second shape would compile for dynamic ones)
        compiled_q, compiled_d = torch.compile(quantize_torch), torch.compile(dequantize_torch)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) * 3
        want_q, want_s = quantize_torch(x)
        q, s = torch.empty_like(want_q), torch.empty_like(want_s)
        xd = torch.empty_like(x)
        quant = {"tkc": lambda: QUANTIZE(x, q, s), "torch eager": lambda: quantize_torch(x),
                 "torch.compile": lambda: compiled_q(x), "copy of x": lambda: x.clone()}
        dequant = {"tkc": lambda: DEQUANTIZE(want_q, want_s, xd),
                   "torch eager": lambda: dequantize_torch(want_q, want_s),
                   "torch.compile": lambda: compiled_d(want_q, want_s), "copy of x": lambda: x.clone()}
        QUANTIZE(x, q, s)
        DEQUANTIZE(want_q, want_s, xd)
        cq, cs = compiled_q(x)
        checks = {"tkc": (q, s, xd), "torch.compile": (cq, cs, compiled_d(want_q, want_s))}
        want_x = dequantize_torch(want_q, want_s)
        for name, (gq, gs, gx) in checks.items():
            assert torch.equal(gq.view(torch.uint8), want_q.view(torch.uint8)), name
            assert torch.equal(gs.view(torch.uint8), want_s.view(torch.uint8)), name
            assert torch.equal(gx, want_x), name
        moved = M * K * (2 + 1 + 1 / 32)
        for what, fns in (("quantize", quant), ("dequantize", dequant)):
            t = in_alternation(fns, 30)
            row = Row(f"MXFP8 {what}", f"{M}x{K}", "GB/s",
                      {n: (2 * M * K * 2 if n == "copy of x" else moved) / s / 1e9 for n, s in t.items()})
            row.notes = "copy of x: x.clone(), 4 bytes a value moved"
            out.append(row)
            print(f"  {row.group} {row.problem}: {row.values}", flush=True)
    return out


def main() -> None:
    args, _ = group_args("mx_fp8.py", GROUPS)
    got = rows(args.quick)
    print(table(got))
    if not args.no_record:
        append_results(ROOT / "benchmarks" / "RESULTS.md", run_command("mx_fp8.py", args.quick, args.only, GROUPS), got)


if __name__ == "__main__":
    main()
