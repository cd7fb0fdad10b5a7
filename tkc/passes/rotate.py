"""What the passes that rotate a consumer loop's products (``issue-ahead``, ``defer-last``)
share: the kernels that pin them, finding the pingpong turn around a product, and putting
the rotated loop in place behind a ``lb < ub`` guard.

Must not: decide what moves (each pass owns its plan).
"""

from __future__ import annotations

from collections.abc import Iterator

from tkc import dtypes
from tkc.ir.core import Block, Module, Operation, replace_all_uses
from tkc.ir.dialects import tile
from tkc.ir.types import ScalarType

I32 = ScalarType(dtypes.i32)
I1 = ScalarType(dtypes.i1)


def pinned_kernels(module: Module, pinned: bool) -> Iterator[Operation]:
    """The module's kernels where the pass's pin is set (``pinned``), else none."""
    for kernel in module.ops:
        if pinned and kernel.name == "tile.kernel":
            yield kernel


def turn_around(ops: list[Operation], w: Operation) -> tuple[Operation, ...] | None:
    """The turn ``wait`` and ``pass`` right around ``w`` among ``ops``, to move with it; ()
    when the loop takes no turns; None when it takes turns but not around ``w`` (moving ``w``
    alone would unpair them)."""
    if not any(op.name == "hopper.turn" for o in ops for op in o.walk()):
        return ()
    i = ops.index(w)
    before, after = ops[i - 1] if i > 0 else None, ops[i + 1] if i + 1 < len(ops) else None
    if (before is not None and after is not None and before.name == after.name == "hopper.turn"
            and before.attributes["kind"] == "wait" and after.attributes["kind"] == "pass"):
        return before, after
    return None


def replace_guarded(loop: Operation, then: Block) -> None:
    """Replace ``loop`` by ``if lb < ub: then else: the initial values``; ``then`` yields the
    loop's results."""
    g = loop.operand_groups()
    loc = loop.loc
    skip = Block()
    skip.append(tile.YieldOp(list(g["init"]), [], loc=loc))
    parent = loop.parent
    cond = tile.CmpOp([g["lb"], g["ub"]], [I1], {"pred": "lt"}, loc=loc)
    parent.insert(parent.ops.index(loop), cond)
    branch = tile.IfOp.of(cond.result, then, skip, [r.type for r in loop.results], loc=loc)
    parent.insert(parent.ops.index(loop), branch)
    root = list(loop.ancestors())[-1]  # the kernel
    for old, new in zip(loop.results, branch.results):
        replace_all_uses(root, old, new)
    loop.erase()
