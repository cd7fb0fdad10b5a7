"""The parser's tables and parsed trees kept in tkc's cache directory: a process that loads
them parses exactly as one that built them, reports syntax errors the same way (they are not
stored), and a damaged or missing file only costs the time to build it again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_SCRIPT = r"""
import sys
from tkc.errors import TkcError
from tkc.frontend import compile_file, compile_source
from tkc.ir.printer import print_module
print(print_module(compile_file(sys.argv[1], {})))
try:
    compile_source("@kernel\ndef k(x: f32[N]):\n    y = x +\n", "bad.tk")
except TkcError as e:
    print(e)
"""


def _parse_in_new_process(cache: Path) -> str:
    env = {**os.environ, "TKC_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(ROOT / "examples" / "attn.tk")], env=env,
                         capture_output=True, text=True, check=True)
    return out.stdout


def test_loaded_tables_parse_like_built_ones(tmp_path):
    tables = tmp_path / "parser" / "tile-lark-tables"
    built = _parse_in_new_process(tmp_path)
    assert tables.is_file(), "the first process keeps the tables"
    stamp = tables.stat().st_mtime_ns
    loaded = _parse_in_new_process(tmp_path)
    assert tables.stat().st_mtime_ns == stamp, "the second process loads them, it does not build them again"
    assert loaded == built
    assert "bad.tk:3:" in built and "^" in built  # the syntax error, located, with its caret


def test_damaged_tables_are_built_again(tmp_path):
    built = _parse_in_new_process(tmp_path)
    tables = tmp_path / "parser" / "tile-lark-tables"
    tables.write_bytes(tables.read_bytes()[:1000])
    assert _parse_in_new_process(tmp_path) == built
    assert tables.stat().st_size > 1000, "rewritten whole"


def test_an_unwritable_cache_directory_still_parses(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert "tile.kernel @attn" in _parse_in_new_process(blocked)


def test_stored_trees_read_back_as_parsed(tmp_path):
    """The first process stores attn.tk's tree (not the bad text's: errors are not stored); the
    second reads it back and prints the same IR, every location included."""
    built = _parse_in_new_process(tmp_path)
    trees = list(tmp_path.rglob("tree.pickle"))
    assert len(trees) == 1
    stamp = trees[0].stat().st_mtime_ns
    assert _parse_in_new_process(tmp_path) == built
    assert trees[0].stat().st_mtime_ns == stamp, "read back, not parsed and stored again"
    assert 'loc("' in built  # (the printed IR carries the source locations)


def test_damaged_trees_are_parsed_again(tmp_path):
    built = _parse_in_new_process(tmp_path)
    (tree,) = tmp_path.rglob("tree.pickle")
    blob = tree.read_bytes()
    tree.write_bytes(blob[:100])  # torn: the cache's own check refuses it
    assert _parse_in_new_process(tmp_path) == built
    assert tree.read_bytes() == blob, "parsed again and stored whole"
    # a whole entry whose payload is no tree (another build's classes, say)
    from tkc.runtime import cache as disk

    key = tree.parent.name
    disk.put(key, "tree.pickle", b"not a pickle", tmp_path)
    assert _parse_in_new_process(tmp_path) == built
