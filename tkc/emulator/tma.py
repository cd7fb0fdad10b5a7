"""TMA tile copies (PTX-FACTS §3) between a 2-D global tensor and shared memory.

``tma_load`` is what the lowering issues for one shared tile: ``box`` is the tensor map's
boxDim (innermost first) and must be the layout's ``tma_box().dims``; the tile is
``count`` such boxes, copied through ``SharedLayout.offset`` (which places the boxes and
applies the swizzle).  Elements outside the tensor are zero-filled and still counted: the
barrier gets ``complete_tx(layout.size_bytes)``.  ``tma_store`` copies a shared tile back,
writing only the in-bounds elements (reads go through the async proxy, so generic stores
to the tile need ``fence.proxy.async`` first).

Global tensors are 2-D numpy arrays ``[rows, cols]`` in dtype storage (float32 for floats),
cols contiguous; coordinates are ``(col, row)`` like PTX (innermost first, signed).  The copy
is instantaneous: asynchrony is modelled by the barrier and by the scheduler's
interleaving, not by delaying bytes.  This module computes no shared address itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tkc.emulator.mbarrier import MBarrier
from tkc.emulator.smem import SharedMemory
from tkc.errors import TkcEmulatorError
from tkc.ir.dialects.hopper import is_vector_box
from tkc.ir.layouts import SharedLayout
from tkc.semantics import atomic_update

__all__ = ["tma_load", "tma_store"]

_I32 = (-(2**31), 2**31 - 1)


def _window(global_array: np.ndarray, coords: Sequence[int], box: Sequence[int], layout: SharedLayout,
            op: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Global (row, col) of every tile element and the in-bounds mask, each rows x cols."""
    if global_array.ndim != 2:
        raise TkcEmulatorError(f"{op}: only 2-D tensors are emulated, got {global_array.ndim}-D")
    if len(coords) != 2 or any(not _I32[0] <= int(c) <= _I32[1] for c in coords):
        raise TkcEmulatorError(f"{op}: coordinates {tuple(coords)} must be two signed 32-bit ints (col, row)")
    c0, r0 = (int(c) for c in coords)
    n = layout.rows * layout.cols
    if tuple(box) == (n, 1) and is_vector_box([1, n], layout):
        # A run along the last axis, held in order in rows of one atom (``is_vector_box``).
        cols = c0 + np.arange(n).reshape(layout.rows, layout.cols)
        rows = np.full_like(cols, r0)
        inb = (rows >= 0) & (rows < global_array.shape[0]) & (cols >= 0) & (cols < global_array.shape[1])
        return rows, cols, inb
    expect = layout.tma_box().dims
    if tuple(box) != tuple(expect):
        raise TkcEmulatorError(f"{op}: tensor-map box {tuple(box)} does not match the shared layout {layout}, "
                               f"whose TMA box is {expect} (innermost first)")
    rows, cols = np.meshgrid(r0 + np.arange(layout.rows), c0 + np.arange(layout.cols), indexing="ij")
    inb = (rows >= 0) & (rows < global_array.shape[0]) & (cols >= 0) & (cols < global_array.shape[1])
    return rows, cols, inb


def tma_load(global_array: np.ndarray, coords: Sequence[int], box: Sequence[int], layout: SharedLayout,
             smem: SharedMemory | Sequence[SharedMemory], dst_base: int, barrier: MBarrier | Sequence[MBarrier], *,
             op: str = "tma_load", boxes: Sequence[int] | None = None, license: int | None = None) -> None:
    """``cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes`` for
    every box of the tile at ``dst_base``; then ``barrier.complete_tx(layout.size_bytes)``.

    Multicast (``.multicast::cluster``): ``smem`` and ``barrier`` list one shared memory and
    barrier per destination CTA, and ``boxes`` the TMA boxes this copy moves (numbered row of
    boxes by row, as the lowering issues them); each destination gets those boxes at
    ``dst_base`` and their bytes on its barrier."""
    rows, cols, inb = _window(global_array, coords, box, layout, op)
    tile = np.zeros((layout.rows, layout.cols), global_array.dtype)
    tile[inb] = global_array[rows[inb], cols[inb]]
    mems = [smem] if isinstance(smem, SharedMemory) else list(smem)
    bars = [barrier] if isinstance(barrier, MBarrier) else list(barrier)
    if boxes is None:
        for m, bar in zip(mems, bars):
            m.write_tile(dst_base, layout, tile, writer=op, proxy="async", license=license)
            bar.when_seen(lambda m=m: m.seen(dst_base, layout.size_bytes))
            bar.complete_tx(layout.size_bytes, by=op)
        return
    tb = layout.tma_box()
    r, c = np.meshgrid(np.arange(layout.rows), np.arange(layout.cols), indexing="ij")
    number = (r // tb.dims[1]) * tb.count[0] + c // tb.dims[0]
    mine = np.isin(number, list(boxes))
    addrs = dst_base + layout.offset(r[mine], c[mine])
    for m, bar in zip(mems, bars):
        m.write_elements(addrs, tile[mine], layout.dtype, writer=op, proxy="async", license=license)
        bar.when_seen(lambda m=m: m.seen(dst_base, layout.size_bytes))
        bar.complete_tx(int(mine.sum()) * layout.elem_bytes, by=op)


def tma_store(smem: SharedMemory, src_base: int, layout: SharedLayout, global_array: np.ndarray,
              coords: Sequence[int], box: Sequence[int], *, op: str = "tma_store", add: bool = False) -> None:
    """``cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group``: the tile at ``src_base``
    goes to ``global_array`` (in place) at ``coords``; out-of-bounds elements are dropped.
    With ``add`` (``cp.reduce.async.bulk.tensor ... .add``) each element is added to the
    tensor's as a tile ``atomic_add`` adds it (``semantics.atomic_update``), instead."""
    rows, cols, inb = _window(global_array, coords, box, layout, op)
    tile = smem.read_tile(src_base, layout, reader=op, proxy="async")
    if add:
        at = (rows[inb], cols[inb])
        global_array[at] = atomic_update("add", layout.dtype, global_array[at], tile[inb])
    else:
        global_array[rows[inb], cols[inb]] = tile[inb]
