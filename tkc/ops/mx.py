"""``mx_quantize``, ``mx_dequantize`` and ``mx_matmul``: MXFP8 (OCP Microscaling) through
examples/mx_fp8.tk and examples/gemm_mx.tk.

Six operators (``torch.ops.tkc.mx_quantize``: bf16 ``[M, K]`` to e4m3 ``[M, K]`` and E8M0
scales ``[M, K / 32]``; ``torch.ops.tkc.mx_dequantize``: back to bf16;
``torch.ops.tkc.mx_matmul``: the product of two such pairs, ``[M, K]`` by a weight ``[N, K]``,
to bf16 ``[M, N]``, and ``torch.ops.tkc.matmul_nt``, the bf16 product of such a pair
dequantized; ``torch.ops.tkc.mx_matmul_weights``: bf16 ``[M, K]`` by such a weight, and
``torch.ops.tkc.mx_matmul_weights_splitk`` the same into f32 for few rows), and
functions taking any leading dims, which they flatten to rows.  No gradient: quantization is
not differentiated here (a straight-through estimator is the caller's choice)."""

from __future__ import annotations

import torch

from tkc.errors import TkcUsageError
from tkc.kernel import load
from tkc.ops import checks
from tkc.ops.kernel_op import MISS, call, custom_op, planned
from tkc.ops.kernels import path

__all__ = ["mx_dequantize", "mx_matmul", "mx_quantize"]

_FILE = path("mx_fp8.tk")
_GEMM = path("gemm_mx.tk")


def _blocks(op: str, k: int) -> None:
    if k % 32 or k == 0:
        raise TkcUsageError(f"tkc.ops.{op}: the last dim ({k}) must be a positive multiple of 32, MXFP8's block")


_quantize = custom_op("tkc::mx_quantize", load(_FILE, "mx_quantize"), dims={"KS": lambda d: d["K"] // 32},
                      check=lambda x, **kw: _blocks("mx_quantize", x.shape[-1]))
def _scales_fit(q: torch.Tensor, scales: torch.Tensor) -> None:
    """``scales`` has ``q``'s shape with its last dim / 32 (the kernel would read a block's
    scale from another place, or none, without a word)."""
    _blocks("mx_dequantize", q.shape[-1])
    checks.same("mx_dequantize", "scales must be q's shape with its last dim / 32",
                ("scales' shape", tuple(scales.shape)), ("q's", (*q.shape[:-1], q.shape[-1] // 32)))


_dequantize = custom_op("tkc::mx_dequantize", load(_FILE, "mx_dequantize"),
                        check=lambda q, s, **kw: _scales_fit(q, s))


def mx_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scales)`` of a bf16 ``x`` (any leading dims, the last a multiple of 32): e4m3
    values ``q`` of ``x``'s shape and one E8M0 scale (``torch.float8_e8m0fnu``) a 32-block of
    the last dim, ``scales`` of shape ``[..., K / 32]``, by the OCP MX rule (a block's scale
    2^(floor(log2(amax)) - 8), values saturating at 448), bit for bit as torch's conversions."""
    checks.dtype("mx_quantize", torch.bfloat16, x=x)
    checks.rank("mx_quantize", "x", x, "at least one dim", x.dim() >= 1)
    _blocks("mx_quantize", x.shape[-1])
    checks.no_gradient("mx_quantize", x)
    q, s = call(_quantize, x.reshape(-1, x.shape[-1]).contiguous())
    return q.view(x.shape), s.view(*x.shape[:-1], x.shape[-1] // 32)


def mx_dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 ``q * scale`` (exact) of e4m3 ``q`` and its E8M0 ``scales`` from :func:`mx_quantize`."""
    checks.dtype("mx_dequantize", torch.float8_e4m3fn, q=q)
    checks.dtype("mx_dequantize", torch.float8_e8m0fnu, scales=scales)
    checks.rank("mx_dequantize", "q", q, "at least one dim", q.dim() >= 1)
    _scales_fit(q, scales)
    checks.no_gradient("mx_dequantize", q, scales)
    x = call(_dequantize, q.reshape(-1, q.shape[-1]).contiguous(), scales.reshape(-1, scales.shape[-1]).contiguous())
    return x.view(q.shape)


def _operands_fit(a: torch.Tensor, a_scale: torch.Tensor | None, b: torch.Tensor, b_scale: torch.Tensor) -> None:
    """``a`` [M, K] and the weight ``b`` [N, K] share K (a multiple of 32), each with its scales'
    shape (its own with the last dim / 32; ``a`` may have none)."""
    _blocks("mx_matmul", a.shape[-1])
    checks.same("mx_matmul", "a and b must share their last dim (K)", ("a's", a.shape[-1]), ("b's", b.shape[-1]))
    for name, x, s in (("a_scale", a, a_scale), ("b_scale", b, b_scale)):
        if s is not None:
            checks.same("mx_matmul", f"{name} must be its operand's shape with the last dim / 32",
                        (f"{name}'s shape", tuple(s.shape)), ("wanted", (*x.shape[:-1], x.shape[-1] // 32)))


_matmul = custom_op("tkc::mx_matmul", load(_GEMM, "gemm_mx"),
                    check=lambda a, sa, b, sb, **kw: _operands_fit(a, sa, b, sb))
matmul_nt = custom_op("tkc::matmul_nt", load(_GEMM, "gemm_nt"))


def scales_blocks(device: torch.device) -> bool:
    """Whether the GPU's tensor cores take block-scaled products (Blackwell): there gemm_mx is
    one MMA a K block; elsewhere dequantizing both operands first and multiplying in bf16
    (gemm_nt) is faster than dequantizing in gemm_mx's loop (2.2x on an H200 at 4096^3,
    benchmarks/RESULTS.md).  The CPU (the interpreter) runs gemm_mx."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 10


_matmul_weights = custom_op("tkc::mx_matmul_weights", load(_GEMM, "gemm_mx_weights"),
                            check=lambda x, w, sw, **kw: _operands_fit(x, None, w, sw))
_matmul_weights_splitk = custom_op("tkc::mx_matmul_weights_splitk", load(_GEMM, "gemm_mx_weights_splitk"),
                                   const_args=("BM", "BN", "SPLIT"),
                                   check=lambda x, w, sw, **kw: _operands_fit(x, None, w, sw))

#: Rows (tokens) up to which bf16-by-MXFP8 runs with K split over several programs a tile
#: (gemm_mx_weights_splitk): on an H200 (benchmarks/RESULTS.md) by an 8192 x 8192 weight, 0.43-0.45x
#: the one-program-a-tile kernel's time at 64 rows, 0.56-0.57x at 128; at 256 rows the tiles fill the
#: GPU without a split.
SPLITK_ROWS = 128
#: Programs an SM the split-K kernel holds (its ``ctas_per_sm``), and its BK.
_SPLITK_PER_SM, _SPLITK_BK = 2, 128


#: :func:`splitk_consts` by (rows, n, k, device), for the calls that repeat an earlier one.
_SPLITK_CONSTS: dict[tuple, dict[str, int]] = {}


def splitk_consts(rows: int, n: int, k: int, device: torch.device) -> dict[str, int]:
    """The split-K kernel's tile and SPLIT for ``rows`` x ``n`` outputs over K = ``k``: 64 x 128
    tiles up to 64 rows, 128 x 64 past (one tile of rows dequantizes each weight tile once);
    SPLIT about one program for each slot of the GPU (two an SM), each at least one K block
    (what the sweeps on an H200 found fastest, benchmarks/RESULTS.md); SPLIT 4 on the CPU.
    Kept by shape (``_SPLITK_CONSTS``): a repeated call asks the driver nothing."""
    key = (rows, n, k, device)
    consts = _SPLITK_CONSTS.get(key)
    if consts is None:
        bm, bn = (64, 128) if rows <= 64 else (128, 64)
        if device.type != "cuda":
            consts = {"BM": bm, "BN": bn, "SPLIT": 4}
        else:
            tiles = -(-rows // bm) * -(-n // bn)
            slots = _SPLITK_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
            consts = {"BM": bm, "BN": bn, "SPLIT": max(1, min(-(-k // _SPLITK_BK), round(slots / tiles)))}
        _SPLITK_CONSTS[key] = consts
    return consts


def mx_matmul(a: torch.Tensor, a_scale: torch.Tensor | None, b: torch.Tensor, b_scale: torch.Tensor) -> torch.Tensor:
    """bf16 ``(a * a_scale) @ (b * b_scale)^T`` of MXFP8 operands as :func:`mx_quantize` makes
    them: ``a`` e4m3 ``[..., K]`` with its E8M0 ``a_scale`` ``[..., K / 32]``, and a weight ``b``
    e4m3 ``[N, K]`` (as ``torch.nn.functional.linear`` takes it) with ``b_scale`` ``[N, K / 32]``;
    f32 accumulation, one rounding.  ``a`` bf16 with ``a_scale=None``: activations by MXFP8
    weights (``torch.ops.tkc.mx_matmul_weights``, examples/gemm_mx.tk's ``gemm_mx_weights``; up
    to ``SPLITK_ROWS`` rows ``torch.ops.tkc.mx_matmul_weights_splitk``, K split over several
    programs a tile into f32, then bf16).  MXFP8 by MXFP8: on sm_100a gemm_mx, the tensor cores'
    block-scaled product (``kind::mxf8f6f4``); on other GPUs both operands dequantized, then
    ``torch.ops.tkc.matmul_nt`` (benchmarks/RESULTS.md)."""
    if a_scale is None and not torch.compiler.is_compiling() and isinstance(a, torch.Tensor) and a.dim() == 2 \
            and isinstance(b, torch.Tensor):
        # arguments like an earlier call's passed the checks below: straight to its launch
        consts = _SPLITK_CONSTS.get((a.shape[0], b.shape[0], a.shape[-1], a.device))
        c = MISS if consts is None else planned(_matmul_weights_splitk, (a, b, b_scale), consts)
        if c is not MISS:
            return c.to(torch.bfloat16)
    checks.dtype("mx_matmul", torch.float8_e4m3fn if a_scale is not None else torch.bfloat16, a=a)
    checks.dtype("mx_matmul", torch.float8_e4m3fn, b=b)
    checks.dtype("mx_matmul", torch.float8_e8m0fnu, b_scale=b_scale)
    if a_scale is not None:
        checks.dtype("mx_matmul", torch.float8_e8m0fnu, a_scale=a_scale)
    checks.rank("mx_matmul", "a", a, "at least one dim", a.dim() >= 1)
    checks.rank("mx_matmul", "b", b, "two dims [N, K]", b.dim() == 2)
    _operands_fit(a, a_scale, b, b_scale)
    checks.no_gradient("mx_matmul", *(t for t in (a, a_scale, b, b_scale) if t is not None))
    k = a.shape[-1]
    rows = a.reshape(-1, k).contiguous()
    if a_scale is None and rows.shape[0] <= SPLITK_ROWS:
        consts = splitk_consts(rows.shape[0], b.shape[0], k, rows.device)
        c = call(_matmul_weights_splitk, rows, b.contiguous(), b_scale.contiguous(), **consts).to(torch.bfloat16)
    elif a_scale is None:
        c = call(_matmul_weights, rows, b.contiguous(), b_scale.contiguous())
    elif scales_blocks(rows.device):
        c = call(_matmul, rows, a_scale.reshape(-1, k // 32).contiguous(), b.contiguous(), b_scale.contiguous())
    else:
        scales = a_scale.reshape(-1, k // 32).contiguous()
        c = call(matmul_nt, call(_dequantize, rows, scales), call(_dequantize, b.contiguous(), b_scale.contiguous()))
    return c.view(*a.shape[:-1], b.shape[0])
