"""torch references of ThunderKittens' kernel set (rope.tk, layernorm_residual.tk), shared by
tests/examples/test_tk_kernels.py and benchmarks/tk_kernels.py (where they are the torch
eager peer).  Each computes in the dtype of its inputs: pass float32 for a reference."""

from __future__ import annotations

import torch


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [B, N, H, D] rotated by the angles of cos/sin [N, D/2]."""
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], -1).flatten(-2)
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def rope_tables(N: int, D: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [N, D/2] of Llama's angles n * 10000^(-2i/D), in bf16."""
    theta = 10000.0 ** (-torch.arange(0, D, 2, device=device).float() / D)
    angles = torch.arange(N, device=device).float()[:, None] * theta[None, :]
    return angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
