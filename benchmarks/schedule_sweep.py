"""Every schedule of the harness's search on every harness shape, timed and kept: the data the
compiler's own schedule choice (tkc/schedule.py) is fitted to and checked against.

    python benchmarks/schedule_sweep.py --out benchmarks/data/schedule_sweep_h200.json
    python benchmarks/schedule_sweep.py --only gemm --quick --out /tmp/s.json

For each attention row (examples/attn.tk; D 64/128/256, causal and not, 512 to 16k tokens,
16k tokens in all) and GEMM row (examples/gemm.tk) it runs ``tkc.autotune`` over the
configurations benchmarks/run.py searches (the unpinned default among them), without the
disk cache, and writes every configuration's time (or why it did not run) to a JSON file:
``{"device": ..., "rows": [{"kernel", "shape", "timings": [[consts, seconds|null, why], ...]}]}``.
It prints, per row, the fastest configuration and how far the unpinned default is from it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import L2_FLUSH_BYTES, device_description  # noqa: E402
from run import EXAMPLES, GEMM_CONFIGS, attn_configs  # noqa: E402

from tkc import autotune  # noqa: E402


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def attention_shapes(quick: bool, dims: list[int]) -> list[dict]:
    seqlens = [1024, 4096, 16384] if quick else [512, 1024, 2048, 4096, 8192, 16384]
    return [{"D": D, "causal": causal, "B": 16384 // N, "H": 2048 // D, "N": N}
            for D in dims for causal in (False, True) for N in seqlens]


def gemm_shapes(quick: bool) -> list[dict]:
    mnk = [(4096, 4096, 4096), (8192, 8192, 8192)] if quick else [
        (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (2048, 4096, 8192),
        (1024, 1024, 1024), (4096, 4096, 1024), (16384, 16384, 4096), (1024, 8192, 8192)]
    return [{"M": M, "N": N, "K": K} for M, N, K in mnk]


def sweep_row(kernel: str, shape: dict, runs: int, rounds: int) -> dict:
    if kernel == "attn.tk":
        B, H, N, D = shape["B"], shape["H"], shape["N"], shape["D"]
        q, k, v, o = randn(B, H, N, D), randn(B, H, N, D), randn(B, H, N, D), torch.empty(B, H, N, D,
                                                                                       device="cuda",
                                                                                       dtype=torch.bfloat16)
        args: list = [q, k, v, o, D ** -0.5]
        configs = attn_configs(D, shape["causal"])
        unpinned = {"D": D, "causal": shape["causal"]}
        if unpinned not in configs:  # the harness pins every D=256 schedule; the default is a row too
            configs.insert(0, unpinned)
    else:
        a, b = randn(shape["M"], shape["K"]), randn(shape["K"], shape["N"])
        args = [a, b, torch.empty(shape["M"], shape["N"], device="cuda", dtype=torch.bfloat16)]
        configs = [dict(c) for c in GEMM_CONFIGS]
    result = autotune(EXAMPLES / kernel, args, configs, runs=runs, rounds=rounds, flush_bytes=L2_FLUSH_BYTES,
                      cache=False, progress=None)
    timings = [[c, s, why] for c, s, why in result.timings]
    default = next(s for c, s, _ in result.timings if not set(c) - {"D", "causal"})
    print(f"{kernel} {shape}: best {result.consts} {result.seconds * 1e6:.1f} us; unpinned default "
          f"{'did not run' if default is None else f'{result.seconds / default:.3f}x of it'}", flush=True)
    return {"kernel": kernel, "shape": shape, "timings": timings}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="attn,gemm", help="comma-separated: attn, gemm")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--dims", default="64,128,256", help="attention head dims")
    ap.add_argument("--runs", type=int, default=10, help="timed calls per configuration and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the configurations in turns")
    ap.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("the sweep needs a CUDA GPU")
    groups = args.only.split(",")
    out = {"device": device_description(), "command": "python benchmarks/schedule_sweep.py " + " ".join(sys.argv[1:]),
           "rows": []}
    print(out["device"], flush=True)
    dims = [int(d) for d in args.dims.split(",")]
    todo = ([("gemm.tk", s) for s in gemm_shapes(args.quick)] if "gemm" in groups else []) + (
        [("attn.tk", s) for s in attention_shapes(args.quick, dims)] if "attn" in groups else [])
    for kernel, shape in todo:
        out["rows"].append(sweep_row(kernel, shape, args.runs, args.rounds))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))  # after every row: a cut-short run keeps what it timed
        if os.environ.get("OUT"):
            (Path(os.environ["OUT"]) / args.out.name).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
