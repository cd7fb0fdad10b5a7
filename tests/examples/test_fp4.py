"""FP4: the ``f4e2m1x2`` dtype (pairs of E2M1 values a byte, torch.float4_e2m1fn_x2),
examples/mx_fp4.tk (MXFP4 and NVFP4 quantization) and examples/gemm_fp4.tk (``dot_scaled`` of FP4
operands): tkc's rounding against an oracle that finds the nearest E2M1 value by search, the
interpreter against torch, the emulator against the interpreter on sm_90a and sm_100a with ptxas
finding no spills, located refusals, and a GPU.  Shapes leave tails in M, N and K and in a
tile's blocks; rows span magnitudes from 2^-20 to 2^20 and hold zero blocks."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from device_checks import assert_refused, interpret_and_emulate, launch_tensors, lowered
from mx_reference import dequantize_fp4, e2m1_codes, quantize_mxfp4, quantize_nvfp4, unpack
from tkc import dtypes
from tkc.compiler import compile_kernel
from tkc.errors import TkcTypeError
from tkc.interpreter import run_kernel

ROOT = pathlib.Path(__file__).resolve().parents[2] / "examples"
QUANT, GEMM = ROOT / "mx_fp4.tk", ROOT / "gemm_fp4.tk"
#: (M, K) of the quantizers (tiles of 16 x 512).
SHAPES = [(37, 800), (16, 512), (5, 1056)]
#: (M, N, K) of the GEMMs: tails in every one (128 x 128 tiles, BK = 64).
GEMMS = [(200, 136, 320), (64, 256, 128)]


def _compile(file: pathlib.Path, kernel: str, stop: str, target: str = "sm_90a", **consts):
    return compile_kernel(file, consts, kernel=kernel, stop=stop, target=target, cache=False)


def _rows(M: int, K: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K // 16, 16, generator=g) * torch.exp2(torch.randint(-20, 20, (M, K // 16, 1), generator=g))
    x[torch.rand(M, K // 16, generator=g) < 0.05] = 0
    return x.reshape(M, K).to(torch.bfloat16)


def _g(x: torch.Tensor) -> torch.Tensor:
    """NVFP4's tensor-wide scale, amax / (6 * 448), as the kernels take it: a one-element f32 tensor."""
    return (x.float().abs().max() / (6 * 448)).reshape(1)


def test_e2m1_rounding_is_the_nearest_value() -> None:
    """tkc.dtypes' thresholds against the oracle's search: every tie, both sides of it, the
    saturation, infinities, NaN and -0.0, and 100k values across the range."""
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)
    x = torch.cat([ties, -ties, torch.nextafter(ties, ties + 1), torch.nextafter(ties, ties - 1),
                   torch.linspace(-8, 8, 100_001, dtype=torch.float64),
                   torch.tensor([6.0, 7.0, 1e30, float("inf"), -float("inf"), float("nan"), -0.0, 0.0, 1e-30])])
    np.testing.assert_array_equal(dtypes.e2m1_code(x.numpy()), e2m1_codes(x).numpy())
    codes = np.arange(16, dtype=np.uint8)
    np.testing.assert_array_equal(dtypes.e2m1_code(dtypes.e2m1_value(codes)), codes)
    pairs = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(dtypes.pack_fp4(dtypes.unpack_fp4(pairs)), pairs)
    assert torch.equal(unpack(torch.from_numpy(pairs).view(torch.float4_e2m1fn_x2)),
                       torch.from_numpy(dtypes.unpack_fp4(pairs)))


@pytest.mark.parametrize("M, K", SHAPES)
def test_quantizers_as_torch(M: int, K: int) -> None:
    x = _rows(M, K, M + K)
    g = _g(x)
    for fmt, block, sdt in (("mx", 32, torch.float8_e8m0fnu), ("nv", 16, torch.float8_e4m3fn)):
        extra = [] if fmt == "mx" else [g]
        q = torch.empty(M, K // 2, dtype=torch.float4_e2m1fn_x2)
        s = torch.empty(M, K // block, dtype=sdt)
        run_kernel(_compile(QUANT, f"{fmt}fp4_quantize", "tkir").kernel_op, [x, *extra, q, s])
        want_q, want_s = quantize_mxfp4(x) if fmt == "mx" else quantize_nvfp4(x, g)
        assert torch.equal(s.view(torch.uint8), want_s.view(torch.uint8)), fmt
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)), fmt
        back = torch.empty(M, K, dtype=torch.bfloat16)
        run_kernel(_compile(QUANT, f"{fmt}fp4_dequantize", "tkir").kernel_op, [q, s, *extra, back])
        assert torch.equal(back, dequantize_fp4(q, s, *extra).to(torch.bfloat16)), fmt
        # E2M1 keeps a value within a quarter of its block's largest (MXFP4's scale leaves the
        # largest at 4 to 8 times the scale, rounded to at most 6); zero blocks stay zero.
        # NVFP4's e4m3 scale of a block far below the tensor's largest is subnormal or 0: its
        # values are off by up to 6 of g's smallest e4m3 steps (2^-9 g) more.
        err = (back.float() - x.float()).abs().reshape(M, K // block, block)
        amax = x.float().abs().reshape(M, K // block, block).amax(-1, keepdim=True)
        slack = 1e-30 if fmt == "mx" else 6 * 2.0**-9 * g.item()
        assert torch.all(err <= amax / 4 + slack), fmt
        assert torch.all(back.reshape(M, K // block, block)[amax.expand(-1, -1, block) == 0] == 0), fmt


@pytest.mark.parametrize("kernel", ["mxfp4_quantize", "mxfp4_dequantize", "nvfp4_quantize", "nvfp4_dequantize"])
@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_quantizers_emulated_as_interpreted(kernel: str, target: str) -> None:
    x = _rows(37, 800, 1)
    g = _g(x)
    q, s = quantize_mxfp4(x) if kernel.startswith("mx") else quantize_nvfp4(x, g)
    extra = [] if kernel.startswith("mx") else [g]
    args = [x, *extra, torch.empty_like(q), torch.empty_like(s)] if kernel.endswith("_quantize") else \
        [q, s, *extra, torch.empty(37, 800, dtype=torch.bfloat16)]
    np_args = [dtypes.from_torch_tensor(a)[0] if isinstance(a, torch.Tensor) else a for a in args]
    hopper = lowered(lambda stop: _compile(QUANT, kernel, stop, target)).kernel_op
    want, got = interpret_and_emulate(_compile(QUANT, kernel, "tkir").kernel_op, hopper, np_args, seed=2)
    for w, o in zip(want, got):
        np.testing.assert_array_equal(o, w)


def _quantized(x: torch.Tensor, fmt: str) -> list:
    """An operand as the kernels take it: [pairs, scales] (MXFP4), [pairs, scales, g] (NVFP4)."""
    if fmt == "mx":
        return list(quantize_mxfp4(x))
    g = _g(x)
    return [*quantize_nvfp4(x, g), g]


def _exact(side: list) -> torch.Tensor:
    """float64 values of a quantized operand without NVFP4's g (exact: an E2M1 value times its
    scale is an f32), and its g (1.0 for MXFP4)."""
    return dequantize_fp4(side[0], side[1]).double(), (side[2].double().reshape(()) if len(side) == 3 else 1.0)


@pytest.mark.parametrize("M, N, K", GEMMS)
@pytest.mark.parametrize("fmt", ["mx", "nv"])
def test_gemm_interpreted_as_torch(M: int, N: int, K: int, fmt: str) -> None:
    a, b = _quantized(_rows(M, K, M + N + K), fmt), _quantized(_rows(N, K, M + N + K + 1), fmt)
    c = torch.empty(M, N, dtype=torch.bfloat16)
    run_kernel(_compile(GEMM, f"gemm_{fmt}fp4", "tkir").kernel_op, [*a, *b, c])
    (va, ga), (vb, gb) = _exact(a), _exact(b)
    want = (va @ vb.T * (ga * gb)).float()
    # one bf16 rounding of an f32 sum (NVFP4: the sum times ga * gb, two f32 roundings more):
    # within an ulp of bf16
    assert torch.all((c.float() - want).abs() <= want.abs() * 2**-7 + 1e-30), (c.float() - want).abs().max()


@pytest.mark.parametrize("fmt", ["mx", "nv"])
def test_weights_gemm_interpreted_as_torch(fmt: str) -> None:
    """bf16 activations by FP4 weights, K split over programs into f32."""
    M, N, K = 70, 136, 640
    x, w = _rows(M, K, 3), _quantized(_rows(N, K, 4), fmt)
    c = torch.zeros(M, N)
    run_kernel(_compile(GEMM, f"gemm_{fmt}fp4_weights_splitk", "tkir").kernel_op, [x, *w, c])
    vw, g = _exact(w)
    want = x.double() @ vw.T * g
    assert torch.allclose(c.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("kernel, target", [("gemm_mxfp4", "sm_90a"), ("gemm_nvfp4", "sm_90a"),
                                            ("gemm_mxfp4_weights_splitk", "sm_90a"),
                                            ("gemm_nvfp4_weights_splitk", "sm_90a"), ("gemm_mxfp4", "sm_100a"),
                                            ("gemm_nvfp4", "sm_100a"), ("gemm_nvfp4_weights_splitk", "sm_100a")])
def test_gemm_emulated_as_interpreted(kernel: str, target: str) -> None:
    """On sm_100a gemm_mxfp4 and gemm_nvfp4 are tcgen05's kind::mxf4nvf4 (their scales copied
    into tensor memory), the weights kernels decomposed as on sm_90a."""
    fmt = kernel[5:7]
    M, N, K = 130, 136, 320
    w = _quantized(_rows(N, K, 9), fmt)
    if "weights" in kernel:
        args = [_rows(M, K, 10), *w, torch.zeros(M, N)]
    else:
        args = [*_quantized(_rows(M, K, 10), fmt), *w, torch.empty(M, N, dtype=torch.bfloat16)]
    np_args = [dtypes.from_torch_tensor(t)[0] for t in args]
    hopper = lowered(lambda stop: _compile(GEMM, kernel, stop, target)).kernel_op
    want, got = interpret_and_emulate(_compile(GEMM, kernel, "tkir").kernel_op, hopper, np_args, seed=3)
    if "weights" in kernel:  # f32 atomic sums in the executors' orders
        np.testing.assert_allclose(got[-1], want[-1], rtol=1e-5, atol=1e-5 * np.abs(want[-1]).max())
    else:  # f32 sums in the tensor cores' order, rounded to bf16: within a bf16 ulp
        assert np.all(np.abs(got[-1] - want[-1]) <= np.abs(want[-1]) * 2**-7)


@pytest.mark.parametrize("kernel, vec, scale", [("gemm_mxfp4", 2, "UE8M0"), ("gemm_nvfp4", 4, "UE4M3")])
@pytest.mark.parametrize("bk", [64, 256])
def test_sm100a_fp4_products_are_mxf4nvf4(kernel: str, vec: int, scale: str, bk: int) -> None:
    """One ``kind::mxf4nvf4.block_scale.scale_vec::{2,4}X`` MMA a 64 values of K (32 bytes of
    pairs), the PTX at .version 8.7 (that kind's), no dequantizing multiply, zero spills."""
    from tkc.ir.dialects import blackwell

    hopper = _compile(GEMM, kernel, "hopper", "sm_100a", BK=bk).kernel_op
    mmas = [op for op in hopper.walk() if op.name == "blackwell.mma"]
    assert mmas and all(op.scale_vec == vec for op in mmas)
    idesc = mmas[0].scale_step(0)[0]
    assert bool(idesc >> 23 & 1) == (scale == "UE8M0")
    ptx = _compile(GEMM, kernel, "ptx", "sm_100a", BK=bk).asm["ptx"]
    assert ".version 8.7" in ptx
    assert ptx.count(f"kind::mxf4nvf4.block_scale.scale_vec::{vec}X") == bk // 64
    assert "kind::f16" not in ptx and blackwell.SCALED_KINDS[vec] == "mxf4nvf4"
    lowered(lambda stop: _compile(GEMM, kernel, stop, "sm_100a", BK=bk))


def test_nvfp4_scales_count_by_their_magnitude() -> None:
    """NVFP4's e4m3 scales are unsigned (UE4M3): a negative scale multiplies as its magnitude,
    in the interpreter, decomposed on sm_90a and natively on sm_100a alike."""
    M, N, K = 128, 128, 128
    a, w = _quantized(_rows(M, K, 21), "nv"), _quantized(_rows(N, K, 22), "nv")
    c = torch.empty(M, N, dtype=torch.bfloat16)
    run_kernel(_compile(GEMM, "gemm_nvfp4", "tkir").kernel_op, [*a, *w, c])
    negated = [a[0], (-a[1].float()).to(torch.float8_e4m3fn), a[2], w[0], (-w[1].float()).to(torch.float8_e4m3fn), w[2]]
    c_neg = torch.empty_like(c)
    run_kernel(_compile(GEMM, "gemm_nvfp4", "tkir").kernel_op, [*negated, c_neg])
    assert torch.equal(c, c_neg)
    np_args = [dtypes.from_torch_tensor(t)[0] for t in [*negated, torch.empty_like(c)]]
    for target in ("sm_90a", "sm_100a"):
        hopper = _compile(GEMM, "gemm_nvfp4", "hopper", target).kernel_op
        want, got = interpret_and_emulate(_compile(GEMM, "gemm_nvfp4", "tkir").kernel_op, hopper, np_args, seed=4)
        np.testing.assert_array_equal(want[-1], c.float().numpy())
        assert np.all(np.abs(got[-1] - want[-1]) <= np.abs(want[-1]) * 2**-7), target


_ROUND_TRIP = """
@kernel
def round_trip(x: f32[M, K], q: f4e2m1x2[M, KH], y: f32[M, K]):
    grid(cdiv(M, 16))
    i = program_id(0)
    p = x[i*16:(i+1)*16, 0:64].to(f4e2m1x2)
    q[i*16:(i+1)*16, 0:32] = p
    y[i*16:(i+1)*16, 0:64] = p.to(f32)
"""


def _edge_values() -> np.ndarray:
    """64 x 64 f32 values at every place E2M1's rounding decides: each tie and the f32 values
    either side of it, the saturation, zeros, infinities, NaN, subnormals, and random values."""
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], np.float32)
    near = np.concatenate([ties, np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(0))])
    special = np.array([0.0, -0.0, 7.0, 1e30, np.inf, -np.inf, np.nan, 1e-45, -1e-40, 0.5, 4.0], np.float32)
    x = np.concatenate([near, -near, special, np.random.default_rng(5).standard_normal(4096) * 3]).astype(np.float32)
    return x[:4096].reshape(64, 64)


def test_rounding_emulated_as_interpreted() -> None:
    """``.to(f4e2m1x2)`` and back at every edge of the rounding, the lowered kernel against the
    interpreter (the GPU test below checks the PTX's integer sequence itself)."""
    x = _edge_values()
    args = [x, np.zeros((64, 32), np.uint8), np.zeros((64, 64), np.float32)]
    hopper = lowered(lambda stop: compile_kernel(_ROUND_TRIP, stop=stop, cache=False)).kernel_op
    want, got = interpret_and_emulate(compile_kernel(_ROUND_TRIP, stop="tkir", cache=False).kernel_op, hopper, args,
                                      seed=1)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(want[1], dtypes.pack_fp4(x))
    np.testing.assert_array_equal(got[2], dtypes.unpack_fp4(dtypes.pack_fp4(x)))


@pytest.mark.gpu
def test_rounding_on_gpu_as_interpreted() -> None:
    x = torch.from_numpy(_edge_values())
    q = torch.zeros(64, 32, dtype=torch.float4_e2m1fn_x2)
    *_, gq, gy = launch_tensors(compile_kernel(_ROUND_TRIP, stop="cubin", cache=False), [x, q, torch.zeros(64, 64)])
    want = dtypes.pack_fp4(x.numpy())
    np.testing.assert_array_equal(gq.view(torch.uint8).numpy(), want)
    np.testing.assert_array_equal(gy.numpy(), dtypes.unpack_fp4(want))


_HEAD = "@kernel\ndef k(w: f4e2m1x2[N, KH], x: bf16[M, K], s: f8e8m0[N, KS], y: f32[M, N]):\n"


@pytest.mark.parametrize("body, message, line", [
    ("    t = w[0:16, 0:16]\n    y[0:16, 0:16] = t + t\n", "pairs of FP4 values, which have no arithmetic", 4),
    ("    y[0:16, 0:32] = exp(w[0:16, 0:16])\n", "unpack them with .to", 3),
    ("    t = w[0:16, 0:16].to(f32)\n    y[0:16, 0:16] = w[0:16, 0:16].to(i32)\n", "unpack to floats, not i32", 4),
    ("    y[0:16, 0:16] = x[0:16, 0:16].to(f4e2m1x2).to(f32)\n", "must be a multiple of 32", 3),
    ("    y[0:16, 0:32] = load(w[0:16, 0:16], other=2).to(f32)\n", "other= cannot fill a pair", 3),
    ("    y[0:16, 0:32] = full([16, 16], 2, f4e2m1x2).to(f32)\n", "zeros only, not 2", 3),
    ("    y[0, 0:16] = w[0:16, 0:16].max(1).to(f32)[0:16]\n", r"max\(\) of a tile of f4e2m1x2", 3),
    ("    y[0:16, 0:16] = dot_scaled(x[0:16, 0:64], None, w[0:32, 0:16], s[0:32, 0:2])\n",
     r"read transposed, whose pairs run along K: w\[...\]\.T", 3),
    ("    y[0:16, 0:16] = dot_scaled(w[0:16, 0:32].T, s[0:32, 0:1], x[0:16, 0:64].T, None)\n",
     "its last axis as loaded", 3),
    ("    y[0:16, 0:32] = dot_scaled(x[0:16, 0:64], None, w[0:32, 0:16].T, s[0:32, 0:2].T)\n",
     r"K = 64 and 32, FP4 pairs counting two", 3),
    ("    y[0:16, 0:32] = dot_scaled(x[0:16, 0:64], None, w[0:32, 0:32].T, x[0:32, 0:2].T)\n",
     r"f8e8m0 scales \(E8M0, one per 32 values along K\), or NVFP4's", 3),
])
def test_refusals(body: str, message: str, line: int) -> None:
    assert_refused(_HEAD + body, TkcTypeError, message, line)


@pytest.mark.gpu
@pytest.mark.parametrize("M, K", SHAPES)
def test_quantizers_on_gpu_as_torch(M: int, K: int) -> None:
    x = _rows(M, K, 7 * M + K)
    g = _g(x)
    for fmt, block, sdt in (("mx", 32, torch.float8_e8m0fnu), ("nv", 16, torch.float8_e4m3fn)):
        extra = [] if fmt == "mx" else [g]
        q = torch.empty(M, K // 2, dtype=torch.float4_e2m1fn_x2)
        s = torch.empty(M, K // block, dtype=sdt)
        *_, q, s = launch_tensors(_compile(QUANT, f"{fmt}fp4_quantize", "cubin"), [x, *extra, q, s])
        want_q, want_s = quantize_mxfp4(x) if fmt == "mx" else quantize_nvfp4(x, g)
        assert torch.equal(s.view(torch.uint8), want_s.view(torch.uint8)), fmt
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)), fmt
        *_, back = launch_tensors(_compile(QUANT, f"{fmt}fp4_dequantize", "cubin"),
                                  [q, s, *extra, torch.empty(M, K, dtype=torch.bfloat16)])
        assert torch.equal(back, dequantize_fp4(q, s, *extra).to(torch.bfloat16)), fmt


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mx", "nv"])
def test_gemms_on_gpu_as_interpreted(fmt: str) -> None:
    M, N, K = 200, 136, 320
    a, w = _quantized(_rows(M, K, 11), fmt), _quantized(_rows(N, K, 12), fmt)
    c = torch.empty(M, N, dtype=torch.bfloat16)
    run_kernel(_compile(GEMM, f"gemm_{fmt}fp4", "tkir").kernel_op, [*a, *w, c])
    *_, got = launch_tensors(_compile(GEMM, f"gemm_{fmt}fp4", "cubin"), [*a, *w, torch.empty_like(c)])
    # f32 sums in the tensor cores' order, rounded to bf16: within a bf16 ulp of the interpreter's,
    # or of the f32 rounding of the largest sums where a sum cancels
    assert torch.all((got.float() - c.float()).abs() <= c.float().abs() * 2**-7 + 2**-20 * c.float().abs().max())
    x = _rows(70, K, 13)
    cw = torch.zeros(70, N)
    run_kernel(_compile(GEMM, f"gemm_{fmt}fp4_weights_splitk", "tkir").kernel_op, [x, *w, cw])
    *_, got = launch_tensors(_compile(GEMM, f"gemm_{fmt}fp4_weights_splitk", "cubin"), [x, *w, torch.zeros(70, N)])
    assert torch.allclose(got, cw, rtol=1e-5, atol=1e-5 * cw.abs().max().item())
