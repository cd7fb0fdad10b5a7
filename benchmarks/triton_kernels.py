"""Triton kernels for the harness: what a user would write in Triton instead of tkc.

Plain, reasonably tuned versions of the benchmarked operations (GEMM with a small autotune
list and grouped tile order; row softmax and LayerNorm that stream rows of any length in
blocks).  Imported only when Triton is installed; the harness skips the Triton column
otherwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_GEMM_CONFIGS = [
    triton.Config({"BM": 128, "BN": 256, "BK": 64, "GROUP": 8}, num_stages=3, num_warps=8),
    triton.Config({"BM": 128, "BN": 128, "BK": 64, "GROUP": 8}, num_stages=4, num_warps=4),
    triton.Config({"BM": 128, "BN": 128, "BK": 64, "GROUP": 8}, num_stages=4, num_warps=8),
    triton.Config({"BM": 64, "BN": 256, "BK": 64, "GROUP": 8}, num_stages=4, num_warps=4),
]


@triton.autotune(configs=_GEMM_CONFIGS, key=["M", "N", "K"])
@triton.jit
def _gemm(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    grid_m, grid_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    width = GROUP * grid_n
    first = (pid // width) * GROUP
    rows = min(grid_m - first, GROUP)
    pm = first + (pid % width) % rows
    pn = (pid % width) // rows
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        kk = k * BK + rk
        x = tl.load(a + rm[:, None] * sam + kk[None, :] * sak, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        y = tl.load(b + kk[:, None] * sbk + rn[None, :] * sbn, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    M, K = a.shape
    N = b.shape[1]
    grid = lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)  # noqa: E731
    _gemm[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))


@triton.jit
def _softmax(x, y, N, stride, BN: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BN)
    m = tl.full((BN,), float("-inf"), tl.float32)
    s = tl.zeros((BN,), tl.float32)
    for j in range(0, tl.cdiv(N, BN)):
        c = j * BN + cols
        v = tl.load(x + row * stride + c, mask=c < N, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, v)
        s = s * tl.exp(m - m_new) + tl.exp(v - m_new)
        m = m_new
    big = tl.max(m, 0)
    total = tl.sum(s * tl.exp(m - big), 0)
    for j in range(0, tl.cdiv(N, BN)):
        c = j * BN + cols
        v = tl.load(x + row * stride + c, mask=c < N, other=float("-inf")).to(tl.float32)
        tl.store(y + row * stride + c, (tl.exp(v - big) / total).to(y.dtype.element_ty), mask=c < N)


def softmax(x: torch.Tensor, y: torch.Tensor) -> None:
    M, N = x.shape
    _softmax[(M,)](x, y, N, x.stride(0), BN=min(4096, triton.next_power_of_2(N)), num_warps=8)


@triton.jit
def _layernorm(x, w, b, y, N, stride, eps, BN: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BN)
    acc = tl.zeros((BN,), tl.float32)
    acc2 = tl.zeros((BN,), tl.float32)
    for j in range(0, tl.cdiv(N, BN)):
        c = j * BN + cols
        v = tl.load(x + row * stride + c, mask=c < N, other=0.0).to(tl.float32)
        acc += v
        acc2 += v * v
    mean = tl.sum(acc, 0) / N
    rstd = 1.0 / tl.sqrt(tl.sum(acc2, 0) / N - mean * mean + eps)
    for j in range(0, tl.cdiv(N, BN)):
        c = j * BN + cols
        v = tl.load(x + row * stride + c, mask=c < N, other=0.0).to(tl.float32)
        wt = tl.load(w + c, mask=c < N, other=0.0).to(tl.float32)
        bt = tl.load(b + c, mask=c < N, other=0.0).to(tl.float32)
        tl.store(y + row * stride + c, ((v - mean) * rstd * wt + bt).to(y.dtype.element_ty), mask=c < N)


def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor, eps: float) -> None:
    M, N = x.shape
    _layernorm[(M,)](x, w, b, y, N, x.stride(0), eps, BN=min(4096, triton.next_power_of_2(N)), num_warps=8)
