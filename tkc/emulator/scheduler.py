"""Warpgroup roles as cooperating coroutines over mbarriers.

A role (a producer warpgroup, a consumer warpgroup, ...) is a Python generator that runs its
ops directly (TMA copies, wgmma, arrivals) and ``yield``s a request whenever the GPU could
switch to another warpgroup:

- ``Wait(barrier, parity, op)``: ``mbarrier.try_wait.parity`` in a loop; the role resumes
  once the barrier passes for it (``MBarrier.try_wait`` with the role's name as waiter, so
  the wrong-phase checks see each role's own history);
- ``Yield(op)``: a point where others may run (an async op in flight, a ``wgmma.wait_group``);
- ``Until(ready, waits_for, op)``: a spin on global memory (a multi-GPU kernel's flag wait or
  barrier across ranks, ``tkc/emulator/ranks.py``); the role resumes once ``ready()`` holds.

``run(roles, seed)`` steps one role at a time until all have returned, picking uniformly at
random (seeded) among the roles that can run, so a protocol is exercised under many
interleavings.  When some role is unfinished and none can run, it raises ``DeadlockError``
naming every blocked role, its op, the barrier, the parity it waits for and the barrier's
phase, arrivals and tx-count (or the error ``stuck`` makes of the blocked roles, if any).  An error
inside a role is re-raised with the role's name.

Stage reuse races are caught by shared-memory read leases (``SharedMemory.begin_read``; a
consumer holds one from its full-barrier wait until it arrives on the empty barrier), so this
module owns no memory state: only who runs next.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass

from tkc.emulator.mbarrier import MBarrier
from tkc.errors import Loc, TkcEmulatorError

__all__ = ["Wait", "Yield", "Until", "run", "DeadlockError", "Role"]


class DeadlockError(TkcEmulatorError):
    """No role can make progress."""


@dataclass(frozen=True)
class Wait:
    """Block until ``barrier``'s phase with ``parity`` has completed (for this role)."""

    barrier: MBarrier
    parity: int
    op: str = "mbarrier.try_wait"


@dataclass(frozen=True)
class Yield:
    """Let another role run."""

    op: str = "yield"


@dataclass(frozen=True)
class Until:
    """Spin until ``ready()`` holds; ``waits_for()`` says what for, in a deadlock's message."""

    ready: Callable[[], bool]
    waits_for: Callable[[], str]
    op: str = "spin"
    loc: Loc | None = None


Request = Wait | Yield | Until
Role = Generator[Request, None, None]


def _describe_block(name: str, w: Wait | Until) -> str:
    if isinstance(w, Until):
        return f"role {name!r} blocked at {w.op!r}: {w.waits_for()}"
    return f"role {name!r} blocked at {w.op!r}: waits for parity {w.parity} of {w.barrier.state()}"


def run(roles: Mapping[str, Role] | Iterable[tuple[str, Role]], seed: int = 0, *,
        max_steps: int = 1_000_000,
        stuck: Callable[[list[tuple[str, Wait | Until]]], TkcEmulatorError | None] | None = None) -> int:
    """Run ``roles`` (name -> generator) to completion; returns the number of steps taken.
    ``stuck`` may make the error of a deadlock from the blocked roles and their requests."""
    items = list(roles.items()) if isinstance(roles, Mapping) else list(roles)
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        raise ValueError(f"role names must be unique: {names}")
    rng = random.Random(seed)
    live: dict[str, Role] = dict(items)
    pending: dict[str, Request | None] = {n: None for n in names}  # None: not started / resumable
    steps = 0
    while live:
        ready = []
        for name in live:
            req = pending[name]
            if isinstance(req, Wait):
                try:
                    ok = req.barrier.wait_status(req.parity, waiter=name)
                except TkcEmulatorError as e:
                    raise type(e)(f"role {name!r} at {req.op!r}: {e.message}") from e
                if not ok:
                    continue
            elif isinstance(req, Until) and not req.ready():
                continue
            ready.append(name)
        if not ready:
            blocked = [(n, pending[n]) for n in live if isinstance(pending[n], (Wait, Until))]
            error = stuck(blocked) if stuck is not None else None
            raise error or DeadlockError("deadlock: no role can run\n  " +
                                         "\n  ".join(_describe_block(*b) for b in blocked))
        name = ready[rng.randrange(len(ready))]
        req = pending[name]
        if isinstance(req, Wait):
            req.barrier.try_wait(req.parity, waiter=name)
        steps += 1
        if steps > max_steps:
            raise TkcEmulatorError(f"no termination after {max_steps} steps (role {name!r} spinning?)")
        try:
            nxt = next(live[name])
        except StopIteration:
            del live[name]
            continue
        except TkcEmulatorError as e:
            raise type(e)(f"role {name!r}: {e.message}") from e
        if not isinstance(nxt, (Wait, Yield, Until)):
            raise TkcEmulatorError(f"role {name!r} yielded {nxt!r}; roles yield Wait, Yield or Until")
        pending[name] = nxt
    return steps
