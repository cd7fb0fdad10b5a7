"""``matmul``: ``a @ b`` through the shipped GEMM kernel, forward and backward.

``torch.ops.tkc.matmul`` is gemm.tk's operator (``[M, K] @ [K, N]``, bf16, fp32
accumulation); :func:`matmul` takes ``a`` with any leading dims (flattened to rows) and a
2-D ``b``, like a linear layer.  Backward runs the same kernel: ``da = g @ b.T`` and
``db = a.T @ g`` (the transposes made contiguous by torch).
"""

from __future__ import annotations

from typing import Any

import torch

from tkc.kernel import load
from tkc.ops import checks
from tkc.ops.kernel_op import MISS, call, custom_op, planned, register_autograd
from tkc.ops.kernels import path

__all__ = ["matmul"]

_BF16 = torch.bfloat16

_matmul = custom_op("tkc::matmul", load(path("gemm.tk")))


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for a bf16 ``a`` of shape ``[..., M, K]`` and a bf16 ``b`` of ``[K, N]``,
    accumulated in fp32, through the tkc kernel ``gemm`` (tkc/ops/kernels/gemm.tk), whose
    backward runs it too."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        checks.dtype("matmul", _BF16, a=a, b=b)
    if a.dim() == 2:  # arguments like an earlier call's passed the checks below
        c = planned(_matmul, (a, b), {})
        if c is not MISS:
            return c
    if a.dtype is not _BF16 or b.dtype is not _BF16:
        checks.dtype("matmul", _BF16, a=a, b=b)
    checks.device("matmul", a=a, b=b)
    if a.dim() < 2 or b.dim() != 2 or a.shape[-1] != b.shape[0]:  # checked cheaply, worded on failure
        checks.rank("matmul", "a", a, "at least two dims", a.dim() >= 2)
        checks.rank("matmul", "b", b, "two dims (a batch of b is not supported)", b.dim() == 2)
        checks.same("matmul", "the inner dims must agree", ("a's last dim", a.shape[-1]), ("b's first", b.shape[0]))
    if a.dim() == 2:  # rows already: no view on either side (each costs a microsecond or two of host time)
        return call(_matmul, a.contiguous(), b.contiguous())
    rows = a.reshape(-1, a.shape[-1]).contiguous()
    return call(_matmul, rows, b.contiguous()).view(*a.shape[:-1], b.shape[1])


def _setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx: Any, g: torch.Tensor) -> tuple:
    a, b = ctx.saved_tensors
    g = g.contiguous()
    da = call(_matmul, g, b.t().contiguous()) if ctx.needs_input_grad[0] else None
    db = call(_matmul, a.t().contiguous(), g) if ctx.needs_input_grad[1] else None
    return da, db


register_autograd(_matmul, _backward, _setup)
