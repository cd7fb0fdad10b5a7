"""Write-write races between programs, as the interpreter and the emulator see them.

Programs of a launch run in no fixed order on the GPU, so two programs that store to the same
tensor element leave whichever value came last: a kernel bug, even where both store the same
value today.  Atomics (``atomic_add``...) are the one way for several programs to write an
element.  Both executors record, for every element written, which program wrote it last with a
plain store and which with an atomic, and where in the source; a plain store onto an element
another program wrote (either way), or an atomic onto one another program stored plainly, is a
race, reported with both programs and both source lines.

Reads are not tracked: a program reading what another writes is the kernel's business (a flag
set with a release atomic and read with an acquire one is the intended use).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from tkc.errors import Loc


#: The atomics' row of an element more than one program updated atomically.
SEVERAL = -2


class Race(NamedTuple):
    """The first element two programs both wrote: where, who, and how."""

    tensor: str
    element: tuple[int, ...]
    other: Any  # the other program's id, or "several programs"
    other_atomic: bool
    other_loc: Loc | None

    def message(self, me: Any, atomic: bool) -> str:
        def how(is_atomic: bool, many: bool = False) -> str:
            return ("update" if many else "updates") + " it atomically" if is_atomic else "stores to it"

        where = f" (line {self.other_loc.line})" if self.other_loc is not None else ""
        many = isinstance(self.other, str)
        other = self.other if many else f"program {self.other}"
        return (f"write-write race on element {list(self.element)} of '{self.tensor}': {other} "
                f"{how(self.other_atomic, many)}{where} and program {me} {how(atomic)} here; programs run in no fixed "
                f"order, so give each program its own elements, or combine them with atomic_add/atomic_max/"
                f"atomic_min")


class Found(NamedTuple):
    """A race :class:`HappensBefore` found, as a :class:`Race` is taken (``message``)."""

    text: str

    def message(self, me: Any, atomic: bool) -> str:
        return self.text


class WriteLog:
    """Which program last wrote each element of each tensor, plainly and atomically.

    ``names`` maps ``id(array)`` of each working tensor to the parameter name messages use.
    Per tensor four int32 arrays of its shape: the writer (an index into ``programs``, -1 for
    none) and the site (an index into ``sites``) of its last plain store and of its last
    atomic."""

    def __init__(self, names: dict[int, str]):
        self.names = names
        self.programs: list[Any] = []
        self._ordinal: dict[Any, int] = {}
        self.sites: list[Loc | None] = []
        self._site: dict[Any, int] = {}
        self._tables: dict[int, np.ndarray] = {}

    def _table(self, tensor: np.ndarray) -> np.ndarray:
        t = self._tables.get(id(tensor))
        if t is None:
            t = self._tables[id(tensor)] = np.full((4, *tensor.shape), -1, np.int32)
        return t

    def write(self, tensor: np.ndarray, index: Any, who: Any, loc: Loc | None, atomic: bool = False) -> Race | None:
        """Record that program ``who`` writes ``tensor[index]`` (``index`` as numpy takes it, naming
        each element once); the first race it makes, or None.  Nothing is recorded on a race."""
        me = self._ordinal.setdefault(who, len(self._ordinal))
        if me == len(self.programs):
            self.programs.append(who)
        site = self._site.setdefault(loc, len(self._site))
        if site == len(self.sites):
            self.sites.append(loc)
        t = self._table(tensor)
        # Rows: 0/1 the last plain store's program/site, 2/3 the atomics' program (SEVERAL once
        # more than one program's) and the last one's site.  An atomic races only with other
        # programs' plain stores; a plain store with every other write.
        for row in (0,) if atomic else (0, 2):
            prev = t[row][index]
            clash = ((prev >= 0) & (prev != me)) | (prev == SEVERAL)
            if np.any(clash):
                return self._race(tensor, index, clash, row, t)
        if atomic:
            prev = t[2][index]
            t[2][index] = np.where((prev >= 0) & (prev != me) | (prev == SEVERAL), SEVERAL, me)
        else:
            t[0][index] = me
        t[3 if atomic else 1][index] = site
        return None

    def _race(self, tensor: np.ndarray, index: Any, clash: np.ndarray, row: int, t: np.ndarray) -> Race:
        flat = np.arange(tensor.size).reshape(tensor.shape)[index]
        first = int(np.asarray(flat)[np.asarray(clash)].reshape(-1)[0]) if np.ndim(flat) else int(flat)
        element = tuple(int(i) for i in np.unravel_index(first, tensor.shape))
        other = int(t[row][element])
        site = int(t[row + 1][element])
        who = "several programs" if other == SEVERAL else self.programs[other]
        return Race(self.names.get(id(tensor), "a tensor"), element, who, row == 2, self.sites[site])


# ------------------------------------------------------------ several ranks
class HappensBefore:
    """Data races between the programs of a multi-GPU launch (``tkc/ranks.py``), by vector
    clocks: an access races with an earlier one of another program unless a chain of release
    and acquire operations orders them (a ``signal``/release atomic, then a ``wait``/acquire
    atomic that reads what it wrote, or a ``barrier_all()``).  Reported: a read of an element
    another program wrote (plainly or atomically) with no such chain, a write onto an element
    another program read or wrote plainly with none, and an atomic onto one another program
    read or wrote plainly with none.  Atomics never race with atomics.

    Programs are numbered ``0..n-1`` (``names``); each rank ``r`` also has a clock of its own,
    ``n + r``, "rank r before the launch": every tensor of rank ``r`` was last written by it, and
    only rank ``r``'s programs start after it (stream order), so a peer that reads rank ``r``'s
    inputs must first synchronize with a program of rank ``r`` (a barrier, or a flag it
    signals).  Per element, the last plain writer and the last plain reader are kept, and up to
    ``ATOMIC_SLOTS`` atomic writers no one of which is ordered before another (a reduce-scatter's
    partials from every peer, unordered until the owner's wait): an atomic writer ordered before
    a later one is covered by it.  An approximation that may miss a race between earlier plain
    accesses (or with a fifth unordered atomic writer), never reports one that is not there.
    Release clocks are kept per element of the tensors released into.  At the end
    (:meth:`landed`) every write into a rank's memory by a peer must happen before the end of
    one of that rank's programs."""

    #: atomic writers of one element kept at once (see the class's docstring)
    ATOMIC_SLOTS = 4

    def __init__(self, names: list[str], ranks: list[int]):
        n, r = len(names), max(ranks, default=0) + 1
        self.names = names + [f"rank {k} before the launch" for k in range(r)]
        self.clock = np.zeros((n + r, n + r), np.int64)
        for t, k in enumerate(ranks):
            self.clock[t, t] = 1
            self.clock[t, n + k] = 1
        for k in range(r):
            self.clock[n + k, n + k] = 1
        self._first = n  # the "before the launch" clocks follow the programs
        self.tensors: dict[int, tuple[str, int]] = {}  # id(array) -> (name, rank)
        self._tables: dict[int, dict[str, np.ndarray]] = {}
        self._sync: dict[int, np.ndarray] = {}
        self.sites: list[Loc | None] = []
        self._site: dict[Any, int] = {}

    def add_tensor(self, tensor: np.ndarray, name: str, rank: int) -> None:
        """A working tensor of rank ``rank``, named ``name`` in messages."""
        self.tensors[id(tensor)] = (name, rank)

    def _table(self, tensor: np.ndarray) -> dict[str, np.ndarray]:
        t = self._tables.get(id(tensor))
        if t is None:
            before = self._first + self.tensors.get(id(tensor), ("", 0))[1]
            slots = (self.ATOMIC_SLOTS, *tensor.shape)
            t = self._tables[id(tensor)] = {
                "w": np.full(tensor.shape, before, np.int32), "we": np.ones(tensor.shape, np.int64),
                "ws": np.full(tensor.shape, -1, np.int32),
                **{k: np.full(tensor.shape, -1, np.int32) for k in ("r", "rs")},
                **{k: np.full(slots, -1, np.int32) for k in ("a", "as")},
                "re": np.zeros(tensor.shape, np.int64), "ae": np.zeros(slots, np.int64)}
        return t

    @staticmethod
    def _slots(index: Any) -> tuple:
        """``index`` of an element or box, over the atomic rows' leading slot axis too."""
        return (slice(None), *(index if isinstance(index, tuple) else (index,)))

    def _site_of(self, loc: Loc | None) -> int:
        s = self._site.setdefault(loc, len(self._site))
        if s == len(self.sites):
            self.sites.append(loc)
        return s

    def _unordered(self, t: dict[str, np.ndarray], who: str, index: Any, me: int) -> np.ndarray:
        if who == "a":  # any of the atomic writers kept
            return np.any(self._unordered_slots(t, index, me), axis=0)
        w, e = t[who][index], t[who + "e"][index]
        return (w >= 0) & (w != me) & (self.clock[me][np.maximum(w, 0)] < e)

    def _unordered_slots(self, t: dict[str, np.ndarray], index: Any, me: int) -> np.ndarray:
        """For each atomic slot of ``index``: whether its writer is another program not ordered
        before ``me``."""
        w, e = t["a"][self._slots(index)], t["ae"][self._slots(index)]
        return (w >= 0) & (w != me) & (self.clock[me][np.maximum(w, 0)] < e)

    def _record_atomic(self, t: dict[str, np.ndarray], index: Any, me: int, site: int) -> None:
        """``me`` updated ``index`` atomically: it takes the place of every atomic writer kept
        there that is ordered before it (a later access ordered after ``me`` is ordered after
        them, one that is not races with ``me`` too), beside those that are not; with every
        slot taken by those, the last slot's writer is forgotten."""
        at = self._slots(index)
        w, e = t["a"][at], t["ae"][at]
        covered = ~self._unordered_slots(t, index, me)  # empty, me, or ordered before me
        target = np.where(covered.any(axis=0), covered.argmax(axis=0), self.ATOMIC_SLOTS - 1)[None]
        rows = {"a": np.where(covered, -1, w), "ae": np.where(covered, 0, e), "as": np.where(covered, -1, t["as"][at])}
        for row, value in (("a", me), ("ae", self.clock[me, me]), ("as", site)):
            np.put_along_axis(rows[row], target, value, axis=0)
            t[row][at] = rows[row]

    def access(self, tensor: np.ndarray, index: Any, me: int, loc: Loc | None, kind: str) -> str | None:
        """Record access ``kind`` ("read", "write" or "atomic") by program ``me`` of
        ``tensor[index]``; the message of the first race it makes, or None (then recorded)."""
        t = self._table(tensor)
        against = {"read": ("w", "a"), "write": ("w", "a", "r"), "atomic": ("w", "r")}[kind]
        for who in against:
            clash = self._unordered(t, who, index, me)
            if np.any(clash):
                return self._message(tensor, index, clash, t, who, me, kind, loc)
        if kind == "atomic":
            self._record_atomic(t, index, me, self._site_of(loc))
            return None
        row = {"read": "r", "write": "w"}[kind]
        t[row][index] = me
        t[row + "e"][index] = self.clock[me, me]
        t[row + "s"][index] = self._site_of(loc)
        return None

    def write(self, tensor: np.ndarray, index: Any, who: int, loc: Loc | None, atomic: bool = False) -> Found | None:
        """:meth:`WriteLog.write`'s call, which ``tkc.semantics`` makes for stores and atomics:
        the write checked and recorded as :meth:`access` does."""
        msg = self.access(tensor, index, who, loc, "atomic" if atomic else "write")
        return None if msg is None else Found(msg)

    def release(self, tensor: np.ndarray, index: Any, me: int) -> None:
        """Program ``me`` releases into ``tensor[index]``: whoever acquires it later sees every
        access ``me`` made before (and what ``me`` had acquired)."""
        s = self._sync.get(id(tensor))
        if s is None:
            s = self._sync[id(tensor)] = np.zeros((*tensor.shape, len(self.names)), np.int64)
        s[index] = np.maximum(s[index], self.clock[me])
        self.clock[me, me] += 1

    def acquire(self, tensor: np.ndarray, element: tuple[int, ...], me: int) -> None:
        """Program ``me`` read ``tensor[element]`` with acquire ordering."""
        s = self._sync.get(id(tensor))
        if s is not None:
            np.maximum(self.clock[me], s[element], out=self.clock[me])

    def barrier(self, programs: list[int]) -> None:
        """``programs`` meet at a barrier: each has seen everything any of them did before."""
        joined = self.clock[programs].max(axis=0)
        for p in programs:
            self.clock[p] = joined
            self.clock[p, p] += 1

    def landed(self, rank: int, programs: list[int]) -> tuple[str, Loc | None] | None:
        """Once every program has finished: whether every write a peer made into rank ``rank``'s
        memory happens before the end of one of ``programs`` (rank ``rank``'s); if not, the
        message and the line of the first such write (rank ``rank``'s kernel may end, and its
        caller read the memory, before the write lands)."""
        end = self.clock[programs].max(axis=0)
        for tid, (name, owner) in self.tensors.items():
            t = self._tables.get(tid)
            if owner != rank or t is None:
                continue
            rows = [(t["w"], t["we"], t["ws"], "w")] + [(t["a"][k], t["ae"][k], t["as"][k], "a")
                                                        for k in range(self.ATOMIC_SLOTS)]
            for w, e, sites, who in rows:
                late = (w >= 0) & (w < self._first) & (end[np.maximum(w, 0)] < e)
                if np.any(late):
                    element = tuple(int(i) for i in np.argwhere(late)[0])
                    loc = self.sites[int(sites[element])]
                    did = "stores to" if who == "w" else "updates"
                    return (f"{self.names[int(w[element])]} {did} element {list(element)} of '{name}' of rank {rank} "
                            f"here, and no program of rank {rank} waits for it: rank {rank}'s kernel may end (and "
                            f"its caller read the tensor) before it lands; signal a flag after it and have rank "
                            f"{rank} wait() for that, or end with a barrier_all()"), loc
        return None

    def _message(self, tensor: np.ndarray, index: Any, clash: np.ndarray, t: dict[str, np.ndarray], who: str,
                 me: int, kind: str, loc: Loc | None) -> str:
        flat = np.arange(tensor.size).reshape(tensor.shape)[index]
        first = int(np.asarray(flat)[np.asarray(clash)].reshape(-1)[0]) if np.ndim(flat) else int(flat)
        element = tuple(int(i) for i in np.unravel_index(first, tensor.shape))
        if who == "a":  # the first atomic writer kept there that is not ordered before ``me``
            k = int(np.argmax(self._unordered_slots(t, element, me)))
            other, site = int(t["a"][self._slots(element)][k]), int(t["as"][self._slots(element)][k])
        else:
            other, site = int(t[who][element]), int(t[who + "s"][element])
        name, rank = self.tensors.get(id(tensor), ("a tensor", 0))
        did = {"w": "stores to it", "a": "updates it atomically", "r": "reads it"}[who]
        doing = {"read": "reads it", "write": "stores to it", "atomic": "updates it atomically"}[kind]
        where = f" (line {self.sites[site].line})" if site >= 0 and self.sites[site] is not None else ""
        if other >= self._first:
            why = (f"rank {rank}'s tensors hold what rank {rank} wrote before the launch, which a peer sees only "
                   f"after synchronizing with rank {rank}'s programs: a barrier_all() first, or a wait() for a "
                   f"flag they signal")
            return (f"data race on element {list(element)} of '{name}' of rank {rank}: {self.names[me]} {doing} "
                    f"here with no release/acquire chain after the launch on rank {rank}; {why}")
        if who == "r":
            fix = ("the reader signals a flag once it is done and the writer wait()s for it before "
                   "overwriting, or a barrier_all() between")
        elif kind == "read":
            fix = ("the writer signals a flag after its stores (signal(flags.on(r)[i], v), release) and the "
                   "reader wait()s for it before its loads")
        else:
            fix = "order the writes with a signal and a wait() or a barrier_all(), or combine them with atomics"
        return (f"data race on element {list(element)} of '{name}' of rank {rank}: {self.names[other]} {did}"
                f"{where} and {self.names[me]} {doing} here, with no release/acquire chain between them; {fix}")
