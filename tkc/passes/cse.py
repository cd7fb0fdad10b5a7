"""The ``cse`` pass: common subexpression elimination.

Two ops are the same computation when they have the ``pure`` trait, no
regions, the same name, the same operands (in order, or in either order for
``commutative`` ops), the same attributes and the same result types; the later
one is replaced by the earlier.  The table is scoped like SSA visibility: an
op in an outer block may replace one in a nested region, never the reverse,
and kernels never share entries.

Loads are not merged (they are ``readonly``, not ``pure``: a store between
two loads may change what the second reads).  This pass never moves an op.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from tkc.ir.core import Block, Module, Operation, Value


def cse(module: Module, *_: object) -> None:
    """Replace every pure op that repeats an earlier, visible one."""
    for top in module.ops:
        for region in top.regions:
            for block in region.blocks:
                _cse_block(block, top, [], {})


def _cse_block(block: Block, root: Operation, scopes: list[dict[Hashable, Operation]],
               merged: dict[Value, Value]) -> None:
    table: dict[Hashable, Operation] = {}
    scopes.append(table)
    erased = False
    for op in list(block.ops):
        # A merged op's uses all come after it (SSA): each op's operands are renamed as the walk
        # reaches it, one pass in all where rewriting every use at each merge was one per merge.
        if merged and any(v in merged for v in op.operands):
            op.operands = [merged.get(v, v) for v in op.operands]
        if op.regions:
            for region in op.regions:
                for inner in region.blocks:
                    _cse_block(inner, root, scopes, merged)
            continue
        if not op.has_trait("pure"):
            continue
        key = op_key(op)
        if key is None:
            continue
        earlier = next((s[key] for s in reversed(scopes) if key in s), None)
        if earlier is None:
            table[key] = op
            continue
        merged.update(zip(op.results, earlier.results))
        op.parent = None  # erased: taken out of the block's list below, in one pass
        erased = True
    scopes.pop()
    if erased:
        block.ops[:] = [op for op in block.ops if op.parent is block]


def op_key(op: Operation, operands: list[Value] | None = None) -> Hashable | None:
    """What makes two pure ops interchangeable; None when something in it is
    not hashable (e.g. a layout object), which just means "never merged".
    ``operands`` stands for the op's own where the caller knows equal ones (the
    frontend's proof that a slice's extent is constant)."""
    operands: tuple = tuple(op.operands if operands is None else operands)
    if op.has_trait("commutative"):
        # Values hash by identity, so any fixed order of the pair will do.
        operands = tuple(sorted(operands, key=id))
    try:
        key = (op.name, operands, _freeze(op.attributes), tuple(r.type for r in op.results))
        hash(key)
    except TypeError:
        return None
    return key


def _freeze(v: Any) -> Hashable:
    # Tag each scalar with its kind: Python says 1 == 1.0 == True and
    # 0.0 == -0.0, and NaN != NaN, none of which may decide what merges.
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, int):
        return ("int", v)
    if isinstance(v, float):
        return ("float", v.hex())
    if isinstance(v, (list, tuple)):
        return ("list", tuple(_freeze(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple(sorted((k, _freeze(x)) for k, x in v.items())))
    return (type(v).__name__, v)
