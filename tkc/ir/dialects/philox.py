"""The ``tile`` dialect's counter-based random numbers: ``rand(seed, offsets)``.

Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the
generator of Random123, cuRAND's Philox and Triton's ``tl.rand``): the key is the seed as 64
bits (two 32-bit words), the counter each offset as 64 bits (an i32 offset sign-extended) in
its first two words and 0 in the other two; ten rounds, and the first 32-bit word of the
result, its top 24 bits scaled by 2**-24, is the number: a float32 in [0, 1), exact in f32,
so the interpreter (numpy, ``compute``), the emulator (the decomposition) and the GPU give
the same bits.  A value depends only on (seed, offset): the same offset gives the same
number in any program and any launch, which is what a dropout's backward needs to rebuild
its mask.

The op decomposes into i64 tile arithmetic (a 32 x 32 -> 64-bit product is one i64 multiply
of zero-extended words), so no target renders it directly.

Must not: know any target, layout or pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tkc import dtypes
from tkc.ir.core import Operation, register
from tkc.ir.dialects.elementwise import AddOp, AndOp, ConstantOp, MulOp, ShrOp, XorOp
from tkc.ir.dialects.tile import CastOp, SplatOp
from tkc.ir.types import ScalarType, TileType

if TYPE_CHECKING:
    from tkc.ir.builder import Builder
    from tkc.ir.core import Value

#: Philox-4x32's multipliers and Weyl key increments (Random123's PHILOX_M4x32_0/1, W32_0/1).
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
ROUNDS = 10
_MASK = 0xFFFFFFFF


def philox(seed: np.ndarray | int, offset: np.ndarray) -> np.ndarray:
    """The first word of Philox-4x32-10 of counter (offset as 64 bits, 0, 0) under key seed,
    as uint32 (numpy, in uint64 arithmetic)."""
    off = np.asarray(offset).astype(np.int64).astype(np.uint64)
    s = np.uint64(np.int64(seed).astype(np.uint64))
    m, mask = np.uint64(_MASK), np.uint64(_MASK)
    c = [off & m, off >> np.uint64(32), np.zeros_like(off), np.zeros_like(off)]
    k = [s & mask, s >> np.uint64(32)]
    for r in range(ROUNDS):
        p0 = np.uint64(PHILOX_M[0]) * c[0]
        p1 = np.uint64(PHILOX_M[1]) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k[0], p1 & mask, (p0 >> np.uint64(32)) ^ c[3] ^ k[1], p0 & mask]
        if r < ROUNDS - 1:
            k = [(k[0] + np.uint64(PHILOX_W[0])) & mask, (k[1] + np.uint64(PHILOX_W[1])) & mask]
    return c[0].astype(np.uint32)


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
    TRAITS = frozenset({"pure"})
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

    def decompose(self, b: Builder) -> Value:
        """Philox in tile ops on i32 words (wrapping adds and xors are u32's bits); each 32 x 32
        -> 64-bit product an i64 multiply of the word zero-extended (sign-extended, then
        masked: a zero extension to LLVM, so ``mul.wide.u32``), its high and low words the
        product shifted and truncated."""
        o, r = self.offset, self.result.type
        tile = isinstance(o.type, TileType)

        def typed(dt):
            return o.type.with_dtype(dt) if tile else ScalarType(dt)

        t32, t64, s32 = typed(dtypes.i32), typed(dtypes.i64), ScalarType(dtypes.i32)

        def const(v: int | float, t) -> Value:
            return b.value(ConstantOp, [], t, {"value": v})

        def op(cls: type, *xs: Value) -> Value:
            return b.value(cls, list(xs), xs[0].type)

        def cast(x: Value, t) -> Value:
            return b.value(CastOp, [x], t)

        def words(x: Value, t) -> tuple[Value, Value]:
            """(low, high) 32-bit words of an i64 ``x`` as i32 of type ``t``."""
            wide = x.type
            return cast(x, t), cast(op(ShrOp, x, const(32, wide)), t)

        def mulhilo(m: int, x: Value) -> tuple[Value, Value]:
            zext = op(AndOp, cast(x, t64), const(_MASK, t64))
            return words(op(MulOp, const(m, t64), zext), t32)

        def splat(x: Value) -> Value:
            return b.value(SplatOp, [x], t32) if tile else x

        c0, c1 = words(cast(o, t64) if o.type.dtype != dtypes.i64 else o, t32)
        c2 = c3 = const(0, t32)
        k0, k1 = words(self.seed, s32)
        for rnd in range(ROUNDS):
            lo0, hi0 = mulhilo(PHILOX_M[0], c0)
            lo1, hi1 = mulhilo(PHILOX_M[1], c2)
            c0, c1, c2, c3 = (op(XorOp, op(XorOp, hi1, c1), splat(k0)), lo1,
                              op(XorOp, op(XorOp, hi0, c3), splat(k1)), lo0)
            if rnd < ROUNDS - 1:
                k0 = op(AddOp, k0, const(_signed(PHILOX_W[0]), s32))
                k1 = op(AddOp, k1, const(_signed(PHILOX_W[1]), s32))
        # the top 24 bits: a logical shift of the u32 word (an arithmetic one, masked)
        top = op(AndOp, op(ShrOp, c0, const(8, t32)), const(0xFFFFFF, t32))
        return op(MulOp, cast(top, r), const(2.0 ** -24, r))


def _signed(v: int) -> int:
    """The u32 ``v`` as the i32 of the same bits."""
    return v - (1 << 32) if v >= 1 << 31 else v
