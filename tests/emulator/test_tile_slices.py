"""Slices of register tiles: ``acc[:, 0:64]`` (an aligned block of an axis), ``acc[:, 1::2]``
(every second element) and ``t[:, 5]`` (one index, the axis dropped) become a reshape and a
``tile.take``.  The interpreter takes numpy's
elements; lowered, an accumulator's halves are registers its threads already hold (no
conversion), a tile whose threads split the axis moves once through shared memory; the
emulator agrees with the interpreter and the dumps read back."""

from __future__ import annotations

import numpy as np
import pytest
from device_checks import interpret_and_emulate, lowered

from tkc.compiler import compile_kernel
from tkc.interpreter import random_args, run_kernel
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify

HALVES = """@kernel
def halves(a: bf16[M, K], w: bf16[K, 128], y: f32[M, 64], z: f32[M, 32], o: f32[M, 64]):
    grid(cdiv(M, 128))
    pm = program_id(0)
    x = zeros([128, 128], f32)
    for k in range(cdiv(K, 64)):
        x += a[pm*128:(pm+1)*128, k*64:(k+1)*64] @ w[k*64:(k+1)*64, :]
    y[pm*128:(pm+1)*128, :] = x[:, 0:64] - x[:, 64:]
    z[pm*128:(pm+1)*128, :] = x[:, 96:128] * 2.0
    o[pm*128:(pm+1)*128, :] = x[:, 1::2]
"""

BLOCKED = """@kernel
def columns(x: f32[M, 128], y: f32[M, 64], z: f32[M, 128], c: f32[M]):
    grid(cdiv(M, 64))
    r = program_id(0) * 64
    t = x[r:r+64, :]
    y[r:r+64, :] = t[:, 0:64] * 2.0 + t[:, 64:128]
    z[r:r+64, :] = t * 3.0
    c[r:r+64] = t[:, 5] + t[:, -1]
"""


def _compile(src, stop):
    return compile_kernel(src, {}, stop=stop, cache=False)


def test_the_interpreter_takes_numpys_elements() -> None:
    tile_ir = _compile(BLOCKED, "tkir").kernel_op
    args = random_args(tile_ir, {"M": 100}, 1)
    x = args[0].copy()
    run_kernel(tile_ir, args)
    np.testing.assert_array_equal(args[1], x[:, :64] * np.float32(2) + x[:, 64:])
    np.testing.assert_array_equal(args[3], x[:, 5] + x[:, 127])


@pytest.mark.parametrize("src, dims", [(HALVES, {"M": 200, "K": 200}), (BLOCKED, {"M": 100})])
def test_emulator_matches_interpreter(src, dims) -> None:
    tile_ir = _compile(src, "tkir").kernel_op
    args = random_args(tile_ir, dims, 2)
    want, got = interpret_and_emulate(tile_ir, lowered(lambda stop: _compile(src, stop)).kernel_op, args, 2)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_an_accumulators_halves_are_its_threads_registers() -> None:
    ops = [op.name for op in _compile(HALVES, "hopper").kernel_op.walk()]
    assert ops.count("tile.take") == 4 and "hopper.convert_layout" not in ops


def test_a_split_axis_moves_once() -> None:
    kernel = _compile(BLOCKED, "hopper").kernel_op
    convs = [op for op in kernel.walk() if op.name == "hopper.convert_layout" and op.x.type.shape == (64, 128)]
    # t once for its two halves, once for its two columns; never a 3-D tile.
    assert len(convs) == 2
    assert all(op.result.type.rank <= 2 for op in kernel.walk() if op.name == "hopper.convert_layout")


def test_the_dump_reads_back() -> None:
    text = _compile(BLOCKED, "hopper").asm["hopper"]
    assert "#stack<" in text
    verify(parse_module(text, "<dump>"))
