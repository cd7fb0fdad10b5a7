"""The parser's tables kept in tkc's cache directory: a process that loads them parses
exactly as one that built them, reports syntax errors the same way, and a damaged or
missing file only costs the time to build them again."""

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
