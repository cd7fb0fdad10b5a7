"""The ``lower-to-hopper`` pass: tile IR with layouts -> hopper IR (docs/hopper.md).

Runs after ``select-layouts``, which decided where every tile lives.  This pass turns each
memory or cross-thread operation into the hopper ops that do it, so the dump reads like a
hand-written Hopper kernel:

- **Shared-tile loads** become TMA copies.  Loads that follow each other in one block (only
  index arithmetic between them) share one mbarrier: at the last load's place the CTA
  waits until every warpgroup is done with the previous contents when the loads sit in a
  loop (``hopper.barrier``), thread 0 arms the barrier with the tiles' bytes
  (``hopper.expect_tx``) and issues one ``hopper.tma_load`` per tile, and every thread waits
  for the phase (``hopper.mbarrier_wait``).  The tensor maps the copies use are listed in
  the kernel's ``tma_maps``; identical maps are shared.  Barriers are created and
  initialized once, at the top of the kernel.  With the pin ``tma_vectors``, a loop's 1-D
  register load of a read-only tensor (attention backward's ``lse[b, h, rows]``) joins an
  earlier group of its block whose copies its offsets are computed before: one vector box into
  a shared tile, read back by every thread where the load was (``hopper.smem_load``).
- **Phases** are explicit: a barrier waited on inside loops gets a loop-carried i32 parity
  (flipped after each wait) through every enclosing ``tile.for`` and ``tile.if``.
- ``@`` becomes ``hopper.wgmma`` followed at once by ``hopper.wgmma_wait {pending = 0}``
  (overlapping them is the ``pipeline-loops`` pass's job); a ``.T`` of a shared tile
  disappears into the operand's layout.
- A product's result stored to a 2-D 16-bit tensor goes out as a hand-written Hopper GEMM's
  epilogue does: ``hopper.smem_store`` into a swizzled shared tile, ``hopper.tma_store``
  (thread 0, asynchronous, clipped at the tensor's edges), a ``hopper.tma_store_wait``
  before a loop writes the tile again and one before the kernel ends.  The pins ``tma`` and
  ``tma_store`` set to false keep the per-thread stores.
- A tensor the kernel both reads and writes, or writes twice over the same elements
  (``tile.ordered_tensors``: ``hs[t] = f(hs[t - 1])``, a GEMM's output read back or a row of it
  written again) is stored thread by thread, never by TMA (the copy would
  land after the program's next access; ``select-layouts`` keeps its loads off TMA too), with a
  ``hopper.sync`` before each write an access may precede and after each one an access may
  follow: the next thread to touch an element need not be the one that wrote it.
- Register loads and stores become per-thread ``hopper.load``/``hopper.store``; reductions
  ``hopper.reduce`` with their layout's plan (and a scratch tile when warps must trade
  partial results); conversions between layouts that place values on different threads get
  a scratch tile.

Shared tiles are created with ``offset = -1``: placing them is ``allocate-smem``'s job.
"""

from __future__ import annotations

import math
from typing import Any

from tkc import dtypes
from tkc.errors import TkcUnsupportedError
from tkc.ir.builder import Builder
from tkc.ir.core import Block, BlockArgument, Module, Operation, Value, replace_all_uses, uses
from tkc.ir.dialects import hopper, tile
from tkc.ir.dialects.hopper import SLOT_ROW, is_vector_box
from tkc.ir.layouts import (
    vector_scratch,
    SharedLayout,
    TmemAccumulator,
    Transposed,
    WgmmaAccumulator,
    is_accumulator,
    choose_swizzle,
    core_matrix_misfit,
    first_holders,
    reduce_plan,
    register_map,
    scan_plan,
)
from tkc.ir.types import MBARRIER, ScalarType, TileType
from tkc.passes.divisors import column_aligned
from tkc.passes.phases import Waits, thread_phases
from tkc.passes.pipeline_loops import ring_room
from tkc.pins import Options
from tkc.target import Target

I32 = ScalarType(dtypes.i32)
#: The shared memory a TMA-store epilogue takes at most when its tile is sliced: what a
#: 128 x 128 bf16 tile or two 64-column slices of a 128 x 256 one take.
EPILOGUE_BYTES = 32 * 1024


def lower_to_hopper(module: Module, options: Options, target: Target) -> None:
    for kernel in module.ops:
        if kernel.name == "tile.kernel":
            _Lowering(kernel, options, target).run()


def _copies_a_vector(ld: Operation) -> bool:
    """Whether the TMA copy ``ld`` moves a 1-D vector (``hopper.is_vector_box``)."""
    return is_vector_box(ld.box, ld.operands[1].type.layout)


def _owner(v: Value) -> Operation | None:
    return getattr(v, "owner", None)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


class _Lowering:
    def __init__(self, kernel: Operation, options: Options, target: Target):
        self.kernel = kernel
        self.options, self.target = options, target
        self.body: Block = kernel.regions[0].block
        self.top = Builder(self.body, 0, kernel.loc)  # allocations go first, in creation order
        self.barriers: list[Value] = []
        self.waits: dict[Operation, Waits] = {}  # an op that waits on a barrier -> how
        self.maps: list[list] = []
        self.consts: dict[int, Value] = {}
        self.stores_pending = False  # a hopper.tma_store exists: the kernel ends with a wait
        self._read_only: dict[Value, bool] = {}  # a tensor parameter -> whether the kernel only reads it

    def run(self) -> None:
        self._drop_views()
        self.written = tile.ordered_tensors(self.kernel)
        self._order_own_accesses()
        for block in self._blocks(self.kernel):
            self._lower_tma_groups(block)
        for op in list(self.kernel.walk()):
            lower = _LOWER.get(op.name)
            if lower is not None:
                lower(self, op)
        self._init_barriers()
        thread_phases(self.body, self.waits, self._const)
        self.kernel.attributes["tma_maps"] = self.maps
        if tile.has_cluster_reductions(self.kernel):
            # Every CTA of the cluster is running, and its barriers initialized, before any
            # stores into another's shared memory.
            self.top.create(hopper.ClusterBarrierOp)

    def _order_own_accesses(self) -> None:
        """A tensor whose accesses keep program order (``tile.ordered_tensors``: one the kernel
        reads and writes, or writes twice over the same elements): a barrier of the
        threads running the code (``hopper.sync``) before each write that an access of it may
        precede (earlier in the kernel, or anywhere in a loop around the write) and after each
        write that one may follow, since the thread that reads or writes an element next need
        not be the one that wrote it."""
        if not self.written:
            return
        order = {op: i for i, op in enumerate(self.kernel.walk())}
        access = tile.TENSOR_WRITES | tile.TENSOR_READS
        for w in [op for op in order if op.name in tile.TENSOR_WRITES and op.operands[0] in self.written]:
            others = [op for op in order if op is not w and op.name in access and op.operands[0] is w.operands[0]]
            loops = [a for a in w.ancestors() if a.name == "tile.for"]
            again = any(o in loops[-1].walk() for o in others) if loops else False  # a loop runs it again
            before = again or any(order[o] < order[w] for o in others)
            after = again or any(order[o] > order[w] for o in others)
            block = w.parent
            if before:
                block.insert(block.ops.index(w), hopper.SyncOp([], [], loc=w.loc))
            if after:
                block.insert(block.ops.index(w) + 1, hopper.SyncOp([], [], loc=w.loc))

    @staticmethod
    def _blocks(op: Operation) -> list[Block]:
        out = []
        for r in op.regions:
            for b in r.blocks:
                out.append(b)
                for inner in b.ops:
                    out.extend(_Lowering._blocks(inner))
        return out

    def _alloc(self, t: TileType, loc) -> Value:
        return self.top.value(hopper.SmemAllocOp, [], t, {"offset": -1}, loc=loc)

    # ------------------------------------------------------------------ views
    def _drop_views(self) -> None:
        for op in list(self.kernel.walk()):
            if op.name == "tile.transpose" and op.result.type.space == "smem":
                replace_all_uses(self.kernel, op.result, op.x)
                op.erase()

    # -------------------------------------------------------------------- TMA
    def _lower_tma_groups(self, block: Block) -> None:
        groups: list[list[Operation]] = []
        current: list[Operation] = []
        for op in block.ops:
            if op.name == "tile.load" and getattr(op.result.type, "space", None) == "smem":
                current.append(op)
            elif current and not (op.has_trait("pure") and not op.regions
                                  and not any(isinstance(r.type, TileType) for r in op.results)
                                  or self._scalar_load(op)):
                groups.append(current)
                current = []
        if current:
            groups.append(current)
        vectors: dict[int, list[Operation]] = {}
        if self.options.tma_vectors and groups and self._in_loop(groups[0][-1]):
            for op in block.ops:
                g = self._joins(op, groups) if self._vector_load(op) else None
                if g is not None:
                    vectors.setdefault(g, []).append(op)
        for k, g in enumerate(groups):
            self._lower_tma_group(g, vectors.get(k, []))

    @staticmethod
    def _scalar_load(op: Operation) -> bool:
        """A load of one element between a group's copies stays in the group: a read beside
        reads, it is issued before the copies and its latency runs under theirs, where ending
        the group there would wait for the copies before it (fftconv.tk at 4k reads its rows'
        norms between its constants and its rows: 1825 -> 1697 us on an H200)."""
        return op.name == "tile.load" and not isinstance(op.result.type, TileType)

    def _vector_load(self, op: Operation) -> bool:
        """Whether ``op`` is a register load the pin ``tma_vectors`` copies by TMA: a 1-D run
        along the last axis of a tensor parameter the kernel never writes (``lse[b, h, rows]``),
        out-of-bounds values 0 (what TMA fills in), whole 128-byte rows of one 16-byte atom
        (``vector_scratch``, ``hopper.is_vector_box``), from an element known to sit at a
        multiple of 16 bytes (``tkc.passes.divisors``: not varlen's ``lse[h, start + rows]``)."""
        if op.name != "tile.load" or getattr(op.result.type, "space", None) != "reg" or op.result.type.rank != 1:
            return False
        box, t = list(op.box), op.tensor.type
        if op.other not in (None, 0) or any(s != 1 for s in op.attributes.get("steps") or []) \
                or not 2 <= t.rank <= 5 or any(x != 1 for x in box[:-1]) or t.dtype.bits not in (16, 32):
            return False
        n, eb = box[-1], t.dtype.bits // 8
        if n > 256 or n * eb % 128 or not is_vector_box(box, vector_scratch(n, t.dtype)) \
                or not column_aligned(op.offsets[-1], eb):
            return False
        param = op.tensor
        if not (isinstance(param, BlockArgument) and param.block is self.body):
            return False
        if param not in self._read_only:
            self._read_only[param] = all(u.name in hopper.TENSOR_READ_ONLY for u in uses(self.kernel).get(param, []))
        return self._read_only[param]

    @staticmethod
    def _joins(op: Operation, groups: list[list[Operation]]) -> int | None:
        """The first TMA group of ``op``'s block before ``op`` whose last copy ``op``'s offsets
        are computed before: its copy is issued with that group's."""
        ops = op.parent.ops
        at = {o: i for i, o in enumerate(ops)}
        for k, g in enumerate(groups):
            last = at[g[-1]]
            if last < at[op] and all(_owner(v) not in at or at[_owner(v)] < last for v in op.offsets):
                return k
        return None

    @staticmethod
    def _in_loop(op: Operation) -> bool:
        return any(p.name == "tile.for" for p in op.ancestors())

    def _map(self, access: Operation, layout: SharedLayout) -> int:
        """The index in ``tma_maps`` of the map for a TMA load or store of ``layout``."""
        # A peer's copy (x.on(r)) is copied through the map of its parameter, rank r's of
        # the per-rank maps a ranked parameter gets (docs/hopper.md §4).
        param = self.body.args.index(tile.tensor_param(access.tensor))
        entry = [param, hopper.tma_map_box(list(access.box), layout), layout.swizzle]
        if entry not in self.maps:
            self.maps.append(entry)
        return self.maps.index(entry)

    def _lower_tma_group(self, loads: list[Operation], vectors: list[Operation] = ()) -> None:
        """``loads``' copies, and those of the 1-D ``vectors`` (pin ``tma_vectors``), which the
        threads then read from shared memory where each was loaded (``hopper.smem_load``)."""
        last = loads[-1]
        bar = self.top.value(hopper.MBarrierAllocOp, [], MBARRIER, {"offset": -1}, loc=loads[0].loc)
        names = [ld.tensor.name_hint or "tile" for ld in [*loads, *vectors]]
        bar.name_hint = "_".join(names) + "_full"
        self.barriers.append(bar)
        types = [ld.result.type for ld in loads]
        for v in vectors:
            lay = vector_scratch(v.box[-1], v.result.type.dtype)
            types.append(TileType((lay.rows, lay.cols), lay.dtype, "smem", lay))
        dsts = [self._alloc(t, ld.loc) for t, ld in zip(types, [*loads, *vectors])]
        for dst, name in zip(dsts, names):
            dst.name_hint = name + "_smem"
        b = Builder.before(last)  # after the allocations: they shift the kernel body's indices
        if self._in_loop(last):
            # Every warpgroup must be done reading the previous tiles before TMA overwrites them.
            b.create(hopper.BarrierOp, attrs={"id": 0})
        nbytes = sum(t.layout.size_bytes for t in types)
        b.create(hopper.ExpectTxOp, [bar], attrs={"bytes": nbytes}, loc=loads[0].loc)
        for ld, dst in zip([*loads, *vectors], dsts):
            b.create(hopper.TmaLoadOp, [ld.tensor, dst, bar, *ld.offsets],
                     attrs={"map": self._map(ld, dst.type.layout), "box": list(ld.box)}, loc=ld.loc)
            if ld in vectors:
                read = Builder.before(ld).value(hopper.SmemLoadOp, [dst], ld.result.type, loc=ld.loc)
                replace_all_uses(self.kernel, ld.result, read)
            else:
                replace_all_uses(self.kernel, ld.result, dst)
        wait = b.create(hopper.MBarrierWaitOp, [bar, bar], loc=last.loc)  # parity set by thread_phases
        self.waits[wait] = Waits(bar, 1, 2)
        for ld in [*loads, *vectors]:
            ld.erase()

    def _init_barriers(self) -> None:
        if not self.barriers:
            return
        for bar in self.barriers:
            self.top.create(hopper.MBarrierInitOp, [bar], attrs={"count": 1})
        self.top.create(hopper.FenceMBarrierInitOp)
        self.top.create(hopper.BarrierOp, attrs={"id": 0})

    # ----------------------------------------------------------------- phases
    def _const(self, value: int) -> Value:
        if value not in self.consts:
            self.consts[value] = self.top.value(tile.ConstantOp, [], I32, {"value": value})
        return self.consts[value]

    # -------------------------------------------------------------- op by op
    def _mma(self, op: Operation) -> None:
        b = Builder.before(op)
        majors = {k: v for k, v in op.attributes.items() if k in ("a_major", "b_major")}
        d = b.value(hopper.WgmmaOp, [op.a, op.b, op.acc, *op.scales], op.result.type, majors)
        e = b.value(hopper.WgmmaWaitOp, [d], op.result.type, {"pending": 0})
        replace_all_uses(self.kernel, op.result, e)
        op.erase()

    def _load(self, op: Operation) -> None:
        b = Builder.before(op)
        new = b.value(hopper.LoadOp, list(op.operands), op.result.type, dict(op.attributes))
        replace_all_uses(self.kernel, op.result, new)
        op.erase()

    def _store(self, op: Operation) -> None:
        staging = self._tma_staging(op)
        if staging is not None:
            self._tma_store(op, staging)
            return
        Builder.before(op).create(hopper.StoreOp, list(op.operands), attrs=dict(op.attributes))
        op.erase()

    def _atomic(self, op: Operation) -> None:
        """An atomic on one element whose old value is read becomes ``hopper.atomic_fetch``: the
        value reaches every thread through a shared word (a 128-byte tile, the smallest shared
        tile).  The others stay as they are: codegen issues them from the threads holding the
        values."""
        t = op.value.type
        if isinstance(t, TileType) and first_holders(t.layout) is None:
            raise TkcUnsupportedError(f"{self.target.name}: the threads of this atomic's {t.dtype.name} tile "
                                      f"hold its values in a pattern that would apply some twice; combine a "
                                      f"tile loaded or computed in the layout of its own box", op.loc)
        if not op.results or not uses(self.kernel).get(op.results[0]):
            staging = self._tma_staging(op) if op.name == "tile.atomic" and op.kind == "add" else None
            if staging is not None:
                self._tma_store(op, staging, reduce="add")
            return
        slot_layout = SharedLayout(8, 4, dtypes.i32, "k", 0)
        slot = self._alloc(TileType((8, 4), dtypes.i32, "smem", slot_layout), op.loc)
        kind = tile.atomic_kind(op)
        values = [op.expected, op.value] if kind == "cas" else [op.value]
        attrs = {"kind": kind, "box": list(op.box), "squeeze": list(op.squeeze or [])}
        if op.sem:
            attrs["sem"] = op.sem
        new = Builder.before(op).value(hopper.AtomicFetchOp, [op.tensor, slot, *values, *op.offsets],
                                       op.results[0].type, attrs)
        replace_all_uses(self.kernel, op.results[0], new)
        op.erase()

    def _tma_staging(self, op: Operation) -> SharedLayout | None:
        """The shared layout a product's result goes through to be stored (or atomically added,
        ``tile.atomic`` ``add``) by TMA, or None to store (add) it thread by thread: the value
        must be a wgmma accumulator's (converted) tile, the tensor's elements 16-bit (f32, f16
        or bf16 for an add, whose ``sem`` must be relaxed) and every axis squeezed but the last
        and one other (attention's ``o[b, h, rows, :]``, or ``o[b, rows, h, :]`` on a [B, N, H, D]
        tensor), its first column known to sit at a multiple of 16 bytes (``tkc.passes.divisors``),
        and the pins ``tma`` and ``tma_store`` not false."""
        adding = op.name == "tile.atomic"
        if op.tensor in self.written:
            return None  # an asynchronous copy would land after the program's next access
        if not (self.options.tma and self.options.tma_store) or op.attributes.get("steps") \
                or op.attributes.get("sem", "relaxed") != "relaxed":
            return None
        t, v = op.tensor.type, op.value.type
        if not isinstance(v, TileType):
            return None
        transposed = isinstance(v.layout, Transposed) and isinstance(v.layout.parent, WgmmaAccumulator)
        if not (is_accumulator(v.layout) or transposed):
            return None
        dtypes_ok = t.dtype.name in hopper.TMA_REDUCE_ADD_DTYPES if adding else t.dtype.bits == 16
        if not 2 <= t.rank <= 5 or t.rank - 1 in (op.squeeze or []) or v.rank != 2 \
                or not dtypes_ok or t.dtype != v.dtype:
            return None
        rows, cols = v.shape
        if rows > 256 or core_matrix_misfit(rows, cols, t.dtype) \
                or not column_aligned(op.offsets[-1], t.dtype.bits // 8):
            return None
        # A transposed accumulator (attention backward's dQ = (K^T dS^T)^T) spreads each
        # column over the warps, so it goes out whole, never in column slices: only where the
        # whole tile fits the epilogue's bytes and leaves the loops' rings two stages.
        nbytes = rows * cols * t.dtype.bits // 8
        if transposed and (nbytes > EPILOGUE_BYTES or not self._leaves_two_stages(nbytes)):
            return None
        try:
            return SharedLayout(rows, cols, t.dtype, "k", choose_swizzle(cols, t.dtype))
        except ValueError:
            return None

    def _tma_store(self, op: Operation, layout: SharedLayout, reduce: str | None = None) -> None:
        """The epilogue of a hand-written Hopper GEMM: every thread writes its values to a
        shared tile and thread 0 has TMA copy it out (clipped at the tensor's edges), which
        runs on while the threads go on.  ``reduce = "add"`` (a tile ``atomic_add``) has the
        copies add the tile into the tensor instead (``cp.reduce.async.bulk.tensor``).

        A tile wider than two 128-byte TMA boxes goes out one box-wide column slice at a time through
        two shared slices used in turn (a 128 x 256 bf16 tile: four 64-column slices, 32 KB
        of shared memory instead of 64 KB, which the TMA ring gets as one more stage).  Before
        a slice is written, the copy that last read it must be done: at most one copy, the
        other slice's, may still be reading (``pending = 1``).  The first slice of a tile in
        a loop waits for every copy (``pending = 0``; the previous tile's are long done), so
        the rule holds whatever the slice count.  The kernel waits for the last copy before
        it ends.  Into a peer's tensor (``x.on(r)``) each slice gets a buffer of its own where
        those bytes leave the loops' rings two stages: a copy over the link reads its slice for
        far longer, and so each slice waits for the previous tile's copy of its buffer only.

        A tall tile whose whole staging would take more than 32 KB (256 x 128 bf16: 64 KB) goes
        out in slices narrower still, two of which take 32 KB (four 32-column slices, 64-byte
        swizzle), so that the ring keeps its four stages there too.

        When those bytes would leave a loop's copies no room for a second stage (attention at
        D = 256 with 80-row K and V blocks: Q 64 KB and two stages of K and V 160 KB), or, where
        the loops copy 1-D vectors too, a stage those vectors would cost (``_stages_to_keep``), a tile
        the kernel TMA-loads once, outside every loop, and then only reads with products that
        all come before the store (attention's Q, when a program computes one tile) stages
        the epilogue instead, whole, after a wait that brings every warpgroup past its last
        product (``_reused_staging``).  Only then: where the bytes are to spare, the reuse
        measured 1-3% slower on an H100 (benchmarks/RESULTS.md)."""
        rows, cols = op.value.type.shape
        width = layout.box_cols if layout.swizzle == 128 and cols > 2 * layout.box_cols else cols
        if isinstance(op.value.type.layout, Transposed):
            width = cols  # whole (``_tma_staging``): a column's values are spread over the warps
        eb = layout.dtype.bits // 8
        if rows * cols * eb > EPILOGUE_BYTES:
            while 2 * rows * width * eb > EPILOGUE_BYTES and width % 32 == 0:
                width //= 2
        acc = op.value.type.layout
        if isinstance(acc, TmemAccumulator) and acc.warpgroups > 1 and width < cols:
            # A column slice is stored by the warpgroup that holds its columns: it must not
            # straddle two (BN = 192 over two warpgroups: 96 columns each, so 32-column slices).
            # The whole tile (no slices) is stored by every warpgroup, each its own columns.
            while (cols // acc.warpgroups) % width and width % 16 == 0:
                width //= 2
        reused = None
        staging = min(cols // width, 2) * rows * width * eb
        if self._ring_stages(staging) < self._stages_to_keep(staging):
            reused = self._reused_staging(op, layout)
            if reused is not None:
                width = cols
        slices = cols // width
        if slices > 1:
            layout = SharedLayout(rows, width, layout.dtype, layout.major, choose_swizzle(width, layout.dtype))
        # Into a peer's memory a slice's copy holds its shared bytes for as long as the link takes
        # them, far longer than a local copy: where the bytes leave the loops two stages, every
        # slice gets its own buffer, so the next tile's epilogue, not this one, waits for them.
        whole = tile.is_peer(op.tensor) and reused is None and slices > 2 \
            and self._leaves_two_stages(rows * cols * eb)
        nbufs = slices if whole else min(slices, 2)
        bufs = [] if reused is None else [reused]
        for i in range(nbufs if reused is None else 0):
            buf = self._alloc(TileType((rows, width), layout.dtype, "smem", layout), op.loc)
            buf.name_hint = (op.tensor.name_hint or "out") + "_out" + (str(i) if slices > 1 else "")
            bufs.append(buf)
        shifts = [None] + [self._const(c * width) for c in range(1, slices)]
        # After the allocations and constants: they shift the kernel body's indices.
        b = Builder.before(op)
        *fixed, col_off = op.offsets
        tma_map = self._map(op, layout)
        for c in range(slices):
            if whole:  # buffer c was last read by the previous tile's slice c: nbufs - 1 copies ago
                if self._in_loop(op):
                    b.create(hopper.TmaStoreWaitOp, attrs={"pending": nbufs - 1}, loc=op.loc)
            elif c >= 2 or self._in_loop(op) or reused is not None:
                b.create(hopper.TmaStoreWaitOp, attrs={"pending": 0 if c == 0 else 1}, loc=op.loc)
            store_attrs = {"col": c * width} if slices > 1 else {}
            b.create(hopper.SmemStoreOp, [op.value, bufs[c % nbufs]], attrs=store_attrs, loc=op.loc)
            col = col_off if c == 0 else b.value(tile.AddOp, [col_off, shifts[c]], I32, loc=op.loc)
            b.create(hopper.TmaStoreOp, [op.tensor, bufs[c % nbufs], *fixed, col],
                     attrs={"map": tma_map, "box": [*op.box[:-1], width], **({"reduce": reduce} if reduce else {})},
                     loc=op.loc)
        op.erase()
        if not self.stores_pending:
            self.stores_pending = True
            ret = self.body.terminator
            self.body.insert(self.body.ops.index(ret), hopper.TmaStoreWaitOp([], [], {"pending": 0}, loc=op.loc))

    def _leaves_two_stages(self, staging: int) -> bool:
        """Whether ``staging`` more bytes of shared memory leave the tiles copied in loops room
        for two stages (``pipeline-loops``' rule, ``ring_room``, all such tiles as one ring)."""
        return self._ring_stages(staging) >= 2

    def _ring_stages(self, staging: int, vectors: bool = True) -> int:
        """The stages the tiles copied in loops get beside ``staging`` more bytes of shared
        memory (``pipeline-loops``' rule, ``ring_room``, all such tiles as one ring; a large
        number where no loop copies anything), counting the 1-D vectors the pin
        ``tma_vectors`` copies with them or not."""
        capacity = self.target.smem_per_program(self.options.programs_per_sm)
        copies = [ld for ld in self.kernel.walk() if ld.name == "hopper.tma_load"]
        left_out = set() if vectors else {ld.operands[1] for ld in copies if _copies_a_vector(ld)}
        looped = [ld for ld in copies if self._in_loop(ld) and ld.operands[1] not in left_out]
        ring = {ld.operands[1] for ld in looped}
        others, group = staging, 0
        for op in self.body.ops:
            if op.name == "hopper.smem_alloc":
                if op.result in ring:
                    group += op.stride
                elif op.result not in left_out:
                    others += op.stride
            elif op.name == "hopper.mbarrier_alloc":
                others += op.stride
        return ring_room(capacity, others, len(looped)) // group if ring else 1 << 30

    def _stages_to_keep(self, staging: int) -> int:
        """The stages an epilogue's ``staging`` bytes must leave the loops' rings, or a loaded-once
        tile stages it instead (``_reused_staging``): two; and on wgmma targets, where the
        loops copy 1-D vectors beside their tiles (``tma_vectors``), as many as the rings
        would have without the vectors' bytes, up to three: a few hundred bytes must not cost
        a ring a stage (attention backward at D = 64: lse and delta would take Q's and dO's
        third, 0.82-0.90x; with dV's epilogue through K's tile they keep it, 1.02-1.07x over
        the vectors loaded per thread on an H200).  (sm_100a's rings share their bytes with
        the products' staging, which is added later: left as it is.)"""
        if self.target.mma != "wgmma" or not any(ld.name == "hopper.tma_load" and self._in_loop(ld)
                                                 and _copies_a_vector(ld) for ld in self.kernel.walk()):
            return 2
        return max(2, min(3, self._ring_stages(staging, vectors=False)))

    def _reused_staging(self, op: Operation, layout: SharedLayout) -> Value | None:
        """A shared tile of the staging's type that ``op``'s epilogue may write instead of new
        bytes, or None.  It must be one allocation (not a ring) that one ``hopper.tma_load``
        outside every loop fills and that only products (``hopper.wgmma`` A or B) read
        besides, every use in a top-level op before the store's, which is in no loop itself:
        then nothing writes the tile again once it is loaded, and the ``tma_store_wait`` the
        store gets first (a wait for no copy, then every thread of the role meets) comes after
        each warpgroup has waited for its last product.  (A persistent kernel loads its tiles
        in the tile loop, into rings the producer refills: never reused.)"""
        if self._in_loop(op):
            return None
        want = TileType(op.value.type.shape, layout.dtype, "smem", layout)

        def at_top(u: Operation) -> Operation | None:
            """The op of the kernel body that is or holds ``u``."""
            return next((a for a in [u, *u.ancestors()] if a.parent is self.body), None)

        top = at_top(op)
        if top is None:
            return None
        before = set(self.body.ops[:self.body.ops.index(top)])
        users = uses(self.kernel)
        for alloc in self.body.ops:
            if alloc.name != "hopper.smem_alloc" or alloc.attributes.get("stages", 1) != 1 \
                    or alloc.result.type != want:
                continue
            mine = users.get(alloc.result, [])
            loads = [u for u in mine if u.name == "hopper.tma_load"]
            if (len(loads) == 1 and loads[0].operands[1] is alloc.result and not self._in_loop(loads[0])
                    and all(u.name == "hopper.tma_load" or (u.name == "hopper.wgmma"
                                                            and alloc.result not in u.operands[2:])
                            for u in mine)
                    and all(at_top(u) in before for u in mine)):
                return alloc.result
        return None

    def _plan(self, make: Any, op: Operation) -> Any:
        """``make(layout, axis)`` (``reduce_plan``, ``scan_plan``) for ``op``'s operand; a layout
        without a plan is refused at ``op``."""
        try:
            return make(op.x.type.layout, op.axis)
        except ValueError as e:
            raise TkcUnsupportedError(f"{self.target.name}: {e}", op.loc) from None

    def _partials(self, op: Operation, rows: int, cols: int) -> Value:
        """A shared scratch tile for partials that travel as they are combined: f32 for floats
        (sums of 16-bit floats accumulate in f32), the integer dtype itself for integers (an
        f32 would round sums above 2^24)."""
        dt = op.x.type.dtype if op.x.type.dtype.is_int else dtypes.f32
        lay = SharedLayout(rows, cols, dt, "k", 0)
        return self._alloc(TileType((rows, cols), dt, "smem", lay), op.loc)

    def _reduce(self, op: Operation) -> None:
        if op.kind not in hopper.REDUCE_KINDS:  # a mean: the decompose pass makes it a sum
            raise TkcUnsupportedError(f"a {op.kind} reduction reaches lower-to-hopper: is the decompose pass in "
                                      f"the pipeline before it?", op.loc)
        plan = self._plan(reduce_plan, op)
        scratch = []
        if plan.warp_xor:
            kept = op.result.type.shape[0] if isinstance(op.result.type, TileType) else 1
            rows = _round_up(op.x.type.layout.threads // self.target.warp_size, 8)
            scratch = [self._partials(op, rows, _round_up(kept, 4))]
        b = Builder.before(op)
        new = b.value(hopper.ReduceOp, [op.x, *scratch], op.result.type,
                      {"kind": op.kind, "axis": op.axis, "shuffle_xor": list(plan.shuffle_xor),
                       "warp_xor": list(plan.warp_xor)})
        replace_all_uses(self.kernel, op.result, new)
        op.erase()

    def _arg_reduce(self, op: Operation) -> None:
        raise TkcUnsupportedError(f"an {op.kind} reaches lower-to-hopper: is the decompose pass in the pipeline "
                                  f"before it?", op.loc)

    def _scan(self, op: Operation) -> None:
        layout = op.x.type.layout
        plan = self._plan(scan_plan, op)
        # Each thread writes its values' block totals in its row.
        scratch = [self._partials(op, _round_up(layout.threads, 8), _round_up(layout.regs, 4))] \
            if plan.warp_xor else []
        new = Builder.before(op).value(hopper.ScanOp, [op.x, *scratch], op.result.type,
                                       {"kind": op.kind, "axis": op.axis})
        replace_all_uses(self.kernel, op.result, new)
        op.erase()

    def _cluster_reduce(self, op: Operation) -> None:
        """A buffer of slots (an f32 per rank and element) per exchange in flight (two in a
        loop, where the next exchange may begin before this one's reads) and an mbarrier for
        each, armed by this CTA and completed by the bytes every rank stores into it
        (hopper.ClusterReduceOp)."""
        n = self.options.cluster
        self.kernel.attributes["cluster"] = n
        copies = 2 if self._in_loop(op) else 1
        elements = math.prod(op.x.type.shape)
        rows, cols = copies * _round_up(-(-n * elements // SLOT_ROW), 8), SLOT_ROW
        scratch = self._alloc(TileType((rows, cols), dtypes.f32, "smem", SharedLayout(rows, cols, dtypes.f32, "k", 0)),
                              op.loc)
        scratch.name_hint = "cluster_slots"
        attrs = {"offset": -1} if copies == 1 else {"offset": -1, "stages": copies}
        bar = self.top.value(hopper.MBarrierAllocOp, [], MBARRIER, attrs, loc=op.loc)
        bar.name_hint = "cluster_slots_full"
        self.barriers.append(bar)
        b = Builder.before(op)
        new = b.value(hopper.ClusterReduceOp, [op.x, scratch, bar, bar], op.result.type,
                      {"kind": op.kind})  # phase set by thread_phases
        if copies == 2 and any(mask for mask, _ in first_holders(op.x.type.layout) or ()):
            # Some threads send nothing (a replicated element goes out from one): the CTA meets
            # after its reads, so that its next exchange's stores, which let a peer start the
            # one after into this buffer, follow every thread's reads.
            b.create(hopper.BarrierOp, attrs={"id": 0})
        self.waits[new.owner] = Waits(bar, 3, 4)  # buffer phase % 2, parity phase // 2
        replace_all_uses(self.kernel, op.result, new)
        op.erase()

    def _to_smem(self, op: Operation) -> None:
        """Every thread stores its values into a shared tile; once all have (and their generic
        stores are ordered before the async proxy wgmma reads through), wgmma may read it.  In a
        loop, the previous iteration's wgmmas must be done with the tile first."""
        dst = self._alloc(op.result.type, op.loc)
        dst.name_hint = (op.x.name_hint or "tile") + "_smem"
        # after the allocation: it shifts the kernel body's indices
        self._write_for_wgmma(op, Builder.before(op), hopper.SmemStoreOp, dst)

    def _write_for_wgmma(self, op: Operation, b: Builder, write: type, dst: Value) -> None:
        """``write`` of ``op.x`` into ``dst`` by every thread at ``b``, between the barriers that
        let wgmma read ``dst`` (a barrier first in a loop: the previous iteration's products are
        done with it; the proxy fence and a barrier after); ``dst`` replaces ``op``."""
        if self._in_loop(op):
            b.create(hopper.BarrierOp, attrs={"id": 0})
        b.create(write, [op.x, dst])
        b.create(hopper.FenceProxyAsyncOp)
        b.create(hopper.BarrierOp, attrs={"id": 0})
        replace_all_uses(self.kernel, op.result, dst)
        op.erase()

    def _transpose_smem(self, op: Operation) -> None:
        """Every thread copies its share of a shared tile into one stored the other way round
        (``hopper.smem_copy``), fenced for the async proxy wgmma reads through and followed by a
        barrier, after which wgmma may read the copy and the original may be refilled.  In a
        loop, the previous iteration's wgmmas must be done with the copy first."""
        dst = self._alloc(op.result.type, op.loc)
        dst.name_hint = (op.x.name_hint or "tile") + "_t_smem"
        b = Builder.before(op)
        ops = op.parent.ops
        prev = ops[ops.index(op) - 1] if ops.index(op) else None
        product = _owner(prev.x) if prev is not None and prev.name == "hopper.wgmma_wait" else None
        if product is not None and product.name == "hopper.wgmma" and op.x not in (product.a, product.b):
            # Attention's S = Q K^T is still on the tensor cores while the threads copy V: its
            # wait comes after the copy (the product reads neither tile of it).
            b = Builder.before(prev)
        self._write_for_wgmma(op, b, hopper.SmemCopyOp, dst)

    def _convert(self, op: Operation) -> None:
        src, dst = op.x.type, op.result.type
        if op.scratch or register_map(src.layout, dst.layout) is not None:
            return
        if src.dtype.is_bool:
            # Shared tiles hold 8- to 32-bit elements: a condition travels as 0 or 1 in i32
            # and is compared with 0 on arrival.
            b = Builder.before(op)
            wide = b.value(tile.CastOp, [op.x], src.with_dtype(dtypes.i32), loc=op.loc)
            moved = b.value(hopper.ConvertLayoutOp, [wide], dst.with_dtype(dtypes.i32), loc=op.loc)
            zero = b.value(tile.ConstantOp, [], dst.with_dtype(dtypes.i32), {"value": 0}, loc=op.loc)
            replace_all_uses(self.kernel, op.result,
                             b.value(tile.CmpOp, [moved, zero], dst, {"pred": "ne"}, loc=op.loc))
            op.erase()
            self._convert(moved.owner)
            return
        try:
            if src.rank > 2:
                raise ValueError("only 1-D and 2-D tiles trade values through shared memory")
            if src.rank == 2 and not core_matrix_misfit(*src.shape, src.dtype):
                lay = SharedLayout(src.shape[0], src.shape[1], src.dtype, "k", 0)
            else:  # its values in order, rows of one atom
                lay = vector_scratch(math.prod(src.shape), src.dtype)
        except ValueError as e:
            hint = "a tile of 2 axes with rows a multiple of 8 and rows 16 bytes long can"
            raise TkcUnsupportedError(f"{self.target.name}: a {src.rank}-D {src.dtype.name} tile of shape "
                                      f"{list(src.shape)} cannot move between the threads that compute it here "
                                      f"and those that use it ({e}); {hint}", op.loc) from None
        op.operands.append(self._alloc(TileType((lay.rows, lay.cols), src.dtype, "smem", lay), op.loc))


_LOWER = {
    "tile.mma": _Lowering._mma,
    "tile.load": _Lowering._load,
    "tile.store": _Lowering._store,
    "tile.atomic": _Lowering._atomic,
    "tile.atomic_cas": _Lowering._atomic,
    "tile.reduce": _Lowering._reduce,
    "tile.scan": _Lowering._scan,
    "tile.arg_reduce": _Lowering._arg_reduce,
    "tile.cluster_reduce": _Lowering._cluster_reduce,
    "hopper.convert_layout": _Lowering._convert,
    "hopper.to_smem": _Lowering._to_smem,
    "hopper.transpose_smem": _Lowering._transpose_smem,
}
