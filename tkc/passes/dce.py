"""The ``dce`` pass: dead code elimination.

Removes ops whose results nobody uses and whose only effect is their
results: ops with the ``pure`` or ``readonly`` trait, and ``tile.for`` /
``tile.if`` whose regions hold only such ops.  It also drops single results
of ``tile.for`` and ``tile.if`` that nobody can observe (for a loop, a carried
value that feeds nothing but its own next iteration), so the code that
computed them becomes dead too.  Repeats until nothing changes.

Everything with an effect stays: stores, the launch grid, terminators, and
any op this pass does not know to be free of effects.
"""

from __future__ import annotations

from tkc.ir.core import Block, Module, Operation, Value, replace_all_uses

# Ops with regions whose only effect is what their regions compute.
_STRUCTURED = ("tile.for", "tile.if")


def dce(module: Module, *_: object) -> None:
    """Erase dead ops and dead loop/branch results, to a fixpoint."""
    changed = True
    while changed:
        changed = False
        counts = _use_counts(module)
        for top in module.ops:
            for region in top.regions:
                for block in region.blocks:
                    changed |= _sweep(block, counts)
        for top in module.ops:
            changed |= _drop_dead_results(top, counts)


def _use_counts(module: Module) -> dict[Value, int]:
    counts: dict[Value, int] = {}
    for op in module.walk():
        for v in op.operands:
            counts[v] = counts.get(v, 0) + 1
    return counts


def _sweep(block: Block, counts: dict[Value, int]) -> bool:
    """Erase dead ops of ``block`` (and of nested regions), last to first, so
    an op whose only user just died goes in the same sweep."""
    changed = erased = False
    for op in reversed(list(block.ops)):
        if _is_dead(op, counts):
            for inner in op.walk():
                for v in inner.operands:
                    counts[v] -= 1
            op.parent = None  # erased: taken out of the block's list below, in one pass
            changed = erased = True
            continue
        for region in op.regions:
            for inner_block in region.blocks:
                changed |= _sweep(inner_block, counts)
    if erased:
        block.ops[:] = [op for op in block.ops if op.parent is block]
    return changed


def _is_dead(op: Operation, counts: dict[Value, int]) -> bool:
    if op.has_trait("terminator") or any(counts.get(r, 0) for r in op.results):
        return False
    return _effect_free(op)


def _effect_free(op: Operation) -> bool:
    if not op.regions:
        return op.has_trait("pure") or op.has_trait("readonly")
    if op.name not in _STRUCTURED:
        return False
    return all(
        inner.has_trait("terminator") or _effect_free(inner)
        for region in op.regions
        for block in region.blocks
        for inner in block.ops
    )


# ------------------------------------------------- dead loop / branch results
def _drop_dead_results(top: Operation, counts: dict[Value, int]) -> bool:
    changed = False
    for op in list(top.walk()):
        if op.name not in _STRUCTURED or op.parent is None:
            continue
        keep = _live_results(op, counts)
        if len(keep) < len(op.results):
            _rebuild(op, keep, top)
            changed = True
    return changed


def _live_results(op: Operation, counts: dict[Value, int]) -> list[int]:
    """Indices of the results of a loop or branch that anything can observe.

    A branch result is live when it is used.  A loop-carried value is live
    when it is used after the loop, or when its block argument feeds an op
    with an effect or another live carried value; a value that only feeds its
    own next iteration (``b = b * b``) is dead however often it is updated."""
    live = {i for i, r in enumerate(op.results) if counts.get(r, 0)}
    if op.name != "tile.for":
        return sorted(live)
    body = op.regions[0].block
    term = body.terminator
    while True:
        needed = {term.operands[i] for i in live}
        for inner in reversed(body.ops[:-1]):
            if not _effect_free(inner) or any(r in needed for r in inner.results):
                for x in inner.walk():
                    needed.update(x.operands)
        grown = live | {i for i in range(len(op.results)) if body.args[1 + i] in needed}
        if grown == live:
            return sorted(live)
        live = grown


def _rebuild(op: Operation, keep: list[int], root: Operation) -> None:
    """Replace ``op`` by the same op with only the results in ``keep``; its
    regions move over, their yields and (for a loop) block arguments shrink."""
    if op.name == "tile.for":
        lb, ub, step, *inits = op.operands
        operands = [lb, ub, step, *(inits[i] for i in keep)]
        body = op.regions[0].block
        body.args = [body.args[0], *(body.args[1 + i] for i in keep)]
        for n, a in enumerate(body.args):
            a.index = n
    else:
        operands = list(op.operands)
    for region in op.regions:
        term = region.block.terminator
        term.operands = [term.operands[i] for i in keep]
    new = type(op)(operands, [op.results[i].type for i in keep], op.attributes, op.regions, op.loc)
    block = op.parent
    block.insert(block.ops.index(op), new)
    op.erase()
    for n, i in enumerate(keep):
        new.results[n].name_hint = op.results[i].name_hint
        replace_all_uses(root, op.results[i], new.results[n])
