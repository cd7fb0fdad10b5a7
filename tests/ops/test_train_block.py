"""The Llama-style model of benchmarks/train_block.py trained a few steps on the CPU: the tkc
model (tkc.ops.rms_norm and tkc.ops.attention through the interpreter, forward and backward)
follows the torch model's loss from the same weights and batches, and the loss falls."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def train_block():
    import cProfile  # noqa: F401  (the standard library's profile, before benchmarks/ is on the path)

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import train_block
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return train_block


def test_tkc_model_trains_like_the_torch_model(train_block) -> None:
    res = train_block.run(train_block.TINY, steps=3, device="cpu", compile_mode=None)
    ours, ref = res["tkc"][0], res["torch"][0]
    assert all(abs(a - b) < 0.02 * abs(b) for a, b in zip(ours, ref)), (ours, ref)
    assert ours[-1] < ours[0] - 0.05, ours  # it learns: lr 1e-2 on a 64-token chain
