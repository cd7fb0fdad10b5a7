"""Several ranks in one process: the interpreter's multi-GPU launch.

A multi-GPU kernel (:func:`tkc.ir.dialects.tile.uses_ranks`) runs on R ranks, one GPU each;
every rank runs the kernel's grid of programs on its own arguments, and tensors declared
``@ ranks`` exist on every rank, with peers' copies reached through ``x.on(r)``
(``tile.peer``).  Here every program of every rank is a thread, but only one runs at a time:
a scheduler seeded by ``seed`` picks which program goes next wherever programs synchronize (an
atomic, a ``wait``, a ``barrier_all()``), so a run is deterministic for its seed and other seeds
interleave the ranks differently; the race detector does not depend on the order.  A program waiting for a flag
runs again only once the flag's condition holds; when no program can run and some have not
finished, that is a deadlock (or a wait that can never be satisfied), reported with every
waiting program's rank, id and line.  Every load, store and atomic goes through
:class:`tkc.races.HappensBefore`, which reports accesses of two programs that no chain of
release and acquire operations orders (whatever order this seed happened to run them in).

Owns: the meaning of ``tile.peer``, ``tile.wait`` and ``tile.rank_barrier``, and the scheduler.
Must not: change how a kernel without ranks runs (``tkc.interpreter.run_kernel`` hands only
multi-GPU kernels to ``tkc.interpreter.run_ranks``, which binds each rank's arguments, calls
:func:`run_programs` and writes the outputs back).
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tkc.errors import Loc, TkcInterpretError, TkcLaunchError, TkcUnsupportedError
from tkc.grid import check_grid, eval_grid, param_name
from tkc.ir.core import Operation
from tkc.ir.dialects import tile
from tkc.ir.types import TensorType
from tkc.races import HappensBefore
from tkc.signature import shares_memory
from tkc.frontend.emit import CMP_PREDS
from tkc.semantics import _CMP as semantics_cmp
from tkc.semantics import Program, _box_slices, gather_elements

__all__ = ["check_launch", "flag_params", "run_programs", "out_of_range", "flag_state", "deadlock", "never_satisfied",
           "barrier_count"]

_SHOWN = {pred: op for op, pred in CMP_PREDS.items()}  # "ge" -> ">=", in messages


# The protocol's messages, shared with the emulator's ranks (tkc/emulator/ranks.py).
def out_of_range(r: int, num_ranks: int) -> str:
    many = "s" if num_ranks > 1 else ""
    return f"rank {r} is out of range: the launch has {num_ranks} rank{many} (0..{num_ranks - 1})"


def flag_state(name: str, element: Sequence[int], pred: str, want: int, now: int) -> str:
    """What a wait waits for: ``flags[0, 1] >= 1 (it is 0)``."""
    return f"{name}[{', '.join(map(str, element))}] {_SHOWN[pred]} {want} (it is {now})"


def deadlock(lines: Sequence[str]) -> str:
    return ("deadlock across ranks: every program that has not finished waits, for one that cannot go on:\n" +
            "\n".join(f"  {line}" for line in lines))


def never_satisfied(what: str) -> str:
    return f"a wait that can never be satisfied: {what}, and every other program has finished"


def barrier_count(waiting: str, lines: Sequence[int], gone: Sequence[tuple[str, Sequence[int]]]) -> str:
    """A barrier some program of the same id on another rank finished without reaching:
    ``waiting`` is at its barrier ``len(lines)``, each of ``gone`` met only the barriers at
    its ``lines``."""
    def met(seen: Sequence[int]) -> str:
        if not seen:
            return "none"
        return f"{len(seen)} (line{'s' if len(seen) > 1 else ''} {', '.join(map(str, seen))})"

    return (f"ranks meet barrier_all() a different number of times: {waiting} waits at its barrier "
            f"{len(lines)} (line {lines[-1]}), but " +
            ", ".join(f"{name} has finished after meeting {met(seen)}" for name, seen in gone) +
            "; every rank must meet every barrier_all() equally often (an if or a loop around one goes "
            "differently on these ranks: a scalar argument or a dim that differs across ranks?)")


class _Aborted(BaseException):
    """Raised in a program's thread when the launch stops (another program failed)."""


@dataclass(eq=False)
class _Task:
    """One program of one rank, and where it stands."""

    index: int
    rank: int
    pid: tuple[int, ...]
    ctx: Any = None
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    thread: threading.Thread | None = None
    ready: Callable[[], bool] | None = None  # while paused at a wait or a barrier: whether it may go on
    waits_for: Callable[[], str] | None = None  # ... and what it waits for, for a deadlock's message
    loc: Loc | None = None
    met: list[int] = field(default_factory=list)  # the line of each barrier it has reached
    at_barrier: list[_Task] | None = None  # while paused at a barrier: who has arrived there
    done: bool = False
    error: BaseException | None = None

    @property
    def name(self) -> str:
        return f"rank {self.rank} program {self.pid}"


class _Scheduler:
    """Runs the programs one at a time: the program that pauses picks the next at random among
    those that can go (itself included) and hands it the baton, so a switch is one handoff."""

    def __init__(self, tasks: list[_Task], seed: int):
        self.tasks = tasks
        self.rng = random.Random(seed)
        self.over = threading.Semaphore(0)  # released once every program has finished, or one failed
        self.failure: BaseException | None = None
        self.aborted = False
        self.arrived: dict[tuple[tuple[int, ...], int], list[_Task]] = {}  # (pid, k) -> its k-th barrier's
        self.body: Callable[[_Task], None] = lambda t: None

    def run(self, body: Callable[[_Task], None]) -> None:
        self.body = body
        try:
            first = self._pick()
            if first is not None:
                self._resume(first)
                self.over.acquire()
            if self.failure is not None:
                raise self.failure
        finally:
            self._stop()

    def _pick(self) -> _Task | None:
        """The next program to run (None once all have finished); a deadlock is an error."""
        live = [t for t in self.tasks if not t.done]
        if not live:
            return None
        ready = [t for t in live if t.ready is None or t.ready()]
        if not ready:
            raise self._stuck(live)
        t = ready[self.rng.randrange(len(ready))]
        t.ready = t.waits_for = t.at_barrier = None
        return t

    def _resume(self, t: _Task) -> None:
        if t.thread is None:
            t.thread = threading.Thread(target=self._main, args=(t,), daemon=True)
            t.thread.start()
        else:
            t.go.release()

    def _hand_on(self, me: _Task) -> bool:
        """Pick the next program and start it: whether that is ``me`` (which then just goes on)."""
        try:
            t = self._pick()
        except TkcInterpretError as e:
            self.failure = e
            t = None
        if t is me:
            return True
        if t is None:
            self.over.release()  # every program has finished, or the launch is stuck
        else:
            self._resume(t)
        return False

    def _main(self, t: _Task) -> None:
        try:
            self.body(t)
        except _Aborted:
            return
        except BaseException as e:  # handed to the scheduler's thread, which raises it
            t.done = True
            self.failure = e
            self.over.release()
            return
        t.done = True
        self._hand_on(t)

    def pause(self, t: _Task, ready: Callable[[], bool] | None = None, waits_for: Callable[[], str] | None = None,
              loc: Loc | None = None) -> None:
        """Called by ``t``'s thread: let the next program run (``t`` goes on once ``ready()``
        holds and it is picked)."""
        t.ready, t.waits_for, t.loc = ready, waits_for, loc
        if self._hand_on(t):
            return
        t.go.acquire()
        if self.aborted:
            raise _Aborted()

    def _stop(self) -> None:
        self.aborted = True
        for t in self.tasks:
            if t.thread is not None and not t.done:
                t.go.release()
        for t in self.tasks:
            if t.thread is not None:
                t.thread.join()

    def _stuck(self, live: list[_Task]) -> TkcInterpretError:
        for t in live:  # a barrier a peer finished without: the cause of whatever else waits
            if t.at_barrier is not None:
                here = {a.rank for a in t.at_barrier}
                gone = [o for o in self.tasks if o.pid == t.pid and o.rank not in here and o.done]
                if gone:
                    return TkcInterpretError(barrier_count(t.name, t.met, [(o.name, o.met) for o in gone]), t.loc)
        first = live[0]
        if len(live) == 1:
            return TkcInterpretError(never_satisfied(f"{first.name} {first.waits_for()}"), first.loc)
        return TkcInterpretError(deadlock([f"{t.name} {t.waits_for()}" for t in live]), first.loc)


class RankProgram(Program):
    """A program of a multi-GPU launch: its rank, the other ranks' tensors, and the
    scheduler and race detector shared by every program."""

    def __init__(self, task: _Task, sched: _Scheduler, launch: _Launch, env: dict):
        super().__init__(task.pid, launch.grid, env, written=launch.written, log=launch.log, sms=launch.sms,
                         rank=task.rank, num_ranks=launch.num_ranks)
        self.task, self.sched, self.launch = task, sched, launch

    @property
    def who(self) -> Any:
        return self.task.index

    def access(self, op: Operation, tensor: np.ndarray, index: Any, kind: str) -> None:
        msg = self.log.access(tensor, index, self.task.index, op.loc, kind)
        if msg is not None:
            raise TkcInterpretError(msg, op.loc)


@dataclass
class _Launch:
    num_ranks: int
    grid: tuple[int, ...]
    envs: list[dict]
    log: HappensBefore  # the race detector; stores and atomics call its write() as WriteLog's
    written: set[int]  # id() of the tensors stored to, every rank's
    sms: int = 0  # what num_sms() reads (0: the CPU's stand-in)


# ------------------------------------------------------------- the rank ops
def _peer(ctx: RankProgram, op: Operation, tensor: np.ndarray, r: Any) -> list[np.ndarray]:
    r = int(r)
    if not 0 <= r < ctx.num_ranks:
        raise TkcInterpretError(out_of_range(r, ctx.num_ranks), op.loc)
    return [ctx.launch.envs[r][op.tensor]]  # a list: a tensor, not a value _checked by its type


def _wait(ctx: RankProgram, op: Operation, tensor: np.ndarray, value: Any, *offsets: Any) -> None:
    element = tuple(int(o) for o in offsets)
    name, _ = ctx.log.tensors.get(id(tensor), ("a tensor", 0))
    if any(not 0 <= i < n for i, n in zip(element, tensor.shape)):
        raise TkcInterpretError(f"wait() on element {list(element)} of '{name}', outside its shape "
                                f"{list(tensor.shape)}", op.loc)
    want, pred = int(value), op.pred

    def ready() -> bool:
        return bool(semantics_cmp[pred](int(tensor[element]), want))

    def waits_for() -> str:
        return f"waits at line {op.loc.line} for {flag_state(name, element, pred, want, int(tensor[element]))}"

    ctx.sched.pause(ctx.task, ready, waits_for, op.loc)
    ctx.log.acquire(tensor, element, ctx.task.index)


def _barrier(ctx: RankProgram, op: Operation) -> None:
    task, sched = ctx.task, ctx.sched
    key = (task.pid, len(task.met))
    task.met.append(op.loc.line if op.loc is not None else 0)
    arrived = sched.arrived.setdefault(key, [])
    arrived.append(task)
    if len(arrived) == ctx.num_ranks:
        ctx.log.barrier([t.index for t in arrived])

    def waits_for() -> str:
        here = {t.rank for t in arrived}
        others = [t for t in sched.tasks if t.pid == task.pid and t.rank not in here]
        how = "; ".join(f"{t.name} " + ("has finished without reaching it" if t.done else
                                         t.waits_for() if t.waits_for else "has not reached it")
                        for t in others)
        return f"waits at barrier_all() (line {op.loc.line}, its barrier {key[1] + 1}) for {how}"

    task.at_barrier = arrived
    sched.pause(task, lambda: len(arrived) == ctx.num_ranks, waits_for, op.loc)


# ------------------------------------------- memory, checked for data races
def _checked_load(ctx: RankProgram, op: Operation, tensor: np.ndarray, *offsets: Any) -> np.ndarray:
    sl = _box_slices(tensor.shape, offsets, op.box, op.steps)
    if sl is not None:
        ctx.access(op, tensor, sl[0], "read")
    return Program.handlers["tile.load"](ctx, op, tensor, *offsets)


def _checked_gather(ctx: RankProgram, op: Operation, tensor: np.ndarray, index: np.ndarray, *offsets: Any
                    ) -> np.ndarray:
    if tensor.size:
        idx, inb = gather_elements(op, tensor, index, offsets)
        ctx.access(op, tensor, tuple(i[inb] for i in idx), "read")
    return Program.handlers["tile.gather"](ctx, op, tensor, index, *offsets)


def _checked_atomic(ctx: RankProgram, op: Operation, tensor: np.ndarray, *rest: Any) -> Any:
    """An atomic (checked as a write by ``_log_write``), then its ordering: an acquire reads the
    release clocks of the element it read, a release leaves this program's."""
    ctx.sched.pause(ctx.task, loc=op.loc)
    out = Program.handlers[op.name](ctx, op, tensor, *rest)
    sem = op.sem or "relaxed"
    sl = _box_slices(tensor.shape, rest[2 if op.name == "tile.atomic_cas" else 1:], op.box)
    if sl is not None:
        if sem in ("acquire", "acq_rel") and op.results:
            for element in itertools.product(*(range(s.start, s.stop) for s in sl[0])):
                ctx.log.acquire(tensor, element, ctx.task.index)
        if sem in ("release", "acq_rel"):
            ctx.log.release(tensor, sl[0], ctx.task.index)
    return out


RankProgram.handlers = {
    **Program.handlers,
    "tile.peer": _peer,
    "tile.wait": _wait,
    "tile.rank_barrier": _barrier,
    "tile.load": _checked_load,
    "tile.gather": _checked_gather,
    "tile.atomic": _checked_atomic,
    "tile.atomic_cas": _checked_atomic,
}


# ------------------------------------------------------------------ launch
def run_programs(kernel: Operation, envs: list[dict], grid: Any, seed: int, written: set[int], sms: int = 0
                 ) -> None:
    """Run ``kernel``'s programs on ``len(envs)`` ranks, rank ``r`` with its parameters bound
    in ``envs[r]`` (:func:`tkc.interpreter.bind_arguments`), adding the ``id`` of every tensor
    stored to into ``written``.  ``seed`` picks the order the programs of all ranks interleave
    in; ``sms`` is what ``num_sms()`` reads (0: :data:`tkc.semantics.CPU_SMS`).
    :func:`tkc.interpreter.run_ranks` binds the arguments and writes the outputs back."""
    num_ranks = len(envs)
    params = kernel.regions[0].block.args
    shape = check_launch(kernel, envs, grid, sms)
    pids = list(itertools.product(*(range(g) for g in shape)))
    tasks = [_Task(i, r, pid) for i, (r, pid) in enumerate((r, pid) for r in range(num_ranks) for pid in pids)]
    hb = HappensBefore([t.name for t in tasks], [t.rank for t in tasks])
    for r, env in enumerate(envs):
        for p in params:
            if isinstance(p.type, TensorType):
                hb.add_tensor(env[p], param_name(p), r)
    launch = _Launch(num_ranks, shape, envs, hb, written, sms)
    sched = _Scheduler(tasks, seed)
    block = kernel.regions[0].block

    def body(t: _Task) -> None:
        t.ctx = RankProgram(t, sched, launch, dict(envs[t.rank]))
        try:
            t.ctx.run(block)
        except TkcInterpretError as e:
            raise TkcInterpretError(f"{e.message} (in rank {t.rank}, program {t.pid})", e.loc) from e

    with np.errstate(all="ignore"):
        sched.run(body)
    for r in range(num_ranks):
        late = hb.landed(r, [t.index for t in tasks if t.rank == r])
        if late is not None:
            raise TkcInterpretError(*late)


def check_launch(kernel: Operation, envs: list[dict], grid: Any, sms: int = 0) -> tuple[int, ...]:
    """Check a launch on ``len(envs)`` ranks (parameters bound in ``envs``) and return its
    grid: at least one rank, ``@ ranks`` tensors of one shape, the same grid on every rank
    (that no two ranks share memory is :func:`check_own_memory`'s, on the caller's arrays,
    before they are copied into ``envs``)."""
    if len(envs) < 1:
        raise TkcLaunchError("a launch needs at least one rank")
    if tile.has_cluster_reductions(kernel):
        raise TkcUnsupportedError("cluster reductions in a multi-GPU kernel are not supported", kernel.loc)
    params = kernel.regions[0].block.args
    _check_symmetric(params, envs)
    with np.errstate(all="ignore"):
        grids = [eval_grid(kernel, dict(env), sms) if grid is None else check_grid(grid, kernel) for env in envs]
    if any(g != grids[0] for g in grids):
        raise TkcLaunchError(f"every rank launches the same grid; the ranks' arguments give {grids}")
    return grids[0]


def flag_params(kernel: Operation) -> list[Any]:
    """The tensor parameters used as flags: waited on, or signalled (an atomic on one element
    with release ordering).  ``tkc run`` starts them at zero, as symmetric memory's signal pads
    are."""
    flags: list[Any] = []
    for op in kernel.walk():
        one = op.name == "tile.wait" or tile.is_atomic(op) and op.name.startswith("tile.") and \
            (op.attributes.get("sem") or "relaxed") in ("release", "acq_rel") and \
            len(op.attributes.get("squeeze") or []) == len(op.attributes["box"])
        if one:
            t = op.operands[0]
            t = t.owner.operands[0] if tile.is_peer(t) else t
            if t not in flags:
                flags.append(t)
    return flags


def check_own_memory(params: Sequence[Any], rank_args: Sequence[Sequence[Any]]) -> None:
    """Every rank has memory of its own: no tensor argument of one rank shares memory with one
    of another (a numpy view of it, the same torch tensor): the executors copy each rank's
    arguments, so ranks sharing memory would each see their own copy and the last write back
    would win, silently."""
    seen: list[tuple[int, str, Any]] = []
    for r, args in enumerate(rank_args):
        for p, a in zip(params, args):
            if not isinstance(p.type, TensorType):
                continue
            for r2, name2, b in seen:
                if r2 != r and shares_memory(a, b):
                    raise TkcLaunchError(f"'{p.name_hint}' of rank {r} shares memory with '{name2}' of rank {r2}; "
                                         f"every rank has memory of its own (pass a copy per rank)")
            seen.append((r, p.name_hint, a))


def _check_symmetric(params: Sequence[Any], envs: list[dict]) -> None:
    """A tensor ``@ ranks`` has the same shape on every rank (symmetric memory)."""
    for p in params:
        if isinstance(p.type, TensorType) and p.type.ranks:
            shapes = [tuple(env[p].shape) for env in envs]
            if any(s != shapes[0] for s in shapes):
                got = ", ".join(f"rank {r}: {list(s)}" for r, s in enumerate(shapes))
                raise TkcLaunchError(f"'{p.name_hint}' is a tensor on every rank (@ ranks): every rank passes the "
                                     f"same shape, got {got}")
