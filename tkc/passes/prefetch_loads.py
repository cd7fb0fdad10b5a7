"""The ``prefetch-loads`` pass: the box a loop's per-thread load reads ``d`` iterations from
now is fetched into L2 ahead of it (pin ``prefetch = d``).

A ``hopper.load`` lands in registers, so a program has in flight only the bytes of the loads
it has issued and not yet used; a loop that reduces each block before loading the next (a
long row's norm) waits out a DRAM round trip per block, with a few kilobytes in flight a
program.  A prefetch into L2 holds no register and no shared memory: thread 0 asks for the
block of iteration ``j + d`` (``hopper.prefetch``, one bulk request a row of the box) while
the threads work on block ``j``, so ``d`` more blocks a program are in flight and the load
itself finds its block in L2.

Runs on hopper IR after the scheduling passes (``specialize-warps``, ``issue-ahead``,
``defer-last``, ``multicast``), so it sees loops where they end up.  A ``hopper.load``
directly in the body of a ``tile.for`` with a constant positive step qualifies when one of
its offsets depends on the induction variable through scalar arithmetic in the body, and its
box has rows along the tensor's last axis, at most ``MAX_ROWS`` of them (thread 0 issues one
request a row) and each at least a 128-byte line long.  The pass puts at the top of the body

    if j + d * step < ub:  hopper.prefetch <each such load's box at iteration j + d>

(the offsets' arithmetic copied with ``j + d * step`` for ``j``), and before the loop the
same for iterations ``lb + step`` to ``lb + (d - 1) * step``: iteration ``lb``'s own loads
are issued at once.  Without the pin, or with ``prefetch = 0``, the pass does nothing.

Must not: change what the kernel computes (a prefetch moves no value), or prefetch an
iteration the loop does not run.
"""

from __future__ import annotations

from tkc import dtypes
from tkc.ir.builder import Builder
from tkc.ir.core import Block, Module, Operation, Value, clone
from tkc.ir.dialects import hopper, tile
from tkc.ir.types import ScalarType
from tkc.passes.rotate import pinned_kernels
from tkc.pins import Options
from tkc.target import Target

I32 = ScalarType(dtypes.i32)
I1 = ScalarType(dtypes.i1)
#: Rows of a box thread 0 requests one by one; a taller tile is better copied by TMA.
MAX_ROWS = 16
#: A request shorter than a 128-byte line costs thread 0 more than it saves.
MIN_ROW_BYTES = 128


def prefetch_loads(module: Module, options: Options, target: Target) -> None:
    distance = options.prefetch
    for kernel in pinned_kernels(module, distance > 0):
        for loop in [op for op in kernel.walk() if op.name == "tile.for"]:
            step = tile.constant_value(loop.step)
            if not isinstance(step, int) or step < 1:
                continue
            plans = [(load, slice_) for load in loop.regions[0].block.ops if load.name == "hopper.load"
                     and _worth_it(load) and (slice_ := offset_slice(loop, load)) is not None]
            if plans:
                _prefetch(loop, plans, step, distance)


def _worth_it(load: Operation) -> bool:
    """The box has rows along the tensor's last axis (not squeezed), at most ``MAX_ROWS`` of
    them, each at least ``MIN_ROW_BYTES`` long."""
    rank = load.tensor.type.rank
    if rank - 1 in (load.squeeze or []):
        return False
    rows = 1
    for extent in load.box[:-1]:
        rows *= extent
    return rows <= MAX_ROWS and load.box[-1] * load.tensor.type.dtype.bits // 8 >= MIN_ROW_BYTES


def offset_slice(loop: Operation, load: Operation) -> list[Operation] | None:
    """The body ops the load's offsets are computed by from the induction variable, in body
    order; None when no offset depends on it, or one depends on anything in the body but
    scalar arithmetic (a loop-carried value, a tile)."""
    body: Block = loop.regions[0].block
    iv = body.args[0]
    carried = set(body.args[1:])
    in_body = {r: op for op in body.ops for r in op.results}
    needed: list[Operation] = []
    reaches_iv = False
    stack = list(load.offsets)
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if v is iv:
            reaches_iv = True
        elif v in carried:
            return None
        elif v in in_body:
            op = in_body[v]
            if op.regions or not op.has_trait("pure") or not all(isinstance(r.type, ScalarType) for r in op.results):
                return None
            needed.append(op)
            stack.extend(op.operands)
    if not reaches_iv:
        return None
    return sorted(needed, key=body.ops.index)


def _prefetch(loop: Operation, plans: list[tuple[Operation, list[Operation]]], step: int, distance: int) -> None:
    """At the top of the body, and before the loop for iterations ``lb + step`` on, one guarded
    block that prefetches every planned load's box ``distance`` iterations ahead."""
    body: Block = loop.regions[0].block
    iv = body.args[0]
    loc = plans[0][0].loc

    def guarded(b: Builder, at: Value, ahead: int) -> None:
        """``if at + ahead * step < ub:`` prefetch each load's box at iteration ``at + ahead * step``."""
        k = b.value(tile.ConstantOp, [], I32, {"value": ahead * step}, loc=loc)
        j = b.value(tile.AddOp, [at, k], I32, loc=loc)
        runs = b.value(tile.CmpOp, [j, loop.ub], I1, {"pred": "lt"}, loc=loc)
        then = Block()
        for load, slice_ in plans:
            mapping: dict[Value, Value] = {iv: j}
            for op in slice_:
                then.append(clone(op, mapping))
            attrs = {"box": list(load.box)}
            if load.attributes.get("squeeze"):
                attrs["squeeze"] = list(load.attributes["squeeze"])
            then.append(hopper.PrefetchOp([load.tensor, *(mapping.get(o, o) for o in load.offsets)], [], attrs,
                                          loc=load.loc))
        then.append(tile.YieldOp([], [], loc=loc))
        skip = Block()
        skip.append(tile.YieldOp([], [], loc=loc))
        b.insert(tile.IfOp.of(runs, then, skip, loc=loc))

    guarded(Builder(body, 0, loc), iv, distance)
    before_loop = Builder.before(loop)
    for ahead in range(1, distance):
        guarded(before_loop, loop.lb, ahead)
