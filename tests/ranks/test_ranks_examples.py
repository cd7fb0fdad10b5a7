"""The multi-GPU examples on simulated ranks (tkc/ranks.py) against torch, at 2 and 4 ranks.

Shapes have tails (no multiple of a tile), every rank has its own random inputs, and each
case runs under two interleavings of the ranks' programs (seeds), which must both be right.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import tkc

EXAMPLES = Path(__file__).parents[2] / "examples"
TILES = {"BM": 32, "BN": 32, "BK": 32}


def _bf16(rng: np.random.Generator, *shape: int) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(torch.bfloat16)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), want.to(got.dtype).float(), atol=0.1, rtol=2e-2)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_allgather_gemm(ranks: int, seed: int) -> None:
    k = tkc.load(EXAMPLES / "allgather_gemm.tk")
    M, K, N = 40, 72, 48
    rng = np.random.default_rng(seed)
    a = [_bf16(rng, M, K) for _ in range(ranks)]
    b = [_bf16(rng, K, N) for _ in range(ranks)]
    c = [torch.full((ranks, M, N), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    grid_m = -(-M // TILES["BM"])
    args = [[a[r], b[r], c[r], torch.zeros(ranks, M, K, dtype=torch.bfloat16),
             torch.zeros(ranks, grid_m, dtype=torch.int32)] for r in range(ranks)]
    tkc.interpret_ranks(k, args, seed=seed, BC=32, **TILES)
    gathered = torch.cat(a).float()
    for r in range(ranks):
        _close(c[r].reshape(ranks * M, N), gathered @ b[r].float())


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_gemm_reducescatter(ranks: int, seed: int) -> None:
    k = tkc.load(EXAMPLES / "gemm_reducescatter.tk")
    MS, K, N = 40, 72, 48
    grid_m, grid_n = -(-MS // TILES["BM"]), -(-N // TILES["BN"])
    rng = np.random.default_rng(seed)
    a = [_bf16(rng, ranks * MS, K) for _ in range(ranks)]
    b = [_bf16(rng, K, N) for _ in range(ranks)]
    out = [torch.full((MS, N), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    args = [[a[r], b[r], out[r], torch.zeros(ranks, MS, N), torch.zeros(ranks, grid_m, grid_n, dtype=torch.int32)]
            for r in range(ranks)]
    tkc.interpret_ranks(k, args, seed=seed, **TILES)
    total = sum(a[r].float() @ b[r].float() for r in range(ranks))
    for r in range(ranks):
        _close(out[r], total[r * MS:(r + 1) * MS])
        assert (args[r][4] == 1).all()  # every rank signalled every tile of rank r once


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_gemm_allreduce(ranks: int, seed: int) -> None:
    k = tkc.load(EXAMPLES / "gemm_allreduce.tk")
    MS, K, N = 40, 72, 48
    grid_m, grid_n = -(-MS // TILES["BM"]), -(-N // TILES["BN"])
    rng = np.random.default_rng(seed)
    a = [_bf16(rng, ranks * MS, K) for _ in range(ranks)]
    b = [_bf16(rng, K, N) for _ in range(ranks)]
    out = [torch.full((ranks, MS, N), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    args = [[a[r], b[r], out[r], torch.zeros(ranks, MS, N), torch.zeros(2, ranks, grid_m, grid_n, dtype=torch.int32)]
            for r in range(ranks)]
    tkc.interpret_ranks(k, args, seed=seed, **TILES)
    total = sum(a[r].float() @ b[r].float() for r in range(ranks))
    for r in range(ranks):
        _close(out[r].reshape(ranks * MS, N), total)
        assert torch.equal(out[r], out[0])  # every rank holds the same sums, bit for bit


@pytest.mark.parametrize("ranks", [2, 4])
def test_ring_attn(ranks: int) -> None:
    k = tkc.load(EXAMPLES / "ring_attn.tk")
    B, H, N, D = 1, 2, 40, 32
    rng = np.random.default_rng(ranks)
    q, kk, v = ([_bf16(rng, B, H, N, D) for _ in range(ranks)] for _ in range(3))
    o = [torch.full((B, H, N, D), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    scale = 0.125
    buffers = [[torch.zeros(ranks, B, H, N, D, dtype=torch.bfloat16), torch.zeros(ranks, B, H, N, D,
                                                                               dtype=torch.bfloat16),
                torch.zeros(ranks, B * H, dtype=torch.int32)] for _ in range(ranks)]
    tkc.interpret_ranks(k, [[q[r], kk[r], v[r], o[r], *buffers[r], scale] for r in range(ranks)], seed=ranks,
                        D=D, BM=32, BN=32)
    keys, values = torch.cat(kk, dim=2).float(), torch.cat(v, dim=2).float()
    for r in range(ranks):
        want = torch.softmax(q[r].float() @ keys.transpose(-1, -2) * scale, dim=-1) @ values
        torch.testing.assert_close(o[r].float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_moe_dispatch(ranks: int, seed: int) -> None:
    k = tkc.load(EXAMPLES / "moe_dispatch.tk")
    T, D, F, EL = 56, 48, 40, 2
    experts = ranks * EL
    rng = np.random.default_rng(seed)
    x = [_bf16(rng, T, D) for _ in range(ranks)]
    w = [_bf16(rng, EL, D, F) for _ in range(ranks)]
    ids = [torch.from_numpy(rng.integers(0, experts, T)) for _ in range(ranks)]
    ids[0][:] = 0  # one rank sends every token to one expert: long and empty segments
    order = [torch.argsort(i, stable=True).to(torch.int32) for i in ids]
    offsets = [torch.cat([torch.zeros(1, dtype=torch.int64), torch.bincount(i, minlength=experts).cumsum(0)])
               .to(torch.int32) for i in ids]
    y = [torch.full((ranks, T, F), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    args = [[x[r], order[r], offsets[r], w[r], y[r]] for r in range(ranks)]
    tkc.interpret_ranks(k, args, seed=seed, BT=16, BF=32, BK=16)
    for d in range(ranks):
        for src in range(ranks):
            for p in range(T):
                e = int(ids[src][order[src][p]])
                if e // EL == d:
                    _close(y[d][src, p], x[src][order[src][p]].float() @ w[d][e % EL].float())
                else:
                    assert y[d][src, p].isnan().all()  # rows of other ranks' experts are left alone


def test_one_rank_runs_through_tkc_interpret() -> None:
    """A multi-GPU kernel on one GPU is rank 0 of 1: tkc.interpret runs it (waits included)."""
    k = tkc.load(EXAMPLES / "gemm_reducescatter.tk")
    rng = np.random.default_rng(3)
    a, b = _bf16(rng, 40, 24), _bf16(rng, 24, 40)
    out = torch.zeros(40, 40, dtype=torch.bfloat16)
    tkc.interpret(k, a, b, out, torch.zeros(1, 40, 40), torch.zeros(1, 2, 2, dtype=torch.int32), **TILES)
    _close(out, a.float() @ b.float())


@pytest.mark.parametrize("ranks", [2, 4])
def test_allgather(ranks: int) -> None:
    k = tkc.load(EXAMPLES / "allgather.tk")
    M, N = 72, 300
    rng = np.random.default_rng(ranks)
    x = [_bf16(rng, M, N) for _ in range(ranks)]
    out = [torch.full((ranks, M, N), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    tkc.interpret_ranks(k, [[x[r], out[r]] for r in range(ranks)], seed=ranks, BM=32, BN=64)
    for r in range(ranks):
        assert torch.equal(out[r], torch.stack(x))  # a copy: bit for bit


@pytest.mark.parametrize("ranks", [2, 4])
def test_reducescatter(ranks: int) -> None:
    k = tkc.load(EXAMPLES / "reducescatter.tk")
    MS, N = 40, 300
    rng = np.random.default_rng(ranks)
    x = [_bf16(rng, ranks * MS, N) for _ in range(ranks)]
    out = [torch.full((MS, N), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    args = [[x[r], out[r], torch.zeros(ranks, MS, N, dtype=torch.bfloat16)] for r in range(ranks)]
    tkc.interpret_ranks(k, args, seed=ranks, BM=32, BN=64)
    total = sum(t.float() for t in x)
    for r in range(ranks):
        _close(out[r], total[r * MS:(r + 1) * MS])
