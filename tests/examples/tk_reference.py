"""torch references of ThunderKittens' kernel set (rope.tk, layernorm_residual.tk), shared by
tests/examples/test_tk_kernels.py and benchmarks/tk_kernels.py (where they are the torch
eager peer).  Each computes in the dtype of its inputs: pass float32 for a reference."""

from __future__ import annotations

import numpy as np
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


def dropout_mask(seed: int, M: int, N: int, p: float) -> torch.Tensor:
    """Which elements of the first M rows of an N-column tensor layernorm_residual.tk's dropout
    keeps: Philox's uniform of each element's flat index (the numbers tests/ir/test_philox.py
    checks)."""
    from tkc.ir.dialects.philox import uniform

    return torch.from_numpy(uniform(seed, np.arange(M * N, dtype=np.int64).reshape(M, N)) >= np.float32(p))


def dropped(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """x in f32 where ``keep``, scaled by 1/(1-p) (rounded to f32, as the kernels scale), else 0."""
    scale = float(np.float32(1.0) / (np.float32(1.0) - np.float32(p)))
    return torch.where(keep.to(x.device), x.float() * scale, 0.0)


def layernorm_residual(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, eps: float,
                       rms: bool, keep: torch.Tensor | None = None, p: float = 0.0) -> tuple[torch.Tensor, ...]:
    """h = x + res in the inputs' dtype (with ``keep``: dropped(x) + res rounded to x's dtype);
    y = LayerNorm(h) (RMSNorm: h * rstd * w) in f32; and the rows' mean (0 for RMSNorm) and
    rstd: (h, y, mean, rstd)."""
    h = x + res if keep is None else (dropped(x, keep, p) + res.float()).to(x.dtype)
    hf = h.float()
    mean = torch.zeros(hf.shape[0], device=hf.device) if rms else hf.mean(-1)
    rstd = torch.rsqrt((hf - mean[:, None]).pow(2).mean(-1) + eps)
    y = (hf - mean[:, None]) * rstd[:, None] * w.float()
    return h, (y if rms else y + bias.float()), mean, rstd


def layernorm_residual_bwd(dy: torch.Tensor, dh: torch.Tensor, h: torch.Tensor, w: torch.Tensor,
                           bias: torch.Tensor, eps: float, rms: bool) -> tuple[torch.Tensor, ...]:
    """(dres, dw, dbias) of layernorm_residual by autograd in float64, dh added to dres (the
    gradient of x too, without dropout; with it, ``dropped(dres, keep, p)``)."""
    hd = h.double().requires_grad_()
    wd, bd = w.double().requires_grad_(), bias.double().requires_grad_()
    if rms:
        y = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + eps) * wd
    else:
        y = torch.nn.functional.layer_norm(hd, hd.shape[-1:], wd, bd, eps)
    y.backward(dy.double())
    db = torch.zeros_like(bd) if rms else bd.grad
    return hd.grad + dh.double(), wd.grad, db
