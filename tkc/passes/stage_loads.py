"""The ``stage-loads`` pass: a loop's per-thread loads copied ``d`` iterations ahead into shared
memory, each thread its own values (pin ``stage_loads = d``).

A ``hopper.load`` lands in registers, so a program has in flight only the rows it has loaded
and not yet used; a loop that reduces each row before it loads the next (a norm's backward,
which sums its weight gradient over the rows a program takes) waits out a DRAM round trip a
row, and the registers the rows take bound the programs an SM holds.  Shared memory holds
rows in flight without registers: each thread copies the values it will read of the row
``d`` iterations ahead with ``cp.async`` (``hopper.async_load``), into bytes that are its own
(``tkc.codegen.runs.private_offsets``), and at the load's place reads them back
(``hopper.async_read``) once ``cp.async.wait_group`` says they have landed.  No thread reads
another's bytes, so no barrier is needed: the copies of a thread complete in the order of its
groups, and it waits for its own.

A load qualifies when it sits directly in the body of a ``tile.for`` with a constant positive
step, its result is a register tile whose every run ``cp.async`` can copy (4, 8 or 16 bytes:
``async_copyable``), it reads the tensor along its last axis (not squeezed, no steps), the
tensor is a parameter the kernel never writes (the copy reads it early), an offset depends on
the induction variable through scalar arithmetic in the body (``prefetch-loads``' rule), and
it is not a vector that a store broadcasts (``deferred``: the store loads it run by run, and
every program reads it, so it is likely in L2).  Each staged load gets a ring of ``d + 1``
stages; the loop, with ``t = (j - lb) // step`` its iteration count so far, becomes

    before the loop, for a in 0 .. d-1:  if lb + a*step < ub: async_load(iteration a) -> stage a
                                         async_commit
    body:  if j + d*step < ub: async_load(iteration t + d) -> stage (t + d) % (d + 1)
           async_commit
           ...
           async_wait {pending = d};  x = async_read(stage t % (d + 1))      (where the load was)

Every iteration commits one group (empty at the loop's end), so ``pending = d`` leaves exactly
the groups of iterations ``t + 1 .. t + d`` in flight.  Stage ``(t + d) % (d + 1)`` is the
one iteration ``t - 1`` read: its values were used in that iteration, before this one's copy
is issued.  Loads that would not fit the shared memory left after the kernel's other tiles
(``Target.smem_per_program`` at the ``ctas_per_sm`` pin) at distance ``d`` are staged at the
largest distance that fits, or not at all.  Inner loops are staged first, and a loop around a
staged loop is not staged: its wait would count the inner loop's groups as well.

Runs on hopper IR after ``prefetch-loads`` (for either target: ``cp.async`` is sm_80 and up),
before ``allocate-smem``, which places the rings.  Without the pin, or with ``stage_loads =
0``, the pass does nothing.

Must not: change what the kernel computes (each value read is the value the load read), or
issue a copy for an iteration the loop does not run.
"""

from __future__ import annotations

from tkc import dtypes
from tkc.codegen.deferred import store_plan
from tkc.codegen.runs import async_copyable, elem_bytes, private_bytes
from tkc.ir.builder import Builder
from tkc.ir.core import Block, BlockArgument, Module, Operation, Value, clone, replace_all_uses, uses
from tkc.ir.dialects import hopper, tile
from tkc.ir.layouts import vector_scratch
from tkc.ir.types import ScalarType, TileType
from tkc.passes.prefetch_loads import offset_slice
from tkc.passes.rotate import pinned_kernels
from tkc.pins import Options
from tkc.target import Target

I32 = ScalarType(dtypes.i32)
I1 = ScalarType(dtypes.i1)


def stage_loads(module: Module, options: Options, target: Target) -> None:
    for kernel in pinned_kernels(module, options.stage_loads > 0):
        room = target.smem_per_program(options.programs_per_sm) - _smem_taken(kernel)
        # A vector that a store broadcasts is loaded by the store itself, run by run
        # (tkc/codegen/deferred.py): few registers, and likely in L2 (every program reads it).
        by_store = store_plan(kernel).deferred
        users = uses(kernel)
        # Inner loops first; a loop around a staged one is left alone: its wait would count the
        # inner loop's groups too, and wait for more than its own copies.
        for loop in reversed([op for op in kernel.walk() if op.name == "tile.for"]):
            step = tile.constant_value(loop.step)
            if not isinstance(step, int) or step < 1 \
                    or any(op.name == "hopper.async_commit" for op in loop.walk()):
                continue
            plans = [(load, slice_) for load in loop.regions[0].block.ops
                     if load not in by_store and _qualifies(kernel, load, users)
                     and (slice_ := offset_slice(loop, load)) is not None]
            stage_bytes = sum(private_bytes(ld.result.type.layout, elem_bytes(ld.result.type.dtype)) for ld, _ in plans)
            distance = min(options.stage_loads, room // stage_bytes - 1) if plans else 0
            if distance >= 1:
                _stage(kernel, loop, plans, step, distance)
                room -= (distance + 1) * stage_bytes


def _smem_taken(kernel: Operation) -> int:
    """Bytes of shared memory the kernel's tiles and barriers take so far."""
    return sum(op.nbytes for op in kernel.walk() if op.name in ("hopper.smem_alloc", "hopper.mbarrier_alloc"))


def _qualifies(kernel: Operation, load: Operation, users: dict) -> bool:
    if load.name != "hopper.load" or not isinstance(load.result.type, TileType):
        return False
    t, tensor = load.result.type, load.tensor
    if load.attributes.get("steps") or tensor.type.rank - 1 in (load.squeeze or []):
        return False
    if t.dtype.bits < 8 or not async_copyable(t.layout, elem_bytes(t.dtype)):  # shared tiles hold 8 bits up
        return False
    if not (isinstance(tensor, BlockArgument) and tensor.block is kernel.regions[0].block):
        return False  # a peer's copy (x.on(r)), or not a parameter
    return all(u.name in hopper.TENSOR_READ_ONLY for u in users.get(tensor, []))


def _stage(kernel: Operation, loop: Operation, plans: list[tuple[Operation, list[Operation]]], step: int,
           distance: int) -> None:
    body: Block = loop.regions[0].block
    iv = body.args[0]
    loc = plans[0][0].loc
    stages = distance + 1
    top = Builder(kernel.regions[0].block, 0, kernel.loc)
    rings = []
    for load, _ in plans:
        t = load.result.type
        lay = vector_scratch(int(t.layout.threads) * int(t.layout.regs), t.dtype)
        ring = top.value(hopper.SmemAllocOp, [], TileType((lay.rows, lay.cols), t.dtype, "smem", lay),
                         {"offset": -1, "stages": stages}, loc=load.loc)
        ring.name_hint = (load.tensor.name_hint or "tile") + "_staged"
        rings.append(ring)

    def const(b: Builder, value: int) -> Value:
        return b.value(tile.ConstantOp, [], I32, {"value": value}, loc=loc)

    def issue(b: Builder, j: Value, stage: Value) -> None:
        """``if j < ub:`` each load's copy of iteration ``j`` into ``stage`` of its ring; then
        the group is committed either way."""
        runs = b.value(tile.CmpOp, [j, loop.ub], I1, {"pred": "lt"}, loc=loc)
        then = Block()
        for (load, slice_), ring in zip(plans, rings):
            mapping: dict[Value, Value] = {iv: j}
            for op in slice_:
                then.append(clone(op, mapping))
            dst = hopper.StageOp([ring, stage], [ring.type], loc=load.loc)
            then.append(dst)
            attrs = {"box": list(load.box), "layout": str(load.result.type.layout)}
            if load.squeeze:
                attrs["squeeze"] = list(load.squeeze)
            if load.other is not None:
                attrs["other"] = load.other
            then.append(hopper.AsyncLoadOp([load.tensor, dst.result, *(mapping.get(o, o) for o in load.offsets)],
                                           [], attrs, loc=load.loc))
        then.append(tile.YieldOp([], [], loc=loc))
        skip = Block()
        skip.append(tile.YieldOp([], [], loc=loc))
        b.insert(tile.IfOp.of(runs, then, skip, loc=loc))
        b.create(hopper.AsyncCommitOp, loc=loc)

    before = Builder.before(loop)
    for a in range(distance):
        issue(before, before.value(tile.AddOp, [loop.lb, const(before, a * step)], I32, loc=loc), const(before, a))

    b = Builder(body, 0, loc)
    count = b.value(tile.SubOp, [iv, loop.lb], I32, loc=loc)
    if step > 1:
        count = b.value(tile.FloorDivOp, [count, const(b, step)], I32, loc=loc)
    ahead = b.value(tile.RemOp, [b.value(tile.AddOp, [count, const(b, distance)], I32, loc=loc),
                                 const(b, stages)], I32, loc=loc)
    here = b.value(tile.RemOp, [count, const(b, stages)], I32, loc=loc)
    issue(b, b.value(tile.AddOp, [iv, const(b, distance * step)], I32, loc=loc), ahead)
    for (load, _), ring in zip(plans, rings):
        # Read where the values are first used: the registers they take are held from there.
        at = Builder.before(_first_user(body, load))
        at.create(hopper.AsyncWaitOp, attrs={"pending": distance}, loc=load.loc)
        src = at.value(hopper.StageOp, [ring, here], ring.type, loc=load.loc)
        read = at.value(hopper.AsyncReadOp, [src], load.result.type, loc=load.loc)
        replace_all_uses(kernel, load.result, read)
        load.erase()


def _first_user(body: Block, load: Operation) -> Operation:
    """The op of ``body`` that first uses ``load``'s result (itself or an op nested in it), or
    the op after ``load`` where none does."""
    after = body.ops[body.ops.index(load) + 1:]
    for op in after:
        if any(load.result in o.operands for o in op.walk()):
            return op
    return after[0]
