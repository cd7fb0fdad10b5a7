"""The argument checks the shipped operators share, in tkc's words, before any kernel runs.

Owns: what a shipped operator accepts beyond its kernel's signature (the dtype its kernel
was written for, ranks, the dims two arguments must share), worded for the operator's own
argument names.  Must not: convert or copy a tensor (the operators do, visibly).
"""

from __future__ import annotations

from typing import Any

from tkc.errors import TkcUsageError


def dtype(op: str, want: Any, **tensors: Any) -> None:
    """Every tensor has dtype ``want`` (a torch dtype)."""
    for name, t in tensors.items():
        if t.dtype != want:
            raise TkcUsageError(f"tkc.ops.{op}: {name} is {t.dtype}, but its kernel takes {want} "
                                f"(convert with .to({want}))")


def rank(op: str, name: str, t: Any, ranks: str, ok: bool) -> None:
    if not ok:
        raise TkcUsageError(f"tkc.ops.{op}: {name} must have {ranks}, got shape {tuple(t.shape)}")


def same(op: str, what: str, a: tuple[str, Any], b: tuple[str, Any]) -> None:
    """``a`` and ``b``, each (description, size), agree."""
    if a[1] != b[1]:
        raise TkcUsageError(f"tkc.ops.{op}: {what}: {a[0]} is {a[1]} but {b[0]} is {b[1]}")
