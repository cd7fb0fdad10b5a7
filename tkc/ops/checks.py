"""The argument checks the shipped operators share, in tkc's words, before any kernel runs.

Owns: what a shipped operator accepts beyond its kernel's signature (the dtype its kernel
was written for, ranks, the dims two arguments must share), worded for the operator's own
argument names.  Must not: convert or copy a tensor (the operators do, visibly).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tkc.errors import TkcUsageError


def dtype(op: str, want: Any, **tensors: Any) -> None:
    """Every one is a tensor of dtype ``want`` (a torch dtype)."""
    for name, t in tensors.items():
        if not hasattr(t, "dtype") or not hasattr(t, "is_cuda"):
            raise TkcUsageError(f"tkc.ops.{op}: {name} must be a torch tensor, got {type(t).__name__}")
        if t.dtype != want:
            raise TkcUsageError(f"tkc.ops.{op}: {name} is {t.dtype}, but its kernel takes {want} "
                                f"(convert with .to({want}))")


def device(op: str, **tensors: Any) -> None:
    """Every one on the first one's device (the kernel runs there and its outputs go there)."""
    (first, t0), *rest = tensors.items()
    for name, t in rest:
        if t.device != t0.device:
            raise TkcUsageError(f"tkc.ops.{op}: {first} and {name} must be on one device, got {t0.device} and "
                                f"{t.device} (move them with .to({str(t0.device)!r}))")


def rank(op: str, name: str, t: Any, ranks: str, ok: bool) -> None:
    if not ok:
        got = f"shape {tuple(t.shape)}" if hasattr(t, "shape") else f"a {type(t).__name__}"
        raise TkcUsageError(f"tkc.ops.{op}: {name} must have {ranks}, got {got}")


def same(op: str, what: str, a: tuple[str, Any], b: tuple[str, Any]) -> None:
    """``a`` and ``b``, each (description, size), agree."""
    if a[1] != b[1]:
        raise TkcUsageError(f"tkc.ops.{op}: {what}: {a[0]} is {a[1]} but {b[0]} is {b[1]}")


def heads(op: str, H: int, KVH: int) -> None:
    """Grouped-query attention's heads: ``H`` query heads, a positive multiple of the ``KVH``
    key/value heads (query head ``h`` reads kv head ``h // (H // KVH)``)."""
    if KVH < 1 or H < 1 or H % KVH:
        raise TkcUsageError(f"tkc.ops.{op}: q's heads ({H}) must be a positive multiple of k's and v's ({KVH})")


def flag(op: str, name: str, value: Any) -> bool:
    """A True/False argument (``causal``): a bool, not anything Python reads as true."""
    if not isinstance(value, (bool, np.bool_)):
        raise TkcUsageError(f"tkc.ops.{op}: {name} is True or False, got {value!r}")
    return bool(value)


def scale(op: str, value: Any, default: float) -> float:
    """The softmax scale: ``default`` for None, else a positive finite number (the kernels scale
    a row's largest score, which stays the largest only for a positive scale, and mask scores
    with -inf, which a scale of 0 turns into NaN)."""
    if value is None:
        return default
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TkcUsageError(f"tkc.ops.{op}: scale must be a positive number, got {value!r}") from None
    if not 0.0 < value < float("inf"):
        raise TkcUsageError(f"tkc.ops.{op}: scale must be a positive number, got {value!r} (its kernels take the "
                            f"row maximum of the scores before scaling them)")
    if not _F32_TINY <= value <= _F32_MAX:
        # the kernels take it as an f32: past these it is inf or 0 (or a subnormal a GPU flushes
        # to 0) there, and the scores NaN
        raise TkcUsageError(f"tkc.ops.{op}: scale must lie within f32's normal range ({_F32_TINY:.7g} to "
                            f"{_F32_MAX:.7g}), got {value!r}")
    return value


_F32_TINY = 1.1754943508222875e-38  # the smallest positive normal f32
_F32_MAX = 3.4028234663852886e38


def number(op: str, name: str, value: Any) -> float:
    """A real number argument (``eps``) as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TkcUsageError(f"tkc.ops.{op}: {name} must be a number, got {type(value).__name__}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TkcUsageError(f"tkc.ops.{op}: {name} must be a number, got {value!r}") from None


def no_gradient(op: str, *tensors: Any) -> None:
    """None of ``tensors`` needs a gradient where one would be recorded: ``op`` has no backward."""
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
        raise TkcUsageError(f"tkc.ops.{op} has no gradient: call it on tensors that need none (.detach()) or "
                            f"under torch.no_grad()")
