"""The ``merge-reductions`` pass: reductions that cross warps and do not depend on each other
trade their partials in one round trip through shared memory (``hopper.reduce_group``).

Every ``hopper.reduce`` whose plan crosses warps costs the threads that run it two barriers
(write partials, meet, combine, meet).  A norm's backward reduces each row several times, and
some of those sums only need values the row already has: LayerNorm's sum of ``x`` and sum of
``g = dy * w``; then its sum of squared deviations and of ``g * d``; RMSNorm's sums of ``x * x``
and ``g * x``.  Grouped, each group meets twice, whatever the number of its parts.

Works block by block (a loop body, a role, the kernel body), in the order the ops stand.  A
later cross-warp reduction ``B`` joins an earlier one (or group) ``A`` of the same block when
``B``'s operand does not depend on ``A``'s results.  The pure ops between them that compute
``B``'s operand (its slice) move up, in order, to just before ``A``, where the group then
stands; ``A``'s results are used no earlier than before.

Must not: reorder anything with an effect (a slice holding a load, a store, a barrier, a loop,
anything that is not pure, leaves ``B`` alone); group reductions run by different threads
(different blocks, or layouts over different thread counts) or through one scratch tile; change what any thread
computes (each part keeps its plan, its order of combination, and its scratch tile).
"""

from __future__ import annotations

from tkc.ir.core import Block, Module, Operation, replace_all_uses
from tkc.ir.dialects import hopper
from tkc.pins import Options
from tkc.target import Target


def merge_reductions(module: Module, options: Options, target: Target) -> None:
    for kernel in module.ops:
        if kernel.name != "tile.kernel":
            continue
        blocks = [b for op in kernel.walk() for region in op.regions for b in region.blocks]
        for block in blocks:
            _merge_in(kernel, block)


def _crosses_warps(op: Operation) -> bool:
    return op.name == "hopper.reduce_group" or (op.name == "hopper.reduce" and bool(op.warp_xor))


def _parts(op: Operation) -> list[tuple]:
    """``(x, scratch, result, kind, axis, shuffle_xor, warp_xor)`` of each reduction in ``op``."""
    if op.name == "hopper.reduce_group":
        return op.parts()
    return [(op.x, op.scratch[0], op.result, op.kind, op.axis, op.shuffle_xor, op.warp_xor)]


def _merge_in(kernel: Operation, block: Block) -> None:
    i = 0
    while i < len(block.ops):
        a = block.ops[i]
        if _crosses_warps(a):
            for b in block.ops[i + 1:]:
                if _crosses_warps(b):
                    merged = _merge(kernel, block, a, b)
                    if merged is not None:
                        a = merged
            i = block.ops.index(a)
        i += 1


def _merge(kernel: Operation, block: Block, a: Operation, b: Operation) -> Operation | None:
    """``a`` and ``b`` as one group standing where ``a`` stood, ``b``'s slice moved before it;
    None where ``b`` depends on ``a`` or its slice cannot move."""
    threads = {p[0].type.layout.threads for p in (*_parts(a), *_parts(b))}
    if len(threads) != 1 or {p[1] for p in _parts(a)} & {p[1] for p in _parts(b)}:
        return None  # other threads, or one scratch tile (its partials would overwrite the other's)
    ops = block.ops
    ia, ib = ops.index(a), ops.index(b)
    need = set(b.operands)
    slice_: list[Operation] = []
    for op in reversed(ops[ia + 1:ib]):
        if need.intersection(op.results):
            if op.regions or not op.has_trait("pure"):
                return None
            slice_.append(op)
            need.update(op.operands)
    if need.intersection(a.results):
        return None
    for op in slice_:
        op.erase()
    at = block.ops.index(a)
    for op in slice_:  # reversed order of appearance: each goes in front of the one after it
        block.insert(at, op)
    parts = [*_parts(a), *_parts(b)]
    group = hopper.ReduceGroupOp(
        [p[0] for p in parts] + [p[1] for p in parts], [p[2].type for p in parts],
        {"kinds": [p[3] for p in parts], "axes": [p[4] for p in parts],
         "shuffle_xor": [list(p[5]) for p in parts], "warp_xor": [list(p[6]) for p in parts]}, loc=a.loc)
    block.insert(block.ops.index(a), group)
    for old, new in zip([p[2] for p in parts], group.results):
        new.name_hint = old.name_hint
        replace_all_uses(kernel, old, new)
    a.erase()
    b.erase()
    return group
