"""The ``licm`` pass: loop-invariant code motion.

Moves ops out of ``tile.for`` bodies when they compute the same thing on
every iteration: ops with the ``pure`` trait and no regions, directly in the
loop's body block, none of whose operands is defined inside the loop (the
induction variable, a carried value, or a result of any op of the body,
however deeply nested).  Hoisted ops go right before the loop in their
original order and keep their locations.  Loops are visited innermost first,
so an op invariant in several nested loops ends up before the outermost.

Loads are not hoisted (they are ``readonly``, not ``pure``: a store in the
loop may change what they read, and a loop that runs zero times must not
read at all).  Neither are ops in nested regions (a ``tile.if`` in the loop
guards them), nor ops with regions.  Run ``cse`` afterwards to merge a
hoisted op with an identical one already outside the loop.
"""

from __future__ import annotations

from tkc.ir.core import Module, Operation, defined_inside


def licm(module: Module, *_: object) -> None:
    """Hoist loop-invariant pure ops out of every ``tile.for``."""
    changed = True
    while changed:
        changed = False
        for top in module.ops:
            for loop in _loops_innermost_first(top):
                changed |= _hoist(loop)


def _loops_innermost_first(op: Operation) -> list[Operation]:
    out: list[Operation] = []
    for region in op.regions:
        for block in region.blocks:
            for inner in block.ops:
                out.extend(_loops_innermost_first(inner))
    if op.name == "tile.for":
        out.append(op)
    return out


def _hoist(loop: Operation) -> bool:
    """Move the invariant ops of ``loop``'s body right before it."""
    inside = defined_inside(loop)
    body = loop.regions[0].block
    outer = loop.parent
    assert outer is not None
    moved = False
    for op in list(body.ops):
        if op.regions or op.has_trait("terminator") or not op.has_trait("pure"):
            continue
        if any(v in inside for v in op.operands):
            continue
        op.erase()
        outer.insert(outer.ops.index(loop), op)
        inside.difference_update(op.results)  # ops after it may now move too
        moved = True
    return moved

