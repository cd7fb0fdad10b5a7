"""The multi-GPU examples on simulated ranks (tkc/ranks.py) against torch, at 2 and 4 ranks.

Shapes have tails (no multiple of a tile), every rank has its own random inputs, and each
case runs under two interleavings of the ranks' programs (seeds), which must both be right.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rank_cases as cases

import torch

import tkc
from tkc.semantics import CPU_SMS

EXAMPLES = Path(__file__).parents[2] / "examples"
TILES = {"BM": 32, "BN": 32, "BK": 32}


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_allgather_gemm(ranks: int, seed: int) -> None:
    case = cases.allgather_gemm(ranks, seed, M=40, K=72, N=48)
    tkc.interpret_ranks(tkc.load(EXAMPLES / "allgather_gemm.tk"), case.args, seed=seed, **TILES)
    case.check()


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_gemm_reducescatter(ranks: int, seed: int) -> None:
    case = cases.gemm_reducescatter(ranks, seed, MS=40, K=72, N=48, BM=TILES["BM"], BN=TILES["BN"])
    tkc.interpret_ranks(tkc.load(EXAMPLES / "gemm_reducescatter.tk"), case.args, seed=seed, **TILES)
    case.check()


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_gemm_allreduce(ranks: int, seed: int) -> None:
    case = cases.gemm_allreduce(ranks, seed, MS=40, K=72, N=48, BM=TILES["BM"], BN=TILES["BN"])
    tkc.interpret_ranks(tkc.load(EXAMPLES / "gemm_allreduce.tk"), case.args, seed=seed, **TILES)
    case.check()


@pytest.mark.parametrize("ranks", [2, 4])
def test_ring_attn(ranks: int) -> None:
    case = cases.ring_attn(ranks, ranks, B=1, H=2, N=40, D=32)
    tkc.interpret_ranks(tkc.load(EXAMPLES / "ring_attn.tk"), case.args, seed=ranks, D=32, BM=32, BN=32)
    case.check()


@pytest.mark.parametrize("sms", [0, 1, 6])
def test_num_sms_reads_the_gpu_it_is_given(sms: int) -> None:
    # ring_attn's ready counts the programs that pushed to a rank: min(PUSHERS, num_sms() // 2)
    # of them (one at least), so a GPU's results match the interpreter's only with that GPU's SM count (tkc run
    # --check)
    case = cases.ring_attn(2, 0, B=1, H=2, N=40, D=32)
    tkc.interpret_ranks(tkc.load(EXAMPLES / "ring_attn.tk"), case.args, sms=sms, D=32, BM=32, BN=32, PUSHERS=64)
    case.check()
    for r, args in enumerate(case.args):
        # the peer's pushers counted in; its own count stays 0 (a rank's own blocks are not pushed)
        assert np.asarray(args[4]).tolist() == [0 if s == r else max((sms or CPU_SMS) // 2, 1) for s in range(2)]


@pytest.mark.parametrize(("sms", "pushers"), [(1, 16), (3, 0)])
def test_ring_attn_pushes_with_one_program_or_no_pushers_asked(sms: int, pushers: int) -> None:
    # one pusher at least: with none, every wait passed at once and read slots nobody wrote
    case = cases.ring_attn(2, 1, B=1, H=2, N=40, D=32)
    tkc.interpret_ranks(tkc.load(EXAMPLES / "ring_attn.tk"), case.args, sms=sms, D=32, BM=32, BN=32,
                        PUSHERS=pushers)
    case.check()


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_moe_dispatch(ranks: int, seed: int) -> None:
    case = cases.moe_dispatch(ranks, seed, T=56, D=48, F=40, EL=2)
    tkc.interpret_ranks(tkc.load(EXAMPLES / "moe_dispatch.tk"), case.args, seed=seed, BT=16, BF=32, BK=16)
    case.check()


@pytest.mark.parametrize(("sms", "lead"), [(1, 2), (2, 2), (3, 0), (7, 5), (9, 1)])
def test_moe_dispatch_deals_every_item_once(sms: int, lead: int) -> None:
    # the pushers (min(PUSHERS, programs // 2), one at least) join the expert GEMMs LEAD items
    # late: every (source, expert, row tile, column tile) item is still taken by some program (y
    # starts NaN); one program pushes and multiplies everything
    case = cases.moe_dispatch(3, sms, T=56, D=48, F=40, EL=2)
    tkc.interpret_ranks(tkc.load(EXAMPLES / "moe_dispatch.tk"), case.args, seed=sms, sms=sms, BT=16, BF=16, BK=16,
                        LEAD=lead)
    case.check()


@pytest.mark.parametrize("ranks", [2, 4])
def test_moe_pulled_from_peers(ranks: int) -> None:
    """The pull form (each expert gathers its rows from the peers' memory in its K loop)."""
    case = cases.moe_dispatch(ranks, ranks, T=56, D=48, F=40, EL=2)
    pull = tkc.load(Path(__file__).parents[1] / "data" / "ranks" / "moe_pull.tk")
    tkc.interpret_ranks(pull, [args[:5] for args in case.args], seed=ranks, BT=16, BF=32, BK=16)
    case.check()


def test_one_rank_runs_through_tkc_interpret() -> None:
    """A multi-GPU kernel on one GPU is rank 0 of 1: tkc.interpret runs it (waits included)."""
    k = tkc.load(EXAMPLES / "gemm_reducescatter.tk")
    (args,), check = cases.gemm_reducescatter(1, 3, MS=40, K=24, N=40, BM=TILES["BM"], BN=TILES["BN"])
    tkc.interpret(k, *args, **TILES)
    check()


@pytest.mark.parametrize("ranks", [2, 4])
def test_allgather(ranks: int) -> None:
    k = tkc.load(EXAMPLES / "allgather.tk")
    M, N = 72, 300
    rng = np.random.default_rng(ranks)
    x = [cases.bf16(rng, M, N) for _ in range(ranks)]
    out = [torch.full((ranks, M, N), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    tkc.interpret_ranks(k, [[x[r], out[r]] for r in range(ranks)], seed=ranks, BM=32, BN=64)
    for r in range(ranks):
        assert torch.equal(out[r], torch.stack(x))  # a copy: bit for bit


@pytest.mark.parametrize("ranks", [2, 4])
def test_reducescatter(ranks: int) -> None:
    k = tkc.load(EXAMPLES / "reducescatter.tk")
    MS, N = 40, 300
    rng = np.random.default_rng(ranks)
    x = [cases.bf16(rng, ranks * MS, N) for _ in range(ranks)]
    out = [torch.full((MS, N), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    args = [[x[r], out[r], torch.zeros(ranks, MS, N, dtype=torch.bfloat16),
             torch.zeros(-(-MS // 32), -(-N // 64), dtype=torch.int32)] for r in range(ranks)]
    tkc.interpret_ranks(k, args, seed=ranks, BM=32, BN=64)
    total = sum(t.float() for t in x)
    for r in range(ranks):
        cases.close(out[r], total[r * MS:(r + 1) * MS])
        assert torch.equal(args[r][3], torch.full_like(args[r][3], ranks - 1))  # every peer counted every tile


def test_ranks_that_share_memory_are_refused(tmp_path: Path) -> None:
    """Each executor copies a rank's arguments: ranks passing one array (or views of it) would
    each see a copy of their own and the last write back would win, silently."""
    from tkc.errors import TkcLaunchError

    path = tmp_path / "shift.tk"
    path.write_text("""
@kernel
def shift(x: f32[N] @ ranks, y: f32[N]):
    grid(1)
    barrier_all()
    x.on((rank() + 1) % num_ranks())[0:16] = y[0:16] + 1.0
    barrier_all()
    y[0:16] = x[0:16]
""")
    k = tkc.load(path)
    x = np.zeros(32, np.float32)
    t = torch.zeros(16)

    def ys() -> list:
        return [np.full(16, 10, np.float32), np.full(16, 20, np.float32)]

    for a, b in ((x[:16], x[:16]), (t, t)):
        y0, y1 = ys()
        with pytest.raises(TkcLaunchError, match="'x' of rank 1 shares memory with 'x' of rank 0"):
            tkc.interpret_ranks(k, [[a, y0], [b, y1]])
    # disjoint halves of one array or tensor, and interleaved elements, are memory of their own
    t32 = torch.zeros(32)
    for a, b in ((x[:16], x[16:]), (x[0::2], x[1::2]), (t32[:16], t32[16:])):
        y0, y1 = ys()
        tkc.interpret_ranks(k, [[a, y0], [b, y1]])
        assert y0.tolist() == [21.0] * 16 and y1.tolist() == [11.0] * 16
    with pytest.raises(TkcLaunchError, match="shares memory"):  # overlapping slices of one tensor
        tkc.interpret_ranks(k, [[t32[:16], ys()[0]], [t32[8:24], ys()[1]]])
