"""``store(view, value, mask=m)``: only the masked-in elements are written.  Segments of a
packed tensor (cu_seqlens-style starts) scaled by their index, the last block of each cut at
the segment's end, against numpy in the interpreter, the emulator against the interpreter,
ptxas without spills, the GPU; the boxes of neighbouring programs overlap but their masks do
not, so no write-write race; misuse is a located error."""

from __future__ import annotations

import numpy as np
import pytest

from device_checks import require_gpu, assert_no_spills, assert_refused, needs_ptxas, run_on_gpu
from tkc import dtypes
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.errors import TkcEmulatorError, TkcError, TkcInterpretError
from tkc.interpreter import run_kernel

SEGMENTS = """@kernel
def segments(x: f32[T, D], starts: i32[S], y: f32[T, D], BM: const = 32, BD: const = 64):
    grid(S - 1, cdiv(D, BD))
    s = program_id(0)
    d = program_id(1)
    start = starts[s]
    end = starts[s + 1]
    rows = start + arange(BM)
    for i in range(cdiv(end - start, BM)):
        r = start + i * BM
        t = x[r:r+BM, d*BD:(d+1)*BD] * (s + 1).to(f32)
        store(y[r:r+BM, d*BD:(d+1)*BD], t, mask=(rows + i * BM < end)[:, None])
"""
STARTS = np.array([0, 7, 7, 50, 131, 200], np.int32)  # an empty segment, tails of every length


def _args(seed: int) -> list:
    x = np.random.default_rng(seed).standard_normal((200, 100)).astype(np.float32)
    return [x, STARTS.copy(), np.full((200, 100), np.nan, np.float32)]


def _want(x: np.ndarray) -> np.ndarray:
    want = np.full_like(x, np.nan)
    for s in range(len(STARTS) - 1):
        want[STARTS[s]:STARTS[s + 1]] = x[STARTS[s]:STARTS[s + 1]] * (s + 1)
    return want


def test_interpreter_and_emulator_write_only_the_masked_in_elements() -> None:
    args = _args(0)
    run_kernel(compile_kernel(SEGMENTS, stop="tkir", cache=False).kernel_op, args)
    np.testing.assert_array_equal(args[2], _want(args[0]))
    got = _args(0)
    emulate(compile_kernel(SEGMENTS, stop="hopper", cache=False).kernel_op, got)
    np.testing.assert_array_equal(got[2], args[2])


def test_overlapping_masks_of_two_programs_race() -> None:
    racy = SEGMENTS.replace("mask=(rows + i * BM < end)[:, None]", "mask=(rows + i * BM < end + 1)[:, None]")
    with pytest.raises(TkcInterpretError, match=r"write-write race on element \[7, 0\] of 'y'"):
        run_kernel(compile_kernel(racy, stop="tkir", cache=False).kernel_op, _args(0))
    with pytest.raises(TkcEmulatorError, match=r"write-write race on element \[7, \d+\] of 'y'"):
        emulate(compile_kernel(racy, stop="hopper", cache=False).kernel_op, _args(0))


@needs_ptxas
def test_assembles_without_spills() -> None:
    assert_no_spills(compile_kernel(SEGMENTS, stop="cubin", cache=False))


@pytest.mark.parametrize("body, message", [
    ("store(y[0:16, 0:16], x[0:16, 0:16], mask=1.0)", r"store\(\.\.\., mask=\) takes a bool tile"),
    ("store(y[0:16, 0:16], x[0:16, 0:16], mask=arange(16) < 3)", r"takes a bool tile of the slice's shape"),
    ("store(y[0, 0], x[0, 0], mask=arange(16) < 3)", r"writes a tile"),
    ("store(x, 1.0)", r"store\(\) takes a tensor slice"),
])
def test_misuse_is_a_located_error(body: str, message: str) -> None:
    src = f"@kernel\ndef k(x: f32[M, N], y: f32[M, N]):\n    grid(1)\n    {body}\n"
    assert_refused(src, TkcError, message, 4, stop="tkir")


@pytest.mark.gpu
def test_on_gpu_as_in_the_interpreter() -> None:
    require_gpu()
    args = _args(3)
    got = run_on_gpu(compile_kernel(SEGMENTS, cache=False), args)
    np.testing.assert_array_equal(got[2], _want(args[0]))


@pytest.mark.gpu
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_row_masks_take_vector_stores_on_gpu(dt: str) -> None:
    # a mask that is one value a row: 16-byte runs under its predicate where the tile lies
    # inside the tensor (D = 128: whole tiles; D = 100: the edge path beside them)
    require_gpu()
    src = SEGMENTS.replace("f32[T, D]", f"{dt}[T, D]").replace("(s + 1).to(f32)", f"(s + 1).to({dt})")
    assert "@p st.global.cs.v" in compile_kernel(src, stop="ptx", cache=False).asm["ptx"]
    for d in (128, 100):
        x = dtypes.round_to(np.random.default_rng(d).standard_normal((200, d)), getattr(dtypes, dt)).astype(np.float32)
        args = [x, STARTS.copy(), np.full((200, d), np.nan, np.float32)]
        want = [a.copy() for a in args]
        run_kernel(compile_kernel(src, stop="tkir", cache=False).kernel_op, want)
        got = run_on_gpu(compile_kernel(src, cache=False), args)
        np.testing.assert_array_equal(got[2], want[2])


def test_an_emulated_run_without_check_says_the_kernels_race_in_the_languages_words() -> None:
    # without --check the interpreter had not run: the emulator's error named 'tile.masked_store'
    # in a role of a CTA
    from tkc.runner import run

    racy = SEGMENTS.replace("mask=(rows + i * BM < end)[:, None]", "mask=(rows + i * BM < end + 1)[:, None]")
    kernel = compile_kernel(racy, stop="tkir", cache=False).kernel_op
    with pytest.raises(TkcInterpretError, match=r"write-write race on element \[7, 0\] of 'y'") as e:
        run(kernel, _args(0), "emulate")
    assert "tile.masked_store" not in str(e.value) and "role" not in str(e.value)
