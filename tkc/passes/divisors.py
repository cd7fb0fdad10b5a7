"""What the compiler knows about an integer scalar's divisors: the largest power of two that
divides every value it can take.

TMA copies a box whose first element along the tensor's last axis sits at a multiple of 16
bytes; a copy from any other column stops the kernel with an illegal instruction on an H200
(a bf16 tile at column 4, an f32 vector at token 2641: benchmarks/RESULTS.md, 2026-11-29).
The column is a runtime value, so the passes copy by TMA only where it is known to be such a
multiple at compile time (``a[rows, k*BK:(k+1)*BK]``, ``lse[b, h, i*BM:(i+1)*BM]``), and
load or store thread by thread where it is not (``lse[h, start + i*BM:...]`` with ``start``
read from ``cu_seqlens``).

Known: constants, sums and differences (the smaller divisor, constants summed first:
``(n + 1) - 1`` is ``n``), products (the product), shifts left by a constant, negation,
min/max and select (the smaller), and a loop's induction variable ``lb + k * step``.
Anything else (``program_id``, a tensor's size, a loaded value, a quotient, a loop-carried
value) is known to be a multiple of 1 only.

Must not: look at anything but the tile IR's scalar arithmetic (no runtime values, no
layouts).
"""

from __future__ import annotations

from tkc.ir.core import BlockArgument, Value
from tkc.ir.dialects.elementwise import constant_value

__all__ = ["power_of_two_divisor", "column_aligned"]

#: The divisor of 0 (every power of two divides it), and the most any product is credited with.
_CAP = 1 << 30
#: Ops whose result is one of their operands: divisible by what divides all of them.
_COMMON = frozenset({"tile.minimum", "tile.maximum"})


def power_of_two_divisor(v: Value) -> int:
    """The largest power of two known to divide every value the integer scalar ``v`` takes."""
    d, c = _Divisors()(v)
    return min(d, _low_bit(c))


def column_aligned(offset: Value, elem_bytes: int, align: int = 16) -> bool:
    """Whether an element offset ``offset`` along a tensor's last axis is known to land at a
    multiple of ``align`` bytes (elements of ``elem_bytes``)."""
    return power_of_two_divisor(offset) * elem_bytes % align == 0


def _low_bit(c: int) -> int:
    return _CAP if c == 0 else min(c & -c, _CAP)


class _Divisors:
    """Each value as ``d * m + c``: ``d`` a power of two known to divide the part that is not
    constant, ``c`` a constant (``(n + 1) - 1`` is a multiple of what divides ``n``)."""

    def __init__(self) -> None:
        self.memo: dict[Value, tuple[int, int]] = {}

    def __call__(self, v: Value) -> tuple[int, int]:
        if v not in self.memo:
            self.memo[v] = (1, 0)  # a value that reaches itself (loop-carried) is assumed nothing of
            self.memo[v] = self._of(v)
        return self.memo[v]

    def _whole(self, v: Value) -> int:
        d, c = self(v)
        return min(d, _low_bit(c))

    def _of(self, v: Value) -> tuple[int, int]:
        c = constant_value(v)
        if c is not None:
            return (_CAP, c) if isinstance(c, int) and not isinstance(c, bool) else (1, 0)
        if isinstance(v, BlockArgument):
            return self._induction(v), 0
        owner = getattr(v, "owner", None)
        if owner is None:
            return 1, 0
        xs = owner.operands
        if owner.name in ("tile.add", "tile.sub"):
            (dx, cx), (dy, cy) = self(xs[0]), self(xs[1])
            return min(dx, dy), cx + cy if owner.name == "tile.add" else cx - cy
        if owner.name == "tile.neg":
            d, c = self(xs[0])
            return d, -c
        if owner.name == "tile.mul":
            for x, y in ((xs[0], xs[1]), (xs[1], xs[0])):
                k = constant_value(y)
                if isinstance(k, int) and not isinstance(k, bool):
                    d, c = self(x)
                    return min(d * _low_bit(k), _CAP), c * k
            return min(self._whole(xs[0]) * self._whole(xs[1]), _CAP), 0
        if owner.name == "tile.shl":
            s = constant_value(xs[1])
            if isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 31:
                d, c = self(xs[0])
                return min(d << s, _CAP), c << s
            return 1, 0
        if owner.name in _COMMON:
            return min(self._whole(x) for x in xs), 0
        if owner.name == "tile.select":
            return min(self._whole(xs[1]), self._whole(xs[2])), 0
        if owner.name == "tile.cast" and getattr(owner.result.type, "dtype", None) is not None \
                and owner.result.type.dtype.is_int and xs[0].type.dtype.is_int \
                and owner.result.type.dtype.bits >= xs[0].type.dtype.bits:
            return self(xs[0])  # a widening cast keeps the value
        return 1, 0

    def _induction(self, v: BlockArgument) -> int:
        """A ``tile.for``'s induction variable, ``lb + k * step``: what divides both."""
        loop = v.block.parent_op
        if loop is None or loop.name != "tile.for" or v.index != 0:
            return 1
        lb, _, step = loop.operands[:3]
        return min(self._whole(lb), self._whole(step))
