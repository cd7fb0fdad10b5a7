"""Runs: the values of a thread's register tile that one vector access moves to or from global memory.

A *run* is a stretch of values ``i .. i+L-1`` of a thread whose tile coordinates differ only
in the last axis, by +1 each, starting at a multiple of ``L`` on every thread; ``L`` is a power
of two and ``L`` elements are at most 16 B (``lower_global`` explains how loads and stores use
them).  This module reads runs off a layout's coordinates, for ``lower_global`` and for the
store plan of ``deferred``, below both.

Must not: emit IR, or know a layout formula (runs come from ``layout.coords``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from tkc.codegen import nvvm
from tkc.codegen.lower_values import bits_type
from tkc.dtypes import DType
from tkc.ir.core import Operation
from tkc.ir.layouts import DistributedLayout
from tkc.ir.types import TensorType, TileType


@lru_cache(maxsize=256)
def vector_runs(layout: DistributedLayout, elem_bytes: int) -> tuple[tuple[int, int], ...]:
    """``(first value, length)`` of each run of ``layout`` for elements of ``elem_bytes``
    bytes, covering the values in order (a value in no longer run is a run of 1).

    Greedy from value 0: each run is the longest power of two ``L`` (``L * elem_bytes <=
    16``) for which, on every thread, values ``i .. i+L-1`` sit at consecutive last-axis
    coordinates of one row, the first a multiple of ``L`` (so the run is ``L`` elements
    aligned relative to the tile origin)."""
    regs, threads = int(layout.regs), int(layout.threads)
    widest = max(nvvm.VECTOR_BYTES // elem_bytes, 1)
    t = np.arange(threads)[:, None]
    coords = [np.broadcast_to(c, (threads, regs)) for c in layout.coords(t, np.arange(regs)[None, :])]
    last, others = coords[-1], coords[:-1]

    def is_run(i: int, n: int) -> bool:
        if i + n > regs:
            return False
        head = last[:, i:i + 1]
        return (bool(np.all(last[:, i:i + n] == head + np.arange(n))) and bool(np.all(head % n == 0))
                and all(bool(np.all(o[:, i:i + n] == o[:, i:i + 1])) for o in others))

    runs, i = [], 0
    while i < regs:
        n = widest
        while n > 1 and not is_run(i, n):
            n //= 2
        runs.append((i, n))
        i += n
    return tuple(runs)


def elem_bytes(dt: DType) -> int:
    """Bytes of one element of ``dt`` as it is held in memory."""
    return bits_type(dt).width // 8


def runs_of(op: Operation, tensor: TensorType, t: object) -> tuple[tuple[int, int], ...] | None:
    """The op's runs (``tensor``: the type of its tensor operand), or None when it has no vector
    access: a scalar, a tile whose last axis is not the tensor's (the last tensor axis is
    squeezed), or one that steps over the last axis (``x[:, 0:D:2]``)."""
    steps = op.attributes.get("steps") or [1]  # gathers and atomics have none
    if not isinstance(t, TileType) or tensor.rank - 1 in (op.squeeze or []) or steps[-1] != 1:
        return None
    runs = vector_runs(t.layout, elem_bytes(tensor.dtype))
    return runs if any(n > 1 for _, n in runs) else None


def vectorized(load: Operation) -> bool:
    """Whether every run of register-tile ``load`` is a vector access (whose words a packed
    tile keeps)."""
    runs = runs_of(load, load.tensor.type, load.result.type)
    return runs is not None and all(n > 1 for _, n in runs)


def private_run_offset(threads: int, first: int, n: int, elem_bytes: int, t: Any) -> Any:
    """Byte offset, in shared bytes where the ``threads`` threads of a layout each keep their own
    values (``hopper.async_load`` / ``hopper.async_read``), of thread ``t``'s run of ``n`` values
    starting at value ``first``: run by run (:func:`vector_runs`), every thread's run side by side,
    so a run is one aligned vector access and a warp's accesses of one run are contiguous.  ``t``
    is a thread index: an int, a numpy array of them, or codegen's ``Sym``."""
    return t * (n * elem_bytes) + threads * first * elem_bytes


def private_offsets(layout: DistributedLayout, elem_bytes: int) -> np.ndarray:
    """:func:`private_run_offset` of every value of every thread (``[threads, regs]``).
    Replicated values are kept once per thread that holds them: nothing is shared, so no thread
    waits for another's copy."""
    threads, regs = int(layout.threads), int(layout.regs)
    out = np.zeros((threads, regs), dtype=np.int64)
    t = np.arange(threads)
    for first, n in vector_runs(layout, elem_bytes):
        for k in range(n):
            out[:, first + k] = private_run_offset(threads, first, n, elem_bytes, t) + k * elem_bytes
    return out


def private_bytes(layout: DistributedLayout, elem_bytes: int) -> int:
    """The bytes every thread's own copy of its values of ``layout`` takes."""
    return int(layout.threads) * int(layout.regs) * elem_bytes


#: The sizes ``cp.async`` copies (bytes): a run of fewer bytes cannot be copied on its own.
ASYNC_COPY_BYTES = (4, 8, 16)


def async_copyable(layout: DistributedLayout, elem_bytes: int) -> bool:
    """Whether every run of ``layout`` is a size one ``cp.async`` copies."""
    return all(n * elem_bytes in ASYNC_COPY_BYTES for _, n in vector_runs(layout, elem_bytes))
