"""``attention``: scaled dot-product attention through attn_train.tk, forward and backward.

Three operators, one per kernel of attn_train.tk (``torch.ops.tkc.attn_fwd``,
``attn_bwd_pre``, ``attn_bwd``), the whole backward as one (``attn_backward``, which a traced
backward calls), and :func:`attention`, which checks its arguments, picks the kernels' tile
sizes by head dim and calls the forward operator, whose autograd runs the two backward
kernels: ``delta = rowsum(dO * O)`` with dQ's fp32 accumulator zeroed, then dK and dV per key
block with dQ accumulated through atomic adds (an argument ``attn_bwd`` updates in place).
Every part runs a tkc kernel; none falls back to torch.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tkc.errors import TkcUsageError
from tkc.kernel import load
from tkc.ops import checks
from tkc.ops.kernel_op import call, custom_op, register_autograd, through_dispatcher, without_gradient
from tkc.ops.kernels import path

__all__ = ["attention"]

_FILE = path("attn_train.tk")
#: Tile sizes per head dim: the forward's (BM, BN) and the backward's (BM, BN).
TILES = {64: ((128, 128), (128, 128)), 128: ((128, 128), (64, 128))}
_PRE_BM = 64


def kernel_arguments(op: str, q: torch.Tensor, k: torch.Tensor, *more: Any) -> None:
    """What attn_fwd and attn_bwd (and their varlen forms) take beyond their signatures, checked
    for every call of the operators themselves (``torch.ops.tkc.attn_fwd``): query heads a
    multiple of the kv heads (axis 1 of [B, H, N, D], or of varlen's [T, H, D]) and a
    positive scale (the last of ``more``; varlen's is followed by max_len)."""
    checks.heads(op, q.shape[1] if q.dim() == 4 else q.shape[-2], k.shape[1] if k.dim() == 4 else k.shape[-2])
    checks.scale(op, more[-1] if q.dim() == 4 else more[-2], 1.0)


_fwd = custom_op("tkc::attn_fwd", load(_FILE, "attn_fwd"), consts={"BM": 128, "BN": 128},
                 const_args=("D", "BM", "BN", "causal"), check=lambda *a, **kw: kernel_arguments("attn_fwd", *a))
_bwd_pre = custom_op("tkc::attn_bwd_pre", load(_FILE, "attn_bwd_pre"), consts={"BM": _PRE_BM},
                     const_args=("D", "BM"))
_bwd = custom_op("tkc::attn_bwd", load(_FILE, "attn_bwd"), consts={"BM": 64, "BN": 128},
                 const_args=("D", "BM", "BN", "causal"), check=lambda *a, **kw: kernel_arguments("attn_bwd", *a),
                 accumulates=("dq",))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: float | None = None) -> torch.Tensor:
    """``softmax(scale * q @ k^T) @ v`` for bf16 ``q`` of shape ``[B, H, N, D]`` and ``k``, ``v`` of
    ``[B, KVH, N, D]`` (grouped-query attention when ``KVH < H``: query head ``h`` reads kv head
    ``h // (H // KVH)``), ``D`` 64 or 128, ``scale`` ``1/sqrt(D)`` by default; ``causal`` masks
    keys after the query's position.  Forward and backward run the tkc kernels of
    attn_train.tk (tkc/ops/kernels)."""
    checks.dtype("attention", torch.bfloat16, q=q, k=k, v=v)
    checks.device("attention", q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.rank("attention", name, t, "four dims [B, heads, N, D]", t.dim() == 4)
    checks.same("attention", "k and v must have one shape", ("k's shape", tuple(k.shape)), ("v's", tuple(v.shape)))
    for axis, what in ((0, "batch"), (2, "sequence length"), (3, "head dim")):
        checks.same("attention", f"q and k must have one {what}", ("q's", q.shape[axis]), ("k's", k.shape[axis]))
    D = q.shape[3]
    checks.heads("attention", q.shape[1], k.shape[1])
    causal = checks.flag("attention", "causal", causal)
    if D not in TILES:
        raise TkcUsageError(f"tkc.ops.attention: the head dim is {D}; its kernels take {' or '.join(map(str, TILES))}")
    scale = checks.scale("attention", scale, 1.0 / math.sqrt(D))
    (bm, bn), _ = TILES[D]
    o, _lse = call(_fwd, q.contiguous(), k.contiguous(), v.contiguous(), scale, D=D, BM=bm, BN=bn, causal=causal)
    return o


def _setup(ctx: Any, inputs: tuple, output: tuple, keyword_only_inputs: dict | None = None) -> None:
    q, k, v, ctx.scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    consts = keyword_only_inputs or {}
    ctx.D, ctx.causal = consts.get("D", q.shape[-1]), consts.get("causal", False)
    ctx.mark_non_differentiable(lse)


def _gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
               do: torch.Tensor, scale: float, D: int, causal: bool) -> tuple[torch.Tensor, ...]:
    """dQ (in q's dtype), dK and dV: the pre-pass (which also zeroes dQ's f32 accumulator), the
    backward kernel (dQ summed in f32), dQ cast."""
    _, (bm, bn) = TILES[D]
    delta, dq = call(_bwd_pre, o, do, D=D, BM=_PRE_BM)
    dk, dv = call(_bwd, q, k, v, do, lse, delta, dq, scale, D=D, BM=bm, BN=bn, causal=causal)
    return dq.to(q.dtype), dk, dv


# The whole backward as one operator, for graphs: a compiled backward then calls one operator
# (as SDPA's does) instead of two and inductor's kernel for dQ's cast; each call through
# torch's dispatcher costs tens of microseconds of the host's time, which at 1k tokens bounds
# the training step (benchmarks/RESULTS.md, 2026-11-29).
@torch.library.custom_op("tkc::attn_backward", mutates_args=())
def _backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                 do: torch.Tensor, scale: float, *, D: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                                                  torch.Tensor]:
    return _gradients(q, k, v, o, lse, do, scale, D, causal)


# Faked as it runs: under fake tensors each kernel's operator makes its outputs (and checks its
# arguments) as the real call does, so the strides agree with it.
_backward_op.register_fake(_gradients)


def _backward(ctx: Any, do: torch.Tensor, _dlse: torch.Tensor | None) -> tuple:
    q, k, v, o, lse = ctx.saved_tensors
    do = do.contiguous()
    if through_dispatcher():  # traced: one operator
        dq, dk, dv = _backward_op(q, k, v, o, lse, do, ctx.scale, D=ctx.D, causal=ctx.causal)
    else:
        dq, dk, dv = _gradients(q, k, v, o, lse, do, ctx.scale, ctx.D, ctx.causal)
    return dq, dk, dv, None


def no_double_backward(op: str) -> tuple[Any, Any]:
    """A backward and setup for a backward kernel's operator: gradients of gradients (a second
    ``backward`` through ``create_graph=True``) are refused in ``op``'s words."""
    return without_gradient(f"tkc.ops.{op} has no second-order gradient: its backward kernels are not "
                            f"differentiated again (take gradients of the gradients with torch's attention)")


register_autograd(_fwd, _backward, _setup)
# attn_bwd updates dQ in place, so torch takes no gradient formula for it: differentiating the
# gradients again stops at attn_bwd_pre, whose refusal below says so first.
register_autograd(_bwd_pre, *no_double_backward("attention"))
_twice, _no_context = no_double_backward("attention")
_backward_op.register_autograd(_twice, setup_context=_no_context)
