"""``fp4_quantize``, ``fp4_dequantize`` and ``fp4_matmul``: FP4 with block scales, OCP MX's
MXFP4 (an E8M0 scale a block of 32) and NVIDIA's NVFP4 (an e4m3 scale a block of 16 and one f32
for the tensor), through examples/mx_fp4.tk and examples/gemm_fp4.tk.

A tensor of FP4 values is ``torch.float4_e2m1fn_x2``: two E2M1 values a byte along the last
dim, so ``[M, K]`` values are a ``[M, K / 2]`` tensor.  Operators ``torch.ops.tkc.mxfp4_quantize``,
``nvfp4_quantize``, ``mxfp4_dequantize``, ``nvfp4_dequantize`` (rows ``[M, K]``), and
``mxfp4_matmul_weights_splitk`` / ``nvfp4_matmul_weights_splitk`` (bf16 activations by an FP4
weight, K split over programs into f32), ``mxfp4_matmul`` / ``nvfp4_matmul`` (FP4 by FP4); the
functions take any leading dims.  No gradient, as
:mod:`tkc.ops.mx`."""

from __future__ import annotations

import torch

from tkc import dtypes
from tkc.errors import TkcUsageError
from tkc.ir.dialects.tile import SCALE_BLOCK_OF
from tkc.kernel import load
from tkc.ops import checks
from tkc.ops.kernel_op import call, custom_op
from tkc.ops.kernels import path
from tkc.ops.mx import SPLITK_ROWS, matmul_nt, scales_blocks, splitk_consts

__all__ = ["fp4_dequantize", "fp4_matmul", "fp4_quantize"]

_FILE = path("mx_fp4.tk")
_GEMM = path("gemm_fp4.tk")
#: The scales' dtype by format, and the values one covers (the language's rule).
_SCALE = {"mxfp4": torch.float8_e8m0fnu, "nvfp4": torch.float8_e4m3fn}
_BLOCK = {fmt: SCALE_BLOCK_OF[dtypes.from_torch(dt).name] for fmt, dt in _SCALE.items()}
#: NVFP4's tensor-wide scale maps the tensor's largest value to E2M1's 6 times e4m3's 448.
_NV_RANGE = 6.0 * 448.0


def _blocks(op: str, k: int) -> None:
    if k % 32 or k == 0:
        raise TkcUsageError(f"tkc.ops.{op}: the last dim ({k}) must be a positive multiple of 32")


def _quantizer(fmt: str):
    block = _BLOCK[fmt]
    return custom_op(f"tkc::{fmt}_quantize", load(_FILE, f"{fmt}_quantize"),
                     dims={"KH": lambda d: d["K"] // 2, "KS": lambda d: d["K"] // block},
                     check=lambda x, *rest, **kw: _blocks("fp4_quantize", x.shape[-1]))


def _dequantizer(fmt: str):
    return custom_op(f"tkc::{fmt}_dequantize", load(_FILE, f"{fmt}_dequantize"),
                     dims={"K": lambda d: 2 * d["KH"]},
                     check=lambda q, s, *rest, **kw: _blocks("fp4_dequantize", 2 * q.shape[-1]))


def _weights(fmt: str):
    return custom_op(f"tkc::{fmt}_matmul_weights_splitk", load(_GEMM, f"gemm_{fmt}_weights_splitk"),
                     const_args=("BM", "BN", "SPLIT"))


def _product(fmt: str):
    return custom_op(f"tkc::{fmt}_matmul", load(_GEMM, f"gemm_{fmt}"))


_QUANTIZE = {fmt: _quantizer(fmt) for fmt in _BLOCK}
_PRODUCT = {fmt: _product(fmt) for fmt in _BLOCK}
_DEQUANTIZE = {fmt: _dequantizer(fmt) for fmt in _BLOCK}
_WEIGHTS = {fmt: _weights(fmt) for fmt in _BLOCK}


def _format(op: str, scales: torch.Tensor) -> str:
    for fmt, dt in _SCALE.items():
        if scales.dtype == dt:
            return fmt
    raise TkcUsageError(f"tkc.ops.{op}: scales are torch.float8_e8m0fnu (MXFP4) or torch.float8_e4m3fn (NVFP4), "
                        f"got {scales.dtype}")


def _global(op: str, fmt: str, global_scale: torch.Tensor | None, device: torch.device) -> list:
    """NVFP4's tensor-wide scale as the kernels take it (a one-element f32 tensor); none for MXFP4."""
    if fmt == "mxfp4":
        if global_scale is not None:
            raise TkcUsageError(f"tkc.ops.{op}: MXFP4 (E8M0 scales) has no global scale; give None")
        return []
    if not isinstance(global_scale, torch.Tensor) or global_scale.numel() != 1:
        raise TkcUsageError(f"tkc.ops.{op}: NVFP4 (e4m3 scales) needs its global scale, the one-element f32 tensor "
                            f"fp4_quantize returned")
    checks.dtype(op, torch.float32, global_scale=global_scale)
    return [global_scale.reshape(1).to(device)]


def fp4_quantize(x: torch.Tensor, fmt: str = "nvfp4") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(q, scales, global_scale)`` of a bf16 ``x`` (any leading dims, the last K a multiple of
    32): ``q`` ``torch.float4_e2m1fn_x2`` ``[..., K / 2]`` (two E2M1 values a byte, the first in
    the low nibble), values rounded to nearest even and saturating at 6.  ``fmt="mxfp4"``: an
    E8M0 scale a block of 32, 2^(floor(log2(amax)) - 2), ``global_scale`` None.
    ``fmt="nvfp4"``: an e4m3 scale a block of 16, amax / 6 / g rounded, and ``global_scale`` g =
    amax(x) / (6 * 448) as a one-element f32 tensor (computed on the device: no sync)."""
    if fmt not in _BLOCK:
        raise TkcUsageError(f"tkc.ops.fp4_quantize: fmt is 'mxfp4' or 'nvfp4', got {fmt!r}")
    checks.dtype("fp4_quantize", torch.bfloat16, x=x)
    checks.rank("fp4_quantize", "x", x, "at least one dim", x.dim() >= 1)
    _blocks("fp4_quantize", x.shape[-1])
    checks.no_gradient("fp4_quantize", x)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    g = None
    if fmt == "nvfp4":  # (a tensor of zeros takes the smallest normal: its scales and values are 0)
        g = (rows.abs().amax().float().clamp_min(2.0**-126) / _NV_RANGE).reshape(1)
    q, s = call(_QUANTIZE[fmt], rows, *([g] if g is not None else []))
    k = x.shape[-1]
    return q.view(*x.shape[:-1], k // 2), s.view(*x.shape[:-1], k // _BLOCK[fmt]), g


def fp4_dequantize(q: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """bf16 values of :func:`fp4_quantize`'s ``q`` with its ``scales`` (and NVFP4's
    ``global_scale``): ``[..., K]`` from ``[..., K / 2]`` pairs."""
    checks.dtype("fp4_dequantize", torch.float4_e2m1fn_x2, q=q)
    fmt = _format("fp4_dequantize", scales)
    checks.rank("fp4_dequantize", "q", q, "at least one dim", q.dim() >= 1)
    k = 2 * q.shape[-1]
    _blocks("fp4_dequantize", k)
    checks.same("fp4_dequantize", f"scales must be q's shape with its last dim {k} / {_BLOCK[fmt]}",
                ("scales' shape", tuple(scales.shape)), ("wanted", (*q.shape[:-1], k // _BLOCK[fmt])))
    checks.no_gradient("fp4_dequantize", q, scales)
    g = _global("fp4_dequantize", fmt, global_scale, q.device)
    rows, blocks = q.reshape(-1, q.shape[-1]).contiguous(), scales.reshape(-1, scales.shape[-1]).contiguous()
    x = call(_DEQUANTIZE[fmt], rows, blocks, *g)
    return x.view(*q.shape[:-1], k)


def fp4_matmul(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, w_global: torch.Tensor | None = None,
               x_scale: torch.Tensor | None = None, x_global: torch.Tensor | None = None) -> torch.Tensor:
    """bf16 ``x @ (w * w_scale [* w_global])^T`` for an FP4 weight ``w`` ``[N, K / 2]`` (as
    ``torch.nn.functional.linear`` takes a weight, from :func:`fp4_quantize`) with its scales
    ``[N, K / 32]`` (MXFP4) or ``[N, K / 16]`` and ``w_global`` (NVFP4); f32 accumulation.

    ``x`` bf16 ``[..., K]`` (``x_scale`` None): up to ``tkc.ops.mx.SPLITK_ROWS`` rows the weight
    is dequantized inside the product, K split over programs into f32
    (examples/gemm_fp4.tk); past it, dequantized once and multiplied in bf16
    (``torch.ops.tkc.matmul_nt``).  ``x`` FP4 pairs ``[..., K / 2]`` with ``x_scale`` (and
    ``x_global``) of the weight's format: on sm_100a (and in the interpreter) gemm_mxfp4 /
    gemm_nvfp4, the tensor cores' ``kind::mxf4nvf4``; on other GPUs both dequantized, then
    ``torch.ops.tkc.matmul_nt``."""
    checks.dtype("fp4_matmul", torch.float4_e2m1fn_x2, w=w)
    fmt = _format("fp4_matmul", w_scale)
    checks.dtype("fp4_matmul", torch.float4_e2m1fn_x2 if x_scale is not None else torch.bfloat16, x=x)
    checks.rank("fp4_matmul", "x", x, "at least one dim", x.dim() >= 1)
    checks.rank("fp4_matmul", "w", w, "two dims [N, K / 2]", w.dim() == 2)
    quantized = x_scale is not None
    k = x.shape[-1] * (2 if quantized else 1)
    _blocks("fp4_matmul", k)
    checks.same("fp4_matmul", "w must hold x's K in pairs, [N, K / 2]", ("x's K / 2", k // 2),
                ("w's last dim", w.shape[-1]))
    block = _BLOCK[fmt]
    checks.same("fp4_matmul", f"w_scale must be [N, K / {block}]", ("w_scale's shape", tuple(w_scale.shape)),
                ("wanted", (w.shape[0], k // block)))
    if quantized:
        checks.dtype("fp4_matmul", _SCALE[fmt], x_scale=x_scale)
        checks.same("fp4_matmul", f"x_scale must be x's shape with its last dim K / {block}",
                    ("x_scale's shape", tuple(x_scale.shape)), ("wanted", (*x.shape[:-1], k // block)))
    elif x_global is not None:
        raise TkcUsageError("tkc.ops.fp4_matmul: x_global belongs to FP4 activations (x_scale given); a bf16 x has "
                            "none")
    checks.no_gradient("fp4_matmul", *(t for t in (x, w, w_scale, x_scale) if t is not None))
    g = _global("fp4_matmul", fmt, w_global, x.device)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    if quantized:
        gx = _global("fp4_matmul", fmt, x_global, x.device)
        xs = x_scale.reshape(-1, k // block).contiguous()
        if scales_blocks(rows.device):
            c = call(_PRODUCT[fmt], rows, xs, *gx, w.contiguous(), w_scale.contiguous(), *g)
        else:
            c = call(matmul_nt, call(_DEQUANTIZE[fmt], rows, xs, *gx),
                     call(_DEQUANTIZE[fmt], w.contiguous(), w_scale.contiguous(), *g))
    elif rows.shape[0] <= SPLITK_ROWS:
        consts = splitk_consts(rows.shape[0], w.shape[0], k, rows.device)
        c = call(_WEIGHTS[fmt], rows, w.contiguous(), w_scale.contiguous(), *g, **consts).to(torch.bfloat16)
    else:
        c = call(matmul_nt, rows, call(_DEQUANTIZE[fmt], w.contiguous(), w_scale.contiguous(), *g))
    return c.view(*x.shape[:-1], w.shape[0])
