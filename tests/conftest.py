"""Setup shared by every test.

``tkc.runtime`` lives in the top-level ``runtime/`` folder (pyproject's package-dir).  An
editable or regular install maps it; when the tests run from a bare checkout (pytest's
``pythonpath = ["."]`` only finds ``tkc/``, as on a GPU machine without an install),
register the folder as ``tkc.runtime`` here, once for all tests.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest

import tkc

if importlib.util.find_spec("tkc.runtime") is None:  # pragma: no cover - depends on the install
    _dir = Path(__file__).resolve().parents[1] / "runtime"
    _spec = importlib.util.spec_from_file_location("tkc.runtime", _dir / "__init__.py",
                                                   submodule_search_locations=[str(_dir)])
    assert _spec is not None and _spec.loader is not None
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["tkc.runtime"] = _mod
    tkc.runtime = _mod  # type: ignore[attr-defined]
    _spec.loader.exec_module(_mod)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true",
                     help="also run the tests marked slow (the same checks in more variants)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without --slow, tests marked slow are deselected: the default run stays within CI's
    ten minutes on two cores."""
    if config.getoption("--slow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked gpu skips before its body without a CUDA GPU: its inputs and cubins
    (seconds of CPU for some) are of no use there."""
    if item.get_closest_marker("gpu") is not None and not _cuda():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")


@functools.cache
def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
