"""tkc's environment knobs, all in one place.

Every environment variable tkc reads is listed here and read here, and only
when :func:`knobs` is called (never at import time), so a test can pass its
own ``env`` mapping; :func:`interpret_requested` is the fast check of
``TKC_INTERPRET`` that every kernel call makes.  Command-line flags override or add to these; the CLI and
the Python API merge them into explicit option objects (e.g.
``tkc.passes.manager.PassOptions``).  Nothing else in tkc reads ``os.environ``.

| variable        | default        | meaning                                                        |
|-----------------|----------------|----------------------------------------------------------------|
| `TKC_DUMP_IR`   | unset          | `all` or `pass,pass,...`: print the IR after those passes      |
|                 |                | (to stderr, or as numbered files in `TKC_DUMP_DIR`)            |
| `TKC_DUMP_DIR`  | unset          | directory for numbered dumps `NN-<pass>.tkir`                  |
| `TKC_INTERPRET` | `0`            | `1`: run kernels with the numpy interpreter instead of the GPU |
| `TKC_CACHE_DIR` | `~/.cache/tkc` | the on-disk cache of compiled kernels (and parsed files)       |
| `TKC_DEBUG`     | `0`            | `1`: show the Python traceback of internal compiler errors     |
| `TKC_PTXAS`     | unset          | the ptxas to use; unset: search PATH, `$CUDA_HOME/bin`, ...    |
|                 |                | (order in `tkc.codegen.ptxas.find_ptxas`)                      |

Boolean knobs accept `1/true/yes/on` and `0/false/no/off` (any case); empty
means unset.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tkc.errors import TkcUsageError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Knobs:
    """The values of tkc's environment variables (see the module docstring)."""

    dump_ir: tuple[str, ...] = ()  # pass names, or ("all",)
    dump_dir: Path | None = None
    interpret: bool = False
    cache_dir: Path = field(default_factory=lambda: Path("~/.cache/tkc").expanduser())
    debug: bool = False
    ptxas: Path | None = None


def knobs(env: Mapping[str, str] | None = None) -> Knobs:
    """Read the knobs from ``env`` (default: the process environment)."""
    env = os.environ if env is None else env
    dump_ir = tuple(n.strip() for n in env.get("TKC_DUMP_IR", "").split(",") if n.strip())
    dump_dir = env.get("TKC_DUMP_DIR") or None
    cache_dir = env.get("TKC_CACHE_DIR") or "~/.cache/tkc"
    ptxas = env.get("TKC_PTXAS") or None
    return Knobs(
        dump_ir=dump_ir,
        dump_dir=Path(dump_dir).expanduser() if dump_dir else None,
        interpret=_flag(env, "TKC_INTERPRET"),
        cache_dir=Path(cache_dir).expanduser(),
        debug=_flag(env, "TKC_DEBUG"),
        ptxas=Path(ptxas).expanduser() if ptxas else None,
    )


# os.environ's own dict (bytes on POSIX), which os.environ[...] = ... and monkeypatch.setenv
# update: a lookup there costs a fortieth of os.environ.get's (which encodes the key first).
_ENVIRON = getattr(os.environ, "_data", None) if os.name == "posix" else None


def interpret_requested() -> bool:
    """``TKC_INTERPRET`` is on: a kernel call (``tkc.kernel``, ``tkc.ops``) runs in the
    interpreter.  Read on every call, since a program may set it at any time, but the common
    case, unset, is one lookup: :func:`knobs` parses every knob, paths included, which costs
    more than a launch."""
    value = _ENVIRON.get(b"TKC_INTERPRET") if _ENVIRON is not None else os.environ.get("TKC_INTERPRET")
    return bool(value) and knobs().interpret


def _flag(env: Mapping[str, str], name: str) -> bool:
    text = env.get(name, "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise TkcUsageError(f"{name}={env[name]!r}: expected 1 or 0")
