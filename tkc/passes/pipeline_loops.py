"""The ``pipeline-loops`` pass: TMA copies in a loop become an S-stage ring.

Runs on hopper IR after ``lower-to-hopper``, which gives each loop iteration one TMA group:
``bar.sync`` (nobody still reads the tiles), ``expect_tx``, the copies, a wait with a
loop-carried parity.  That is correct but serial: the copies of iteration i + 1 start only
when iteration i is done with the tiles.  This pass gives every tile of the group S stages
(docs/hopper.md, "Rings and roles") and runs the ring protocol:

- a prologue issues the copies of the first S - 1 iterations;
- iteration i waits for its own tiles (``full``: one ring per first reader, waited right
  before it, so attention starts ``q @ k.T`` while V is still landing), computes, releases
  its stage (``mbarrier_arrive`` on an ``empty`` ring once the wgmmas reading its tiles have
  completed: each ``full`` ring has an ``empty`` of its own, so attention's K stage is free
  once S is, while P V still reads V), and refills: the copies of iteration i + S - 1 go to
  the stage of iteration i - 1, each once every warpgroup has released its ring's stage;
- a loop that only accumulates wgmma results (a GEMM's K loop, one ring) keeps one wgmma in flight:
  iteration i waits for the wgmma of i - 1 (``wgmma_wait_group 1``) and releases its stage,
  and the accumulator is waited for behind the loop;
- stage and parity come from the iteration number (``i % S``, ``(i / S) & 1``), so the
  loop-carried parity and the ``bar.sync`` disappear.

Issuing and computing stay in every warpgroup here (thread 0 issues); ``specialize-warps``
moves the issuing to a producer warpgroup.  The stage count is the kernel's ``stages``
constant when it has one (1 keeps the loop as it is), else as many stages as the shared
memory left over allows, at most 4 (and at least 2: with less room the loop stays serial).

Inner loops go first, but an inner ring takes a third stage only where the groups in the
loops around it keep room for their second.  A group in a loop around a ring (a persistent
kernel's per-tile Q, in the tile loop around the K/V loop) then gets what the inner rings
left, at most 2 stages (``stages`` does not apply to it), and as little as 1: a one-stage
ring, whose refill at the end of iteration i waits for the release iteration i has just
made, is still a ring a producer can issue, where a serial loop's ``bar.sync`` would keep the
kernel from having one.  Its iterations count across the runs of the inner loop from the tile loop's position
times the trip count, or, when the trip count changes from tile to tile (causal attention),
from a count the tile loop carries.

A tile copied into another shared tile by the consumers (``hopper.smem_copy``: an 8-bit V
transposed for wgmma) is released at the barrier behind the copy, before the products read
the copy.
A tile the consumers' threads read themselves (``hopper.smem_load``: a vector the pin
``tma_vectors`` copies beside the tiles) is read where it is used (the read moves down to the
first op that combines it with anything else), and rides the rings of a tile waited for before
that read and freed behind a product issued after it (``_vector_hosts``); without such a tile
it has rings of its own, whose empty barrier every thread arrives on right behind its read.

A wait for a flag in the body ahead of the copies (``tile.wait``, alone or under an ``if``:
ring attention waits for a rank's K/V blocks at the first of them) guards copies of a tensor
the kernel writes: the copies of iteration i + S - 1, issued during iteration i, would read
those tiles before iteration i + S - 1 has waited for them.  Such a guard is issued again, for
its own iteration, right before the copies it guards (in the prologue and in the refill;
``copies = true``: the role that issues the copies runs it); the body keeps its own.  A loop
that orders memory any other way around copies of a tensor the kernel writes (a wait behind
the copies, a barrier across ranks, an acquiring atomic) stays serial.

A loop whose copies stay serial for a reason the kernel's author can change (it runs under a
runtime ``if``, orders memory around its copies, indexes its tiles with a value it carries, has
bounds that vary under more than one loop, or has no room for a second stage unless the pin
``stages`` asked for one) gets a remark at its line (``tkc.errors.remark``: ``tkc compile``
prints it as a note).

Must not: change what a loop computes, touch loops whose tiles are read by anything but
wgmma, ``hopper.smem_copy`` and ``hopper.smem_load``, or place shared memory (``allocate-smem``
does).
"""

from __future__ import annotations

from tkc import dtypes
from tkc.errors import remark
from tkc.ir.builder import Builder
from tkc.ir.core import Block, Module, Operation, OpResult, Region, Value, clone, uses
from tkc.ir.dialects import hopper, tile
from tkc.ir.types import MBARRIER, ScalarType, TileType
from tkc.pins import Options
from tkc.target import Target

I32 = ScalarType(dtypes.i32)
I1 = ScalarType(dtypes.i1)
MAX_STAGES = 4
OUTER_STAGES = 2
BARRIER_BYTES = hopper.MBarrierAllocOp.stride


def pipeline_loops(module: Module, options: Options, target: Target) -> None:
    for kernel in module.ops:
        if kernel.name == "tile.kernel":
            _Pipeliner(kernel, options, target).run()


def ring_room(capacity: int, others: int, loads: int) -> int:
    """The bytes of shared memory a ring of ``loads`` copies a stage may take beside
    ``others`` bytes, the barriers of its full and empty rings (at ``MAX_STAGES``) set aside."""
    return capacity - others - 2 * BARRIER_BYTES * MAX_STAGES * (1 + loads)


def _owner(v: Value) -> Operation | None:
    return getattr(v, "owner", None)


class _Group:
    """One TMA group of a loop body, as lower-to-hopper left it."""

    def __init__(self, loop: Operation, wait: Operation):
        self.loop, self.wait = loop, wait
        body = loop.regions[0].block
        i = body.ops.index(wait)
        self.loads: list[Operation] = []
        j = i - 1
        while j >= 0 and body.ops[j].name == "hopper.tma_load":
            self.loads.insert(0, body.ops[j])
            j -= 1
        self.expect = body.ops[j] if j >= 0 and body.ops[j].name == "hopper.expect_tx" else None
        self.sync = body.ops[j - 1] if j >= 1 and body.ops[j - 1].name == "hopper.barrier" else None
        self.barrier = wait.barrier
        self.dsts = [ld.dst for ld in self.loads]
        self.guards: list[Operation] = []  # the waits its copies follow (``_Pipeliner._guards``)


class _Pipeliner:
    def __init__(self, kernel: Operation, options: Options, target: Target):
        self.kernel = kernel
        self.body = kernel.regions[0].block
        self.pin = options.stages
        self.outer_pin = options.outer_stages
        self.producer = options.warp_specialize  # a producer warpgroup may issue the copies
        self.refill_first = options.refill_first
        self.warpgroups = (kernel.attributes.get("threads") or target.warpgroup) // target.warpgroup
        self.warpgroup_threads = target.warpgroup
        self.capacity = target.smem_per_program(options.programs_per_sm)
        self.consts: dict[int, Value] = {}
        self.positions: dict[Operation, Value] = {}

    def run(self) -> None:
        # Inner loops first: their rings take the shared memory, an enclosing loop's group
        # (a persistent kernel's per-tile Q) gets what is left.
        for loop in reversed([op for op in self.kernel.walk() if op.name == "tile.for"]):
            for wait in [op for op in loop.regions[0].block.ops if op.name == "hopper.mbarrier_wait"]:
                group = _Group(loop, wait)
                stages = self._stages(group)
                fits = stages >= (1 if self._encloses_ring(loop) else 2)
                obstacle = self._obstacle(group)
                if fits and obstacle is None:
                    self._pipeline(group, stages)
                elif obstacle or obstacle is None and self.pin is None:  # (no room for a second stage)
                    # The loop's copies stay one at a time: tell the kernel's author why.
                    remark(f"this loop's tile loads stay one at a time (each waits for the iteration before to "
                           f"finish with its tiles): {obstacle or self._no_room(group)}", loop.loc)

    @staticmethod
    def _encloses_ring(loop: Operation) -> bool:
        return any(op.name == "hopper.stage" for op in loop.walk())

    # ----------------------------------------------------------- decisions
    def _smem_bytes(self) -> int:
        total = 0
        for op in self.kernel.walk():
            if op.name == "hopper.smem_alloc":
                total += op.stride * op.attributes.get("stages", 1)
            elif op.name == "hopper.mbarrier_alloc":
                total += BARRIER_BYTES * op.attributes.get("stages", 1)
        return total

    def _stages(self, g: _Group) -> int:
        outer = self._encloses_ring(g.loop)
        if self.pin is not None and not outer:
            return self.pin
        if not g.loads:
            return 1
        group = sum(_owner(d).stride for d in g.dsts)
        others = self._smem_bytes() - group
        free = ring_room(self.capacity, others, len(g.loads))
        room = free // group
        # A group around a ring is copied once per run of the inner loop: a second stage lets
        # the next copy land during the inner loop, a third would have nothing left to hide.
        if outer:
            if self.outer_pin is not None and self.outer_pin > max(room, 1):
                remark(f"outer_stages = {self.outer_pin} does not fit in shared memory beside this loop's "
                       f"inner ring: {max(room, 1)} stage(s) of its tiles", g.loop.loc)
            return max(1, min(self.outer_pin or OUTER_STAGES, room))
        # An inner ring with two stages leaves the group around it its second stage before
        # taking a third: a persistent program's next Q then lands during this tile's loop
        # (attention at D=128 with 96-key blocks, 512-2k tokens: 6-16% faster than Q in one
        # stage and K/V in three; benchmarks/RESULTS.md).
        spare = (free - (OUTER_STAGES - 1) * self._around_bytes(g.loop)) // group
        return max(1, min(MAX_STAGES, spare if spare >= 2 else room))

    def _around_bytes(self, loop: Operation) -> int:
        """The bytes one stage of the TMA groups in the loops around ``loop`` takes."""
        total = 0
        for outer in [p for p in self._enclosing(loop) if p.name == "tile.for"]:
            for wait in [op for op in outer.regions[0].block.ops if op.name == "hopper.mbarrier_wait"]:
                total += sum(_owner(d).stride for d in _Group(outer, wait).dsts)
        return total

    def _obstacle(self, g: _Group) -> str | None:
        """None when the group is lower-to-hopper's shape and its tiles are read only by wgmma
        (and ``hopper.smem_copy``, or ``hopper.smem_load`` in the loop's body); else why not, in
        the kernel's words where its author can change it ('' where not)."""
        if g.expect is None or g.sync is None or not g.loads or g.expect.barrier is not g.barrier:
            return ""
        body = g.loop.regions[0].block
        parity = g.wait.parity
        if parity not in body.args:
            return ""
        all_uses = uses(self.kernel)
        for d in g.dsts:
            if _owner(d).attributes.get("stages", 1) != 1:
                return ""
            if any(u.name not in ("hopper.tma_load", "hopper.wgmma", "hopper.smem_copy", "hopper.smem_load")
                   or not self._inside(u, g.loop)
                   or u.name == "hopper.smem_copy" and u.src is not d
                   or u.name == "hopper.smem_load" and u.parent is not body
                   for u in all_uses.get(d, [])):
                return ""
        bar_uses = [u for u in all_uses.get(g.barrier, []) if u.name != "hopper.mbarrier_init"]
        if not all(u in (g.expect, g.wait, *g.loads) for u in bar_uses):
            return ""
        if not all(self._recomputable(v, g.loop) for ld in g.loads for v in ld.offsets):
            return ("the coordinates of its tile loads depend on a value the loop carries from one iteration "
                    "to the next (or computes with a side effect), so a later iteration's loads cannot be "
                    "issued ahead; compute them from the loop index")
        g.guards = self._guards(g, all_uses)
        if g.guards is None:
            return ("it loads a tensor the kernel writes and orders memory around those loads other than by a "
                    "wait() ahead of them (a wait() after them, a barrier_all() or an acquiring atomic): loads "
                    "issued ahead would pass it; wait() before the loads instead")
        # Ring positions count iterations across enclosing loops (a persistent kernel's tile
        # loop): from the trip count when it is the same in every enclosing iteration, else
        # (causal attention's K/V loop) from a count the enclosing loop carries, which needs
        # the loop right in the enclosing loop's body.
        outer = self._enclosing(g.loop)
        if any(p.name != "tile.for" for p in outer):
            return ("it runs under an if whose condition is known only at run time; keep the loop at the "
                    "top level (or in loops only) and give the programs that skip it zero trips")
        if self._varying(g.loop) and not (len(outer) == 1 and g.loop.parent is outer[0].regions[0].block):
            return ("its bounds change from one run to the next inside more than one enclosing loop; compute "
                    "them in the loop right around it")
        return None

    def _no_room(self, g: _Group) -> str:
        """Why a second stage of the group's tiles does not fit."""
        group = sum(_owner(d).stride for d in g.dsts)
        free = ring_room(self.capacity, self._smem_bytes() - group, len(g.loads))
        return (f"two stages of its tiles (2 x {group} bytes) do not fit in the {free} bytes of shared memory "
                f"left; smaller tiles let the next loads land while this iteration computes")

    def _varying(self, loop: Operation) -> bool:
        """Whether ``loop``'s bounds may change from one iteration of an enclosing loop to the
        next (they are computed inside one)."""
        inside = set()
        for p in self._enclosing(loop):
            inside |= {r for op in p.walk() for r in op.results} | {a for op in p.walk() for r in op.regions
                                                                   for blk in r.blocks for a in blk.args}
        return any(v in inside for v in loop.operands[:3])

    def _guards(self, g: _Group, all_uses: dict[Value, list[Operation]]) -> list[Operation] | None:
        """The waits for flags that order the group's copies: the body's top-level ops ahead of
        the copies that only wait (``tile.wait``, or an ``if`` holding nothing else), which the
        copies of each iteration must follow; [] where the copies read only tensors the kernel
        never writes (nothing can change them), None where something else in the loop orders
        memory (a wait behind the copies, a barrier across ranks, an acquiring atomic) or a
        wait's flag or condition cannot be computed for a later iteration: copies issued
        iterations ahead would pass it, so the loop stays serial."""
        if all(_read_only(ld.tensor, all_uses) for ld in g.loads):
            return []
        body = g.loop.regions[0].block
        ahead = body.ops[:body.ops.index(g.sync)]
        guards = [op for op in ahead if any(inner.name == "tile.wait" for inner in op.walk())]
        if any(not _only_waits(op) or not all(self._recomputable(v, g.loop) for v in _free_operands(op))
               for op in guards):
            return None
        if any(_orders(inner) for op in body.ops if op not in guards for inner in op.walk()):
            return None
        return guards

    def _enclosing(self, op: Operation) -> list[Operation]:
        return [p for p in op.ancestors() if p is not self.kernel]

    @staticmethod
    def _inside(op: Operation, loop: Operation) -> bool:
        return loop in op.ancestors()

    # ---------------------------------------------------------------- rewrite
    def _c(self, value: int) -> Value:
        if value not in self.consts:
            # Constants go first in the kernel body, where every role can see them.
            self.consts[value] = Builder(self.body, 0, self.kernel.loc).value(
                tile.ConstantOp, [], I32, {"value": value})
        return self.consts[value]

    def _ring(self, near: Operation, count: int, loc, name: str) -> Value:
        """A new S-stage mbarrier ring initialized with ``count`` where ``near`` (the old
        barrier's init) was."""
        alloc = _owner(near.barrier)
        ring = Builder(alloc.parent, alloc.parent.ops.index(alloc) + 1, loc).value(
            hopper.MBarrierAllocOp, [], MBARRIER, {"offset": -1, "stages": self.stages})
        ring.name_hint = name
        Builder(near.parent, near.parent.ops.index(near) + 1, loc).create(
            hopper.MBarrierInitOp, [ring], attrs={"count": count})
        return ring

    def _at(self, b: Builder, ring: Value, stage: Value, ty) -> Value:
        """Stage ``stage`` of ``ring``; a one-stage ring is its allocation."""
        return ring if self.stages == 1 else b.value(hopper.StageOp, [ring, stage], ty)

    def _pipeline(self, g: _Group, stages: int) -> None:
        self.stages = stages
        # Copies in flight ahead of the consumer: S - 1, so that the refill at the end of
        # iteration i takes the stage iteration i - 1 released; one stage (a group around an
        # inner ring) refills the stage iteration i has just released.
        ahead = max(stages - 1, 1)
        for value in (0, 1, ahead, stages):
            self._c(value)  # first: a constant inserted later would shift the builders below
        loop, body = g.loop, g.loop.regions[0].block
        loc = g.wait.loc
        init = next(u for u in uses(self.kernel).get(g.barrier, []) if u.name == "hopper.mbarrier_init")
        for d in g.dsts:
            _sink_reads(body, d)
        # Tiles first read by the same op share a "full" ring; the others get their own, so
        # the consumer can start on one tile while the next is still landing.
        first_use = [next(op for op in body.ops if op not in (g.sync, g.expect, *g.loads, g.wait)
                          and self._uses(op, d)) for d in g.dsts]
        hosts = self._vector_hosts(body, g, first_use)
        rings: dict[int, Value] = {}
        full = []
        for k, (ld, first) in enumerate(zip(g.loads, first_use)):
            first = first_use[hosts.get(k, k)]
            if id(first) not in rings:
                names = [x.tensor.name_hint or "tile" for j, (x, f) in enumerate(zip(g.loads, first_use))
                         if f is first and j not in hosts]
                rings[id(first)] = self._ring(init, 1, ld.loc, "_".join(names) + "_full")
            full.append(rings[id(first)])
        # Each full ring's stage is released on an "empty" ring of its own, once the wgmmas
        # reading its tiles have completed: attention's K stage right after S, its V stage
        # after P V, so the producer refills K while P V still reads V.
        distinct = list(dict.fromkeys(full))
        # A stage the threads read themselves (hopper.smem_load: a vector copied beside the
        # tiles) is released by every thread, right behind its read.  So is a stage whose last
        # reader is a loop or an if (a persistent tile's Q, read in its K/V loop): that loop may
        # run no iteration (varlen's empty sequence, paged decode's empty split), and then no
        # wgmma brings the warps together between their waits and the release; released by
        # one thread, the stage could be refilled twice while a warp still spins on its wait.
        last_reader = {ring: max((op for op in body.ops if self._reads_stage(op, [d for d, r in zip(g.dsts, full)
                                                                                 if r is ring])),
                                 key=body.ops.index) for ring in distinct}
        by_threads = {ring for k, (ring, first) in enumerate(zip(full, first_use))
                      if first.name == "hopper.smem_load" and k not in hosts} | \
            {ring for ring, op in last_reader.items() if op.name in ("tile.for", "tile.if")}
        empties = {ring: self._ring(init, self.warpgroups * (self.warpgroup_threads if ring in by_threads else 1), loc,
                                    "empty" if len(distinct) == 1 else
                                    ring.name_hint.removesuffix("_full") + "_empty") for ring in distinct}
        for d in g.dsts:
            _owner(d).attributes["stages"] = stages

        # The iteration number, its position in the ring (counting the iterations of earlier
        # runs of the loop, in enclosing loops), its stage and its round's parity.
        trip = self._trip_count(loop)
        base = self._base(loop, trip)
        b = Builder(body, 0, loc)
        local = self._iteration(b, loop, body.args[0])
        i = self._position(b, base, local)
        self.positions[loop] = i
        # Copies in flight: the prologue issues iterations 0 .. S-2 before the loop...
        pro = Builder.before(loop)
        npro = pro.value(tile.MinimumOp, [self._c(ahead), trip], I32)
        prologue = pro.create(tile.ForOp, [self._c(0), npro, self._c(1)], [], regions=[_region([I32])], loc=loc)
        pb = Builder(prologue.regions[0].block, 0, loc)
        j = prologue.regions[0].block.args[0]
        self._issue(pb, g, full, empties, self._position(pb, base, j), self._iv_at(pb, loop, j))
        pb.create(tile.YieldOp)
        stage, parity = self._stage_parity(b, i)
        stage.name_hint, parity.name_hint = "stage", "phase"
        top = b.index  # behind the iteration's position, stage and parity

        # Each tensor's tiles are waited for right before their first use.
        waited: set[Value] = set()
        for ld, ring, dst, first in zip(g.loads, full, g.dsts, first_use):
            w = Builder.before(first)
            if ring not in waited:
                waited.add(ring)
                w.create(hopper.MBarrierWaitOp, [self._at(w, ring, stage, MBARRIER), parity],
                         loc=ld.loc)
            staged = self._at(w, dst, stage, dst.type)
            for op in body.ops[body.ops.index(first):]:
                _replace_inside(op, dst, staged)
        # Each ring's stage is released once the last wgmma reading its tiles has completed.
        releases = []
        for ring, free in empties.items():
            last = body.ops.index(last_reader[ring])
            if body.ops[last].name == "hopper.smem_copy":
                # Every thread's reads of the stage are done at the barrier behind the copy.
                last = next(i for i in range(last, len(body.ops)) if body.ops[i].name == "hopper.barrier")
            releases.append((last, free, {"threads": True} if ring in by_threads else {}))
        for last, free, attrs in sorted(releases, key=lambda x: x[0], reverse=True):
            r = Builder(body, last + 1, loc)
            r.create(hopper.MBarrierArriveOp, [self._at(r, free, stage, MBARRIER)], attrs=attrs)

        # (One stage: iteration i + 1's copy would wait for a release deferred to i + 1.)
        overlapped = stages >= 2 and len(empties) == 1 \
            and self._overlap_wgmma(loop, g, local, i, empties[full[0]], trip, base)

        # ... and iteration i refills the stage of iteration i - 1 with iteration i + S - 1.
        # Last in the body with the wgmma overlapped (i - 1 is released only now, and a
        # warpgroup must not wait for its own release) or with one stage (the refill takes the
        # stage iteration i releases); else, where the consumers issue the copies themselves
        # (``warp_specialize`` false), first (pin ``refill_first``): the copies then land
        # while iteration i computes, where at the end they would have only the gap between
        # two iterations (attention backward at D=128, 2 stages: 1.03-1.10x on an H200; at
        # D=64, 128 query rows a step, 0.93-0.95x, so attn_train.tk pins it off there).  A
        # producer warpgroup issues them as soon as the stage is free wherever they sit.
        early = stages >= 2 and not overlapped and not self.producer and self.refill_first
        rb0 = Builder(body, top, loc) if early else Builder.before(body.terminator)
        nxt = rb0.value(tile.AddOp, [local, self._c(ahead)], I32)
        more = rb0.value(tile.CmpOp, [nxt, trip], I1, {"pred": "lt"})
        refill = rb0.create(tile.IfOp, [more], [], regions=[_region([]), _region([])], loc=loc)
        rb = Builder(refill.regions[0].block, 0, loc)
        self._issue(rb, g, full, empties, rb.value(tile.AddOp, [i, self._c(ahead)], I32),
                    self._iv_at(rb, loop, nxt))
        rb.create(tile.YieldOp)
        Builder(refill.regions[1].block, 0, loc).create(tile.YieldOp)

        # What the ring replaces: the bar.sync, the group, its barrier and its parity.
        flip = next(op for op in body.ops if op.name == "tile.xor" and g.wait.parity in op.operands)
        for op in (g.sync, g.expect, *g.loads, g.wait):
            op.erase()
        flip.erase()
        _drop_phase(loop, body.args.index(g.wait.parity) - 1)
        init.erase()
        _owner(g.barrier).erase()
        _drop_unused(body)  # the copies' offsets, now computed where the copies are issued

    @staticmethod
    def _vector_hosts(body: Block, g: _Group, first_use: list[Operation]) -> dict[int, int]:
        """For each load of the group that the threads read themselves (a ``tma_vectors``
        vector, read by ``hopper.smem_load``), the load whose rings it may ride: a tile whose
        stage is waited for before the read and released behind a product that reads the
        tile and takes an operand computed from the read (each warp's read has returned
        before it issues its part of that wgmma, and the wgmma completes only once all four
        warps of the warpgroup have issued it, so the thread that releases the stage behind
        its wait arrives after every warp's read).  Of those, the tile first read last, so
        the read waits for nothing it would not anyway.  The vector's bytes then complete on
        that tile's full barrier and its stage is freed with the tile's: no barriers of its
        own to wait on and arrive at each iteration (attention backward's lse rides dO's ring
        and delta Q's: 1.06x on an H200 over the per-thread loads, 1.11x over rings of their
        own, benchmarks/RESULTS.md)."""
        pos = {id(op): i for i, op in enumerate(body.ops)}
        hosts: dict[int, int] = {}
        for k, first in enumerate(first_use):
            if first.name != "hopper.smem_load":
                continue
            read = pos[id(first)]
            derived = {first.result}  # what the body computes from the read, after it
            for op in body.ops[read + 1:]:
                if any(x in derived for inner in op.walk() for x in inner.operands):
                    derived.update(r for inner in op.walk() for r in inner.results)
            best = None
            for j, (ld, tfirst) in enumerate(zip(g.loads, first_use)):
                if tfirst.name == "hopper.smem_load" or pos[id(tfirst)] > read:
                    continue
                issued_after = any(op.name == "hopper.wgmma" and _chain_reads(op.result, [ld.dst])
                                   and any(x in derived for x in op.operands) for op in body.ops[read + 1:])
                if issued_after and (best is None or pos[id(tfirst)] > pos[id(first_use[best])]):
                    best = j
            if best is not None:
                hosts[k] = best
        return hosts

    def _overlap_wgmma(self, loop: Operation, g: _Group, local: Value, i: Value, empty: Value, trip: Value,
                       base: Value | None) -> bool:
        """Keep the loop's accumulating wgmma in flight across iterations (depth 1).

        Applies when the body's only use of a carried accumulator is ``wgmma`` + ``wgmma_wait``
        yielded back (a GEMM's K loop): the wait goes behind the loop, iteration i waits for
        iteration i - 1's wgmma only (``wgmma_wait_group 1``) and releases that stage instead
        of its own."""
        body = loop.regions[0].block
        term = body.terminator
        for k, arg in enumerate(body.args[1:]):
            arg_uses = [op for op in loop.walk() if arg in op.operands]
            if len(arg_uses) != 1 or arg_uses[0].name != "hopper.wgmma" or arg_uses[0].acc is not arg \
                    or arg_uses[0].parent is not body:
                continue
            mma = arg_uses[0]
            waits = [op for op in loop.walk() if mma.result in op.operands]
            if len(waits) != 1 or waits[0].name != "hopper.wgmma_wait" or waits[0].pending != 0:
                continue
            wait = waits[0]
            if [op for op in loop.walk() if wait.result in op.operands] != [term] \
                    or term.operands.index(wait.result) != k or not _chain_reads(mma.result, g.dsts):
                continue
            if any(_is_smem(x) and not _ring_stage(x, g.dsts) for x in (mma.a, mma.b)):
                continue  # a shared tile outside the ring is rewritten every iteration: wait for it
            if not _is_smem(mma.a):
                # An A operand in registers (a gather's rows): the wgmma reads those registers
                # until it completes, and the next iteration writes its A into the same ones
                # (one loop body, one register allocation).  On an H200 moe_dispatch read
                # wrong rows with the previous wgmma still in flight; the emulator, whose
                # values are SSA values and not registers, could not see it.
                continue
            idx = body.ops.index(wait)
            arrive = body.ops[idx + 2] if idx + 2 < len(body.ops) else None
            if arrive is None or arrive.name != "hopper.mbarrier_arrive":
                continue
            # In the loop: wait for the previous wgmma only, then release its stage.
            term.operands[k] = mma.result
            for op in (arrive, body.ops[idx + 1], wait):  # the arrive, its stage op, the wait
                op.erase()
            b = Builder(body, body.ops.index(mma) + 1, mma.loc)
            b.create(hopper.WgmmaWaitGroupOp, attrs={"pending": 1})
            has_prev = b.value(tile.CmpOp, [local, self._c(0)], I1, {"pred": "gt"})
            release = b.create(tile.IfOp, [has_prev], [], regions=[_region([]), _region([])], loc=mma.loc)
            rb = Builder(release.regions[0].block, 0, mma.loc)
            prev = rb.value(tile.SubOp, [i, self._c(1)], I32)
            stage = rb.value(tile.RemOp, [prev, self._c(self.stages)], I32)
            rb.create(hopper.MBarrierArriveOp, [self._at(rb, empty, stage, MBARRIER)])
            rb.create(tile.YieldOp)
            Builder(release.regions[1].block, 0, mma.loc).create(tile.YieldOp)
            # Behind the loop: the accumulator becomes readable, and the last iteration's
            # stage is released (a later run of the loop, in a persistent kernel's next tile,
            # refills it).
            res = loop.results[k]
            after = Builder(loop.parent, loop.parent.ops.index(loop) + 1, loop.loc)
            done = after.value(hopper.WgmmaWaitOp, [res], res.type, {"pending": 0})
            ran = after.value(tile.CmpOp, [trip, self._c(0)], I1, {"pred": "gt"})
            last = after.create(tile.IfOp, [ran], [], regions=[_region([]), _region([])], loc=loop.loc)
            lb = Builder(last.regions[0].block, 0, loop.loc)
            end = self._position(lb, base, lb.value(tile.SubOp, [trip, self._c(1)], I32))
            stage = lb.value(tile.RemOp, [end, self._c(self.stages)], I32)
            lb.create(hopper.MBarrierArriveOp, [self._at(lb, empty, stage, MBARRIER)])
            lb.create(tile.YieldOp)
            Builder(last.regions[1].block, 0, loop.loc).create(tile.YieldOp)
            for op in loop.parent.parent_op.walk() if loop.parent.parent_op else []:
                if op is not done.owner:
                    op.operands = [done if v is res else v for v in op.operands]
            return True
        return False

    def _uses(self, op: Operation, v: Value) -> bool:
        return any(v in inner.operands for inner in op.walk())

    @staticmethod
    def _reads_stage(op: Operation, dsts: list[Value]) -> bool:
        """Whether ``op`` (a top-level op of the loop body) waits for a wgmma that reads one of
        the (staged) tiles ``dsts``."""
        if op.name in ("hopper.smem_copy", "hopper.smem_load"):
            return op.src in dsts or _ring_stage(op.src, dsts)
        return any(inner.name == "hopper.wgmma_wait" and _chain_reads(inner.x, dsts) for inner in op.walk())

    def _base(self, loop: Operation, trip: Value) -> Value | None:
        """The ring position of this run's first iteration: the enclosing loop's position
        times the trip count, or, when the trip count changes from run to run, the count of
        earlier iterations the enclosing loop carries (None at the kernel's top level:
        position = iteration)."""
        parent = loop.parent.parent_op
        if parent is self.kernel:
            return None
        if self._varying(loop):
            return self._carried_count(parent, trip)
        outer = self._outer_position(parent)
        return Builder.before(loop).value(tile.MulOp, [outer, trip], I32)

    def _carried_count(self, loop: Operation, trip: Value) -> Value:
        """A value ``loop`` carries: the iterations of the inner loop in all earlier runs, then
        increased by ``trip`` every iteration.  Inside further loops (a rank loop inside a
        persistent tile loop) it starts where their runs left it, which they carry through
        (:meth:`_count_into`), so the count goes on from tile to tile."""
        init, through = self._count_into(loop)
        done, result = self._carry(loop, init)
        term = loop.regions[0].block.terminator
        term.operands[-1] = Builder.before(term).value(tile.AddOp, [done, trip], I32)
        self._count_out(through, result)
        return done

    def _carry(self, loop: Operation, init: Value) -> tuple[Value, Value]:
        """A new value ``loop`` carries from ``init``, yielded unchanged (the caller may change
        the yield): its block argument and the loop's result."""
        body = loop.regions[0].block
        loop.operands.append(init)
        arg = body.add_arg(I32, "done")
        result = OpResult(I32, loop, len(loop.results), "done")
        loop.results.append(result)
        body.terminator.operands.append(arg)
        return arg, result

    def _count_into(self, loop: Operation) -> tuple[Value, list[tuple[Operation, Value, Value]]]:
        """The count of earlier iterations where ``loop`` starts (0 at the kernel's top level,
        else a value every enclosing loop carries through for this count alone: two counted
        loops under one loop each have their own), and the enclosing loops' (loop, block
        argument, result) of it, innermost first, for :meth:`_count_out`."""
        parent = loop.parent.parent_op
        if parent is self.kernel or parent.name != "tile.for":
            return self._c(0), []
        init, outer = self._count_into(parent)
        arg, result = self._carry(parent, init)
        return arg, [(parent, arg, result), *outer]

    @staticmethod
    def _count_out(through: list[tuple[Operation, Value, Value]], result: Value) -> None:
        """The count after a run goes on in each enclosing loop's next iteration (its yield
        found by the block argument itself: later rewrites drop other carried values)."""
        for loop, arg, carried in through:
            block = loop.regions[0].block
            block.terminator.operands[block.args.index(arg) - 1] = result
            result = carried

    def _outer_position(self, loop: Operation) -> Value:
        """An enclosing loop's own position (iterations of all its runs so far), computed once
        at the top of its body."""
        if loop not in self.positions:
            body = loop.regions[0].block
            trip = self._trip_count(loop)
            base = self._base(loop, trip)
            b = Builder(body, 0, loop.loc)
            self.positions[loop] = self._position(b, base, self._iteration(b, loop, body.args[0]))
        return self.positions[loop]

    @staticmethod
    def _position(b: Builder, base: Value | None, i: Value) -> Value:
        return i if base is None else b.value(tile.AddOp, [base, i], I32)

    def _iteration(self, b: Builder, loop: Operation, iv: Value) -> Value:
        """(iv - lb) / step, folded when lb = 0 and step = 1."""
        lb, step = tile.constant_value(loop.lb), tile.constant_value(loop.step)
        i = iv if lb == 0 else b.value(tile.SubOp, [iv, loop.lb], I32)
        return i if step == 1 else b.value(tile.FloorDivOp, [i, loop.step], I32)

    def _iv_at(self, b: Builder, loop: Operation, i: Value) -> Value:
        """The induction variable of iteration ``i``: lb + i * step."""
        lb, step = tile.constant_value(loop.lb), tile.constant_value(loop.step)
        x = i if step == 1 else b.value(tile.MulOp, [i, loop.step], I32)
        return x if lb == 0 else b.value(tile.AddOp, [x, loop.lb], I32)

    def _trip_count(self, loop: Operation) -> Value:
        b = Builder.before(loop)
        lb, step = tile.constant_value(loop.lb), tile.constant_value(loop.step)
        span = loop.ub if lb == 0 else b.value(tile.SubOp, [loop.ub, loop.lb], I32)
        span = span if step == 1 else b.value(tile.CdivOp, [span, loop.step], I32)
        # A loop whose upper bound is below its lower bound runs zero times.
        return b.value(tile.MaximumOp, [span, self._c(0)], I32)

    def _stage_parity(self, b: Builder, i: Value) -> tuple[Value, Value]:
        s = self._c(self.stages)
        stage = b.value(tile.RemOp, [i, s], I32)
        rnd = b.value(tile.FloorDivOp, [i, s], I32)
        return stage, b.value(tile.AndOp, [rnd, self._c(1)], I32)

    def _issue(self, b: Builder, g: _Group, full: list[Value], empties: dict[Value, Value], i: Value,
               iv: Value) -> None:
        """The copies of iteration ``i`` (induction variable ``iv``): per load, wait until every
        warpgroup released its ring's stage, arm the ring, copy."""
        stage, parity = self._stage_parity(b, i)
        free = b.value(tile.XorOp, [parity, self._c(1)], I32)
        loop = g.loop
        mapping: dict[Value, Value] = {loop.regions[0].block.args[0]: iv}
        for guard in g.guards:  # this iteration's waits, then its copies
            for v in _free_operands(guard):
                self._recompute(b, v, loop, mapping)
            copy = clone(guard, mapping)
            for inner in copy.walk():
                if inner.name == "tile.wait":
                    inner.attributes["copies"] = True
            b.insert(copy)
        armed: dict[Value, Value] = {}
        for ld, ring in zip(g.loads, full):
            if ring not in armed:
                b.create(hopper.MBarrierWaitOp, [self._at(b, empties[ring], stage, MBARRIER), free])
                armed[ring] = f = self._at(b, ring, stage, MBARRIER)
                nbytes = sum(x.dst.type.layout.size_bytes for x, r in zip(g.loads, full) if r is ring)
                b.create(hopper.ExpectTxOp, [f], attrs={"bytes": nbytes}, loc=ld.loc)
            f = armed[ring]
            offsets = [self._recompute(b, v, loop, mapping) for v in ld.offsets]
            dst = self._at(b, ld.dst, stage, ld.dst.type)  # (the loads still name the ring)
            b.create(hopper.TmaLoadOp, [ld.tensor, dst, f, *offsets], attrs=dict(ld.attributes), loc=ld.loc)

    def _read_only_element(self, op: Operation) -> bool:
        """Whether ``op`` reads one element of a tensor the kernel never writes (a block table's
        ``page = table[b, j]``): it reads the same value whenever it runs, so the copies of a later
        iteration may read it ahead of the loop body."""
        if op.name != "hopper.load" or isinstance(op.result.type, TileType):
            return False
        return _read_only(op.tensor, uses(self.kernel))

    def _recomputable(self, v: Value, loop: Operation) -> bool:
        """Whether :meth:`_recompute` can compute ``v`` for another iteration: it depends on no
        value the loop carries and on no op of the body with an effect (but a read-only element)."""
        body = loop.regions[0].block
        op = _owner(v)
        if op is None or op.parent is not body:
            return v not in body.args[1:]  # the induction variable, or defined outside the loop
        if (op.has_trait("pure") and not op.regions) or self._read_only_element(op):
            return all(self._recomputable(x, loop) for x in op.operands)
        if tile.picks_scalars(op):  # (a launch order's program ids in a persistent walk)
            return all(self._recomputable(x, loop) for x in tile.outside_operands(op))
        return False

    def _recompute(self, b: Builder, v: Value, loop: Operation, mapping: dict[Value, Value]) -> Value:
        """``v`` as computed in the loop body, for the iteration whose induction variable is in
        ``mapping``: pure ops of the body between the induction variable and ``v`` are cloned
        (``v`` is :meth:`_recomputable`: a loop whose copies need anything else stays serial)."""
        if v in mapping:
            return mapping[v]
        op = _owner(v)
        if op is None or op.parent is not loop.regions[0].block:
            return v  # defined outside the loop: the same in every iteration
        for x in tile.outside_operands(op):  # (an if of scalars: what its ops read from the body)
            self._recompute(b, x, loop, mapping)
        b.insert(clone(op, mapping))
        return mapping[v]


def _read_only(tensor: Value, all_uses: dict[Value, list[Operation]]) -> bool:
    """Whether the kernel never writes ``tensor`` (on any rank: a peer's copy is the same parameter)."""
    todo = [tensor]
    while todo:
        for u in all_uses.get(todo.pop(), []):
            if u.name == "tile.peer":
                todo.append(u.result)
            elif not (u.has_trait("readonly") or u.name in ("hopper.tma_load", "tile.dim")):
                return False
    return True


def _only_waits(op: Operation) -> bool:
    """Whether ``op`` only waits for flags: a ``tile.wait``, or ifs holding nothing but waits."""
    return not op.results and all(inner.name in ("tile.wait", "tile.if", "tile.yield") and not inner.results
                                  and not (inner.name == "tile.yield" and inner.operands) for inner in op.walk())


def _orders(op: Operation) -> bool:
    """Whether ``op`` orders the program's memory accesses around it with other programs'."""
    return op.name in ("tile.wait", "tile.rank_barrier") or (
        op.name in ("tile.atomic", "tile.atomic_cas") and op.attributes.get("sem") in ("acquire", "acq_rel"))


def _free_operands(op: Operation) -> list[Value]:
    """The values ``op`` and the ops nested in it use that are defined outside ``op``."""
    inside = {r for inner in op.walk() for r in inner.results} | {
        a for inner in op.walk() for region in inner.regions for blk in region.blocks for a in blk.args}
    return list(dict.fromkeys(v for inner in op.walk() for v in inner.operands if v not in inside))


def _is_smem(v: Value) -> bool:
    return getattr(v.type, "space", None) == "smem"


def _ring_stage(v: Value, dsts: list[Value]) -> bool:
    """Whether ``v`` is a stage of one of the rings ``dsts``."""
    return _owner(v) is not None and _owner(v).name == "hopper.stage" and _owner(v).ring in dsts


def _chain_reads(v: Value, dsts: list[Value]) -> bool:
    """Whether the (pending) wgmma result ``v`` or one it accumulates onto reads the tiles ``dsts``."""
    op = _owner(v)
    while op is not None and op.name == "hopper.wgmma":
        if any(x in dsts or _ring_stage(x, dsts) for x in (op.a, op.b)):
            return True
        op = _owner(op.acc)
    return False


def _sink_reads(body: Block, dst: Value) -> None:
    """Move the threads' read of a copied vector (``hopper.smem_load`` of ``dst`` at the top
    level of ``body``), with the pure ops that only prepare it for its use (a scaling, an
    ``expand_dims``, a ``broadcast``), to right before the first op that combines it with
    anything else: its registers are then live from its use on, not across the products
    before it (attention backward's lse and delta: 16 registers each a thread at D=128, live
    through S^T's and dP^T's products otherwise)."""
    for load in [op for op in body.ops if op.name == "hopper.smem_load" and op.src is dst]:
        chain = [load]
        while True:
            users = [op for op in body.ops if any(chain[-1].result in inner.operands for inner in op.walk())]
            if not users:
                break
            nxt = users[0]
            others = [v for v in nxt.operands if v is not chain[-1].result]
            if len(users) > 1 or not nxt.has_trait("pure") or nxt.regions or any(
                    _owner(v) is not None and _owner(v).parent is body
                    and body.ops.index(_owner(v)) > body.ops.index(load) for v in others):
                break
            chain.append(nxt)
        if not users:
            continue  # read for nothing (dce's to drop): left where it is
        target = users[0]
        for op in chain:
            op.erase()
        at = body.ops.index(target)
        for n, op in enumerate(chain):
            body.insert(at + n, op)


def _region(arg_types: list) -> Region:
    return Region([Block(arg_types)])


def _replace_inside(op: Operation, old: Value, new: Value) -> None:
    for inner in op.walk():
        inner.operands = [new if x is old else x for x in inner.operands]


def _drop_phase(loop: Operation, k: int) -> None:
    """Remove carried value ``k`` of ``loop`` (init, block argument, yielded value, result):
    the parity lower-to-hopper threaded through it.  An enclosing loop carried the same parity
    into this one; that goes too, and the flips and constants left without a use with it."""
    body = loop.regions[0].block
    init = loop.operands[3 + k]
    del loop.operands[3 + k]
    body.args.pop(1 + k)
    for idx, a in enumerate(body.args):
        a.index = idx
    yielded = body.terminator.operands.pop(k)
    loop.results.pop(k)
    for idx, r in enumerate(loop.results):
        r.index = idx
    flip = _owner(yielded)
    if flip is not None and flip.parent is body and flip.name == "tile.xor":
        flip.erase()
    parent = loop.parent.parent_op if loop.parent else None
    if parent is not None and parent.name == "tile.for" and init in parent.regions[0].block.args:
        _drop_phase(parent, parent.regions[0].block.args.index(init) - 1)


def _drop_unused(block: Block) -> None:
    """Erase pure ops of ``block`` whose results nothing uses (last first, so chains go)."""
    used = {v for op in block.parent.parent.walk() for v in op.operands}
    for op in reversed(list(block.ops)):
        if op.has_trait("pure") and not op.regions and not any(r in used for r in op.results):
            op.erase()
            used = {v for o in block.parent.parent.walk() for v in o.operands}
