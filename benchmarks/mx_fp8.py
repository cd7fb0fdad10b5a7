"""MXFP8 quantization and dequantization (examples/mx_fp8.tk): bf16 [M, K] to e4m3 values and
one E8M0 scale a 32-block, and back, beside the same OCP MX rule in torch eager and under
``torch.compile`` (compiled for each shape), timed in alternation on one GPU (a 256 MB L2 clear before each call,
harness.in_alternation).  Memory-bound: GB/s counts the bytes read and written (2 + 1 + 1/32
a value), with a copy of x (torch's ``clone``) as the bandwidth bar.

    python benchmarks/mx_fp8.py [--quick] [--no-record] [--only mx_fp8,fp4]

The ``fp4`` rows: MXFP4 and NVFP4 quantization through ``tkc.ops.fp4_quantize`` (examples/mx_fp4.tk;
NVFP4's tensor-wide scale included) beside tests/mx_reference.py's rule in torch eager and
compiled (2 + 1/2 + 1/32 or 1/16 bytes a value).

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
from mx_reference import quantize_mxfp4, quantize_nvfp4  # noqa: E402

import tkc.ops  # noqa: E402

GROUPS = ["mx_fp8", "fp4"]
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


def _codes(v: torch.Tensor) -> torch.Tensor:
    """E2M1 codes of ``v`` as a torch user writes the rounding: the thresholds it passes (ties
    to even: strictly past 0.25, 1.25, 2.5 and 5, at or past 0.75, 1.75 and 3.5), the sign bit."""
    mag = v.abs()
    code = ((mag > 0.25).to(torch.uint8) + (mag >= 0.75) + (mag > 1.25) + (mag >= 1.75) + (mag > 2.5)
            + (mag >= 3.5) + (mag > 5.0))
    code = code | ((torch.signbit(v) & ~v.isnan()).to(torch.uint8) << 3)
    return torch.where(v.isnan(), 0, code).to(torch.uint8)


def fp4_torch(x: torch.Tensor, fmt: str):
    """MXFP4 / NVFP4 quantization in plain torch (tests/mx_reference.py's rules, its rounding by
    thresholds), NVFP4's tensor-wide scale computed as tkc.ops.fp4_quantize computes it."""
    M, K = x.shape
    block = 32 if fmt == "mxfp4" else 16
    blocks = x.float().reshape(M, K // block, block)
    amax = blocks.abs().amax(-1)
    g = None
    if fmt == "mxfp4":
        scale = torch.exp2(torch.floor(torch.log2(amax)) - 2).to(torch.float8_e8m0fnu)
        q = blocks / scale.float()[..., None]
    else:
        g = (x.abs().amax().float().clamp_min(2.0**-126) / (6.0 * 448.0)).reshape(1)
        scale = (amax * (1.0 / 6.0) / g).to(torch.float8_e4m3fn)
        sg = scale.float() * g
        q = torch.where(sg[..., None] > 0, blocks / sg[..., None], 0.0)
    c = _codes(q.reshape(M, K)).reshape(M, K // 2, 2)
    return (c[..., 0] | (c[..., 1] << 4)).view(torch.float4_e2m1fn_x2), scale, g


def fp4_rows(quick: bool) -> list[Row]:
    out = []
    for fmt in ("mxfp4", "nvfp4"):
        for M, K in ((8192, 8192),) if quick else ((8192, 8192), (16384, 4096), (4096, 14336)):
            torch._dynamo.reset()
            compiled = torch.compile(fp4_torch)
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) * 3
            want = quantize_mxfp4(x) if fmt == "mxfp4" else quantize_nvfp4(x, tkc.ops.fp4_quantize(x, fmt)[2])
            for name, got in (("tkc", tkc.ops.fp4_quantize(x, fmt)), ("torch eager", fp4_torch(x, fmt))):
                for g, w in zip(got[:2], want[:2]):  # bytes equal to the tests' oracle
                    assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), (fmt, name)
            # (torch.compile may divide by a reciprocal: its bytes are counted, not required equal)
            same = (compiled(x, fmt)[0].view(torch.uint8) == want[0].view(torch.uint8)).float().mean().item()
            fns = {"tkc": lambda: tkc.ops.fp4_quantize(x, fmt), "torch eager": lambda: fp4_torch(x, fmt),
                   "torch.compile": lambda: compiled(x, fmt), "copy of x": lambda: x.clone()}
            t = in_alternation(fns, 20)
            moved = M * K * (2 + 0.5 + 1 / (32 if fmt == "mxfp4" else 16))
            row = Row(f"{fmt.upper()} quantize", f"{M}x{K}", "GB/s",
                      {n: (2 * M * K * 2 if n == "copy of x" else moved) / s / 1e9 for n, s in t.items()})
            row.notes = (f"tkc: tkc.ops.fp4_quantize (NVFP4: torch's amax for the global scale, then the kernel); "
                         f"torch.compile's pairs equal the oracle's: {same:.4%}")
            out.append(row)
            print(f"  {row.group} {row.problem}: {row.values}", flush=True)
    return out


def main() -> None:
    args, only = group_args("mx_fp8.py", GROUPS)
    got = (rows(args.quick) if "mx_fp8" in only else []) + (fp4_rows(args.quick) if "fp4" in only else [])
    print(table(got))
    if not args.no_record:
        append_results(ROOT / "benchmarks" / "RESULTS.md", run_command("mx_fp8.py", args.quick, args.only, GROUPS), got)


if __name__ == "__main__":
    main()
