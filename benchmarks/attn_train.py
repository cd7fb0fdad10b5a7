"""Attention backward: examples/attn_train.tk beside PyTorch's SDPA backends.

    python benchmarks/attn_train.py [--quick] [--no-record] [--variants 'BM=32;stages=3']
                                    [--masks both|causal|none]
                                    [--only long,short,gqa,varlen,e2e,e2e-graphs]
                                    [--sources 'old=path/to/attn_train.tk']

Rows (each timed in turns with its peers on the same GPU, cold L2, benchmarks/harness.py), in
TFLOP/s counted as FlashAttention-3 counts them: a forward is 4 B H N^2 D (half of it causal)
and a backward 2.5 forwards.

* ``attn_bwd long``: B x N = 16k tokens, H x D = 2048 (D 128 with 16 heads, D 64 with 32),
  N from 512 to 16k, causal and not.
* ``attn_bwd short``: B = 16, H = 16, D = 128, N from 768 to 3072, causal and not.
* ``varlen fwd+bwd`` (``--only varlen``): forward and backward of 16 packed sequences of
  512-4096 tokens (seeded), 16 heads, D 128 and 64, causal and not, through
  ``tkc.ops.varlen_attention`` (examples/varlen_attn_train.tk), beside torch's own varlen
  attention (``torch.nn.attention.varlen.varlen_attn``, where this torch has it), SDPA on the
  batch padded to the longest sequence (with the key-padding mask it needs, and without: the
  padded work at the fastest backend) and ``tkc.ops.attention`` on that padded batch
  (attn_train.tk; no mask, so the padded work only).  Each counted by its useful FLOPs (3.5
  forwards of the sequences themselves).
* ``attention fwd+bwd, torch.compile`` (``--only e2e``): a training step's attention, forward
  and gradients, through ``tkc.ops.attention`` beside SDPA's flash and cuDNN backends, each
  under ``torch.compile(fullgraph=True)``; B x N = 16k tokens, H x D = 2048, N 1k/4k/16k,
  D 128 and 64, causal and not (3.5 forwards of FLOPs).  Each row notes every contender's
  host time a step: at 1k tokens torch.compile's own wrappers make the host, not the GPU, the
  limit.  ``--only e2e-graphs``: the same under ``mode="reduce-overhead"`` (CUDA graphs).

tkc's backward is what a training step runs after the forward: the pre-pass (``attn_bwd_pre``:
rowsum(dO * O), and dQ's f32 accumulator zeroed), ``attn_bwd`` (dK, dV and dQ's f32 accumulation), and dQ cast
to bf16.  The peers are ``torch.autograd.grad`` of ``F.scaled_dot_product_attention`` under
``torch.nn.attention.sdpa_kernel`` with each backend that takes the shape (FlashAttention-2,
memory-efficient, cuDNN), their forward run once outside the timing.  ``--variants`` adds tkc
contenders with other constants (``;``-separated, each ``NAME=VALUE,...``), as ``tkc NAME=VALUE``;
``--sources`` adds contenders compiled from other copies of the example (``;``-separated
``NAME=PATH``, as ``tkc NAME``: another order of its statements, say), with their own defaults.
Every tkc contender's gradients are checked against SDPA's before it is timed.
Without a GPU it says so and stops.
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

EXAMPLE = ROOT / "examples" / "attn_train.tk"


def parse_variants(text: str) -> list[dict]:
    """``'BM=32;BM=64,stages=3'`` -> ``[{'BM': 32}, {'BM': 64, 'stages': 3}]``."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        consts = {}
        for item in part.split(","):
            name, value = item.split("=")
            v = value.strip()
            consts[name.strip()] = v.lower() == "true" if v.lower() in ("true", "false") else int(v)
        out.append(consts)
    return out


def flops(B: int, H: int, N: int, D: int, causal: bool) -> float:
    """FlashAttention-3's count of a backward: 2.5 forwards of 4 B H N^2 D (half when causal)."""
    return 2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)


class Backward:
    """tkc's backward of one shape: the three kernels compiled for it and its tensors."""

    def __init__(self, B: int, H: int, KVH: int, N: int, D: int, causal: bool, extra: dict | None = None,
                 example: Path = EXAMPLE):
        from tkc.compiler import compile_kernel

        # ``extra`` (a variant's constants) is attn_bwd's; the forward and the pre-pass keep theirs.
        self.fwd = compile_kernel(example, {"D": D, "causal": causal}, kernel="attn_fwd")
        self.pre = compile_kernel(example, {"D": D}, kernel="attn_bwd_pre")
        self.bwd = compile_kernel(example, {"D": D, **(extra or {}), "causal": causal}, kernel="attn_bwd")
        dev, bf = "cuda", torch.bfloat16
        self.q = torch.randn(B, H, N, D, device=dev, dtype=bf)
        self.k, self.v = (torch.randn(B, KVH, N, D, device=dev, dtype=bf) for _ in range(2))
        self.do = torch.randn(B, H, N, D, device=dev, dtype=bf)
        self.o = torch.empty_like(self.q)
        self.lse = torch.empty(B, H, N, device=dev)
        self.delta = torch.empty(B, H, N, device=dev)
        self.dq = torch.empty(B, H, N, D, device=dev)
        self.dk, self.dv = torch.empty_like(self.k), torch.empty_like(self.v)
        self.scale = D ** -0.5
        self.forward()

    def forward(self) -> None:
        from tkc.runtime.launch import launch

        launch(self.fwd, [self.q, self.k, self.v, self.o, self.lse, self.scale])

    def __call__(self) -> torch.Tensor:
        from tkc.runtime.launch import launch

        launch(self.pre, [self.o, self.do, self.delta, self.dq])  # dq zeroed there
        launch(self.bwd, [self.q, self.k, self.v, self.do, self.lse, self.delta, self.dq, self.dk, self.dv,
                          self.scale])
        return self.dq.to(torch.bfloat16)


def check(ours: Backward, causal: bool) -> None:
    """tkc's gradients of the first batch element's first kv head (and its query heads) against
    SDPA's memory-efficient backend in fp32 (a bf16-level tolerance)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    G = ours.q.shape[1] // ours.k.shape[1]
    q, k, v = (x[:1, :n].float().requires_grad_() for x, n in ((ours.q, G), (ours.k, 1), (ours.v, 1)))
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        o = F.scaled_dot_product_attention(q, k.expand(-1, G, -1, -1), v.expand(-1, G, -1, -1), is_causal=causal)
        want = torch.autograd.grad(o, (q, k, v), ours.do[:1, :G].float())
    dq = ours()
    mine = (dq[:1, :G], ours.dk[:1, :1], ours.dv[:1, :1])
    for name, got, w in zip(("dq", "dk", "dv"), mine, want):
        err = (got.float() - w).abs().max().item()
        assert err <= 3e-2 * max(1.0, w.abs().max().item()), (name, err)


def sdpa_backward(backend, B: int, H: int, KVH: int, N: int, D: int, causal: bool):
    """A callable timing SDPA's backward under ``backend``, or None where it refuses the shape."""
    from torch.nn.attention import sdpa_kernel

    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(B, H, N, D, device=dev, dtype=bf, requires_grad=True)
    k, v = (torch.randn(B, KVH, N, D, device=dev, dtype=bf, requires_grad=True) for _ in range(2))
    do = torch.randn(B, H, N, D, device=dev, dtype=bf)
    try:
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=H != KVH)
            torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    except RuntimeError:
        return None

    def run():
        with sdpa_kernel(backend):
            return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    return run


def rows_for(shapes: list[tuple[str, int, int, int, int, int]], causal_modes, variants: list[dict], runs: int,
             sources: dict[str, Path] | None = None):
    from torch.nn.attention import SDPBackend

    from harness import Row, in_turns

    backends = {"SDPA flash": SDPBackend.FLASH_ATTENTION, "SDPA efficient": SDPBackend.EFFICIENT_ATTENTION,
                "SDPA cudnn": SDPBackend.CUDNN_ATTENTION}
    rows = []
    for group, B, H, KVH, N, D in shapes:
        for causal in causal_modes:
            ours = Backward(B, H, KVH, N, D, causal)
            check(ours, causal)
            contenders = {"tkc": ours}
            for extra in variants:
                name = "tkc " + ",".join(f"{k}={v}" for k, v in extra.items())
                contenders[name] = Backward(B, H, KVH, N, D, causal, extra)
                check(contenders[name], causal)
            for name, path in (sources or {}).items():
                contenders["tkc " + name] = Backward(B, H, KVH, N, D, causal, example=path)
                check(contenders["tkc " + name], causal)
            for name, backend in backends.items():
                fn = sdpa_backward(backend, B, H, KVH, N, D, causal)
                if fn is not None:
                    contenders[name] = fn
            t = in_turns(contenders, runs)
            f = flops(B, H, N, D, causal)
            gqa = f", {KVH} kv heads" if KVH != H else ""
            rows.append(Row(f"attn_bwd {group}", f"B={B} H={H}{gqa} N={N} D={D}" + (", causal" if causal else ""),
                            "TFLOP/s", {n: f / s / 1e12 for n, s in t.items()},
                            notes="tkc: pre-pass (dQ zeroed there), attn_bwd, dQ to bf16"))
            del ours, contenders
            torch.cuda.empty_cache()
    return rows


def torch_varlen(q, k, v, cu, max_len: int, causal: bool):
    """torch's varlen attention of packed ``[T, H, D]`` tensors, or None where this torch has none
    or refuses it (its signature moved between releases: ``is_causal`` before ``window_size``)."""
    import inspect

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    kw = {}
    if causal:
        kw = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" not in params:
            return None
        kw["enable_gqa"] = True

    def run():
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)
    try:
        run()
    except (RuntimeError, NotImplementedError, TypeError) as e:  # a build or release that refuses it
        print(f"torch's varlen_attn refused the shape ({type(e).__name__}: {str(e)[:200]}); no row for it")
        return None
    return run


def varlen_rows(runs: int, quick: bool, seqs: int = 16, H: int = 16):
    """Forward + backward of packed sequences of 512-4096 tokens: tkc.ops.varlen_attention beside
    torch's varlen attention, SDPA on the padded batch (with and without its mask) and
    tkc.ops.attention on the padded batch."""
    import tkc.ops
    from harness import Row, in_turns

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(512, 4097, (seqs,), generator=g).tolist()
    total, L = sum(lengths), max(lengths)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    rows = []
    for D in ((128,) if quick else (128, 64)):
        dev, bf = "cuda", torch.bfloat16
        q, k, v, do = (torch.randn(total, H, D, device=dev, dtype=bf, requires_grad=i < 3) for i in range(4))
        pad = [torch.zeros(seqs, H, L, D, device=dev, dtype=bf) for _ in range(4)]
        for s, n in enumerate(lengths):
            a = int(cu[s])
            for p, t in zip(pad, (q, k, v, do)):
                p[s, :, :n] = t[a:a + n].detach().transpose(0, 1)
        qp, kp, vp, dop = (p.requires_grad_(i < 3) for i, p in enumerate(pad))
        valid = torch.arange(L, device=dev)[None, :] < torch.tensor(lengths, device=dev)[:, None]
        for causal in ((False,) if quick else (False, True)):
            mask = valid[:, None, None, :]
            if causal:
                mask = mask & torch.ones(L, L, dtype=torch.bool, device=dev).tril()

            def grads(o, inputs, dout):
                return torch.autograd.grad(o, inputs, dout)

            contenders = {
                "tkc": lambda: grads(tkc.ops.varlen_attention(q, k, v, cu, L, causal=causal), (q, k, v), do),
                "SDPA padded + mask": lambda: grads(F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask),
                                                    (qp, kp, vp), dop),
                "SDPA padded": lambda: grads(F.scaled_dot_product_attention(qp, kp, vp, is_causal=causal),
                                             (qp, kp, vp), dop),
                "tkc attention padded": lambda: grads(tkc.ops.attention(qp, kp, vp, causal=causal), (qp, kp, vp), dop)}
            tv = torch_varlen(q, k, v, cu, L, causal)
            if tv is not None:
                contenders["torch varlen_attn"] = lambda tv=tv: grads(tv(), (q, k, v), do)
            # The first sequence's gradients against SDPA's on the padded batch (bf16 tolerance).
            n0 = lengths[0]
            want = grads(F.scaled_dot_product_attention(qp[:1, :, :n0], kp[:1, :, :n0], vp[:1, :, :n0],
                                                        is_causal=causal), (qp, kp, vp), dop[:1, :, :n0])
            for got, w in zip(contenders["tkc"](), want):
                err = (got[:n0].float() - w[0, :, :n0].transpose(0, 1).float()).abs().max().item()
                assert err <= 3e-2 * max(1.0, w.abs().max().item()), err
            t = in_turns(contenders, runs)
            f = sum(3.5 * 4 * n * n * D * H * (0.5 if causal else 1.0) for n in lengths)
            rows.append(Row("varlen fwd+bwd", f"{seqs} sequences of 512-4096 ({total} tokens), H={H} D={D}"
                            + (", causal" if causal else ""), "TFLOP/s", {n: f / s / 1e12 for n, s in t.items()},
                            notes=f"padded: [{seqs}, {H}, {L}, {D}]; every contender counted by the useful FLOPs"))
            del contenders
            torch.cuda.empty_cache()
    return rows


def e2e_rows(runs: int, quick: bool, graphs: bool = False):
    """Forward + backward as a training step runs them: ``tkc.ops.attention`` under
    ``torch.compile(fullgraph=True)`` (inductor compiles the graph around the operator and its
    registered backward) beside SDPA's flash and cuDNN backends compiled the same way; B x N =
    16k tokens, H x D = 2048.  ``graphs``: compiled with ``mode="reduce-overhead"`` (CUDA
    graphs: a step replays its launches, so no contender pays host time per step).  Each row
    notes every contender's host time a step (``harness.host_time``): where it exceeds the
    GPU's, the row times the host."""
    import tkc.ops
    from harness import Row, host_time, in_turns
    from torch._dynamo.utils import counters
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def flash(q, k, v, causal):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def cudnn(q, k, v, causal):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def ours(q, k, v, causal):
        return tkc.ops.attention(q, k, v, causal=causal)

    fns = {"tkc": ours, "SDPA flash": flash, "SDPA cudnn": cudnn}
    mode = "reduce-overhead" if graphs else None
    rows = []
    for D in ((128,) if quick else (128, 64)):
        for N in ((4096,) if quick else (1024, 4096, 16384)):
            B, H = 16384 // N, 2048 // D
            for causal in ((False,) if quick else (False, True)):
                dev, bf = "cuda", torch.bfloat16
                q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=bf, requires_grad=True) for _ in range(3))
                do = torch.randn(B, H, N, D, device=dev, dtype=bf)
                torch._dynamo.reset()  # every shape compiled afresh: no recompile limit across rows
                counters.clear()
                contenders = {}
                for name, fn in fns.items():
                    compiled = torch.compile(fn, fullgraph=True, mode=mode)

                    def step(compiled=compiled):
                        return torch.autograd.grad(compiled(q, k, v, causal), (q, k, v), do)
                    contenders[name] = step
                for step in contenders.values():  # CUDA graphs record on the first calls
                    for _ in range(3 if graphs else 1):
                        step()
                got = [g.clone() for g in contenders["tkc"]()]
                want = contenders["SDPA flash"]()
                for g, w in zip(got, want):
                    err = (g.float() - w.float()).abs().max().item()
                    assert err <= 3e-2 * max(1.0, w.abs().max().item()), err
                t = in_turns(contenders, runs)
                hosts = ", ".join(f"{n} {host_time(fn, 20) * 1e6:.0f}" for n, fn in contenders.items())
                notes = "tkc: tkc.ops.attention; each compiled with fullgraph=True" + \
                    (", mode=reduce-overhead" if graphs else "")
                notes += f"; host us a step: {hosts}"
                if graphs and counters["inductor"]["cudagraph_skips"]:
                    notes += f"; CUDA graphs skipped {counters['inductor']['cudagraph_skips']} times"
                f = 3.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0)
                rows.append(Row("attention fwd+bwd, torch.compile" + (" + CUDA graphs" if graphs else ""),
                                f"B={B} H={H} N={N} D={D}" + (", causal" if causal else ""), "TFLOP/s",
                                {n: f / s / 1e12 for n, s in t.items()}, notes=notes))
                del contenders
                torch.cuda.empty_cache()
    return rows


def shapes_of(quick: bool, only: set[str]) -> list[tuple[str, int, int, int, int, int]]:
    if quick:
        return [("long", 8, 16, 16, 2048, 128), ("long", 8, 32, 32, 2048, 64)]
    out = []
    if "long" in only:
        for D, H in ((128, 16), (64, 32)):
            out += [("long", 16384 // N, H, H, N, D) for N in (512, 1024, 2048, 4096, 8192, 16384)]
    if "short" in only:
        out += [("short", 16, 16, 16, N, 128) for N in (768, 1024, 1536, 2048, 3072)]
    if "gqa" in only:
        out += [("gqa", 4, 32, 8, 4096, 128)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one shape per head dim, not causal")
    ap.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    ap.add_argument("--only", default="long,short,gqa",
                    help="comma-separated groups: long, short, gqa, varlen, e2e, e2e-graphs")
    ap.add_argument("--variants", default="", help="more tkc contenders: 'BM=32;stages=3'")
    ap.add_argument("--masks", choices=("both", "causal", "none"), default="both",
                    help="the long and short groups' rows: causal and not (default), or one of them")
    ap.add_argument("--sources", default="", help="tkc contenders from other copies of the example: 'old=old.tk'")
    args = ap.parse_args()
    sources = {n.strip(): Path(p.strip()) for n, p in (part.split("=") for part in args.sources.split(";") if part)}
    if not torch.cuda.is_available():
        sys.exit("benchmarks/attn_train.py times kernels on a CUDA GPU; torch sees none here")
    from harness import append_results, table

    only = set(args.only.split(","))
    masks = {"both": (False, True), "causal": (True,), "none": (False,)}[args.masks]
    rows = rows_for(shapes_of(args.quick, only), (False,) if args.quick else masks,
                    parse_variants(args.variants), 30 if args.quick else 60, sources)
    if "varlen" in only:
        rows += varlen_rows(30 if args.quick else 60, args.quick)
    if "e2e" in only:
        rows += e2e_rows(30 if args.quick else 60, args.quick)
    if "e2e-graphs" in only:
        rows += e2e_rows(30 if args.quick else 60, args.quick, graphs=True)
    print(table(rows))
    if not args.no_record:
        command = "python benchmarks/attn_train.py" + (" --quick" if args.quick else "")
        if args.only != "long,short,gqa":
            command += f" --only {args.only}"
        if args.masks != "both":
            command += f" --masks {args.masks}"
        if args.variants:
            command += f" --variants '{args.variants}'"
        if args.sources:
            command += f" --sources '{args.sources}'"
        append_results(ROOT / "benchmarks" / "RESULTS.md", command, rows)


if __name__ == "__main__":
    main()
