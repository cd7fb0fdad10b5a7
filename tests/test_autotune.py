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


def test_needs_positive_rounds() -> None:
    with pytest.raises(TkcUsageError, match="runs >= 1 and rounds >= 1, got runs=20, rounds=0"):
        tkc.autotune(GEMM, [], [{}], rounds=0)


def test_turns_cancel_a_clock_that_slows_down() -> None:
    """Three configurations, the second truly fastest, on a GPU that gets 5% slower with every
    call: timed one after another, the first would win; taking turns, the second does."""
    from tkc.runtime.timing import interleaved_medians

    true_time = [1.00, 0.96, 1.02]
    calls = []

    def timer(i: int):
        def run() -> float:
            calls.append(i)
            return true_time[i] * (1 + 0.05 * len(calls))
        return run

    sequential = [true_time[i] * (1 + 0.05 * (i + 1)) for i in range(3)]
    assert min(range(3), key=sequential.__getitem__) == 0  # the drift alone would pick config 0
    medians = interleaved_medians([timer(i) for i in range(3)], rounds=6)
    assert min(range(3), key=medians.__getitem__) == 1
    assert sorted(calls) == [0] * 6 + [1] * 6 + [2] * 6
    assert calls[:6] == [0, 1, 2, 1, 2, 0]  # round r starts at timer r


def test_two_kernels_of_one_file_are_tuned_apart() -> None:
    # the disk cache's key holds what _source gives: kernels of one file taking the same
    # arguments shared a tuned result before it held their names
    from tkc.autotune import _source

    path = Path(__file__).parents[1] / "examples" / "attn_train.tk"
    fwd, bwd = tkc.load(path, "attn_fwd"), tkc.load(path, "attn_bwd")
    assert fwd.source == bwd.source and _source(fwd) != _source(bwd)


def test_a_kernel_is_timed_with_the_pins_its_launch_adds(monkeypatch) -> None:
    """``kernel(*args, **best.consts)`` launches with tkc.schedule's pins for the shapes: the
    build autotune times must be that one, not the configuration alone."""
    import torch

    from tkc.autotune import _compile

    k = tkc.load(Path(__file__).resolve().parents[1] / "examples" / "attn.tk")
    built = []
    monkeypatch.setattr(type(k), "specialize", lambda self, **c: built.append(c))
    args = [torch.empty(32, 16, 512, 128, dtype=torch.bfloat16, device="meta")] * 4 + [0.1]
    _compile(k, {"D": 128}, "sm_90a", args)
    _compile(k, {"D": 128, "persistent": False}, "sm_90a", args)
    assert built == [{"D": 128, "defer_last": True, "persistent": True},
                     {"D": 128, "persistent": False, "defer_last": True}]
