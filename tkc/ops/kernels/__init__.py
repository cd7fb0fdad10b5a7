"""The kernels behind the shipped operators (``tkc.ops``), one file each, linked with
``examples/``: the files are here and ``examples/`` links to them, but for ``attn_train.tk``,
``varlen_attn_train.tk`` and ``fftconv.tk``, which are developed in ``examples/`` and linked from
here.  A wheel carries a link's target, so a non-editable install has every kernel as package data.  ``.tk`` files
are read with :func:`tkc.load`; ``rmsnorm.py`` holds a ``@tkc.kernel``."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """The file of a shipped kernel: ``path("gemm.tk")``."""
    return HERE / name
