"""The on-disk kernel cache: keys, atomic writes, corrupt entries, many processes at once."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest

from tkc.dtypes import bf16, f16
from tkc.errors import TkcUsageError
from tkc.runtime import cache

K = cache.key("0.1.0", "def k(): ...", {"BM": 128, "dt": bf16}, "sm_90a", {"stages": 3})


def test_key_is_stable_and_sensitive():
    assert len(K) == 64 and int(K, 16) >= 0
    assert K == cache.key("0.1.0", "def k(): ...", {"dt": bf16, "BM": 128}, "sm_90a", {"stages": 3})  # order-free
    others = [
        cache.key("0.1.1", "def k(): ...", {"BM": 128, "dt": bf16}, "sm_90a", {"stages": 3}),
        cache.key("0.1.0", "def k():  ...", {"BM": 128, "dt": bf16}, "sm_90a", {"stages": 3}),
        cache.key("0.1.0", "def k(): ...", {"BM": 64, "dt": bf16}, "sm_90a", {"stages": 3}),
        cache.key("0.1.0", "def k(): ...", {"BM": 128, "dt": f16}, "sm_90a", {"stages": 3}),
        cache.key("0.1.0", "def k(): ...", {"BM": 128.0, "dt": bf16}, "sm_90a", {"stages": 3}),
        cache.key("0.1.0", "def k(): ...", {"BM": True, "dt": bf16}, "sm_90a", {"stages": 3}),
        cache.key("0.1.0", "def k(): ...", {"BM": "128", "dt": bf16}, "sm_90a", {"stages": 3}),
        cache.key("0.1.0", "def k(): ...", {"BM": 128, "dt": bf16}, "sm_100a", {"stages": 3}),
        cache.key("0.1.0", "def k(): ...", {"BM": 128, "dt": bf16}, "sm_90a", {"stages": 4}),
        cache.key("0.1.0", "def k(): ...", {"BM": 128, "dt": bf16}, "sm_90a"),
    ]
    assert len(set(others) | {K}) == len(others) + 1


def test_key_refuses_unstable_values():
    with pytest.raises(TkcUsageError, match=r"cache key: constants\['f'\] is a function, which has no stable"):
        cache.key("0.1.0", "src", {"f": lambda: 0}, "sm_90a")
    with pytest.raises(TkcUsageError, match="keys that are equal as strings"):
        cache.key("0.1.0", "src", {1: 0, "1": 0}, "sm_90a")


def test_roundtrip_and_miss(tmp_path):
    assert cache.get(K, "kernel.cubin", tmp_path) is None
    assert cache.put(K, "kernel.cubin", b"\x7fELF\0binary", tmp_path)
    assert cache.get(K, "kernel.cubin", tmp_path) == b"\x7fELF\0binary"
    assert cache.get(K, "kernel.ptx", tmp_path) is None
    assert cache.put(K, "kernel.cubin", b"", tmp_path) and cache.get(K, "kernel.cubin", tmp_path) == b""
    path = cache.entry_path(K, "kernel.cubin", tmp_path)
    assert path == tmp_path / K[:2] / K / "kernel.cubin"
    assert [p.name for p in path.parent.iterdir()] == ["kernel.cubin"]  # no temp files left behind


def test_cache_dir_comes_from_the_knob(tmp_path, monkeypatch):
    monkeypatch.setenv("TKC_CACHE_DIR", str(tmp_path / "c"))
    assert cache.put(K, "x.ptx", b"ptx")
    assert (tmp_path / "c" / K[:2] / K / "x.ptx").exists()
    assert cache.get(K, "x.ptx") == b"ptx"


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "directory"])
def test_corrupt_entry_is_a_miss(tmp_path, damage):
    data = bytes(range(256)) * 10
    cache.put(K, "kernel.cubin", data, tmp_path)
    path = cache.entry_path(K, "kernel.cubin", tmp_path)
    blob = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(blob[:-1])
    elif damage == "flip":
        path.write_bytes(blob[:-5] + bytes([blob[-5] ^ 1]) + blob[-4:])
    elif damage == "garbage":
        path.write_bytes(b"not a cache entry at all" * 10)
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.unlink()
        path.mkdir()
    assert cache.get(K, "kernel.cubin", tmp_path) is None
    if damage != "directory":
        assert cache.put(K, "kernel.cubin", data, tmp_path)  # a rewrite repairs it
        assert cache.get(K, "kernel.cubin", tmp_path) == data


@pytest.mark.parametrize("bad_key,name", [("abc", "x"), (K.upper(), "x"), (K, "../x"), (K, ".hidden"), (K, "")])
def test_bad_names(tmp_path, bad_key, name):
    with pytest.raises(TkcUsageError):
        cache.get(bad_key, name, tmp_path)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a non-root POSIX user")
def test_unwritable_cache_warns_and_returns_false(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.warns(RuntimeWarning, match="cannot write the cache entry"):
            assert cache.put(K, "kernel.cubin", b"x", tmp_path) is False
    finally:
        tmp_path.chmod(0o700)


def _payload(writer: int) -> bytes:
    # Large enough that a torn write would be likely to show, distinct per writer.
    return bytes([writer]) * 300_000 + writer.to_bytes(4, "little")


def _hammer(root: str, writer: int, rounds: int, q) -> None:
    seen = set()
    bad = 0
    for _ in range(rounds):
        cache.put(K, "kernel.cubin", _payload(writer), root)
        got = cache.get(K, "kernel.cubin", root)
        if got is None:
            bad += 1  # the entry exists from this process's own put: a miss would mean a torn read
        else:
            w = got[0]
            bad += got != _payload(w)
            seen.add(w)
    q.put((writer, bad, sorted(seen)))


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_many_processes_same_key(tmp_path):
    # fork where there is one: the workers inherit tkc.runtime even when only conftest.py could map it
    # (a bare checkout); they never touch CUDA, so forking a process that initialised it is harmless.
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = ctx.Queue()
    n = 6
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), w, 40, q)) for w in range(n)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(bad == 0 for _, bad, _ in results), results
    final = cache.get(K, "kernel.cubin", tmp_path)
    assert final is not None and final == _payload(final[0])
    leftovers = [p.name for p in Path(cache.entry_path(K, "x", tmp_path)).parent.iterdir()]
    assert leftovers == ["kernel.cubin"]


@pytest.mark.parametrize("entry", [b"{not json", b"[]", b'{"asm": {}}', b'{"name": 1, "asm": 3, "cubin": false}'])
def test_an_entry_the_compiler_cannot_read_is_a_miss(entry):
    """Past the header's checksum, an entry whose JSON this version cannot read (another
    version's fields) compiles again instead of raising."""
    from tkc.compiler import Compiled

    assert Compiled._from_entry(entry, None, K) is None
