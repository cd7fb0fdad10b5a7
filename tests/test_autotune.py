"""tkc.autotune's argument errors (the GPU search itself is tested in tests/gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tkc
from tkc.errors import TkcUsageError

GEMM = Path(__file__).resolve().parents[1] / "examples" / "gemm.tk"


def test_needs_configurations() -> None:
    with pytest.raises(TkcUsageError, match="at least one configuration"):
        tkc.autotune(GEMM, [], [])


def test_needs_a_kernel() -> None:
    with pytest.raises(TkcUsageError, match="takes a @tkc.kernel or a .tk path, got int"):
        tkc.autotune(3, [], [{}])


def test_needs_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TkcUsageError, match="times kernels on a GPU; torch sees none"):
        tkc.autotune(GEMM, [], [{"BN": 128}])
