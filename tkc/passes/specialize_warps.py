"""The ``specialize-warps`` pass: a producer warpgroup issues the copies, the others compute.

Runs after ``pipeline-loops``.  In a pipelined kernel every warpgroup still both waits for
stages to free up and computes; here the waiting and issuing move to a warpgroup of its own,
the way ThunderKittens' producer/consumer template and FlashAttention-3 do it:

- the **producer** role (warpgroup 0) keeps the copies (``expect_tx``, ``tma_load``), the
  waits on the rings' ``empty`` barriers and the index arithmetic and loops they need, and
  gives registers back (``setmaxnreg`` to 24, as FlashAttention-3's producer; 40 where it
  also runs a multi-GPU kernel's waits, barriers or peers' addresses; the pin
  ``producer_regs`` sets it); its first
  warp alone runs them (``warps = 1``: thread 0 issues every copy, and a warp that only spun
  on the waits could fall two phases behind a ring, whose waits test a phase's parity);
- both roles run the waits for peers' flags and the barriers across ranks (``tile.wait``,
  ``tile.rank_barrier``), each at its place: they order the producer's copies as much as the
  consumers' accesses (but for a wait ``pipeline-loops`` issued again for copies ahead of their
  iteration, ``copies = true``: the producer's alone);
- the **consumers** role (warpgroups 1 .. G, as many as the kernel had) keeps everything
  else, and takes the registers the producer gave up (``setmaxnreg``, the most that fits what
  the CTA is launched with, ``tkc.registers``, at most 240); its threads count from 0, so
  every layout stays as it was.

The producer's loops are the consumers' loops without their carried values (but for scalars
the copies need, such as the count of a ring's earlier iterations a persistent tile loop
carries when the inner loop's length changes from tile to tile); since the only
thing the two roles share is the ring protocol, the producer runs ahead as far as the
``empty`` barriers let it.  What both roles need and is the same for every thread (sizes,
program ids, loop bounds, an if that only picks such scalars: a launch order's block and head)
stays before the roles; allocations and barrier initialization too.

The pin ``pingpong = true`` makes two consumers take turns (``hopper.turn``, ping-pong as in
FlashAttention-3) in every consumer loop with a product: each waits for its turn before
issuing a wgmma and passes it right after, so the two warpgroups run in opposite phases, one
on the tensor cores while the other computes in registers.  It is off by default: on an H100,
attention at D=128 and 16k tokens ran at 574 TFLOP/s with turns against 609 without (the
warpgroups already overlap; each turn adds a barrier round trip), within 2% either way
elsewhere (benchmarks/RESULTS.md).

The kernel's constant ``warp_specialize = false`` turns the pass off; ``consumers = N`` must
match the kernel's warpgroups (64 to 256 rows of every product per consumer, which
``select-layouts`` chose from the same pin).  Kernels without a
ring, kernels that still synchronize the whole CTA inside (a loop ``pipeline-loops`` left
serial) and kernels with cluster reductions (each meets every thread of the cluster) stay as
they are.

The barriers a consumer loop keeps around a register tile it stores for wgmma
(``hopper.to_smem``: attention backward's dS) order only the consumers' own stores and reads:
they become ``hopper.sync``, the consumers' own barrier.

Must not: change what any thread computes, or choose layouts or stage counts.
"""

from __future__ import annotations

from tkc.errors import TkcUnsupportedError, TkcUsageError
from tkc.ir.core import Block, Module, Operation, Region, Value, clone
from tkc.ir.dialects import hopper, tile
from tkc.ir.types import TileType
from tkc.pins import Options
from tkc.registers import SETMAXNREG_MIN, register_pool
from tkc.target import Target

PRODUCER_REGS = 24
# A producer that also waits for peers' flags, meets other ranks or loads peers' addresses:
# 24 registers spill moe_dispatch.tk's 64-bit addresses, and where they do not (ring attention,
# the fused GEMMs) 24 ran 2-13% slower than 40 at 6 of 8 shapes on 4 H200s, 1-2% faster at two
# (benchmarks/RESULTS.md, 2026-11-27, the pin producer_regs).
RANK_PRODUCER_REGS = 40
MAX_CONSUMER_REGS = 240

# Top-level ops every warpgroup runs before the roles: shared memory set-up.
_SETUP = ("hopper.smem_alloc", "hopper.mbarrier_alloc", "hopper.mbarrier_init", "hopper.fence_mbarrier_init",
          "hopper.barrier", "tile.grid")

# Ops both roles run, each in its place: a wait for a peer's flag and a barrier across ranks
# order the producer's copies after them as much as the consumers' loads and stores.
_BOTH = ("tile.wait", "tile.rank_barrier")


def _both(op: Operation) -> bool:
    """Whether both roles run ``op``: a wait or barrier across ranks, but for a wait that guards
    copies issued ahead of their iteration (``copies``: the producer's alone)."""
    return op.name in _BOTH and not op.attributes.get("copies")


def specialize_warps(module: Module, options: Options, target: Target) -> None:
    for kernel in module.ops:
        if kernel.name == "tile.kernel":
            _Specializer(kernel, options, target).run()


def consumer_regs(consumers: int, ctas_per_sm: int, target: Target, producer: int = PRODUCER_REGS) -> int:
    """The register budget of each consumer thread once the producer holds ``producer``: the most that
    fits what the CTA holds from launch (``tkc.registers``: more, and ``setmaxnreg.inc`` waits
    forever), a multiple of 8, at most 240 (what FlashAttention-3 uses).  240 for two consumers,
    160 for three, 112 for four."""
    wg = target.warpgroup
    pool = register_pool(wg * (consumers + 1), ctas_per_sm, target)
    free = (pool - producer * wg) // (wg * consumers)
    return min(MAX_CONSUMER_REGS, free - free % 8)


def _owner(v: Value) -> Operation | None:
    return getattr(v, "owner", None)


def _scalar_if(op: Operation, common: set[Value]) -> bool:
    """Whether ``op`` is an if that only picks scalars from common values: both roles compute
    it before they part."""
    return tile.picks_scalars(op) and all(v in common for v in tile.outside_operands(op))


class _Specializer:
    def __init__(self, kernel: Operation, options: Options, target: Target):
        self.kernel = kernel
        self.body: Block = kernel.regions[0].block
        self.options, self.target = options, target

    def run(self) -> None:
        if not self.options.warp_specialize:
            return
        wg = self.target.warpgroup
        warpgroups = (self.kernel.attributes.get("threads") or wg) // wg
        pin = self.options.consumers
        if pin is not None and pin != warpgroups:
            raise TkcUnsupportedError(
                f"consumers = {pin!r}: this kernel computes in {warpgroups} warpgroups, so it runs "
                f"{warpgroups} consumers (change the tile rows instead)",
                self.kernel.loc)
        ops = list(self.kernel.walk())
        if not any(op.name == "hopper.mbarrier_alloc" and op.attributes.get("stages", 1) > 1 for op in ops):
            return  # nothing to overlap
        if any(op.name == "hopper.barrier" and op.parent is not self.body and self._serial(op) for op in ops):
            return  # a loop still synchronizes every thread: the producer would have to join it
        if tile.has_cluster_reductions(self.kernel):
            return  # each cluster reduction meets every thread of the cluster (barrier.cluster)
        self.common = self._common()
        producer = self._producer_ops()
        if producer is None or any(tile.is_atomic(op) for op in producer):
            # An atomic the producer needs (its old value picks what to copy) would run in both
            # roles; one only the consumers need (a signal) is issued once, by their thread 0.
            return
        self._split(producer, warpgroups)

    # -------------------------------------------------------------- analysis
    @staticmethod
    def _serial(barrier: Operation) -> bool:
        """Whether ``barrier`` (in a loop) may order the producer's copies: its loop copies into
        a tile that is no ring stage (a loop ``pipeline-loops`` left serial).  Otherwise it only
        orders the consumers' own stores of a register tile for wgmma (``hopper.to_smem``), and
        becomes their role's barrier."""
        loop = next((a for a in barrier.ancestors() if a.name == "tile.for"), None)
        return loop is None or any(op.name == "hopper.tma_load" and (_owner(op.operands[1]) is None
                                                      or _owner(op.operands[1]).name != "hopper.stage")
                   for op in loop.walk())

    def _common(self) -> set[Value]:
        """Values every warpgroup computes before the roles: kernel parameters, and results of
        top-level set-up ops and of top-level pure scalar ops on common values."""
        common: set[Value] = set(self.body.args)
        for op in self.body.ops:
            scalar = op.has_trait("pure") and not op.regions and not any(
                isinstance(r.type, TileType) for r in op.results)
            readonly = op.name in ("tile.dim", "tile.program_id", "tile.num_programs")
            if op.name in _SETUP or ((scalar or readonly or _scalar_if(op, common))
                                     and all(v in common for v in op.operands)):
                common.update(op.results)
        return common

    def _empty_rings(self) -> set[Value]:
        """Barriers (allocations) that consumers arrive on: waiting on them is the producer's."""
        rings = set()
        for op in self.kernel.walk():
            if op.name == "hopper.mbarrier_arrive":
                b = op.barrier
                rings.add(b.owner.ring if _owner(b) is not None and b.owner.name == "hopper.stage" else b)
        return rings

    def _producer_ops(self) -> set[Operation] | None:
        """The ops the producer needs, or None when it would need a value carried by a loop or
        computed by the consumers."""
        empty = self._empty_rings()
        seeds = []
        for op in self.kernel.walk():
            if op.name in ("hopper.expect_tx", "hopper.tma_load", *_BOTH):  # (a wait with copies=true too)
                seeds.append(op)
            elif op.name == "hopper.mbarrier_wait":
                b = op.barrier
                ring = b.owner.ring if _owner(b) is not None and b.owner.name == "hopper.stage" else b
                if ring in empty:
                    seeds.append(op)
        need: set[Operation] = set()
        self.carried: dict[Operation, set[int]] = {}  # loop -> the carried values the producer keeps
        self.scalar_ifs: set[Operation] = set()  # ifs of scalars whose results the producer reads
        work: list[Operation | Value] = list(seeds)
        while work:
            item = work.pop()
            if isinstance(item, Value):
                if not self._need_value(item, work):
                    return None
                continue
            op = item
            if op in need or op.parent is self.body and op.name in _SETUP:
                continue
            need.add(op)
            for anc in op.ancestors():
                if anc not in need:
                    work.append(anc)
            work.extend(op.operands if op.name != "tile.for" else op.operands[:3])  # carried values: if used
        return need

    def _need_value(self, v: Value, work: list) -> bool:
        """Queue what computing ``v`` takes; False when the producer cannot compute it."""
        if v in self.common:
            return True
        d = _owner(v)
        if d is not None:
            if d.name == "tile.for" and not isinstance(v.type, TileType):
                # A scalar a loop carries out (a ring's count of earlier iterations that an inner
                # loop of varying length carries through it): the producer's copy carries it too.
                k = d.results.index(v)
                work.append(d)
                if k not in self.carried.setdefault(d, set()):
                    self.carried[d].add(k)
                    work.extend([d.operands[3 + k], d.regions[0].block.terminator.operands[k]])
                return True
            if tile.picks_scalars(d):
                # The producer computes its own copy (a persistent walk's launch order).
                self.scalar_ifs.add(d)
                work.append(d)
                work.extend(tile.outside_operands(d))
                return True
            if d.name in ("tile.for", "tile.if") or isinstance(v.type, TileType) and v.type.space == "reg":
                return False  # a result of the consumers' control flow or of their registers
            work.append(d)
            return True
        # A block argument: a loop's induction variable, or a scalar the loop carries (a ring's
        # count of earlier iterations), kept when its start and its update are the producer's too.
        block = v.block
        loop = block.parent.parent if block.parent else None
        if loop is None or loop.name != "tile.for":
            return False
        k = block.args.index(v) - 1
        if k < 0:
            return True
        if isinstance(v.type, TileType):
            return False
        if k not in self.carried.setdefault(loop, set()):
            self.carried[loop].add(k)
            work.extend([loop.operands[3 + k], block.terminator.operands[k]])
        return True

    # -------------------------------------------------------------- rewrite
    def _split(self, producer: set[Operation], warpgroups: int) -> None:
        body = self.body

        def work(op: Operation) -> bool:
            # (an op with regions is common only as a scalar if: _scalar_if)
            return op.name not in _SETUP and op.name != "tile.return" and not (
                op.results and all(r in self.common for r in op.results))

        # A top-level barrier after the work has begun is the consumers' (a register tile stored
        # for a product after the K loop, read by all warpgroups): set-up barriers come first.
        begun = next((i for i, op in enumerate(body.ops) if work(op)), len(body.ops))
        moved = [op for i, op in enumerate(body.ops) if work(op) or (op.name == "hopper.barrier" and i > begun)]
        # The producer: a filtered copy of what it needs, in order.
        prod_block = Block()
        mapping: dict[Value, Value] = {}
        for op in moved:
            if op in producer:
                self._copy_filtered(op, producer, prod_block, mapping)
        prod_block.append(tile.YieldOp([], [], loc=body.terminator.loc))
        # The consumers: the original ops, without what only the producer needs.
        cons_block = Block()
        for op in moved:
            op.erase()
            cons_block.append(op)
        self._strip(cons_block, producer)
        for op in [inner for o in cons_block.ops for inner in o.walk() if inner.name == "hopper.barrier"]:
            op.parent.insert(op.parent.ops.index(op), hopper.SyncOp([], [], loc=op.loc))
            op.erase()
        cons_block.append(tile.YieldOp([], [], loc=body.terminator.loc))
        ret = body.terminator
        index = body.ops.index(ret)
        ranks = any(op.name in tile.RANK_OPS for op in producer)
        producer_regs = self.options.producer_regs or (RANK_PRODUCER_REGS if ranks else PRODUCER_REGS)
        regs = consumer_regs(warpgroups, self.options.programs_per_sm, self.target, producer_regs)
        if regs < SETMAXNREG_MIN and self.options.producer_regs:
            raise TkcUsageError(f"pin producer_regs = {producer_regs}: with {warpgroups} consumer warpgroup"
                                f"{'s' if warpgroups > 1 else ''} and {self.options.programs_per_sm} program"
                                f"{'s' if self.options.programs_per_sm > 1 else ''} an SM the consumers would "
                                f"keep {max(regs, 0)} registers a thread (setmaxnreg takes {SETMAXNREG_MIN} at least); "
                                f"give the producer fewer (-D producer_regs=40) or run fewer programs an SM",
                                self.kernel.loc)
        # The producer's copies are issued by one thread, so one warp runs its loops: the
        # other three would only spin on the same parity waits, and one left behind by the
        # ring's turns (two phases of a stage while it is not scheduled) would wait forever.
        for name, first, count, budget, block, warps in (
                ("producer", 0, 1, producer_regs, prod_block, {"warps": 1}),
                ("consumers", 1, warpgroups, regs, cons_block, {})):
            role = hopper.RoleOp([], [], {"name": name, "first": first, "warpgroups": count, "regs": budget,
                                          **warps}, [Region([block])], loc=self.kernel.loc)
            body.insert(index, role)
            index += 1
        self.kernel.attributes["threads"] = self.target.warpgroup * (warpgroups + 1)
        self._take_turns(cons_block, warpgroups)

    def _take_turns(self, block: Block, warpgroups: int) -> None:
        """Ping-pong, when pinned: turns around every wgmma of the consumer loops."""
        if not self.options.pingpong:
            return
        if warpgroups != 2:
            raise TkcUnsupportedError(f"pingpong = true takes turns between two consumer warpgroups; "
                                      f"this kernel has {warpgroups}", self.kernel.loc)
        for loop in [inner for op in block.ops for inner in op.walk() if inner.name == "tile.for"]:
            body = loop.regions[0].block
            products = [op for op in body.ops if op.name == "hopper.wgmma"]
            if not products:
                continue
            for op in products:
                body.insert(body.ops.index(op), hopper.TurnOp([], [], {"kind": "wait"}, loc=op.loc))
                body.insert(body.ops.index(op) + 1, hopper.TurnOp([], [], {"kind": "pass"}, loc=op.loc))
            outer = loop.parent
            outer.insert(outer.ops.index(loop), hopper.TurnOp([], [], {"kind": "start"}, loc=loop.loc))
            outer.insert(outer.ops.index(loop) + 1, hopper.TurnOp([], [], {"kind": "end"}, loc=loop.loc))

    def _copy_filtered(self, op: Operation, keep: set[Operation], into: Block, mapping: dict[Value, Value]) -> None:
        """Append to ``into`` a copy of ``op`` keeping, inside its regions, only ``keep``; loops
        lose their carried values and branches their results (the producer needs neither)."""
        if not op.regions or op in self.scalar_ifs:  # (an if of scalars the producer reads: whole)
            into.append(clone(op, mapping))
            return
        if op.name == "tile.for":
            src = op.regions[0].block
            kept = sorted(self.carried.get(op, ()))
            inits = [op.operands[3 + k] for k in kept]
            new = tile.ForOp([mapping.get(v, v) for v in [*op.operands[:3], *inits]], [v.type for v in inits],
                             loc=op.loc)
            mapping.update(zip([op.results[k] for k in kept], new.results))
            args = [src.args[0], *(src.args[1 + k] for k in kept)]
            blk = Block([a.type for a in args], [a.name_hint for a in args])
            mapping.update(zip(args, blk.args))
            self._fill(src, keep, blk, mapping, [src.terminator.operands[k] for k in kept])
            new.regions.append(Region([blk]))
        elif op.name == "tile.if":
            new = tile.IfOp([mapping.get(op.operands[0], op.operands[0])], [], loc=op.loc)
            for r in op.regions:
                blk = Block()
                self._fill(r.blocks[0], keep, blk, mapping)
                new.regions.append(Region([blk]))
        else:
            raise TkcUnsupportedError(f"specialize-warps: cannot split '{op.name}'", op.loc)
        for r in new.regions:
            r.parent = new
        into.append(new)

    def _fill(self, src: Block, keep: set[Operation], into: Block, mapping: dict[Value, Value],
              yielded: list[Value] = ()) -> None:
        for inner in src.ops:
            if inner in keep and not inner.has_trait("terminator"):
                self._copy_filtered(inner, keep, into, mapping)
        end = src.terminator
        into.append(tile.YieldOp([mapping.get(v, v) for v in yielded], [], loc=end.loc if end is not None else None))

    def _strip(self, block: Block, producer: set[Operation]) -> None:
        """Remove from the consumers' ops what only the producer needs: its side-effecting ops,
        then every pure op and control op left without a use or an effect."""
        for op in list(block.ops):
            for r in op.regions:
                for b in r.blocks:
                    self._strip(b, producer)
            if op in producer and not _both(op) and (not op.has_trait("pure") or op.regions) \
                    and not op.results:
                if not op.regions or not self._has_effect(op, producer):
                    op.erase()
        changed = True
        while changed:
            changed = False
            used = {v for o in block.parent_op.walk() for v in o.operands} if block.parent_op else set()
            used |= {v for o in block.ops for inner in o.walk() for v in inner.operands}
            for op in reversed(list(block.ops)):
                if op in producer and op.has_trait("pure") and not any(r in used for r in op.results):
                    op.erase()
                    changed = True

    @staticmethod
    def _has_effect(op: Operation, producer: set[Operation]) -> bool:
        """Whether a control op still holds something the consumers do (a wait or a barrier
        across ranks included: both roles run those)."""
        return any(inner is not op and (inner not in producer or _both(inner))
                   and not inner.has_trait("terminator") for inner in op.walk())
