"""The ``pair-ctas`` pass: the two CTAs of a cluster multiply together (``tcgen05`` CTA pairs).

With the pin ``cta_pairs`` (sm_100a; it sets ``cluster = 2``), the two programs of a cluster
take two row tiles of one column of output tiles (``persistent``), as under ``cluster = 2``,
but instead of each multiplying its own rows by all of B (B multicast into both), one
``tcgen05.mma.cta_group::2`` of 256 rows multiplies both (docs/blackwell.md §4c):

- each CTA copies its own 128 rows of A and **half of B's columns** (its rank's half) into the
  same shared offsets; B's ring stages are half as large, and no copy is multicast;
- every copy of the ring the MMAs read, and each CTA's ``expect_tx`` of it, complete on the
  barrier in the **even** CTA (``pair``), which counts both CTAs' arrivals and bytes;
- the even CTA's thread issues every MMA (``blackwell.mma {pair}``; the odd CTA skips them),
  its rows landing in its tensor memory and the odd CTA's rows in the odd CTA's, at the same
  column address (``tcgen05.alloc.cta_group::2`` in both); each commit arrives on the barrier
  at its offset in both CTAs, so one arrival frees a ring stage in both (the ``empty`` ring
  counts one again) and each CTA's epilogue waits on its own ``%acc_full``;
- in a tile loop, the even CTA's next MMAs overwrite columns the odd CTA's epilogue reads: a
  barrier ``%acc_empty`` that both CTAs' warpgroups arrive on once their epilogue has loaded
  the sums (and once on entry) is waited for by both before each K loop.

Runs after ``lower-to-blackwell`` (the products are ``blackwell.mma`` with their rings and
commits) and before ``allocate-smem`` (the halved stages are what it places).

Must not: change what any CTA's epilogue reads, or pair a product that is not a K loop's sum
(a located refusal names what is not paired).
"""

from __future__ import annotations

from dataclasses import replace

from tkc import dtypes
from tkc.errors import TkcUnsupportedError
from tkc.ir.builder import Builder
from tkc.ir.core import Module, Operation, Value, uses
from tkc.ir.dialects import blackwell, hopper, tile
from tkc.ir.types import MBARRIER, ScalarType, TileType
from tkc.passes.lower_to_blackwell import behind_reads
from tkc.passes.phases import Waits, thread_phases
from tkc.pins import Options
from tkc.target import Target

I32 = ScalarType(dtypes.i32)


def pair_ctas(module: Module, options: Options, target: Target) -> None:
    if not options.cta_pairs:
        return
    for kernel in module.ops:
        if kernel.name == "tile.kernel":
            _Pairing(kernel).run()


def _refuse(op: Operation, message: str) -> TkcUnsupportedError:
    return TkcUnsupportedError(f"cta_pairs = true: {message}", op.loc)


def _owner(v: Value) -> Operation | None:
    return getattr(v, "owner", None)


def _alloc_of(v: Value) -> Operation | None:
    """The allocation behind a shared tile or barrier value (a ring stage's ring)."""
    op = _owner(v)
    if op is not None and op.name == "hopper.stage":
        op = _owner(op.operands[0])
    return op if op is not None and op.name in ("hopper.smem_alloc", "hopper.mbarrier_alloc") else None


class _Pairing:
    def __init__(self, kernel: Operation):
        self.kernel = kernel
        self.body = kernel.regions[0].block
        self.consts: dict[int, Value] = {}

    def run(self) -> None:
        k = self.kernel
        mmas = [op for op in k.walk() if op.name == blackwell.MmaOp.name]
        if not mmas:
            raise _refuse(k, "the kernel has no tcgen05 product for a CTA pair to issue")
        if k.attributes.get("cluster") != 2:
            raise _refuse(k, "a pair is a cluster of 2 programs walking a GEMM's tiles (the multicast pass "
                             "gives the kernel cluster = 2)")
        fulls: dict[Operation, None] = {}
        halves: dict[Operation, str] = {}
        for mma in mmas:
            self._check_product(mma)
            for bar, _ in mma.waits():
                fulls[_alloc_of(bar)] = None
            halves[_alloc_of(mma.b)] = "rows" if mma.operand_layout("b").major == "k" else "cols"
        operands = {_alloc_of(v) for mma in mmas for v in (mma.a, mma.b)}
        all_users = uses(k)
        for ring in fulls:
            if ring is None:
                raise _refuse(mmas[0], "the product's operands must come from a TMA ring")
            self._pair_ring(ring, operands)
        for b_alloc, axis in halves.items():
            self._halve(b_alloc, axis, all_users)
        for op in k.walk():
            if op.name == hopper.TmaLoadOp.name and op.attributes.get("multicast"):
                raise _refuse(op, "this copy is multicast to both programs but is no product's B: a pair shares "
                                  "only B's columns")
        rings_counted: set[Operation] = set()
        for op in k.walk():
            if op.name in (blackwell.MmaOp.name, blackwell.TmemAllocOp.name, blackwell.TmemDeallocOp.name):
                op.attributes["pair"] = True
            elif op.name == blackwell.CommitOp.name:
                if op.attributes.pop("cluster", False):
                    # One commit of the even CTA frees the stage in both: the ring counts one again.
                    ring = _alloc_of(op.barrier)
                    if ring not in rings_counted:
                        rings_counted.add(ring)
                        self._init(ring).attributes["count"] //= 2
                op.attributes["pair"] = True
        self._guard_tile_loops(mmas)

    # ------------------------------------------------------------------ checks
    def _check_product(self, mma: Operation) -> None:
        # A K loop's sum: a commit that frees a ring stage in every CTA of the cluster follows it
        # in its loop (SwiGLU's two products: both MMAs, then their commits).
        ops = mma.parent.ops
        if not any(op.name == blackwell.CommitOp.name and op.attributes.get("cluster")
                   for op in ops[ops.index(mma) + 1:]):
            raise _refuse(mma, "a pair multiplies a K loop's sum (acc += a @ b) whose B the cluster shares; this "
                               "product is read at once (attention-shaped kernels keep cta_pairs off)")
        if mma.m != blackwell.TMEM_LANES or mma.n % 32:
            raise _refuse(mma, f"a pair's product has 128 rows a program and a multiple of 32 columns "
                               f"(each half of B a multiple of 16), here {mma.m} x {mma.n}")
        for which in ("a", "b"):
            if mma.attributes.get(f"{which}_major"):
                raise _refuse(mma, f"operand {which.upper()} is read with another major than it is stored; "
                                   f"a pair reads both CTAs' tiles as stored")

    def _init(self, ring: Operation) -> Operation:
        for op in self.body.ops:
            if op.name == "hopper.mbarrier_init" and op.operands[0] is ring.result:
                return op
        raise _refuse(ring, "its barriers are not initialized before the roles")

    # ------------------------------------------------------------------ the rings
    def _pair_ring(self, ring: Operation, operands: set) -> None:
        """The ring the MMAs wait on: every copy completing on it lands in its own CTA and
        completes on the even CTA's barrier, which counts both CTAs' ``expect_tx``."""
        for op in self.kernel.walk():
            if op.name == hopper.TmaLoadOp.name and _alloc_of(op.barrier) is ring:
                if _alloc_of(op.dst) not in operands:
                    raise _refuse(op, "this copy shares its barrier with the product's tiles but is not one of "
                                      "them; only the even program waits on that barrier in a pair")
                op.attributes["pair"] = True
            elif op.name == hopper.ExpectTxOp.name and _alloc_of(op.barrier) is ring:
                op.attributes["pair"] = True
        self._init(ring).attributes["count"] *= 2

    def _halve(self, alloc: Operation, axis: str, all_users) -> None:
        """B's stages hold this CTA's half of the columns (``axis``: the tile's rows when B is
        stored N x K, its cols when K x N); its copies take the rank's half."""
        old: TileType = alloc.result.type
        lay = old.layout
        rows, cols = (lay.rows // 2, lay.cols) if axis == "rows" else (lay.rows, lay.cols // 2)
        try:
            half = replace(lay, rows=rows, cols=cols)
        except ValueError:
            raise _refuse(alloc, f"B's {lay.rows} x {lay.cols} tile does not split into two halves of whole "
                                 f"swizzle atoms") from None
        new = TileType((half.rows, half.cols), half.dtype, "smem", half)
        alloc.result.type = new
        for user in all_users.get(alloc.result, []):
            if user.name == "hopper.stage":
                user.result.type = new
            elif user.name not in ("hopper.tma_load",):
                raise _refuse(user, "B's ring is read here as well as by the product")
        saved = old.layout.size_bytes - half.size_bytes
        for op in list(self.kernel.walk()):
            if op.name != hopper.TmaLoadOp.name or _alloc_of(op.dst) is not alloc:
                continue
            if op.attributes.pop("multicast", None) != 2:
                raise _refuse(op, "B's copy is not one the cluster shares (the multicast pass did not share it)")
            box = list(op.box)
            a = hopper.tma_row_axis(box) if axis == "rows" else len(box) - 1
            box[a] //= 2
            op.attributes["box"] = box
            # This CTA's half: the rank's columns (rows) of B.
            b = Builder.before(op)
            b.loc = op.loc
            pid = b.value(tile.ProgramIdOp, [], I32, {"axis": 0})
            rank = b.value(tile.RemOp, [pid, self._const(2)], I32)
            shift = b.value(tile.MulOp, [rank, self._const(box[a])], I32)
            op.operands[3 + a] = b.value(tile.AddOp, [op.operands[3 + a], shift], I32)
            # A map of their own: another copy of the tensor (a Gram product's A) keeps its box.
            maps = self.kernel.attributes["tma_maps"]
            entry = [maps[op.map][0], hopper.tma_map_box(box, half), half.swizzle]
            if entry not in maps:
                maps.append(entry)
            op.attributes["map"] = maps.index(entry)
            # The expect_tx that armed this copy's stage: the last one on its ring before it.
            ring = _alloc_of(op.barrier)
            armed = [e for e in op.parent.ops[:op.parent.ops.index(op)]
                     if e.name == hopper.ExpectTxOp.name and _alloc_of(e.barrier) is ring]
            if not armed:
                raise _refuse(op, "B's copy is not armed by an expect_tx before it in its block")
            armed[-1].attributes["bytes"] -= saved

    # ------------------------------------------------------------------ tile loops
    def _guard_tile_loops(self, mmas: list[Operation]) -> None:
        """Where a loop runs the K loop again, its next MMAs (issued by the even CTA) must wait
        until both CTAs' epilogues have read the sums: ``%acc_empty``."""
        k_loops: dict[Operation, None] = {}
        for mma in mmas:
            loop = mma.parent.parent_op
            if loop is None or loop.name != "tile.for":
                raise _refuse(mma, "a pair's product sits in its K loop")
            k_loops[loop] = None
        waits: dict[Operation, Waits] = {}
        roles: dict[Operation, Value] = {}
        guarded: set[Operation] = set()
        for loop in k_loops:
            outer = loop.parent.parent_op
            if outer is None or outer.name != "tile.for":
                continue
            if outer in guarded:
                continue  # one wait and one arrival a tile, around all of its K loops
            guarded.add(outer)
            loop = next(op for op in loop.parent.ops if op in k_loops)  # the tile's first K loop
            role = hopper.enclosing_role(loop)
            container = role or self.kernel
            if container not in roles:
                roles[container] = self._acc_empty(container, role)
            empty = roles[container]
            block = loop.parent
            b = Builder.before(loop)
            b.loc = loop.loc
            waits[b.create(hopper.MBarrierWaitOp, [empty, empty])] = Waits(empty, 1, 2)  # parity: below
            # Both CTAs' warps have read the sums (every K loop's of the tile) when they arrive.
            after = behind_reads(block, block.ops.index(loop) + 1, loop.loc)
            if after is None:
                raise _refuse(loop, "the sums of this K loop are read outside the loop around it")
            after.create(hopper.MBarrierArriveOp, [empty], [], {"cluster": True})
        # Before the pair's columns are freed, both CTAs' epilogues have read the last tile's sums
        # (dealloc.cta_group::2 needs no access of the peer's in flight): a last wait in each role.
        for container, empty in roles.items():
            top = container.regions[0].block
            dealloc = next((op for op in top.ops if op.name == blackwell.TmemDeallocOp.name), None)
            if dealloc is not None:
                b = Builder.before(dealloc)
                waits[b.create(hopper.MBarrierWaitOp, [empty, empty])] = Waits(empty, 1, 2)
        for container in dict.fromkeys(hopper.enclosing_role(w) or self.kernel for w in waits):
            thread_phases(container.regions[0].block, waits, self._const)

    def _acc_empty(self, container: Operation, role: Operation | None) -> Value:
        """The barrier both CTAs' warpgroups of ``role`` arrive on once they have read the sums,
        initialized with the others, and the role's first arrival (its columns start free)."""
        init = next(op for op in self.body.ops if op.name == "hopper.mbarrier_init")
        b = Builder.before(init)
        b.loc = container.loc
        bar = b.value(hopper.MBarrierAllocOp, [], MBARRIER, {"offset": -1})
        bar.name_hint = "acc_empty"
        warpgroups = role.warpgroups if role is not None else self.kernel.attributes.get("threads", 128) // 128
        b.create(hopper.MBarrierInitOp, [bar], [], {"count": 2 * warpgroups})
        top = container.regions[0].block
        alloc = next((op for op in top.ops if op.name == blackwell.TmemAllocOp.name), None)
        at = top.ops.index(alloc) + 1 if alloc is not None else 0
        Builder(top, at, container.loc).create(hopper.MBarrierArriveOp, [bar], [], {"cluster": True})
        return bar

    def _const(self, value: int) -> Value:
        if value not in self.consts:
            self.consts[value] = Builder(self.body, 0, self.kernel.loc).value(tile.ConstantOp, [], I32,
                                                                               {"value": value})
        return self.consts[value]
