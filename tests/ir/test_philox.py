"""``rand(seed, offsets)``: Philox-4x32-10 as Random123 defines it, the same bits in the
interpreter and the emulator (numpy) and on the GPU (tkc/codegen/lower_rand.py), located
refusals."""

from __future__ import annotations

import numpy as np
import pytest

from device_checks import (assert_refused, interpret_and_emulate, interpret_and_run_on_gpu, lowered,
                           needs_ptxas)
from tkc.compiler import compile_kernel
from tkc.errors import TkcTypeError
from tkc.interpreter import run_kernel
from tkc.ir.dialects.philox import philox, uniform

# offsets: a tile of i32 or i64 per program, here the flat index of each element plus `base`.
SRC = """
@kernel
def noise(u: f32[M, N], seed: i64, base: {odt}, BM: const = 16, BN: const = 32):
    grid(cdiv(M, BM), cdiv(N, BN))
    r = program_id(0) * BM
    c = program_id(1) * BN
    off = ((r + arange(BM))[:, None] * N + (c + arange(BN))[None, :]){cast} + base
    u[r:r+BM, c:c+BN] = rand(seed, off)
"""


def _src(odt: str) -> str:
    return SRC.format(odt=odt, cast=".to(i64)" if odt == "i64" else "")


def test_known_answer_of_random123() -> None:
    # Random123's kat_vectors: philox4x32 10 rounds, counter 0, key 0 -> these four words,
    # which offsets 0-3 take in turn; offset 4 starts counter 1.
    assert [int(w) for w in philox(0, np.arange(5))[:4]] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert int(philox(0, np.array([4]))[0]) not in (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)


def test_uniform_is_in_zero_one_with_24_bits() -> None:
    u = uniform(12345, np.arange(1 << 16))
    assert u.dtype == np.float32 and u.min() >= 0.0 and u.max() < 1.0
    assert np.all(u * 2.0 ** 24 == np.floor(u * 2.0 ** 24))
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    # a different seed or offset gives other numbers
    assert not np.array_equal(u, uniform(12346, np.arange(1 << 16)))
    assert not np.array_equal(u[1:], u[:-1])


@pytest.mark.parametrize("odt, seed, base", [("i32", 0, 0), ("i32", 7, -5000), ("i64", -(2 ** 40) - 3, 2 ** 33 + 1),
                                             ("i64", 2 ** 63 - 1, -(2 ** 62))])
def test_interpreter_is_philox(odt: str, seed: int, base: int) -> None:
    M, N = 20, 40
    k = compile_kernel(_src(odt), {}, stop="tkir", cache=False).kernel_op
    u = np.full((M, N), np.nan, np.float32)
    run_kernel(k, [u, seed, base])
    flat = np.arange(M * N, dtype=np.int64).reshape(M, N)
    off = (flat.astype(np.int32) + np.int32(base)) if odt == "i32" else flat + base
    np.testing.assert_array_equal(u, uniform(seed, off))


@pytest.mark.parametrize("odt, seed, base", [("i32", 3, -77), ("i64", -(2 ** 40) - 3, 2 ** 33 + 1)])
def test_emulator_gives_the_interpreters_bits(odt: str, seed: int, base: int) -> None:
    def to(stop):
        return compile_kernel(_src(odt), {}, stop=stop, cache=False)
    args = [np.full((20, 40), np.nan, np.float32), seed, base]
    want, got = interpret_and_emulate(to("tkir").kernel_op, lowered(to).kernel_op, args, 0)
    np.testing.assert_array_equal(got[0], want[0])


@needs_ptxas
def test_assembles_without_spills() -> None:
    lowered(lambda stop: compile_kernel(_src("i64"), {}, stop=stop, cache=False))


@pytest.mark.parametrize("call, message", [
    ("rand(1.5, off)", r"rand\(\) takes an i32 or i64 scalar as its seed"),
    ("rand(seed, off.to(f32))", r"rand\(\) takes i32 or i64 offsets \(a scalar or a tile\) as its offset"),
    ("rand(off, off)", r"rand\(\) takes an i32 or i64 scalar as its seed"),
])
def test_refusals_are_located(call: str, message: str) -> None:
    src = _src("i32").replace("rand(seed, off)", call)
    assert_refused(src, TkcTypeError, message, 8)


@pytest.mark.gpu
# N = 130: every other row starts at a multiple of 4 (one call for four values) and the rest do
# not (a call a value); base 4096 keeps that, -77 and 2**33 + 1 swap which rows.
@pytest.mark.parametrize("odt, seed, base", [("i32", 3, -77), ("i32", 11, 4096), ("i64", -(2 ** 40) - 3, 2 ** 33 + 1)])
def test_gpu_gives_the_interpreters_bits(odt: str, seed: int, base: int) -> None:
    def to(stop):
        return compile_kernel(_src(odt), {}, stop=stop, cache=False)
    _, want, got = interpret_and_run_on_gpu(to, [np.full((300, 130), np.nan, np.float32), seed, base])
    np.testing.assert_array_equal(got[0], want[0])
