"""The ``tile`` dialect's counter-based random numbers: ``rand(seed, offsets)``.

Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the
generator of Random123, cuRAND's Philox and Triton's ``tl.rand``): the key is the seed as 64
bits (two 32-bit words); one call of the ten rounds gives four 32-bit words.  Offset ``o``
takes word ``o & 3`` of the call whose counter is ``o >> 2`` as 64 bits (its first two
words; 0 in the other two), its top 24 bits scaled by 2**-24: a float32 in [0, 1), exact in
f32, so the interpreter (numpy, ``compute``), the emulator (the same numpy) and the GPU
(``tkc/codegen/lower_rand.py``) give the same bits.  Four consecutive offsets from a
multiple of 4 share one call, as four values a thread holds side by side in a row usually
are: a dropout's ``rows * N + cols`` costs a quarter of a call a value, not a call.  A
value depends only on (seed, offset): the same offset gives the same number in any program
and any launch, which is what a dropout's backward needs to rebuild its mask.

Must not: know any target, layout or pass.
"""

from __future__ import annotations

import numpy as np

from tkc import dtypes
from tkc.ir.core import Operation, register
from tkc.ir.types import ScalarType, TileType

#: Philox-4x32's multipliers and Weyl key increments (Random123's PHILOX_M4x32_0/1, W32_0/1).
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
ROUNDS = 10
_MASK = 0xFFFFFFFF


def philox4x32(key: tuple, counter: tuple) -> list[np.ndarray]:
    """The four words of Philox-4x32-10 of ``counter`` (four u32 words or arrays) under ``key``
    (two), as uint32 arrays (numpy, in uint64 arithmetic)."""
    mask = np.uint64(_MASK)
    c = [np.asarray(w).astype(np.uint64) & mask for w in counter]
    k = [np.uint64(int(w) & _MASK) for w in key]
    for r in range(ROUNDS):
        p0 = np.uint64(PHILOX_M[0]) * c[0]
        p1 = np.uint64(PHILOX_M[1]) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k[0], p1 & mask, (p0 >> np.uint64(32)) ^ c[3] ^ k[1], p0 & mask]
        if r < ROUNDS - 1:
            k = [(k[0] + np.uint64(PHILOX_W[0])) & mask, (k[1] + np.uint64(PHILOX_W[1])) & mask]
    return [w.astype(np.uint32) for w in c]


def philox(seed: np.ndarray | int, offset: np.ndarray) -> np.ndarray:
    """The 32-bit word ``rand`` takes for each offset: word ``offset & 3`` of the call whose
    counter is ``offset >> 2`` (as 64 bits), under ``seed`` (as 64 bits)."""
    off = np.asarray(offset).astype(np.int64)
    ctr = (off >> np.int64(2)).astype(np.uint64)
    s = int(np.int64(seed)) & ((1 << 64) - 1)
    words = philox4x32((s & _MASK, s >> 32), (ctr & np.uint64(_MASK), ctr >> np.uint64(32), 0, 0))
    return np.choose((off & np.int64(3)).astype(np.intp), [np.broadcast_to(w, off.shape) for w in words])


def uniform(seed: np.ndarray | int, offset: np.ndarray) -> np.ndarray:
    """``rand``'s value: the top 24 bits of :func:`philox` times 2**-24, float32 in [0, 1)."""
    return ((philox(seed, offset) >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)).astype(np.float32)


@register
class RandOp(Operation):
    """``rand(seed, offsets)``: a uniform float32 in [0, 1) per offset (Philox-4x32-10; the
    module docstring says which bits).  ``seed`` an i64 scalar, ``offsets`` an i32 or i64
    scalar or tile; the result f32 of the offsets' shape."""

    name = "tile.rand"
    SURFACE = "rand"
    OPERANDS = ("seed", "offset")
    RESULTS = ("result",)
    TRAITS = frozenset({"pure", "elementwise"})
    SUMMARY = "uniform f32 in [0, 1) from a seed and an offset (Philox-4x32-10, the same bits everywhere)"
    EXAMPLE = "keep = rand(seed, rows[:, None] * N + cols[None, :]) >= p"

    @staticmethod
    def compute(seed: np.ndarray, offset: np.ndarray) -> np.ndarray:
        return uniform(seed, offset)

    def verify(self) -> None:
        s, o, r = self.seed.type, self.offset.type, self.result.type
        if not isinstance(s, ScalarType) or s.dtype != dtypes.i64:
            raise self.error(f"seed must be an i64 scalar, got {s}")
        if not isinstance(o, (ScalarType, TileType)) or o.dtype not in (dtypes.i32, dtypes.i64):
            raise self.error(f"offsets must be an i32 or i64 scalar or tile, got {o}")
        if type(r) is not type(o) or r.dtype != dtypes.f32 or (isinstance(o, TileType) and r.shape != o.shape):
            raise self.error(f"result must be f32 of the offsets' shape, got {r}")
