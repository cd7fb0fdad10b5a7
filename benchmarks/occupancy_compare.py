"""Programs an SM as the compiler chooses them (tkc/codegen/occupancy.py) against ptxas's own
choice (the pin ``ctas_per_sm = 1``), for softmax and LayerNorm configurations side by side with
the copy bandwidth.

    python benchmarks/occupancy_compare.py            # the configurations of RESULTS.md
    python benchmarks/occupancy_compare.py --runs 90

Each configuration is compiled both ways, each output checked against torch with the output
poisoned, then the two are timed in turns with the copy (``harness.in_turns``: L2 flushed,
median round).  Prints GB/s of one read + one write, the share of copy, and for each kernel the
programs an SM and registers a thread ptxas gave it.  Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import in_turns  # noqa: E402
from run import EXAMPLES, close, norm_call, randn  # noqa: E402

from tkc.compiler import compile_kernel  # noqa: E402
from tkc.runtime.launch import launch  # noqa: E402

#: (op, row length, configuration): one-block and two-sweep rows at 4k, 16k and 64k columns,
#: and rows split over a cluster (the "cluster" constant: softmax_split.tk, layernorm_split.tk).
CASES = [("softmax", 4096, {"BN": 4096, "warps": 4}), ("layernorm", 4096, {"BN": 4096, "warps": 4}),
         ("softmax", 4096, {"BN": 4096, "warps": 8}), ("layernorm", 4096, {"BN": 4096, "warps": 8}),
         ("layernorm", 16384, {"BN": 8192, "warps": 4}), ("softmax", 16384, {"BN": 16384, "warps": 8}),
         ("softmax", 16384, {"BN": 8192, "warps": 4}), ("layernorm", 65536, {"BN": 8192, "warps": 4, "prefetch": 1}),
         ("softmax", 65536, {"BN": 16384, "cluster": 4}), ("softmax", 65536, {"BN": 16384, "cluster": 4, "warps": 8}),
         ("softmax", 16384, {"BN": 8192, "cluster": 2}), ("layernorm", 16384, {"BN": 8192, "cluster": 2})]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=60)
    args = ap.parse_args()
    for op, N, cfg in CASES:
        M = (1 << 26) // N
        x, y = randn(M, N), torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        w, b = randn(N), randn(N)
        kargs, reference = norm_call(op, x, w, b, y)
        ref = reference()
        contenders = {"copy": lambda: y.copy_(x)}
        for label, consts in (("chosen", cfg), ("ctas_per_sm=1", {**cfg, "ctas_per_sm": 1})):
            kernel = compile_kernel(EXAMPLES / (f"{op}_split.tk" if "cluster" in cfg else f"{op}.tk"), consts)
            y.fill_(float("nan"))
            launch(kernel, kargs)
            wrong = close(y, ref, 3e-2)
            if wrong:
                print(f"{op} {M}x{N} {label}: {wrong}", flush=True)
                continue
            name = f"{label} ({kernel.programs_per_sm}/SM, {kernel.resources.registers} regs)"
            contenders[name] = lambda kernel=kernel: launch(kernel, kargs)
        gbs = {k: 2 * x.numel() * x.element_size() / s / 1e9 for k, s in in_turns(contenders, args.runs).items()}
        print(f"{op} {M}x{N} {cfg}: copy {gbs['copy']:.0f} GB/s", flush=True)
        for k, v in gbs.items():
            if k != "copy":
                print(f"    {k:40s} {v:6.0f} GB/s  {v / gbs['copy']:.3f}x copy", flush=True)


if __name__ == "__main__":
    main()
