"""The ``transpose-in-producer`` pass: an 8-bit tile the consumers transpose in shared memory
each iteration (FP8 attention's V, ``hopper.smem_copy``) is transposed by the producer
warpgroup instead, into a ring of its own, as FlashAttention-3 does.

Runs on hopper IR right after ``specialize-warps``.  Before, a consumer loop iteration waits
for V's stage, every consumer thread copies its share of it transposed into one shared tile,
fences, meets the others and releases V's stage; the products then read the copy, which the
next iteration rewrites.  After:

- the producer's loop, in iteration ``j`` (after its refill), meets its four warps (so none
  falls a phase behind another), waits for V's stage of ``j`` and for the transposed ring's
  stage ``j % 2`` to be free, copies, fences for the async proxy, and every producer thread
  arrives on V's ``empty`` barrier (V's stage is free again) and on the transposed ring's
  ``full`` one;
- the consumer loop waits on that ``full`` barrier right before the product that reads the
  copy, reads the ring's stage, and releases it behind that product's wait.

The consumers lose the copy, its fence and its two barriers, the product reading the copy
reads a ring stage, so ``defer-last`` applies, and the producer warpgroup runs on all four
warps with 40 registers a thread (the consumers keep what is left).  Two stages: the producer
copies block ``j + 1`` while the consumers read block ``j``.

Applies where the loop with the copy is a consumer role's own top-level loop whose iteration
counts the ring (no persistent tile loop around it), the producer has a loop of the same
bounds, the copy is the one ``lower-to-hopper`` makes (wait, copy, fence, meet, release), and
the ring's second tile fits in shared memory beside every other allocation; elsewhere the
kernel stays as it is (FP8 attention at D = 128 with 192-key blocks: three stages of K and V
leave no room).  The pin ``transpose_in_producer = false`` keeps the
consumers' copy.

Must not: change what any thread computes; the copy's bytes land in the same layout.
"""

from __future__ import annotations

from tkc.ir.builder import Builder
from tkc.ir.core import Block, Module, Operation, Value
from tkc.ir.dialects import hopper, tile
from tkc.ir.types import MBARRIER
from tkc.passes.allocate_smem import allocated_bytes
from tkc.passes.rotate import I32
from tkc.passes.specialize_warps import RANK_PRODUCER_REGS, consumer_regs
from tkc.pins import Options
from tkc.target import Target

STAGES = 2
# A producer that runs more than copies and waits keeps 40 registers (specialize-warps' rule for
# multi-GPU producers); the copy holds 12 words a block beside its addresses.  24 was not timed.
PRODUCER_REGS = RANK_PRODUCER_REGS


def transpose_in_producer(module: Module, options: Options, target: Target) -> None:
    if not options.transpose_in_producer:
        return
    for kernel in module.ops:
        if kernel.name == "tile.kernel":
            _rewrite(kernel, options, target)


def _owner(v: Value) -> Operation | None:
    return getattr(v, "owner", None)


def _roles(kernel: Operation) -> dict[str, Operation]:
    return {op.attributes["name"]: op for op in kernel.regions[0].block.ops if op.name == "hopper.role"}


def _rewrite(kernel: Operation, options: Options, target: Target) -> None:
    roles = _roles(kernel)
    producer, consumers = roles.get("producer"), roles.get("consumers")
    if producer is None or consumers is None:
        return
    for loop in [op for op in consumers.regions[0].block.ops if op.name == "tile.for"]:
        match = _copy_in(loop)
        if match is None:
            continue
        feeder = _feeder(producer, loop)
        if feeder is None:
            continue
        _move(kernel, producer, consumers, loop, feeder, match, options, target)


class _Copy:
    """The consumers' copy in a loop body: the wait for V's stage, the copy, its fence and
    barrier, V's release, and the barrier before them (the last iteration's products done with
    the copy)."""

    def __init__(self, ops: list[Operation], wait: Operation, copy: Operation, stage: Value):
        self.ops, self.wait, self.copy, self.stage = ops, wait, copy, stage


def _copy_in(loop: Operation) -> _Copy | None:
    body: Block = loop.regions[0].block
    copies = [op for op in loop.walk() if op.name == "hopper.smem_copy"]
    if len(copies) != 1 or copies[0].parent is not body:
        return None
    copy = copies[0]
    # The loop body's side effects around the copy (stage numbers between them are pure).
    effects = [op for op in body.ops if not op.has_trait("pure")]
    i = effects.index(copy)
    if i < 1 or i + 3 >= len(effects):
        return None
    wait, fence, sync, arrive = effects[i - 1], effects[i + 1], effects[i + 2], effects[i + 3]
    src, dst = _owner(copy.src), _owner(copy.dst)
    if not (wait.name == "hopper.mbarrier_wait" and fence.name == "hopper.fence_proxy_async"
            and sync.name == "hopper.sync" and arrive.name == "hopper.mbarrier_arrive"
            and not arrive.attributes.get("cluster") and not arrive.attributes.get("threads")
            and src is not None and src.name == "hopper.stage" and dst is not None
            and dst.name == "hopper.smem_alloc" and not dst.attributes.get("stages")):
        return None
    # The wait and the release name stages of the same index as the copied tile.
    full, empty = _owner(wait.barrier), _owner(arrive.barrier)
    if any(x is None or x.name != "hopper.stage" or x.index is not src.index for x in (full, empty)):
        return None
    stage = src.index
    if not _counts_iterations(loop, stage):
        return None
    moved = [wait, copy, fence, sync, arrive]
    if i >= 2 and effects[i - 2].name == "hopper.sync":  # the last iteration's products done with the copy
        moved.insert(0, effects[i - 2])
    return _Copy(moved, wait, copy, stage)


def _counts_iterations(loop: Operation, stage: Value) -> bool:
    """Whether ``stage`` is the loop's induction variable modulo a constant (a ring whose
    position is the iteration: no persistent tile loop counting around it)."""
    rem = _owner(stage)
    iv = loop.regions[0].block.args[0]
    return rem is not None and rem.name == "tile.rem" and rem.operands[0] is iv \
        and tile.constant_value(rem.operands[1]) is not None \
        and tile.constant_value(loop.lb) == 0 and tile.constant_value(loop.step) == 1


def _feeder(producer: Operation, loop: Operation) -> Operation | None:
    """The producer's loop over the same iterations as ``loop`` (its main loop, which refills)."""
    for op in producer.regions[0].block.ops:
        if op.name == "tile.for" and op.operands[:3] == loop.operands[:3]:
            return op
    return None


def _alloc_before(kernel: Operation, anchor: Operation, op: Operation) -> Value:
    block = kernel.regions[0].block
    block.insert(block.ops.index(anchor), op)
    return op.result


def _move(kernel: Operation, producer: Operation, consumers: Operation, loop: Operation, feeder: Operation,
          c: _Copy, options: Options, target: Target) -> None:
    body: Block = loop.regions[0].block
    dst_alloc = _owner(c.copy.dst)
    v_full = _owner(c.wait.barrier).ring
    v_empty = _owner(c.ops[-1].barrier).ring
    v_ring = _owner(c.copy.src).ring
    loc = c.copy.loc
    top = kernel.regions[0].block
    inits = [op for op in top.ops if op.name == "hopper.mbarrier_init"]
    empty_init = next((op for op in inits if op.barrier is v_empty), None)
    if empty_init is None:
        return
    # The product reading the copy and its wait, in the loop's body; no other reader anywhere.
    reader = next((op for op in body.ops if op.name == "hopper.wgmma" and c.copy.dst in op.operands), None)
    done = None if reader is None else next(
        (op for op in body.ops if op.name == "hopper.wgmma_wait" and op.x is reader.result), None)
    readers = [op for op in kernel.walk() if c.copy.dst in op.operands and op is not c.copy]
    if done is None or readers != [reader]:
        return
    releases = empty_init.attributes["count"]  # one a consumer warpgroup, as V's release had
    threads = target.warpgroup * producer.attributes["warpgroups"]
    # The ring takes STAGES tiles where the copy took one: only where every allocation still
    # fits side by side (allocate-smem may share bytes between some; this does not count on it).
    allocs = [op for op in top.ops if op.name in ("hopper.smem_alloc", "hopper.mbarrier_alloc")]
    taken = allocated_bytes(allocs)
    extra = (STAGES - 1) * dst_alloc.nbytes + 2 * STAGES * hopper.MBarrierAllocOp.stride
    if taken + extra > target.smem_per_program(options.programs_per_sm):
        return

    # The ring of transposed copies and its barriers, beside the copy's old tile.
    t = dst_alloc.result.type
    ring = _alloc_before(kernel, dst_alloc, hopper.SmemAllocOp([], [t], {"offset": -1, "stages": STAGES}, loc=loc))
    ring.name_hint = (dst_alloc.result.name_hint or "t").replace("_t_smem", "_t")
    full = _alloc_before(kernel, dst_alloc, hopper.MBarrierAllocOp([], [MBARRIER], {"offset": -1, "stages": STAGES},
                                                                   loc=loc))
    empty = _alloc_before(kernel, dst_alloc, hopper.MBarrierAllocOp([], [MBARRIER], {"offset": -1, "stages": STAGES},
                                                                    loc=loc))
    full.name_hint, empty.name_hint = ring.name_hint + "_full", ring.name_hint + "_empty"
    at = top.ops.index(empty_init)
    top.insert(at + 1, hopper.MBarrierInitOp([full], [], {"count": threads}, loc=loc))
    top.insert(at + 2, hopper.MBarrierInitOp([empty], [], {"count": releases}, loc=loc))
    empty_init.attributes["count"] = threads  # V's stage is now released by every producer thread

    # The consumers: wait for the ring's stage right before the product reading it, read it,
    # release it behind that product's wait.
    for op in c.ops:
        op.erase()
    iv = body.args[0]
    b = Builder.before(reader)
    stage, phase = _position(b, iv, STAGES, loc)
    b.create(hopper.MBarrierWaitOp, [b.value(hopper.StageOp, [full, stage], MBARRIER, loc=loc), phase], loc=loc)
    staged = b.value(hopper.StageOp, [ring, stage], t, loc=loc)
    reader.operands = [staged if v is c.copy.dst else v for v in reader.operands]
    r = Builder(body, body.ops.index(done) + 1, loc)
    r.create(hopper.MBarrierArriveOp, [r.value(hopper.StageOp, [empty, stage], MBARRIER, loc=loc)], loc=loc)
    dst_alloc.erase()

    # The producer: after the refill, meet, wait, copy, fence, release V and fill the ring.
    pbody: Block = feeder.regions[0].block
    j = pbody.args[0]
    p = Builder.before(pbody.terminator)
    p.create(hopper.SyncOp, loc=loc)
    vs, vphase = _position(p, j, tile.constant_value(_owner(c.stage).operands[1]), loc)
    p.create(hopper.MBarrierWaitOp, [p.value(hopper.StageOp, [v_full, vs], MBARRIER, loc=loc), vphase], loc=loc)
    ts, tphase = _position(p, j, STAGES, loc)
    free = p.value(tile.XorOp, [tphase, _const(p, 1, loc)], I32, loc=loc)
    p.create(hopper.MBarrierWaitOp, [p.value(hopper.StageOp, [empty, ts], MBARRIER, loc=loc), free], loc=loc)
    src = p.value(hopper.StageOp, [v_ring, vs], v_ring.type, loc=loc)
    p.create(hopper.SmemCopyOp, [src, p.value(hopper.StageOp, [ring, ts], t, loc=loc)], loc=loc)
    p.create(hopper.FenceProxyAsyncOp, loc=loc)
    for bar, index in ((v_empty, vs), (full, ts)):
        p.create(hopper.MBarrierArriveOp, [p.value(hopper.StageOp, [bar, index], MBARRIER, loc=loc)],
                 attrs={"threads": True}, loc=loc)

    # Every producer warp runs (the copy's threads), with more registers.
    producer.attributes.pop("warps", None)
    regs = options.producer_regs or max(PRODUCER_REGS, producer.attributes["regs"])
    producer.attributes["regs"] = regs
    consumers.attributes["regs"] = consumer_regs(consumers.attributes["warpgroups"], options.programs_per_sm,
                                                 target, regs)


def _const(b: Builder, value: int, loc: object) -> Value:
    return b.value(tile.ConstantOp, [], I32, {"value": value}, loc=loc)


def _position(b: Builder, iv: Value, stages: int, loc: object) -> tuple[Value, Value]:
    """The stage of a ring of ``stages`` and the parity its ``full`` barrier completes with,
    for iteration ``iv`` (a ring counting from 0)."""
    stage = b.value(tile.RemOp, [iv, _const(b, stages, loc)], I32, loc=loc)
    rnd = b.value(tile.FloorDivOp, [iv, _const(b, stages, loc)], I32, loc=loc)
    return stage, b.value(tile.AndOp, [rnd, _const(b, 1, loc)], I32, loc=loc)
