"""Causal attention forward with and without the persistent pass's ``longest_first``.

    python benchmarks/causal_order.py [--no-record]

Programs one a tile whose loops run longer the later their query block (a causal mask) are
launched longest first by default, in groups of about an SM's count of programs (docs/pins.md,
``longest_first``).  Each row times, in alternation after an L2 clear (benchmarks/harness.py),
the three causal forward kernels a user calls -- examples/attn.tk, attn_train.tk's attn_fwd
(``tkc.ops.attention``'s forward, BM = BN = 128) and attn_fp8.tk (e4m3 Q, K, V from the same
values) -- each as called (tkc.schedule's pins) and with ``longest_first=False``, beside SDPA's
cuDNN forward (one table per kernel, all timed in the same turns); B x N = 16k tokens, H x D =
2048, N 1k-16k, D 128 and 64.  Each pair's outputs are checked bit-equal first (the order
changes no value).  The backward's rows:
``benchmarks/attn_train.py --masks causal --variants longest_first=false``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.append(str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tkc  # noqa: E402

EXAMPLES = ROOT / "examples"


def rows(runs: int) -> list:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from harness import Row, in_alternation

    train, attn, fp8 = (tkc.load(EXAMPLES / f, k) for f, k in (("attn_train.tk", "attn_fwd"), ("attn.tk", "attn"),
                                                               ("attn_fp8.tk", "attn_fp8")))
    out = []
    for D, H in ((128, 16), (64, 32)):
        for N in (1024, 2048, 4096, 8192, 16384):
            B = 16384 // N
            q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
            s, lse = D ** -0.5, torch.empty(B, H, N, device="cuda")
            calls = {
                "attn.tk": lambda o, **pin: attn(q, k, v, o, s, D=D, causal=True, **pin),
                "attn_train.tk": lambda o, **pin: train(q, k, v, o, lse, s, D=D, BM=128, BN=128, causal=True, **pin),
                "attn_fp8.tk": lambda o, **pin: fp8(q8, k8, v8, o, s, 1.0, 1.0, 1.0, D=D, causal=True, **pin),
            }
            contenders, outs = {}, {}
            for name, call in calls.items():
                for pin, label in (({}, name), ({"longest_first": False}, f"{name} longest_first=False")):
                    outs[label] = torch.empty_like(q)
                    contenders[label] = lambda call=call, o=outs[label], pin=pin: call(o, **pin)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            contenders["SDPA cudnn"] = cudnn
            for fn in contenders.values():
                fn()
            ref = cudnn().float()
            for name in calls:
                grid_order = outs[f"{name} longest_first=False"]
                assert torch.equal(outs[name], grid_order), f"{name}: the launch order changed a value"
                if name != "attn_fp8.tk":
                    assert (outs[name].float() - ref).abs().max().item() < 3e-2, f"{name}: off SDPA"
            t = in_alternation(contenders, runs)
            flops = 4 * B * H * N * N * D * 0.5
            for name in calls:  # a table per kernel: tkc's ratio to its grid order and to cuDNN
                values = {"tkc": flops / t[name] / 1e12,
                          "tkc longest_first=False": flops / t[f"{name} longest_first=False"] / 1e12,
                          "SDPA cudnn": flops / t["SDPA cudnn"] / 1e12}
                out.append(Row(f"causal forward, {name}", f"B={B} H={H} N={N} D={D}", "TFLOP/s", values))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/causal_order.py times kernels on a CUDA GPU; torch sees none here")
    from harness import append_results, table

    found = rows(40)
    print(table(found))
    if not args.no_record:
        append_results(ROOT / "benchmarks" / "RESULTS.md", "python benchmarks/causal_order.py", found)


if __name__ == "__main__":
    main()
