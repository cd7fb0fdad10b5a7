"""Rows shorter than their block on the GPU: loads and stores whose box reaches past the
tensor by whole runs go by runs (each run's vector access predicated on its run,
tkc/codegen/lower_global.py), the rest the edge loop; both agree with the interpreter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from device_checks import interpret_and_run_on_gpu
from tkc.codegen.lower import kernel_to_llvm
from tkc.compiler import compile_kernel

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CASES = [
    # aligned rows shorter than the block: by runs (LayerNorm's loads, deferred weight
    # and bias, its store; softmax's loads, -inf past the row, and its store)
    ("layernorm.tk", {"BN": 4096}, {"M": 9, "N": 4000}),
    ("layernorm.tk", {"BN": 1024}, {"M": 9, "N": 2504}),  # two sweeps, the last block short
    ("layernorm_residual.tk", {"BN": 5120}, {"M": 5, "N": 5000}),
    ("softmax.tk", {"BN": 4096}, {"M": 7, "N": 4000}),
    # a 2-D block past both the rows and the columns
    ("softmax.tk", {"BM": 16, "BN": 1024}, {"M": 37, "N": 1000}),
    # misaligned rows (a row is not a multiple of 8 bf16): the edge loop
    ("layernorm.tk", {"BN": 4096}, {"M": 9, "N": 4001}),
]


def test_the_cases_go_by_runs_with_predicates() -> None:
    # CPU: the kernels above test each access's runs against the row's end (the GPU test below
    # checks what they compute)
    for name, consts, _ in CASES:
        op = compile_kernel(EXAMPLES / name, consts, stop="hopper", cache=False).kernel_op
        llvm = str(kernel_to_llvm(op))
        assert "ld.tile.vec" in llvm and "@p ld.global.v4" in llvm and "@p st.global.cs.v4" in llvm, name


@pytest.mark.gpu
@pytest.mark.parametrize("name, consts, dims", CASES)
def test_rows_shorter_than_their_block_as_the_interpreter(name: str, consts: dict, dims: dict) -> None:
    args, want, got = interpret_and_run_on_gpu(
        lambda stop: compile_kernel(EXAMPLES / name, consts, stop=stop, cache=False), dims)
    for a, w, g in zip(args, want, got):
        if isinstance(a, np.ndarray):
            np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=2e-2, atol=2e-2)
