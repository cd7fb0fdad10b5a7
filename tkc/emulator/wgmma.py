"""``wgmma.mma_async`` (PTX-FACTS §1) on one warpgroup's registers, and register-fragment helpers.

A wgmma is one vectorized gather + matmul + scatter, never a loop over threads:

1. A (64 x k) and B (n x k) are gathered from shared memory at the addresses
   ``layouts.descriptor_address`` decodes from the 64-bit descriptors (the hardware's view:
   if a descriptor or a layout is wrong, the wrong bytes are read).  The reads go through
   the async proxy, so generic stores not followed by ``fence.proxy.async`` are an error.
   In the RS form A comes from registers laid out by ``WgmmaOperandA`` (16-bit), or as 8-bit
   bytes in register order, placed by the hardware's reading (``_a8_register``).
2. D = A @ B^T is computed in float64 and added to the accumulator with one rounding to
   f32 per instruction (exact whenever the true sum is an f32; the GPU's internal summation
   order may differ in the last bit otherwise).
3. The accumulator is the per-thread fragment ``acc[thread, reg]`` (128 x n/2, float32) of
   ``WgmmaAccumulator(n)``; ``coords`` maps it to the 64 x n tile.

The emulator never computes an address or a register mapping itself: ``tkc.ir.layouts`` does.
Issue order, ``wgmma.fence``/``commit_group``/``wait_group`` and the lifetime of smem operands
and of an A operand in registers belong to the op handlers and the scheduler (a stage read
lease, ``SharedMemory.begin_read``; ``machine._Warpgroup.overwrite``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from tkc import dtypes
from tkc.dtypes import DType
from tkc.emulator.smem import SharedMemory
from tkc.errors import TkcEmulatorError
from tkc.ir.layouts import WgmmaAccumulator, WgmmaOperandA, descriptor_address, mma_k_step

Fragment = WgmmaAccumulator | WgmmaOperandA

__all__ = ["wgmma", "fragment_to_tile", "tile_to_fragment"]



def _a8_register(t: int, r: int, byte: int) -> tuple[int, int]:
    """(row, k) of one 64 x 32 K-step of an 8-bit wgmma A operand in registers that byte ``byte``
    of b32 register ``r`` of thread ``t`` holds: the hardware's reading (CUTLASS
    ``ALayout_64x32``: row = 16 warp + lane/4 + 8 (r&1), k = 4 (lane%4) + byte + 16 (r>>1)).
    Written here, apart from the compiler's layouts, so the emulator checks their packing."""
    lane = t % 32
    return t // 32 % 4 * 16 + lane // 4 + 8 * (r & 1), lane % 4 * 4 + byte + 16 * (r >> 1)

@lru_cache(maxsize=64)
def _grid(layout: Fragment) -> tuple[np.ndarray, np.ndarray]:
    # Cached: a kernel's wgmmas ask for the same few layouts thousands of times.  Read-only,
    # so no caller changes what another gets.
    t = np.arange(layout.threads)[:, None]
    i = np.arange(layout.regs)[None, :]
    rows, cols = (np.broadcast_to(c, (layout.threads, layout.regs)).copy() for c in layout.coords(t, i))
    rows.flags.writeable = cols.flags.writeable = False
    return rows, cols


def _read_operand(smem: SharedMemory, desc: int, major: str, rows: int, k: int, dtype: DType,
                  reader: str) -> np.ndarray:
    """The ``rows`` x ``k`` operand ``desc`` points at, read through the async proxy."""
    b = _operand_bytes(smem, desc, major, rows, k, dtype, reader)
    return smem.read_bytes(b, dtype, reader=reader, proxy="async")


def _operand_bytes(smem: SharedMemory, desc: int, major: str, rows: int, k: int, dtype: DType,
                   reader: str) -> np.ndarray:
    # A loop's wgmmas read the same stages through the same descriptors thousands of times: the
    # decoded, checked byte addresses are kept per descriptor (and shared memory size, which the
    # check reads); an address the check refuses raises for each reader and is never kept.
    key = (desc, major, rows, k, dtype, smem.size)
    b = _OPERAND_BYTES.get(key)
    if b is None:
        addr = descriptor_address(desc, major, np.arange(rows)[:, None], np.arange(k)[None, :], dtype)
        b = smem.element_bytes(addr, dtype, reader)
        b.flags.writeable = False
        if len(_OPERAND_BYTES) >= 4096:
            _OPERAND_BYTES.clear()
        _OPERAND_BYTES[key] = b
    return b


_OPERAND_BYTES: dict[tuple, np.ndarray] = {}


def fragment_to_tile(frag: np.ndarray, layout: Fragment) -> np.ndarray:
    """The ``layout.shape`` tile held by the per-thread fragment ``frag[thread, reg]``."""
    frag = np.asarray(frag)
    if frag.shape != (layout.threads, layout.regs):
        raise ValueError(f"fragment of shape {frag.shape} does not match {layout} "
                         f"({layout.threads} threads x {layout.regs} values)")
    rows, cols = _grid(layout)
    tile = np.empty(layout.shape, frag.dtype)
    tile[rows, cols] = frag
    return tile


def tile_to_fragment(tile: np.ndarray, layout: Fragment) -> np.ndarray:
    """The per-thread fragment ``[thread, reg]`` of a ``layout.shape`` tile."""
    tile = np.asarray(tile)
    if tile.shape != layout.shape:
        raise ValueError(f"tile of shape {tile.shape} does not match {layout} {layout.shape}")
    rows, cols = _grid(layout)
    return tile[rows, cols]


def wgmma(acc: np.ndarray, smem: SharedMemory, a: int | np.ndarray, desc_b: int, *, n: int, k: int,
          dtype: DType, dtype_b: DType | None = None, m: int = 64, trans_a: bool = False, trans_b: bool = False,
          scale_d: bool = True, scale_a: int = 1, scale_b: int = 1, op: str = "wgmma") -> np.ndarray:
    """``wgmma.mma_async.m64n{n}k{k}.f32.{dtype}.{dtype_b}``: ``acc`` (128 x n/2 float32, one
    warpgroup's ``WgmmaAccumulator(n)`` fragment) is updated in place and returned.

    ``a`` is a descriptor (SS form; ``trans_a`` = MN-major) or the A registers (RS form,
    128 x k/2 values of ``WgmmaOperandA(k)``; 8-bit: 128 x 16, byte b of register r at
    4 r + b).  ``trans_b`` = B is MN-major.  ``scale_d`` false means D = A.B (pD = 0);
    ``scale_a``/``scale_b`` are the +-1 negation immediates.
    """
    dtype_b = dtype_b or dtype
    if m != 64:
        raise TkcEmulatorError(f"{op}: wgmma is m64 per warpgroup, got m={m}")
    if not (8 <= n <= 256 and n % 8 == 0):
        raise TkcEmulatorError(f"{op}: N={n} is not in 8..256 in steps of 8 (PTX-FACTS §1)")
    if dtype.bits != dtype_b.bits or not dtype.is_float:
        raise TkcEmulatorError(f"{op}: operand types {dtype} x {dtype_b} are not a wgmma float pair")
    eb = dtype.bits // 8
    if k != mma_k_step(dtype.bits):
        raise TkcEmulatorError(f"{op}: a {dtype} wgmma has K={mma_k_step(dtype.bits)} (32 B of K), got k={k}")
    if (trans_a or trans_b) and eb != 2:
        raise TkcEmulatorError(f"{op}: MN-major operands are f16/bf16 only (PTX-FACTS §1, tA/tB)")
    if scale_a not in (1, -1) or scale_b not in (1, -1):
        raise TkcEmulatorError(f"{op}: scale-a/scale-b are immediates 1 or -1")
    acc_layout = WgmmaAccumulator(n)
    acc = np.asarray(acc)
    if acc.shape != (acc_layout.threads, acc_layout.regs) or acc.dtype != np.float32:
        raise TkcEmulatorError(f"{op}: accumulator must be float32 of shape "
                               f"({acc_layout.threads}, {acc_layout.regs}), got {acc.dtype} {acc.shape}")

    if isinstance(a, np.ndarray):
        if trans_a:
            raise TkcEmulatorError(f"{op}: A from registers has no transpose")
        if eb == 1:  # four b32 registers of four bytes, read as the hardware reads them
            a_tile = np.empty((64, k), np.float32)
            t = np.arange(128)
            for r in range(4):
                for byte in range(4):
                    row, col = _a8_register(t, r, byte)
                    a_tile[row, col] = a[:, 4 * r + byte]
        else:
            a_tile = fragment_to_tile(a, WgmmaOperandA(k)).astype(np.float32)
        if not np.array_equal(dtypes.round_to(a_tile, dtype), a_tile, equal_nan=True):
            raise TkcEmulatorError(f"{op}: A registers hold values that are not {dtype} (convert them first)")
    else:
        a_tile = _read_operand(smem, int(a), "mn" if trans_a else "k", 64, k, dtype, f"{op} (A)")
    b_tile = _read_operand(smem, int(desc_b), "mn" if trans_b else "k", n, k, dtype_b, f"{op} (B)")

    d = (a_tile.astype(np.float64) @ b_tile.astype(np.float64).T) * (scale_a * scale_b)
    rows, cols = _grid(acc_layout)
    d_frag = d[rows, cols]
    if scale_d:
        d_frag = d_frag + acc.astype(np.float64)
    acc[...] = d_frag.astype(np.float32)
    return acc
