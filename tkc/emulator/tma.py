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
from tkc.ir.layouts import SharedLayout

__all__ = ["tma_load", "tma_store"]

_I32 = (-(2**31), 2**31 - 1)


def _window(global_array: np.ndarray, coords: Sequence[int], box: Sequence[int], layout: SharedLayout,
            op: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Global (row, col) of every tile element and the in-bounds mask, each rows x cols."""
    if global_array.ndim != 2:
        raise TkcEmulatorError(f"{op}: only 2-D tensors are emulated, got {global_array.ndim}-D")
    if len(coords) != 2 or any(not _I32[0] <= int(c) <= _I32[1] for c in coords):
        raise TkcEmulatorError(f"{op}: coordinates {tuple(coords)} must be two signed 32-bit ints (col, row)")
    expect = layout.tma_box().dims
    if tuple(box) != tuple(expect):
        raise TkcEmulatorError(f"{op}: tensor-map box {tuple(box)} does not match the shared layout {layout}, "
                               f"whose TMA box is {expect} (innermost first)")
    c0, r0 = (int(c) for c in coords)
    rows, cols = np.meshgrid(r0 + np.arange(layout.rows), c0 + np.arange(layout.cols), indexing="ij")
    inb = (rows >= 0) & (rows < global_array.shape[0]) & (cols >= 0) & (cols < global_array.shape[1])
    return rows, cols, inb


def tma_load(global_array: np.ndarray, coords: Sequence[int], box: Sequence[int], layout: SharedLayout,
             smem: SharedMemory, dst_base: int, barrier: MBarrier, *, op: str = "tma_load") -> None:
    """``cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes`` for
    every box of the tile at ``dst_base``; then ``barrier.complete_tx(layout.size_bytes)``."""
    rows, cols, inb = _window(global_array, coords, box, layout, op)
    tile = np.zeros((layout.rows, layout.cols), global_array.dtype)
    tile[inb] = global_array[rows[inb], cols[inb]]
    smem.write_tile(dst_base, layout, tile, writer=op, proxy="async")
    barrier.complete_tx(layout.size_bytes, by=op)


def tma_store(smem: SharedMemory, src_base: int, layout: SharedLayout, global_array: np.ndarray,
              coords: Sequence[int], box: Sequence[int], *, op: str = "tma_store") -> None:
    """``cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group``: the tile at ``src_base``
    goes to ``global_array`` (in place) at ``coords``; out-of-bounds elements are dropped."""
    rows, cols, inb = _window(global_array, coords, box, layout, op)
    tile = smem.read_tile(src_base, layout, reader=op, proxy="async")
    global_array[rows[inb], cols[inb]] = tile[inb]
