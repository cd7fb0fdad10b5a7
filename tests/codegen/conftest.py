"""Shared fixtures of the codegen tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tkc.codegen.ptxas import find_ptxas, searched


@pytest.fixture(scope="session")
def ptxas() -> Path:
    """The ptxas the compiler would use (same search); skips the test only when there is none."""
    found = find_ptxas()
    if found is None:
        pytest.skip(f"no ptxas found (searched {', '.join(searched())})")
    return found
