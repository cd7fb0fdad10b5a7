"""Phases of mbarrier waits as values: each wait's parity (or count) threaded through loops.

A barrier that completes once for each of its waits (a TMA group's barrier, a tcgen05 commit's
``%acc_full``) is waited for phase 0, 1, 2, ... in program order, so the parity a wait names
is the number of waits before it, mod 2.  Under loops whose trip counts vary from run to run
(MoE's expert loops, causal attention's key loop) and ``if``s, that number is not a function
of the induction variables; it is a value each loop carries and each ``if`` yields.
:func:`thread_phases` makes it so: every enclosing ``tile.for`` carries one i32 a barrier,
every ``tile.if`` returns one, and the op after each wait in a loop flips it.

Used by ``lower-to-hopper`` (TMA groups, cluster reductions) and ``lower-to-blackwell`` (the
accumulators' commits).  Must not: decide which ops wait on which barrier (the callers do).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from tkc import dtypes
from tkc.ir.builder import Builder
from tkc.ir.core import Block, Operation, OpResult, Value
from tkc.ir.dialects import tile
from tkc.ir.types import ScalarType

I32 = ScalarType(dtypes.i32)


class Waits(NamedTuple):
    """How an op waits on ``barrier``: operand ``operand`` takes its phase, counted through
    loops modulo ``period`` (2: the parity of an mbarrier wait; 4: a cluster reduction's count
    of exchanges, which alternate between two barriers)."""

    barrier: Value
    operand: int
    period: int


def thread_phases(block: Block, waits: Mapping[Operation, Waits], const: Callable[[int], Value]) -> None:
    """Set the phase operand of every op of ``waits`` in ``block`` (and in the loops and ``if``s
    inside it), counting from 0 at the top of ``block``.  ``const(n)`` is an i32 constant
    visible throughout ``block``."""

    def waited(op: Operation) -> list[Value]:
        out: list[Value] = []
        for inner in op.walk():
            if inner in waits and waits[inner].barrier not in out:
                out.append(waits[inner].barrier)
        return out

    def walk(block: Block, cur: dict[Value, Value], in_loop: bool) -> dict[Value, Value]:
        for op in list(block.ops):
            if op in waits:
                bar, operand, period = waits[op]
                if bar not in cur:
                    cur[bar] = const(0)
                op.operands[operand] = cur[bar]
                if in_loop:
                    b = Builder(block, block.ops.index(op) + 1, op.loc)
                    if period == 2:  # a parity
                        cur[bar] = b.value(tile.XorOp, [cur[bar], const(1)], I32)
                    else:
                        step = b.value(tile.AddOp, [cur[bar], const(1)], I32)
                        cur[bar] = b.value(tile.AndOp, [step, const(period - 1)], I32)
            elif op.name in ("tile.for", "tile.if") and (bars := waited(op)):
                for bar in bars:
                    cur.setdefault(bar, const(0))
                if op.name == "tile.for":
                    body = op.regions[0].block
                    inner = {}
                    for bar in bars:
                        op.operands.append(cur[bar])
                        inner[bar] = body.add_arg(I32, "phase")
                    out = walk(body, inner, in_loop=True)
                    body.terminator.operands.extend(out[bar] for bar in bars)
                else:
                    for r in op.regions:
                        out = walk(r.blocks[0], dict(cur), in_loop)
                        r.blocks[0].terminator.operands.extend(out[bar] for bar in bars)
                for bar in bars:
                    res = OpResult(I32, op, len(op.results), "phase")
                    op.results.append(res)
                    cur[bar] = res
        return cur

    walk(block, {}, in_loop=False)
