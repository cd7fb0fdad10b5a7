"""``varlen_attention``: attention over packed sequences of different lengths (``cu_seqlens``,
flash_attn_varlen_func's interface) through varlen_attn_train.tk, forward and backward.

Three operators, one per kernel of varlen_attn_train.tk (``torch.ops.tkc.varlen_attn_fwd``,
``varlen_attn_bwd_pre``, ``varlen_attn_bwd``), the whole backward as one
(``varlen_attn_backward``, which a traced backward calls), and :func:`varlen_attention`, which
checks its arguments, picks the kernels' tile sizes by head dim (attention's) and calls the
forward operator, whose autograd runs the two backward kernels.  Every part runs a tkc kernel; none
falls back to torch.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

from tkc.errors import TkcUsageError
from tkc.kernel import load
from tkc.ops import checks
from tkc.ops.attention import TILES, kernel_arguments, no_double_backward
from tkc.ops.kernel_op import call, custom_op, register_autograd, through_dispatcher
from tkc.ops.kernels import path

__all__ = ["varlen_attention"]

_FILE = path("varlen_attn_train.tk")
_PRE_BM = 64

def _fwd_check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float, max_len: int,
               **consts: Any) -> None:
    """The forward operator's arguments; ``cu_seqlens`` and ``max_seqlen`` too where the offsets
    are values on the host (not on a GPU, and not a fake tensor ``torch.compile`` traces with):
    in the operator, so a compiled graph checks them as eager calls do."""
    kernel_arguments("varlen_attn_fwd", q, k, v, cu, scale, max_len)
    if cu.device.type == "cpu" and not is_fake(cu):
        _check_offsets([int(c) for c in cu.tolist()], q.shape[0], int(max_len))


def _padded_rows(dims: dict[str, Any]) -> Any:
    """lse's and delta's rows: every token's, and 128 a sequence, so that each sequence starts at
    a multiple of 128 (varlen_attn_train.tk's ``rows_at``); a multiple of 128 itself, so that a
    row of them is a multiple of 16 bytes, as TMA's strides must be.  Allocated as zeros: rows
    no sequence owns are never written."""
    return 128 * ((dims["T"] + 127) // 128 + dims["S1"] - 1)


_fwd = custom_op("tkc::varlen_attn_fwd", load(_FILE, "varlen_attn_fwd"), consts={"BM": 128, "BN": 128},
                 const_args=("D", "BM", "BN", "causal"), check=_fwd_check, dims={"TL": _padded_rows},
                 zeroed=("lse",))
_bwd_pre = custom_op("tkc::varlen_attn_bwd_pre", load(_FILE, "varlen_attn_bwd_pre"), consts={"BM": _PRE_BM},
                     const_args=("D", "BM"), dims={"TL": _padded_rows}, zeroed=("delta",))


def _bwd_check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
               delta: torch.Tensor, cu: torch.Tensor, *more: Any, **consts: Any) -> None:
    """The backward operator's arguments: attention's, and lse and delta in the forward's layout
    (each sequence's rows from a multiple of 128: ``_padded_rows``), not one row a token."""
    kernel_arguments("varlen_attn_bwd", q, k, v, do, lse, delta, cu, *more)
    need = _padded_rows({"T": q.shape[0], "S1": cu.shape[0]})
    for name, t in (("lse", lse), ("delta", delta)):
        if t.dim() == 2 and t.shape[1] < need:
            raise TkcUsageError(f"torch.ops.tkc.varlen_attn_bwd: {name} has {t.shape[1]} rows a head; the "
                                f"forward's layout has {need} (each sequence's rows from a multiple of 128): pass "
                                f"the lse varlen_attn_fwd returned and the delta varlen_attn_bwd_pre returned")


_bwd = custom_op("tkc::varlen_attn_bwd", load(_FILE, "varlen_attn_bwd"), consts={"BM": 64, "BN": 128},
                 const_args=("D", "BM", "BN", "causal"), check=_bwd_check)


def _check_offsets(cu: list[int], tokens: int, max_seqlen: int) -> None:
    """cu_seqlens from 0 up to at most the token count, never down, no sequence
    longer than max_seqlen: checked where the offsets are on the host (on a GPU reading them
    would wait for the device; there they are the caller's promise, as in flash-attn)."""
    bad = next((i for i in range(1, len(cu)) if cu[i] < cu[i - 1]), None)
    if cu[0] != 0 or cu[-1] > tokens or bad is not None:
        what = (f"cu_seqlens[{bad}] = {cu[bad]} is below cu_seqlens[{bad - 1}] = {cu[bad - 1]}" if bad is not None
                else f"they run from {cu[0]} to {cu[-1]}")
        raise TkcUsageError(f"tkc.ops.varlen_attention: cu_seqlens must rise from 0 to at most the {tokens} tokens; "
                            f"{what}")
    longest = max(b - a for a, b in zip(cu, cu[1:]))
    if longest > max_seqlen:
        raise TkcUsageError(f"tkc.ops.varlen_attention: max_seqlen is {max_seqlen}, but a sequence has {longest} "
                            f"tokens (pass the longest length)")


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_seqlen: int, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Attention of each of several sequences packed one after another: bf16 ``q`` of shape
    ``[T, H, D]`` and ``k``, ``v`` of ``[T, KVH, D]`` (``T`` tokens in all; grouped-query
    attention when ``KVH < H``: query head ``h`` reads kv head ``h // (H // KVH)``), sequence
    ``s`` being tokens ``cu_seqlens[s]`` to ``cu_seqlens[s + 1] - 1`` (an int32 tensor of the
    sequence count plus one, from 0 to ``T``, on the tensors' device; sequences may be empty)
    and ``max_seqlen`` (an int) at least the longest one's length.  ``D`` 64 or 128, ``scale``
    ``1/sqrt(D)`` by default; ``causal`` masks keys after the query's position in its sequence.
    ``cu_seqlens`` and ``max_seqlen`` are checked when ``cu_seqlens`` is a CPU tensor (under
    ``torch.compile`` too), not on a GPU.
    Returns ``[T, H, D]``.  Forward and backward run the tkc kernels of varlen_attn_train.tk
    (tkc/ops/kernels); tokens past ``cu_seqlens[-1]`` are not attended to, their output is not
    written and their gradients are zero."""
    checks.dtype("varlen_attention", torch.bfloat16, q=q, k=k, v=v)
    checks.dtype("varlen_attention", torch.int32, cu_seqlens=cu_seqlens)
    checks.device("varlen_attention", q=q, k=k, v=v, cu_seqlens=cu_seqlens)
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.rank("varlen_attention", name, t, "three dims [tokens, heads, D]", t.dim() == 3)
    checks.rank("varlen_attention", "cu_seqlens", cu_seqlens, "one dim of at least two offsets",
                cu_seqlens.dim() == 1 and cu_seqlens.shape[0] >= 2)
    checks.same("varlen_attention", "k and v must have one shape", ("k's shape", tuple(k.shape)),
                ("v's", tuple(v.shape)))
    for axis, what in ((0, "token count"), (2, "head dim")):
        checks.same("varlen_attention", f"q and k must have one {what}", ("q's", q.shape[axis]), ("k's", k.shape[axis]))
    D = q.shape[2]
    checks.heads("varlen_attention", q.shape[1], k.shape[1])
    causal = checks.flag("varlen_attention", "causal", causal)
    if D not in TILES:
        raise TkcUsageError(f"tkc.ops.varlen_attention: the head dim is {D}; its kernels take "
                            f"{' or '.join(map(str, TILES))}")
    if isinstance(max_seqlen, (torch.Tensor, bool)) or not isinstance(max_seqlen, numbers.Integral) \
            or not 1 <= max_seqlen < 2**31 - 256:
        # (the pre-pass's grid covers max_seqlen + 256 rows a sequence: lse's padding)
        raise TkcUsageError(f"tkc.ops.varlen_attention: max_seqlen is the longest sequence's length, an int "
                            f"from 1 to 2**31 - 257, got {max_seqlen!r}")
    scale = checks.scale("varlen_attention", scale, 1.0 / math.sqrt(D))
    (bm, bn), _ = TILES[D]
    o, _lse = call(_fwd, q.contiguous(), k.contiguous(), v.contiguous(), cu_seqlens.contiguous(), scale,
                   int(max_seqlen), D=D, BM=bm, BN=bn, causal=causal)
    return o


def _setup(ctx: Any, inputs: tuple, output: tuple, keyword_only_inputs: dict | None = None) -> None:
    q, k, v, cu, ctx.scale, ctx.max_len = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu)
    consts = keyword_only_inputs or {}
    ctx.D, ctx.causal = consts.get("D", q.shape[-1]), consts.get("causal", False)
    ctx.mark_non_differentiable(lse)


def _gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
               cu: torch.Tensor, do: torch.Tensor, scale: float, max_len: int, D: int,
               causal: bool) -> tuple[torch.Tensor, ...]:
    """dQ (in q's dtype), dK and dV: the pre-pass, the backward kernel (dQ summed in f32), dQ
    cast, and the rows of no sequence zeroed."""
    _, (bm, bn) = TILES[D]
    # Tokens past cu_seqlens[-1] belong to no sequence: the forward wrote no output row for them
    # (the pre-pass gives every row past a sequence's end delta 0, whatever o holds there), the
    # backward writes none of their dK and dV rows (dQ's are zeros it adds to), and their
    # gradient is zero.  Masked on the device, so that the backward reads no offset back to the
    # host.
    past = torch.arange(q.shape[0], device=q.device) >= cu[-1]
    delta = call(_bwd_pre, o, do, cu, max_len, D=D, BM=_PRE_BM)
    dq, dk, dv = call(_bwd, q, k, v, do, lse, delta, cu, scale, max_len, D=D, BM=bm, BN=bn, causal=causal)
    dk.masked_fill_(past[:, None, None], 0)
    dv.masked_fill_(past[:, None, None], 0)
    return dq.to(q.dtype), dk, dv


# The whole backward as one operator for graphs, as attention's (tkc/ops/attention.py).
@torch.library.custom_op("tkc::varlen_attn_backward", mutates_args=())
def _backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                 cu: torch.Tensor, do: torch.Tensor, scale: float, max_len: int, *, D: int,
                 causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _gradients(q, k, v, o, lse, cu, do, scale, max_len, D, causal)


_backward_op.register_fake(_gradients)  # as it runs: attention's


def _backward(ctx: Any, do: torch.Tensor, _dlse: torch.Tensor | None) -> tuple:
    q, k, v, o, lse, cu = ctx.saved_tensors
    do = do.contiguous()
    if through_dispatcher():  # traced: one operator
        dq, dk, dv = _backward_op(q, k, v, o, lse, cu, do, ctx.scale, ctx.max_len, D=ctx.D, causal=ctx.causal)
    else:
        dq, dk, dv = _gradients(q, k, v, o, lse, cu, do, ctx.scale, ctx.max_len, ctx.D, ctx.causal)
    return dq, dk, dv, None, None, None


register_autograd(_fwd, _backward, _setup)
register_autograd(_bwd, *no_double_backward("varlen_attention"))
register_autograd(_bwd_pre, *no_double_backward("varlen_attention"))
_twice, _no_context = no_double_backward("varlen_attention")
_backward_op.register_autograd(_twice, setup_context=_no_context)
