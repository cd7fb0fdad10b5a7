"""Where LayerNorm's time goes over long rows: the cluster-split kernel as written, without its
bias, and without weight and bias, beside softmax_split and the copy, timed in turns.

    python benchmarks/norm_breakdown.py                      # 1024 x 65536, 4 x 16384 a row
    python benchmarks/norm_breakdown.py --rows 4096 --cols 16384 --bn 8192

The variants are layernorm_split.tk with ``+ bt[None, :]`` (and ``* wt[None, :]``) taken out
of its output expression, compiled from a temporary copy; only the full kernel and softmax
are checked against torch (the variants compute something else).  Prints GB/s of one read
+ one write and the share of copy.  Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import in_turns  # noqa: E402
from run import EXAMPLES, close, randn  # noqa: E402

from tkc.compiler import compile_kernel  # noqa: E402
from tkc.runtime.launch import launch  # noqa: E402

WEIGHT, BIAS = " * wt[None, :]", " + bt[None, :]"


def variants(tmp: Path) -> dict[str, Path]:
    """layernorm_split.tk as written and with the bias, then also the weight, taken out."""
    src = (EXAMPLES / "layernorm_split.tk").read_text()
    if WEIGHT not in src or BIAS not in src:
        raise SystemExit("layernorm_split.tk no longer ends its row in '* wt[None, :] + bt[None, :]'")
    out = {"layernorm_split.tk": EXAMPLES / "layernorm_split.tk"}
    for name, text in (("without bias", src.replace(BIAS, "")),
                       ("without weight and bias", src.replace(BIAS, "").replace(WEIGHT, ""))):
        path = tmp / f"layernorm_split_{len(out)}.tk"
        path.write_text(text)
        out[name] = path
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=65536)
    ap.add_argument("--bn", type=int, default=16384, help="columns a program (cluster = cols / bn)")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--ctas-per-sm", type=int, default=3)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    M, N = args.rows, args.cols
    consts = {"BN": args.bn, "cluster": N // args.bn, "warps": args.warps, "ctas_per_sm": args.ctas_per_sm}
    x, y = randn(M, N), torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    w, b = randn(N), randn(N)
    moved = 2 * x.numel() * x.element_size()
    checks = {"layernorm_split.tk": lambda: torch.nn.functional.layer_norm(x.float(), (N,), w.float(), b.float(), 1e-5),
              "softmax_split.tk": lambda: torch.softmax(x.float(), -1)}
    contenders = {"copy": lambda: y.copy_(x)}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {**variants(Path(tmp)), "softmax_split.tk": EXAMPLES / "softmax_split.tk"}
        for name, path in paths.items():
            compiled = compile_kernel(path, consts)
            kargs = [x, y] if name == "softmax_split.tk" else [x, w, b, y, 1e-5]
            if name in checks:
                y.fill_(float("nan"))
                launch(compiled, kargs)
                wrong = close(y, checks[name](), 3e-2)
                if wrong:
                    print(f"{name}: {wrong}", flush=True)
                    continue
            contenders[name] = lambda compiled=compiled, kargs=kargs: launch(compiled, kargs)
        times = in_turns(contenders, args.runs)
    copy = moved / times["copy"] / 1e9
    print(f"{M}x{N}, {' '.join(f'{k}={v}' for k, v in consts.items())}: copy {copy:.0f} GB/s")
    for name, s in times.items():
        if name != "copy":
            gbs = moved / s / 1e9
            print(f"  {name:28s} {gbs:7.0f} GB/s  {gbs / copy:.3f}x copy")


if __name__ == "__main__":
    main()
