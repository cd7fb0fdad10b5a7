"""MXFP8 GEMM (examples/gemm_mx.tk, ``dot_scaled``): C = (A * SA) @ (B * SB)^T from e4m3
operands with an E8M0 scale a 32-block, to bf16, beside what a user of torch writes for it on
this GPU: dequantize both operands and multiply in bf16, eagerly and under ``torch.compile``
(compiled for each shape); cuBLAS's bf16 GEMM on operands dequantized beforehand is the bar a
dequantizing kernel cannot pass; ``torch._scaled_mm`` with MX scales where the GPU has
block-scaled products (Blackwell; elsewhere its error is noted).  Timed in alternation on
one GPU (a 256 MB L2 clear before each call, harness.in_alternation).

    python benchmarks/gemm_mx.py [--quick] [--no-record] [--only gemm_mx,weights,fp4,fp4_gemm]

The ``weights`` rows: bf16 activations by MXFP8 weights at decode sizes (``tkc.ops.mx_matmul``
with ``a_scale=None``), in TB/s of the bytes a fused kernel must move.  The ``fp4`` rows: the
same by MXFP4 and NVFP4 weights (``tkc.ops.fp4_matmul``, a quarter of bf16's bytes), beside
torch's unpack-dequantize-multiply (eager and compiled), tkc's MXFP8 weights and cuBLAS on the
weight dequantized beforehand.  The ``fp4_gemm`` rows: FP4 by FP4 (``tkc.ops.fp4_matmul`` with
``x_scale``) beside torch's unpack-dequantize of both and a bf16 product.

Every contender's output is checked against the float64 product of the dequantized operands
first.  Needs a CUDA GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks"))
sys.path.append(str(ROOT / "tests"))

import torch  # noqa: E402

import tkc  # noqa: E402
import tkc.ops  # noqa: E402
from harness import Row, append_results, group_args, in_alternation, run_command, table  # noqa: E402
from mx_reference import E2M1, dequantize, quantize  # noqa: E402  (the OCP MX rule the tests check against)

GROUPS = ["gemm_mx", "weights", "fp4", "fp4_gemm"]
GEMM = tkc.load(ROOT / "examples" / "gemm_mx.tk", "gemm_mx")
WEIGHTS = tkc.load(ROOT / "examples" / "gemm_mx.tk", "gemm_mx_weights")
#: (M, N, K): square GEMMs and a weight of 8192 x 8192 applied to 256 tokens.
SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (256, 8192, 8192))
#: Weights only (bf16 activations by MXFP8 weights): decode sizes, tokens by a weight [N, K]
#: (8192 x 8192; Llama-3-8B's MLP down projection, 4096 x 14336).
WEIGHT_SHAPES = ((16, 8192, 8192), (64, 8192, 8192), (128, 8192, 8192), (256, 8192, 8192), (64, 4096, 14336))


def dequantize_and_multiply(a, sa, b, sb):
    return dequantize(a, sa) @ dequantize(b, sb).T


def rows(quick: bool) -> list[Row]:
    out = []
    for M, N, K in SHAPES[:1] if quick else SHAPES:
        torch._dynamo.reset()  # each shape compiled afresh
        compiled = torch.compile(dequantize_and_multiply)
        a, sa = quantize(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
        b, sb = quantize(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05)
        ad, bd = dequantize(a, sa), dequantize(b, sb)
        want = ad.double() @ bd.double().T
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        fns = {"tkc": lambda: tkc.ops.mx_matmul(a, sa, b, sb), "tkc gemm_mx": lambda: GEMM(a, sa, b, sb, c),
               "torch eager": lambda: dequantize_and_multiply(a, sa, b, sb),
               "torch.compile": lambda: compiled(a, sa, b, sb),
               "cuBLAS bf16, dequantized before": lambda: ad @ bd.T}
        notes = ("tkc: tkc.ops.mx_matmul (on sm_90a both operands dequantized by tkc, then gemm_nt's bf16 product); "
                 "tkc gemm_mx: dequantizing in the product's loop; cuBLAS bf16, dequantized before: the bf16 GEMM "
                 "alone, its operands dequantized outside the timing")
        try:
            torch._scaled_mm(a, b.T, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
            fns["torch._scaled_mm"] = lambda: torch._scaled_mm(a, b.T, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        except (RuntimeError, ValueError, TypeError) as e:
            notes += f"; torch._scaled_mm with MX scales not run: {str(e).splitlines()[0][:120]}"
        GEMM(a, sa, b, sb, c)
        for name, fn in fns.items():
            got = c if name == "tkc gemm_mx" else fn()
            err = ((got.double() - want).abs().max() / want.abs().max()).item()
            assert err < 2**-6, (name, err)
        t = in_alternation(fns, 30)
        row = Row("MXFP8 GEMM", f"{M}x{N}x{K}", "TFLOP/s", {n: 2 * M * N * K / s / 1e12 for n, s in t.items()})
        row.notes = notes
        out.append(row)
        print(f"  {row.problem}: {row.values}", flush=True)
    return out


def linear(x, w, sw):
    return x @ dequantize(w, sw).T


def weight_rows(quick: bool) -> list[Row]:
    """bf16 activations by MXFP8 weights: ``tkc.ops.mx_matmul(x, None, w, sw)`` as a user calls
    it (K split over programs up to ``SPLITK_ROWS`` tokens), the one-program-a-tile kernel, and
    torch's dequantize-then-multiply; TB/s counts the bytes read and written once."""
    out = []
    for M, N, K in WEIGHT_SHAPES[1:2] if quick else WEIGHT_SHAPES:
        torch._dynamo.reset()
        compiled = torch.compile(linear)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w, sw = quantize(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05)
        wd = dequantize(w, sw)
        want = x.double() @ wd.double().T
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        fns = {"tkc": lambda: tkc.ops.mx_matmul(x, None, w, sw),
               "tkc one program a tile": lambda: WEIGHTS(x, w, sw, c),
               "torch eager": lambda: linear(x, w, sw), "torch.compile": lambda: compiled(x, w, sw),
               "cuBLAS bf16, dequantized before": lambda: x @ wd.T}
        WEIGHTS(x, w, sw, c)
        for name, fn in fns.items():
            got = c if name == "tkc one program a tile" else fn()
            err = ((got.double() - want).abs().max() / want.abs().max()).item()
            assert err < 2**-6, (name, err)
        nbytes = N * K + N * K // 32 + 2 * M * K + 2 * M * N
        # Each contender as one CUDA graph (what a decoding loop replays: the GPU's time, whatever
        # the host's), and called eagerly (the host's time per call counts where it exceeds the
        # GPU's: torch.compile's guards, tkc.ops' three launches).
        for group, timed in (("MXFP8 weights, CUDA graphs", {n: _graphed(f) for n, f in fns.items()}),
                             ("MXFP8 weights, eager calls", fns)):
            t = in_alternation(timed, 30)
            row = Row(group, f"{M}x{N}x{K}", "TB/s", {n: nbytes / s / 1e12 for n, s in t.items()})
            row.notes = ("tkc: tkc.ops.mx_matmul, gemm_mx_weights_splitk up to tkc.ops.mx.SPLITK_ROWS tokens (f32 "
                         "zeroed, the kernel, bf16), gemm_mx_weights past it; cuBLAS bf16: the weight dequantized "
                         "outside the timing (it reads twice the bytes counted)")
            out.append(row)
            print(f"  {group} {row.problem}: {row.values}", flush=True)
    return out


def fp4_linear(x, w, s, g, lut):
    """What a torch user writes for an FP4 weight: unpack both nibbles through a table of the
    sixteen values, times each block's scale (and NVFP4's g), then a bf16 product."""
    b = w.view(torch.uint8)
    v = torch.stack([lut[(b & 15).int()], lut[(b >> 4).int()]], -1).reshape(w.shape[0], -1)
    scale = s.float().repeat_interleave(v.shape[1] // s.shape[1], 1)
    if g is not None:
        scale = scale * g
    return x @ (v * scale).to(torch.bfloat16).T


def fp4_rows(quick: bool) -> list[Row]:
    """bf16 activations by MXFP4 and NVFP4 weights at decode sizes: ``tkc.ops.fp4_matmul`` as a
    user calls it, torch's unpack-dequantize-multiply eagerly and compiled, tkc's MXFP8 weights
    (the same weight in twice the bytes) and cuBLAS on the weight dequantized beforehand; TB/s of
    the FP4 bytes a fused kernel moves (weight, scales, activations, output once)."""
    out = []
    lut = E2M1.float().cuda()
    for fmt in ("mxfp4", "nvfp4"):
        for M, N, K in WEIGHT_SHAPES[1:2] if quick else WEIGHT_SHAPES:
            torch._dynamo.reset()
            compiled = torch.compile(fp4_linear)
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            wb = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
            w, sw, g = tkc.ops.fp4_quantize(wb, fmt)
            w8, s8 = quantize(wb)
            wd = tkc.ops.fp4_dequantize(w, sw, g)
            want = x.double() @ wd.double().T
            fns = {"tkc": lambda: tkc.ops.fp4_matmul(x, w, sw, g),
                   "torch eager": lambda: fp4_linear(x, w, sw, g, lut),
                   "torch.compile": lambda: compiled(x, w, sw, g, lut),
                   "tkc MXFP8 weights": lambda: tkc.ops.mx_matmul(x, None, w8, s8),
                   "cuBLAS bf16, dequantized before": lambda: x @ wd.T}
            for name, fn in fns.items():
                if name != "tkc MXFP8 weights":
                    err = ((fn().double() - want).abs().max() / want.abs().max()).item()
                    assert err < 2**-6, (fmt, name, err)
            nbytes = N * K // 2 + N * K // (32 if fmt == "mxfp4" else 16) + 2 * M * K + 2 * M * N
            for group, timed in ((f"{fmt.upper()} weights, CUDA graphs", {n: _graphed(f) for n, f in fns.items()}),
                                 (f"{fmt.upper()} weights, eager calls", fns)):
                t = in_alternation(timed, 30)
                row = Row(group, f"{M}x{N}x{K}", "TB/s", {n: nbytes / s / 1e12 for n, s in t.items()})
                row.notes = ("tkc: tkc.ops.fp4_matmul (gemm_" + fmt + "_weights_splitk up to tkc.ops.mx.SPLITK_ROWS "
                             "tokens: f32 zeroed, the kernel, bf16; past it the weight dequantized, then "
                             "matmul_nt); MXFP8 weights and cuBLAS bf16 read 2x and 4x the weight bytes counted")
                out.append(row)
                print(f"  {group} {row.problem}: {row.values}", flush=True)
    return out


def fp4_both(x, sx, gx, w, sw, gw, lut):
    """Both operands unpacked and dequantized as fp4_linear does, then a bf16 product."""
    b = x.view(torch.uint8)
    v = torch.stack([lut[(b & 15).int()], lut[(b >> 4).int()]], -1).reshape(x.shape[0], -1)
    scale = sx.float().repeat_interleave(v.shape[1] // sx.shape[1], 1)
    xd = (v * (scale if gx is None else scale * gx)).to(torch.bfloat16)
    return fp4_linear(xd, w, sw, gw, lut)


def fp4_gemm_rows(quick: bool) -> list[Row]:
    """FP4 by FP4 at GEMM sizes: ``tkc.ops.fp4_matmul(x, w, sw, gw, sx, gx)`` (on sm_90a both
    operands dequantized by tkc, then tkc's bf16 product), torch's unpack-dequantize of both
    and a bf16 product, eagerly and compiled, and cuBLAS on operands dequantized beforehand."""
    out = []
    lut = E2M1.float().cuda()
    for fmt in ("mxfp4", "nvfp4"):
        for M, N, K in SHAPES[:1] if quick else SHAPES:
            torch._dynamo.reset()
            compiled = torch.compile(fp4_both)
            x, sx, gx = tkc.ops.fp4_quantize(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), fmt)
            w, sw, gw = tkc.ops.fp4_quantize(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05, fmt)
            xd, wd = tkc.ops.fp4_dequantize(x, sx, gx), tkc.ops.fp4_dequantize(w, sw, gw)
            want = xd.double() @ wd.double().T
            fns = {"tkc": lambda: tkc.ops.fp4_matmul(x, w, sw, gw, sx, gx),
                   "torch eager": lambda: fp4_both(x, sx, gx, w, sw, gw, lut),
                   "torch.compile": lambda: compiled(x, sx, gx, w, sw, gw, lut),
                   "cuBLAS bf16, dequantized before": lambda: xd @ wd.T}
            for name, fn in fns.items():
                err = ((fn().double() - want).abs().max() / want.abs().max()).item()
                assert err < 2**-6, (fmt, name, err)
            t = in_alternation(fns, 20)
            row = Row(f"{fmt.upper()} x {fmt.upper()}", f"{M}x{N}x{K}", "TFLOP/s",
                      {n: 2 * M * N * K / s / 1e12 for n, s in t.items()})
            row.notes = "tkc: tkc.ops.fp4_matmul with x_scale (sm_90a: both dequantized by tkc, then matmul_nt)"
            out.append(row)
            print(f"  {row.group} {row.problem}: {row.values}", flush=True)
    return out


def _graphed(fn):
    """``fn`` captured in a CUDA graph (after warm-up calls on a side stream): its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def main() -> None:
    args, only = group_args("gemm_mx.py", GROUPS)
    got = (rows(args.quick) if "gemm_mx" in only else []) + (weight_rows(args.quick) if "weights" in only else []) \
        + (fp4_rows(args.quick) if "fp4" in only else []) + (fp4_gemm_rows(args.quick) if "fp4_gemm" in only else [])
    print(table(got))
    if not args.no_record:
        command = run_command("gemm_mx.py", args.quick, args.only, GROUPS)
        append_results(ROOT / "benchmarks" / "RESULTS.md", command, got)


if __name__ == "__main__":
    main()
