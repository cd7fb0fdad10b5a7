"""``x.T`` of a register tile (a product's accumulator, a loaded tile): the interpreter against
numpy on random inputs with tails, the emulator against the interpreter on compiled kernels,
ptxas without spills, and on a GPU the same as the interpreter.  On sm_90a the transpose moves
no value: the result's layout is ``#transpose`` of the operand's, in the same registers
(attention backward adds dQ^T = K^T dS^T into dQ this way)."""

from __future__ import annotations

import numpy as np
import pytest
from device_checks import interpret_and_emulate, interpret_and_run_on_gpu, lowered

from tkc.compiler import compile_kernel
from tkc.interpreter import random_args, run_kernel
from tkc.ir.layouts import Transposed, WgmmaAccumulator, transposes
from tkc.ir.types import LAYOUT_PARSERS

# A product's accumulator, transposed: stored, reduced, added to a loaded tile, and added
# atomically by two programs a block (y2 gets both programs' sums).
MMA = """@kernel
def mt(a: bf16[M, K], b: bf16[K, N], x: f32[N, M], y: f32[N, M], s: f32[N], y2: f32[N, M]):
    grid(cdiv(M, 64), 2)
    i = program_id(0)
    acc = a[i*64:(i+1)*64, 0:64] @ b[0:64, 0:64]
    if program_id(1) == 0:
        y[0:64, i*64:(i+1)*64] = acc.T * 2.0 + x[0:64, i*64:(i+1)*64]
        atomic_add(s[0:64], acc.T.sum(1))
    atomic_add(y2[0:64, i*64:(i+1)*64], acc.T)
"""
# A loaded tile, transposed (no products: blocked layouts).
BLOCKED = """@kernel
def bt(x: f32[M, N], y: f32[N, M]):
    grid(cdiv(M, 32))
    i = program_id(0)
    y[0:64, i*32:(i+1)*32] = x[i*32:(i+1)*32, 0:64].T - 1.0
"""


def _mma_ref(a: list[np.ndarray]) -> list[np.ndarray]:
    acc = (a[0][:, :64] @ a[1][:64, :64]).T  # N x M
    return [2 * acc + a[2], a[4] + acc.sum(1), a[5] + 2 * acc]


CASES = {
    # name: (source, dims, reference(args) -> the outputs y.. in order, the arguments they start from)
    "mma_acc": (MMA, {"M": 100, "K": 64, "N": 64}, _mma_ref),
    "blocked": (BLOCKED, {"M": 70, "N": 64}, lambda a: [a[0][:, :64].T - 1]),
}
OUTPUTS = {"mma_acc": [3, 4, 5], "blocked": [1]}


def _compile(name: str, stop: str):
    return compile_kernel(CASES[name][0], stop=stop, cache=False)


@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_matches_numpy(name: str) -> None:
    kernel = _compile(name, "tkir").kernel_op
    args = random_args(kernel, CASES[name][1], 0)
    ins = [np.asarray(a, np.float64) for a in args]
    run_kernel(kernel, args)
    for i, want in zip(OUTPUTS[name], CASES[name][2](ins)):
        np.testing.assert_allclose(np.asarray(args[i], np.float64), want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", list(CASES))
def test_emulator_matches_interpreter_without_spills(name: str) -> None:
    tile_ir = _compile(name, "tkir").kernel_op
    want, got = interpret_and_emulate(tile_ir, lowered(lambda stop: _compile(name, stop)).kernel_op,
                                      random_args(tile_ir, CASES[name][1], 2), 2)
    for i in OUTPUTS[name]:
        np.testing.assert_allclose(got[i], want[i], rtol=1e-5, atol=1e-5)


def test_transposes_move_no_value() -> None:
    text = _compile("mma_acc", "hopper").asm["hopper"]
    assert "tile.transpose" in text and "#transpose<#wgmma_acc<64>>" in text
    # The only conversions are the loaded x's into the transposed layout and the sum's.
    lay = WgmmaAccumulator(64)
    assert transposes(lay, Transposed(lay)) and not transposes(lay, lay)
    assert LAYOUT_PARSERS["transpose"]("#wgmma_acc<64, wg=2>") == Transposed(WgmmaAccumulator(64, 2))
    assert str(Transposed(WgmmaAccumulator(64, 2))) == "#transpose<#wgmma_acc<64, wg=2>>"


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_on_gpu_as_in_the_interpreter(name: str) -> None:
    _, want, got = interpret_and_run_on_gpu(lambda stop: _compile(name, stop), CASES[name][1])
    for i in OUTPUTS[name]:
        np.testing.assert_allclose(got[i], np.asarray(want[i], np.float64), rtol=1e-4, atol=1e-4)
