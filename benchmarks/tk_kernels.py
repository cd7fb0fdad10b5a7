"""ThunderKittens' kernel set (GEMM epilogues, RoPE, residual + LayerNorm/RMSNorm, the scaled FP8
GEMM) beside what a PyTorch user runs, each row timed in turns with its peers on one GPU (cold L2,
harness.py).

    python benchmarks/tk_kernels.py [--quick] [--no-record] [--only gemm_epilogue,rope,norm,fp8]

Appends the table to benchmarks/RESULTS.md and plots it in benchmarks/plot_tk_kernels.png
(unless --no-record).

Rows:

* ``gemm_epilogue``: examples/gemm_bias_gelu.tk (tanh and erf GELU), gemm_swiglu.tk (two
  products, one kernel), gemm_residual.tk and gemm_rope.tk (a Q/K projection with RoPE),
  beside gemm.tk as it ships (the plain GEMM, twice for SwiGLU: the epilogue should cost
  under 3% of it), torch.matmul followed by the unfused ops, the same under
  ``torch.compile``, and liger-kernel's fused SwiGLU gate after two matmuls where
  liger-kernel imports.  TFLOP/s of the products.
* ``rope``: examples/rope.tk (rotate-half and interleaved) on x [B, N, H, D] with cos/sin
  tables [N, D/2], beside torch eager, ``torch.compile``, liger-kernel's RoPE (rotate-half, q
  and k [B, H, N, D]: twice the bytes) and a copy of x.  GB/s of x read and y written (the
  tables, read from L2 for every head, not counted).
* ``norm``: examples/layernorm_residual.tk (h = x + residual, or dropout(x) + residual at p=0.1;
  y = norm(h)), LayerNorm and RMSNorm, forward and backward (layernorm_residual_bwd.tk; the
  peers' backward is autograd's of the same forward), beside torch eager, ``torch.compile``,
  liger-kernel (torch's add, and dropout, then its norm) and a copy.  GB/s of the tensors read
  and written (the copy: its own two).
* ``fp8``: examples/gemm_fp8_scaled.tk (e4m3 A [M, K] and B [N, K] to bf16, per-tensor and
  rowwise f32 scales) beside ``torch._scaled_mm`` in the same mode (cuBLAS; B is its
  column-major [K, N]), with and without ``use_fast_accum`` (tkc accumulates in the wgmma
  accumulator throughout, as fast accumulation does; without it cuBLAS promotes partial sums
  to f32 now and then), and beside gemm.tk in bf16 on the same shape.  TFLOP/s.

liger-kernel is optional: its column is left out when it does not import.  Needs a CUDA GPU.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.append(str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from harness import Row, append_results, group_args, in_turns, plot, run_command, table  # noqa: E402

sys.path.append(str(ROOT / "tests" / "examples"))
import tk_reference as ref  # noqa: E402  (the torch references the tests check against)

from tkc.compiler import compile_kernel  # noqa: E402

EXAMPLES = ROOT / "examples"


def liger(module: str, name: str) -> Callable | None:
    """``liger_kernel.ops.<module>.<name>`` where liger-kernel imports, else None."""
    try:
        mod = __import__(f"liger_kernel.ops.{module}", fromlist=[name])
        return getattr(mod, name)
    except Exception:  # not installed, or its Triton does not load here
        return None


def launcher(file: str, consts: dict, kernel: str | None = None) -> Callable:
    from tkc.runtime.launch import launch

    k = compile_kernel(EXAMPLES / file, consts, kernel=kernel)
    return lambda *args: launch(k, list(args))


def checked(row: Row, got: torch.Tensor, want: torch.Tensor, tol: float) -> bool:
    """Whether ``got`` is ``want`` within ``tol`` of its scale; if not, the row says so."""
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item() or 1.0
    if not err <= tol * scale:
        row.notes = f"WRONG: max error {err:.3g} (scale {scale:.3g}); not timed"
        return False
    return True


# ------------------------------------------------------------------------------ GEMM epilogues
def gemm_epilogue_rows(shapes: list[tuple[int, int, int]], runs: int) -> list[Row]:
    def gelu_eager(approximate):
        return lambda a, b, bias: F.gelu(torch.addmm(bias, a, b), approximate=approximate)

    def swiglu_eager(a, wg, wu):
        return F.silu(a @ wg) * (a @ wu)

    def residual_eager(a, b, r):
        return a @ b + r

    def rope_eager(interleaved):
        def run(a, b, cos, sin):
            y = a @ b
            return ref.rope(y.view(1, y.shape[0], -1, 128), cos, sin, interleaved).view(y.shape)
        return run

    liger_swiglu = liger("swiglu", "LigerSiLUMulFunction")
    rows = []
    for M, N, K in shapes:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) * K ** -0.5
        b2 = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) * K ** -0.5
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        r = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        cos, sin = ref.rope_tables(M, 128, "cuda")
        # (name, example, consts, tkc args, torch reference, extra arguments of the reference, products)
        cases = [("bias + GELU (tanh)", "gemm_bias_gelu.tk", {}, [a, b, bias, c], gelu_eager("tanh"), (a, b, bias), 1),
                 ("bias + GELU (erf)", "gemm_bias_gelu.tk", {"approx_tanh": False}, [a, b, bias, c],
                  gelu_eager("none"), (a, b, bias), 1),
                 ("SwiGLU", "gemm_swiglu.tk", {}, [a, b, b2, c], swiglu_eager, (a, b, b2), 2),
                 ("residual", "gemm_residual.tk", {}, [a, b, r, c], residual_eager, (a, b, r), 1),
                 ("RoPE (rotate-half, heads of 128)", "gemm_rope.tk", {}, [a, b, cos, sin, c], rope_eager(False),
                  (a, b, cos, sin), 1),
                 ("RoPE (interleaved, heads of 128)", "gemm_rope.tk", {"interleaved": True}, [a, b, cos, sin, c],
                  rope_eager(True), (a, b, cos, sin), 1)]
        for name, file, consts, args, eager, ref_args, products in cases:
            row = Row("gemm_epilogue", f"{name}, {M}x{N}x{K} bf16", "TFLOP/s")
            ours = launcher(file, consts)
            c.fill_(float("nan"))
            ours(*args)
            if not checked(row, c, eager(*[x.float() for x in ref_args]), 2e-2):
                rows.append(row)
                continue
            # The plain GEMM as gemm.tk ships (its 128 x 256 tile; for SwiGLU's two products, two).
            plain = launcher("gemm.tk", {})
            compiled = torch.compile(eager)
            compiled(*ref_args)
            contenders = {"tkc": lambda: ours(*args),
                          "tkc gemm.tk (no epilogue)": lambda: [plain(a, b, c) for _ in range(products)],
                          "torch eager": lambda: eager(*ref_args), "torch.compile": lambda: compiled(*ref_args)}
            if name == "SwiGLU" and liger_swiglu is not None:
                contenders["liger-kernel (matmuls + fused gate)"] = lambda: liger_swiglu.apply(a @ b, a @ b2)
            t = in_turns(contenders, runs)
            flops = 2 * M * N * K * products
            row.values = {n: flops / s / 1e12 for n, s in t.items()}
            row.notes = (f"epilogue costs {t['tkc'] / t['tkc gemm.tk (no epilogue)'] - 1:+.1%} of the plain GEMM"
                         + (f"; tkc {', '.join(f'{k}={v}' for k, v in consts.items())}" if consts else ""))
            rows.append(row)
            print(f"  {row.problem}: {row.values}", flush=True)
    return rows


# ------------------------------------------------------------------------------------- RoPE
def rope_rows(shapes: list[tuple[int, int, int, int]], runs: int) -> list[Row]:
    liger_rope = liger("rope", "LigerRopeFunction")
    rows = []
    for B, N, H, D in shapes:
        x = torch.randn(B, N, H, D, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        copy_out = torch.empty_like(x)
        cos, sin = ref.rope_tables(N, D, "cuda")
        for interleaved in (False, True):
            row = Row("rope", f"{'interleaved' if interleaved else 'rotate-half'}, [{B}, {N}, {H}, {D}] bf16", "GB/s")
            ours = launcher("rope.tk", {"D": D, "interleaved": interleaved})
            ours(x, cos, sin, y)
            if not checked(row, y, ref.rope(x.float(), cos.float(), sin.float(), interleaved), 1e-2):
                rows.append(row)
                continue

            def eager(x=x, interleaved=interleaved):
                return ref.rope(x, cos, sin, interleaved)

            compiled = torch.compile(eager)
            compiled()
            contenders = {"tkc": lambda: ours(x, cos, sin, y), "torch eager": eager, "torch.compile": compiled,
                          "copy": lambda: copy_out.copy_(x)}
            moved = {n: 2 * x.numel() * 2 for n in contenders}
            if liger_rope is not None and not interleaved:
                # liger's layout: q and k [B, H, N, D], tables [1, N, D] (the halves repeated)
                q = x.transpose(1, 2).contiguous()
                full_cos, full_sin = (torch.cat([t, t], -1)[None] for t in (cos, sin))
                contenders["liger-kernel (q and k)"] = lambda q=q: liger_rope.apply(q, q, full_cos, full_sin)
                moved["liger-kernel (q and k)"] = 2 * moved["tkc"]
            t = in_turns(contenders, runs)
            row.values = {n: moved[n] / s / 1e9 for n, s in t.items()}
            row.notes = f"tkc at {t['copy'] / t['tkc']:.0%} of the copy's time; bytes: x read, y written"
            rows.append(row)
            print(f"  {row.problem}: {row.values}", flush=True)
    return rows


# ------------------------------------------------------------------ residual + LayerNorm / RMSNorm
def liger_norm(rms: bool, N: int, eps: float, w: torch.Tensor, bias: torch.Tensor) -> torch.nn.Module | None:
    """liger-kernel's LigerRMSNorm / LigerLayerNorm module with weights ``w`` (and ``bias``),
    where liger-kernel imports.  RMSNorm's backward writes dx over the incoming gradient by
    default (``in_place``): the harness hands every contender the same dy, so it runs out of
    place here (left in place, it overwrote dy at every timed call until the next variants'
    references read NaN)."""
    try:
        if rms:
            from liger_kernel.transformers.rms_norm import LigerRMSNorm
            m = LigerRMSNorm(N, eps=eps, in_place=False)
        else:
            from liger_kernel.transformers.layer_norm import LigerLayerNorm
            m = LigerLayerNorm(N, eps=eps)
            m.bias.data.copy_(bias)
    except Exception:  # not installed, or its Triton does not load here
        return None
    m.weight.data.copy_(w)
    return m.cuda().to(torch.bfloat16)


def norm_rows(shapes: list[tuple[int, int]], runs: int) -> list[Row]:
    import torch._functorch.config as functorch_config

    # The peers' backward graphs run again at every timed call (retain_graph=True), which a
    # compiled backward that donates its saved buffers refuses; it is compiled at its first call.
    functorch_config.donated_buffer = False
    from tkc import autotune

    from harness import L2_FLUSH_BYTES

    eps, seed, R = 1e-5, 1234, 64  # R: rows checked against the dropout reference (Philox in numpy)
    rows = []
    for M, N in shapes:
        BN = max(256, 1 << (N - 1).bit_length())
        x, res, dy, dh = (torch.randn(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        w, bias = (torch.randn(N, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        h, y, dx, dres = (torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        mu, rstd = torch.empty(M, device="cuda"), torch.empty(M, device="cuda")
        dw, db = torch.zeros(N, device="cuda"), torch.zeros(N, device="cuda")
        copy_out = torch.empty_like(x)
        for rms, p in ((False, 0.0), (True, 0.0), (False, 0.1), (True, 0.1)):
            dropout = p > 0
            name = ("dropout + " if dropout else "") + "residual + " + ("RMSNorm" if rms else "LayerNorm")
            xg, resg = x.clone().requires_grad_(), res.clone().requires_grad_()
            wg, bg = w.clone().requires_grad_(), bias.clone().requires_grad_()

            def forward(x, res, w=w, bias=bias, rms=rms, p=p):
                hh = (F.dropout(x, p) if p > 0 else x) + res
                return hh, (F.rms_norm(hh, (N,), w, eps) if rms else F.layer_norm(hh, (N,), w, bias, eps))

            compiled = torch.compile(forward)
            lg = liger_norm(rms, N, eps, w, bias)
            fwd_args = [x, res, w, bias, h, y, mu, rstd, eps, seed, p]
            warps = (4, 8, 16)
            best = autotune(EXAMPLES / "layernorm_residual.tk", fwd_args,
                            [{"BN": BN, "rms": rms, "dropout": dropout, "warps": n} for n in warps],
                            flush_bytes=L2_FLUSH_BYTES)
            fwd = launcher("layernorm_residual.tk", best.consts)
            bwd_args = [dy, dh, h, w, mu, rstd, dx, dres, dw, db, seed, p]
            best_bwd = autotune(EXAMPLES / "layernorm_residual_bwd.tk", bwd_args,
                                [{"BN": BN, "rms": rms, "dropout": dropout, "ROWS": r, "warps": n}
                                 for r in (16, 32) for n in (8, 16)], flush_bytes=L2_FLUSH_BYTES)
            bwd = launcher("layernorm_residual_bwd.tk", best_bwd.consts)

            def ours_bwd(bwd=bwd):
                dw.zero_()
                db.zero_()
                bwd(*bwd_args)

            keep = ref.dropout_mask(seed, R, N, p) if dropout else None
            for direction in ("forward", "backward"):
                row = Row("norm", f"{name} {direction}, {M}x{N} bf16" + (f", p={p}" if dropout else ""), "GB/s")
                if direction == "forward":
                    # x, res read; h, y written
                    moved = 4 * M * N * 2
                    fwd(*fwd_args)
                    want_h, want_y, _, _ = ref.layernorm_residual(x[:R].float(), res[:R].float(), w, bias, eps, rms,
                                                                  keep, p)
                    ok = checked(row, h[:R], want_h, 1e-2) and checked(row, y[:R], want_y, 2e-2)
                    contenders = {"tkc": lambda fwd=fwd: fwd(*fwd_args),
                                  "torch eager": lambda forward=forward: forward(x, res),
                                  "torch.compile": lambda compiled=compiled: compiled(x, res)}
                    if lg is not None:
                        contenders["liger-kernel (torch add + norm)"] = lambda lg=lg, p=p: lg(
                            (F.dropout(x, p) if p > 0 else x) + res)
                else:
                    # dy, dh, h read; dx written (and dres, with dropout)
                    moved = (5 if dropout else 4) * M * N * 2
                    ours_bwd()
                    want_dres, want_dw, want_db = ref.layernorm_residual_bwd(dy, dh, h, w, bias, eps, rms)
                    want_dx = want_dres if not dropout else ref.dropped(want_dres[:R].to(torch.bfloat16), keep, p)
                    ok = (checked(row, dx[:R], want_dx[:R], 2e-2) and checked(row, dw, want_dw, 1e-2)
                          and checked(row, db, want_db, 1e-2)
                          and (not dropout or checked(row, dres, want_dres, 2e-2)))

                    def graph(forward, params):
                        # autograd's backward of ``forward``, its graph built once outside the timing
                        # and run again at every call (retain_graph: a compiled graph must then not
                        # donate its saved buffers, which norm_rows turns off)
                        hh, yy = forward(xg, resg)
                        return lambda: torch.autograd.grad([yy, hh], [xg, resg, *params], [dy, dh],
                                                           retain_graph=True)

                    params = [wg] if rms else [wg, bg]
                    contenders = {"tkc": ours_bwd,
                                  "torch eager": graph(lambda x, res, f=forward: f(x, res, wg, bg), params),
                                  "torch.compile": graph(torch.compile(lambda x, res, f=forward: f(x, res, wg, bg)),
                                                         params)}
                    if lg is not None:
                        lg.requires_grad_()
                        contenders["liger-kernel (torch add + norm)"] = graph(
                            lambda x, res, lg=lg, p=p: (hh := (F.dropout(x, p) if p > 0 else x) + res, lg(hh)),
                            list(lg.parameters()))
                if not ok:
                    rows.append(row)
                    continue
                contenders["copy"] = lambda: copy_out.copy_(x)
                t = in_turns(contenders, runs)
                row.values = {n: (2 * M * N * 2 if n == "copy" else moved) / s / 1e9 for n, s in t.items()}
                picked = (best if direction == "forward" else best_bwd).consts
                row.notes = f"tkc {', '.join(f'{k}={v}' for k, v in picked.items())} (tkc.autotune)"
                rows.append(row)
                print(f"  {row.problem}: {row.values}", flush=True)
    return rows


# ------------------------------------------------------------------------------- FP8 GEMM
def fp8_rows(shapes: list[tuple[int, int, int]], runs: int) -> list[Row]:
    rows = []
    for M, N, K in shapes:
        a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)  # K-major: _scaled_mm's b.t()
        a16, b16 = a.to(torch.bfloat16), b.t().contiguous().to(torch.bfloat16)  # gemm.tk's B is [K, N]
        c, c16 = (torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        plain = launcher("gemm.tk", {})
        for rowwise in (False, True):
            row = Row("fp8", f"{'rowwise' if rowwise else 'per-tensor'} scales, {M}x{N}x{K} e4m3 -> bf16", "TFLOP/s")
            # torch._scaled_mm's scales: f32 tensors, [M, 1] and [1, N] rowwise; tkc's the same as vectors
            sa, sb = ((torch.rand(n, 1, device="cuda") + 0.5) * K ** -0.25 for n in (M, N))
            sa, sb = (sa, sb.t()) if rowwise else (sa[:1, 0].reshape(()), sb[:1, 0].reshape(()))
            ours = launcher("gemm_fp8_scaled.tk", {"rowwise": rowwise})
            args = [a, b, sa.reshape(-1), sb.reshape(-1), c]

            def scaled_mm(fast: bool, sa=sa, sb=sb) -> torch.Tensor:
                return torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast)

            c.fill_(float("nan"))
            ours(*args)
            if not checked(row, c, scaled_mm(False), 2e-2):
                rows.append(row)
                continue
            t = in_turns({"tkc": lambda args=args, ours=ours: ours(*args),
                          "torch._scaled_mm": lambda f=scaled_mm: f(False),
                          "torch._scaled_mm (use_fast_accum)": lambda f=scaled_mm: f(True),
                          "tkc gemm.tk (bf16)": lambda: plain(a16, b16, c16)}, runs)
            row.values = {n: 2 * M * N * K / s / 1e12 for n, s in t.items()}
            row.notes = (f"tkc at {t['torch._scaled_mm'] / t['tkc']:.2f}x torch._scaled_mm, "
                         f"{t['torch._scaled_mm (use_fast_accum)'] / t['tkc']:.2f}x with use_fast_accum")
            rows.append(row)
            print(f"  {row.problem}: {row.values}", flush=True)
    return rows


GROUPS = {"gemm_epilogue": gemm_epilogue_rows, "rope": rope_rows, "norm": norm_rows, "fp8": fp8_rows}


def main() -> None:
    args, only = group_args("tk_kernels.py", list(GROUPS))
    runs = 30 if args.quick else 60
    shapes = {"gemm_epilogue": [(4096, 4096, 4096)] if args.quick else [(4096, 4096, 4096), (8192, 8192, 8192)],
              "rope": [(4, 4096, 32, 128)] if args.quick else [(4, 4096, 32, 128), (1, 16384, 8, 128),
                                                               (8, 2048, 32, 64)],
              "norm": [(16384, 4096)] if args.quick else [(4096, 4096), (16384, 4096), (8192, 8192), (16384, 1024)],
              "fp8": [(4096, 4096, 4096)] if args.quick else [(4096, 4096, 4096), (8192, 8192, 8192)]}
    rows = [r for g in only for r in GROUPS[g](shapes[g], runs)]
    print(table(rows))
    if not args.no_record:
        command = run_command("tk_kernels.py", args.quick, args.only, list(GROUPS))
        append_results(ROOT / "benchmarks" / "RESULTS.md", command, rows)
        plot(rows, only, ROOT / "benchmarks" / "plot_tk_kernels.png")


if __name__ == "__main__":
    main()
