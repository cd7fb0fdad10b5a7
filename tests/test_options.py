"""tkc's environment knobs: read on request, from any mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from tkc.errors import TkcUsageError
from tkc.options import knobs


def test_defaults() -> None:
    k = knobs({})
    assert k.dump_ir == () and k.dump_dir is None
    assert not k.interpret and not k.debug
    assert k.cache_dir == Path("~/.cache/tkc").expanduser()


def test_values() -> None:
    k = knobs({"TKC_DUMP_IR": "cse, dce,", "TKC_DUMP_DIR": "/tmp/d", "TKC_INTERPRET": "yes",
               "TKC_CACHE_DIR": "/tmp/c", "TKC_DEBUG": "1"})
    assert k.dump_ir == ("cse", "dce")
    assert k.dump_dir == Path("/tmp/d") and k.cache_dir == Path("/tmp/c")
    assert k.interpret and k.debug


def test_bad_flag() -> None:
    with pytest.raises(TkcUsageError, match="TKC_DEBUG='maybe': expected 1 or 0"):
        knobs({"TKC_DEBUG": "maybe"})
