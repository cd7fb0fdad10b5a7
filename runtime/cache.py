"""The on-disk cache of compiled kernels.

Owns: the cache key (a sha256 over a canonical JSON encoding of compiler
version, source, specialization constants, target and options), where entries
live (``<cache_dir>/<key[:2]>/<key>/<name>``, ``cache_dir`` from
``tkc.options.knobs().cache_dir``, i.e. ``TKC_CACHE_DIR``), and reading and
writing them safely from many processes at once:

* :func:`put` writes a temporary file in the entry's own directory and
  ``os.replace``\\ s it into place, so a reader sees the old entry, no entry or
  the whole new one, never a torn file;
* every entry carries a header (magic, payload length, sha256 of the payload);
  :func:`get` treats a missing, unreadable, truncated or corrupt entry as a miss.

Must not: decide what is cached or compile anything (callers store PTX, cubins,
IR dumps under names they choose), read ``os.environ`` itself, or fail a
compilation because the cache is unwritable (:func:`put` warns and returns
False).
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tkc.dtypes import DType
from tkc.errors import TkcUsageError
from tkc.options import knobs

__all__ = ["key", "get", "put", "entry_path"]

_SCHEMA = "tkc-cache-v1"
_MAGIC = b"TKC1"
_HEADER = len(_MAGIC) + 8 + 32  # magic, payload length (u64 LE), sha256


def _canon(x: Any, where: str) -> Any:
    """A JSON-able value that is equal for equal inputs and differs for different ones."""
    if isinstance(x, np.generic):  # a numpy scalar (BM=np.int64(64)) keys as the Python value it is
        x = x.item()
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, enum.Enum):
        return {"enum": f"{type(x).__name__}.{x.name}"}
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        return {"float": x.hex()}  # exact, and never confused with an int or a string
    if isinstance(x, bytes):
        return {"bytes": hashlib.sha256(x).hexdigest()}
    if isinstance(x, DType):
        return {"dtype": x.name}
    if isinstance(x, Path):
        return {"path": str(x)}
    if isinstance(x, Mapping):
        items = [(str(k), _canon(v, f"{where}[{k!r}]")) for k, v in x.items()]
        if len({k for k, _ in items}) != len(items):
            raise TkcUsageError(f"cache key: {where} has keys that are equal as strings")
        return {"map": sorted(items)}
    if isinstance(x, (list, tuple)):
        return [_canon(v, f"{where}[{i}]") for i, v in enumerate(x)]
    raise TkcUsageError(f"cache key: {where} is a {type(x).__name__}, which has no stable encoding")


def key(compiler_version: str, source: str | bytes, constants: Mapping[str, Any], target: str,
        options: Mapping[str, Any] | None = None) -> str:
    """The sha256 hex digest naming the cache entry of one compilation."""
    doc = [_SCHEMA, _canon(compiler_version, "compiler_version"), _canon(source, "source"),
           _canon(dict(constants), "constants"), _canon(target, "target"), _canon(dict(options or {}), "options")]
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _root(root: str | Path | None) -> Path:
    return Path(root) if root is not None else knobs().cache_dir


def entry_path(k: str, name: str, root: str | Path | None = None) -> Path:
    """Where entry ``name`` of key ``k`` lives."""
    if len(k) != 64 or any(c not in "0123456789abcdef" for c in k):
        raise TkcUsageError(f"cache key must be a sha256 hex digest, got {k!r}")
    if not name or name.startswith(".") or "/" in name or "\\" in name or "\0" in name:
        raise TkcUsageError(f"cache entry name {name!r} must be a plain file name not starting with '.'")
    return _root(root) / k[:2] / k / name


def get(k: str, name: str, root: str | Path | None = None) -> bytes | None:
    """The bytes stored under (``k``, ``name``), or None on a miss (including a corrupt entry)."""
    path = entry_path(k, name, root)
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    if len(blob) < _HEADER or not blob.startswith(_MAGIC):
        return None
    n = int.from_bytes(blob[4:12], "little")
    data = blob[_HEADER:]
    if len(data) != n or hashlib.sha256(data).digest() != blob[12:_HEADER]:
        return None
    return data


def put(k: str, name: str, data: bytes, root: str | Path | None = None) -> bool:
    """Store ``data`` atomically; True on success.  A failure (read-only or full disk) warns
    and returns False: the cache is an optimisation."""
    path = entry_path(k, name, root)
    data = bytes(data)
    blob = _MAGIC + len(data).to_bytes(8, "little") + hashlib.sha256(data).digest() + data
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return True
    except OSError as e:
        warnings.warn(f"tkc: cannot write the cache entry {path}: {e}", RuntimeWarning, stacklevel=2)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False
