"""The ``overlap-epilogue`` pass: a persistent GEMM's next tile multiplies during this tile's epilogue.

After ``lower-to-blackwell`` the epilogue's warpgroups issue a tile's MMAs themselves (one
thread of theirs), so the tensor core idles while they load the sums from tensor memory,
convert and store them.  Blackwell GEMMs (CUTLASS's, ThunderKittens') keep the MMAs in a warp
of their own and two accumulators in tensor memory.  This pass does that for a kernel whose
producer warpgroup issues the copies (``specialize-warps``) and whose epilogue role walks the
same persistent tile loop around one K loop of sums (docs/blackwell.md §4d):

- the K loop's MMAs and commits move into the producer's K loop, issued by its thread ahead of
  the refill of the stage the previous MMA read (the refill's wait is that MMA's completion, so
  one MMA is always queued behind the running one);
- tensor memory is allocated once for the CTA, twice the columns: tile ``i`` of a program sums
  into half ``i % 2``;
- two-stage rings ``%acc_full`` (the producer's commit after a tile's K loop) and
  ``%acc_empty`` (one arrival from each epilogue warpgroup once its warps have read the half,
  behind the epilogue's first meeting): the producer waits for the half to be free before the
  tile's K loop, the epilogue for it to be full, each at parity ``(i // 2) & 1``.

Kernels of another shape (attention's products read at once, no producer, more than 256
columns of sums a tile, an epilogue doing more than converting and storing them, several
programs an SM), multi-GPU kernels and kernels in clusters (ptxas spilled 8-28 B with the MMAs
beside their producers' other work) are left as they are.  Runs after
``lower-to-blackwell`` and a clean-up, before ``pair-ctas``.

Must not: change what the epilogue reads, or let a tile's MMAs write the half the epilogue is
still reading.
"""

from __future__ import annotations

from tkc import dtypes
from tkc.ir.builder import Builder
from tkc.ir.core import Block, BlockArgument, Module, Operation, Value, clone, replace_all_uses, uses
from tkc.ir.dialects import blackwell, hopper, tile
from tkc.ir.types import MBARRIER, ScalarType, TileType
from tkc.passes.lower_to_blackwell import behind_reads
from tkc.passes.phases import Waits, thread_phases
from tkc.pins import Options
from tkc.registers import SETMAXNREG_MIN, register_pool
from tkc.target import Target

I32 = ScalarType(dtypes.i32)
#: The producer's registers a thread when it issues the MMAs too: with fewer, ptxas 13.0
#: spilled 4-12 B in gemm.tk (96: 12 B, 104: 4 B, 112: none; 120: 12 B storing f32); the
#: epilogue's warpgroups keep 184 at 384 threads, enough for a 128 x 256 f32 sum.
MMA_PRODUCER_REGS = 136
#: Ops a tile's index arithmetic is made of, copied from the epilogue's loop into the producer's.
_PURE = "tile."
_NOT_PURE = frozenset({"tile.for", "tile.if", "tile.yield", "tile.store", "tile.atomic"})


def overlap_epilogue(module: Module, options: Options, target: Target) -> None:
    # In clusters (multicast copies, CTA pairs) ptxas spilled 8-16 B with the MMAs in the
    # producer, whatever its budget; those kernels keep the one-accumulator structure.  With
    # several programs an SM, two accumulators each would take more than the SM's tensor memory
    # (the next program's tcgen05.alloc would wait for this one to end).
    if target.mma != "tcgen05" or not options.overlap_epilogue or options.cluster > 1 \
            or options.programs_per_sm > 1:
        return
    for kernel in module.ops:
        # A multi-GPU kernel's producer runs its waits and barriers too: with the MMAs beside
        # them ptxas spilled 8-28 B in the all-gather and reduce-scatter GEMMs; they keep theirs.
        if kernel.name == "tile.kernel" and not tile.uses_ranks(kernel):
            split = _Split.find(kernel, target)
            if split is not None:
                split.run(options)


#: The register-tile ops of an epilogue that only converts and stores the sums.
_EPILOGUE_OPS = frozenset({blackwell.TmemLoadOp.name, "tile.cast", "hopper.smem_store", "hopper.store"})


def _reg_tile(v: Value) -> bool:
    return isinstance(v.type, TileType) and v.type.space == "reg"


def _pure(op: Operation) -> bool:
    """Index arithmetic: a tile op of one scalar result, no regions, no effects."""
    return (op.name.startswith(_PURE) and op.name not in _NOT_PURE and not op.regions and len(op.results) == 1
            and isinstance(op.result.type, ScalarType))


def _same_values(xs: list[Value], ys: list[Value]) -> bool:
    """Whether two loops' bounds are the same values (before ``cse``, equal constants are
    separate ops)."""
    return len(xs) == len(ys) and all(x is y or tile.constant_value(x) is not None
                                      and tile.constant_value(x) == tile.constant_value(y) for x, y in zip(xs, ys))


class _Split:
    """The ops the pass moves, found by :meth:`find`: the producer's and the epilogue's roles,
    their tile loops, their K loops, the epilogue's tensor memory and ``%acc_full``."""

    def __init__(self, kernel: Operation, target: Target, **parts: Operation) -> None:
        self.kernel, self.target = kernel, target
        self.body: Block = kernel.regions[0].block
        self.consts: dict[int, Value] = {}
        self.counts: dict[Operation, Waits] = {}  # each tile loop's count of tiles, mod 4
        for name, op in parts.items():
            setattr(self, name, op)

    @classmethod
    def find(cls, kernel: Operation, target: Target) -> _Split | None:
        body = kernel.regions[0].block
        roles = [op for op in body.ops if op.name == "hopper.role"]
        producer = next((r for r in roles if r.attributes["name"] == "producer"), None)
        others = [r for r in roles if r is not producer]
        if producer is None or len(others) != 1 or producer.attributes.get("warps") != 1:
            return None
        cons = others[0]
        cbody = cons.regions[0].block
        allocs = [op for op in cbody.ops if op.name == blackwell.TmemAllocOp.name]
        deallocs = [op for op in cbody.ops if op.name == blackwell.TmemDeallocOp.name]
        mmas = [op for op in kernel.walk() if op.name == blackwell.MmaOp.name]
        if len(allocs) != 1 or len(deallocs) != 1 or not mmas or 2 * allocs[0].cols > target.tmem_columns:
            return None
        loops = [op for op in cbody.ops if op.name == "tile.for" and any(m in op.walk() for m in [mmas[0]])]
        if len(loops) != 1:
            return None
        tl = loops[0]
        k_loops = [op for op in tl.regions[0].block.ops if op.name == "tile.for" and mmas[0] in op.walk()]
        if len(k_loops) != 1:
            return None
        kl = k_loops[0]
        kbody = kl.regions[0].block
        # The K loop is index arithmetic, stages, the MMAs and their commits: all the producer's
        # thread can issue (a stage the epilogue's warps release themselves stays theirs).
        movable = (hopper.StageOp.name, blackwell.MmaOp.name, blackwell.CommitOp.name, "tile.yield")
        if len(kbody.args) != 1 or any(m.parent is not kbody for m in mmas) or not all(
                op.name in movable or _pure(op) for op in kbody.ops):
            return None
        # An epilogue that converts and stores the sums: with more register work beside them
        # (bias and GELU, a residual, RoPE, scales, SwiGLU) its warpgroups' share of the
        # registers left by the producer's 136 spilled 8-740 B.
        for op in tl.walk():
            if op is not tl and kl not in op.ancestors() and op is not kl and not (
                    op.name in _EPILOGUE_OPS or not any(_reg_tile(v) for v in (*op.operands, *op.results))):
                return None
        # Behind the K loop: the commit onto %acc_full and the epilogue's wait for it.
        tops = tl.regions[0].block.ops
        after = tops[tops.index(kl) + 1:]
        commit = next((op for op in after if op.name == blackwell.CommitOp.name), None)
        wait = next((op for op in after if op.name == "hopper.mbarrier_wait"), None)
        if commit is None or wait is None or wait.barrier is not commit.barrier \
                or tops.index(wait) < tops.index(commit):
            return None
        if any(op.name == blackwell.CommitOp.name and op.parent is not kbody and op is not commit
               for op in kernel.walk()):
            return None
        # The producer walks the same tiles and the same K steps.
        ptl = next((op for op in producer.regions[0].block.ops if op.name == "tile.for"
                    and _same_values(op.operands[:3], tl.operands[:3])), None)
        if ptl is None:
            return None
        pkl = next((op for op in ptl.regions[0].block.ops if op.name == "tile.for"
                    and _same_values(op.operands[:3], kl.operands[:3]) and len(op.regions[0].block.args) == 1), None)
        if pkl is None:
            return None
        split = cls(kernel, target, producer=producer, cons=cons, tl=tl, kl=kl, ptl=ptl, pkl=pkl,
                    alloc=allocs[0], dealloc=deallocs[0], commit=commit, wait=wait)
        try:  # every value the K loop reads, the producer can compute for itself
            for op in kbody.ops:
                for v in op.operands:
                    split._closure(v, set(), [])
        except _NotMovable:
            return None
        return split

    # ------------------------------------------------------------------ the rewrite
    def run(self, options: Options) -> None:
        cols = self.alloc.cols
        roles = [op for op in self.body.ops if op.name == "hopper.role"]
        # Tensor memory for the CTA: both roles use it, the producer's MMAs and the epilogue's loads.
        b = Builder.before(roles[0])
        tmem = b.value(blackwell.TmemAllocOp, [], I32, {"cols": 2 * cols})
        tmem.name_hint = "tmem"
        Builder(self.body, self.body.ops.index(roles[-1]) + 1, self.dealloc.loc).create(
            blackwell.TmemDeallocOp, [tmem], [], {"cols": 2 * cols})
        full = self._ring("acc_full", 1)
        empty = self._ring("acc_empty", self.cons.warpgroups)
        # The producer: each tile waits for its half, issues the K loop's MMAs, commits the half.
        p_half, p_parity = self._half(self.ptl, tmem, cols)
        self._move_products(p_half)
        pb = Builder.before(self.pkl)
        free = pb.value(tile.XorOp, [p_parity, self._const(1)], I32)  # the first use passes at once
        pb.create(hopper.MBarrierWaitOp, [self._stage(pb, empty, p_half[1]), free])
        after = Builder(self.pkl.parent, self.pkl.parent.ops.index(self.pkl) + 1, self.commit.loc)
        after.create(blackwell.CommitOp, [self._stage(after, full, p_half[1])])
        # The epilogue: waits for its half full, reads it, frees it behind its first meeting.
        c_half, c_parity = self._half(self.tl, tmem, cols)
        self._rebase_epilogue(c_half[0])
        wb = Builder.before(self.wait)
        self.wait.operands[0] = self._stage(wb, full, c_half[1])
        self.wait.operands[1] = c_parity
        self._free_behind_reads(empty, c_half[1])
        old_full = self.commit.barrier
        self.kl.erase()
        self.commit.erase()
        self.alloc.erase()
        self.dealloc.erase()
        for op in list(self.body.ops):
            if op.name == "hopper.mbarrier_init" and op.operands[0] is old_full:
                op.erase()
        old = getattr(old_full, "owner", None)
        if old is not None and not uses(self.kernel).get(old_full):
            old.erase()
        for role in (self.producer, self.cons):
            thread_phases(role.regions[0].block, self.counts, self._const)
        self._registers(options)

    def _ring(self, name: str, count: int) -> Value:
        init = next(op for op in self.body.ops if op.name == "hopper.mbarrier_init")
        b = Builder.before(init)
        ring = b.value(hopper.MBarrierAllocOp, [], MBARRIER, {"offset": -1, "stages": 2})
        ring.name_hint = name
        b.create(hopper.MBarrierInitOp, [ring], [], {"count": count})
        return ring

    def _stage(self, b: Builder, ring: Value, half: Value) -> Value:
        return b.value(hopper.StageOp, [ring, half], MBARRIER)

    def _rebase_epilogue(self, half: Value) -> None:
        """The epilogue's reads of tensor memory at ``half``: the role-level addresses computed
        from the old allocation (SwiGLU's second sum at ``%tmem + 128``) are computed again
        from ``half`` at the top of the tile loop, and the old ones dropped."""
        cbody, tbody = self.cons.regions[0].block, self.tl.regions[0].block
        mapping: dict[Value, Value] = {self.alloc.result: half}
        at = tbody.ops.index(half.owner) + 1
        moved = []
        for op in list(cbody.ops):
            if _pure(op) and any(x in mapping for x in op.operands):
                tbody.insert(at, clone(op, mapping))
                at += 1
                moved.append(op)
        for old, new in mapping.items():
            replace_all_uses(self.tl, old, new)
        for op in reversed(moved):
            if not any(uses(self.kernel).get(r) for r in op.results):
                op.erase()

    def _half(self, loop: Operation, tmem: Value, cols: int) -> tuple[tuple[Value, Value], Value]:
        """At the top of the tile loop ``loop``: the tensor-memory address of half ``i % 2`` for
        the program's tile i, that half, and ``(i // 2) & 1``.  ``i mod 4`` is a count the loop
        carries (``phases.thread_phases``, period 4), not a division of the induction variable."""
        body = loop.regions[0].block
        b = Builder(body, 0, loop.loc)
        three = self._const(3)
        count = b.value(tile.AndOp, [three, three], I32)  # operand 0: the count, threaded below
        self.counts[count.owner] = Waits(loop.regions[0].block.args[0], 0, 4)
        half = b.value(tile.AndOp, [count, self._const(1)], I32)
        addr = b.value(tile.AddOp, [tmem, b.value(tile.MulOp, [half, self._const(cols)], I32)], I32)
        parity = b.value(tile.ShrOp, [count, self._const(1)], I32)
        return (addr, half), parity

    def _const(self, value: int) -> Value:
        if value not in self.consts:
            self.consts[value] = Builder(self.body, 0, self.kernel.loc).value(tile.ConstantOp, [], I32,
                                                                               {"value": value})
        return self.consts[value]

    def _move_products(self, p_half: tuple[Value, Value]) -> None:
        """The K loop's ops into the producer's K loop, at its top, with what they read from the
        epilogue's tile loop rebuilt in the producer's."""
        kbody, pbody = self.kl.regions[0].block, self.pkl.regions[0].block
        mapping: dict[Value, Value] = {kbody.args[0]: pbody.args[0], self.alloc.result: p_half[0],
                                       self.tl.regions[0].block.args[0]: self.ptl.regions[0].block.args[0]}
        before_pkl = Builder.before(self.pkl)
        at = 0
        for op in list(kbody.ops):
            if op.name == "tile.yield":
                continue
            for v in op.operands:
                self._materialize(v, mapping, before_pkl)
            pbody.insert(at, clone(op, mapping))
            at += 1

    def _closure(self, v: Value, seen: set, out: list[Operation]) -> None:
        """The ops of the epilogue's role (outside the K loop) that ``v`` is computed from, in
        order, into ``out``; _NotMovable where one is not plain index arithmetic or reads a
        value the epilogue's loops carry."""
        kl_ops = set(self.kl.walk())
        if isinstance(v, BlockArgument):
            if v.block is self.body or v.block is self.kl.regions[0].block or v is self.tl.regions[0].block.args[0]:
                return
            raise _NotMovable
        op = v.owner
        if op in kl_ops or op in seen or op is self.alloc or op.parent is self.body \
                or not any(p is self.cons for p in op.ancestors()):
            return
        if not _pure(op):
            raise _NotMovable
        seen.add(op)
        for x in op.operands:
            self._closure(x, seen, out)
        out.append(op)

    def _materialize(self, v: Value, mapping: dict[Value, Value], b: Builder) -> None:
        """``v``'s defining ops from the epilogue's role copied before the producer's K loop."""
        needed: list[Operation] = []
        self._closure(v, {getattr(x, "owner", None) for x in mapping} - {None}, needed)
        for op in needed:
            if op.result not in mapping:
                b.insert(clone(op, mapping))

    def _free_behind_reads(self, empty: Value, half: Value) -> None:
        """One arrival a warpgroup on ``%acc_empty``'s half once every warp of the epilogue
        has read it (``lower_to_blackwell.behind_reads``)."""
        b = behind_reads(self.tl.regions[0].block, 0, self.tl.loc)
        b.create(hopper.MBarrierArriveOp, [self._stage(b, empty, half)])

    def _registers(self, options: Options) -> None:
        """The producer's thread issues the MMAs too: it keeps MMA_PRODUCER_REGS (unless the pin
        producer_regs says how many) and the epilogue's warpgroups share the rest."""
        if options.producer_regs is not None or not self.producer.attributes.get("regs"):
            return
        want = max(self.producer.attributes["regs"], MMA_PRODUCER_REGS)
        threads = self.kernel.attributes["threads"]
        pool = register_pool(threads, options.programs_per_sm, self.target)
        g = self.cons.warpgroups
        regs = (pool - self.target.warpgroup * want) // (self.target.warpgroup * g) // 8 * 8
        if regs < SETMAXNREG_MIN:
            return
        self.producer.attributes["regs"] = want
        self.cons.attributes["regs"] = min(self.cons.attributes.get("regs") or regs, regs)


class _NotMovable(Exception):
    """A value of the K loop's that the producer cannot compute for itself."""
