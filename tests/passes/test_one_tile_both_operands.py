"""One register tile read as both operands of a product (``p @ p``): select-layouts stages it
once as A (K-major) and once as B in B's layout.  It redirected every operand reading the tile to
the first copy, so B read A's layout: wrong numbers on sm_90a (12216 of 12800 elements), and on
sm_100a a refusal at the cast in compiler words."""

from __future__ import annotations

import pytest

from device_checks import interpret_and_run_on_gpu
from tkc.compiler import compile_kernel
from tkc.errors import TkcUnsupportedError
from tkc.interpreter import random_args
from tkc.runner import run

SQUARE = """@kernel
def square(a: {dt}[M, K], b: {dt}[N, K], c: bf16[M, N], BM: const = 64, BN: const = 64, K: const = 64):
    grid(cdiv(M, BM))
    r = program_id(0) * BM
    acc = a[r:r+BM, :] @ b[0:BN, :].T
    p = acc.to({dt})
    c[r:r+BM, 0:BN] = (p @ p).to(bf16)
"""


@pytest.mark.parametrize(("dt", "target"), [("bf16", "sm_90a"), ("bf16", "sm_100a"), ("f8e4m3", "sm_100a")])
def test_a_tile_squared_agrees_with_the_interpreter(dt: str, target: str) -> None:
    kernel = compile_kernel(SQUARE.format(dt=dt), stop="tkir", cache=False).kernel_op
    for seed in (0, 1):
        result = run(kernel, random_args(kernel, {"M": 200, "N": 64}, seed), "emulate", check=True, seed=seed,
                     target=target)
        assert result.ok, result.checked


def test_an_8bit_tile_squared_on_sm_90a_says_to_store_b_k_major() -> None:
    with pytest.raises(TkcUnsupportedError, match=r"f8e4m3 operands must be K-major: store B transposed"):
        compile_kernel(SQUARE.format(dt="f8e4m3"), stop="hopper", cache=False)


@pytest.mark.gpu
def test_a_tile_squared_on_gpu() -> None:
    text = SQUARE.format(dt="bf16")
    _, want, got = interpret_and_run_on_gpu(lambda stop: compile_kernel(text, stop=stop, cache=False),
                                            {"M": 200, "N": 64})
    import numpy as np

    np.testing.assert_allclose(got[2], want[2], rtol=2e-2, atol=0.25)
