"""MXFP8 quantization and dequantization (examples/mx_fp8.tk, the ``f8e8m0`` scale type)
against torch's own conversions of the OCP MX rule, in the interpreter, the emulator against
the interpreter with ptxas finding no spills, and on a GPU.  Shapes leave tails in rows and in
the 16 blocks of a tile's row; rows include zero blocks, tiny and huge ones."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from device_checks import interpret_and_emulate, launch_tensors, lowered
from mx_reference import dequantize, quantize as reference, rows
from tkc.compiler import compile_kernel
from tkc.interpreter import run_kernel

FILE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "mx_fp8.tk"
SHAPES = [(37, 800), (16, 512), (5, 1056)]


def _compile(kernel: str, stop: str):
    return compile_kernel(FILE, {}, kernel=kernel, stop=stop, cache=False)


@pytest.mark.parametrize("M, K", SHAPES)
def test_quantize_as_torch_and_dequantize_exactly(M: int, K: int) -> None:
    x = rows(M, K, M + K)
    q = torch.empty(M, K, dtype=torch.float8_e4m3fn)
    s = torch.empty(M, K // 32, dtype=torch.float8_e8m0fnu)
    run_kernel(_compile("mx_quantize", "tkir").kernel_op, [x, q, s])
    want_q, want_s = reference(x)
    assert torch.equal(s.view(torch.uint8), want_s.view(torch.uint8))
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    back = torch.empty(M, K, dtype=torch.bfloat16)
    run_kernel(_compile("mx_dequantize", "tkir").kernel_op, [q, s, back])
    assert torch.equal(back, dequantize(q, s))
    # within e4m3's rounding of each value: half an ulp (2^-4 of it), half a subnormal step (2^-10
    # of the scale), or the clamp of a value at 448 to 512 times the scale (at most 1/7 of it)
    err = (back.float() - x.float()).abs().reshape(M, K // 32, 32)
    size, scale = x.float().abs().reshape(M, K // 32, 32), s.float()[..., None]
    clamped = size > 448 * scale
    assert torch.all(err <= torch.where(clamped, size / 7, torch.maximum(size * 2**-4, scale * 2**-10)))
    assert clamped.any() and not torch.all(clamped)


@pytest.mark.parametrize("kernel", ["mx_quantize", "mx_dequantize"])
def test_emulator_as_interpreter(kernel: str) -> None:
    x = rows(37, 800, 1)
    q, s = reference(x)
    args = [x, torch.empty_like(q), torch.empty_like(s)] if kernel == "mx_quantize" else \
        [q, s, torch.empty(37, 800, dtype=torch.bfloat16)]
    np_args = [a.float().numpy() for a in args]
    hopper = lowered(lambda stop: _compile(kernel, stop)).kernel_op
    want, got = interpret_and_emulate(_compile(kernel, "tkir").kernel_op, hopper, np_args, seed=2)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(np.nan_to_num(g, nan=7.0), np.nan_to_num(w, nan=7.0))


@pytest.mark.gpu
@pytest.mark.parametrize("M, K", SHAPES)
def test_on_gpu_as_torch(M: int, K: int) -> None:
    x = rows(M, K, 7 * M + K)
    q = torch.empty(M, K, dtype=torch.float8_e4m3fn)
    s = torch.empty(M, K // 32, dtype=torch.float8_e8m0fnu)
    _, q, s = launch_tensors(_compile("mx_quantize", "cubin"), [x, q, s])
    want_q, want_s = reference(x)
    assert torch.equal(s.view(torch.uint8), want_s.view(torch.uint8))
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    _, _, back = launch_tensors(_compile("mx_dequantize", "cubin"), [q, s, torch.empty(M, K, dtype=torch.bfloat16)])
    assert torch.equal(back, dequantize(q, s))
