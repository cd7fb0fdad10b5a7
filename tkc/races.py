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
