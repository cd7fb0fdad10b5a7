"""Shared by the tests that start processes under torchrun."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def installed_tkc() -> None:
    """The processes torchrun starts import tkc as installed (``pip install -e .``): the tests'
    own mapping of runtime/ to ``tkc.runtime`` (tests/conftest.py) does not reach them."""
    if subprocess.run([sys.executable, "-c", "import tkc.runtime"], cwd="/", capture_output=True).returncode:
        pytest.skip("tkc is not installed (pip install -e .): torchrun's processes cannot import tkc.runtime")
