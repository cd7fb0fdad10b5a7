"""Linear attention (issue 27): examples/linear_attn.tk (decayed, a slope a head),
examples/based.tk (Based's Taylor feature map, 16 features, 64 values; ``tkc.ops.based``, whose
long sequences of few heads go in segments, beside the one-program-a-head kernel) and
examples/mamba2_ssd.tk (Mamba-2's SSD: linear attention with q = C, k = B dt, v = x and a decay
exp(dt A) a step), causal, beside a torch
reference in the chunked form (eager and ``torch.compile``: memory linear in N, the algorithm
the kernels run) and flash-linear-attention's Triton kernels (``fla.ops.simple_gla``'s
chunk_simple_gla with a per-head decay ``g_gamma``, ``fla.ops.based``'s parallel_based without
its normalizer; for the SSD chunk_simple_gla with the gate g = dt A of every step, its q, k
and g made before the timing) where ``fla`` imports.  Each row timed in turns with its peers on
one GPU (cold L2, harness.py).

    python benchmarks/linear_attn.py [--quick] [--no-record] [--only linear_attn,based,mamba2_ssd]

Appends the table to benchmarks/RESULTS.md (unless --no-record).  TFLOP/s of the chunked form
(chunks of 64: the masked product inside a chunk and the state's two products), the same count
for every contender.  fla's columns are left out when it does not import (or its call fails:
the note says why).  Needs a CUDA GPU.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/ goes after the standard library, whose profile module torch.compile imports
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"] + [str(ROOT / "benchmarks")]

import math  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from harness import Row, append_results, group_args, in_turns, run_command, table  # noqa: E402
from tk_kernels import checked, launcher  # noqa: E402

sys.path.append(str(ROOT / "tests" / "examples"))
import tk_reference as ref  # noqa: E402  (the torch references the tests check against)

import tkc.ops  # noqa: E402
from tkc.ops.based import segments_for  # noqa: E402

SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 0

C = 64  # the chunk of the kernels and of the torch peer


def fla_op(module: str, name: str) -> Callable | None:
    """``fla.ops.<module>.<name>`` where flash-linear-attention imports, else None."""
    try:
        return getattr(__import__(f"fla.ops.{module}", fromlist=[name]), name)
    except Exception:  # not installed, or its Triton does not load here
        return None


def chunked_flops(B: int, H: int, N: int, DK: int, DV: int) -> float:
    chunks = -(-N // C)
    return 2.0 * B * H * chunks * (C * C * (DK + DV) + 2 * C * DK * DV)


def add_fla(row: Row, contenders: dict, name: str, call: Callable[[], torch.Tensor], want: torch.Tensor) -> None:
    """``call`` as a contender, if it runs and computes ``want`` (within bf16's error); else
    the row's note says why it is missing."""
    try:
        got = call()
    except Exception as e:  # an fla version with another signature
        row.notes += f"; {name} failed: {type(e).__name__}: {str(e)[:80]}"
        return
    err = (got.float() - want.float()).abs().max().item()
    if err > 2e-2 * want.float().abs().max().item():
        row.notes += f"; {name} differs from torch (max error {err:.3g}), not timed"
        return
    contenders[name] = call


def timed(row: Row, contenders: dict, runs: int, flops: float) -> Row:
    """``row`` with each contender's TFLOP/s at ``flops`` a call, timed in turns, and printed."""
    t = in_turns(contenders, runs)
    row.values = {n: flops / s / 1e12 for n, s in t.items()}
    row.notes = row.notes.lstrip("; ")
    print(f"  {row.problem}: {row.values}", flush=True)
    return row


def linear_attn_rows(shapes: list[tuple[int, int, int, int, int]], runs: int) -> list[Row]:
    simple_gla = fla_op("simple_gla", "chunk_simple_gla")
    rows = []
    for B, H, N, DK, DV in shapes:
        row = Row("linear_attn", f"decayed, B={B} H={H} N={N} DK={DK} DV={DV} bf16", "TFLOP/s")
        q = torch.randn(B, H, N, DK, device="cuda", dtype=torch.bfloat16) * DK ** -0.5
        k = torch.randn(B, H, N, DK, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, H, N, DV, device="cuda", dtype=torch.bfloat16)
        # lightning attention's slopes: 2^(-8 h / H)
        slope = torch.exp2(-8.0 * torch.arange(1, H + 1, device="cuda") / H)
        o = torch.full_like(v, float("nan"))
        ours = launcher("linear_attn.tk", {"DV": DV})
        ours(q, k, v, slope, o)
        want = ref.linear_attn_chunked(q.float(), k.float(), v.float(), slope, C)
        if not checked(row, o, want, 2e-2):
            rows.append(row)
            continue

        def eager():
            return ref.linear_attn_chunked(q, k, v, slope, C)

        compiled = torch.compile(eager)
        compiled()
        contenders = {"tkc": lambda: ours(q, k, v, slope, o), "torch eager (chunked)": eager,
                      "torch.compile (chunked)": compiled}
        if simple_gla is not None:
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # fla: [B, N, H, D]
            g_gamma = -slope.float()

            def fla():
                return simple_gla(qt, kt, vt, g_gamma=g_gamma, scale=1.0)[0]

            add_fla(row, contenders, "fla chunk_simple_gla", fla, want.transpose(1, 2))
        rows.append(timed(row, contenders, runs, chunked_flops(B, H, N, DK, DV)))
    return rows


def based_rows(shapes: list[tuple[int, int, int, int, int]], runs: int) -> list[Row]:
    parallel_based = fla_op("based", "parallel_based")
    rows = []
    for B, H, N, DK, DV in shapes:
        row = Row("based", f"Based, B={B} H={H} N={N} DK={DK} DV={DV} bf16", "TFLOP/s")
        q, k = (torch.randn(B, H, N, DK, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(B, H, N, DV, device="cuda", dtype=torch.bfloat16)
        o = torch.full_like(v, float("nan"))
        ours = launcher("based.tk", {"DV": DV}, kernel="based")  # one program a head
        ours(q, k, v, o)
        want = ref.based_chunked(q.float(), k.float(), v.float(), C)
        segments = tkc.ops.based(q, k, v)  # long sequences of few heads in segments
        if not (checked(row, o, want, 2e-2) and checked(row, segments, want, 2e-2)):
            rows.append(row)
            continue

        def eager():
            return ref.based_chunked(q, k, v, C)

        compiled = torch.compile(eager)
        compiled()
        contenders = {"tkc": lambda: tkc.ops.based(q, k, v), "tkc one program a head": lambda: ours(q, k, v, o),
                      "torch eager (chunked)": eager, "torch.compile (chunked)": compiled}
        row.notes += f"tkc.ops.based: {segments_for(B, H, N, SMS)} segments a head"
        if parallel_based is not None:
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # fla: [B, N, H, D]

            def fla():
                return parallel_based(qt, kt, vt, scale=DK ** -0.5, use_norm=False)

            add_fla(row, contenders, "fla parallel_based", fla, want.transpose(1, 2))
        # the count of the 256 order-2 features, as Based's chunked form has them
        rows.append(timed(row, contenders, runs, chunked_flops(B, H, N, 1 + DK + DK * DK, DV)))
    return rows


def ssd_rows(shapes: list[tuple[int, int, int, int, int, int]], runs: int) -> list[Row]:
    """Mamba-2's SSD forward at (B, T, H, P, N, G), dt and A drawn as Mamba-2 initializes them;
    every contender computes y and the final state from (x, dt, dt_bias, A, B, C)."""
    simple_gla = fla_op("simple_gla", "chunk_simple_gla")
    rows = []
    for B, T, H, P, N, G in shapes:
        row = Row("mamba2_ssd", f"Mamba-2 SSD, B={B} T={T} H={H} P={P} N={N} G={G} bf16", "TFLOP/s")
        x = torch.randn(B, T, H, P, device="cuda", dtype=torch.bfloat16)
        dt_raw = 0.5 * torch.randn(B, T, H, device="cuda")
        dt_bias = torch.expm1(torch.exp(torch.empty(H, device="cuda").uniform_(math.log(1e-3), math.log(0.1)))).log()
        A = -torch.empty(H, device="cuda").uniform_(1, 16)
        b_in, c_in = (torch.randn(B, T, G, N, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        h0 = torch.zeros(B, H, P, N, device="cuda", dtype=torch.bfloat16)
        y, ht = torch.full_like(x, float("nan")), torch.full_like(h0, float("nan"))
        ours = launcher("mamba2_ssd.tk", {"N": N})
        ours(x, dt_raw, dt_bias, A, b_in, c_in, h0, y, ht)

        def eager():
            return ref.ssd(x, F.softplus(dt_raw + dt_bias), A, b_in, c_in, None, C)

        want, want_ht = eager()
        if not (checked(row, y, want, 2e-2) and checked(row, ht, want_ht, 2e-2)):
            rows.append(row)
            continue
        compiled = torch.compile(eager)
        compiled()
        contenders = {"tkc": lambda: ours(x, dt_raw, dt_bias, A, b_in, c_in, h0, y, ht),
                      "torch eager (chunked)": eager, "torch.compile (chunked)": compiled}
        if simple_gla is not None:
            dt = F.softplus(dt_raw + dt_bias)
            q = c_in.repeat_interleave(H // G, 2).contiguous()                          # [B, T, H, N]
            k = (b_in.repeat_interleave(H // G, 2) * dt[..., None]).to(torch.bfloat16)  # B dt
            g = dt * A                                                                   # log decay

            def fla():
                return simple_gla(q, k, x, g=g, scale=1.0, output_final_state=True)

            add_fla(row, contenders, "fla chunk_simple_gla", lambda: fla()[0], want)
            if "fla chunk_simple_gla" in contenders:
                err = (fla()[1].transpose(-1, -2).float() - want_ht).abs().max().item()
                row.notes += f"; fla's final state within {err / want_ht.abs().max().item():.2g} of torch's"
        rows.append(timed(row, contenders, runs, chunked_flops(B, H, T, N, P)))
    return rows


GROUPS = {"linear_attn": linear_attn_rows, "based": based_rows, "mamba2_ssd": ssd_rows}


def main() -> None:
    args, only = group_args("linear_attn.py", list(GROUPS))
    runs = 30 if args.quick else 60
    # linear attention and Based (B, H, N, DK, DV); Based on ThunderKittens' shapes (16 heads,
    # feature dim 16, values 64)
    shapes = {"linear_attn": [(8, 16, 4096, 64, 64)] if args.quick else
              [(8, 16, 4096, 64, 64), (8, 16, 4096, 64, 128), (2, 16, 16384, 64, 128)],
              "based": [(16, 16, 4096, 16, 64)] if args.quick else
              [(16, 16, 1024, 16, 64), (16, 16, 4096, 16, 64), (4, 16, 16384, 16, 64)],
              # (B, T, H, P, N, G): Mamba-2-2.7B's heads (80 of 64, state 128, one group)
              "mamba2_ssd": [(8, 4096, 80, 64, 128, 1)] if args.quick else
              [(8, 2048, 80, 64, 128, 1), (8, 8192, 80, 64, 128, 1), (8, 4096 + 37, 80, 64, 64, 1)]}
    rows = [r for g in only for r in GROUPS[g](shapes[g], runs)]
    print(table(rows))
    if not args.no_record:
        command = run_command("linear_attn.py", args.quick, args.only, list(GROUPS))
        append_results(ROOT / "benchmarks" / "RESULTS.md", command, rows)


if __name__ == "__main__":
    main()
