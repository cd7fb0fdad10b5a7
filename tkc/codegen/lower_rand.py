"""``rand``: Philox-4x32-10 in LLVM integer arithmetic, one call for four of a thread's values.

The op's meaning is ``tkc/ir/dialects/philox.py``'s (value of offset ``o``: word ``o & 3`` of
the call whose counter is ``o >> 2``); this module only decides how many calls a thread makes.
Ten rounds are about 90 PTX instructions (18 ``mul.hi``/``mul.lo`` pairs; two calls more in
a kernel of 8 values a thread added 188 instructions with their stores), so at a call a value
a dropout kernel is bound by them, not by memory.

Values a thread holds four in a row along the tile's last axis (the coordinates of one
group differ only there, by 0, 1, 2, 3: every row layout holds such runs) usually have
offsets ``o, o + 1, o + 2, o + 3`` with ``o`` a multiple of 4 (a dropout's ``row * N + col``
with N a multiple of 4).  Each group checks exactly that at run time (three compares and a
mask, which LLVM folds where the offsets are visibly consecutive) and branches: one call
whose four words are the four values, or, for any other offsets, a call per value.  Values
in no group take a call each.

Must not: choose a layout or change which bits a value gets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import llvmlite.ir as ir

from tkc.codegen.lower_elementwise import mulhi
from tkc.codegen.nvvm import F32, I32, I64
from tkc.ir.dialects.philox import PHILOX_M, PHILOX_W, ROUNDS
from tkc.ir.types import TileType

if TYPE_CHECKING:
    from tkc.codegen.lowerer import Handler, Lowerer
    from tkc.ir.core import Operation

#: Values one call gives.
GROUP = 4


def philox4x32(b: ir.IRBuilder, key: tuple[ir.Value, ir.Value],
               counter: tuple[ir.Value, ir.Value, ir.Value, ir.Value]) -> list[ir.Value]:
    """The four i32 words of Philox-4x32-10 of ``counter`` under ``key`` (i32 words).  Each
    32 x 32 -> 64-bit product is its two halves in i32 (``mul.lo`` and ``mul.hi.u32``, which
    ptxas pairs into one wide multiply): from one i64 multiply of zero-extended words LLVM
    widened the rounds' xors to 64 bits and multiplied in 64 (``mul.lo.s64``, several
    instructions)."""
    c, k = list(counter), list(key)
    m0, m1 = ir.Constant(I32, PHILOX_M[0]), ir.Constant(I32, PHILOX_M[1])
    for r in range(ROUNDS):
        hi0, lo0 = mulhi(b, m0, c[0]), b.mul(m0, c[0])
        # The first round's second product is of a zero word (rand's counters have two); LLVM
        # folds the low half but not ``mul.hi.u32``'s intrinsic.
        zero = isinstance(c[2], ir.Constant) and c[2].constant == 0
        hi1, lo1 = (c[2], c[2]) if zero else (mulhi(b, m1, c[2]), b.mul(m1, c[2]))
        c = [b.xor(b.xor(hi1, c[1]), k[0]), lo1, b.xor(b.xor(hi0, c[3]), k[1]), lo0]
        if r < ROUNDS - 1:
            k = [b.add(k[0], ir.Constant(I32, PHILOX_W[0])), b.add(k[1], ir.Constant(I32, PHILOX_W[1]))]
    return c


def _key(b: ir.IRBuilder, seed: ir.Value) -> tuple[ir.Value, ir.Value]:
    return b.trunc(seed, I32), b.trunc(b.lshr(seed, ir.Constant(I64, 32)), I32)


def _call(b: ir.IRBuilder, key: tuple[ir.Value, ir.Value], off: ir.Value) -> list[ir.Value]:
    """The four words of the call that holds offset ``off`` (i32 or i64; counter ``off >> 2``
    as 64 bits)."""
    ctr = b.ashr(off if off.type == I64 else b.sext(off, I64), ir.Constant(I64, 2))
    zero = ir.Constant(I32, 0)
    return philox4x32(b, key, (b.trunc(ctr, I32), b.trunc(b.lshr(ctr, ir.Constant(I64, 32)), I32), zero, zero))


def uniform(b: ir.IRBuilder, word: ir.Value) -> ir.Value:
    """A word's top 24 bits times 2**-24: an f32 in [0, 1), exact."""
    return b.fmul(b.uitofp(b.lshr(word, ir.Constant(I32, 8)), F32), ir.Constant(F32, 2.0 ** -24))


def _one(b: ir.IRBuilder, key: tuple[ir.Value, ir.Value], off: ir.Value) -> ir.Value:
    """The word of offset ``off``: its call's word ``off & 3``."""
    w = _call(b, key, off)
    m = b.trunc(b.and_(off, ir.Constant(off.type, 3)), I32)
    pick = w[3]
    for j in (2, 1, 0):
        pick = b.select(b.icmp_unsigned("==", m, ir.Constant(I32, j)), w[j], pick)
    return pick


def _groups(at: dict[tuple[int, ...], int]) -> tuple[list[list[int]], list[int]]:
    """Given the first slot holding each coordinate, the slots of four values side by side
    along the last axis (the first's coordinate there a multiple of 4), and the slots in no
    group."""
    groups, grouped = [], set()
    for c in at:
        if c[-1] % GROUP == 0:
            g = [at.get((*c[:-1], c[-1] + j)) for j in range(GROUP)]
            if None not in g:
                groups.append(g)
                grouped.update(g)
    return groups, [i for i in at.values() if i not in grouped]


def _rand(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    key = _key(b, lw.get(op.seed))
    t = op.offset.type
    if not isinstance(t, TileType):
        lw.set(op.result, uniform(b, _one(b, key, lw.get(op.offset))))
        return
    offs = lw.tile(op, op.offset)
    # Per value its coordinates less this thread's (the same for every value); a replicated
    # value (its coordinates held twice) is computed once.
    _, parts = lw.coord_parts(op, t.layout)
    first: dict[tuple[int, ...], int] = {}
    for i, c in enumerate(parts):
        first.setdefault(c, i)
    groups, single = _groups(first)
    words: dict[int, ir.Value] = {}
    for g in groups:
        o = [offs[i] for i in g]
        ok = b.icmp_unsigned("==", b.and_(o[0], ir.Constant(o[0].type, GROUP - 1)), ir.Constant(o[0].type, 0))
        for j in range(1, GROUP):
            ok = b.and_(ok, b.icmp_unsigned("==", o[j], b.add(o[0], ir.Constant(o[0].type, j))))
        got = lw.either(ok, lambda o=o: _call(b, key, o[0]), lambda o=o: [_one(b, key, x) for x in o], "rand")
        words.update(zip(g, got))
    for i in single:
        words[i] = _one(b, key, offs[i])
    lw.set(op.result, [uniform(b, words[first[c]]) for c in parts])


HANDLERS: dict[str, Handler] = {"tile.rand": _rand}
