"""Every error tkc raises on purpose, and the source locations they point at.

A located error renders as ``file:line:col: error: reason`` followed by the
source line and a caret, like a C compiler.  Nothing else in tkc formats
diagnostics; the CLI prints ``str(err)`` and exits non-zero.  A remark
(:class:`TkcRemark`, ``file:line:col: note: ...``) is the same diagnostic about a
kernel that compiles: a choice a pass made that costs speed and that the kernel's
author can change; passes make them with :func:`remark`, a compilation collects
them with :func:`remarks`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Loc:
    """A 1-based source position.  ``source`` holds the whole text of the file
    so a diagnostic can show the offending line without reopening it."""

    file: str
    line: int
    col: int
    source: str | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def snippet(self) -> str:
        """The source line and a caret under the column, or '' when unknown.  A location that
        came back through textual IR (a pass or codegen error) has no text: its file is read."""
        source = self.source
        if source is None:
            try:
                source = Path(self.file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError, ValueError):
                return ""
        lines = source.splitlines()
        if not 1 <= self.line <= len(lines):
            return ""
        text = lines[self.line - 1].rstrip("\n")
        pad = "".join(c if c == "\t" else " " for c in text[: max(self.col - 1, 0)])
        return f"{text}\n{pad}^"


UNKNOWN = Loc("<unknown>", 0, 0)


class TkcError(Exception):
    """Base class: ``TkcError(message, loc=None)``, a message and a location when one is known.

    The arguments are kept as ``args`` (``message`` and ``loc`` read them): torch.compile traces
    a check that raises one inside a compiled function (``tkc.ops``' argument checks), and an
    ``__init__`` that calls ``super()`` is what it cannot trace, which lost the message."""

    kind = "error"

    def __init__(self, message: str, loc: Loc | None = None):
        self.args = (message,) if loc is None else (message, loc)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    @property
    def loc(self) -> Loc | None:
        return self.__dict__.get("_loc", self.args[1] if len(self.args) > 1 else None)

    @loc.setter
    def loc(self, loc: Loc | None) -> None:
        self._loc = loc

    def __str__(self) -> str:
        if self.loc is None or self.loc.line == 0:
            return f"{self.kind}: {self.message}"
        out = f"{self.loc}: {self.kind}: {self.message}"
        snip = self.loc.snippet()
        return f"{out}\n{snip}" if snip else out


class TkcSyntaxError(TkcError):
    """The text does not parse (kernel source or textual IR)."""


class TkcNameError(TkcError):
    """A name is used that is not defined."""


class TkcTypeError(TkcError):
    """Dtypes or shapes do not agree, or a value has the wrong kind."""


class TkcUnsupportedError(TkcError):
    """Valid Python that the tile language does not accept."""


class TkcVerifyError(TkcError):
    """The IR breaks an invariant of an op or of SSA."""


class TkcPassError(TkcError):
    """A pass failed; the message names the pass and the reproducer."""


class TkcInterpretError(TkcError):
    """The interpreter hit a runtime fault (bad grid, bad argument, ...)."""


class TkcLaunchError(TkcError):
    """Arguments given to a kernel call do not match its signature."""


class TkcTmaStrideError(TkcLaunchError):
    """A tensor read through TMA has strides TMA cannot take (the kernel could be compiled
    with the pin ``tma=False`` instead)."""


class TkcUsageError(TkcError):
    """A command-line or API option is wrong or asks for a stage that is missing."""


class TkcCodegenError(TkcError):
    """LLVM or ptxas rejected the code tkc generated; the message quotes their complaint."""


class TkcEmulatorError(TkcError):
    """The Hopper emulator caught a protocol fault the GPU would turn into a hang, a race or
    wrong values: a deadlock, an mbarrier phase or tx misuse, a shared-memory race, a missing
    proxy fence, a misaligned or out-of-bounds access.  The message names the roles, ops and
    barriers involved."""


class TkcRemark(TkcError):
    """A note about a kernel that compiles (never raised): what a pass left undone and why, in
    the kernel's words, at the line it concerns (a loop whose copies stay one at a time)."""

    kind = "note"


_REMARKS: ContextVar[list[TkcRemark] | None] = ContextVar("tkc_remarks", default=None)


@contextmanager
def remarks() -> Iterator[list[TkcRemark]]:
    """The remarks passes make inside the block (:func:`remark`), in order."""
    collected: list[TkcRemark] = []
    token = _REMARKS.set(collected)
    try:
        yield collected
    finally:
        _REMARKS.reset(token)


def remark(message: str, loc: Loc | None) -> None:
    """A pass's remark about the kernel at ``loc``: kept by the innermost :func:`remarks` block
    (none: dropped), once per message and place."""
    collected = _REMARKS.get()
    if collected is not None and not any(r.message == message and r.loc == loc for r in collected):
        collected.append(TkcRemark(message, loc))


def kernel_choice_error(file: str, name: str | None, names: list[str]) -> TkcUsageError:
    """The error for a file whose kernels do not pick one: ``name`` is not among ``names``, or
    none was named among several."""
    listed = ", ".join(names) or "none"
    if name is not None:
        return TkcUsageError(f"{file} has no kernel '{name}' (its kernels: {listed})")
    return TkcUsageError(f"{file} has several kernels ({listed}): name one with --kernel NAME (kernel= in Python)")
