"""The kernels behind the shipped operators (``tkc.ops``), one home each: ``examples/`` links
here, and a non-editable install carries them as package data.  ``.tk`` files are read with
:func:`tkc.load`; ``rmsnorm.py`` holds a ``@tkc.kernel``."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """The file of a shipped kernel: ``path("gemm.tk")``."""
    return HERE / name
