"""tkc against the kernels a user would pick instead, in one run, on one GPU.

    python benchmarks/run.py                 # everything; appends to benchmarks/RESULTS.md, saves PNGs
    python benchmarks/run.py --quick         # fewer shapes and runs (a few minutes)
    python benchmarks/run.py --only gemm,norm --no-write

Rows (bf16 unless named): GEMM (the best of a few schedules of gemm.tk, found by
tkc.autotune per shape, as for attention and the norms) against torch.matmul (cuBLAS), a
Triton GEMM and TileLang's and cuTile's; attention
forward against every SDPA backend torch has (cuDNN, flash, memory-efficient),
FlashAttention-4, TileLang and cuTile (benchmarks/peers.py; a peer that cannot run says why), with
FlashAttention-3's published H100 numbers beside; softmax and LayerNorm against torch, Triton
and the device-to-device copy bandwidth (tkc's kernel for a row of 16k columns or more is the
faster of softmax.tk/layernorm.tk and their row-over-a-cluster versions, *_split.tk); cold
compile time and host time per launch (``--only compile``: every example's cold compile, with or
without a GPU).  Every tkc result is checked against torch before it
is timed; a wrong result is reported, not timed.  Timing: the contenders of a row alternate
call by call, each after a 256 MB L2 clear (benchmarks/harness.py, in_alternation).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from harness import (L2_FLUSH_BYTES, Row, append_results, device_description, host_time,  # noqa: E402
                     in_alternation, plot, table)

import peers  # noqa: E402
import tkc  # noqa: E402
from tkc import autotune  # noqa: E402
from tkc.compiler import compile_kernel  # noqa: E402
from tkc.runtime.launch import launch  # noqa: E402
from tkc.pins import Options  # noqa: E402

EXAMPLES = ROOT / "examples"
# FlashAttention-3 forward, bf16, H100 SXM, seqlen 16k, head dim 128 (background/performance-anchors).
FA3_PUBLISHED = {(128, False, 16384): 648.0, (128, True, 16384): 616.0}

try:
    import triton_kernels as tri
except ImportError:  # no Triton: its column stays empty
    tri = None


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def tkc_call(example: str, consts: dict, args: list):
    compiled = compile_kernel(EXAMPLES / example, consts)
    return compiled, (lambda: launch(compiled, args))


def close(got: torch.Tensor, want: torch.Tensor, tol: float) -> str:
    """'' when ``got`` matches ``want`` within ``tol`` of its scale, else what is wrong."""
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item() or 1.0
    if math.isnan(err) or err > tol * scale:
        return f"WRONG: max error {err:.3g} (scale {scale:.3g}); not timed"
    return ""


# ------------------------------------------------------------------------ tkc's own default
# Beside each autotuned row: the kernel called as a user calls it, no pins and no search, so
# the schedule is the compiler's own (tkc.schedule picks pins, and attn.tk's choose(...) tile
# rows, for the launch's shapes).
GEMM = tkc.load(EXAMPLES / "gemm.tk")
ATTN = tkc.load(EXAMPLES / "attn.tk")
NORMS = {"softmax": tkc.load(EXAMPLES / "softmax.tk"), "layernorm": tkc.load(EXAMPLES / "layernorm.tk")}


def default_contender(contenders: dict, row: Row, kernel: tkc.Kernel, args: list, consts: dict,
                      out: torch.Tensor, ref: torch.Tensor, tol: float) -> str:
    """Add ``kernel(*args, **consts)`` to ``contenders`` as "tkc default" once its result is
    checked against ``ref``; the note that names the pins it ran with, or says it was wrong."""
    def call() -> None:
        kernel(*args, **consts)

    out.fill_(float("nan"))
    call()
    row.values["tkc default"] = None
    wrong = close(out, ref, tol)
    if wrong:
        return "tkc default " + wrong
    contenders["tkc default"] = call
    pins = kernel.pins(*args, **consts)
    defaults = Options()
    on = [k if v is True else f"{k}={v}" for k, v in pins.items() if v != getattr(defaults, k, None)]
    return f"tkc default: {', '.join(on) or 'no pins'} (tkc.schedule)"


# ---------------------------------------------------------------------------------- peers
# FlashAttention-4, TileLang and cuTile (benchmarks/peers.py: installed from carried wheels,
# TileLang's and cuTile's own published examples as the kernels).  A peer that cannot run says
# why in the row's notes, once a run; a wrong result is reported and not timed.
_said: set[tuple[str, str]] = set()


def peer_contenders(contenders: dict, row: Row, built: dict, out: Callable[[Any], torch.Tensor],
                    ref: torch.Tensor, tol: float) -> str:
    """Add each of ``built`` (peers.attention's or peers.gemm's answer) that runs and matches
    ``ref`` (its result through ``out``) to ``contenders``; the note saying why the others are not."""
    notes = []
    for name, peer in built.items():
        row.values[name] = None
        if isinstance(peer, str):
            said = (name, peer) in _said
            _said.add((name, peer))
            notes.append(f"{name} not run{' (as above)' if said else ': ' + peer}")
            continue
        wrong = close(out(peer()), ref, tol)
        if wrong:
            notes.append(f"{name} {wrong}")
        else:
            contenders[name] = peer
    return "; ".join(notes)


# ----------------------------------------------------------------------------------- GEMM
# The schedules tried per shape (tkc.autotune picks; benchmarks/RESULTS.md has the sweeps):
# the example's 128 x 256 tile on two 64-row warpgroups, and cuBLAS's cooperative shape,
# 256 x 128 on two warpgroups of 128 rows, each with and without 2-CTA clusters (the shared
# operand read once from L2 and multicast).
GEMM_CONFIGS = [{}, {"cluster": 2}, {"BM": 256, "BN": 128, "consumers": 2},
                {"BM": 256, "BN": 128, "consumers": 2, "cluster": 2}]


def gemm_rows(quick: bool, runs: int, progress: TextIO | None = None) -> list[Row]:
    shapes = [(4096, 4096, 4096), (8192, 8192, 8192)] if quick else [
        (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (2048, 4096, 8192)]
    rows = []
    for M, N, K in shapes:
        a, b = randn(M, K), randn(K, N)
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        flops = 2 * M * N * K
        row = Row("GEMM bf16", f"{M}x{N}x{K}", "TFLOP/s")
        best = autotune(EXAMPLES / "gemm.tk", [a, b, c], GEMM_CONFIGS, flush_bytes=L2_FLUSH_BYTES, progress=progress)
        _, run = tkc_call("gemm.tk", best.consts, [a, b, c])
        c.fill_(float("nan"))
        run()
        row.notes = close(c, a.float() @ b.float(), 2e-2)
        contenders = {"tkc": run, "torch (cuBLAS)": lambda: torch.matmul(a, b, out=c)}
        if tri is not None:
            contenders["triton"] = lambda: tri.gemm(a, b, c)
        if row.notes:
            del contenders["tkc"]
            row.values["tkc"] = None
        elif best.consts:
            row.notes = f"tkc: {', '.join(f'{k}={v}' for k, v in best.consts.items())} (tkc.autotune)"
        want = a.float() @ b.float()
        wrong = default_contender(contenders, row, GEMM, [a, b, c], {}, c, want, 2e-2)
        others = peer_contenders(contenders, row, peers.gemm(a, b), lambda r: r, want, 2e-2)
        row.notes = "; ".join(n for n in (row.notes, wrong, others) if n)
        row.values.update({k: flops / s / 1e12 for k, s in in_alternation(contenders, runs).items()})
        rows.append(row)
        print(f"  gemm {row.problem}: {row.values}", flush=True)
    return rows


# ------------------------------------------------------------------------------ attention
# The schedules tried per head dim (tkc.autotune picks per shape; benchmarks/RESULTS.md has the
# sweeps).  defer_last (P V of block j - 1 in flight through block j's softmax) won on long
# sequences at every head dim.  O goes out through a shared tile and TMA by default; on long
# sequences the 32 KB that takes can be worth more as a K/V stage, so the schedules that win
# there are also tried storing O thread by thread (``tma_store=False``); BM=192 (three consumer
# warpgroups) where the softmax outweighs the products at D=64.  For short sequences:
# persistent programs, whose producer loads the next tile's Q, K and V during this tile's
# epilogue (at D=128 also with two K/V stages, so that Q gets two), and at D=64 64-row programs
# two to an SM, so that one's ring fill and epilogue overlap the other's products.  Wider K/V
# blocks where two stages of them fit only with O staged in Q's shared tile (lower-to-hopper
# does that then): 192 rows at D=128, 80 at D=256 (FlashAttention-3's choice there).
TWO_PER_SM = {"BM": 64, "ctas_per_sm": 2, "issue_ahead": True}
PERSISTENT = {"persistent": True}
BY_THREAD = {"tma_store": False}
DEFER = {"defer_last": True}
ATTN_CONFIGS = {
    64: [{}, {"pingpong": True, **BY_THREAD}, {"BM": 192, **BY_THREAD}, {**TWO_PER_SM, "BN": 128},
         PERSISTENT, {**PERSISTENT, "BM": 192}, {**PERSISTENT, "BM": 192, **BY_THREAD},
         {"BM": 192, **DEFER}, {**PERSISTENT, "BM": 192, **DEFER}, {**PERSISTENT, **DEFER},
         {"BM": 192, **DEFER, **BY_THREAD}],
    128: [{}, {"issue_ahead": True, **BY_THREAD}, PERSISTENT, {**PERSISTENT, "stages": 2},
          DEFER, {**DEFER, "pingpong": True}, {**DEFER, **BY_THREAD}, {**DEFER, "pingpong": True, **BY_THREAD},
          {**DEFER, **PERSISTENT}, {**DEFER, **PERSISTENT, **BY_THREAD}, {**DEFER, "BN": 192}],
    256: [{"BN": 64}, {"BN": 64, "pingpong": True}, {"BN": 64, "pingpong": True, **BY_THREAD},
          {**PERSISTENT, "BN": 64}, {**DEFER, "BN": 64}, {**DEFER, "BN": 64, "pingpong": True},
          {**DEFER, **PERSISTENT, "BN": 64}, {**DEFER, "BN": 80}, {**DEFER, "BN": 80, "pingpong": True}],
}


def attn_configs(D: int, causal: bool) -> list[dict]:
    return [{"D": D, "causal": causal, **c} for c in ATTN_CONFIGS[D]]


def attention_rows(quick: bool, runs: int, progress: TextIO | None = None,
                   head_dims: list[int] | None = None) -> list[Row]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"cuDNN": SDPBackend.CUDNN_ATTENTION, "flash (FA2)": SDPBackend.FLASH_ATTENTION,
                "mem-efficient": SDPBackend.EFFICIENT_ATTENTION}
    seqlens = [1024, 4096, 16384] if quick else [512, 1024, 2048, 4096, 8192, 16384]
    dims = head_dims or ([64, 128] if quick else [64, 128, 256])
    rows = []
    for D in dims:
        H = 2048 // D
        for causal in (False, True):
            for N in seqlens:
                B = 16384 // N
                q, k, v = randn(B, H, N, D), randn(B, H, N, D), randn(B, H, N, D)
                o = torch.empty_like(q)
                scale = 1 / math.sqrt(D)
                flops = 4 * B * H * N * N * D // (2 if causal else 1)
                row = Row(f"attention forward D={D}{' causal' if causal else ''}", f"B{B} H{H} N{N}", "TFLOP/s")
                # The schedule for this shape (tkc.autotune, timed as below, cached on disk); the
                # winner is checked and timed like any kernel.
                best = autotune(EXAMPLES / "attn.tk", [q, k, v, o, scale],
                                attn_configs(D, causal),
                                flush_bytes=L2_FLUSH_BYTES, progress=progress)
                _, run = tkc_call("attn.tk", best.consts, [q, k, v, o, scale])
                o.fill_(float("nan"))
                run()
                ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
                row.notes = close(o, ref, 2e-2)
                contenders = {} if row.notes else {"tkc": run}
                row.values["tkc"] = None
                # What the winning schedule sets beyond the shape: pins on by name, others as k=v
                # (tma_store=False included: the same pins win with either epilogue).
                on = [k if v is True else f"{k}={v}" for k, v in best.consts.items()
                      if k not in ("D", "causal")]
                if on and not row.notes:
                    row.notes = f"tkc: {', '.join(on)} (tkc.autotune)"
                wrong = default_contender(contenders, row, ATTN, [q, k, v, o, scale],
                                          {"D": D, "causal": causal}, o, ref, 2e-2)
                row.notes = "; ".join(n for n in (row.notes, wrong) if n)
                for name, be in backends.items():
                    def sdpa(be=be):
                        with sdpa_kernel([be]):
                            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
                    row.values[name] = None
                    try:
                        sdpa()
                        contenders[name] = sdpa
                    except RuntimeError:  # this backend does not take these inputs
                        pass
                others = peer_contenders(contenders, row, peers.attention(q, k, v, causal, scale), lambda r: r,
                                         ref, 2e-2)
                row.notes = "; ".join(n for n in (row.notes, others) if n)
                row.values.update({k: flops / s / 1e12 for k, s in in_alternation(contenders, runs).items()})
                pub = FA3_PUBLISHED.get((D, causal, N))
                if pub:
                    row.notes = (row.notes + "; " if row.notes else "") + f"FA3 published on H100: {pub} TFLOP/s"
                rows.append(row)
                print(f"  attn D{D} causal={causal} {row.problem}: {row.values}", flush=True)
    return rows


# ------------------------------------------------------------------- softmax and layernorm
# One row a program (the examples' default BM=1); a row that fits one block is read once.
# Block widths up to the row, spread over 4 to 16 warps so that each thread holds 8 to 256
# values: at least one 16-byte vector (fewer leaves threads idle), at most what registers
# take (more spills: a 64k row over 4 warps is 512 a thread).  A 64k-wide block only for softmax: layernorm also holds
# w and b, and spills at that width whatever the warps (benchmarks/RESULTS.md).
# Where a row takes several blocks, each also with the blocks fetched into L2 one and two
# iterations ahead (the pin prefetch): for LayerNorm only by default, since it made two-sweep
# softmax slower on an H100 (benchmarks/norm_sweep.py).  Each 4-warp configuration also with the
# pin ctas_per_sm=3: added when ptxas alone fit two 8k-block LayerNorm programs an SM (0.90x ->
# 0.94x of copy at 16k columns, RESULTS.md).  The compiler now makes that choice itself (one more
# program than ptxas fits, tkc/codegen/occupancy.py; the same cubin for that configuration), so
# the pinned variants stay as the alternative: for several configurations they give fewer
# programs an SM than the compiler's choice, which two-sweep rows sometimes prefer.  Rows of 16k
# columns or more also try the row split over 2 or 4 programs of a cluster (split_configs):
# softmax's 64k row runs split at 0.94x copy against 0.83x in one program.
def norm_call(op: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor):
    """softmax.tk's or layernorm.tk's arguments for rows ``x`` into ``y`` (``w`` and ``b``: the
    LayerNorm's weight and bias), and the fp32 torch reference, computed when called."""
    if op == "softmax":
        return [x, y], lambda: torch.softmax(x.float(), -1)
    return [x, w, b, y, 1e-5], lambda: torch.nn.functional.layer_norm(
        x.float(), (x.shape[-1],), w.float(), b.float(), 1e-5)


def norm_configs(op: str, N: int, prefetch: tuple[int, ...] | None = None) -> list[dict]:
    widths = [bn for bn in (2048, 4096, 8192, 16384) + ((65536,) if op == "softmax" else ()) if bn <= N]
    base = [{"BN": bn, "warps": w} for bn in widths for w in (4, 8, 16) if 8 <= bn // (32 * w) <= 256]
    if prefetch is None:
        prefetch = (1, 2) if op == "layernorm" else ()
    base += [{**c, "prefetch": d} for c in base if c["BN"] < N for d in prefetch]
    return base + [{**c, "ctas_per_sm": 3} for c in base if c["warps"] == 4]


def split_configs(N: int) -> list[dict]:
    """softmax_split.tk's and layernorm_split.tk's configurations for rows of ``N`` columns:
    the row over 2 or 4 programs of a cluster, one block each, 4, 8 or 16 warps, as many
    programs an SM as the compiler chooses or three or four (LayerNorm's 16k-column, 4-warp
    block fits four with its row packed; its 64k row ran fastest as 2 x 32768 over 16 warps on
    an H100, benchmarks/RESULTS.md).  Rows under 16k columns fill the GPU without a cluster (a
    row a program)."""
    if N < 16384:
        return []
    return [{"BN": N // c, "cluster": c, "warps": w, **ctas} for c in (2, 4) for w in (4, 8, 16)
            for ctas in ({}, {"ctas_per_sm": 3}, {"ctas_per_sm": 4}) if 8 <= N // c // (32 * w) <= 256]


def best_norm_kernel(op: str, N: int, args: list, runs: int, progress: TextIO | None) -> tuple[str, dict]:
    """The example and constants tkc runs a norm row with: ``op``.tk's best configuration
    (tkc.autotune), or ``op``_split.tk's where it is faster, the two winners timed in turns."""
    best = autotune(EXAMPLES / f"{op}.tk", args, norm_configs(op, N), flush_bytes=L2_FLUSH_BYTES,
                    progress=progress)
    configs = split_configs(N)
    if not configs:
        return f"{op}.tk", best.consts
    split = autotune(EXAMPLES / f"{op}_split.tk", args, configs, flush_bytes=L2_FLUSH_BYTES, progress=progress)
    picks = {f"{op}.tk": best.consts, f"{op}_split.tk": split.consts}
    times = in_alternation({ex: tkc_call(ex, consts, args)[1] for ex, consts in picks.items()}, runs)
    example = min(times, key=times.get)
    return example, picks[example]


def norm_rows(quick: bool, runs: int, progress: TextIO | None = None) -> list[Row]:
    widths = [4096, 65536] if quick else [4096, 16384, 65536]
    total = 1 << 26  # elements per problem: 128 MB of bf16 in, 128 MB out
    rows = []
    for N in widths:
        M = total // N
        x, y = randn(M, N), torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        moved = 2 * x.numel() * x.element_size()  # read once, write once: what any kernel must move
        for op in ("softmax", "layernorm"):
            row = Row(f"{op} bf16 (GB/s of one read + one write)", f"{M}x{N}", "GB/s")
            w, b = randn(N), randn(N)
            args, ref = norm_call(op, x, w, b, y)
            if op == "softmax":
                torch_fn = lambda: torch.softmax(x, -1)
                tri_fn = (lambda: tri.softmax(x, y)) if tri else None
            else:
                torch_fn = lambda: torch.nn.functional.layer_norm(x, (N,), w, b, 1e-5)
                tri_fn = (lambda: tri.layernorm(x, w, b, y, 1e-5)) if tri else None
            # The block width for this row length, as Triton's kernels pick theirs: tkc.autotune
            # times each (cached on disk), the winner is checked and timed like any kernel.
            example, consts = best_norm_kernel(op, N, args, runs, progress)
            _, run = tkc_call(example, consts, args)
            y.fill_(float("nan"))
            run()
            wrong = close(y, ref(), 3e-2)
            picked = ", ".join(f"{k}={v}" for k, v in consts.items())
            row.notes = wrong or f"tkc: {'' if example == f'{op}.tk' else example + ' '}{picked} (tkc.autotune)"
            row.values["tkc"] = None
            contenders = {} if wrong else {"tkc": run}
            row.notes = "; ".join(n for n in (row.notes, default_contender(
                contenders, row, NORMS[op], args, {}, y, ref(), 3e-2)) if n)
            contenders["torch"] = torch_fn
            if tri_fn is not None:
                contenders["triton"] = tri_fn
            contenders["copy"] = lambda: y.copy_(x)  # the bandwidth floor, in the same turns
            row.values.update({k: moved / s / 1e9 for k, s in in_alternation(contenders, runs).items()})
            rows.append(row)
            print(f"  {op} {row.problem}: {row.values}", flush=True)
    return rows


# ---------------------------------------------------------------- compile and launch costs
#: Cold compiles timed per example; the row reports their median (single compiles of softmax.tk
#: read 0.40 s and 0.65 s in two runs on two hosts the same day).
COMPILES = 5


def overhead_rows() -> list[Row]:
    rows = []
    for example, consts in (("gemm.tk", {}), ("attn.tk", {}), ("softmax.tk", {}), ("layernorm.tk", {})):
        seconds = []
        for _ in range(COMPILES):
            t = time.perf_counter()
            compile_kernel(EXAMPLES / example, consts, cache=False)
            seconds.append(time.perf_counter() - t)
        rows.append(Row(f"cold compile time (tkc compile_kernel to cubin, no cache; median of {COMPILES})",
                        example, "s", {"tkc": statistics.median(seconds)}))
    x, y = randn(64, 256), torch.empty(64, 256, device="cuda", dtype=torch.bfloat16)
    compiled = compile_kernel(EXAMPLES / "softmax.tk", {})
    row = Row("host time per launch, cached compile (64x256 softmax)", "one call", "us")
    row.values["tkc"] = host_time(lambda: launch(compiled, [x, y])) * 1e6
    row.values["torch"] = host_time(lambda: torch.softmax(x, -1)) * 1e6
    if tri is not None:
        tri.softmax(x, y)
        row.values["triton"] = host_time(lambda: tri.softmax(x, y)) * 1e6
    rows.append(row)
    return rows


def example_kernels() -> list[tuple[Path, str | None]]:
    """Every kernel of examples/*.tk: (file, its name where the file has several, else None)."""
    import re

    out = []
    for path in sorted(EXAMPLES.glob("*.tk")):
        names = re.findall(r"^@kernel[^\n]*\ndef (\w+)", path.read_text(), re.MULTILINE)
        out += [(path, name if len(names) > 1 else None) for name in names]
    return out


@contextlib.contextmanager
def cold() -> Iterator[None]:
    """A compilation as the first of its kernel on this machine: no parsed tree of its file
    and no ptxas result in this process (tkc keeps both, so a second compile of the same text
    skips them), and an empty cache directory (no stored tree)."""
    import tempfile

    from tkc.compiler import forget_kept

    with tempfile.TemporaryDirectory(prefix="tkc-cold-") as empty:
        before = os.environ.get("TKC_CACHE_DIR")
        os.environ["TKC_CACHE_DIR"] = empty
        forget_kept()
        try:
            yield
        finally:
            if before is None:
                del os.environ["TKC_CACHE_DIR"]
            else:
                os.environ["TKC_CACHE_DIR"] = before


def compile_rows() -> list[Row]:
    """Cold compile (compile_kernel to cubin, no cache, :func:`cold`) of every example kernel at
    its own constants, the median of ``COMPILES``; the slowest first.  Needs ptxas, not a GPU: the time
    is the host's, whose CPU (cores for ptxas's parallel runs, single-thread speed) the table's
    heading names."""
    import platform

    rows = []
    for path, kernel in example_kernels():
        seconds = []
        for _ in range(COMPILES):
            with cold():
                t = time.perf_counter()
                compile_kernel(path, {}, kernel=kernel, cache=False)
                seconds.append(time.perf_counter() - t)
        name = path.name + (f":{kernel}" if kernel else "")
        rows.append(Row(f"cold compile time of every example (median of {COMPILES}; {os.cpu_count()} CPUs, "
                        f"{platform.processor() or platform.machine()})", name, "s",
                        {"tkc": statistics.median(seconds)}))
        print(f"  compile {name}: {rows[-1].values['tkc']:.2f} s", flush=True)
    return sorted(rows, key=lambda r: -r.values["tkc"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes and timed runs")
    ap.add_argument("--only", default="gemm,attn,norm,overhead", help="comma-separated groups (also: compile, "
                    "every example's cold compile, which runs without a GPU)")
    ap.add_argument("--dims", type=lambda t: [int(d) for d in t.split(",")], default=None,
                    help="attention head dims, comma-separated (default: 64,128,256; 64,128 with --quick)")
    ap.add_argument("--runs", type=int, default=None,
                    help="timed runs per contender, in three rounds taken in turns with the others")
    ap.add_argument("--no-write", action="store_true", help="print only; no RESULTS.md section, no plots")
    ap.add_argument("--results", type=Path, default=HERE / "RESULTS.md", help="the file the section goes to")
    ap.add_argument("--plots", type=Path, default=HERE, help="folder for the PNG plots")
    ap.add_argument("--progress", action="store_true",
                    help="tkc.autotune's lines on stderr: each schedule as it compiles, then the timings (a row "
                         "that stalls names its schedules)")
    args = ap.parse_args()
    progress = sys.stderr if args.progress else None
    groups = args.only.split(",")
    gpu = torch.cuda.is_available()
    if not gpu and groups != ["compile"]:
        sys.exit("benchmarks need a CUDA GPU (but --only compile)")
    runs = args.runs or (20 if args.quick else 50)
    print(device_description() if gpu else "no GPU: compile times only", flush=True)
    rows: list[Row] = []
    if "gemm" in groups:
        rows += gemm_rows(args.quick, runs, progress)
    if "attn" in groups:
        rows += attention_rows(args.quick, runs, progress, args.dims)
    if "norm" in groups:
        rows += norm_rows(args.quick, runs, progress)
    if "overhead" in groups:
        rows += overhead_rows()
    if "compile" in groups:
        rows += compile_rows()
    text = table(rows)
    print()
    print(text)
    if not args.no_write:
        command = "python benchmarks/run.py " + " ".join(sys.argv[1:])
        append_results(args.results, command, rows)
        groups_seen = list(dict.fromkeys(r.group for r in rows))
        for name, prefix in (("gemm", "GEMM"), ("attention", "attention"), ("norms", ("softmax", "layernorm"))):
            plot(rows, [g for g in groups_seen if g.startswith(prefix)], args.plots / f"plot_{name}.png")


if __name__ == "__main__":
    main()
