"""Shared setup of the pass tests: ``tests/filecheck.py`` importable, and no
TKC_* environment variable of the caller leaking into a test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@pytest.fixture(autouse=True)
def _clean_tkc_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TKC_"):
            monkeypatch.delenv(name)
