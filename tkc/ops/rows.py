"""Operators over the last dim of a tensor: ``rms_norm``, ``layer_norm`` and ``softmax``.

Each is the operator of a shipped kernel over rows (``torch.ops.tkc.rms_norm`` and the
others take ``[M, N]``: the kernel's signature), and a function taking any leading dims,
which it flattens to rows.  Forward and backward run tkc kernels: the backward kernels of
rows_bwd.tk (``torch.ops.tkc.rms_norm_backward``, ``layer_norm_backward`` and, for rows of
exactly one block, ``layer_norm_backward_block``, ``softmax_backward``;
``rms_norm_weight_grad`` and ``layer_norm_weight_grad`` for the weights of rows longer than
8192), whose tile sizes follow the rows (:func:`backward_tiles`).  The
norms' backward computes each row's statistics again from x, so the forwards write nothing
for it.
A second-order gradient (``create_graph=True``) takes the same formulas in fp32 torch ops,
which autograd can differentiate again.
"""

from __future__ import annotations

from typing import Any

import torch

from tkc.kernel import load
from tkc.ops import checks
from tkc.ops.kernel_op import MISS, call, custom_op, planned, register_autograd, without_gradient
from tkc.ops.kernels import path
from tkc.ops.kernels.rmsnorm import rmsnorm

__all__ = ["layer_norm", "rms_norm", "softmax"]

_rms_norm = custom_op("tkc::rms_norm", rmsnorm)
_layer_norm = custom_op("tkc::layer_norm", load(path("layernorm.tk")))
_softmax = custom_op("tkc::softmax", load(path("softmax.tk")))
_BWD = path("rows_bwd.tk")
_TILES = ("ROWS", "BN", "SBN", "warps", "wgrad")
_rms_norm_bwd = custom_op("tkc::rms_norm_backward", load(_BWD, "rmsnorm_bwd"), const_args=_TILES)
_layer_norm_bwd = custom_op("tkc::layer_norm_backward", load(_BWD, "layernorm_bwd"), const_args=_TILES)
_layer_norm_bwd_block = custom_op("tkc::layer_norm_backward_block", load(_BWD, "layernorm_bwd_block"),
                                  const_args=("ROWS", "BN", "warps"))
_rms_norm_wgrad = custom_op("tkc::rms_norm_weight_grad", load(_BWD, "rmsnorm_wgrad"))
_layer_norm_wgrad = custom_op("tkc::layer_norm_weight_grad", load(_BWD, "layernorm_wgrad"))
_softmax_bwd = custom_op("tkc::softmax_backward", load(_BWD, "softmax_bwd"), const_args=("BN",))


_BF16 = torch.bfloat16


def _rows(op: str, x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 2 and x.is_contiguous():
        return x
    checks.rank(op, "x", x, "at least one dim", x.dim() >= 1)
    return x.reshape(-1, x.shape[-1]).contiguous()


def _shaped(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The rows ``y`` in ``x``'s shape (``y`` itself when ``x`` is rows already: a view costs a
    microsecond or two of host time)."""
    return y if x.dim() == 2 else y.view(*x.shape)


def _weight(op: str, name: str, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if w.device != x.device:
        checks.device(op, x=x, **{name: w})
    if w.dim() != 1 or x.dim() == 0 or w.shape[0] != x.shape[-1]:  # checked cheaply, worded on failure
        checks.rank(op, name, w, "one dim", w.dim() == 1)
        checks.same(op, f"{name} must span x's last dim", (f"{name}'s size", w.shape[0]),
                    ("x's last dim", x.shape[-1] if x.dim() else None))
    return w.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(mean(x**2, -1) + eps) * weight`` over the last dim of a bf16 ``x`` (any
    leading dims) with a bf16 ``weight``; statistics in fp32.  Forward: the tkc kernel
    ``rmsnorm`` (tkc/ops/kernels/rmsnorm.py); backward: ``rmsnorm_bwd`` (tkc/ops/kernels/rows_bwd.tk)."""
    if isinstance(x, torch.Tensor) and x.dim() == 2:  # rows already: like an earlier call's, which passed the checks
        y = planned(_rms_norm, (x, weight, eps), {})
        if y is not MISS:
            return y
    if getattr(x, "dtype", None) is not _BF16 or getattr(weight, "dtype", None) is not _BF16:
        checks.dtype("rms_norm", _BF16, x=x, weight=weight)
    checks.rank("rms_norm", "x", x, "at least one dim", x.dim() >= 1)
    w = _weight("rms_norm", "weight", weight, x)
    return _shaped(call(_rms_norm, _rows("rms_norm", x), w, checks.number("rms_norm", "eps", eps)), x)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim of a bf16 ``x`` (any leading dims), with a bf16 ``weight``
    and ``bias`` (ones and zeros when None); statistics in fp32.  Forward: the tkc kernel
    ``layernorm`` (tkc/ops/kernels/layernorm.tk); backward: ``layernorm_bwd`` (rows_bwd.tk)."""
    if isinstance(x, torch.Tensor) and x.dim() == 2:  # rows already: like an earlier call's, which passed the checks
        y = planned(_layer_norm, (x, weight, bias, eps), {})
        if y is not MISS:
            return y
    checks.dtype("layer_norm", torch.bfloat16, x=x)
    checks.rank("layer_norm", "x", x, "at least one dim", x.dim() >= 1)
    n = x.shape[-1]
    weight = torch.ones(n, dtype=x.dtype, device=x.device) if weight is None else weight
    bias = torch.zeros(n, dtype=x.dtype, device=x.device) if bias is None else bias
    checks.dtype("layer_norm", torch.bfloat16, x=x, weight=weight, bias=bias)
    w, b = _weight("layer_norm", "weight", weight, x), _weight("layer_norm", "bias", bias, x)
    return _shaped(call(_layer_norm, _rows("layer_norm", x), w, b, checks.number("layer_norm", "eps", eps)), x)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of a bf16 ``x`` (any leading dims), in fp32 inside.  Forward:
    the tkc kernel ``softmax`` (tkc/ops/kernels/softmax.tk); backward: ``softmax_bwd`` (rows_bwd.tk)."""
    if isinstance(x, torch.Tensor) and x.dim() == 2:  # rows already: an x like an earlier call's passed the checks
        y = planned(_softmax, (x,), {})
        if y is not MISS:
            return y
    if getattr(x, "dtype", None) is not _BF16:
        checks.dtype("softmax", _BF16, x=x)
    return _shaped(call(_softmax, _rows("softmax", x)), x)


# ------------------------------------------------------------------ autograd
#: The widest row the norms' backward holds in registers (256 threads; wider ones spill).
ONE_BLOCK = 8192
#: Programs the weight-gradient kernels aim at: four an SM of an H100/H200.
_WGRAD_PROGRAMS = 528


def backward_tiles(M: int, N: int) -> dict[str, Any]:
    """The backward kernels' tile sizes for ``M`` rows of ``N``: a row in one block of ``BN``
    columns (``N`` rounded up to 512) up to ``ONE_BLOCK`` columns, and ``ROWS`` rows a
    program, the most of 4-32 that leaves about 256 programs (two an SM of an H100/H200 at 4096
    columns): more rows a program add their dw terms together before the atomic adds, but
    too few programs leave SMs idle (on an H200, RESULTS.md 2026-11-29).  Rows of up to 4096
    take four warps (at 2048 columns LayerNorm's kernel ran 1.28x and RMSNorm's 1.10x eight
    warps, at 4096 1.00-1.03x; at 8192 four warps hold too much a thread).  A longer row is swept
    in blocks of ``SBN`` 1024 (``BN`` 512 keeps the one-block code, which never runs, small),
    four rows a program over four warps (on an H200 at 2048 x 16384, 0.36x the time of 16 rows
    over eight), and its dw is left to the weight-gradient kernels (``wgrad`` False)."""
    if N > ONE_BLOCK:  # one row after another: programs enough to fill the GPU
        return {"ROWS": 4, "BN": 512, "SBN": 1024, "warps": 4, "wgrad": False}
    rows = 4
    while rows < 32 and M >= 512 * rows:
        rows *= 2
    return {"ROWS": rows, "BN": softmax_block(N), "wgrad": True, "warps": 4 if N <= 4096 else 8}


def one_block_tiles(M: int, N: int) -> dict[str, Any] | None:
    """``layernorm_bwd_block``'s constants where LayerNorm's backward takes it (rows of exactly
    one block: ``N`` a multiple of 512, up to ``ONE_BLOCK``; it has no mask past the row's end
    and no sweep path), else None."""
    tiles = backward_tiles(M, N)
    if not tiles["wgrad"] or tiles["BN"] != N:
        return None
    return {k: tiles[k] for k in ("ROWS", "BN", "warps")}


def softmax_block(N: int) -> int:
    """The block a row of ``N`` takes in the backward kernels: ``N`` rounded up to 512, at most
    ``ONE_BLOCK`` (softmax_bwd sweeps longer rows in blocks of that: at 8192, one block ran
    1.13x two of 4096 on an H200)."""
    return min(-(-N // 512) * 512, ONE_BLOCK)


def wgrad_split(M: int, N: int) -> int:
    """How many programs of the weight-gradient kernels share a column strip (128 wide): enough
    for about ``_WGRAD_PROGRAMS`` in all, at least 16 rows each."""
    return max(1, min(-(-M // 16), _WGRAD_PROGRAMS // -(-N // 128)))


def _save_inputs(ctx: Any, inputs: tuple, output: Any) -> None:
    *tensors, ctx.eps = inputs
    ctx.save_for_backward(*tensors)


def _rms_norm_backward(ctx: Any, g: torch.Tensor) -> tuple:
    x, w = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph: a backward autograd can differentiate
        xf, wf, gf = x.float(), w.float(), g.float()
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps)
        gw = gf * wf
        dx = r * (gw - xf * (r * r) * (gw * xf).mean(-1, keepdim=True))
        return dx.to(x.dtype), (gf * xf * r).sum(0).to(w.dtype), None
    g, tiles = g.contiguous(), backward_tiles(*x.shape)
    dx, dw, rstd = call(_rms_norm_bwd, g, x, w, ctx.eps, **tiles)
    if not tiles["wgrad"]:  # rows past one block: dw summed down the columns
        dw = call(_rms_norm_wgrad, g, x, rstd, wgrad_split(*x.shape))
    return dx, dw, None  # dw in f32: autograd casts a gradient to its input's dtype (in C++, sooner)


def _layer_norm_backward(ctx: Any, g: torch.Tensor) -> tuple:
    x, w, b = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph: a backward autograd can differentiate
        xf, gf = x.float(), g.float()
        mean = xf.mean(-1, keepdim=True)
        rstd = torch.rsqrt((xf - mean).pow(2).mean(-1, keepdim=True) + ctx.eps)
        xhat = (xf - mean) * rstd
        gx = gf * w.float()
        dx = rstd * (gx - gx.mean(-1, keepdim=True) - xhat * (gx * xhat).mean(-1, keepdim=True))
        return dx.to(x.dtype), (gf * xhat).sum(0).to(w.dtype), gf.sum(0).to(b.dtype), None
    g, tiles = g.contiguous(), backward_tiles(*x.shape)
    block = one_block_tiles(*x.shape)
    if block is not None:  # rows of exactly one block: the kernel without a mask
        dx, dw, db, _, _ = call(_layer_norm_bwd_block, g, x, w, ctx.eps, **block)
        return dx, dw, db, None
    dx, dw, db, mean, rstd = call(_layer_norm_bwd, g, x, w, ctx.eps, **tiles)
    if not tiles["wgrad"]:  # rows past one block: dw and dbias summed down the columns
        dw, db = call(_layer_norm_wgrad, g, x, mean, rstd, wgrad_split(*x.shape))
    return dx, dw, db, None


def _save_output(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    ctx.save_for_backward(output)


def _softmax_backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
    (y,) = ctx.saved_tensors
    if torch.is_grad_enabled():  # create_graph: a backward autograd can differentiate
        yf, gf = y.float(), g.float()
        return (yf * (gf - (gf * yf).sum(-1, keepdim=True))).to(y.dtype)
    return call(_softmax_bwd, g.contiguous(), y, BN=softmax_block(y.shape[1]))


register_autograd(_rms_norm, _rms_norm_backward, _save_inputs)
register_autograd(_layer_norm, _layer_norm_backward, _save_inputs)
register_autograd(_softmax, _softmax_backward, _save_output)
for _name, _of, _op in (("rms_norm_backward", "rms_norm", _rms_norm_bwd),
                        ("layer_norm_backward", "layer_norm", _layer_norm_bwd),
                        ("layer_norm_backward_block", "layer_norm", _layer_norm_bwd_block),
                        ("softmax_backward", "softmax", _softmax_bwd),
                        ("rms_norm_weight_grad", "rms_norm", _rms_norm_wgrad),
                        ("layer_norm_weight_grad", "layer_norm", _layer_norm_wgrad)):
    register_autograd(_op, *without_gradient(f"torch.ops.tkc.{_name} has no gradient of its own: for gradients "
                                             f"of tkc.ops.{_of}'s gradients, call backward with create_graph=True"))
