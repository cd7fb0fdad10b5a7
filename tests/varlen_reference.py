"""Attention over packed sequences (``cu_seqlens``) in float64 torch, one sequence at a time,
as the tests of varlen_attn_train.tk and of ``tkc.ops.varlen_attention`` check them: random
ragged lengths, packed inputs, and the reference's output, log-sum-exp and gradients."""

from __future__ import annotations

import torch


def ragged_lengths(seed: int, count: int, longest: int) -> list[int]:
    """``count`` lengths from 0 to ``longest``, one of them 0, one 1 and one ``longest``."""
    g = torch.Generator().manual_seed(seed)
    rest = torch.randint(2, longest, (max(count - 3, 0),), generator=g).tolist()
    lengths = [0, 1, longest, *rest]
    return [lengths[i] for i in torch.randperm(len(lengths), generator=g).tolist()]


def packed(seed: int, lengths: list[int], H: int, KVH: int, D: int) -> tuple:
    """bf16 q ``[T, H, D]``, k and v ``[T, KVH, D]``, dO ``[T, H, D]`` and int32 cu_seqlens."""
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
    T = int(cu[-1])
    q = torch.randn(T, H, D, generator=g).bfloat16()
    k, v = (torch.randn(T, KVH, D, generator=g).bfloat16() for _ in range(2))
    do = torch.randn(T, H, D, generator=g).bfloat16()
    return q, k, v, do, cu


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, cu: torch.Tensor,
              causal: bool, scale: float) -> tuple:
    """O ``[T, H, D]``, lse ``[H, T]`` and the gradients of q, k, v, in float64 on q's device: each
    sequence's attention on its own (kv heads repeated over their groups), ``causal`` in its own
    positions."""
    q, k, v = (x.double().requires_grad_() for x in (q, k, v))
    G = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for s in range(len(cu) - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        qs = q[a:b].transpose(0, 1)
        ks, vs = (x[a:b].transpose(0, 1).repeat_interleave(G, 0) for x in (k, v))
        sc = qs @ ks.transpose(-1, -2) * scale
        if causal:
            sc = sc.masked_fill(torch.ones(b - a, b - a, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        outs.append((torch.softmax(sc, -1) @ vs).transpose(0, 1))
        lses.append(torch.logsumexp(sc, -1))
    o, lse = torch.cat(outs), torch.cat(lses, 1)
    o.backward(do.double())
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def assert_gradients_close(got: tuple, want: tuple) -> None:
    """dQ, dK, dV against the reference's: bf16 operands (P, dS, dO) with f32 accumulation,
    a few bf16 ulps of the largest."""
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=2e-2, atol=2e-2 * max(1.0, w.abs().max().item()))


def assert_padding_gets_zero_gradients(tokens: int, lengths: list[int], H: int, D: int, device: str = "cpu") -> None:
    """A padded batch: ``tokens`` tokens, sequences of ``lengths`` packed from the first; the
    padding after them (finite values of its own, large) gets zero dQ, dK and dV through
    ``tkc.ops.varlen_attention``, and the sequences' gradients are finite and not all zero, even
    where the output rows the forward did not write hold NaN."""
    import tkc.ops

    end = sum(lengths)
    q, k, v = (torch.randn(tokens, H, D, dtype=torch.bfloat16, device=device) for _ in range(3))
    for t in (q, k, v):
        t[end:] *= 1000
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    cu = torch.tensor(offsets, dtype=torch.int32, device=device)
    o = tkc.ops.varlen_attention(q, k, v, cu, max(lengths))
    o.data[end:] = float("nan")  # the output rows the forward leaves alone hold whatever memory did
    g = torch.randn_like(o)
    g[end:] = 0
    for name, d in zip(("dq", "dk", "dv"), torch.autograd.grad(o, (q, k, v), g)):
        assert d[end:].eq(0).all(), name
        assert d[:end].isfinite().all() and d[:end].abs().sum() > 0, name
