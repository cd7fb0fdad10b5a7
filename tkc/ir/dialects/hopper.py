"""The ``hopper`` dialect: what sm_90a offers, one op per thing a Hopper kernel does.

Shared-memory tiles and mbarriers, TMA copies, wgmma, per-thread global loads and stores,
reductions and layout conversions of distributed register tiles.  The semantics of every op
(who executes it, what it reads and writes) are in docs/hopper.md, section 3; the emulator
and codegen implement exactly that.  Ops only check their own types here; they never choose
a layout (select-layouts does) or an offset (allocate-smem does).
"""

from __future__ import annotations

import math
from typing import Any

from tkc import dtypes
from tkc.ir.core import Operation, register
from tkc.ir.dialects.tile import REDUCE_KINDS, SCAN_KINDS, TENSOR_WRITES, check_block_scales, check_steps, tensor_param
from tkc.ir.layouts import ScaleLayout, TmemAccumulator, first_holders, read_as
from tkc.ir.types import MBARRIER, ScalarType, TensorType, TileType, Type
from tkc.registers import SETMAXNREG_MAX, SETMAXNREG_MIN, setmaxnreg_budget

#: Ops that write a tensor (operand 0, or a peer's copy of one) at the tile level and once
#: lowered: the tile level's, the lowered stores and the atomic whose old value is read.
LOWERED_WRITES = TENSOR_WRITES | {"hopper.store", "hopper.tma_store", "hopper.atomic_fetch"}

I32 = ScalarType(dtypes.i32)


def _smem(t: Type) -> bool:
    from tkc.ir.layouts import SharedLayout

    return isinstance(t, TileType) and t.space == "smem" and isinstance(t.layout, SharedLayout)


def _reg(t: Type) -> bool:
    return isinstance(t, TileType) and t.space == "reg" and t.layout is not None


def _check_view(op: Operation, t: TileType, what: str) -> None:
    """A shared tile's shape is its layout's rows x cols, or the transpose (a view)."""
    lay = t.layout
    if t.rank != 2 or t.shape not in ((lay.rows, lay.cols), (lay.cols, lay.rows)) or t.dtype != lay.dtype:
        raise op.error(f"{what} {t} does not match its layout {lay}")


def _check_reg(op: Operation, t: Type, what: str) -> None:
    if not _reg(t):
        raise op.error(f"{what} must be a register tile with a layout, got {t}")
    if tuple(t.layout.shape) != t.shape:
        raise op.error(f"{what} {t}: layout {t.layout} covers shape {tuple(t.layout.shape)}")


class _OneThread:
    """Marker: thread 0 of the CTA executes the op (docs/hopper.md section 3)."""


# -------------------------------------------------------------- shared memory
@register
class SmemAllocOp(Operation):
    """A shared tile at byte ``offset`` of the dynamic shared memory (-1: not placed yet)."""

    name = "hopper.smem_alloc"
    RESULTS = ("result",)
    ATTRS = {"offset": int, "stages?": int}

    def verify(self) -> None:
        t = self.result.type
        if not _smem(t):
            raise self.error(f"allocates a shared tile with a #smem layout, got {t}")
        _check_view(self, t, "result")
        if self.offset != -1 and (self.offset < 0 or self.offset % t.layout.alignment):
            raise self.error(f"offset {self.offset} is not {t.layout.alignment}-B aligned")
        _check_stages(self)

    @property
    def stride(self) -> int:
        """Bytes from one stage of a ring to the next."""
        lay = self.result.type.layout
        return -(-lay.size_bytes // lay.alignment) * lay.alignment

    @property
    def nbytes(self) -> int:
        """Bytes the allocation takes: its tile's, or ``stages`` strides for a ring."""
        n = stages_of(self.result)
        return n * self.stride if n > 1 else self.result.type.layout.size_bytes


def _check_stages(op: Operation) -> None:
    """A ring (``stages`` > 1) is used only through ``hopper.stage``."""
    n = op.attributes.get("stages", 1)
    if not isinstance(n, int) or n < 1:
        raise op.error("stages must be a positive integer")


def stages_of(v) -> int:
    """How many stages the allocation behind ``v`` has (1 for a plain tile or barrier)."""
    owner = getattr(v, "owner", None)
    return owner.attributes.get("stages", 1) if owner is not None else 1


#: Arrivals an mbarrier counts in a phase, and bytes its tx-count holds, are below 2^20 (PTX ISA, mbarrier).
MAX_ARRIVALS = 1 << 20


def _const_int(v) -> int | None:
    """The value of an integer ``tile.constant`` defining ``v``, else None."""
    owner = getattr(v, "owner", None)
    if owner is None or owner.name != "tile.constant":
        return None
    value = owner.attributes.get("value")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _name(v) -> str:
    """A value in messages: ``%name`` or, without a name, what defines it."""
    if v.name_hint:
        return f"%{v.name_hint}"
    owner = getattr(v, "owner", None)
    return f"the {owner.name} at {owner.loc}" if owner is not None else "a block argument"


@register
class MBarrierAllocOp(Operation):
    """An mbarrier (or a ring of ``stages`` of them) at a byte ``offset`` of shared memory."""

    name = "hopper.mbarrier_alloc"
    RESULTS = ("result",)
    ATTRS = {"offset": int, "stages?": int}
    stride = 8

    @property
    def nbytes(self) -> int:
        """Bytes the allocation takes: 8 for each stage."""
        return self.stride * stages_of(self.result)

    def verify(self) -> None:
        if self.result.type != MBARRIER:
            raise self.error(f"result must be an mbarrier, got {self.result.type}")
        if self.offset != -1 and (self.offset < 0 or self.offset % 8):
            raise self.error(f"offset {self.offset} is not 8-B aligned")
        _check_stages(self)


@register
class StageOp(Operation):
    """Stage ``index`` (an i32 in [0, stages)) of a ring of shared tiles or mbarriers: the
    allocation's offset plus ``index`` strides."""

    name = "hopper.stage"
    OPERANDS = ("ring", "index")
    RESULTS = ("result",)
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        owner = getattr(self.ring, "owner", None)
        if owner is None or owner.name not in ("hopper.smem_alloc", "hopper.mbarrier_alloc") \
                or owner.attributes.get("stages", 1) < 2:
            raise self.error("takes a ring: a hopper.smem_alloc or hopper.mbarrier_alloc with stages > 1")
        if self.index.type != I32:
            raise self.error("the stage index is an i32")
        n, k = owner.attributes["stages"], _const_int(self.index)
        if k is not None and not 0 <= k < n:
            raise self.error(f"stage {k} of the {n}-stage ring {_name(self.ring)} is outside [0, {n}): "
                             f"index it with 0 to {n - 1}")
        if self.result.type != self.ring.type:
            raise self.error(f"a stage has its ring's type {self.ring.type}, not {self.result.type}")


@register
class MBarrierArriveOp(Operation):
    """``mbarrier.arrive``: thread 0 of each warpgroup that runs it arrives once (a consumer
    warpgroup releasing a ring stage).  With ``cluster``, it arrives on the barrier at the same
    offset in every CTA of the kernel's cluster (a stage that the cluster's copies fill
    together is free once every CTA's consumers have released it).  With ``threads``, every
    thread arrives (a stage its threads read themselves, ``hopper.smem_load``: each orders its
    own reads before the next copy)."""

    name = "hopper.mbarrier_arrive"
    OPERANDS = ("barrier",)
    ATTRS = {"cluster?": bool, "threads?": bool}

    def verify(self) -> None:
        _check_barrier(self, self.barrier)
        if self.attributes.get("cluster"):
            _check_cluster(self, "arrives on every CTA of a cluster")
            if self.attributes.get("threads"):
                raise self.error("arrives once per warpgroup on a cluster's barriers, not from every thread")


@register
class RoleOp(Operation):
    """Warpgroups ``[first, first + warpgroups)`` run the region, the others skip it.  Inside,
    thread ids are counted from the role's first thread (so layouts see threads from 0), and
    ``regs`` (when nonzero) is the per-thread register budget the role asks for with
    ``setmaxnreg`` on entry.  ``warps`` (when given) narrows the region to the role's first
    ``warps`` warps once every warpgroup has set its budget: a role that only issues copies and
    waits for ring stages (a producer) needs no more than one, and an idle warp spinning on
    the same parity waits could fall two phases behind a ring and wait forever."""

    name = "hopper.role"
    ATTRS = {"name": str, "first": int, "warpgroups": int, "regs": int, "warps?": int}
    REGIONS = 1

    @property
    def body(self):
        return self.regions[0].block

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    def verify(self) -> None:
        if self.first < 0 or self.warpgroups < 1:
            raise self.error("a role spans at least one warpgroup from first >= 0")
        if self.regs and not setmaxnreg_budget(self.regs):
            raise self.error(f"setmaxnreg takes a multiple of 8 in [{SETMAXNREG_MIN}, {SETMAXNREG_MAX}] "
                             f"(0: keep the budget)")
        parent = self.parent.parent_op if self.parent else None
        if parent is None or parent.name != "tile.kernel":
            raise self.error("roles sit directly in the kernel body")
        threads = parent.attributes.get("threads")
        if isinstance(threads, int) and 128 * (self.first + self.warpgroups) > threads:
            raise self.error(f"warpgroups [{self.first}, {self.first + self.warpgroups}) exceed the kernel's "
                             f"{threads} threads")
        if self.warps is not None:
            if not 1 <= self.warps <= 4 * self.warpgroups:
                raise self.error(f"warps = {self.warps}: a role of {self.warpgroups} warpgroup(s) has "
                                 f"1 to {4 * self.warpgroups} warps")
            for op in self.body.ops:
                for inner in op.walk():
                    if not _runs_on_few_warps(inner):
                        raise inner.error(f"in role {self.attributes['name']!r} with warps = {self.warps}: "
                                          f"'{inner.name}' needs every thread of the role")


# What a role narrowed to a few warps (``warps``) may run: scalar arithmetic and control flow
# (the same in every thread), ring stages, waits, and what thread 0 alone issues (copies).
# A peer's copy (``tile.peer``) is one address every thread loads for itself, like a scalar;
# a wait for a flag and a barrier across ranks are one thread's, then the role's warps meet.
# A tcgen05 MMA is the first warp's (it waits, its thread 0 issues), a commit thread 0's.
_FEW_WARPS = ("tile.for", "tile.if", "tile.yield", "hopper.stage", "hopper.mbarrier_wait", "tile.peer",
              "tile.wait", "tile.rank_barrier", "blackwell.mma", "blackwell.commit")


def _runs_on_few_warps(op: Operation) -> bool:
    if isinstance(op, _OneThread) or op.name in _FEW_WARPS:
        return True
    scalar = bool(op.results) and all(isinstance(r.type, ScalarType) for r in op.results)
    # A scalar load is one element every thread reads for itself: any warps may run it.
    return scalar and (op.name.startswith("tile.") or op.name == "hopper.load")


def barrier_roles(kernel: Operation) -> int:
    """How many roles of a program meet at each ``tile.rank_barrier`` of ``kernel``: every
    role runs its own copy (specialize-warps), and the barrier completes once all arrived."""
    return max(1, sum(1 for op in kernel.regions[0].block.ops if op.name == "hopper.role"))


def _check_barrier(op: Operation, v) -> None:
    if v.type != MBARRIER:
        raise op.error(f"expects an mbarrier, got {v.type}")


@register
class MBarrierInitOp(Operation, _OneThread):
    """``mbarrier.init`` with ``count`` arrivals per phase, of every stage of a ring."""

    name = "hopper.mbarrier_init"
    OPERANDS = ("barrier",)
    ATTRS = {"count": int}

    def verify(self) -> None:
        _check_barrier(self, self.barrier)
        if not 1 <= self.count < MAX_ARRIVALS:
            raise self.error(f"count = {self.count}: an mbarrier counts 1 to {MAX_ARRIVALS - 1} arrivals a phase")


@register
class FenceMBarrierInitOp(Operation, _OneThread):
    """``fence.mbarrier_init.release.cluster``: barriers just initialized are seen by the async proxy and the
    cluster's other CTAs."""

    name = "hopper.fence_mbarrier_init"


@register
class BarrierOp(Operation):
    """``bar.sync id`` over every thread of the CTA."""

    name = "hopper.barrier"
    ATTRS = {"id": int}

    def verify(self) -> None:
        if not 0 <= self.id < 16:
            raise self.error("named barrier ids are 0..15")
        if enclosing_role(self) is not None:
            raise self.error("inside a role, threads synchronize through mbarriers (a bar.sync over the "
                             "whole CTA would wait for the other roles)")


@register
class SyncOp(Operation):
    """``bar.sync`` over the threads running this code: the CTA's barrier 0 outside roles, the
    role's own named barrier ``1 + first`` over its threads inside one (the barrier of the
    reductions' round trips).  ``specialize-warps`` makes a consumer loop's ``hopper.barrier``
    (around a register tile stored for wgmma, ``hopper.to_smem``) one of these."""

    name = "hopper.sync"


def role_meets(op: Operation) -> bool:
    """Whether every thread of the role running ``op`` meets at it: a role barrier, a TMA
    store (its threads meet before thread 0 copies), or a wait for TMA stores but with
    ``sync = false``."""
    return op.name in (SyncOp.name, "hopper.tma_store") or (
        op.name == "hopper.tma_store_wait" and op.attributes.get("sync", True))


#: The named barriers of ``hopper.turn``: warpgroup ``g`` of a two-warpgroup role waits on
#: ``TURN_BARRIER + g``.  0 is the CTA's, ``1 + first`` a role's internal one (first <= 1).
TURN_BARRIER = 3


@register
class TurnOp(Operation):
    """Turns between the two warpgroups of a role (ping-pong): each takes the turn before it
    issues its wgmmas and passes it on right after, so one warpgroup's tensor-core work runs
    while the other computes in registers.  Warpgroup ``g`` waits on named barrier
    ``TURN_BARRIER + g`` and passes on ``TURN_BARRIER + 1 - g`` (256 threads each):

    - ``start``: warpgroup 1 passes (warpgroup 0 has the first turn);
    - ``wait``: ``bar.sync TURN_BARRIER + g, 256``;
    - ``pass``: ``bar.arrive TURN_BARRIER + 1 - g, 256``;
    - ``end``: warpgroup 0 waits once, taking warpgroup 1's last pass, so every barrier is
      back where it started (a persistent kernel's next tile starts clean).
    """

    name = "hopper.turn"
    ATTRS = {"kind": str}
    KINDS = ("start", "wait", "pass", "end")

    def verify(self) -> None:
        if self.kind not in self.KINDS:
            raise self.error(f"kind is one of {', '.join(self.KINDS)}, not {self.kind!r}")
        role = enclosing_role(self)
        if role is None or role.attributes.get("warpgroups") != 2:
            raise self.error("takes turns between the two warpgroups of a role")


def enclosing_role(op: Operation) -> Operation | None:
    """The ``hopper.role`` an op is nested in, if any."""
    return next((p for p in op.ancestors() if p.name == "hopper.role"), None)


@register
class ExpectTxOp(Operation, _OneThread):
    """``mbarrier.arrive.expect_tx``: one arrival and ``bytes`` more expected this phase.  With
    ``pair`` (CTA pairs, ``pair-ctas``), on the barrier at this offset in the pair's even CTA,
    which waits for both CTAs' copies before it multiplies for both."""

    name = "hopper.expect_tx"
    OPERANDS = ("barrier",)
    ATTRS = {"bytes": int, "pair?": bool}

    def verify(self) -> None:
        _check_barrier(self, self.barrier)
        if self.attributes.get("pair"):
            check_pair(self)
        if self.bytes <= 0 or self.bytes % 16:
            raise self.error("bytes must be a positive multiple of 16")
        if self.bytes >= MAX_ARRIVALS:
            raise self.error(f"bytes = {self.bytes}: an mbarrier's tx-count holds less than {MAX_ARRIVALS} bytes "
                             f"a phase (split the copies over more phases)")


#: The element types a TMA copy adds into a tensor (``cp.reduce.async.bulk.tensor .add``).
TMA_REDUCE_ADD_DTYPES = ("f32", "f16", "bf16")


def tma_row_axis(box: list) -> int:
    """The tensor axis a TMA copy's rows run along: the one axis but the last whose box is not
    1 (``k_cache[rows, kvh, :]`` copies rows of axis 0), the second-to-last by default."""
    kept = [a for a in range(len(box) - 1) if box[a] != 1]
    return kept[-1] if kept else len(box) - 2


def is_vector_box(box: list, layout) -> bool:
    """Whether a TMA copy of ``box`` through the shared ``layout`` moves a 1-D run along the
    tensor's last axis (``box`` 1 elsewhere) into a :func:`~tkc.ir.layouts.vector_scratch`-shaped
    tile: unswizzled rows of one 16-byte atom holding the run in order, one TMA box of at most
    256 elements (``lse[b, h, rows]`` beside attention backward's Q)."""
    n = layout.rows * layout.cols
    return (len(box) >= 2 and all(x == 1 for x in box[:-1]) and box[-1] == n and 1 < layout.rows
            and n <= 256 and layout.swizzle == 0 and layout.cols * layout.elem_bytes == 16)


def tma_map_box(box: list, layout) -> list[int]:
    """The box, in tensor order, of the tensor map that copies a tile of ``box`` through the
    shared ``layout``: the layout's TMA box on the row axis and the last axis, 1 elsewhere
    (a vector's box, :func:`is_vector_box`, as it is)."""
    if is_vector_box(box, layout):
        return list(box)
    cols, rows = layout.tma_box().dims
    out = [1] * len(box)
    out[tma_row_axis(box)] = rows
    out[-1] = cols
    return out


def _check_tma(op: Operation, tensor, shared, box: list, loading: bool) -> None:
    """A TMA copy's operands: a tensor, a shared tile, one i32 offset per tensor axis, and a
    box that is the tile's cols on the last axis, its rows on one other axis and 1 elsewhere."""
    t = tensor.type
    if not isinstance(t, TensorType):
        raise op.error(f"copies {'from' if loading else 'into'} a tensor, got {t}")
    if not _smem(shared.type):
        raise op.error(f"copies {'into' if loading else 'from'} a shared tile, got {shared.type}")
    lay = shared.type.layout
    if len(op.offsets) != t.rank or any(o.type != I32 for o in op.offsets):
        raise op.error(f"needs {t.rank} i32 offsets, one per axis of {t}")
    want = [1] * t.rank
    if len(box) == t.rank >= 2:
        want[tma_row_axis(box)], want[-1] = lay.rows, lay.cols
    if list(box) != want and not (len(box) == t.rank and is_vector_box(box, lay)):
        raise op.error(f"box {box} must be {lay.cols} on the last axis, {lay.rows} on one other and 1 elsewhere")
    if t.dtype != lay.dtype:
        raise op.error(f"tensor dtype {t.dtype.name} differs from the tile's {lay.dtype.name}")


@register
class TmaLoadOp(Operation, _OneThread):
    """Copy a box of ``tensor`` at element ``offsets`` into the shared tile ``dst`` through
    tensor map ``map`` of the kernel's ``tma_maps``; completes dst's bytes on ``barrier``.

    With ``multicast`` (the kernel's cluster size), every CTA of the cluster issues the same
    copy (same offsets) and they share it: the CTA of rank ``r`` copies the tile's TMA boxes
    ``r, r + multicast, ...`` into ``dst`` of every CTA and completes their bytes on each CTA's
    ``barrier`` (same offsets), so each CTA still receives the whole tile, read once from L2.

    With ``pair`` (CTA pairs, ``pair-ctas``), the copy lands in this CTA's ``dst`` and completes
    its bytes on the barrier at ``barrier``'s offset in the pair's even CTA (``.cta_group::2``),
    whose MMA reads both CTAs' tiles."""

    name = "hopper.tma_load"
    OPERANDS = ("tensor", "dst", "barrier", "*offsets")
    ATTRS = {"map": int, "box": list, "multicast?": int, "pair?": bool}

    def verify(self) -> None:
        _check_tma(self, self.tensor, self.dst, self.box, loading=True)
        _check_barrier(self, self.barrier)
        if self.attributes.get("pair"):
            check_pair(self)
            if self.attributes.get("multicast"):
                raise self.error("a pair's copy lands in its own CTA (pair), not in every CTA (multicast)")
        mc = self.attributes.get("multicast")
        if mc is not None and _check_cluster(self, "multicasts to a cluster") != mc:
            raise self.error(f"multicast = {mc}, but the kernel's cluster has {_cluster_of(self)} CTAs")


def _cluster_of(op: Operation) -> int:
    kernel = next((p for p in op.ancestors() if p.name == "tile.kernel"), None)
    return (kernel.attributes.get("cluster") or 1) if kernel is not None else 1


def check_pair(op: Operation) -> None:
    """``op`` (``pair``) works across a CTA pair: its kernel runs in clusters of 2."""
    if _cluster_of(op) != 2:
        raise op.error(f"works across a CTA pair (pair), but the kernel's cluster has {_cluster_of(op)} CTAs, not 2")


def _check_cluster(op: Operation, what: str) -> int:
    """The cluster size of ``op``'s kernel, which must be 2 or more for an op that ``what``."""
    n = _cluster_of(op)
    if n < 2:
        raise op.error(f"{what}, but the kernel has no cluster (its 'cluster' attribute)")
    return n


#: Slots of a ``hopper.cluster_reduce`` a row of its scratch tile.
SLOT_ROW = 128


@register
class ClusterReduceOp(Operation):
    """``tile.cluster_reduce`` on a register tile, through shared memory and an mbarrier in
    every CTA of the cluster, without ``barrier.cluster``.

    ``scratch`` holds ``copies`` buffers one after the other (``copies`` is ``barrier``'s
    stages: 2 inside a loop, else 1), each an f32 slot per rank and per element of the tile,
    element ``e`` (row-major) of rank ``r`` at flat index ``r * elements + e``, ``SLOT_ROW`` to
    a row.  ``phase`` (an i32 in [0, 4), threaded through loops by lower-to-hopper) picks
    buffer and barrier ``phase % copies`` and the parity ``phase // 2`` to wait for.  Thread 0
    arms its own barrier for every rank's elements (``mbarrier.arrive.expect_tx``); the thread
    holding the first copy of an element (``layouts.first_holders``: a row statistic every
    thread of the CTA holds is sent by thread 0 alone) stores it into its slot of that buffer in
    every CTA of the cluster, completing the bytes on that CTA's barrier (``st.async ...
    mbarrier::complete_tx``); every thread waits for the parity, then combines the slots of its
    values' elements over all ranks in rank order.

    Two buffers keep the exchanges of a loop apart: a peer can be at most one exchange ahead
    (it needs this CTA's values of each exchange to finish it), so its next values go to the
    other buffer and barrier, and the one after that only once this CTA has sent its own; in a
    loop lower-to-hopper follows the op with a ``hopper.barrier``, so that those sends (from a
    few threads) come after every thread's reads.  Every CTA has received all bytes bound for
    its shared memory when its last wait passes, so none exits while a peer's stores into it
    are in flight."""

    name = "hopper.cluster_reduce"
    OPERANDS = ("x", "scratch", "barrier", "phase")
    RESULTS = ("result",)
    ATTRS = {"kind": str}

    @property
    def copies(self) -> int:
        return stages_of(self.barrier)

    def elements(self) -> int:
        """Slots one rank fills: an element of the tile each."""
        return math.prod(self.x.type.shape)

    def buffer_rows(self) -> int:
        """Rows of ``scratch`` one buffer takes (buffer ``i`` starts at row ``i * buffer_rows``)."""
        return self.scratch.type.shape[0] // self.copies

    def verify(self) -> None:
        _check_reg(self, self.x.type, "the operand")
        if self.kind not in REDUCE_KINDS or self.x.type.dtype.name != "f32":
            raise self.error("combines f32 tiles by sum, max or min")
        if self.result.type != self.x.type:
            raise self.error(f"result must be {self.x.type}, got {self.result.type}")
        n = _check_cluster(self, "combines across a cluster")
        if enclosing_role(self) is not None:
            raise self.error("a cluster reduction waits for every CTA of the cluster, so it cannot run "
                             "inside a role: pin warp_specialize = false")
        _check_barrier(self, self.barrier)
        if self.copies != (2 if any(p.name == "tile.for" for p in self.ancestors()) else 1):
            raise self.error(f"takes a ring of two barriers inside a loop and one barrier elsewhere, got "
                             f"{self.copies} stage(s)")
        if self.phase.type != I32 or _const_int(self.phase) not in (None, 0, 1, 2, 3):
            raise self.error("phase is an i32 in [0, 4)")
        st = self.scratch.type
        if first_holders(self.x.type.layout) is None:
            raise self.error(f"the first holders of {self.x.type.layout}'s elements are not a set of "
                             f"thread-index bits: no thread can tell it sends an element")
        need = -(-n * self.elements() // SLOT_ROW)
        if not _smem(st) or st.dtype.name != "f32" or st.shape[1] != SLOT_ROW or st.shape[0] % self.copies \
                or self.buffer_rows() < need:
            raise self.error(f"scratch must be a shared f32 tile of {SLOT_ROW} columns holding {self.copies} "
                             f"buffer(s) of at least {need} rows ({n} ranks' values), got {st}")


@register
class ClusterBarrierOp(Operation):
    """``barrier.cluster.arrive`` + ``wait`` (release, then acquire): every thread of every CTA of the
    kernel's cluster meets here.  Once after the mbarriers are initialized (a peer's copies and
    arrivals may reach them from then on) and, where peers arrive on each other's barriers
    (multicast), once before the CTAs exit (none may exit while a peer can still write its
    shared memory or arrive on its barriers; a cluster reduction needs none, its last wait
    passing only once every byte bound for the CTA has landed)."""

    name = "hopper.cluster_barrier"

    def verify(self) -> None:
        _check_cluster(self, "synchronizes a cluster")
        parent = self.parent.parent_op if self.parent else None
        if parent is None or parent.name != "tile.kernel":
            raise self.error("a cluster barrier sits directly in the kernel body (every thread reaches it)")


@register
class TmaStoreOp(Operation):
    """Copy the shared tile ``src`` into ``tensor`` at element ``offsets`` through tensor map
    ``map`` of the kernel's ``tma_maps`` (out-of-bounds elements are not written), as one
    bulk group.  Every thread fences its shared writes for the async proxy and the threads
    running the op synchronize; then thread 0 issues the copies and commits them.  The
    tile is read asynchronously until a ``hopper.tma_store_wait``.

    With ``reduce = "add"`` the copy adds the tile into the tensor instead, element by element
    and atomically (``cp.reduce.async.bulk.tensor``: a tile ``atomic_add`` of f32, f16 or bf16)."""

    name = "hopper.tma_store"
    OPERANDS = ("tensor", "src", "*offsets")
    ATTRS = {"map": int, "box": list, "reduce?": str}

    def verify(self) -> None:
        _check_tma(self, self.tensor, self.src, self.box, loading=False)
        red = self.attributes.get("reduce")
        if red is not None and (red != "add" or self.tensor.type.dtype.name not in TMA_REDUCE_ADD_DTYPES):
            raise self.error(f"reduce = {red!r}: a TMA reduction adds ('add') f32, f16 or bf16 tiles, "
                             f"not {self.tensor.type.dtype.name}")


@register
class TmaStoreWaitOp(Operation):
    """Thread 0 waits until all but the newest ``pending`` of its ``hopper.tma_store`` groups
    have read their shared tiles (``cp.async.bulk.wait_group.read``); then the threads running
    the op synchronize, so any of them may write those tiles again.  With ``sync = false``
    (``merge-barriers``) only thread 0 waits: the ``hopper.barrier`` right after it is the
    meeting."""

    name = "hopper.tma_store_wait"
    ATTRS = {"pending": int, "sync?": bool}

    def verify(self) -> None:
        if not 0 <= self.pending <= 7:
            raise self.error("pending is 0..7")


@register
class MBarrierWaitOp(Operation):
    """``mbarrier.try_wait.parity`` in a loop: wait until the barrier's phase of ``parity`` has completed."""

    name = "hopper.mbarrier_wait"
    OPERANDS = ("barrier", "parity")

    def verify(self) -> None:
        _check_barrier(self, self.barrier)
        if self.parity.type != I32 or _const_int(self.parity) not in (None, 0, 1):
            raise self.error("parity is an i32 (0 or 1)")


@register
class SmemStoreOp(Operation):
    """Every thread writes its values of a register tile into the shared tile ``dst``.  With
    ``col``, ``dst`` is narrower than the value: it takes the value's columns ``col`` to
    ``col + dst columns`` (an epilogue that goes out in column slices).  The value is then a
    wgmma accumulator and the slice whole 8-column groups, so which registers a thread
    stores is known at compile time (its own column is below 8)."""

    name = "hopper.smem_store"
    OPERANDS = ("value", "dst")
    ATTRS = {"col?": int}

    def verify(self) -> None:
        from tkc.ir.layouts import TmemAccumulator, WgmmaAccumulator

        v, d = self.value.type, self.dst.type
        _check_reg(self, v, "value")
        if not _smem(d):
            raise self.error(f"stores into a shared tile, got {d}")
        col = self.attributes.get("col")
        if col is None:
            fits = d.shape == v.shape
        else:
            fits = v.rank == d.rank == 2 and d.shape[0] == v.shape[0] and 0 <= col and col + d.shape[1] <= v.shape[1]
        if not fits or d.dtype != v.dtype:
            at = "" if col is None else f" at column {col}"
            raise self.error(f"{v} does not fit {d}{at}")
        if col is not None and isinstance(v.layout, TmemAccumulator):
            per = v.layout.regs  # a warpgroup's columns: the slice must lie in one warpgroup's
            if col // per != (col + d.shape[1] - 1) // per:
                raise self.error(f"a column slice of {v} lies in one warpgroup's {per} columns, not columns "
                                 f"{col}..{col + d.shape[1]}")
        elif col is not None and (not isinstance(v.layout, WgmmaAccumulator) or col % 8 or d.shape[1] % 8):
            raise self.error(f"a column slice is stored from a wgmma accumulator in whole 8-column groups, "
                             f"not columns {col}..{col + d.shape[1]} of {v}")


@register
class SmemLoadOp(Operation):
    """Every thread reads its values of a register tile from the shared tile ``src``, which has
    the result's shape, or holds a 1-D result in order in rows of one 16-byte atom
    (``vector_scratch``: a vector TMA copied beside a loop's tiles)."""

    name = "hopper.smem_load"
    OPERANDS = ("src",)
    RESULTS = ("result",)
    TRAITS = frozenset({"readonly"})

    def verify(self) -> None:
        from tkc.ir.layouts import vector_scratch

        s, r = self.src.type, self.result.type
        if not _smem(s):
            raise self.error(f"loads from a shared tile, got {s}")
        _check_reg(self, r, "result")
        if s.dtype != r.dtype:
            raise self.error(f"{s} holds {s.dtype.name}, the result is {r.dtype.name}")
        if s.shape != r.shape and not (r.rank == 1 and s.layout == vector_scratch(r.shape[0], r.dtype)
                                       and s.shape == (s.layout.rows, s.layout.cols)):
            raise self.error(f"{r} is not held by {s}")


@register
class ToSmemOp(Operation):
    """A register tile written to a shared tile of its own (what ``select-layouts`` asks for
    when a ``@`` operand is computed, or loaded without TMA); ``lower-to-hopper`` expands it
    into the allocation, the per-thread stores, the proxy fence and the barrier."""

    name = "hopper.to_smem"
    OPERANDS = ("x",)
    RESULTS = ("result",)
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        x, r = self.x.type, self.result.type
        _check_reg(self, x, "the operand")
        if not _smem(r) or r.shape != x.shape or r.dtype != x.dtype:
            raise self.error(f"writes {x} to a shared tile of its shape and dtype, not {r}")
        _check_view(self, r, "the result")
        if (r.layout.rows, r.layout.cols) != r.shape:
            raise self.error("the shared tile is stored as its own shape (transpose it after, as a view)")


@register
class TransposeSmemOp(Operation):
    """A shared tile copied into a shared tile of its own that stores it the other way round
    (what ``select-layouts`` asks for when an 8-bit ``@`` B operand is MN-major: wgmma reads
    8-bit operands K-major only, so attention's V [BN, D] is rewritten as [D, BN], K
    contiguous).  ``lower-to-hopper`` expands it into the allocation, ``hopper.smem_copy``,
    the proxy fence and the barrier."""

    name = "hopper.transpose_smem"
    OPERANDS = ("x",)
    RESULTS = ("result",)
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        x, r = self.x.type, self.result.type
        if not _smem(x) or not _smem(r) or r.shape != x.shape or r.dtype != x.dtype:
            raise self.error(f"copies a shared tile into a shared tile of its shape and dtype, not {x} -> {r}")
        _check_view(self, x, "the operand")
        _check_view(self, r, "the result")
        if (x.layout.rows, x.layout.cols) != x.shape or (r.layout.cols, r.layout.rows) != r.shape:
            raise self.error("the operand is stored as its own shape and the result transposed")


@register
class SmemCopyOp(Operation):
    """Every thread copies its share of the 8-bit shared tile ``src`` into ``dst``, which stores
    it transposed: element (i, j) of ``src``'s stored ``rows x cols`` at (j, i) of ``dst``'s
    (``layouts.transpose_copy_block`` says which thread moves which 4 x 4 block).  Generic-proxy
    reads and writes, so a wgmma reading ``dst`` needs ``hopper.fence_proxy_async`` and a
    barrier after it."""

    name = "hopper.smem_copy"
    OPERANDS = ("src", "dst")

    def verify(self) -> None:
        s, d = self.src.type, self.dst.type
        if not _smem(s) or not _smem(d) or s.shape != d.shape or s.dtype != d.dtype:
            raise self.error(f"copies a shared tile into one of its shape and dtype, not {s} -> {d}")
        _check_view(self, s, "the source")
        _check_view(self, d, "the destination")
        if (s.layout.rows, s.layout.cols) != (d.layout.cols, d.layout.rows) or s.dtype.bits != 8:
            raise self.error(f"stores an 8-bit tile transposed, not {s.layout} -> {d.layout}")


@register
class FenceProxyAsyncOp(Operation):
    """``fence.proxy.async.shared::cta``: this thread's generic writes to shared memory are seen by the async
    proxy (a TMA store or wgmma reading them next)."""

    name = "hopper.fence_proxy_async"


# ---------------------------------------------------------------------- wgmma
#: The accumulator widths (N of m64nNk*) wgmma has: 8 to 256 in steps of 8 (PTX-FACTS §1).
WGMMA_N = range(8, 257, 8)


@register
class WgmmaOp(Operation):
    """``acc + A @ B``, issued asynchronously by each warpgroup for its 64 rows.  ``a_major`` /
    ``b_major`` (``k`` or ``mn``), where present, are what this wgmma reads a shared operand as
    instead of its layout's ``major``: one tile read by two products, once transposed (attention
    backward's Q is B of ``K Q^T`` and of ``dS^T Q``), keeps one copy in shared memory."""

    name = "hopper.wgmma"
    OPERANDS = ("a", "b", "acc", "*scales")
    RESULTS = ("result",)
    ATTRS = {"a_major?": str, "b_major?": str}

    def operand_layout(self, which: str) -> Any:
        """The shared layout this wgmma reads operand ``which`` ('a' or 'b') through."""
        return read_as(getattr(self, which).type.layout, self.attributes.get(f"{which}_major"))

    def verify(self) -> None:
        from tkc.ir.layouts import WgmmaOperandA, WgmmaOperandA8, is_accumulator

        # A #tmem_acc accumulator is a tcgen05 product before lower-to-blackwell rewrites it.
        acc, r = self.acc.type, self.result.type
        if not (_reg(acc) and is_accumulator(acc.layout)) or acc.dtype != dtypes.f32 or r != acc:
            raise self.error(f"the accumulator and result are one f32 #wgmma_acc tile, got {acc} -> {r}")
        m, n = acc.shape
        a, b = self.a.type, self.b.type
        for which in ("a", "b"):
            major = self.attributes.get(f"{which}_major")
            if major is not None and (major not in ("k", "mn") or not _smem(getattr(self, which).type)):
                raise self.error(f"{which}_major is 'k' or 'mn' on a shared operand, got {major!r}")
        if _smem(a):
            _check_view(self, a, "A")
            la = self.operand_layout("a")
            am, ak = (la.rows, la.cols) if la.major == "k" else (la.cols, la.rows)
        elif _reg(a) and isinstance(a.layout, (WgmmaOperandA, WgmmaOperandA8)):
            am, ak = a.shape
            if isinstance(a.layout, WgmmaOperandA8) != (a.dtype.bits == 8):
                raise self.error(f"an A operand in registers is #wgmma_a8 for 8-bit values, #wgmma_a for 16-bit, "
                                 f"got {a}")
            if a.layout.warpgroups != acc.layout.warpgroups:
                raise self.error("A and the accumulator span different warpgroups")
        else:
            raise self.error(f"A is a shared tile or a #wgmma_a register tile, got {a}")
        if not _smem(b):
            raise self.error(f"B is a shared tile, got {b}")
        _check_view(self, b, "B")
        lb = self.operand_layout("b")
        bn, bk = (lb.rows, lb.cols) if lb.major == "k" else (lb.cols, lb.rows)
        if lb.kperm != (_reg(a) and isinstance(a.layout, WgmmaOperandA8)):
            raise self.error("B's K is stored permuted (kperm) exactly when A is a #wgmma_a8 register tile, "
                             f"got A {a} and B {lb}")
        if am != m or bn != n or ak != bk:
            raise self.error(f"shapes do not agree: A {am}x{ak}, B {bk}x{bn}, accumulator {m}x{n}")
        if n not in WGMMA_N:
            raise self.error(f"wgmma N is 8..256 in steps of 8, got {n}")
        if a.dtype.bits != b.dtype.bits or (a.dtype != b.dtype and a.dtype.bits != 8):
            raise self.error(f"operand dtypes {a.dtype.name} and {b.dtype.name} do not pair")
        if self.scales:
            self._check_scales(m, n, ak)

    def _check_scales(self, m: int, n: int, k: int) -> None:
        """A block-scaled product (``tile.mma``'s scales): a tcgen05 product before
        lower-to-blackwell (wgmma scales no blocks), 8-bit operands, and A's and B's scale
        factors in shared ``#scales`` tiles the threads wrote."""
        if not isinstance(self.acc.type.layout, TmemAccumulator) or self.a.type.dtype.bits != 8:
            raise self.error("block scales are a tcgen05 product's (a #tmem_acc accumulator) of 8-bit operands")
        if not all(_smem(v.type) and isinstance(v.type.layout, ScaleLayout) for v in self.scales):
            raise self.error("block scales are shared #scales tiles")
        check_block_scales(self, TileType((m, k), self.a.type.dtype), TileType((k, n), self.b.type.dtype),
                           [v.type for v in self.scales])
        for v, major in zip(self.scales, ("k", "mn")):
            if v.type.layout.major != major or (v.type.layout.rows, v.type.layout.cols) != v.type.shape \
                    or v.type.layout.dtype != v.type.dtype:
                raise self.error(f"A's scales are stored #scales<MxK/32, k>, B's #scales<K/32xN, mn> (of their "
                                 f"dtype), got {v.type.layout}")


@register
class WgmmaWaitOp(Operation):
    """``wgmma.wait_group pending``; the result is the operand, now readable."""

    name = "hopper.wgmma_wait"
    OPERANDS = ("x",)
    RESULTS = ("result",)
    ATTRS = {"pending": int}

    def verify(self) -> None:
        if self.x.type != self.result.type:
            raise self.error("the result has the operand's type")
        if self.pending < 0:
            raise self.error("pending must be >= 0")


@register
class WgmmaWaitGroupOp(Operation):
    """``wgmma.wait_group pending`` without a value to read: every wgmma of this warpgroup but
    the last ``pending`` has completed, so the shared tiles they read may be released while
    the newest keeps running (a pipelined loop's accumulator stays in flight across
    iterations and is read after a ``hopper.wgmma_wait`` behind the loop)."""

    name = "hopper.wgmma_wait_group"
    ATTRS = {"pending": int}

    def verify(self) -> None:
        if self.pending < 0:
            raise self.error("pending must be >= 0")


# --------------------------------------------------------- registers <-> global
class _GlobalAccess(Operation):
    def _check_tensor(self, tensor: Type, offsets: list) -> None:
        if not isinstance(tensor, TensorType):
            raise self.error(f"expects a tensor, got {tensor}")
        if len(offsets) != tensor.rank or any(o.type != I32 for o in offsets):
            raise self.error(f"needs {tensor.rank} i32 offsets, one per axis of {tensor}")

    def _check_scalar(self, t: ScalarType) -> None:
        self._check_tensor(self.tensor.type, self.offsets)
        if any(b != 1 for b in self.box) or sorted(self.squeeze or []) != list(range(len(self.box))) \
                or t.dtype != self.tensor.type.dtype:
            raise self.error(f"a scalar access touches one element of {self.tensor.type}, every axis squeezed")

    def _check(self, tensor: Type, offsets: list, tile: Type) -> None:
        self._check_tensor(tensor, offsets)
        _check_reg(self, tile, "the tile")
        squeeze = self.squeeze or []
        shape = tuple(b for i, b in enumerate(self.box) if i not in squeeze)
        if len(self.box) != tensor.rank or shape != tile.shape or tile.dtype != tensor.dtype:
            raise self.error(f"the box {self.box} of {tensor} is not {tile}")
        check_steps(self, tensor.rank)


@register
class LoadOp(_GlobalAccess):
    """Each thread loads its values of a register tile from a box of a global tensor (out-of-bounds values read
    as ``other``); with a scalar result (a box of ones, every axis squeezed), every thread loads that element."""

    name = "hopper.load"
    OPERANDS = ("tensor", "*offsets")
    RESULTS = ("result",)
    ATTRS = {"box": list, "squeeze?": list, "other?": (int, float, bool), "steps?": list}
    TRAITS = frozenset({"readonly"})

    def verify(self) -> None:
        if isinstance(self.result.type, ScalarType):
            self._check_scalar(self.result.type)
            return
        self._check(self.tensor.type, self.offsets, self.result.type)


@register
class StoreOp(_GlobalAccess):
    """Each thread stores its values of a register tile into a box of a global tensor (out-of-bounds values are
    not written)."""

    name = "hopper.store"
    OPERANDS = ("tensor", "value", "*offsets")
    ATTRS = {"box": list, "squeeze?": list, "steps?": list}

    def verify(self) -> None:
        if isinstance(self.value.type, ScalarType):  # one element, stored by every thread alike
            self._check_scalar(self.value.type)
            return
        self._check(self.tensor.type, self.offsets, self.value.type)


@register
class AtomicFetchOp(_GlobalAccess):
    """An atomic on one element whose old value the program reads (``tile.atomic`` or
    ``tile.atomic_cas`` with a used result): thread 0 issues it between two barriers of the
    threads running it and passes the old value through the shared word ``slot``; every
    thread reads it.  ``args``: the value (``expected`` and the value for ``cas``), then one
    offset per tensor axis."""

    name = "hopper.atomic_fetch"
    OPERANDS = ("tensor", "slot", "*args")
    RESULTS = ("result",)
    ATTRS = {"kind": str, "box": list, "squeeze": list, "sem?": str}

    @property
    def values(self) -> list:
        return self.args[:2 if self.kind == "cas" else 1]

    @property
    def value(self):
        return self.values[-1]

    @property
    def expected(self):
        return self.values[0]

    @property
    def offsets(self) -> list:
        return self.args[len(self.values):]

    def verify(self) -> None:
        from tkc.ir.dialects.tile import check_atomic_kind

        t = self.tensor.type
        if not isinstance(t, TensorType):
            raise self.error(f"expects a tensor, got {t}")
        check_atomic_kind(self, self.kind, t.dtype, self.sem)
        if len(self.args) != len(self.values) + t.rank:
            raise self.error("takes the value(s), then one offset per axis of the tensor")
        self._check_tensor(t, self.offsets)
        want = ScalarType(t.dtype)
        if any(v.type != want for v in self.values) or self.result.type != want:
            raise self.error(f"the value(s) and the result are {want}")
        if self.box != [1] * t.rank or sorted(self.squeeze) != list(range(t.rank)):
            raise self.error("reads one element: a box of ones, every axis squeezed")
        if not _smem(self.slot.type) or self.slot.type.layout.size_bytes < 4:
            raise self.error(f"the slot must be a shared tile of at least 4 bytes, got {self.slot.type}")


@register
class PrefetchOp(_GlobalAccess, _OneThread):
    """A hint: the in-bounds part of each row of ``box`` at element ``offsets`` (a row: the
    box's extent along the tensor's last axis, the other coordinates fixed) is fetched into
    L2, one ``cp.async.bulk.prefetch.L2`` per row, its ends moved inward to 16-byte
    boundaries.  Rows of a tensor whose last axis is strided are not fetched.  Nothing a
    kernel computes depends on it; ``prefetch-loads`` places it an iteration or more ahead of
    a ``hopper.load`` in a loop."""

    name = "hopper.prefetch"
    OPERANDS = ("tensor", "*offsets")
    ATTRS = {"box": list, "squeeze?": list}

    def verify(self) -> None:
        t = self.tensor.type
        self._check_tensor(t, self.offsets)
        squeeze = self.squeeze or []
        if len(self.box) != t.rank or any(b < 1 for b in self.box) or any(self.box[i] != 1 for i in squeeze) \
                or t.rank - 1 in squeeze:
            raise self.error(f"the box {self.box} must have one positive extent per axis of {t}, 1 on "
                             f"squeezed axes, and rows along the last axis (not squeezed)")


#: Ops that only read a tensor parameter, in tile IR and in hopper IR: a tensor whose every use
#: is one of these is read-only in the kernel, so a copy may read it early (``tma_vectors``,
#: ``stage-loads``).
TENSOR_READ_ONLY = frozenset({"tile.load", "tile.gather", "tile.dim", "hopper.load", "hopper.async_load",
                              "hopper.prefetch", "hopper.tma_load"})


# ------------------------------------------- global -> a thread's own shared bytes
def parse_layout(text: str) -> Any:
    """A register layout from its printed form (``#blocked<...>``), as tile types read it."""
    import re

    from tkc.ir.types import LAYOUT_PARSERS

    m = re.fullmatch(r"#(\w+)(?:<(.*)>)?", text, re.S)
    parse = LAYOUT_PARSERS.get(m.group(1)) if m else None
    if parse is None:
        raise ValueError(f"unknown layout {text!r}")
    return parse(m.group(2) or "")


@register
class AsyncLoadOp(_GlobalAccess):
    """Each thread starts copying its values of a register tile of ``layout`` (a tile of the
    box's kept axes, the tensor's dtype) from a box of a global tensor into bytes of the shared
    tile ``dst`` that are its own (``tkc.codegen.runs.private_offsets``), out-of-bounds values
    as ``other`` (0 by default; ``cp.async``).  The copy joins the thread's open group (``hopper.async_commit``) and
    has landed once a ``hopper.async_wait`` leaves fewer groups in flight than came after it;
    only then may the thread read it (``hopper.async_read`` with the same layout).  No other
    thread reads those bytes, so no barrier orders them.  The tensor must be one the kernel
    never writes: the copy reads it at some time before the wait."""

    name = "hopper.async_load"
    OPERANDS = ("tensor", "dst", "*offsets")
    ATTRS = {"box": list, "layout": str, "squeeze?": list, "other?": (int, float, bool)}

    @property
    def reg_layout(self) -> Any:
        return parse_layout(self.layout)

    @property
    def tile_type(self) -> TileType:
        """The register tile the copy moves (what ``hopper.async_read`` gives back)."""
        squeeze = self.squeeze or []
        shape = tuple(b for i, b in enumerate(self.box) if i not in squeeze)
        return TileType(shape, self.tensor.type.dtype, "reg", self.reg_layout)

    def verify(self) -> None:
        self._check_tensor(self.tensor.type, self.offsets)
        try:
            t = self.tile_type
        except ValueError as e:
            raise self.error(f"layout {self.layout!r}: {e}") from None
        self._check(self.tensor.type, self.offsets, t)
        if self.tensor.type.rank - 1 in (self.squeeze or []):
            raise self.error("copies runs along the tensor's last axis: it cannot be squeezed")
        from tkc.codegen.runs import async_copyable, elem_bytes

        if t.dtype.bits < 8 or not async_copyable(t.layout, elem_bytes(t.dtype)):
            raise self.error(f"layout {self.layout} gives runs that cp.async cannot copy (4, 8 or 16 bytes each)")
        _check_private(self, self.dst.type, t)


def _check_private(op: Operation, s: Type, t: TileType) -> None:
    """``s`` is a shared tile with room for every thread's own copy of ``t``'s values."""
    from tkc.codegen.runs import elem_bytes, private_bytes

    need = private_bytes(t.layout, elem_bytes(t.dtype))
    if not _smem(s) or s.layout.size_bytes < need:
        raise op.error(f"needs a shared tile of at least {need} bytes (every thread's own copy of {t}), got {s}")


@register
class AsyncCommitOp(Operation):
    """Each thread closes its group of ``hopper.async_load`` copies (``cp.async.commit_group``);
    an empty group is a group too."""

    name = "hopper.async_commit"


@register
class AsyncWaitOp(Operation):
    """Each thread waits until at most its newest ``pending`` groups of copies are in flight
    (``cp.async.wait_group``): the copies of every older group have landed."""

    name = "hopper.async_wait"
    ATTRS = {"pending": int}

    def verify(self) -> None:
        if not 0 <= self.pending <= 7:
            raise self.error("pending is 0..7")


@register
class AsyncReadOp(Operation):
    """Each thread reads its values of the register tile back from its own bytes of ``src``,
    where a ``hopper.async_load`` of the same layout copied them."""

    name = "hopper.async_read"
    OPERANDS = ("src",)
    RESULTS = ("result",)

    def verify(self) -> None:
        _check_reg(self, self.result.type, "result")
        _check_private(self, self.src.type, self.result.type)
        if self.src.type.dtype != self.result.type.dtype:
            raise self.error(f"{self.src.type} holds {self.src.type.dtype.name}, the result is "
                             f"{self.result.type.dtype.name}")


# ------------------------------------------------------------ between threads
def _check_reduction(op: Operation, x: Type, r: Type, kind: str, axis: int, shuffle_xor: list,
                     warp_xor: list, scratch: list, what: str = "") -> None:
    """One reduction's types, kind and steps (``hopper.reduce``, a part of ``hopper.reduce_group``):
    the steps are ``reduce_plan(x.layout, axis)``'s, the result its kept shape in the plan's
    layout (a scalar when nothing is kept), and a plan that crosses warps takes one scratch."""
    from tkc.ir.layouts import reduce_plan

    _check_reg(op, x, f"{what}the operand")
    if kind not in REDUCE_KINDS:
        raise op.error(f"{what}kind must be sum, max or min")
    try:
        plan = reduce_plan(x.layout, axis)
    except ValueError as e:
        raise op.error(f"{what}{e}") from None
    if list(plan.shuffle_xor) != list(shuffle_xor) or list(plan.warp_xor) != list(warp_xor):
        raise op.error(f"{what}steps must be the layout's plan: shuffle_xor {list(plan.shuffle_xor)}, "
                       f"warp_xor {list(plan.warp_xor)}")
    shape = x.shape[:axis] + x.shape[axis + 1:]
    want = TileType(shape, x.dtype, "reg", plan.result) if shape else ScalarType(x.dtype)
    if r != want:
        raise op.error(f"{what}result must be {want}, got {r}")
    if bool(plan.warp_xor) != bool(scratch) or len(scratch) > 1:
        raise op.error(f"{what}a cross-warp reduction takes one shared scratch tile, others none")


@register
class ReduceOp(Operation):
    """``reduce_plan(x.layout, axis)`` executed step by step (docs/hopper.md section 2)."""

    name = "hopper.reduce"
    OPERANDS = ("x", "*scratch")
    RESULTS = ("result",)
    ATTRS = {"kind": str, "axis": int, "shuffle_xor": list, "warp_xor": list}
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        _check_reduction(self, self.x.type, self.result.type, self.kind, self.axis, self.shuffle_xor,
                         self.warp_xor, self.scratch)


@register
class ReduceGroupOp(Operation):
    """Reductions that cross warps and trade their partials in one round trip (docs/hopper.md
    section 2): each part is ``hopper.reduce``'s plan, every part's partials are written to its
    own scratch tile before one ``bar.sync``, and all are combined before the second.  Operands:
    the parts' operands, then their scratch tiles in the same order; result ``i`` is part
    ``i``'s.  ``merge-reductions`` makes it from ``hopper.reduce``s."""

    name = "hopper.reduce_group"
    OPERANDS = ("*values",)
    RESULTS = ("*results",)
    ATTRS = {"kinds": list, "axes": list, "shuffle_xor": list, "warp_xor": list}
    TRAITS = frozenset({"pure"})

    def parts(self) -> list[tuple[Any, ...]]:
        """``(x, scratch, result, kind, axis, shuffle_xor, warp_xor)`` of each part."""
        n = len(self.results)
        return list(zip(self.operands[:n], self.operands[n:], self.results, self.kinds, self.axes,
                        self.shuffle_xor, self.warp_xor))

    def verify(self) -> None:
        n = len(self.results)
        if n < 2 or len(self.operands) != 2 * n or not all(
                len(a) == n for a in (self.kinds, self.axes, self.shuffle_xor, self.warp_xor)):
            raise self.error(f"a group of {n} reductions takes {n} operands, {n} scratch tiles and {n} kinds, "
                             f"axes and steps (at least two parts)")
        if len(set(self.operands[n:])) != n:
            raise self.error("each part takes a scratch tile of its own: all write their partials before any reads")
        for i, (x, s, r, kind, axis, sx, wx) in enumerate(self.parts()):
            if not _smem(s.type):
                raise self.error(f"part {i}: the scratch must be a shared tile, got {s.type}")
            if not wx:
                raise self.error(f"part {i} stays within warps: only reductions that cross warps are grouped")
            _check_reduction(self, x.type, r.type, kind, axis, sx, wx, [s], f"part {i}: ")


@register
class ScanOp(Operation):
    """``scan_plan(x.layout, axis)`` executed step by step (docs/hopper.md section 2): an
    inclusive prefix sum or product along ``axis``, in the operand's layout.  A plan with
    warp steps takes one shared scratch tile of ``threads`` rows and a column per value."""

    name = "hopper.scan"
    OPERANDS = ("x", "*scratch")
    RESULTS = ("result",)
    ATTRS = {"kind": str, "axis": int}
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        from tkc.ir.layouts import scan_plan

        x, r = self.x.type, self.result.type
        _check_reg(self, x, "the operand")
        if self.kind not in SCAN_KINDS:
            raise self.error(f"kind must be one of {', '.join(SCAN_KINDS)}")
        try:
            plan = scan_plan(x.layout, self.axis)
        except ValueError as e:
            raise self.error(str(e)) from None
        if r != x:
            raise self.error(f"result must be {x}, got {r}")
        if bool(plan.warp_xor) != bool(self.scratch) or len(self.scratch) > 1:
            raise self.error("a scan across warps takes one shared scratch tile, others none")
        if self.scratch:
            s = self.scratch[0].type
            if not _smem(s) or s.layout.rows < x.layout.threads or s.layout.cols < x.layout.regs:
                raise self.error(f"the scratch must be a shared tile of at least {x.layout.threads} rows and "
                                 f"{x.layout.regs} columns, got {s}")


@register
class ConvertLayoutOp(Operation):
    """The same tile in another register layout (through ``scratch`` when threads must trade values)."""

    name = "hopper.convert_layout"
    OPERANDS = ("x", "*scratch")
    RESULTS = ("result",)
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        x, r = self.x.type, self.result.type
        _check_reg(self, x, "the operand")
        _check_reg(self, r, "the result")
        if x.shape != r.shape or x.dtype != r.dtype:
            raise self.error(f"converts layouts only: {x} -> {r}")
        if len(self.scratch) > 1 or (self.scratch and not _smem(self.scratch[0].type)):
            raise self.error("takes at most one shared scratch tile")


ONE_THREAD_OPS = frozenset(c.name for c in (MBarrierInitOp, FenceMBarrierInitOp, ExpectTxOp, TmaLoadOp, PrefetchOp))
ONE_THREAD_PER_WARPGROUP_OPS = frozenset({MBarrierArriveOp.name})


# ------------------------------------------------------------ the kernel as a whole
#: Operand slots a ring (an allocation with stages > 1) may fill: ``hopper.stage`` takes a
#: stage of it, ``hopper.mbarrier_init`` initializes every stage, ``hopper.cluster_reduce``
#: alternates between its two barriers.
_RING_USES = frozenset({("hopper.stage", 0), ("hopper.mbarrier_init", 0), ("hopper.cluster_reduce", 2)})
#: Ops that use an mbarrier they do not initialize (operand slot).
_BARRIER_USES = frozenset({("hopper.mbarrier_wait", 0), ("hopper.mbarrier_arrive", 0), ("hopper.expect_tx", 0),
                           ("hopper.tma_load", 2), ("hopper.cluster_reduce", 2)})


def verify_kernel(kernel: Operation) -> None:
    """What the emulator checks of a hopper-level kernel before or while running it that holds
    on every run, checked without running it (docs/hopper.md, "What the verifier checks"): the
    kernel's threads and shared memory, every allocation inside ``smem_bytes`` and no mbarrier
    sharing bytes, rings used through ``hopper.stage``, every mbarrier initialized once, TMA
    copies that match their tensor maps, register tiles where threads run them, no wgmma result
    read before its wait, and role register budgets that fit the CTA."""
    from tkc.target import DEFAULT_TARGET

    ops = list(kernel.walk())[1:]
    if not any(op.name.startswith("hopper.") for op in ops) and not any(
            k in kernel.attributes for k in ("threads", "smem_bytes")):
        return  # tile IR: nothing of the hopper level yet
    target = DEFAULT_TARGET  # the hopper dialect's target (sm_90a)
    threads = kernel.attributes.get("threads")
    if threads is not None and not (0 < threads <= target.max_threads and threads % target.warpgroup == 0):
        raise kernel.error(f"threads = {threads}: a CTA has a positive multiple of {target.warpgroup} threads, "
                           f"at most {target.max_threads}")
    _check_placement(kernel, [op for op in ops if op.name in _ALLOCS], target)
    _check_uses(kernel, ops)
    _check_tma_maps(kernel, ops)
    if isinstance(threads, int):
        _check_register_tiles(kernel, ops, threads)
        for op in ops:
            _check_register_move(op)
        roles = [op for op in kernel.body.ops if op.name == "hopper.role"]
        if roles:
            from tkc.pins import Options
            from tkc.registers import role_budget_problem

            ctas = Options.from_consts(kernel.attributes.get("consts"), kernel.loc).programs_per_sm
            problem = role_budget_problem(kernel, roles, threads, ctas, target)
            if problem is not None:
                op, message, _ = problem
                raise op.error(message)
    _check_pending(ops)


_ALLOCS = ("hopper.smem_alloc", "hopper.mbarrier_alloc")


def _what(op: Operation) -> str:
    """An allocation in messages: its name and what it holds."""
    n = stages_of(op.result)
    if op.name == "hopper.mbarrier_alloc":
        held = f"a ring of {n} mbarriers of 8 B" if n > 1 else "an mbarrier of 8 B"
    else:
        lay = op.result.type.layout
        held = f"a ring of {n} {lay} tiles, {op.stride} B apart" if n > 1 else f"a {lay} tile of {lay.size_bytes} B"
    return f"{_name(op.result)} ({held})"


def _check_placement(kernel: Operation, allocs: list[Operation], target) -> None:
    """``smem_bytes`` (set by allocate-smem together with every offset) within what a CTA may
    have; each allocation's bytes inside it; no mbarrier sharing bytes with anything (tiles
    may share bytes: allocate-smem reuses them across a barrier)."""
    smem = kernel.attributes.get("smem_bytes")
    if smem is None:
        return  # offsets may still be -1: allocate-smem has not run
    if not 0 <= smem <= target.max_smem_bytes:
        raise kernel.error(f"smem_bytes = {smem}: a CTA has 0 to {target.max_smem_bytes} B of dynamic shared "
                           f"memory on {target.name}")
    spans = []
    for op in allocs:
        off, size = op.offset, op.nbytes
        if off < 0:
            raise op.error(f"{_what(op)} has no offset, but the kernel's smem_bytes is set: give it one "
                           f"(or run allocate-smem on the kernel without smem_bytes)")
        if off + size > smem:
            fixes = [f"move it to an offset of at most {smem - size}"] if size <= smem else []
            fit = (smem - off) // op.stride if stages_of(op.result) > 1 else 0
            if fit > 1:
                fixes.append(f"lower stages to at most {fit}")
            if off + size <= target.max_smem_bytes:
                fixes.append(f"raise smem_bytes to {off + size}")
            fix = ", ".join(fixes[:-1]) + (" or " if len(fixes) > 1 else "") + (fixes[-1] if fixes else "")
            raise op.error(f"{_what(op)} takes bytes [{off}, {off + size}), past the kernel's smem_bytes = {smem}"
                           + (f": {fix}" if fix else f" and the {target.max_smem_bytes} B a CTA may have"))
        spans.append((op, off, off + size))
    for i, (a, lo, hi) in enumerate(spans):
        for b, blo, bhi in spans[:i]:
            if lo < bhi and blo < hi and "hopper.mbarrier_alloc" in (a.name, b.name):
                raise a.error(f"{_what(a)} at bytes [{lo}, {hi}) overlaps {_what(b)} at [{blo}, {bhi}): an "
                              f"mbarrier shares its bytes with nothing; give one of them another offset")


def _check_uses(kernel: Operation, ops: list[Operation]) -> None:
    """Rings are used only through ``hopper.stage`` (and initialized whole); every mbarrier an
    op waits on, arrives on or copies to is initialized by exactly one ``hopper.mbarrier_init``."""
    inits: dict[Operation, list[Operation]] = {}
    used: dict[Operation, Operation] = {}
    for op in ops:
        for i, v in enumerate(op.operands):
            owner = getattr(v, "owner", None)
            if owner is None:
                continue
            alloc = owner.ring.owner if owner.name == "hopper.stage" else owner
            if alloc.name not in _ALLOCS:
                continue
            if stages_of(v) > 1 and owner is alloc and (op.name, i) not in _RING_USES:
                raise op.error(f"takes the ring {_what(alloc)} itself; use one stage of it through hopper.stage")
            if alloc.name != "hopper.mbarrier_alloc":
                continue
            if op.name == "hopper.mbarrier_init":
                # A ring is initialized whole; a stage of one counts as initializing it (a use
                # of another stage before its init is the emulator's to find).
                inits.setdefault(alloc, [])
                if owner is alloc:
                    inits[alloc].append(op)
            elif (op.name, i) in _BARRIER_USES:
                used.setdefault(alloc, op)
    for alloc, first in inits.items():
        if len(first) > 1:
            raise first[1].error(f"initializes {_what(alloc)} again (it was at {first[0].loc}): an mbarrier "
                                 f"is initialized once")
    for alloc, op in used.items():
        if alloc not in inits:
            raise op.error(f"uses {_what(alloc)}, which no hopper.mbarrier_init initializes: add "
                           f"'hopper.mbarrier_init {_name(alloc.result)} {{count = N}}' after its allocation")


def _check_tma_maps(kernel: Operation, ops: list[Operation]) -> None:
    """Each TMA copy names a tensor map of the kernel's ``tma_maps`` that describes its tensor
    parameter with the box and swizzle of its shared tile's layout."""
    maps = kernel.attributes.get("tma_maps") or []
    for op in ops:
        if op.name not in ("hopper.tma_load", "hopper.tma_store"):
            continue
        tile = op.dst if op.name == "hopper.tma_load" else op.src
        lay = tile.type.layout
        if not 0 <= op.map < len(maps):
            raise op.error(f"names tensor map {op.map}, but the kernel's tma_maps has {len(maps)}")
        entry = maps[op.map]
        if not (isinstance(entry, list) and len(entry) == 3):
            raise kernel.error(f"tma_maps[{op.map}] = {entry!r}: an entry is [parameter, box, swizzle]")
        param, box, swz = entry
        arg = tensor_param(op.tensor)
        if getattr(arg, "block", None) is not kernel.body or arg.index != param:
            raise op.error(f"tensor map {op.map} describes parameter {param}, not this copy's tensor "
                           f"{_name(arg)}")
        want = tma_map_box(op.box, lay)
        if list(box) != want or swz != lay.swizzle:
            raise op.error(f"tensor map {op.map} has box {list(box)} and swizzle {swz}, but {lay} needs box "
                           f"{want} and swizzle {lay.swizzle}: make tma_maps[{op.map}] [{param}, {want}, "
                           f"{lay.swizzle}]")


def _has_registers(op: Operation) -> bool:
    return any(_reg(v.type) for v in (*op.operands, *op.results))


def _check_register_tiles(kernel: Operation, ops: list[Operation], threads: int) -> None:
    """Register tiles live where threads run them: inside roles once the kernel has roles, and
    with layouts spanning exactly the threads that run the op (the role's, else the CTA's)."""
    has_roles = any(op.name == "hopper.role" for op in kernel.body.ops)
    for op in ops:
        if not _has_registers(op):
            continue
        role = enclosing_role(op)
        if has_roles and role is None:
            raise op.error("uses register tiles outside the kernel's roles: once a kernel has roles, each role "
                           "has its own threads and registers; move the op into the role that uses it")
        n = role.threads if role is not None else threads
        for v in (*op.operands, *op.results):
            lay = v.type.layout if _reg(v.type) else None
            if lay is not None and getattr(lay, "threads", n) != n:
                who = f"role {role.attributes['name']!r}" if role is not None else "the kernel"
                raise op.error(f"{_name(v)}: {v.type} spans {lay.threads} threads, but {who} runs it on {n}")


def _check_register_move(op: Operation) -> None:
    """Ops that move register values without leaving their threads do so: ``expand_dims`` and
    ``broadcast`` are register copies, ``convert_layout`` without scratch finds each new value in
    its own thread, and a wgmma's A and B take the same K steps (elementwise ops take operands of
    their result's type, layout included: their own check)."""
    from tkc.ir.layouts import broadcast_slots, expand_is_free, mma_k_step, register_map

    if op.name == "hopper.wgmma":
        a = op.operand_layout("a") if _smem(op.a.type) else op.a.type.layout
        b = op.operand_layout("b")
        if a.k_steps != b.k_steps:
            raise op.error(f"A ({a}) takes {a.k_steps} K steps and B ({b}) {b.k_steps}")
        k, step = op.a.type.shape[1], mma_k_step(op.a.type.dtype.bits)
        if k % step:
            raise op.error(f"K = {k} is not a whole number of {op.a.type.dtype.name} K steps ({step} each)")
        return
    if not op.results or not _reg(op.result.type if len(op.results) == 1 else None):
        return
    r = op.result.type
    x = op.operands[0].type if op.operands else None
    if op.name in ("tile.expand_dims", "tile.broadcast", "hopper.convert_layout") and not _reg(x):
        return
    if op.name == "tile.expand_dims" and not expand_is_free(x.layout, r.layout, op.axis):
        raise op.error(f"{x.layout} -> {r.layout} moves values between threads; expand_dims is a register copy "
                       f"(convert_layout first)")
    if op.name == "tile.broadcast":
        axes = [i for i, (m, n) in enumerate(zip(x.shape, r.shape)) if m != n]
        if broadcast_slots(x.layout, r.layout, axes) is None:
            raise op.error(f"broadcasts {x.layout} to {r.layout}: the source must be a keep slice of the result's "
                           f"layout (#slice<{r.layout}, axis=..., keep>) whose slots hold the values it needs")
    # Before lower-to-hopper (which sets tma_maps) a conversion has not been given its scratch yet.
    lowered = any("tma_maps" in p.attributes for p in op.ancestors() if p.name == "tile.kernel")
    if op.name == "hopper.convert_layout" and lowered and not op.scratch and register_map(x.layout, r.layout) is None:
        raise op.error(f"{x.layout} -> {r.layout} needs values from other threads: give it a shared scratch tile")


def _check_pending(ops: list[Operation]) -> None:
    """A ``hopper.wgmma`` result is still being written until a ``hopper.wgmma_wait``: it may
    only be waited for, accumulated into by another wgmma, or carried through a loop or a
    branch (that carries it on to the same rule)."""
    pending = {op.result: op for op in ops if op.name == "hopper.wgmma"}
    changed = bool(pending)
    while changed:  # what carries a pending value may hold one
        changed = False
        for op in ops:
            if op.name == "tile.for":
                body = op.regions[0].block
                yielded = body.terminator.operands if body.terminator is not None else []
                for i, r in enumerate(op.results):
                    src = next((v for v in (op.operands[3 + i], *yielded[i:i + 1]) if v in pending), None)
                    for carried in (r, body.args[1 + i]):
                        if src is not None and carried not in pending:
                            pending[carried] = pending[src]
                            changed = True
            elif op.name == "tile.if":
                for i, r in enumerate(op.results):
                    for region in op.regions:
                        term = region.blocks[0].terminator
                        src = term.operands[i] if term is not None and i < len(term.operands) else None
                        if src in pending and r not in pending:
                            pending[r] = pending[src]
                            changed = True
    for op in ops:
        for i, v in enumerate(op.operands):
            if v in pending and not ((op.name, i) in (("hopper.wgmma", 2), ("hopper.wgmma_wait", 0))
                                     or op.name == "tile.yield" or (op.name == "tile.for" and i >= 3)):
                w = pending[v]
                raise op.error(f"reads {_name(v)}, the result of the hopper.wgmma at {w.loc}, before a "
                               f"hopper.wgmma_wait: the accumulator is still being written (wait for it first)")
