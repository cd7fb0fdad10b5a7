"""An mbarrier (PTX-FACTS §4) with its phase, pending arrivals and tx-count, and the misuse checks.

State: ``count`` (arrivals per phase), ``pending`` (arrivals still missing in the current
phase), ``tx`` (transaction bytes still expected), ``phase`` (how many phases have completed;
the hardware keeps only ``phase & 1``, the *current parity*).  A phase completes when
``pending == 0`` and ``tx == 0``: ``pending`` resets to ``count`` and the parity flips.

Errors (``MBarrierError``) for the misuses that hang or silently corrupt on the GPU:

- **use before init**: any operation on a barrier created without ``count`` and not yet
  ``init``-ed (and ``init`` of a barrier already initialized).
- **arrivals beyond the count**: ``arrive(n)`` with ``n`` larger than the arrivals still
  pending in the current phase (the extra arrivals would complete the next phase early).
- **tx underflow**: ``complete_tx(b)`` in a phase whose arrivals have all come in and whose
  outstanding tx-count is below ``b``: more bytes landed than were expected, and no
  ``arrive.expect_tx`` of this phase is left to make up the difference.  While arrivals are
  still pending the tx-count may go negative (a copy may complete before another thread's
  ``expect_tx``, as the hardware allows); the phase then waits for tx to return to 0.
- **wrong phase**: see ``wait_status``.

``try_wait(parity)`` gives the hardware answer (true iff the most recently completed phase has
that parity, with phase -1 counting as complete at init), after the wrong-phase check.

This module knows nothing about shared memory, TMA or scheduling: it times each phase's
completion (``clock.CLOCK``) and calls back who asked to hear once every waiter passed a phase
(``when_seen``).
"""

from __future__ import annotations

from collections.abc import Callable

from tkc.emulator.clock import CLOCK
from tkc.errors import TkcEmulatorError

__all__ = ["MBarrier", "MBarrierError", "PhaseError"]


class MBarrierError(TkcEmulatorError):
    """An mbarrier was used in a way that is undefined or always wrong on the GPU."""


class PhaseError(MBarrierError):
    """A wait whose parity names a phase the waiter cannot mean: on the GPU it would pass on
    the wrong phase's data or hang."""


class MBarrier:
    """One mbarrier.  ``MBarrier(name, count)`` is initialized; ``MBarrier(name)`` is not,
    until ``init(count)`` (``mbarrier.init``)."""

    def __init__(self, name: str, count: int | None = None):
        self.name = name
        self.count: int | None = None
        self.pending = 0
        self.tx = 0
        self.phase = 0
        self._observed: dict[str, int] = {}  # waiter -> last phase index it waited for
        # (phase, what to call) once every waiter the barrier has seen passed that phase: a TMA
        # copy that completed on it marks its bytes seen (read or not: a tile read only under
        # an ``if``), so a later copy over them loses nothing (``SharedMemory.seen``).
        self._when_seen: list[tuple[int, Callable[[], None]]] = []
        self.completed_at: dict[int, int] = {}  # phase -> when (clock.CLOCK) it completed
        if count is not None:
            self.init(count)

    # ---------------------------------------------------------------- state
    def init(self, count: int) -> None:
        if self.count is not None:
            raise MBarrierError(f"mbarrier {self.name!r} initialized twice")
        if not 1 <= count < 1 << 20:
            raise MBarrierError(f"mbarrier {self.name!r}: arrival count {count} out of range [1, 2^20)")
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0
        self._observed.clear()

    @property
    def parity(self) -> int:
        """Parity of the current (incomplete) phase."""
        return self.phase & 1

    def state(self) -> str:
        """The barrier's state in words, for messages."""
        if self.count is None:
            return f"mbarrier {self.name!r} (not initialized)"
        return (f"mbarrier {self.name!r} in phase {self.phase} (parity {self.parity}), "
                f"{self.pending}/{self.count} arrivals pending, tx-count {self.tx} bytes")

    def _need_init(self, op: str) -> None:
        if self.count is None:
            raise MBarrierError(f"{op} on mbarrier {self.name!r} before mbarrier.init")

    def _maybe_complete(self) -> None:
        assert self.count is not None
        if self.pending == 0 and self.tx == 0:
            self.completed_at[self.phase] = next(CLOCK)
            self.phase += 1
            self.pending = self.count

    # ---------------------------------------------------------------- arrive / tx
    def arrive(self, n: int = 1) -> None:
        """``mbarrier.arrive`` with count ``n``."""
        self._need_init("arrive")
        if n < 1:
            raise MBarrierError(f"arrive on {self.name!r} with count {n}")
        if n > self.pending:
            raise MBarrierError(f"arrive({n}) on {self.state()}: more arrivals than the count in one phase")
        self.pending -= n
        self._maybe_complete()

    def expect_tx(self, nbytes: int) -> None:
        """``mbarrier.expect_tx``: the current phase also waits for ``nbytes`` more bytes."""
        self._need_init("expect_tx")
        if nbytes < 0:
            raise MBarrierError(f"expect_tx({nbytes}) on {self.name!r}")
        self.tx += nbytes

    def arrive_expect_tx(self, nbytes: int) -> None:
        """``mbarrier.arrive.expect_tx``: expect ``nbytes``, then arrive once."""
        self.expect_tx(nbytes)
        self.arrive(1)

    def complete_tx(self, nbytes: int, by: str = "complete_tx") -> None:
        """``nbytes`` landed (a TMA copy's ``mbarrier::complete_tx::bytes``)."""
        self._need_init(by)
        if self.pending == 0 and nbytes > self.tx:
            raise MBarrierError(f"tx underflow: {by} completes {nbytes} bytes on {self.state()}: "
                                f"more bytes than the phase expects (expect_tx too small?)")
        self.tx -= nbytes
        self._maybe_complete()

    # ---------------------------------------------------------------- waiting
    def _target(self, parity: int, waiter: str) -> int:
        last = self._observed.get(waiter, -2)
        return last + 1 if (last + 1) % 2 == parity else last + 2

    def wait_status(self, parity: int, waiter: str = "<anon>") -> bool:
        """Whether ``try_wait.parity`` by ``waiter`` passes now, without recording the wait.

        The wrong-phase rule.  Each waiter is taken to wait a barrier's phases in increasing
        order: its wait for parity P targets phase k, the first phase after the last one it
        waited for (before its first wait: after phase -2, so a first wait for parity 1 targets
        phase -1, which counts as completed at init: the producer's "empty slot" idiom) whose
        parity is P.  With ``phase`` = C phases completed:

        - k == C - 1: the most recent completion, the wait passes;
        - k == C: not complete yet, the wait blocks;
        - k >= C + 1 (**ahead**, e.g. a waiter that did not flip its parity after a wrap):
          the GPU passes at once, on phase C - 1's completion, which has the same parity;
        - k <= C - 2 (**behind**: the barrier completed a phase this waiter never saw): the
          GPU would hang (k has the current parity) or pass on a later phase's data.

        Both ahead and behind raise ``PhaseError``.
        """
        self._need_init("try_wait")
        if parity not in (0, 1):
            raise MBarrierError(f"try_wait on {self.name!r} with parity {parity}")
        k = self._target(parity, waiter)
        if k >= self.phase + 1:
            raise PhaseError(
                f"wrong phase: {waiter!r} waits for parity {parity} of {self.state()}; its previous wait "
                f"observed phase {k - 2}, so this targets phase {k}, which is ahead of the barrier: the GPU "
                f"would pass at once on phase {self.phase - 1}'s completion (parity not flipped?)")
        if k <= self.phase - 2:
            raise PhaseError(
                f"wrong phase: {waiter!r} waits for parity {parity} (phase {k}) of {self.state()}: phases "
                f"{k}..{self.phase - 1} completed without this waiter seeing phase {k}; the GPU would hang or "
                f"pass on a later phase's data")
        return k == self.phase - 1

    def try_wait(self, parity: int, waiter: str = "<anon>") -> bool:
        """``mbarrier.try_wait.parity``: true once the phase with ``parity`` has completed;
        records the observed phase for ``waiter`` when it passes (see ``wait_status``)."""
        ok = self.wait_status(parity, waiter)
        if ok:
            self._observed[waiter] = self._target(parity, waiter)
            oldest = min(self._observed.values())
            for _, fn in [h for h in self._when_seen if h[0] <= oldest]:
                fn()
            self._when_seen = [h for h in self._when_seen if h[0] > oldest]
        return ok

    def when_seen(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once every waiter has passed the current phase."""
        self._when_seen.append((self.phase, fn))

    def completed_when(self, waiter: str) -> int:
        """When (``clock.CLOCK``) the newest phase ``waiter`` waited for completed (0: none)."""
        return self.completed_at.get(self._observed.get(waiter, -1), 0)
