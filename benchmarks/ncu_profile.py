"""Where the time goes: Nsight Compute reports of tkc's kernels and their peers, at the
benchmark harness's shapes.

    python benchmarks/ncu_profile.py --out prof/                 # every case below, one report each
    python benchmarks/ncu_profile.py --out prof/ gemm softmax     # some of them
    python benchmarks/ncu_profile.py --case gemm                  # run one case once (ncu runs this)
    python benchmarks/ncu_profile.py --out prof/ --source attn-bwd # and where each instruction stalls

Each case is launched a few times to warm up, then once between cudaProfilerStart/Stop, so
``ncu --profile-from-start off`` profiles exactly the kernels of that one call (a peer may
launch more than one).  The report of each case is written to ``OUT/<case>.txt``: speed of
light, occupancy, launch statistics, warp stall reasons, memory and compute workloads.  With
``--source``, the report also samples stalls per SASS instruction: ``OUT/<case>.sass.csv`` is
Nsight Compute's source page (every instruction with its samples and their reasons) and
``OUT/<case>.hot.txt`` the instructions that hold the most samples, in program order with the
lines around them, which is where a schedule loses its time.
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
SECTIONS = ["SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats",
            "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis"]


def _randn(*shape: int):
    import torch

    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def _tkc(example: str, consts: dict, args: list):
    return _tkc_kernel(EXAMPLES / example, consts, None, args)


def _gemm(peer: bool, consts: dict | None = None):
    import torch

    a, b = _randn(4096, 4096), _randn(4096, 4096)
    c = torch.empty(4096, 4096, device="cuda", dtype=torch.bfloat16)
    return (lambda: torch.matmul(a, b, out=c)) if peer else _tkc("gemm.tk", consts or {}, [a, b, c])


def _attn(peer: bool, causal: bool = False, D: int = 128, consts: dict | None = None, N: int = 16384):
    """``consts``: the schedule the harness's tkc.autotune picked for this shape (the
    harness's B x N = 16384 tokens, H x D = 2048)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (_randn(16384 // N, 2048 // D, N, D) for _ in range(3))
    o, scale = torch.empty_like(q), 1 / math.sqrt(D)
    if not peer:
        return _tkc("attn.tk", {"D": D, "causal": causal, **(consts or {})}, [q, k, v, o, scale])

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return cudnn


def _attn_bwd(peer: bool, causal: bool = False, D: int = 128, consts: dict | None = None, N: int = 4096):
    """Attention backward (examples/attn_train.tk's attn_bwd alone, lse and delta from its
    forward and pre-pass; the peer: cuDNN's backward through SDPA), B x N = 16384 tokens,
    H x D = 2048."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tkc.compiler import compile_kernel
    from tkc.runtime.launch import launch

    B, H = 16384 // N, 2048 // D
    q, k, v, do = (_randn(B, H, N, D) for _ in range(4))
    scale = 1 / math.sqrt(D)
    if peer:
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    o, f32 = torch.empty_like(q), dict(device="cuda", dtype=torch.float32)
    lse, delta, dq = torch.empty(B, H, N, **f32), torch.empty(B, H, N, **f32), torch.empty(B, H, N, D, **f32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    path = EXAMPLES / "attn_train.tk"
    fixed = {"D": D, "causal": causal}
    launch(compile_kernel(path, fixed, kernel="attn_fwd"), [q, k, v, o, lse, scale])
    launch(compile_kernel(path, fixed, kernel="attn_bwd_pre"), [o, do, delta, dq])  # dq zeroed there
    return _tkc_kernel(path, {**fixed, **(consts or {})}, "attn_bwd",
                       [q, k, v, do, lse, delta, dq, dk, dv, scale])


def _attn_fp8(consts: dict | None = None, D: int = 128, N: int = 16384):
    """examples/attn_fp8.tk (e4m3 Q, K, V, unit descales) at the harness's shapes."""
    import torch

    q, k, v = (_randn(16384 // N, 2048 // D, N, D).to(torch.float8_e4m3fn) for _ in range(3))
    o = torch.empty(q.shape, device="cuda", dtype=torch.bfloat16)
    return _tkc("attn_fp8.tk", {"D": D, **(consts or {})}, [q, k, v, o, 1 / math.sqrt(D), 1.0, 1.0, 1.0])


def _tkc_kernel(path: Path, consts: dict, kernel: str | None, args: list):
    from tkc.compiler import compile_kernel
    from tkc.runtime.launch import launch

    compiled = compile_kernel(path, consts, kernel=kernel)
    return lambda: launch(compiled, args)


def _norm_bwd(N: int, BN: int):
    """examples/layernorm_residual_bwd.tk (RMSNorm, its own pins), 16384 rows of N in one block
    of BN: a row shorter than its block takes every access's edge path."""
    import torch

    M, f32 = 16384, dict(device="cuda", dtype=torch.float32)
    dy, dh, h = (_randn(M, N) for _ in range(3))
    w, dx, dres = _randn(N), torch.empty_like(dy), torch.empty_like(dy)
    mu, rstd, dw, db = torch.zeros(M, **f32), torch.rand(M, **f32) + 0.5, torch.zeros(N, **f32), torch.zeros(N, **f32)
    return _tkc("layernorm_residual_bwd.tk", {"BN": BN, "rms": True},
                [dy, dh, h, w, mu, rstd, dx, dres, dw, db, 0, 0.0])


def _norm(op: str, N: int, peer: bool, consts: dict | None = None):
    """``consts``: the block width the harness's tkc.autotune picked for this row length."""
    import torch

    M = (1 << 26) // N
    x, y, w, b = _randn(M, N), torch.empty(M, N, device="cuda", dtype=torch.bfloat16), _randn(N), _randn(N)
    if op == "softmax":
        return (lambda: torch.softmax(x, -1)) if peer else _tkc("softmax.tk", consts or {}, [x, y])
    if op == "layernorm":
        return ((lambda: torch.nn.functional.layer_norm(x, (N,), w, b, 1e-5)) if peer
                else _tkc("layernorm.tk", consts or {}, [x, w, b, y, 1e-5]))
    return lambda: y.copy_(x)


CASES = {
    "gemm": lambda: _gemm(False), "gemm-cublas": lambda: _gemm(True),
    # cuBLAS's tile shape on two 128-row warpgroups, and one 128-row warpgroup alone (what each
    # warpgroup of a tile ping-pong would run).
    "gemm-256x128": lambda: _gemm(False, {"BM": 256, "BN": 128, "consumers": 2}),
    "gemm-one-warpgroup": lambda: _gemm(False, {"BM": 128, "BN": 128, "consumers": 1}),
    # The schedules the harness's tkc.autotune picked at D=128 over 16k tokens.
    "attn": lambda: _attn(False, consts={"defer_last": True, "pingpong": True, "tma_store": False}),
    "attn-cudnn": lambda: _attn(True),
    "attn-bwd": lambda: _attn_bwd(False), "attn-bwd-cudnn": lambda: _attn_bwd(True),
    "attn-bwd-1k": lambda: _attn_bwd(False, N=1024), "attn-bwd-1k-cudnn": lambda: _attn_bwd(True, N=1024),
    "attn-bwd-d64": lambda: _attn_bwd(False, D=64), "attn-bwd-d64-cudnn": lambda: _attn_bwd(True, D=64),
    "attn-bwd-no-ws": lambda: _attn_bwd(False, consts={"warp_specialize": False}),
    "attn-causal": lambda: _attn(False, True, consts={"defer_last": True, "tma_store": False}),
    "attn-persistent": lambda: _attn(False, consts={"persistent": True, "issue_ahead": True}),
    "attn-512": lambda: _attn(False, consts={"persistent": True}, N=512),
    "attn-512-cudnn": lambda: _attn(True, N=512),
    # The row furthest below cuDNN: D=64, causal, 512 tokens (the harness's best schedule there).
    "attn-d64-causal-512": lambda: _attn(False, True, D=64, consts={"persistent": True, "defer_last": True}, N=512),
    "attn-d64-causal-512-cudnn": lambda: _attn(True, True, D=64, N=512),
    "attn-d64": lambda: _attn(False, D=64, consts={"BM": 192}), "attn-d64-cudnn": lambda: _attn(True, D=64),
    # Wider K/V blocks with O staged in Q's tile: 192 keys at D=128, 80 at D=256 (16k tokens),
    # and a row under 1.1x cuDNN (D=128, 4k tokens, the harness's pick there).
    "attn-bn192": lambda: _attn(False, consts={"defer_last": True, "BN": 192}),
    "attn-d256-bn80": lambda: _attn(False, D=256, consts={"defer_last": True, "BN": 80}),
    "attn-d256-cudnn": lambda: _attn(True, D=256),
    "attn-4k": lambda: _attn(False, consts={"defer_last": True, "pingpong": True}, N=4096),
    "attn-4k-cudnn": lambda: _attn(True, N=4096),
    # FlashAttention-3's ordering (P V of block j - 1 in flight through the softmax of block j)
    # against the same schedule without it.
    "attn-plain": lambda: _attn(False), "attn-defer": lambda: _attn(False, consts={"defer_last": True}),
    # The same with persistent programs (ring attention's walk): 13% slower at 16k tokens.
    "attn-defer-persistent": lambda: _attn(False, consts={"defer_last": True, "persistent": True}),
    # FP8 attention, whose schedule leaves defer_last off (it ran 11% slower with it)
    "attn-fp8": lambda: _attn_fp8(), "attn-fp8-defer": lambda: _attn_fp8({"defer_last": True}),
    "attn-d64-plain": lambda: _attn(False, D=64),
    "attn-d64-defer": lambda: _attn(False, D=64, consts={"defer_last": True}),
    "softmax": lambda: _norm("softmax", 4096, False), "softmax-torch": lambda: _norm("softmax", 4096, True),
    "softmax-64k": lambda: _norm("softmax", 65536, False, {"BN": 65536, "warps": 8}),
    "layernorm": lambda: _norm("layernorm", 4096, False),
    "layernorm-16k": lambda: _norm("layernorm", 16384, False, {"BN": 8192, "warps": 4, "ctas_per_sm": 3}),
    "layernorm-64k": lambda: _norm("layernorm", 65536, False, {"BN": 16384, "warps": 16, "prefetch": 1}),
    "layernorm-64k-torch": lambda: _norm("layernorm", 65536, True),
    "copy": lambda: _norm("copy", 4096, True),
    # A norm backward's rows of one block, and rows 96 columns short of it (0.86x and 0.54x of
    # copy bandwidth on an H200).
    "norm-bwd": lambda: _norm_bwd(4096, 4096), "norm-bwd-ragged": lambda: _norm_bwd(4000, 4096),
    "layernorm-ragged": lambda: _norm("layernorm", 4000, False, {"BN": 4096}),
}


def run_case(name: str) -> None:
    import torch

    fn = CASES[name]()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def profile(names: list[str], out: Path, source: bool = False) -> None:
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        sections = SECTIONS + (["SourceCounters"] if source else [])
        cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none",
               *[a for s in sections for a in ("--section", s)],
               *(["--import-source", "no", "-f", "-o", str(out / name)] if source else []),
               sys.executable, __file__, "--case", name]
        print("$", " ".join(cmd), flush=True)
        res = subprocess.run(cmd, capture_output=True, text=True)
        text = res.stdout + res.stderr
        if source:  # the report went to a file: print its details and its source page
            report = str(out / f"{name}.ncu-rep")
            text += subprocess.run([ncu, "-i", report, "--print-details", "all"],
                                   capture_output=True, text=True).stdout
            csv = subprocess.run([ncu, "-i", report, "--page", "source", "--csv", "--print-source", "sass"],
                                 capture_output=True, text=True).stdout
            (out / f"{name}.sass.csv").write_text(csv)
            (out / f"{name}.hot.txt").write_text(hot_spots(csv))
        (out / f"{name}.txt").write_text(text)
        print(f"{name}: ncu exit {res.returncode}, {len(text)} characters", flush=True)


def hot_spots(csv_text: str, top: int = 40, around: int = 6) -> str:
    """The ``top`` SASS instructions with the most stall samples in Nsight Compute's source
    page (CSV), each with ``around`` instructions either side, in program order: the share of
    all samples, the sample count and the instruction."""
    import csv
    import io

    lines = csv_text.splitlines()  # a "Kernel Name" line may come before the header
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), 0)
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    if not rows:
        return "no source page in the report\n"
    key = next((k for k in rows[0] if k.startswith("Warp Stall Sampling (All")), None)
    src = next((k for k in rows[0] if k.lower() == "source"), None)
    if key is None or src is None:
        return "columns: " + ", ".join(rows[0]) + "\n"

    def count(r: dict) -> int:
        try:
            return int(float(r[key].replace(",", "") or 0))
        except ValueError:
            return 0

    counts = [count(r) for r in rows]
    total = sum(counts) or 1
    hot = sorted(range(len(rows)), key=lambda i: -counts[i])[:top]
    shown = sorted({j for i in hot for j in range(max(0, i - around), min(len(rows), i + around + 1))})
    out, last = [f"{total} samples; the {top} instructions with the most, in program order"], -2
    for j in shown:
        if j != last + 1:
            out.append("...")
        mark = "*" if j in hot else " "
        out.append(f"{mark}{j:5d} {100 * counts[j] / total:5.1f}% {counts[j]:7d}  {rows[j][src].strip()}")
        last = j
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", help=f"cases to profile (default: all of {', '.join(CASES)})")
    ap.add_argument("--case", choices=CASES, help="run this case once (what ncu launches)")
    ap.add_argument("--out", type=Path, default=Path("profiles"), help="folder for the reports")
    ap.add_argument("--source", action="store_true",
                    help="also sample stalls per SASS instruction (OUT/<case>.sass.csv, OUT/<case>.hot.txt)")
    args = ap.parse_args()
    if args.case:
        run_case(args.case)
    else:
        profile(args.cases or list(CASES), args.out, args.source)


if __name__ == "__main__":
    main()
