"""RMSNorm as a @tkc.kernel: y = x / sqrt(mean(x^2) + eps) * w, per row.

    TKC_INTERPRET=1 python examples/rmsnorm.py     # run in the interpreter, check against torch
"""

from __future__ import annotations

import tkc


@tkc.kernel
def rmsnorm(x: bf16[M, N], w: bf16[N], y: bf16[M, N], eps: f32,
            BM: const = 16, BN: const = 256):
    grid(cdiv(M, BM))
    r = program_id(0) * BM

    def block(t, j):
        return t[r:r+BM, j*BN:(j+1)*BN].to(f32)

    ss = zeros([BM], f32)
    for j in range(cdiv(N, BN)):
        xt = block(x, j)
        ss += (xt * xt).sum(1)
    rms = rsqrt(ss / N.to(f32) + eps)
    for j in range(cdiv(N, BN)):
        wt = w[j*BN:(j+1)*BN].to(f32)
        y[r:r+BM, j*BN:(j+1)*BN] = (block(x, j) * rms[:, None] * wt[None, :]).to(bf16)


def reference(x, w, eps):
    import torch

    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(torch.bfloat16)


if __name__ == "__main__":
    import torch

    M, N, eps = 100, 700, 1e-6
    x = torch.randn(M, N, dtype=torch.bfloat16)
    w = torch.randn(N, dtype=torch.bfloat16)
    y = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    tkc.interpret(rmsnorm, x, w, y, eps)
    err = (y.float() - reference(x, w, eps).float()).abs().max().item()
    print(f"rmsnorm {M}x{N}: max abs error vs torch = {err:.4g}")
