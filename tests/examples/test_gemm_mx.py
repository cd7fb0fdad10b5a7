"""The block-scaled product ``dot_scaled`` and examples/gemm_mx.tk (an MXFP8 GEMM): the
interpreter against torch's dequantize-then-multiply, the emulator of the lowered kernel against
the interpreter on sm_90a and sm_100a with ptxas finding no spills (also on other pins), and a GPU.  Shapes leave
tails in M, N and K; the operands are MX quantizations (examples/mx_fp8.tk's rule) of rows
whose 32-blocks span 2^-40 to 2^40, so the scales differ block by block."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from device_checks import interpret_and_emulate, launch_tensors, lowered
from mx_reference import dequantize, quantize
from tkc.compiler import compile_kernel
from tkc.errors import TkcUsageError
from tkc.interpreter import run_kernel

FILE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "gemm_mx.tk"
#: (M, N, K): tails in every one (BM = BN = 128, BK = 64 by default).
SHAPES = [(200, 136, 320), (64, 256, 128), (130, 40, 96)]


def _rows(M: int, K: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K // 32, 32, generator=g) * torch.exp2(torch.randint(-40, 40, (M, K // 32, 1), generator=g))
    return x.reshape(M, K).to(torch.bfloat16)


def _operands(M: int, N: int, K: int, seed: int):
    a, sa = quantize(_rows(M, K, seed))
    b, sb = quantize(_rows(N, K, seed + 1))
    return a, sa, b, sb


def _reference(a, sa, b, sb) -> torch.Tensor:
    """bf16 of the exact product (float64 sums of exact products), as the interpreter defines it."""
    return (dequantize(a, sa).double() @ dequantize(b, sb).double().T).float().to(torch.bfloat16)


def _compile(stop: str, target: str = "sm_90a", **consts):
    return compile_kernel(FILE, consts, kernel="gemm_mx", stop=stop, target=target, cache=False)


@pytest.mark.parametrize("M, N, K", SHAPES)
def test_interpreter_as_torch(M: int, N: int, K: int) -> None:
    a, sa, b, sb = _operands(M, N, K, M + N + K)
    c = torch.empty(M, N, dtype=torch.bfloat16)
    run_kernel(_compile("tkir").kernel_op, [a, sa, b, sb, c])
    want = _reference(a, sa, b, sb)
    # one bf16 rounding of an f32 sum: within an ulp of bf16 of the exact value
    assert torch.all((c.float() - want.float()).abs() <= want.float().abs() * 2**-7 + 1e-30), \
        (c.float() - want.float()).abs().max()


def test_nan_scale_is_nan() -> None:
    """E8M0's 0xFF is NaN: every output of the rows that read it is NaN, the others are not."""
    M, N, K = 64, 32, 64
    a, sa, b, sb = _operands(M, N, K, 3)
    sa.view(torch.uint8)[5, 1] = 0xFF
    c = torch.empty(M, N, dtype=torch.bfloat16)
    run_kernel(_compile("tkir", BM=64, BN=64).kernel_op, [a, sa, b, sb, c])
    assert torch.isnan(c[5]).all() and not torch.isnan(c[torch.arange(M) != 5]).any()


def test_scaled_operands_are_bf16_in_the_interpreter_as_compiled() -> None:
    """A tiny a * a_scale (an e4m3 subnormal times 2^-127) is 0 as a bf16 even where b's scale
    would bring the product back into range, and 448 * 2^127 is inf: the interpreter computes
    what the decomposition does (the emulator agrees), not the exact float64 product."""
    M, N, K = 128, 128, 64
    a = torch.full((M, K), 2.0**-9).to(torch.float8_e4m3fn)
    b = torch.ones(N, K).to(torch.float8_e4m3fn)
    sa = torch.full((M, K // 32), 2.0**-127).to(torch.float8_e8m0fnu)
    sb = torch.full((N, K // 32), 2.0**127).to(torch.float8_e8m0fnu)
    sa[1] = 1.0
    a[1] = 448.0
    sa[1, 0] = 2.0**127
    args = [x.float().numpy() for x in (a, sa, b, sb, torch.empty(M, N))]
    consts = {"ctas_per_sm": 1}
    want, got = interpret_and_emulate(_compile("tkir", **consts).kernel_op, _compile("hopper", **consts).kernel_op,
                                      args, seed=1)
    assert np.all(want[4][0] == 0) and np.all(np.isinf(want[4][1]))
    np.testing.assert_array_equal(got[4][:2], want[4][:2])


def test_the_warps_pin_is_refused_beside_a_block_scaled_product() -> None:
    """Its rows set the warps, as a product's do: refused before the interpreter runs."""
    with pytest.raises(TkcUsageError, match="pin warps = 8: the pin sets the warps of kernels without products"):
        _compile("tkir", warps=8)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("M, N, K", SHAPES[:2])
def test_emulator_as_interpreter(M: int, N: int, K: int, target: str) -> None:
    args = [*_operands(M, N, K, 11 * M + K), torch.empty(M, N, dtype=torch.bfloat16)]
    np_args = [x.float().numpy() for x in args]
    lowered_kernel = lowered(lambda stop: _compile(stop, target)).kernel_op
    want, got = interpret_and_emulate(_compile("tkir", target).kernel_op, lowered_kernel, np_args, seed=5)
    # the emulator's wgmma sums in f32 in its own order, the interpreter in float64
    np.testing.assert_allclose(got[4], want[4], rtol=2**-7, atol=0)


@pytest.mark.parametrize("pins", [{"BN": 256, "ctas_per_sm": 1}, {"ctas_per_sm": 1}, {"BK": 32, "ctas_per_sm": 1},
                                  {"stage_loads": 2}])
def test_pins_compile_without_spills(pins: dict) -> None:
    lowered(lambda stop: _compile(stop, **pins))


def _assert_close_to_sums(c: torch.Tensor, a, sa, b, sb) -> None:
    """``c`` within one bf16 rounding of the exact product, plus f32 summation error: 2^-20 of
    the sum of the terms' magnitudes (blocks whose scales differ by 2^80 cancel in f32 on the
    tensor cores, in an order of their own)."""
    want = _reference(a, sa, b, sb).double()
    size = dequantize(a, sa).double().abs() @ dequantize(b, sb).double().abs().T
    err = (c.double() - want).abs()
    bound = want.abs() * 2**-7 + size * 2**-20
    assert torch.all(err <= bound), (err - bound).max()


@pytest.mark.gpu
@pytest.mark.parametrize("pins", [{}, {"BN": 256, "ctas_per_sm": 1}, {"ctas_per_sm": 1, "stage_loads": 0}])
@pytest.mark.parametrize("M, N, K", SHAPES)
def test_on_gpu_as_torch(M: int, N: int, K: int, pins: dict) -> None:
    a, sa, b, sb = _operands(M, N, K, 5 * M + N)
    *_, c = launch_tensors(_compile("cubin", **pins), [a, sa, b, sb, torch.empty(M, N, dtype=torch.bfloat16)])
    _assert_close_to_sums(c, a, sa, b, sb)


# ---------------------------------------------------------------- weights only (a's scales None)
def _weights_compile(stop: str, target: str = "sm_90a", **consts):
    return compile_kernel(FILE, consts, kernel="gemm_mx_weights", stop=stop, target=target, cache=False)


def _weights_operands(M: int, N: int, K: int, seed: int):
    x = _rows(M, K, seed)
    w, sw = quantize(_rows(N, K, seed + 1))
    return x, w, sw


def _weights_reference(x, w, sw) -> torch.Tensor:
    return (x.double() @ dequantize(w, sw).double().T).float().to(torch.bfloat16)


@pytest.mark.parametrize("M, N, K", SHAPES)
def test_weights_only_interpreter_as_torch(M: int, N: int, K: int) -> None:
    x, w, sw = _weights_operands(M, N, K, 2 * M + K)
    c = torch.empty(M, N, dtype=torch.bfloat16)
    run_kernel(_weights_compile("tkir").kernel_op, [x, w, sw, c])
    want = _weights_reference(x, w, sw)
    assert torch.all((c.float() - want.float()).abs() <= want.float().abs() * 2**-7 + 1e-30)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_weights_only_emulator_as_interpreter(target: str) -> None:
    """x's tiles reach the product as they are loaded (TMA on sm_90a), w's are dequantized."""
    M, N, K = 200, 136, 320
    args = [t.float().numpy() for t in (*_weights_operands(M, N, K, 4), torch.empty(M, N))]
    hopper = lowered(lambda stop: _weights_compile(stop, target)).kernel_op
    if target == "sm_90a":
        assert any(op.name == "hopper.tma_load" and op.tensor.name_hint == "x" for op in hopper.walk())
    want, got = interpret_and_emulate(_weights_compile("tkir", target).kernel_op, hopper, args, seed=5)
    np.testing.assert_allclose(got[3], want[3], rtol=2**-7, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", SHAPES)
def test_weights_only_on_gpu_as_torch(M: int, N: int, K: int) -> None:
    x, w, sw = _weights_operands(M, N, K, 3 * M + N)
    *_, c = launch_tensors(_weights_compile("cubin"), [x, w, sw, torch.empty(M, N, dtype=torch.bfloat16)])
    want = _weights_reference(x, w, sw).double()
    size = x.double().abs() @ dequantize(w, sw).double().abs().T
    assert torch.all((c.double() - want).abs() <= want.abs() * 2**-7 + size * 2**-20)


def _splitk_compile(stop: str, target: str = "sm_90a", **consts):
    return compile_kernel(FILE, consts, kernel="gemm_mx_weights_splitk", stop=stop, target=target, cache=False)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("M, N, K, consts", [(70, 136, 1088, {"SPLIT": 4}), (130, 200, 352, {"SPLIT": 3}),
                                              (100, 72, 544, {"BM": 128, "BN": 64, "SPLIT": 2})], ids=str)
def test_weights_split_k_emulator_as_interpreter(M: int, N: int, K: int, consts: dict, target: str) -> None:
    """K split over SPLIT programs a tile, each adding into f32 (zeroed): tails in M, N and K, a
    program with fewer K blocks than another (1088 = 8.5 blocks of 128 over 4), and programs
    with none (352 = 2.75 blocks over 3); the 128 x 64 tiles tkc.ops.mx_matmul takes past 64 rows."""
    x, w, sw = _weights_operands(M, N, K, M + K)
    args = [t.float().numpy() for t in (x, w, sw, torch.zeros(M, N))]
    hopper = lowered(lambda stop: _splitk_compile(stop, target, **consts)).kernel_op
    want, got = interpret_and_emulate(_splitk_compile("tkir", target, **consts).kernel_op, hopper, args, seed=2)
    # f32 sums in another order (the blocks span 2^-40 to 2^40): within 2^-20 of the terms' sizes
    ref = (x.double() @ dequantize(w, sw).double().T).numpy()
    size = (x.double().abs() @ dequantize(w, sw).double().abs().T).numpy()
    for c in (want[3], got[3]):
        assert np.all(np.abs(c - ref) <= size * 2**-20)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_gemm_nt_emulator_as_interpreter(target: str) -> None:
    """The bf16 product tkc.ops.mx_matmul runs after dequantizing (a weight [N, K], K-major)."""
    M, N, K = 200, 264, 136
    g = torch.Generator().manual_seed(6)
    args = [torch.randn(M, K, generator=g).bfloat16().float().numpy(),
            torch.randn(N, K, generator=g).bfloat16().float().numpy(), np.zeros((M, N), np.float32)]
    c = lowered(lambda stop: compile_kernel(FILE, {}, kernel="gemm_nt", stop=stop, target=target, cache=False))
    tile_ir = compile_kernel(FILE, {}, kernel="gemm_nt", stop="tkir", target=target, cache=False).kernel_op
    want, got = interpret_and_emulate(tile_ir, c.kernel_op, args, seed=1)
    np.testing.assert_allclose(got[2], want[2], rtol=2**-7, atol=1e-2)
