"""The multi-GPU examples' inputs on R ranks and their torch references, shared by the
interpreter's tests (test_ranks_examples.py) and the emulator's (test_ranks_emulator.py).

Each case returns every rank's arguments (its own random inputs, outputs NaN where the kernel
must write, or a random residual where it adds) and a ``check`` that compares every rank's
outputs with torch once the kernel ran."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from tkc import dtypes
from tkc.runner import tolerance


class Case(NamedTuple):
    args: list[list]
    check: Callable[[], None]


def bf16(rng: np.random.Generator, *shape: int) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(torch.bfloat16)


def close(got: torch.Tensor, want: torch.Tensor, summed: bool = False) -> None:
    """``summed``: ``got`` is a sum of 16-bit atomic adds, each rounding the running sum, in an
    order the ranks pick: also within what ``tkc run --check`` allows such a sum."""
    atol = 0.1
    if summed:
        atol = max(atol, tolerance(dtypes.bf16, 16, float(want.abs().max()), summed=True)[0])
    torch.testing.assert_close(got.float(), want.to(got.dtype).float(), atol=atol, rtol=2e-2)


def allgather_gemm(ranks: int, seed: int, M: int, K: int, N: int) -> Case:
    rng = np.random.default_rng(seed)
    a = [bf16(rng, M, K) for _ in range(ranks)]
    b = [bf16(rng, K, N) for _ in range(ranks)]
    c = [torch.full((ranks, M, N), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]

    def check() -> None:
        gathered = torch.cat(a).float()
        for r in range(ranks):
            close(c[r].reshape(ranks * M, N), gathered @ b[r].float())

    def gathered_buffer(r: int) -> torch.Tensor:  # rank r's shard in its own slot, the others to fill
        ag = torch.full((ranks, M, K), float("nan"), dtype=torch.bfloat16)
        ag[r] = a[r]
        return ag

    # ready: a flag a tile row, enough rows for tiles of 16 and up
    return Case([[b[r], c[r], gathered_buffer(r), torch.zeros(ranks, -(-M // 16), dtype=torch.int32)]
                 for r in range(ranks)], check)


def _sharded(ranks: int, seed: int, MS: int, K: int, N: int) -> tuple[list, list, torch.Tensor]:
    rng = np.random.default_rng(seed)
    a = [bf16(rng, ranks * MS, K) for _ in range(ranks)]
    b = [bf16(rng, K, N) for _ in range(ranks)]
    return a, b, sum(a[r].float() @ b[r].float() for r in range(ranks))


def gemm_reducescatter(ranks: int, seed: int, MS: int, K: int, N: int, BM: int, BN: int) -> Case:
    a, b, total = _sharded(ranks, seed, MS, K, N)
    # out is added into: every rank starts from a residual of its own rows
    rng = np.random.default_rng(seed + 1)
    residual = [bf16(rng, MS, N) for _ in range(ranks)]
    out = [x.clone() for x in residual]

    def check() -> None:
        for r in range(ranks):
            close(out[r], residual[r].float() + total[r * MS:(r + 1) * MS], summed=True)

    return Case([[a[r], b[r], out[r]] for r in range(ranks)], check)


def gemm_allreduce(ranks: int, seed: int, MS: int, K: int, N: int, BM: int, BN: int) -> Case:
    a, b, total = _sharded(ranks, seed, MS, K, N)
    # out is added into: the same residual stream on every rank
    residual = bf16(np.random.default_rng(seed + 1), ranks, MS, N)
    out = [residual.clone() for _ in range(ranks)]

    def check() -> None:
        for r in range(ranks):
            close(out[r].reshape(ranks * MS, N), residual.reshape(ranks * MS, N).float() + total, summed=True)
            assert torch.equal(out[r], out[0])  # every rank holds the same sums, bit for bit

    return Case([[a[r], b[r], out[r], torch.zeros(2, ranks, -(-MS // BM), -(-N // BN), dtype=torch.int32)]
                 for r in range(ranks)], check)


def ring_attn(ranks: int, seed: int, B: int, H: int, N: int, D: int, scale: float = 0.125) -> Case:
    rng = np.random.default_rng(seed)
    q, k, v = ([bf16(rng, B, H, N, D) for _ in range(ranks)] for _ in range(3))
    o = [torch.full((B, H, N, D), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]

    def check() -> None:
        keys, values = torch.cat(k, dim=2).float(), torch.cat(v, dim=2).float()
        for r in range(ranks):
            want = torch.softmax(q[r].float() @ keys.transpose(-1, -2) * scale, dim=-1) @ values
            torch.testing.assert_close(o[r].float(), want, atol=2e-2, rtol=2e-2)

    def slots(x: list[torch.Tensor], r: int) -> torch.Tensor:  # every rank's blocks, rank r's own filled in
        g = torch.full((ranks, B, H, N, D), float("nan"), dtype=torch.bfloat16)
        g[r] = x[r]
        return g

    # kg, vg (every rank's K/V blocks, this rank's in its own slot) and ready (a count a source rank)
    return Case([[q[r], o[r], slots(k, r), slots(v, r), torch.zeros(ranks, dtype=torch.int32), scale]
                 for r in range(ranks)], check)


def moe_dispatch(ranks: int, seed: int, T: int, D: int, F: int, EL: int) -> Case:
    """Rank 0 sends every token to one expert: long and empty segments."""
    experts = ranks * EL
    rng = np.random.default_rng(seed)
    x = [bf16(rng, T, D) for _ in range(ranks)]
    w = [bf16(rng, EL, D, F) for _ in range(ranks)]
    ids = [torch.from_numpy(rng.integers(0, experts, T)) for _ in range(ranks)]
    ids[0][:] = 0
    order = [torch.argsort(i, stable=True).to(torch.int32) for i in ids]
    offsets = [torch.cat([torch.zeros(1, dtype=torch.int64), torch.bincount(i, minlength=experts).cumsum(0)])
               .to(torch.int32) for i in ids]
    y = [torch.full((ranks, T, F), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    recv = [torch.full((ranks, T, D), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    arrived = [torch.zeros(ranks, dtype=torch.int32) for _ in range(ranks)]

    def check() -> None:
        want = [torch.full((ranks, T, F), float("nan")) for _ in range(ranks)]  # rows of others' experts: untouched
        for src in range(ranks):
            for p in range(T):
                e = int(ids[src][order[src][p]])
                want[e // EL][src, p] = x[src][order[src][p]].float() @ w[e // EL][e % EL].float()
        for r in range(ranks):
            torch.testing.assert_close(y[r].float(), want[r].bfloat16().float(), atol=0.1, rtol=2e-2, equal_nan=True)

    return Case([[x[r], order[r], offsets[r], w[r], y[r], recv[r], arrived[r]] for r in range(ranks)], check)
