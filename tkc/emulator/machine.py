"""Running a hopper-level kernel: the CTA and warpgroup model of docs/hopper.md §1.

This module owns *execution*: walking a kernel's ops for each warpgroup, the values they
produce, and the order in which warpgroups meet at barriers.  Each CTA of the grid runs in
turn with its own ``SharedMemory`` and barriers; inside a CTA every warpgroup is one
coroutine (``scheduler.run`` picks who runs next, seeded), and each coroutine handles its
128 threads at once: a register tile is one ``[128, layout.regs]`` array in storage form,
value ``i`` of local thread ``t`` being element ``layout.coords(128 g + t, i)``.

Rings and roles (docs/hopper.md, "Rings and roles"): a ring allocation is one value holding
all its stages (``SmemTile.stages`` / ``BarrierRing``) that only ``hopper.stage`` and
``hopper.mbarrier_init`` may take.  Inside a ``hopper.role`` a warpgroup counts its threads
from the role's first one (``g`` above becomes the warpgroup's index in the role), runs the
one-thread ops only if it is the role's first warpgroup, and meets only the role's other
warpgroups at the internal barriers of reductions and conversions.  Because each warpgroup
is its own coroutine, a producer role and its consumer roles only meet on mbarriers, and the
seeded interleavings exercise the ring protocol: a stage refilled while a wgmma still reads
it, or before anyone read it, is a race of shared memory's read leases and lost-write
check; a wait for the wrong phase is mbarrier's ``PhaseError``; a missing arrival is the
scheduler's deadlock report naming every blocked warpgroup and its barrier.  One coroutine
per warpgroup hides that its four warps pass an mbarrier wait each on its own: a warp may
still spin on a wait the warpgroup has passed, until they next meet (a ``bar.sync``, or the
completion of a wgmma committed after the wait, which needs all four).  A barrier that
completes two phases in that window is an error (``_Warpgroup.left_behind``): that warp would
see its parity again and wait forever, as a producer on four warps did on an H100.

It must not define what an op computes or where anything lives: elementwise ops, casts,
constants and scalar arithmetic go through ``tkc.semantics.evaluate`` (the one home of op
meaning), every coordinate, address, descriptor and reduction plan comes from
``tkc.ir.layouts``, and the bytes, barriers, copies and matrix instructions are the machine
model's (``smem``, ``mbarrier``, ``tma``, ``wgmma``, ``scheduler``).  Every fault is a
``TkcEmulatorError`` naming the op (with its location) and the CTA.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from tkc import dtypes, semantics
from tkc.codegen.runs import elem_bytes, private_offsets
from tkc.dtypes import round_to
from tkc.emulator import ranks, tmem
from tkc.emulator.mbarrier import MBarrier
from tkc.emulator.scheduler import Request, Wait, Yield, run
from tkc.emulator.smem import ReadLease, SharedMemory
from tkc.emulator.tma import tma_load, tma_store
from tkc.emulator.wgmma import wgmma
from tkc.errors import TkcEmulatorError, TkcError
from tkc.grid import as_kernel, check_grid, eval_grid, param_name
from tkc.interpreter import bind_arguments, random_args, tensor_names, write_back
from tkc.ir.dialects.tile import atomic_kind, tensor_param, uses_ranks
from tkc.races import HappensBefore, WriteLog
from tkc.semantics import atomic_update, combine_ranks, evaluate
from tkc.ir.core import Block, BlockArgument, Module, Operation, Value
from tkc.ir.dialects.hopper import ONE_THREAD_OPS, SLOT_ROW, TURN_BARRIER, is_vector_box, tma_map_box, tma_row_axis
from tkc.ir.layouts import (TRANSPOSE_BLOCK, SharedLayout, WgmmaAccumulator, WgmmaOperandA, WgmmaOperandA8,
                            a8_logical_col, broadcast_slots, picked_registers,
                            expand_is_free, first_holders, reduce_plan, register_map, same_registers, scan_plan,
                            transpose_copy_block, transpose_copy_blocks, transpose_copy_last, transposes,
                            vector_coords)
from tkc.ir.types import ScalarType, TensorType, TileType
from tkc.pins import Options
from tkc.registers import role_budget_problem
from tkc.target import DEFAULT_TARGET

__all__ = ["emulate", "emulate_ranks", "emulate_module", "SmemTile", "BarrierRing"]

Co = Generator[Request, None, Any]  # a coroutine step: yields scheduler requests, returns a value


# ------------------------------------------------------------------ values
@dataclass(frozen=True)
class SmemTile:
    """The value of a ``hopper.smem_alloc``: where the tile's bytes are and how they are laid
    out.  ``shape`` is the type's shape: the layout's ``rows x cols`` or, for a transposed
    view, ``cols x rows``."""

    base: int
    layout: SharedLayout
    shape: tuple[int, ...]
    name: str
    stages: int = 1  # > 1: a ring; stage k's tile is at base + k * stride
    stride: int = 0

    def stage(self, k: int) -> SmemTile:
        return SmemTile(self.base + k * self.stride, self.layout, self.shape, f"{self.name}[{k}]")

    @property
    def transposed(self) -> bool:
        return self.shape != (self.layout.rows, self.layout.cols)

    def offsets(self, coords: Sequence[np.ndarray]) -> np.ndarray:
        """Byte addresses of the elements at tile coordinates ``coords`` (type axes)."""
        r, c = coords
        return self.base + (self.layout.offset(c, r) if self.transposed else self.layout.offset(r, c))


@dataclass(frozen=True)
class BarrierRing:
    """The value of a ``hopper.mbarrier_alloc`` with ``stages`` > 1: one mbarrier per stage."""

    name: str
    stages: tuple[MBarrier, ...]


def _is_ring(x: Any) -> bool:
    return isinstance(x, BarrierRing) or (isinstance(x, SmemTile) and x.stages > 1)


@dataclass
class _Pending:
    """A ``hopper.wgmma`` result still in flight: readable only after ``hopper.wgmma_wait``."""

    value: np.ndarray
    op: Operation
    group: _Group


class _Unmet(NamedTuple):
    """A wait a warpgroup passed whose four warps have not met since."""

    barrier: MBarrier
    phase: int  # the barrier's completed phases when the warpgroup passed
    wait: Operation
    committed: int  # the warpgroup's wgmma groups committed by then
    role: str


@dataclass
class _Group:
    """One committed wgmma group of a warpgroup: the smem it reads until it completes, and
    its A operand when that is in registers (``a``), which it reads until then as well."""

    op: Operation
    leases: list[ReadLease]
    a: Value | None = None
    done: bool = False


def _describe(op: Operation) -> str:
    names = ", ".join(f"%{r.name_hint}" for r in op.results if r.name_hint)
    where = f" at {op.loc}" if op.loc is not None and op.loc.line else ""
    return f"'{op.name}'" + (f" ({names})" if names else "") + where


def _who(op: Operation, wg: _Warpgroup | None = None) -> str:
    """An op as a shared-memory reader or writer (the other party of a race message)."""
    where = f" at {op.loc}" if op.loc is not None and op.loc.line else ""
    return f"{op.name}{where}" + (f" ({wg.role})" if wg is not None else "")


def _fault(op: Operation, message: str, cls: type[TkcEmulatorError] = TkcEmulatorError) -> TkcEmulatorError:
    """An error naming ``op``; marked so that enclosing ops (a loop around it) do not rename it."""
    e = cls(f"{_describe(op)}: {message}", op.loc)
    e.names_op = True  # type: ignore[attr-defined]
    return e


@functools.lru_cache(maxsize=256)
def _coords(layout: Any, g: int) -> tuple[np.ndarray, ...]:
    """Coordinates (one ``[128, regs]`` array per tile axis) of warpgroup ``g``'s values."""
    t = 128 * g + np.arange(128)[:, None]
    c = layout.coords(t, np.arange(layout.regs)[None, :])
    return tuple(np.broadcast_to(np.asarray(a, np.int64), (128, layout.regs)) for a in c)


# ---------------------------------------------------------------------- CTA
class _CTA:
    """One CTA: shared memory, barriers and the warpgroup coroutines that share them."""

    def __init__(self, kernel: Operation, pid: tuple[int, ...], grid: tuple[int, ...],
                 params: dict[Value, Any], written: set[int], log: WriteLog | HappensBefore | None = None):
        self.kernel = kernel
        self.pid, self.grid = pid, grid
        self.params = params
        self.written = written
        self.log = log  # who wrote which element: write-write races between CTAs (tkc/races.py)
        self.who: Any = pid  # this CTA in ``log``'s messages (a multi-GPU launch: its index among every rank's)
        self.fetched: dict[Operation, np.ndarray] = {}  # the old value of a hopper.atomic_fetch
        # One GPU: this program's TMA stores, in flight until it ends (its last wait is
        # ``.read``: the shared tile is free, the global writes need not have landed).  A
        # multi-GPU launch tracks them itself (``ranks.Launch``), until the role's next release.
        self.flying: list[tuple[int, list[tuple[int, int]], Operation]] = []
        threads = kernel.threads
        if not isinstance(threads, int) or threads <= 0 or threads % 128:
            raise TkcEmulatorError(f"kernel @{kernel.sym_name} needs a 'threads' attribute, a positive "
                                   f"multiple of 128 (run allocate-smem first), got {threads!r}", kernel.loc)
        self.warpgroups = threads // 128
        self.threads = threads
        smem_bytes = kernel.smem_bytes or 0
        self.smem = SharedMemory(max(smem_bytes, 1))
        self.copy_owner: np.ndarray | None = None  # per smem byte, whose hopper.async_load landed there
        self.mbarriers: dict[int, MBarrier] = {}
        self.bar_names: dict[int, str] = {}  # offset -> the allocation's name, without a CTA rank
        # bar.sync over the CTA, one per id: an mbarrier every warpgroup arrives on once; and
        # one per role for its internal barriers (count: the role's warpgroups).
        self.bar_sync: dict[Any, MBarrier] = {}
        self.turn_arrivals: dict[Any, tuple[int, set[int]]] = {}  # per turn barrier: (phase, who arrived)
        self.fault_loc = None
        # A cluster's CTAs (``cluster`` consecutive CTAs along x) run together: ``peers`` in
        # rank order (this one among them), sharing ``cluster_state`` (the cluster barrier and
        # the multicast copies each rank has issued, to check that they agree).
        self.rank, self.peers = 0, [self]
        self.cluster_state: dict[Any, Any] = {}
        self.issued: dict[Operation, int] = {}  # multicast copies issued, per op
        self.finished = 0  # warpgroups that have run to the end of the kernel
        # A CTA of a multi-GPU launch (``emulate_ranks``): the launch's shared state
        # (``ranks.RankLaunch``), its rank, and the handlers of the rank ops.
        self.launch: ranks.RankLaunch | None = None
        self.gpu = 0
        self.handlers, self.co_handlers = _HANDLERS, _CO_HANDLERS
        self.roles = [op for op in kernel.regions[0].block.ops if op.name == "hopper.role"]
        _check_registers(kernel, self.roles, threads)
        self._place(kernel, smem_bytes)

    def _place(self, kernel: Operation, smem_bytes: int) -> None:
        """Check every allocation lies in the dynamic shared memory and no mbarrier overlaps a
        tile; name the allocations in shared-memory messages."""
        tiles, bars = [], []
        for op in kernel.walk():
            if op.name not in ("hopper.smem_alloc", "hopper.mbarrier_alloc"):
                continue
            off = op.offset
            size = op.nbytes  # a ring takes stages * stride bytes (what allocate-smem reserves for it)
            if off is None or off < 0:
                raise _fault(op, "has no offset (run allocate-smem first)")
            if off + size > smem_bytes:
                raise _fault(op, f"[{off:#x}, {off + size:#x}) is outside the kernel's smem_bytes = {smem_bytes}")
            (tiles if op.name == "hopper.smem_alloc" else bars).append((op, off, size))
        for op, off, size in bars:
            for t, toff, tsize in tiles:
                if toff < off + size and off < toff + tsize:
                    raise _fault(op, f"overlaps the shared tile of {_describe(t)}")
        for op, off, size in tiles + bars:
            # allocate-smem may reuse bytes for tiles whose lifetimes do not overlap, so only the
            # first allocation of a range names it; overlap itself is not an error here.  A
            # ring names each stage, so that a race message says which stage was hit.
            n = _stages(op)
            parts = [(f"{_alloc_name(op)}[{k}]", off + k * op.stride, size // n) for k in range(n)] \
                if n > 1 else [(_alloc_name(op), off, size)]
            for name, base, nbytes in parts:
                try:
                    self.smem.add_region(name, base, nbytes)
                except TkcEmulatorError:
                    pass

    def mbarrier(self, op: Operation) -> MBarrier | BarrierRing:
        n = _stages(op)
        if n == 1:
            return self._mbarrier(op.offset, _alloc_name(op))
        return BarrierRing(_alloc_name(op), tuple(self._mbarrier(op.offset + 8 * k, f"{_alloc_name(op)}[{k}]")
                                                  for k in range(n)))

    def _mbarrier(self, off: int, name: str) -> MBarrier:
        if off not in self.mbarriers:
            self.bar_names[off] = name
            self.mbarriers[off] = MBarrier(name if len(self.peers) == 1 else f"{name} of CTA rank {self.rank}")
        return self.mbarriers[off]

    def offset_of(self, bar: MBarrier) -> int:
        return next(o for o, b in self.mbarriers.items() if b is bar)

    def in_peers(self, bar: MBarrier) -> list[MBarrier]:
        """The barrier at ``bar``'s offset in every CTA of the cluster, in rank order."""
        off = self.offset_of(bar)
        self.peers_running(f"its barrier {self.bar_names[off]!r}")
        return [peer._mbarrier(off, self.bar_names[off]) for peer in self.peers]

    def in_even(self, bar: MBarrier) -> MBarrier:
        """The barrier at ``bar``'s offset in the even CTA of this CTA's pair (``pair``: a CTA
        pair's copies and arrivals complete on the even CTA's barrier, which its MMA waits on)."""
        off = self.offset_of(bar)
        self.peers_running(f"its barrier {self.bar_names[off]!r}")
        return self.peers[self.rank & ~1]._mbarrier(off, self.bar_names[off])

    def pair(self) -> list[_CTA]:
        """The CTAs of this CTA's pair, the even one first."""
        return self.peers[self.rank & ~1:(self.rank & ~1) + 2]

    def peers_running(self, what: str) -> None:
        """A CTA whose warpgroups have all run to the end has exited: its shared memory is gone,
        and reaching ``what`` in it is an error."""
        for peer in self.peers:
            if peer.finished == peer.warpgroups:
                raise TkcEmulatorError(f"CTA rank {peer.rank} has exited, and CTA rank {self.rank} still reaches "
                                       f"{what} (a cluster barrier before the end keeps every CTA until its "
                                       f"peers are done)")

    def barrier(self, bar_id: int, role: Operation | None = None) -> MBarrier:
        """``bar.sync bar_id`` over the CTA, or over ``role``'s warpgroups (its internal barrier)."""
        key = bar_id if role is None else role
        if key not in self.bar_sync:
            self.bar_sync[key] = MBarrier(f"bar.sync {bar_id}", self.warpgroups) if role is None else \
                MBarrier(f"bar.sync {1 + role.first} of role {role.attributes['name']!r}", role.warpgroups)
        return self.bar_sync[key]

    def turn(self, k: int, role: Operation) -> MBarrier:
        """Named barrier ``TURN_BARRIER + k`` of ``role``'s turns (``hopper.turn``): one arrival
        per warpgroup, two per phase."""
        key = ("turn", k, role)
        if key not in self.bar_sync:
            self.bar_sync[key] = MBarrier(f"bar.sync {TURN_BARRIER + k} (the turn of warpgroup {k} of role "
                                          f"{role.attributes['name']!r})", 2)
            self.turn_arrivals[key] = (0, set())
        return self.bar_sync[key]

    def arrive_turn(self, k: int, role: Operation, g: int, op: Operation) -> tuple[MBarrier, int]:
        """Warpgroup ``g`` arrives on turn barrier ``k``; the parity it would wait for.  Two
        arrivals of one warpgroup in one phase are a broken protocol (the hardware would count
        256 threads and let the turn pass without the other warpgroup)."""
        bar = self.turn(k, role)
        key = ("turn", k, role)
        phase, who = self.turn_arrivals[key]
        if phase != bar.phase:
            phase, who = bar.phase, set()
        if g in who:
            raise _fault(op, f"warpgroup {g} arrives twice on {bar.name} before the other warpgroup does")
        who.add(g)
        self.turn_arrivals[key] = (phase, who)
        parity = bar.parity
        bar.arrive()
        return bar, parity

    def name(self, g: int) -> str:
        """Warpgroup ``g`` in the scheduler's messages, with the roles it runs."""
        roles = [r.attributes["name"] for r in self.roles if r.first <= g < r.first + r.warpgroups]
        rank = f"CTA rank {self.rank} " if len(self.peers) > 1 else ""
        return f"{rank}warpgroup {g}" + (f" ({', '.join(roles)})" if roles else "")


def _join_cluster(ctas: list[_CTA]) -> None:
    """Make ``ctas`` one cluster, in rank order."""
    for rank, cta in enumerate(ctas):
        cta.rank, cta.peers = rank, ctas
        cta.cluster_state = ctas[0].cluster_state


def _run_cluster(ctas: list[_CTA], seed: int) -> None:
    """Run the warpgroups of a cluster's CTAs (one CTA without a cluster) interleaved."""
    _join_cluster(ctas)
    warpgroups = [_Warpgroup(cta, g) for cta in ctas for g in range(cta.warpgroups)]
    run([(wg.waiter, wg.run()) for wg in warpgroups], seed)
    for wg in warpgroups:
        wg.left_behind(None, lambda w: True)


def _stages(op: Operation) -> int:
    return op.attributes.get("stages", 1)


def _check_registers(kernel: Operation, roles: list[Operation], threads: int) -> None:
    """A CTA holds the registers it was launched with (``tkc.registers``): the roles' budgets
    must fit that pool, or ``setmaxnreg.inc`` waits forever."""
    ctas = Options.from_consts(kernel.attributes.get("consts"), kernel.loc).programs_per_sm
    problem = role_budget_problem(kernel, roles, threads, ctas, DEFAULT_TARGET)  # the hopper IR's target
    if problem is not None:
        op, message, one_role = problem
        raise _fault(op, message) if one_role else TkcEmulatorError(message, op.loc)


def _alloc_name(op: Operation) -> str:
    hint = op.result.name_hint
    return f"%{hint}" if hint else f"{op.name}@{op.offset:#x}"


# ---------------------------------------------------------------- warpgroup
class _Warpgroup:
    """The ops of one warpgroup (threads ``[128 g, 128 g + 128)``) as a coroutine."""

    def __init__(self, cta: _CTA, g: int):
        self.cta, self.g = cta, g
        # Its name to the scheduler, which records under it the mbarrier phases it waited for
        # (tensor memory's reads check those): a rank's warpgroups carry the rank and CTA too.
        self.waiter = cta.name(g)
        self.env: dict[Value, Any] = dict(cta.params)
        self.groups: list[_Group] = []  # committed wgmma groups not yet waited for
        self.bulk: list[Any] = []  # read leases of committed TMA stores not yet waited for
        self.role_op: Operation | None = None  # the hopper.role being run, if any
        self.last_role: Operation | None = None  # the role it ran last (kept once it ends)
        self.unmet: list[_Unmet] = []  # waits this warpgroup's warps have not met since (left_behind)
        self.committed = self.completed = 0  # wgmma groups committed / completed, in order
        self.license = 0  # when the newest barrier phase it waited for completed (clock.CLOCK)
        # hopper.async_load copies: those of the open group, and the committed groups whose
        # copies have not landed (oldest first); each copy (addresses, values, dtype, op).
        self.copies: list[tuple] = []
        self.copy_groups: list[list[tuple]] = []

    # Inside a role, thread ids count from the role's first thread: ``local`` is this
    # warpgroup's index and ``threads`` the thread count that layouts see.
    @property
    def local(self) -> int:
        return self.g - (self.role_op.first if self.role_op is not None else 0)

    @property
    def threads(self) -> int:
        return self.role_op.threads if self.role_op is not None else self.cta.threads

    @property
    def leader(self) -> bool:
        """Whether this warpgroup holds "thread 0" of the one-thread ops."""
        return self.local == 0

    def run(self) -> Co:
        yield from self.block(self.cta.kernel.regions[0].block)
        self.cta.finished += 1
        if self.cta.finished == self.cta.warpgroups:
            tmem.at_exit(self.cta)
        if any(not grp.done for grp in self.groups):
            op = next(grp.op for grp in self.groups if not grp.done)
            raise self._remember(_fault(op, "is still in flight when the kernel ends (no hopper.wgmma_wait)"))
        flying = _flying(self)
        if flying:
            raise self._remember(_fault(flying[0][3], "is still copying when the kernel ends (no hopper.async_wait "
                                                      "covers it)"))
        if self.bulk:
            raise self._remember(TkcEmulatorError(
                f"{self.role}: a hopper.tma_store is still reading shared memory when the kernel ends "
                f"(no hopper.tma_store_wait after it)"))

    def block(self, block: Block) -> Co:
        """Run ``block``; return what its ``tile.yield`` yields ([] for ``tile.return``)."""
        for op in block.ops:
            if op.name == "tile.yield":
                return [self.env[v] for v in op.operands]  # pending values may be carried
            if op.name == "tile.return":
                return []
            try:
                out = yield from self.op(op)
            except TkcEmulatorError as e:
                if getattr(e, "names_op", False):
                    self._remember(e)
                    raise
                raise self._remember(_fault(op, e.message, type(e))) from e
            except (TkcError, ValueError, IndexError, TypeError) as e:
                # Layout and descriptor checks raise ValueError: the op asked for something the
                # machine cannot do (a misaligned base, a coordinate outside a tile).
                raise self._remember(_fault(op, e.message if isinstance(e, TkcError) else str(e))) from e
            if op.results:
                self.overwrite(op, op.results)
                outs = out if isinstance(out, list) else [out]
                self.env.update(zip(op.results, outs))
        return []

    def overwrite(self, op: Operation, values: Sequence[Value]) -> None:
        """``op`` writes the registers of ``values``.  A wgmma reads an A operand in registers
        until a wait covers it (the PTX ISA: the registers of an in-flight ``wgmma.mma_async``,
        accumulator and A, are not to be modified before a ``wgmma.wait_group`` covering it),
        and a value's registers are the same on every run of the op that defines it (one loop
        body, one register allocation): a value that an in-flight wgmma of this warpgroup
        takes as A may not be written again (its op run again, as in the next iteration of a
        loop that computes it; a loop argument given a new value)."""
        for grp in self.groups:
            if not grp.done and any(grp.a is v for v in values):
                mma = grp.op
                where = f"at line {mma.loc.line}" if mma.loc is not None and mma.loc.line else _describe(mma)
                hint = mma.result.name_hint
                raise self._remember(_fault(op, f"writes the registers of the A operand that the product {where} "
                                                f"still reads ('{mma.name}'{f' (%{hint})' if hint else ''} is in "
                                                f"flight): wait for it (a wgmma_wait with pending 0) before "
                                                f"computing the next A"))

    def _remember(self, e: TkcEmulatorError) -> TkcEmulatorError:
        """Keep the innermost faulting op's location for the CTA-level error: the scheduler
        re-raises a role's error from its message alone."""
        if self.cta.fault_loc is None:
            self.cta.fault_loc = e.loc
        return e

    def coords(self, op: Operation, layout: Any) -> tuple[np.ndarray, ...]:
        """This warpgroup's coordinates in ``layout``, which must span the threads running it
        (the CTA's, or inside a role the role's)."""
        if layout.threads != self.threads:
            who = f"role {self.role_op.attributes['name']!r} has" if self.role_op is not None else "the kernel has"
            raise _fault(op, f"{layout} spans {layout.threads} threads, {who} {self.threads}")
        return _coords(layout, self.local)

    def operands(self, op: Operation) -> list[Any]:
        vals = [self.env[v] for v in op.operands]
        for i, x in enumerate(vals):
            if isinstance(x, _Pending) and not _may_take_pending(op, i):
                raise _fault(op, f"reads {_describe(x.op)}'s result before hopper.wgmma_wait: the "
                                 f"accumulator registers are still being written")
            if _is_ring(x) and (op.name, i) not in (("hopper.stage", 0), ("hopper.mbarrier_init", 0),
                                                    ("hopper.cluster_reduce", 2)):
                raise _fault(op, f"takes the ring {x.name} itself; a ring is used through hopper.stage")
        return vals

    def op(self, op: Operation) -> Co:
        if self.cta.roles and self.role_op is None and _has_registers(op):
            raise _fault(op, "uses register tiles outside the kernel's roles (register tiles live inside "
                             "roles once a kernel has them: each role has its own threads and registers)")
        if op.name in ONE_THREAD_OPS and not self.leader:
            return None  # executed by thread 0 of the CTA (of the role): in its first warpgroup
        co, plain = self.cta.co_handlers, self.cta.handlers
        if op.name in co:
            return (yield from co[op.name](self, op, *self.operands(op)))
        if op.name in plain:
            return plain[op.name](self, op, *self.operands(op))
        return self.compute(op, self.operands(op))

    def compute(self, op: Operation, args: list[Any]) -> np.ndarray:
        """Ops whose meaning is the interpreter's: scalar arithmetic anywhere, and value-by-value
        ops on register tiles that share the result's layout."""
        if op.regions or len(op.results) != 1 or not op.has_trait("pure"):
            raise _fault(op, "is not an op the emulator runs at the hopper level")
        t = op.result.type
        if isinstance(t, ScalarType):
            out = evaluate(op, args)
            want: tuple[int, ...] = ()
        else:
            layout = _reg_layout(op, t)
            if op.name in ("tile.constant", "tile.splat", "tile.arange"):
                # The interpreter's whole tile, gathered at each value's coordinates.
                out = evaluate(op, args)[self.coords(op, layout)]
            elif op.has_trait("elementwise"):
                for v in op.operands:
                    if isinstance(v.type, TileType) and v.type.layout != layout:
                        raise _fault(op, f"mixes layouts {v.type.layout} and {layout}: elementwise ops "
                                         f"work value by value (convert_layout first)")
                out = evaluate(op, args)
            else:
                raise _fault(op, "is not an op the emulator runs on register tiles")
            want = (128, layout.regs)
        if out.shape != want or out.dtype != t.dtype.np_storage:
            raise _fault(op, f"produced {out.dtype}{list(out.shape)} for {t} (expected {want})")
        return out

    # ---------------------------------------------------------- barriers
    def passed(self, op: Operation, bar: MBarrier) -> None:
        """This warpgroup passed the mbarrier wait ``op``.  Its four warps spin on the wait
        each on its own; unless the role runs on one warp (``warps = 1``), remember the wait
        until they next meet."""
        if self.role_op is None or (self.role_op.warps or 4) > 1:
            self.unmet.append(_Unmet(bar, bar.phase, op, self.committed, self.role))

    def left_behind(self, at: Operation | None, met: Callable[[_Unmet], bool]) -> None:
        """The warps meet at ``at`` (None: never again; the CTA has run to its end, and a warp
        exits only once past all its waits) for the waits ``met`` selects: a wait whose barrier
        completed two phases or more since the warpgroup passed it is an error.  A warp still
        spinning on it (its warps wait each on its own, and nothing held it to the others)
        tests the parity it waits for against a barrier two phases on, sees its parity again
        and waits forever: the CTA never exits."""
        keep = []
        for w in self.unmet:
            bar = w.barrier
            if not met(w):
                keep.append(w)
            elif bar.phase - w.phase >= 2:
                where = f"meet at {_describe(at)}" if at is not None else "meet again"
                who = "" if at is not None else f"{w.role}: "  # (inside the run the scheduler names the role)
                raise _fault(w.wait, f"{who}{bar.name!r} completed {bar.phase - w.phase} phases after this "
                                     f"warpgroup passed the wait, before its four warps {where}: a warp still "
                                     f"spinning here would see its parity again and wait forever (a role that "
                                     f"only waits and issues copies runs on one warp: warps = 1)")
        self.unmet = keep

    def bar_sync(self, op: Operation, bar_id: int | None = None) -> Co:
        """``bar.sync id``: arrive on the barrier, then wait for its phase to complete.  With no
        ``bar_id`` (the internal barrier of a reduction or conversion): barrier 0 over the CTA,
        or inside a role barrier ``1 + first`` over the role's warpgroups."""
        if bar_id is not None and self.role_op is not None:
            raise _fault(op, f"bar.sync {bar_id} over the whole CTA inside role "
                             f"{self.role_op.attributes['name']!r} would wait for the other roles")
        bar = self.cta.barrier(0 if bar_id is None else bar_id, self.role_op)
        parity = bar.parity
        bar.arrive()
        yield Wait(bar, parity, f"{bar.name} of {_describe(op)}")
        self.left_behind(op, lambda w: True)  # every warp arrived

    @property
    def role(self) -> str:
        r = self.role_op
        return f"warpgroup {self.g}" + (f", role {r.attributes['name']!r}" if r is not None else "")


def _has_registers(op: Operation) -> bool:
    return any(isinstance(v.type, TileType) and v.type.space == "reg" for v in (*op.operands, *op.results))


def _may_take_pending(op: Operation, i: int) -> bool:
    """A wgmma result may be waited for, accumulated into, or carried (loop/if results are
    only moved, never read)."""
    return (op.name, i) in (("hopper.wgmma", 2), ("hopper.wgmma_wait", 0)) or \
        (op.name == "tile.for" and i >= 3)


def _reg_layout(op: Operation, t: Any) -> Any:
    if not isinstance(t, TileType) or t.space != "reg" or t.layout is None:
        raise _fault(op, f"needs register tiles with a layout, got {t}")
    return t.layout


# ------------------------------------------------------------- structure
def _for(wg: _Warpgroup, op: Operation, lb: Any, ub: Any, step: Any, *init: Any) -> Co:
    if int(step) <= 0:
        raise _fault(op, f"loop step must be positive, got {int(step)}")
    body = op.regions[0].block
    carried = list(init)
    for n, i in enumerate(range(int(lb), int(ub), int(step))):
        # The arguments take the loop's operands, then what each iteration yields (an
        # argument yielded as it is keeps its registers).
        written = body.args[1:] if n == 0 else \
            [x for x, y in zip(body.args[1:], body.terminator.operands) if y is not x]
        wg.overwrite(op if n == 0 else body.terminator, written)
        wg.env[body.args[0]] = np.asarray(i, np.int32)
        wg.env.update(zip(body.args[1:], carried))
        carried = yield from wg.block(body)
    return carried


def _if(wg: _Warpgroup, op: Operation, cond: Any) -> Co:
    return (yield from wg.block(op.regions[0 if bool(cond) else 1].block))


def _role(wg: _Warpgroup, op: Operation) -> Co:
    """Warpgroups ``[first, first + warpgroups)`` run the region; the others go on at once
    (they meet the role's warpgroups only on mbarriers or a later CTA barrier)."""
    if not op.first <= wg.g < op.first + op.warpgroups:
        return None
    if wg.role_op is not None:
        raise _fault(op, f"is nested in role {wg.role_op.attributes['name']!r}")
    wg.role_op = wg.last_role = op
    try:
        yield from wg.block(op.body)
    finally:
        wg.role_op = None
    return None


def _program_id(wg: _Warpgroup, op: Operation) -> np.ndarray:
    pid = wg.cta.pid
    return np.asarray(pid[op.axis] if op.axis < len(pid) else 0, np.int32)


def _num_programs(wg: _Warpgroup, op: Operation) -> np.ndarray:
    grid = wg.cta.grid
    return np.asarray(grid[op.axis] if op.axis < len(grid) else 1, np.int32)


# ---------------------------------------------------------- register moves
def _expand_dims(wg: _Warpgroup, op: Operation, x: np.ndarray) -> np.ndarray:
    src, dst = _reg_layout(op, op.x.type), _reg_layout(op, op.result.type)
    if not expand_is_free(src, dst, op.axis):
        raise _fault(op, f"{src} -> {dst} moves values between threads; expand_dims must be free")
    return x


def _reshape(wg: _Warpgroup, op: Operation, x: np.ndarray) -> np.ndarray:
    src, dst = _reg_layout(op, op.x.type), _reg_layout(op, op.result.type)
    if not same_registers(src, dst):
        raise _fault(op, f"{src} -> {dst} moves values between threads or registers; a reshape must be free")
    return x


def _transpose(wg: _Warpgroup, op: Operation, x: np.ndarray) -> np.ndarray:
    src, dst = _reg_layout(op, op.x.type), _reg_layout(op, op.result.type)
    if not transposes(src, dst):
        raise _fault(op, f"{src} -> {dst} moves values between threads or registers; a transpose must be free")
    return x


def _picks(op: Operation, whole: Any, part: Any, axis: int, index: int) -> list[int]:
    picks = picked_registers(whole, part, axis, index)
    if picks is None:
        raise _fault(op, f"{whole} and {part}: a take or a stack picks registers of threads that hold "
                         f"axis {axis} whole, the part in the whole's slice along it")
    return list(picks)


def _take(wg: _Warpgroup, op: Operation, x: np.ndarray) -> np.ndarray:
    whole, part = _reg_layout(op, op.x.type), _reg_layout(op, op.result.type)
    return x[:, _picks(op, whole, part, op.axis, op.index)]


def _stack(wg: _Warpgroup, op: Operation, *xs: np.ndarray) -> np.ndarray:
    whole = _reg_layout(op, op.result.type)
    out = np.empty((xs[0].shape[0], whole.regs), xs[0].dtype)
    for p, (v, x) in enumerate(zip(op.operands, xs)):
        out[:, _picks(op, whole, _reg_layout(op, v.type), op.axis, p)] = x
    return out


def _broadcast(wg: _Warpgroup, op: Operation, x: np.ndarray) -> np.ndarray:
    src, dst = _reg_layout(op, op.x.type), _reg_layout(op, op.result.type)
    wg.coords(op, dst)  # the layout spans the threads running it
    axes = [a for a, (s, d) in enumerate(zip(op.x.type.shape, op.result.type.shape)) if s != d]
    slots = broadcast_slots(src, dst, axes)
    if slots is None:
        raise _fault(op, f"broadcasts {src} to {dst}: the source must be a keep slice of the result's layout "
                         f"whose slots hold the values the result needs")
    return x[:, list(slots)]


def _convert_layout(wg: _Warpgroup, op: Operation, x: np.ndarray, *scratch: SmemTile) -> Co:
    src, dst = _reg_layout(op, op.x.type), _reg_layout(op, op.result.type)
    if not scratch:
        m = register_map(src, dst)
        if m is None:
            raise _fault(op, f"{src} -> {dst} without a scratch tile, but threads do not already hold "
                             f"their new values")
        return x[:, list(m)]
    (s,) = scratch
    if op.x.type.rank not in (1, 2):
        raise _fault(op, "converts 1-D and 2-D tiles through shared memory")

    def coords(layout: Any) -> tuple:
        return _held_coords(wg, op, layout, op.x.type.shape, s)

    smem = wg.cta.smem
    who = _who(op, wg)
    smem.write_elements(s.offsets(coords(src)), x, s.layout.dtype, writer=who)
    yield from wg.bar_sync(op)
    out = smem.read_elements(s.offsets(coords(dst)), s.layout.dtype, reader=who)
    yield from wg.bar_sync(op)  # the scratch may be rewritten once every warpgroup has read it
    return round_to(out, op.result.type.dtype)


_COMBINE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def _within_warps(op: Operation, x: np.ndarray, xt: Any, kind: str, axis: int, steps: tuple[list, list],
                  what: str = "") -> tuple[Any, Callable[..., np.ndarray], np.ndarray]:
    """A reduction's plan up to its cross-warp step: each thread's values combined along
    ``axis``, then across lanes by shuffles.  ``steps``: the op's (shuffle_xor, warp_xor)."""
    layout = _reg_layout(op, xt)
    plan = reduce_plan(layout, axis)
    if list(plan.shuffle_xor) != list(steps[0]) or list(plan.warp_xor) != list(steps[1]):
        raise _fault(op, f"{what}steps shuffle_xor {steps[0]}, warp_xor {steps[1]} are not {layout}'s plan "
                         f"{list(plan.shuffle_xor)}, {list(plan.warp_xor)}")
    combine = _COMBINE[kind]
    v = np.stack([functools.reduce(combine, [x[:, i] for i in group]) for group in plan.groups], axis=1)
    lane = np.arange(128)
    for m in plan.shuffle_xor:  # shfl.bfly: masks below 32 stay inside a warp, so inside this warpgroup
        v = combine(v, v[lane ^ m])
    return plan, combine, v


def _reduced(wg: _Warpgroup, op: Operation, plan: Any, v: np.ndarray, dtype: Any) -> Any:
    out = round_to(v, dtype)
    if plan.result is not None:
        return out
    if not np.all((out == out[0, 0]) | (np.isnan(out) & np.isnan(out[0, 0]))):
        raise _fault(op, f"threads of {wg.role} end with different values for the scalar result")
    return out[0, 0].reshape(())


def _reduce(wg: _Warpgroup, op: Operation, x: np.ndarray, *scratch: SmemTile) -> Co:
    """``reduce_plan`` executed step by step, as the generated code does it.  Partials stay in
    the storage type (float32 for every float, like the registers), so float sums add in f32
    in the plan's order; the result is rounded to its dtype once."""
    plan, combine, v = _within_warps(op, x, op.x.type, op.kind, op.axis, (op.shuffle_xor, op.warp_xor))
    if plan.warp_xor:
        if len(scratch) != 1:
            raise _fault(op, "crosses warps but has no scratch tile")
        (v,) = yield from _warp_exchange(wg, op, [(plan, combine, v, scratch[0])])
    return _reduced(wg, op, plan, v, op.x.type.dtype)


def _reduce_group(wg: _Warpgroup, op: Operation, *values: Any) -> Co:
    """``hopper.reduce_group``: every part as ``hopper.reduce`` runs it, the cross-warp steps
    of all parts in one round trip."""
    n = len(op.results)
    parts = [_within_warps(op, x, xo.type, kind, axis, (sx, wx), f"part {i}: ")
             for i, (x, xo, kind, axis, sx, wx) in enumerate(zip(values[:n], op.operands[:n], op.kinds, op.axes,
                                                                   op.shuffle_xor, op.warp_xor))]
    got = yield from _warp_exchange(wg, op, [(*p, s) for p, s in zip(parts, values[n:])])
    return [_reduced(wg, op, p[0], v, xo.type.dtype) for p, v, xo in zip(parts, got, op.operands[:n])]


_SCAN_COMBINE = {"sum": np.add, "prod": np.multiply}


def _scan(wg: _Warpgroup, op: Operation, x: np.ndarray, *scratch: SmemTile) -> Co:
    """``scan_plan`` executed step by step, as the generated code does it (``ScanPlan``): per
    value a prefix and its block's total, in the storage type (float32 for every float), the
    result rounded to its dtype once."""
    plan = scan_plan(_reg_layout(op, op.x.type), op.axis)
    combine = _SCAN_COMBINE[op.kind]
    pre, tot = x.copy(), x.copy()
    thread = 128 * wg.local + np.arange(128)[:, None]
    for kind, how in plan.steps:
        if kind == "regs":
            for chain in how:
                run = tot[:, chain[0]]
                for i in chain[1:]:
                    pre[:, i] = combine(run, pre[:, i])
                    run = combine(run, tot[:, i])
                for i in chain:
                    tot[:, i] = run
            continue
        if kind == "lane":  # shfl.bfly: masks below 32 stay inside a warp, so inside this warpgroup
            other = tot[np.arange(128) ^ how]
        else:
            if len(scratch) != 1:
                raise _fault(op, "crosses warps but has no scratch tile")
            s, who = scratch[0], _who(op, wg)
            cols = np.arange(tot.shape[1])[None, :] + np.zeros_like(thread)
            wg.cta.smem.write_elements(s.offsets((thread + 0 * cols, cols)), tot, s.layout.dtype, writer=who)
            yield from wg.bar_sync(op)
            other = wg.cta.smem.read_elements(s.offsets(((thread ^ how) + 0 * cols, cols)), s.layout.dtype,
                                              reader=who).astype(tot.dtype)
            yield from wg.bar_sync(op)  # the partner has read this step's totals
        pre = np.where((thread & how) != 0, combine(other, pre), pre)
        tot = combine(tot, other)
    return round_to(pre, op.x.type.dtype)


def _warp_exchange(wg: _Warpgroup, op: Operation, parts: list[tuple[Any, Callable[..., np.ndarray], np.ndarray,
                                                                      SmemTile]]) -> Co:
    """The cross-warp step of reductions through their scratch tiles (docs/hopper.md §3), one
    round trip for all ``(plan, combine, partials, scratch)`` parts: warp ``w`` writes its
    partial for kept coordinate ``c`` at ``(w, c)`` of each part's scratch; after ``bar.sync``
    (the group may span warpgroups) every warp combines the partials of its group in increasing
    warp order, so that all end with the same bits, and meets a second ``bar.sync`` before the
    scratch may be written again."""
    smem, who = wg.cta.smem, _who(op, wg)
    placed = []
    for plan, _, v, s in parts:
        warp = (128 * wg.local + np.arange(128)[:, None]) // 32 + np.zeros_like(v, np.int64)
        kept = wg.coords(op, plan.result)[0] if plan.result is not None else np.zeros_like(warp)
        mine = s.offsets((warp, kept))
        smem.write_elements(mine, v, s.layout.dtype, writer=who)
        # Every lane of a warp writes; the lanes sharing a kept coordinate must agree, or the
        # value one of them reads back depends on which store landed last.
        back = smem.read_elements(mine, s.layout.dtype, reader=who).astype(v.dtype)
        if not np.array_equal(back, v, equal_nan=True):
            raise _fault(op, f"lanes of one warp hold different partials for one kept coordinate ({wg.role})")
        placed.append((warp, kept))
    yield from wg.bar_sync(op)
    out = []
    for (plan, combine, v, s), (warp, kept) in zip(parts, placed):
        base = warp & plan.group_base
        acc = None
        for other in plan.group_offsets:
            got = smem.read_elements(s.offsets((base | other, kept)), s.layout.dtype, reader=who).astype(v.dtype)
            acc = got if acc is None else combine(acc, got)
        out.append(acc)
    yield from wg.bar_sync(op)  # every warp has read the partials: the next reduction may overwrite them
    return out


# ------------------------------------------------------------------ global memory
def _global_index(op: Operation, tensor: np.ndarray, offsets: Sequence[Any], coords: Sequence[np.ndarray]
                  ) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Tensor index of every value (box axes in order; squeezed axes take only the offset) and
    the in-bounds mask."""
    squeeze = set(op.squeeze or [])
    steps = op.attributes.get("steps") or [1] * len(offsets)
    it = iter(coords)
    idx = []
    for a, off in enumerate(offsets):
        c = 0 if a in squeeze else next(it)
        idx.append(int(off) + steps[a] * np.asarray(c, np.int64))
    shape = np.broadcast_shapes(*(i.shape for i in idx))
    idx = [np.broadcast_to(i, shape) for i in idx]
    inb = np.ones(shape, bool)
    for size, i in zip(tensor.shape, idx):
        inb &= (i >= 0) & (i < size)
    return tuple(idx), inb


def _load(wg: _Warpgroup, op: Operation, tensor: np.ndarray, *offsets: Any) -> np.ndarray:
    dt = op.tensor.type.dtype
    if isinstance(op.result.type, ScalarType):  # one element, the same in every thread
        idx, inb = _global_index(op, tensor, offsets, ())
        other = round_to(0 if op.other is None else op.other, dt)
        if bool(inb) and wg.cta.launch is not None:
            wg.cta.launch.check_read(tensor, idx)
            wg.cta.launch.read(wg, op, tensor, idx)
        elif bool(inb) and wg.cta.flying:
            _landed(wg, op, tensor, idx)
        return np.asarray(tensor[idx] if bool(inb) else other, dt.np_storage)
    return _read(wg, op, tensor, offsets, wg.coords(op, _reg_layout(op, op.result.type)))


def _read(wg: _Warpgroup, op: Operation, tensor: np.ndarray, offsets: Sequence[Any],
          coords: Sequence[np.ndarray]) -> np.ndarray:
    """The tensor's elements at ``coords`` (one array per kept axis), ``other`` outside it."""
    dt = op.tensor.type.dtype
    idx, inb = _global_index(op, tensor, offsets, coords)
    if wg.cta.launch is not None:
        wg.cta.launch.check_read(tensor, idx, inb)
        wg.cta.launch.read(wg, op, tensor, tuple(i[inb] for i in idx))
    elif wg.cta.flying:
        _landed(wg, op, tensor, idx, inb)
    safe = tuple(np.where(inb, i, 0) for i in idx)
    other = round_to(0 if op.other is None else op.other, dt)
    if tensor.size == 0:
        return np.full(inb.shape, other, dt.np_storage)
    return np.where(inb, tensor[safe], other).astype(dt.np_storage)


def _gather(wg: _Warpgroup, op: Operation, tensor: np.ndarray, index: np.ndarray, *offsets: Any) -> np.ndarray:
    """``tile.gather``: a load whose coordinate along ``op.axis`` is each value's index register."""
    coords = list(wg.coords(op, _reg_layout(op, op.result.type)))
    kept = [a for a in range(tensor.ndim) if a not in (op.squeeze or [])]
    coords[kept.index(op.axis)] = np.asarray(index, np.int64)
    return _read(wg, op, tensor, offsets, coords)


def _landed(wg: _Warpgroup, op: Operation, tensor: np.ndarray, index: tuple, mask: Any = None,
            access: str = "reads", atomic: bool = False) -> None:
    """One GPU: an access of ``tensor[index]`` by the program that TMA-stores some of it, before
    its program ends, is an error (the copy lands at no fixed time).  Atomic adds into an
    element its TMA reduction adds to commute and are fine."""
    for key, box, store in wg.cta.flying:
        if key != id(tensor) or atomic and store.attributes.get("reduce") == "add":
            continue
        element = ranks.first_inside(box, index, mask)
        if element is not None:
            raise _fault(op, f"{access} element {element} of '{param_name(op.tensor)}' while this program's TMA "
                             f"store at {ranks._line(store)} still writes it (a TMA store lands at no fixed time "
                             f"before the program ends): write each element once, or compute from the tile "
                             f"you stored instead of reading it back")


def _log_write(wg: _Warpgroup, op: Operation, tensor: np.ndarray, index: Any, atomic: bool) -> None:
    if wg.cta.launch is None and wg.cta.flying:
        _landed(wg, op, tensor, index if isinstance(index, tuple) else (index,), access="writes", atomic=atomic)
    log = wg.cta.log
    if log is not None:
        race = log.write(tensor, index, wg.cta.who, op.loc, atomic)
        if race is not None:
            raise _fault(op, race.message(wg.cta.who, atomic))


def _store(wg: _Warpgroup, op: Operation, tensor: np.ndarray, value: np.ndarray, *offsets: Any) -> None:
    if isinstance(op.value.type, ScalarType):  # one element, stored by every thread alike
        idx, inb = _global_index(op, tensor, offsets, ())
        if bool(inb):
            _log_write(wg, op, tensor, idx, atomic=False)
            tensor[idx] = value
        wg.cta.written.add(id(tensor))
        return
    layout = _reg_layout(op, op.value.type)
    idx, inb = _global_index(op, tensor, offsets, wg.coords(op, layout))
    sel = tuple(i[inb] for i in idx)
    _log_write(wg, op, tensor, sel, atomic=False)
    tensor[sel] = value[inb]
    # Replicated layouts store one element from several threads; they must agree.
    if not np.array_equal(tensor[sel], value[inb], equal_nan=True):
        raise _fault(op, f"threads holding the same element of {layout} store different values ({wg.role})")
    wg.cta.written.add(id(tensor))


def _masked_store(wg: _Warpgroup, op: Operation, tensor: np.ndarray, value: np.ndarray, mask: np.ndarray,
                  *offsets: Any) -> None:
    layout = _reg_layout(op, op.value.type)
    idx, inb = _global_index(op, tensor, offsets, wg.coords(op, layout))
    inb = inb & np.asarray(mask, bool)
    sel = tuple(i[inb] for i in idx)
    _log_write(wg, op, tensor, sel, atomic=False)
    tensor[sel] = value[inb]
    wg.cta.written.add(id(tensor))


def _atomic(wg: _Warpgroup, op: Operation, tensor: np.ndarray, *rest: Any) -> np.ndarray | None:
    """``tile.atomic``/``tile.atomic_cas`` as codegen issues them: a tile's values by the threads
    holding their first copies, one element by thread 0 (its old value read by nobody)."""
    kind = atomic_kind(op)
    n = 2 if kind == "cas" else 1
    values, offsets = rest[:n], rest[n:]
    dt = op.tensor.type.dtype
    wg.cta.written.add(id(tensor))
    if isinstance(op.value.type, ScalarType):
        if wg.leader:
            _atomic_element(wg, op, kind, dt, tensor, values, offsets)
        return np.zeros((), dt.np_storage) if op.results else None
    layout = _reg_layout(op, op.value.type)
    idx, inb = _global_index(op, tensor, offsets, wg.coords(op, layout))
    t = 128 * wg.local + np.arange(128)[:, None]
    masks = np.array(first_holders(layout), dtype=np.int64).reshape(-1, 2)
    inb = inb & ((t & masks[:, 0][None, :]) == masks[:, 1][None, :])
    sel = tuple(i[inb] for i in idx)
    _log_write(wg, op, tensor, sel, atomic=True)
    tensor[sel] = atomic_update(kind, dt, tensor[sel], np.asarray(values[-1])[inb])
    return None


def _atomic_element(wg: _Warpgroup, op: Operation, kind: str, dt: Any, tensor: np.ndarray,
                    values: Sequence[Any], offsets: Sequence[Any]) -> np.ndarray:
    """Apply an atomic on one element; its old value (0 outside the tensor, which is left alone)."""
    idx, inb = _global_index(op, tensor, offsets, ())
    if not bool(inb):
        return np.zeros((), dt.np_storage)
    _log_write(wg, op, tensor, idx, atomic=True)
    old = np.asarray(tensor[idx], dt.np_storage).copy()
    expected = values[0] if kind == "cas" else None
    tensor[idx] = atomic_update(kind, dt, old, np.asarray(values[-1], dt.np_storage), expected)
    return old


def _atomic_fetch(wg: _Warpgroup, op: Operation, tensor: np.ndarray, slot: Any, *args: Any) -> Co:
    """``hopper.atomic_fetch``: a barrier, thread 0's atomic, a barrier, every thread reads the old value."""
    n = 2 if op.kind == "cas" else 1
    yield from wg.bar_sync(op)
    if wg.leader:
        wg.cta.fetched[op] = _atomic_element(wg, op, op.kind, op.tensor.type.dtype, tensor, args[:n], args[n:])
        wg.cta.written.add(id(tensor))
    yield from wg.bar_sync(op)
    return wg.cta.fetched[op]


# ------------------------------------------------------------------ shared memory
def _smem_alloc(wg: _Warpgroup, op: Operation) -> SmemTile:
    t = op.result.type
    return SmemTile(op.offset, t.layout, t.shape, _alloc_name(op), _stages(op), op.stride)


def _mbarrier_alloc(wg: _Warpgroup, op: Operation) -> MBarrier | BarrierRing:
    return wg.cta.mbarrier(op)


def _stage(wg: _Warpgroup, op: Operation, ring: Any, k: Any) -> SmemTile | MBarrier:
    if not _is_ring(ring):
        raise _fault(op, "takes a ring (an allocation with stages > 1)")
    n = len(ring.stages) if isinstance(ring, BarrierRing) else ring.stages
    k = int(k)
    if not 0 <= k < n:
        raise _fault(op, f"stage {k} of the {n}-stage ring {ring.name} is outside [0, {n})")
    return ring.stages[k] if isinstance(ring, BarrierRing) else ring.stage(k)


def _mbarrier_init(wg: _Warpgroup, op: Operation, bar: MBarrier | BarrierRing) -> None:
    for b in bar.stages if isinstance(bar, BarrierRing) else (bar,):
        b.init(op.count)


def _mbarrier_arrive(wg: _Warpgroup, op: Operation, bar: MBarrier) -> None:
    # Thread 0 of each warpgroup running it: one arrival per coroutine (on every CTA's
    # barrier at this offset, with ``cluster``).
    for b in wg.cta.in_peers(bar) if op.attributes.get("cluster") else (bar,):
        b.arrive(128 if op.attributes.get("threads") else 1)  # every thread of the warpgroup, or its first
    if op.attributes.get("threads"):
        # Every warp arrives, each behind its own waits: the barrier cannot complete while a
        # warp still spins on an earlier wait, so those waits are met here.
        wg.left_behind(op, lambda w: True)


def _cluster_barrier(wg: _Warpgroup, op: Operation) -> Co:
    """``barrier.cluster`` arrive + wait: every warpgroup of every CTA of the cluster."""
    state = wg.cta.cluster_state
    if op not in state:
        state[op] = MBarrier(f"barrier.cluster of {_describe(op)}", sum(c.warpgroups for c in wg.cta.peers))
    bar = state[op]
    parity = bar.parity
    bar.arrive()
    yield Wait(bar, parity, f"barrier.cluster of {_describe(op)}")
    wg.left_behind(op, lambda w: True)


def _cluster_reduce(wg: _Warpgroup, op: Operation, x: np.ndarray, scratch: SmemTile, bars: Any,
                    phase: Any) -> Co:
    """``hopper.cluster_reduce``: thread 0 arms this exchange's barrier (buffer and barrier
    ``phase % copies``) for every rank's elements; this warpgroup's first holders of elements
    (``layouts.first_holders``) store them into slot ``rank * elements + e`` of that buffer in
    every CTA, completing their bytes on that CTA's barrier; then every thread waits for parity
    ``phase // 2`` and combines its elements' slots of its own buffer in rank order."""
    cta = wg.cta
    lay = _reg_layout(op, op.x.type)
    phase = int(phase)
    if not 0 <= phase < 4:
        raise _fault(op, f"phase {phase} is outside [0, 4)")
    which = phase % op.copies
    bar = bars.stages[which] if isinstance(bars, BarrierRing) else bars
    first_row = which * op.buffer_rows()
    threads = 128 * wg.local + np.arange(128)
    flat = np.zeros((128, lay.regs), dtype=np.int64)
    for c, extent in zip(wg.coords(op, lay), op.x.type.shape):
        flat = flat * extent + np.broadcast_to(c, flat.shape)
    masks = np.array(first_holders(lay), dtype=np.int64).reshape(-1, 2)
    sends = (threads[:, None] & masks[None, :, 0]) == masks[None, :, 1]

    def slots(rank: int, picked: np.ndarray) -> np.ndarray:
        f = rank * op.elements() + flat[picked]
        return scratch.offsets([first_row + f // SLOT_ROW, f % SLOT_ROW])

    if wg.leader:
        bar.arrive_expect_tx(len(cta.peers) * op.elements() * 4)
    values = np.asarray(x, np.float32)
    if sends.any():  # a warpgroup that sends nothing reaches no peer (which may have exited)
        for peer, peer_bar in zip(cta.peers, cta.in_peers(bar)):
            peer.smem.write_elements(slots(cta.rank, sends), values[sends], dtypes.f32, writer=_who(op, wg))
            peer_bar.complete_tx(int(sends.sum()) * 4, by=_who(op, wg))
    # No lagging-warp record (``passed``): this barrier's next phase needs this CTA's stores of
    # the exchange after next, made only once every one of its threads has passed this wait
    # (each sender's own order, or the bar.sync after the op where only some threads send).
    yield Wait(bar, phase // 2, _describe(op))
    every = np.ones_like(sends)
    parts = [cta.smem.read_elements(slots(r, every), dtypes.f32, reader=_who(op, wg)).reshape(sends.shape)
             for r in range(len(cta.peers))]
    return combine_ranks(op.kind, parts)


def _expect_tx(wg: _Warpgroup, op: Operation, bar: MBarrier) -> None:
    (wg.cta.in_even(bar) if op.attributes.get("pair") else bar).arrive_expect_tx(op.bytes)


def _smem_store(wg: _Warpgroup, op: Operation, value: np.ndarray, dst: SmemTile) -> None:
    layout = _reg_layout(op, op.value.type)
    coords = [np.broadcast_to(c, np.shape(value)) for c in wg.coords(op, layout)]
    col = op.attributes.get("col")
    if col is not None:  # only the columns [col, col + width) go to dst, shifted to its origin
        r, c = coords
        inside = (c >= col) & (c < col + op.dst.type.shape[1])
        coords, value = [r[inside], c[inside] - col], np.asarray(value)[inside]
    wg.cta.smem.write_elements(dst.offsets(coords), value, dst.layout.dtype, writer=_who(op, wg))


def _held_coords(wg: _Warpgroup, op: Operation, layout: Any, shape: tuple, held: SmemTile) -> tuple:
    """This warpgroup's coordinates in ``layout`` (a tile of ``shape``) where the shared tile
    ``held`` keeps them: the tile's own, or ``vector_coords`` in a ``vector_scratch`` tile."""
    cs = wg.coords(op, layout)
    return cs if tuple(held.shape) == shape else vector_coords(cs, shape, held.layout)


def _smem_load(wg: _Warpgroup, op: Operation, src: SmemTile) -> np.ndarray:
    """Every thread reads its values where ``src`` keeps them (a 1-D result held in order in a
    ``vector_scratch`` tile at ``vector_coords``)."""
    cs = _held_coords(wg, op, _reg_layout(op, op.result.type), op.result.type.shape, src)
    cs = [np.broadcast_to(c, np.broadcast_shapes(*(np.shape(x) for x in cs))) for c in cs]
    out = wg.cta.smem.read_elements(src.offsets(cs), src.layout.dtype, reader=_who(op, wg))
    return round_to(out, op.result.type.dtype)


def _private(wg: _Warpgroup, tile: SmemTile, layout: Any, dt: Any) -> np.ndarray:
    """Byte addresses of this warpgroup's threads' own copies of their values of ``layout`` in
    ``tile`` (``private_offsets``): ``[128, regs, element bytes]``."""
    eb = elem_bytes(dt)
    offs = private_offsets(layout, eb)
    return tile.base + offs[128 * wg.local + np.arange(128)][..., None] + np.arange(eb)


def _flying(wg: _Warpgroup) -> list[tuple]:
    return [c for grp in [*wg.copy_groups, wg.copies] for c in grp]


def _share_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the byte addresses ``a`` and ``b`` have one in common: a ring's stages lie apart,
    so their ranges answer at once; ranges that meet are compared byte by byte."""
    if a.size == 0 or b.size == 0 or a.max() < b.min() or b.max() < a.min():
        return False
    lo = min(a.min(), b.min())
    mark = np.zeros(max(a.max(), b.max()) - lo + 1, bool)
    mark[a - lo] = True
    return bool(mark[b - lo].any())


def _async_load(wg: _Warpgroup, op: Operation, tensor: np.ndarray, dst: SmemTile, *offsets: Any) -> None:
    """The copy reads the tensor now (the kernel never writes it, so any time before the wait
    reads the same values) and lands at the ``hopper.async_wait`` that covers its group.  A copy
    into bytes that an earlier copy still flies into is an error: the hardware does not order
    them."""
    layout, dt = op.reg_layout, op.tensor.type.dtype
    values = _read(wg, op, tensor, offsets, wg.coords(op, layout))
    nbytes = _private(wg, dst, layout, dt)
    for other, _, _, load in _flying(wg):
        if _share_bytes(other, nbytes):
            raise _fault(op, f"copies into shared bytes that {_describe(load)} still copies into: a "
                             f"hopper.async_wait must leave that copy landed first")
    wg.copies.append((nbytes, values, dt, op))


def _async_commit(wg: _Warpgroup, op: Operation) -> None:
    wg.copy_groups.append(wg.copies)
    wg.copies = []


def _copy_owners(wg: _Warpgroup) -> np.ndarray:
    """Per byte of shared memory, the thread whose ``hopper.async_load`` copy landed there last
    (-1: none)."""
    if wg.cta.copy_owner is None:
        wg.cta.copy_owner = np.full(wg.cta.smem.data.size, -1, np.int32)
    return wg.cta.copy_owner


def _async_wait(wg: _Warpgroup, op: Operation) -> Co:
    yield Yield(_describe(op))  # the copies run asynchronously until here: others may run
    done = wg.copy_groups[: max(len(wg.copy_groups) - op.pending, 0)]
    owners = _copy_owners(wg)
    threads = (128 * wg.g + np.arange(128))[:, None, None]
    for grp in done:
        for nbytes, values, dt, load in grp:
            wg.cta.smem.write_elements(nbytes[..., 0], values, dt, writer=_who(load, wg))
            owners[nbytes] = np.broadcast_to(threads, nbytes.shape)
    wg.copy_groups = wg.copy_groups[len(done):]


def _async_read(wg: _Warpgroup, op: Operation, src: SmemTile) -> np.ndarray:
    """Each thread reads its own bytes, where its own copy landed: a copy into them still in
    flight (the hardware would hand back the bytes before it), or bytes another thread's copy
    wrote (``cp.async.wait_group`` waits for the thread's own copies only), is an error."""
    t = op.result.type
    nbytes = _private(wg, src, t.layout, t.dtype)
    for other, _, _, load in _flying(wg):
        if _share_bytes(other, nbytes):
            raise _fault(op, f"reads shared bytes that {_describe(load)} is still copying into: a "
                             f"hopper.async_wait must leave that copy's group landed first")
    owner = _copy_owners(wg)[nbytes]
    mine = (128 * wg.g + np.arange(128))[:, None, None]
    if not np.all(owner == mine):
        bad = np.argwhere(owner != mine)[0]
        who = int(owner[tuple(bad)])
        whose = "no copy" if who < 0 else f"thread {who}'s copy"
        raise _fault(op, f"thread {128 * wg.g + int(bad[0])} reads shared bytes that {whose} put there: a thread "
                         f"reads back only what its own hopper.async_load copied (the copy's layout must be the "
                         f"read's)")
    out = wg.cta.smem.read_elements(nbytes[..., 0], t.dtype, reader=_who(op, wg))
    return round_to(out, t.dtype)


def _smem_copy(wg: _Warpgroup, op: Operation, src: SmemTile, dst: SmemTile) -> None:
    """This warpgroup's threads' blocks of the transposing copy (``transpose_copy_block``), each
    element read where ``src`` keeps it and written where ``dst`` does (generic proxy)."""
    lay = dst.layout
    if (src.layout.rows, src.layout.cols) != (lay.cols, lay.rows) or lay.elem_bytes != 1:
        raise _fault(op, f"copies an 8-bit tile into a transposed one, not {src.layout} -> {lay}")
    per = transpose_copy_blocks(lay.rows, lay.cols, wg.threads)
    t = 128 * wg.local + np.arange(128)[:, None, None, None]
    r = np.arange(per)[None, :, None, None]
    v = np.arange(TRANSPOSE_BLOCK)[None, None, :, None]
    u = np.arange(TRANSPOSE_BLOCK)[None, None, None, :]
    row0, col0 = transpose_copy_block(lay.rows, lay.cols, wg.threads, t, r)
    n, k = np.broadcast_arrays(row0 + v, col0 + u)  # stored (rows x cols) = (N, K); the tile is K x N
    moves = np.broadcast_to((r < per - 1) | (t < transpose_copy_last(lay.rows, lay.cols, wg.threads)), n.shape)
    n, k = n[moves], k[moves]  # the last round's threads past the blocks move none
    if lay.kperm:
        k = a8_logical_col(k)  # stored column k holds this column of the tile
    who = _who(op, wg)
    vals = wg.cta.smem.read_elements(src.base + src.layout.offset(k, n), lay.dtype, reader=who)
    wg.cta.smem.write_elements(dst.base + lay.offset(n, k), vals, lay.dtype, writer=who)


def _fence_proxy_async(wg: _Warpgroup, op: Operation) -> None:
    wg.cta.smem.fence_proxy_async()


def _tensor_map(wg: _Warpgroup, op: Operation, tensor: np.ndarray, lay: Any) -> list:
    """The box of the tensor map a TMA op names, checked against the op's tensor and shared
    layout and against what cuTensorMapEncodeTiled accepts."""
    kernel = wg.cta.kernel
    maps = kernel.tma_maps or []
    if not 0 <= op.map < len(maps):
        raise _fault(op, f"names tensor map {op.map}, but the kernel has {len(maps)}")
    param, box, swz = maps[op.map]
    arg = tensor_param(op.tensor)  # a peer's copy (x.on(r)) is copied through x's map of rank r
    if not isinstance(arg, BlockArgument) or arg.block is not kernel.regions[0].block or arg.index != param:
        raise _fault(op, f"tensor map {op.map} describes parameter {param}, not this op's tensor")
    want = tma_map_box(op.box, lay)
    if list(box) != want or swz != lay.swizzle:
        raise _fault(op, f"tensor map {op.map} has box {list(box)} and swizzle {swz}, but {lay} "
                         f"needs box {want} and swizzle {lay.swizzle}")
    eb = lay.elem_bytes
    strides = [eb * int(np.prod(tensor.shape[a + 1:])) for a in range(tensor.ndim - 1)]
    if any(st % 16 for st in strides):
        raise _fault(op, f"a {tensor.shape} tensor has byte strides {strides}; TMA needs outer strides "
                         f"that are multiples of 16 bytes (cuTensorMapEncodeTiled rejects others): pad its "
                         f"last axis, or compile with the pin tma=False (-D tma=false) to load it without TMA")
    return box


class _Plane(NamedTuple):
    """Where a TMA copy's boxes move in its tensor: the row axis and last axis at the copy's
    other offsets (``index``, slices on those two axes), or None when an offset on another axis
    is outside the tensor (the whole box is: zeros loaded, nothing stored), and the copy's
    (column, row) origin and its map's (columns, rows) box."""

    index: tuple | None
    origin: tuple[int, int]
    box: tuple[int, int]


def _plane(op: Operation, tensor: np.ndarray, offsets: Sequence[Any], box: list, elem_bytes: int) -> _Plane:
    r, last = tma_row_axis(op.box), tensor.ndim - 1
    offs = [int(o) for o in offsets]
    if offs[last] * elem_bytes % 16:
        # The GPU stops such a copy with an illegal instruction (H200, benchmarks/RESULTS.md).
        raise _fault(op, f"copies from column {offs[last]} of the last axis, {offs[last] * elem_bytes} bytes into "
                         f"the row; a TMA copy starts at a multiple of 16 bytes (lower-to-hopper copies by TMA "
                         f"only where the column is known to be one)")
    inside = all(0 <= offs[a] < tensor.shape[a] for a in range(tensor.ndim) if a not in (r, last))
    index = tuple(slice(None) if a in (r, last) else offs[a] for a in range(tensor.ndim)) if inside else None
    return _Plane(index, (offs[last], offs[r]), (box[last], box[r]))


def _tile_region(op: Operation, at: _Plane, tensor: np.ndarray, lay: SharedLayout) -> tuple:
    """The elements of ``tensor`` a TMA copy's whole tile covers (an int or a slice per axis,
    clipped to the tensor); ``at.index`` is not None."""
    region = list(at.index)
    rows, cols = (1, lay.rows * lay.cols) if is_vector_box(op.box, lay) else (lay.rows, lay.cols)
    for a, o, n in ((tma_row_axis(op.box), at.origin[1], rows), (tensor.ndim - 1, at.origin[0], cols)):
        region[a] = slice(max(o, 0), max(min(o + n, tensor.shape[a]), 0))
    return tuple(region)


def _tma_load(wg: _Warpgroup, op: Operation, tensor: np.ndarray, dst: SmemTile, bar: MBarrier,
              *offsets: Any) -> None:
    lay = dst.layout
    at = _plane(op, tensor, offsets, _tensor_map(wg, op, tensor, lay), lay.elem_bytes)
    r = tma_row_axis(op.box)
    # The whole box outside the tensor: TMA fills it with zeros.
    plane = tensor[at.index] if at.index is not None else np.zeros((tensor.shape[r], tensor.shape[-1]), tensor.dtype)
    if at.index is not None and wg.cta.launch is not None:
        region = _tile_region(op, at, tensor, lay)
        wg.cta.launch.check_read(tensor, region)
        if wg.leader:  # thread 0 issues the copy
            wg.cta.launch.read(wg, op, tensor, region)
    elif at.index is not None and wg.cta.flying:
        _landed(wg, op, tensor, _tile_region(op, at, tensor, lay))
    n = op.attributes.get("multicast") or 1
    if op.attributes.get("pair"):  # into this CTA, its bytes on the pair's even CTA's barrier
        bar = wg.cta.in_even(bar)
    if n == 1:
        tma_load(plane, at.origin, at.box, lay, wg.cta.smem, dst.base, bar, op=_who(op, wg), license=wg.license)
        return
    # Multicast: this CTA's share of the boxes into every CTA of the cluster.  Its peers
    # issue the same copy (their k-th issue of this op) at the same coordinates and offsets,
    # or each CTA would receive a tile put together from different places.
    cta = wg.cta
    k = cta.issued.get(op, 0)
    cta.issued[op] = k + 1
    mine = (tuple(int(o) for o in offsets), dst.base, cta.offset_of(bar))
    other = cta.cluster_state.setdefault(("multicast", op, k), (cta.rank, mine))
    if other[1] != mine:
        raise _fault(op, f"CTA rank {cta.rank} multicasts copy {k} of this op with offsets {list(mine[0])} into "
                         f"{dst.name} at {mine[1]:#x}, but CTA rank {other[0]} issued it with offsets "
                         f"{list(other[1][0])} at {other[1][1]:#x}: a multicast copy is the same in every CTA")
    count = lay.tma_box().count
    tma_load(plane, at.origin, at.box, lay, [c.smem for c in cta.peers], dst.base,
             cta.in_peers(bar), op=_who(op, wg), boxes=range(cta.rank, count[0] * count[1], n), license=wg.license)


def _tma_store(wg: _Warpgroup, op: Operation, tensor: np.ndarray, src: SmemTile, *offsets: Any) -> Co:
    """``hopper.tma_store``: fence, synchronize, and thread 0 copies the tile out.  The copy
    lands at once, but the tile stays leased to it until a ``hopper.tma_store_wait``: a
    write to it before then is a race."""
    wg.cta.smem.fence_proxy_async()
    yield from wg.bar_sync(op)
    if not wg.leader:
        return
    lay = src.layout
    at = _plane(op, tensor, offsets, _tensor_map(wg, op, tensor, lay), lay.elem_bytes)
    who = _who(op, wg)
    if at.index is not None:  # else the whole box is outside: nothing written
        written = _tile_region(op, at, tensor, lay)
        add = op.attributes.get("reduce") == "add"
        _log_write(wg, op, tensor, written, atomic=add)
        tma_store(wg.cta.smem, src.base, lay, tensor[at.index], at.origin, at.box, op=who, add=add)
        if wg.cta.launch is not None:  # in flight until the role's next release
            wg.cta.launch.store(wg, op, tensor, written)
        else:  # in flight until the program ends
            wg.cta.flying.append((id(tensor), ranks.box_of(written), op))
    wg.cta.written.add(id(tensor))
    wg.bulk.append(wg.cta.smem.begin_read(src.base, lay.size_bytes, reader=who))


def _tma_store_wait(wg: _Warpgroup, op: Operation) -> Co:
    """``cp.async.bulk.wait_group.read pending`` by thread 0, then a barrier of the threads
    (none with ``sync = false``: the next op's barrier is the meeting)."""
    if wg.leader:
        yield Yield(_describe(op))  # the copies run asynchronously until here: others may run
        done = wg.bulk[: max(len(wg.bulk) - op.pending, 0)]
        for lease in done:
            lease.release()
        wg.bulk = wg.bulk[len(done):]
    if op.attributes.get("sync", True):
        yield from wg.bar_sync(op)


# ------------------------------------------------------------------ waits
def _barrier(wg: _Warpgroup, op: Operation) -> Co:
    yield from wg.bar_sync(op, op.id)


def _sync(wg: _Warpgroup, op: Operation) -> Co:
    yield from wg.bar_sync(op)


def _turn(wg: _Warpgroup, op: Operation) -> Co:
    """``hopper.turn`` (docs/hopper.md): warpgroup ``g`` of the role waits on turn barrier
    ``g`` and passes on ``1 - g``."""
    g, role = wg.local, wg.role_op
    if op.kind == "pass" or op.kind == "start" and g == 1:
        wg.cta.arrive_turn(1 - g, role, g, op)
    elif op.kind == "wait" or op.kind == "end" and g == 0:
        bar, parity = wg.cta.arrive_turn(g, role, g, op)
        yield Wait(bar, parity, f"{bar.name} of {_describe(op)}")
        wg.left_behind(op, lambda w: True)  # a bar.sync: every warp of both warpgroups


def _mbarrier_wait(wg: _Warpgroup, op: Operation, bar: MBarrier, parity: Any) -> Co:
    yield Wait(bar, int(parity), _describe(op))
    wg.passed(op, bar)
    # what this warpgroup has seen released: its copies may overwrite what landed before it
    wg.license = max(wg.license, bar.completed_when(wg.waiter))


# ------------------------------------------------------------------ wgmma
def _wgmma(wg: _Warpgroup, op: Operation, a: Any, b: SmemTile, acc: Any) -> _Pending:
    acc_layout = _reg_layout(op, op.acc.type)
    if isinstance(acc, _Pending):
        acc = acc.value  # wgmma chains accumulate in the same registers without a wait
    if not isinstance(acc_layout, WgmmaAccumulator) or acc_layout.threads != wg.threads:
        raise _fault(op, f"accumulator layout {acc_layout} does not span the {wg.threads} threads running it")
    smem = wg.cta.smem
    who = _who(op, wg)
    lb = op.operand_layout("b")
    n = acc_layout.n
    k_per = lb.k_per_step
    leases = [smem.begin_read(b.base, lb.size_bytes, reader=who)]
    if isinstance(a, SmemTile):
        a = replace(a, layout=op.operand_layout("a"))
        la = a.layout
        leases.append(smem.begin_read(a.base, la.size_bytes, reader=who))
        steps = la.k_steps
    else:
        a_layout = _reg_layout(op, op.a.type)
        if not isinstance(a_layout, (WgmmaOperandA, WgmmaOperandA8)):
            raise _fault(op, f"A in registers must be #wgmma_a or #wgmma_a8, got {a_layout}")
        steps = a_layout.k_steps
    if steps != lb.k_steps:
        raise _fault(op, f"A has {steps} K steps, B {lb.k_steps}")
    out = np.array(acc, np.float32)  # a new value: SSA operands are never changed in place
    slices, per = acc_layout.slices, acc_layout.slice_regs
    for s in range(steps):
        for m in range(slices):  # slice m of this warpgroup: rows 64 (slices g + m) on, its own registers
            if isinstance(a, SmemTile):
                a_in: int | np.ndarray = a.layout.descriptor(a.base, s, 64 * (slices * wg.local + m))
                trans_a = a.layout.major == "mn"
            elif isinstance(a_layout, WgmmaOperandA8):  # bytes in register order: 4 r + b
                a_in, trans_a = np.ascontiguousarray(a[:, np.ravel(a_layout.step_values(s, m))]), False
            else:
                regs = [2 * r + h for r in a_layout.step_registers(s, m) for h in (0, 1)]
                a_in, trans_a = np.ascontiguousarray(a[:, regs]), False
            wgmma(out[:, m * per:(m + 1) * per], smem, a_in, lb.descriptor(b.base, s, 0), n=n, k=k_per,
                  dtype=op.a.type.dtype, dtype_b=lb.dtype, trans_a=trans_a, trans_b=lb.major == "mn", op=who)
    group = _Group(op, leases, None if isinstance(a, SmemTile) else op.a)
    wg.groups.append(group)
    wg.committed += 1
    return _Pending(out, op, group)


def _wait_group(wg: _Warpgroup, op: Operation) -> Co:
    """``wgmma.wait_group pending``: every group of this warpgroup but the newest ``pending``
    completes and stops reading its shared tiles."""
    yield Yield(_describe(op))  # the wgmmas run asynchronously until here: others may run
    live = [grp for grp in wg.groups if not grp.done]
    finished = live[: max(len(live) - op.pending, 0)]
    for grp in finished:
        grp.done = True
        for lease in grp.leases:
            lease.release()
    wg.groups = [grp for grp in wg.groups if not grp.done]
    # A wgmma completes only once all four warps have issued it: those committed after a wait
    # bring every warp past that wait.
    wg.completed += len(finished)
    wg.left_behind(op, lambda w: w.committed < wg.completed)


def _wgmma_wait(wg: _Warpgroup, op: Operation, x: Any) -> Co:
    yield from _wait_group(wg, op)
    if isinstance(x, _Pending):
        if not x.group.done:
            raise _fault(op, f"waits with pending = {op.pending}, which leaves {_describe(x.op)} in flight")
        return x.value
    return x


_HANDLERS: dict[str, Callable[..., Any]] = {
    "tile.masked_store": _masked_store,
    "tile.gather": _gather,
    "tile.atomic": _atomic,
    "tile.atomic_cas": _atomic,
    "tile.grid": lambda wg, op, *extents: None,
    "tile.dim": lambda wg, op, t: np.asarray(t.shape[op.axis], np.int32),
    "tile.program_id": _program_id,
    "tile.num_programs": _num_programs,
    # The SM count the interpreter pretends to have, so a persistent kernel's programs walk the
    # same tiles in both (and each walks several: the ring carries over from tile to tile).
    "tile.num_sms": lambda wg, op: np.asarray(semantics.CPU_SMS, np.int32),
    "tile.expand_dims": _expand_dims,
    "tile.broadcast": _broadcast,
    "tile.reshape": _reshape,
    "tile.take": _take,
    "tile.stack": _stack,
    "tile.transpose": _transpose,
    "hopper.load": _load,
    "hopper.store": _store,
    "hopper.smem_alloc": _smem_alloc,
    "hopper.mbarrier_alloc": _mbarrier_alloc,
    "hopper.mbarrier_init": _mbarrier_init,
    "hopper.stage": _stage,
    "hopper.mbarrier_arrive": _mbarrier_arrive,
    "hopper.fence_mbarrier_init": lambda wg, op: None,
    # A hint to L2: it moves no value the emulator models.
    "hopper.prefetch": lambda wg, op, *operands: None,
    "hopper.expect_tx": _expect_tx,
    "hopper.tma_load": _tma_load,
    "hopper.smem_store": _smem_store,
    "hopper.smem_copy": _smem_copy,
    "hopper.smem_load": _smem_load,
    "hopper.async_load": _async_load,
    "hopper.async_commit": _async_commit,
    "hopper.async_read": _async_read,
    "hopper.fence_proxy_async": _fence_proxy_async,
    "hopper.wgmma": _wgmma,
}

_CO_HANDLERS: dict[str, Callable[..., Co]] = {
    "hopper.async_wait": _async_wait,
    "hopper.atomic_fetch": _atomic_fetch,
    "tile.for": _for,
    "tile.if": _if,
    "hopper.role": _role,
    "hopper.barrier": _barrier,
    "hopper.sync": _sync,
    "hopper.turn": _turn,
    "hopper.tma_store": _tma_store,
    "hopper.tma_store_wait": _tma_store_wait,
    "hopper.mbarrier_wait": _mbarrier_wait,
    "hopper.cluster_barrier": _cluster_barrier,
    "hopper.cluster_reduce": _cluster_reduce,
    "hopper.wgmma_wait": _wgmma_wait,
    "hopper.wgmma_wait_group": _wait_group,
    "hopper.convert_layout": _convert_layout,
    "hopper.reduce": _reduce,
    "hopper.reduce_group": _reduce_group,
    "hopper.scan": _scan,
}

# The blackwell dialect's ops: tensor memory and tcgen05 (tkc/emulator/tmem.py).
_HANDLERS.update(tmem.HANDLERS)
_CO_HANDLERS.update(tmem.CO_HANDLERS)

# The CTAs of a multi-GPU launch (``emulate_ranks``) also run the rank ops, and atomics that
# release on one element as the lowering issues them (tkc/emulator/ranks.py).
_RANK_HANDLERS = {**_HANDLERS, **ranks.HANDLERS}
_RANK_CO_HANDLERS = {**_CO_HANDLERS, **ranks.CO_HANDLERS,
                     "tile.atomic": ranks.releasing(_atomic, co=False),
                     "tile.atomic_cas": ranks.releasing(_atomic, co=False),
                     "hopper.atomic_fetch": ranks.releasing(_atomic_fetch, co=True)}


# ------------------------------------------------------------------ launching
def emulate(kernel: Module | Operation, args: Sequence[Any], grid: Any = None, seed: int = 0) -> None:
    """Run a hopper-level ``kernel`` (after allocate-smem) over ``grid`` (default: its
    ``tile.grid``), writing outputs in place into the tensors of ``args``.

    Arguments are bound as the interpreter binds them (``tkc.interpreter.bind_arguments``):
    numpy arrays in storage form or torch CPU tensors, rounded to their dtype on entry; scalars
    as python or numpy numbers.  ``seed`` picks the interleaving of warpgroups inside each CTA
    (CTA ``k`` in row-major order runs with ``seed + k``).  A multi-GPU kernel runs as rank 0
    of 1 (:func:`emulate_ranks`).
    """
    kernel = as_kernel(kernel)
    if uses_ranks(kernel):
        emulate_ranks(kernel, [args], grid, seed)
        return
    params = kernel.regions[0].block.args
    env, working = bind_arguments(kernel, args)
    written: set[int] = set()
    log = WriteLog(tensor_names(params, env))
    with np.errstate(all="ignore"):
        shape = eval_grid(kernel, dict(env)) if grid is None else check_grid(grid, kernel)
        cluster = kernel.cluster or 1
        if shape[0] % cluster:
            raise TkcEmulatorError(f"kernel @{kernel.sym_name} runs in clusters of {cluster} CTAs along x: its "
                                   f"grid {shape} must have a multiple of {cluster} there", kernel.loc)
        try:
            pids = list(itertools.product(*(range(n) for n in shape)))
            # product() varies x slowest; a cluster is ``cluster`` CTAs consecutive in x, so
            # go cluster by cluster (the other axes, then x within it).
            pids.sort(key=lambda p: (p[0] // cluster, *p[1:], p[0]))
            for k in range(0, len(pids), cluster):
                group = pids[k:k + cluster]
                ctas: list[_CTA] = []
                try:
                    for pid in group:
                        ctas.append(_CTA(kernel, pid, shape, env, written, log))
                    _run_cluster(ctas, seed + k)
                except TkcEmulatorError as e:
                    where = next((c for c in ctas if c.fault_loc is not None), ctas[-1] if ctas else None)
                    loc = e.loc or (where.fault_loc if where is not None else None)
                    who = f"CTA {group[0]}" if cluster == 1 else f"cluster of CTAs {group}"
                    raise type(e)(f"{who}: {e.message}", loc) from e
        finally:
            write_back(params, args, working, written)


def emulate_ranks(kernel: Module | Operation, rank_args: Sequence[Sequence[Any]], grid: Any = None,
                  seed: int = 0) -> None:
    """Run a multi-GPU hopper-level ``kernel`` on ``len(rank_args)`` simulated ranks, rank
    ``r`` on the arguments ``rank_args[r]`` (as :func:`emulate` takes them), writing every
    rank's outputs in place.  Every CTA of every rank is live at once: their warpgroups run
    in one scheduler, interleaved in an order ``seed`` picks, so a CTA's waits for its peers
    are met as on the GPU (tkc/emulator/ranks.py); a launch that cannot finish is an error
    naming every waiting warpgroup with its rank, CTA, role and line."""
    from tkc.ranks import check_launch, check_own_memory

    kernel = as_kernel(kernel)
    params = kernel.regions[0].block.args
    check_own_memory(params, rank_args)
    bound = [bind_arguments(kernel, args) for args in rank_args]
    envs = [env for env, _ in bound]
    written: set[int] = set()
    try:
        with np.errstate(all="ignore"):
            shape = check_launch(kernel, envs, grid)
            cluster = kernel.cluster or 1
            if shape[0] % cluster:
                raise TkcEmulatorError(f"kernel @{kernel.sym_name} runs in clusters of {cluster} CTAs along x: its "
                                       f"grid {shape} must have a multiple of {cluster} there", kernel.loc)
            names = {id(env[p]): (param_name(p), r) for r, env in enumerate(envs) for p in params
                     if isinstance(p.type, TensorType)}
            pids = list(itertools.product(*(range(n) for n in shape)))
            pids.sort(key=lambda p: (p[0] // cluster, *p[1:], p[0]))
            launch = ranks.RankLaunch(kernel, envs, names, [(r, pid) for r in range(len(envs)) for pid in pids])
            ctas: list[_CTA] = []
            for r, env in enumerate(envs):
                for k in range(0, len(pids), cluster):
                    group = [_CTA(kernel, pid, shape, env, written, launch.log) for pid in pids[k:k + cluster]]
                    _join_cluster(group)
                    for cta in group:
                        cta.launch, cta.gpu, cta.who = launch, r, launch.index[(r, cta.pid)]
                        cta.handlers, cta.co_handlers = _RANK_HANDLERS, _RANK_CO_HANDLERS
                    ctas += group
            _run_ranks(launch, ctas, seed)
    finally:
        for (_, working), args in zip(bound, rank_args):
            write_back(params, args, working, written)


def _run_ranks(launch: ranks.RankLaunch, ctas: list[_CTA], seed: int) -> None:
    """Run every warpgroup of ``ctas`` (all ranks') interleaved."""
    warpgroups = []
    for cta in ctas:
        for g in range(cta.warpgroups):
            wg = _Warpgroup(cta, g)
            wg.waiter = launch.labels[wg] = f"rank {cta.gpu} CTA {cta.pid} {cta.name(g)}"
            warpgroups.append(wg)

    def role(wg: _Warpgroup) -> Co:
        yield from wg.run()
        launch.finished.add(wg)

    try:
        run([(launch.labels[wg], role(wg)) for wg in warpgroups], seed, stuck=launch.stuck,
            max_steps=1_000_000 * len(ctas))
        for wg in warpgroups:
            wg.left_behind(None, lambda w: True)
        launch.landed()
    except TkcEmulatorError as e:
        loc = e.loc or next((c.fault_loc for c in ctas if c.fault_loc is not None), None)
        raise type(e)(e.message, loc) from e


def emulate_module(module: Module, kernel_name: str | None = None, args: Sequence[Any] | None = None,
                   grid: Any = None, dims: dict[str, int] | None = None, seed: int = 0) -> list[Any]:
    """Run one kernel of ``module`` (random arguments from ``dims`` when ``args`` is None, as
    ``tkc.interpreter.interpret_module``) and return the arguments, outputs written."""
    kernel = module.kernel(kernel_name)
    if args is None:
        args = random_args(kernel, dims or {}, seed)
    emulate(kernel, args, grid, seed)
    return list(args)
