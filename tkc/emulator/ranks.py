"""Several ranks in one emulation: a multi-GPU kernel's hopper IR on R simulated GPUs.

The ranks' ops stay tile ops in hopper IR (docs/hopper.md §4 "Ranks", docs/ranks.md); this
module gives them the meaning the lowered kernel has on the GPU:

- ``tile.rank`` / ``tile.num_ranks``: the CTA's rank and the launch's rank count;
  ``tile.peer``: rank ``r``'s copy of a ``@ ranks`` tensor (its array; a TMA copy of it is
  checked against its parameter's map), a rank out of range an error at the op.
- ``tile.wait``: thread 0 of the role (or CTA) spins until the local flag compares true (the
  scheduler's ``Until``), then the role's threads meet (``bar.sync``).
- ``tile.rank_barrier``: the role's threads meet, its thread 0 arrives for the role, spins
  until every role of the program with the same program id on every rank has arrived at its
  barrier of the same count (the lowering's counters on the pads, modelled directly), and
  the role's threads meet again.
- a releasing atomic on one element (``signal``) or a barrier first completes the TMA stores
  of the role's thread 0 (``cp.async.bulk.wait_group 0``) and lets the role's threads meet, as
  ``lower_ranks.before_release`` does; until then a TMA store's global writes are *in
  flight*: any load, gather or TMA load of those elements is an error naming both ops.
- every global access of the lowered kernel (loads, gathers and TMA copies as reads; stores,
  atomics and TMA stores as writes) goes through the interpreter's race detector
  (``tkc.races.HappensBefore``) with a CTA as its program: a wait acquires the flag, a releasing
  atomic releases its element, a barrier across ranks joins the CTAs of one program id on
  every rank.  So a read of a peer's tile that no wait orders after the peer's write (a copy a
  pipelined loop issued ahead of the wait that guards it) is an error naming both CTAs and
  lines, whichever came first in the run, as it is in the interpreter; and so is a write into
  a rank that none of its CTAs waits for before the launch ends.

Every program of every rank is live from the start (``machine.emulate_ranks`` runs all their
warpgroups in one scheduler), as in the interpreter.  When none can go on, the error lists
every waiting warpgroup with its rank, CTA, role and line (``stuck``), in the interpreter's
words (``tkc.ranks``).

Must not: change how a kernel of one GPU runs (``machine.emulate`` hands only multi-GPU
kernels to ``emulate_ranks``, whose CTAs alone use these handlers).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from tkc.emulator.scheduler import DeadlockError, Until, Wait
from tkc.errors import TkcEmulatorError
from tkc.ir.core import Operation
from tkc.ir.dialects.tile import atomic_kind
from tkc.ir.types import ScalarType
from tkc.races import HappensBefore
from tkc.ranks import barrier_count, deadlock, flag_state, never_satisfied, out_of_range
from tkc.semantics import _CMP as semantics_cmp
from tkc.semantics import _box_slices

__all__ = ["RankLaunch", "HANDLERS", "CO_HANDLERS", "releasing"]

Co = Generator[Any, None, Any]  # a coroutine step, as in machine.py


class RankLaunch:
    """What the CTAs of a multi-GPU launch share: every rank's parameters, the barriers
    across ranks, the TMA stores still in flight, and the warpgroups' names (for messages)."""

    def __init__(self, kernel: Operation, envs: list[dict], names: dict[int, tuple[str, int]],
                 ctas: list[tuple[int, tuple[int, ...]]]):
        self.envs = envs
        # The race detector, a CTA a program: ``ctas`` lists every CTA's (rank, program id).
        self.index = {cta: k for k, cta in enumerate(ctas)}
        self.log = HappensBefore([f"rank {r} CTA {pid}" for r, pid in ctas], [r for r, _ in ctas])
        for env in envs:
            for array in env.values():
                if id(array) in names:
                    self.log.add_tensor(array, *names[id(array)])
        self.num_ranks = len(envs)
        roles = [op for op in kernel.regions[0].block.ops if op.name == "hopper.role"]
        self.roles: list[str | None] = [r.attributes["name"] for r in roles] or [None]
        self.names = names  # id of each rank's array -> (parameter name, rank)
        self.labels: dict[Any, str] = {}  # warpgroup -> its name in the scheduler and in messages
        self.finished: set[Any] = set()  # warpgroups that have run to the end
        self.spinning: dict[Any, Callable[[], str]] = {}  # warpgroup -> what it spins for, while it does
        self.reached: dict[tuple[int, tuple[int, ...], str | None], list[int]] = {}  # barriers' lines per
        # (rank, pid, role)
        self.at_barrier: dict[Any, tuple[tuple[tuple[int, ...], int], set, Operation]] = {}  # warpgroup -> the
        # barrier it spins at (key, who arrived, the op)
        self.arrived: dict[tuple[tuple[int, ...], int], set[tuple[int, str | None]]] = {}
        self.flying: dict[int, list[tuple[list[tuple[int, int]], Operation, Any]]] = {}

    def tensor(self, tensor: np.ndarray) -> str:
        name, rank = self.names.get(id(tensor), ("a tensor", 0))
        return f"'{name}' of rank {rank}"

    # ------------------------------------------------------------ in-flight stores
    def store(self, wg: Any, op: Operation, tensor: np.ndarray, index: tuple) -> None:
        """A TMA store by ``wg`` writes ``tensor[index]`` (ints and slices): in flight until
        the role's next release."""
        self.flying.setdefault(id(tensor), []).append((box_of(index), op, wg))

    def drain(self, wg: Any) -> None:
        """``cp.async.bulk.wait_group 0`` by ``wg``'s thread 0: its TMA stores have landed
        (and read their shared tiles)."""
        for lease in wg.bulk:
            lease.release()
        wg.bulk = []
        for key in list(self.flying):
            left = [f for f in self.flying[key] if f[2] is not wg]
            if left:
                self.flying[key] = left
            else:
                del self.flying[key]

    def check_read(self, tensor: np.ndarray, index: tuple, mask: np.ndarray | None = None) -> None:
        """A read of ``tensor[index]`` (per axis an integer array, broadcast together, or a
        slice; only where ``mask`` holds) of elements a TMA store still writes is an error."""
        flying = self.flying.get(id(tensor), ())
        if not flying:
            return
        for box, store, wg in flying:
            element = first_inside(box, index, mask)
            if element is not None:
                raise TkcEmulatorError(
                    f"reads element {element} of {self.tensor(tensor)} while the TMA store at "
                    f"{_line(store)} by {self.labels[wg]} still writes it: a TMA store has landed only once its "
                    f"role releases after it (signal(), barrier_all() or an atomic with sem release or acq_rel "
                    f"first waits for the role's bulk copies: cp.async.bulk.wait_group 0)")

    # ------------------------------------------------------------------ data races
    def read(self, wg: Any, op: Operation, tensor: np.ndarray, index: Any) -> None:
        """``wg``'s CTA reads ``tensor[index]`` (global memory): a race with a write no chain of
        waits and releases orders before it is an error."""
        if id(tensor) in self.names:
            msg = self.log.access(tensor, index, wg.cta.who, op.loc, "read")
            if msg is not None:
                raise TkcEmulatorError(msg, op.loc)

    def landed(self) -> None:
        """Once every CTA has finished: every write into a rank's memory by a peer happens
        before the end of one of that rank's CTAs (else the rank's caller may read the memory
        before the write lands)."""
        for r in range(self.num_ranks):
            late = self.log.landed(r, [k for (rank, _), k in self.index.items() if rank == r])
            if late is not None:
                raise TkcEmulatorError(*late)

    # ------------------------------------------------------------------ barriers
    def arrive(self, wg: Any, op: Operation) -> tuple[tuple[tuple[int, ...], int], set]:
        """``wg``'s role reaches its next barrier ``op``: the barrier's key (program id, count)
        and who has arrived there."""
        cta, role = wg.cta, _role_name(wg)
        met = self.reached.setdefault((cta.gpu, cta.pid, role), [])
        k = len(met)
        met.append(op.loc.line if op.loc is not None else 0)
        arrived = self.arrived.setdefault((cta.pid, k), set())
        arrived.add((cta.gpu, role))
        if len(arrived) == self.num_ranks * len(self.roles):  # the last arrival: everyone has seen everything
            self.log.barrier([self.index[(r, cta.pid)] for r in range(self.num_ranks)])
        return (cta.pid, k), arrived

    def _absent(self, key: tuple[tuple[int, ...], int], arrived: set) -> list[tuple[Any, str]]:
        """The warpgroups (their leaders) that have not arrived at barrier ``key``."""
        return [(wg, name) for wg, name in self.labels.items()
                if wg.cta.pid == key[0] and _leads(wg) and (wg.cta.gpu, _role_name(wg)) not in arrived]

    def missing(self, key: tuple[tuple[int, ...], int], arrived: set) -> str:
        """Who has not arrived at barrier ``key``, and why."""
        out = []
        for wg, name in self._absent(key, arrived):
            spin = self.spinning.get(wg)
            why = "has finished without reaching it" if wg in self.finished else \
                spin() if spin is not None else "has not reached it"
            out.append(f"{name} {why}")
        return "; ".join(out)

    def _met(self, wg: Any) -> list[int]:
        """The lines of the barriers ``wg``'s role has reached."""
        return self.reached.get((wg.cta.gpu, wg.cta.pid, _role_name(wg)), [])

    # ------------------------------------------------------------------ deadlock
    def stuck(self, blocked: list[tuple[str, Wait | Until]]) -> TkcEmulatorError | None:
        """The error when no warpgroup can go on and some spin on a flag or a barrier: every
        one that waits, with what for, in the interpreter's words (None: a deadlock of
        mbarriers alone, the scheduler's own error)."""
        spins = [i for i, (_, w) in enumerate(blocked) if isinstance(w, Until)]
        if not spins:
            return None
        for wg, (key, arrived, op) in self.at_barrier.items():  # a barrier a peer finished without: the cause
            gone = [(name, self._met(other)) for other, name in self._absent(key, arrived) if other in self.finished]
            if gone:
                return DeadlockError(barrier_count(self.labels[wg], self._met(wg), gone), op.loc)
        lines = [f"{n} {w.waits_for()}" if isinstance(w, Until) else
                 f"{n} waits at {w.op} for parity {w.parity} of {w.barrier.state()}" for n, w in blocked]
        first = spins[0]
        loc = blocked[first][1].loc
        by_name = {name: wg for wg, name in self.labels.items()}
        programs = {(by_name[n].cta.gpu, by_name[n].cta.pid) for n, _ in blocked}
        if len(programs) > 1:
            return DeadlockError(deadlock(lines), loc)
        rest = lines[:first] + lines[first + 1:]
        also = f" (its program's other warpgroups wait too: {'; '.join(rest)})" if rest else ""
        return DeadlockError(never_satisfied(lines[first]) + also, loc)


def _role_name(wg: Any) -> str | None:
    """The role ``wg`` runs, or ran last once it has finished (the barriers it met count under it)."""
    role = wg.role_op or wg.last_role
    return role.attributes["name"] if role is not None else None


def _leads(wg: Any) -> bool:
    """Whether ``wg`` is the first warpgroup of the role it runs, or ran last once it has
    finished (a role meets a barrier once, through its first warpgroup)."""
    role = wg.role_op or wg.last_role
    return wg.g == (role.first if role is not None else 0)


def box_of(index: tuple) -> list[tuple[int, int]]:
    """The box ``[lo, hi)`` per axis of a region ``tensor[index]`` (ints and slices)."""
    return [(int(i), int(i) + 1) if not isinstance(i, slice) else (i.start, i.stop) for i in index]


def first_inside(box: list[tuple[int, int]], index: tuple, mask: np.ndarray | None = None) -> list[int] | None:
    """The first element of ``tensor[index]`` (per axis an integer array, broadcast together, or a
    slice; only where ``mask`` holds) inside ``box``, or None."""
    n = len(index)
    index = tuple(np.arange(i.start, i.stop).reshape([-1 if b == a else 1 for b in range(n)])
                  if isinstance(i, slice) else np.asarray(i)[mask] if mask is not None else i
                  for a, i in enumerate(index))
    index = np.broadcast_arrays(*(np.asarray(i) for i in index))
    inside = np.ones(index[0].shape, bool)
    for i, (lo, hi) in zip(index, box):
        inside &= (i >= lo) & (i < hi)
    if not inside.any():
        return None
    at = tuple(np.argwhere(inside)[0])
    return [int(i[at]) for i in index]


def _line(op: Operation) -> str:
    return f"line {op.loc.line}" if op.loc is not None and op.loc.line else op.name


def _spin(wg: Any, op: Operation, ready: Callable[[], bool], waits_for: Callable[[], str]) -> Co:
    """Thread 0 spins (``ld.acquire.sys`` in a loop) until ``ready()``."""
    if ready():
        return
    spinning = wg.cta.launch.spinning
    spinning[wg] = waits_for
    yield Until(ready, waits_for, op.name, op.loc)
    del spinning[wg]


# ------------------------------------------------------------------ the rank ops
def _rank(wg: Any, op: Operation) -> np.ndarray:
    return np.asarray(wg.cta.gpu, np.int32)


def _num_ranks(wg: Any, op: Operation) -> np.ndarray:
    return np.asarray(wg.cta.launch.num_ranks, np.int32)


def _peer(wg: Any, op: Operation, tensor: np.ndarray, r: Any) -> np.ndarray:
    launch = wg.cta.launch
    r = int(r)
    if not 0 <= r < launch.num_ranks:
        raise TkcEmulatorError(out_of_range(r, launch.num_ranks))
    return launch.envs[r][op.tensor]


def _wait(wg: Any, op: Operation, tensor: np.ndarray, value: Any, *offsets: Any) -> Co:
    launch = wg.cta.launch
    element = tuple(int(o) for o in offsets)
    name = launch.names.get(id(tensor), ("a tensor", 0))[0]
    if any(not 0 <= i < n for i, n in zip(element, tensor.shape)):
        raise TkcEmulatorError(f"wait() on element {list(element)} of '{name}', outside its shape "
                               f"{list(tensor.shape)}")
    want, pred = int(value), op.pred

    def waits_for() -> str:
        return f"waits at {_line(op)} for {flag_state(name, element, pred, want, int(tensor[element]))}"

    if wg.leader:
        yield from _spin(wg, op, lambda: bool(semantics_cmp[pred](int(tensor[element]), want)), waits_for)
        launch.log.acquire(tensor, element, wg.cta.who)
    yield from wg.bar_sync(op)


def _barrier(wg: Any, op: Operation) -> Co:
    launch = wg.cta.launch
    if wg.leader:
        launch.drain(wg)
    yield from wg.bar_sync(op)
    if wg.leader:
        key, arrived = launch.arrive(wg, op)
        everyone = launch.num_ranks * len(launch.roles)
        launch.at_barrier[wg] = (key, arrived, op)
        yield from _spin(wg, op, lambda: len(arrived) == everyone,
                         lambda: f"waits at barrier_all() ({_line(op)}, its barrier {key[1] + 1}) for "
                                 f"{launch.missing(key, arrived)}")
        del launch.at_barrier[wg]
    yield from wg.bar_sync(op)


def releasing(handler: Callable[..., Any], co: bool) -> Callable[..., Co]:
    """``handler`` (an atomic; ``co``: a coroutine) as a multi-GPU launch runs it: one that
    releases first completes the role's TMA stores and, unless the handler's own first barrier
    does it, lets the role's threads meet (``lower_ranks.before_release``), so a tile's release
    (every thread's ``red.release`` of its own values) covers every thread's writes, as one
    element's does."""

    def run(wg: Any, op: Operation, *args: Any) -> Co:
        sem = op.attributes.get("sem") or "relaxed"
        one = isinstance(op.value.type, ScalarType)
        if sem in ("release", "acq_rel"):
            if wg.leader:
                wg.cta.launch.drain(wg)
            if not co:
                yield from wg.bar_sync(op)
        out = handler(wg, op, *args)
        out = (yield from out) if co else out
        if sem != "relaxed" and wg.leader:  # its ordering, for the CTA (a tile: every thread's)
            log, tensor = wg.cta.launch.log, args[0]
            if one:
                element = _element(op, args)
                if element is not None:
                    if sem in ("acquire", "acq_rel") and op.results:
                        log.acquire(tensor, element, wg.cta.who)
                    if sem in ("release", "acq_rel"):
                        log.release(tensor, element, wg.cta.who)
            elif sem in ("release", "acq_rel"):
                n = 2 if atomic_kind(op) == "cas" else 1
                box = _box_slices(tensor.shape, args[1 + n:], op.attributes["box"])
                if box is not None:
                    log.release(tensor, box[0], wg.cta.who)
        return out

    return run


def _element(op: Operation, args: tuple) -> tuple[int, ...] | None:
    """The element an atomic on one element (``tile.atomic``, ``tile.atomic_cas``,
    ``hopper.atomic_fetch``; ``args`` its operands' values) updates; None outside its tensor."""
    n = 2 if atomic_kind(op) == "cas" else 1
    rest = args[2:] if op.name == "hopper.atomic_fetch" else args[1:]  # (a fetch's slot first)
    element = tuple(int(o) for o in rest[n:])
    tensor = args[0]
    return element if all(0 <= i < d for i, d in zip(element, tensor.shape)) else None


HANDLERS: dict[str, Callable[..., Any]] = {
    "tile.rank": _rank,
    "tile.num_ranks": _num_ranks,
    "tile.peer": _peer,
}

CO_HANDLERS: dict[str, Callable[..., Co]] = {
    "tile.wait": _wait,
    "tile.rank_barrier": _barrier,
}
