"""MXFP8 by the OCP MX rule in torch's own conversions, and bf16 rows that exercise it: the
oracle of examples/mx_fp8.tk and tkc.ops.mx_quantize."""

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
