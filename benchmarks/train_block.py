"""A small Llama-style model trained with ``tkc.ops``, beside the same model on torch's ops.

    python benchmarks/train_block.py [--steps 200] [--no-record]     # a GPU: the recorded run
    python benchmarks/train_block.py --tiny --steps 3 --no-record    # the CPU: the interpreter

Each block: RMSNorm, q/k/v projections with grouped-query attention (8 query heads over 2 KV
heads, head dim 128), rotary embeddings (plain torch), causal attention, the output projection
and a SwiGLU MLP (torch matmuls), residuals around both halves; an embedding, two blocks, a
final RMSNorm and the vocabulary head around them.  The task is next-token prediction on
sequences drawn from a fixed random Markov chain (each token has a few likely successors), so
the loss falls quickly towards the chain's entropy.

Three models start from the same weights and see the same batches:

* ``tkc``: ``tkc.ops.rms_norm`` and ``tkc.ops.attention`` (forward and backward kernels),
  under ``torch.compile(fullgraph=True, mode="reduce-overhead")`` (CUDA graphs);
* ``torch``: ``F.rms_norm`` and SDPA with ``enable_gqa``, compiled the same way;
* ``torch eager``: the torch model without compiling, whose distance from the compiled one
  is the bf16 noise two correct implementations show.

It prints the loss curves' largest gaps and the time a step of each compiled model takes,
writes ``benchmarks/train_block.svg`` (the curves) and records a section in RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.append(str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import tkc.ops  # noqa: E402


@dataclass(frozen=True)
class Config:
    vocab: int = 4096
    dim: int = 1024
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 128
    hidden: int = 2816
    layers: int = 2
    batch: int = 8
    seq: int = 1024
    lr: float = 1e-3
    eps: float = 1e-6


#: Small enough for the interpreter: a sequence of 40 tokens leaves a tail in every tile.
TINY = Config(vocab=64, dim=128, heads=2, kv_heads=1, head_dim=64, hidden=256, layers=1, batch=1, seq=40, lr=1e-2)


def rope_tables(cfg: Config, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, cfg.head_dim, 2, device=device).float() / cfg.head_dim))
    ang = torch.arange(cfg.seq, device=device).float()[:, None] * inv[None, :]
    return ang.cos().bfloat16(), ang.sin().bfloat16()


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` [B, H, N, D] on halves (the Llama layout)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def norm(x: torch.Tensor, w: torch.Tensor, eps: float, use_tkc: bool) -> torch.Tensor:
    if use_tkc:
        return tkc.ops.rms_norm(x, w, eps)
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, use_tkc: bool) -> torch.Tensor:
    if use_tkc:
        return tkc.ops.attention(q, k, v, causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


class Block(nn.Module):
    def __init__(self, cfg: Config, use_tkc: bool):
        super().__init__()
        self.cfg, self.use_tkc = cfg, use_tkc
        hd = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.heads * hd, cfg.dim, bias=False)
        self.w1 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w2 = nn.Linear(cfg.hidden, cfg.dim, bias=False)
        self.n1 = nn.Parameter(torch.ones(cfg.dim))
        self.n2 = nn.Parameter(torch.ones(cfg.dim))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        B, N, _ = x.shape
        h = norm(x, self.n1, cfg.eps, self.use_tkc)
        q = self.wq(h).view(B, N, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = self.wk(h).view(B, N, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.wv(h).view(B, N, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        a = attend(rope(q, cos, sin), rope(k, cos, sin), v.contiguous(), self.use_tkc)
        x = x + self.wo(a.transpose(1, 2).reshape(B, N, -1))
        h = norm(x, self.n2, cfg.eps, self.use_tkc)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Model(nn.Module):
    def __init__(self, cfg: Config, use_tkc: bool):
        super().__init__()
        self.cfg, self.use_tkc = cfg, use_tkc
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, use_tkc) for _ in range(cfg.layers))
        self.nf = nn.Parameter(torch.ones(cfg.dim))
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = self.head(norm(x, self.nf, self.cfg.eps, self.use_tkc))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def models(cfg: Config, device: str, seed: int = 0) -> dict[str, Model]:
    """The tkc model and the torch model with the same bf16 weights."""
    torch.manual_seed(seed)
    ref = Model(cfg, use_tkc=False).to(device=device, dtype=torch.bfloat16)
    ours = Model(cfg, use_tkc=True).to(device=device, dtype=torch.bfloat16)
    ours.load_state_dict(ref.state_dict())
    return {"tkc": ours, "torch": ref}


def batches(cfg: Config, steps: int, device: str, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Token sequences of a random Markov chain: each token's successor is one of 4 tokens
    fixed per token, with probabilities 0.7, 0.2, 0.07, 0.03."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, cfg.vocab, (cfg.vocab, 4), generator=g)
    probs = torch.tensor([0.7, 0.2, 0.07, 0.03])
    rows = steps * cfg.batch
    picks = torch.multinomial(probs, rows * cfg.seq, replacement=True, generator=g).view(rows, cfg.seq)
    seqs = torch.empty(rows, cfg.seq + 1, dtype=torch.long)
    seqs[:, 0] = torch.randint(0, cfg.vocab, (rows,), generator=g)
    for t in range(cfg.seq):
        seqs[:, t + 1] = succ[seqs[:, t], picks[:, t]]
    seqs = seqs.view(steps, cfg.batch, cfg.seq + 1).to(device)
    return [(s[:, :-1].contiguous(), s[:, 1:].contiguous()) for s in seqs]


def train(model: Model, step_fn, data: list, cfg: Config, device: str) -> tuple[list[float], float]:
    """Losses of each step, and seconds a step over the second half (after compiling)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    cos, sin = rope_tables(cfg, device)
    losses, start = [], None
    for i, (x, y) in enumerate(data):
        if i == len(data) // 2:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        loss = step_fn(x, y, cos, sin)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    if device == "cuda":
        torch.cuda.synchronize()
    timed = len(data) - len(data) // 2
    return losses, (time.perf_counter() - start) / max(timed, 1)


def run(cfg: Config, steps: int, device: str, compile_mode: str | None) -> dict[str, tuple[list[float], float]]:
    """Loss curves and step times of the tkc model and the torch model (compiled with
    ``fullgraph=True`` and ``compile_mode`` unless it is None), and of the torch model eager."""
    data = batches(cfg, steps, device)
    out = {}
    for name, model in models(cfg, device).items():
        fn = model if compile_mode is None else torch.compile(model, fullgraph=True, mode=compile_mode)
        out[name] = train(model, fn, data, cfg, device)
    if compile_mode is not None:
        eager = models(cfg, device)["torch"]
        out["torch eager"] = train(eager, eager, data, cfg, device)
    return out


def svg(curves: dict[str, list[float]], path: Path) -> None:
    """The loss curves as a small SVG line chart (no plotting library needed)."""
    w, h, pad = 640, 360, 40
    hi = max(max(c) for c in curves.values())
    lo = min(min(c) for c in curves.values())
    n = max(len(c) for c in curves.values())
    colors = ["#d62728", "#1f77b4", "#7f7f7f"]

    def xy(i: int, v: float) -> str:
        x = pad + (w - 2 * pad) * i / max(n - 1, 1)
        y = h - pad - (h - 2 * pad) * (v - lo) / max(hi - lo, 1e-9)
        return f"{x:.1f},{y:.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
             f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
             f'<text x="{pad}" y="{pad - 8}">loss ({lo:.2f} to {hi:.2f}) over {n} steps</text>']
    for k, (name, c) in enumerate(curves.items()):
        pts = " ".join(xy(i, v) for i, v in enumerate(c))
        color = colors[k % len(colors)]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>')
        parts.append(f'<text x="{w - pad - 120}" y="{pad + 16 * k}" fill="{color}">{name}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--tiny", action="store_true", help="the interpreter's tiny model (CPU tensors)")
    ap.add_argument("--no-record", action="store_true", help="print only (no RESULTS.md section, no SVG)")
    args = ap.parse_args()
    cfg = TINY if args.tiny else Config()
    device = "cpu" if args.tiny else "cuda"
    res = run(cfg, args.steps, device, None if args.tiny else "reduce-overhead")
    curves = {name: losses for name, (losses, _) in res.items()}
    gap = max(abs(a - b) for a, b in zip(curves["tkc"], curves["torch"]))
    lines = [f"{name}: loss {c[0]:.4f} -> {c[-1]:.4f}, {res[name][1] * 1e3:.2f} ms a step"
             for name, c in curves.items()]
    lines.append(f"largest |tkc - torch| loss gap over {args.steps} steps: {gap:.4f}")
    if "torch eager" in curves:
        noise = max(abs(a - b) for a, b in zip(curves["torch eager"], curves["torch"]))
        lines.append(f"largest |torch eager - torch compiled| gap (bf16 noise): {noise:.4f}")
    print("\n".join(lines))
    if args.no_record:
        return
    from harness import Row, append_results

    svg(curves, ROOT / "benchmarks" / "train_block.svg")
    shape = (f"{cfg.layers} blocks, dim {cfg.dim}, {cfg.heads}/{cfg.kv_heads} heads, D {cfg.head_dim}, "
             f"batch {cfg.batch} x {cfg.seq} tokens")
    rows = [Row("train_block: a step, forward + backward + AdamW", shape, "s",
                {name: t for name, (_, t) in res.items()})]
    append_results(ROOT / "benchmarks" / "RESULTS.md", f"python benchmarks/train_block.py --steps {args.steps}", rows,
                   "\n".join(f"- {x}" for x in lines) + "\n- curves: benchmarks/train_block.svg")

if __name__ == "__main__":
    main()
