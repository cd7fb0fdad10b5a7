"""MXFP8 by the OCP MX rule in torch's own conversions, and bf16 rows that exercise it: the
oracle of examples/mx_fp8.tk and tkc.ops.mx_quantize.  FP4 (MXFP4, NVFP4) the same way, E2M1
rounding as the nearest of its sixteen values (ties to the even code), independently of
tkc.dtypes' thresholds: the oracle of examples/mx_fp4.tk."""

from __future__ import annotations

import torch


def rows(M: int, K: int, seed: int) -> torch.Tensor:
    """bf16 rows whose 32-blocks span magnitudes from 2^-100 to 2^100, with zero blocks."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K // 32, 32, generator=g) * torch.exp2(torch.randint(-100, 100, (M, K // 32, 1), generator=g))
    x[torch.rand(M, K // 32, generator=g) < 0.05] = 0
    return x.reshape(M, K).to(torch.bfloat16)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scales) of ``[M, K]`` ``x``: 2^(floor(log2(amax)) - 8) a 32-block as torch's e8m0 (0
    -> 2^-127), x / scale clamped to e4m3's 448 and rounded."""
    M, K = x.shape
    blocks = x.float().reshape(M, K // 32, 32)
    scale = torch.exp2(torch.floor(torch.log2(blocks.abs().amax(-1))) - 8).to(torch.float8_e8m0fnu)
    q = (blocks / scale.float()[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.reshape(M, K), scale


def dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 ``q`` times its block's scale (exact)."""
    M, K = q.shape
    return (q.float().reshape(M, K // 32, 32) * scales.float()[..., None]).reshape(M, K).to(torch.bfloat16)


#: E2M1's values by code (bit 3 the sign).
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                    dtype=torch.float64)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """uint8 E2M1 codes of ``x``: the nearest value, a tie to the even code (an even mantissa),
    past 6 saturating, NaN to 0, the sign kept (-0.0 is code 8)."""
    v = x.double()
    mag = v.abs().clamp(max=6.0)
    dist = (mag[..., None] - E2M1[:8].to(v.device)).abs()
    best = dist.min(-1, keepdim=True).values
    # among the nearest (one, or two at a tie), the even code: the lowest index with an even code
    tied = dist == best
    even = tied & (torch.arange(8, device=v.device) % 2 == 0)
    code = torch.where(even.any(-1), even.float().argmax(-1), tied.float().argmax(-1))
    code = torch.where(torch.signbit(v) & ~v.isnan(), code + 8, code)
    return torch.where(v.isnan(), 0, code).to(torch.uint8)


def pack(x: torch.Tensor) -> torch.Tensor:
    """``x`` [..., 2C] as float4_e2m1fn_x2 pairs [..., C], the even-indexed value low."""
    c = e2m1_codes(x).reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    return (c[..., 0] | (c[..., 1] << 4)).view(torch.float4_e2m1fn_x2)


def unpack(q: torch.Tensor) -> torch.Tensor:
    """float32 values [..., 2C] of float4_e2m1fn_x2 pairs [..., C]."""
    b = q.view(torch.uint8).long()
    table = E2M1.to(b.device)
    v = torch.stack([table[b & 15], table[b >> 4]], dim=-1)
    return v.reshape(*q.shape[:-1], 2 * q.shape[-1]).float()


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pairs, E8M0 scales) of ``[M, K]`` ``x``: 2^(floor(log2(amax)) - 2) a 32-block."""
    M, K = x.shape
    blocks = x.float().reshape(M, K // 32, 32)
    scale = torch.exp2(torch.floor(torch.log2(blocks.abs().amax(-1))) - 2).to(torch.float8_e8m0fnu)
    return pack((blocks / scale.float()[..., None]).reshape(M, K)), scale


def quantize_nvfp4(x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pairs, e4m3 scales) of ``[M, K]`` ``x`` with the tensor-wide ``g`` (a one-element f32
    tensor): a 16-block's scale amax / 6 / g rounded to e4m3 (f32 arithmetic, as the kernel),
    values x / (scale * g)."""
    M, K = x.shape
    blocks = x.float().reshape(M, K // 16, 16)
    amax = blocks.abs().amax(-1)
    g = g.float().reshape(())
    scale = (amax * torch.tensor(1 / 6, dtype=torch.float32) / g).to(torch.float8_e4m3fn)
    sg = scale.float() * g
    q = torch.where(sg[..., None] > 0, blocks / sg[..., None], torch.zeros(()))
    return pack(q.reshape(M, K)), scale


def dequantize_fp4(q: torch.Tensor, scales: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
    """f32 values of pairs ``q`` [M, K / 2] times their block's scale (times NVFP4's ``g``)."""
    v = unpack(q)
    M, K = v.shape
    block = K // scales.shape[-1]
    s = scales.float() if g is None else scales.float() * g.float().reshape(())
    return (v.reshape(M, K // block, block) * s[..., None]).reshape(M, K)
