"""TMA copies start at 16-byte columns: what the compiler knows of a column offset's divisors
(tkc.passes.divisors), the copies it makes only where the offset is known aligned, and the
emulator's refusal of a copy from any other column (the GPU stops it with an illegal
instruction)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from device_checks import interpret_and_emulate, interpret_and_run_on_gpu, lowered

from tkc.compiler import compile_kernel
from tkc.errors import TkcEmulatorError
from tkc.interpreter import random_args
from tkc.ir.parser import parse_module
from tkc.passes.divisors import column_aligned, power_of_two_divisor

ROOT = Path(__file__).resolve().parents[2]
UNALIGNED = ROOT / "tests" / "contract" / "unaligned_columns.tk"

OFFSETS = """@kernel
def offsets(x: f32[M, N], y: f32[M], off: i32, BN: const = 64):
    grid(1)
    p = program_id(0)
    acc = zeros([16], f32)
    j = 0
    for k in range(2, 9, 4):
        acc += load(x[0, k*BN:k*BN+16])
        acc += load(x[0, j:j+16])
        j = j + 16
    acc += load(x[0, off:off+16])
    acc += load(x[0, off*12:off*12+16])
    acc += load(x[0, 16 + p*48:16 + p*48+16])
    acc += load(x[0, p*BN + 8:p*BN + 24])
    acc += load(x[0, (off << 3) - 32:(off << 3) - 16])
    acc += load(x[0, 0:16])
    y[0:16] = acc
"""


def _loads(src: str) -> list:
    kernel = compile_kernel(src, {}, stop="tkir", cache=False).kernel_op
    return [op for op in kernel.walk() if op.name == "tile.load"]


def test_the_divisors_of_column_offsets() -> None:
    got = [power_of_two_divisor(op.offsets[-1]) for op in _loads(OFFSETS)]
    # k*64 (k from 2 by 4), j (carried by the loop: nothing known), off, off*12, 16 + p*48,
    # p*64 + 8, (off << 3) - 32, 0
    assert got == [128, 1, 1, 4, 16, 8, 8, 1 << 30]
    assert [column_aligned(op.offsets[-1], 4) for op in _loads(OFFSETS)] == \
        [True, False, False, True, True, True, True, True]
    assert [column_aligned(op.offsets[-1], 2) for op in _loads(OFFSETS)] == \
        [True, False, False, False, True, True, True, True]


def test_tiles_at_runtime_columns_are_loaded_and_stored_thread_by_thread() -> None:
    kernel = compile_kernel(UNALIGNED, {}, stop="hopper", cache=False).kernel_op
    params = kernel.regions[0].block.args
    a, c, d = params[0], params[2], params[3]
    loads = [op for op in kernel.walk() if op.name == "hopper.tma_load"]
    stores = [op for op in kernel.walk() if op.name == "hopper.tma_store"]
    # only the `off * 8` tiles (16 bytes a step) go by TMA: two loads and d's store
    assert len(loads) == 2 and {op.operands[0] for op in loads} != {a} and len(stores) == 1
    assert stores[0].operands[0] is d and c not in {op.operands[0] for op in stores}


def test_a_vector_at_a_runtime_column_is_no_tma_copy() -> None:
    """``s[b, start + i*BM]`` with ``start`` read from memory (varlen attention's lse before its
    rows were padded to multiples of 128): the pin tma_vectors leaves it to the threads;
    ``s[b, i*BM]`` takes it."""
    src = """@kernel
def shifted(x: bf16[M, D], w: bf16[N, D], s: f32[B, M], starts: i32[B], out: f32[B, N, M], BM: const = 64,
            BN: const = 64, D: const = 64):
    grid(cdiv(N, BN), B)
    j = program_id(0)
    b = program_id(1)
    wt = w[j*BN:(j+1)*BN, :]
    start = starts[b]
    for i in range(cdiv(M, BM)):
        r = OFF
        xt = x[i*BM:(i+1)*BM, :]
        l = s[b, r:r + BM]
        out[b, j*BN:(j+1)*BN, i*BM:(i+1)*BM] = wt @ xt.T - l[None, :]
"""
    def vectors(off: str) -> int:
        text = compile_kernel(src.replace("OFF", off), {"tma_vectors": True}, stop="hopper", cache=False).asm["hopper"]
        return text.count("hopper.smem_load")

    assert vectors("start + i*BM") == 0 and vectors("start // 64 * 64 + i*BM") == 1 and vectors("i*BM") == 1


@pytest.mark.parametrize("dims", [{"M": 64, "N": 80, "K": 144}, {"M": 70, "N": 64, "K": 80}])
def test_emulator_matches_interpreter_at_unaligned_columns(dims: dict) -> None:
    tile_ir = compile_kernel(UNALIGNED, {}, stop="tkir", cache=False).kernel_op
    hopper = lowered(lambda stop: compile_kernel(UNALIGNED, {}, stop=stop, cache=False)).kernel_op
    for off in (3, 1, 2):
        args = random_args(tile_ir, dims, off)
        args[-1] = off
        want, got = interpret_and_emulate(tile_ir, hopper, args, off)
        for w, g in zip(want[2:4], got[2:4]):
            np.testing.assert_allclose(g, w, rtol=2**-7, atol=1e-2)


def test_emulator_refuses_a_tma_copy_from_an_unaligned_column() -> None:
    """The `off * 8` copy with its factor edited to 1: a copy from column 3 is an error, as
    the GPU's illegal instruction."""
    text = compile_kernel(UNALIGNED, {}, stop="hopper", cache=False).asm["hopper"]
    edited = text.replace("tile.constant {value = 8}", "tile.constant {value = 1}")
    assert edited != text
    hopper = parse_module(edited).ops[0]
    tile_ir = compile_kernel(UNALIGNED, {}, stop="tkir", cache=False).kernel_op
    args = random_args(tile_ir, {"M": 64, "N": 80, "K": 144}, 0)
    args[-1] = 3
    with pytest.raises(TkcEmulatorError, match="multiple of 16 bytes"):
        interpret_and_emulate(tile_ir, hopper, args, 0)
    args[-1] = 8  # column 8 of bf16: 16 bytes in
    interpret_and_emulate(tile_ir, hopper, args, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("off", [4, 1, 8])
def test_on_gpu_at_unaligned_columns(off: int) -> None:
    """Column 4 of bf16 stopped an H200 with an illegal instruction when copied by TMA."""
    compile_to = lambda stop: compile_kernel(UNALIGNED, {}, stop=stop, cache=False)  # noqa: E731
    args = random_args(compile_to("tkir").kernel_op, {"M": 64, "N": 144, "K": 144}, 5)
    args[-1] = off
    _, want, got = interpret_and_run_on_gpu(compile_to, args)
    for w, g in zip(want[2:4], got[2:4]):
        np.testing.assert_allclose(g, w, rtol=2**-7, atol=1e-2)
