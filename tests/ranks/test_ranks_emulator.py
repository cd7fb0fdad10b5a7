"""Multi-GPU kernels in the emulator (tkc/emulator/ranks.py): the lowered hopper IR of the five
examples on 2 and 4 simulated ranks against torch and against the interpreter, and the
protocol errors of the lowered kernels (a wait nobody signals, a barrier a rank skips, a peer
out of range, a read of a TMA store still in flight) naming ranks, CTAs, roles and lines.

Tiles are the smallest the hopper lowering takes (64 rows a consumer warpgroup); shapes have
tails, every rank has its own random inputs, and each case runs under several seeds (the
order the warpgroups of all ranks interleave in)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from tkc.cli import cli
from tkc.compiler import compile_kernel
from tkc.emulator import emulate, emulate_ranks
from tkc.emulator.mbarrier import PhaseError
from tkc.emulator.scheduler import DeadlockError
from tkc.errors import TkcEmulatorError
from tkc.ir.parser import parse_module

EXAMPLES = Path(__file__).parents[2] / "examples"
GEMM = {"BM": 64, "BN": 64, "BK": 32}
SEEDS = [0, 1, 2]


@functools.cache
def _hopper(example: str, **consts: int):
    return compile_kernel(EXAMPLES / example, consts, stop="hopper", cache=False).kernel_op


def _compiled(text: str):
    return compile_kernel(text, stop="hopper", cache=False).kernel_op


def _bf16(rng: np.random.Generator, *shape: int) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(torch.bfloat16)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), want.to(got.dtype).float(), atol=0.1, rtol=2e-2)


def _line(text: str, piece: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if piece in line and not line.startswith("#"))


# ------------------------------------------------------------------ the examples
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_allgather_gemm(ranks: int, seed: int) -> None:
    M, K, N = 80, 72, 48
    rng = np.random.default_rng(seed)
    a = [_bf16(rng, M, K) for _ in range(ranks)]
    b = [_bf16(rng, K, N) for _ in range(ranks)]
    c = [torch.full((ranks, M, N), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    emulate_ranks(_hopper("allgather_gemm.tk", **GEMM), [[a[r], b[r], c[r]] for r in range(ranks)], seed=seed)
    gathered = torch.cat(a).float()
    for r in range(ranks):
        _close(c[r].reshape(ranks * M, N), gathered @ b[r].float())


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_gemm_reducescatter(ranks: int, seed: int) -> None:
    MS, K, N = 80, 72, 48
    grid_m, grid_n = -(-MS // GEMM["BM"]), -(-N // GEMM["BN"])
    rng = np.random.default_rng(seed)
    a = [_bf16(rng, ranks * MS, K) for _ in range(ranks)]
    b = [_bf16(rng, K, N) for _ in range(ranks)]
    out = [torch.full((MS, N), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    args = [[a[r], b[r], out[r], torch.zeros(ranks, MS, N), torch.zeros(ranks, grid_m, grid_n, dtype=torch.int32)]
            for r in range(ranks)]
    emulate_ranks(_hopper("gemm_reducescatter.tk", **GEMM), args, seed=seed)
    total = sum(a[r].float() @ b[r].float() for r in range(ranks))
    for r in range(ranks):
        _close(out[r], total[r * MS:(r + 1) * MS])
        assert (args[r][4] == 1).all()  # every rank signalled every tile of rank r once


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_gemm_allreduce(ranks: int, seed: int) -> None:
    MS, K, N = 80, 72, 48
    grid_m, grid_n = -(-MS // GEMM["BM"]), -(-N // GEMM["BN"])
    rng = np.random.default_rng(seed)
    a = [_bf16(rng, ranks * MS, K) for _ in range(ranks)]
    b = [_bf16(rng, K, N) for _ in range(ranks)]
    out = [torch.full((ranks, MS, N), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    args = [[a[r], b[r], out[r], torch.zeros(ranks, MS, N), torch.zeros(2, ranks, grid_m, grid_n, dtype=torch.int32)]
            for r in range(ranks)]
    emulate_ranks(_hopper("gemm_allreduce.tk", **GEMM), args, seed=seed)
    total = sum(a[r].float() @ b[r].float() for r in range(ranks))
    for r in range(ranks):
        _close(out[r].reshape(ranks * MS, N), total)
        assert torch.equal(out[r], out[0])  # every rank holds the same sums, bit for bit


@pytest.mark.parametrize("ranks", [2, 4])
def test_ring_attn(ranks: int) -> None:
    B, H, N, D = 1, 2, 80, 64
    rng = np.random.default_rng(ranks)
    q, kk, v = ([_bf16(rng, B, H, N, D) for _ in range(ranks)] for _ in range(3))
    o = [torch.full((B, H, N, D), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    scale = 0.125
    emulate_ranks(_hopper("ring_attn.tk", D=D, BM=64, BN=64), [[q[r], kk[r], v[r], o[r], scale] for r in range(ranks)],
                  seed=ranks)
    keys, values = torch.cat(kk, dim=2).float(), torch.cat(v, dim=2).float()
    for r in range(ranks):
        want = torch.softmax(q[r].float() @ keys.transpose(-1, -2) * scale, dim=-1) @ values
        torch.testing.assert_close(o[r].float(), want, atol=2e-2, rtol=2e-2)


def _moe(ranks: int, seed: int, T: int = 150, D: int = 80, F: int = 96, EL: int = 2) -> tuple[list, list, list]:
    """moe_dispatch's arguments (rank 0 sends every token to one expert: long and empty
    segments) and what each rank's y must hold."""
    experts = ranks * EL
    rng = np.random.default_rng(seed)
    x = [_bf16(rng, T, D) for _ in range(ranks)]
    w = [_bf16(rng, EL, D, F) for _ in range(ranks)]
    ids = [torch.from_numpy(rng.integers(0, experts, T)) for _ in range(ranks)]
    ids[0][:] = 0
    order = [torch.argsort(i, stable=True).to(torch.int32) for i in ids]
    offsets = [torch.cat([torch.zeros(1, dtype=torch.int64), torch.bincount(i, minlength=experts).cumsum(0)])
               .to(torch.int32) for i in ids]
    y = [torch.full((ranks, T, F), float("nan"), dtype=torch.bfloat16) for _ in range(ranks)]
    want = [torch.full((ranks, T, F), float("nan")) for _ in range(ranks)]
    for src in range(ranks):
        for p in range(T):
            e = int(ids[src][order[src][p]])
            want[e // EL][src, p] = x[src][order[src][p]].float() @ w[e // EL][e % EL].float()
    return [[x[r], order[r], offsets[r], w[r], y[r]] for r in range(ranks)], y, want


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_moe_dispatch(ranks: int, seed: int) -> None:
    args, y, want = _moe(ranks, seed)
    emulate_ranks(_hopper("moe_dispatch.tk"), args, seed=seed)
    for r in range(ranks):
        torch.testing.assert_close(y[r].float(), want[r].bfloat16().float(), atol=0.1, rtol=2e-2, equal_nan=True)


def test_one_rank_runs_through_emulate() -> None:
    """A multi-GPU kernel on one GPU is rank 0 of 1: emulate runs it (waits included)."""
    rng = np.random.default_rng(3)
    a, b = _bf16(rng, 80, 40), _bf16(rng, 40, 80)
    out = torch.zeros(80, 80, dtype=torch.bfloat16)
    emulate(_hopper("gemm_reducescatter.tk", **GEMM), [a, b, out, torch.zeros(1, 80, 80),
                                                       torch.zeros(1, 2, 2, dtype=torch.int32)])
    _close(out, a.float() @ b.float())


# ------------------------------------------------------------------ tkc run
SMALL = {"ring_attn.tk": ["-D", "BM=64", "-D", "BN=64", "-D", "D=64", "--dim", "B=1", "--dim", "H=2", "--dim", "N=80"],
         "moe_dispatch.tk": ["--dim", "F=96"]}
CLI_GEMM = [arg for k, v in GEMM.items() for arg in ("-D", f"{k}={v}")]


@pytest.mark.parametrize("example", ["allgather_gemm.tk", "gemm_reducescatter.tk", "gemm_allreduce.tk", "ring_attn.tk",
                                     "moe_dispatch.tk"])
@pytest.mark.parametrize("ranks", ["2", "4"])
def test_run_emulated_with_check(example: str, ranks: str) -> None:
    r = CliRunner().invoke(cli, ["run", str(EXAMPLES / example), "--ranks", ranks, "--backend", "emulate", "--check",
                                 *SMALL.get(example, CLI_GEMM)], env={"TKC_INTERPRET": None})
    assert r.exit_code == 0, r.output
    assert f"{ranks} ranks of grid" in r.output and "emulate: emulated in" in r.output, r.output
    checks = [line for line in r.output.splitlines() if "check " in line]
    assert checks and all("emulator against interpreter" in line and line.endswith(": ok") for line in checks), r.output
    assert f"(rank {int(ranks) - 1})" in r.output


# ------------------------------------------------------------------ protocol errors
RING = """@kernel
def ring(x: f32[N] @ ranks, flags: i32[R] @ ranks):
    grid(1)
    nxt = (rank() + 1) % num_ranks()
    prv = (rank() + num_ranks() - 1) % num_ranks()
    wait(flags[prv] >= 1)
    x.on(nxt)[0:16] = x[0:16] + 1.0
    signal(flags.on(nxt)[rank()], 1)
"""


def _ring_args(ranks: int) -> list[list]:
    return [[np.zeros(16, np.float32), np.zeros(ranks, np.int32)] for _ in range(ranks)]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_wait_nobody_signals_is_a_deadlock_across_ranks(seed: int) -> None:
    with pytest.raises(DeadlockError) as info:
        emulate_ranks(_compiled(RING), _ring_args(3), seed=seed)
    msg = str(info.value)
    assert "deadlock across ranks" in msg, msg
    for r in range(3):
        assert f"rank {r} CTA (0,) warpgroup 0 waits at line 6 for flags[{(r + 2) % 3}] >= 1 (it is 0)" in msg, msg
    assert info.value.loc.line == 6


def test_a_wait_that_can_never_be_satisfied() -> None:
    with pytest.raises(DeadlockError) as info:
        emulate_ranks(_compiled(RING), _ring_args(1))
    assert "a wait that can never be satisfied: rank 0 CTA (0,) warpgroup 0 waits at line 6 for flags[0] >= 1 " \
           "(it is 0), and every other program has finished" in str(info.value), str(info.value)


def test_a_ring_that_starts_runs() -> None:
    """The same ring with rank 0 starting it: each rank adds one to what it got."""
    k = _compiled(RING.replace("    wait(flags[prv] >= 1)\n",
                               "    barrier_all()\n    if rank() > 0:\n        wait(flags[prv] >= 1)\n")
                  .replace("    x.on(nxt)[0:16] = x[0:16] + 1.0\n    signal(",
                           "    if nxt > 0:\n        x.on(nxt)[0:16] = x[0:16] + 1.0\n        signal("))
    for seed in SEEDS:
        args = _ring_args(4)
        emulate_ranks(k, args, seed=seed)
        assert [float(a[0][0]) for a in args] == [0.0, 1.0, 2.0, 3.0]


def test_a_rank_that_skips_a_barrier_leaves_the_others_waiting() -> None:
    k = _compiled("""@kernel
def skip(x: f32[N] @ ranks):
    grid(1)
    if rank() != 1:
        barrier_all()
    x[0:16] = zeros([16], f32)
""")
    with pytest.raises(DeadlockError) as info:
        emulate_ranks(k, [[np.zeros(16, np.float32)] for _ in range(3)])
    msg = str(info.value)
    assert "deadlock across ranks" in msg, msg
    for r in (0, 2):
        assert f"rank {r} CTA (0,) warpgroup 0 waits at barrier_all() (line 5, its barrier 1) for rank 1 CTA (0,) " \
               f"warpgroup 0 has finished without reaching it" in msg, msg


@pytest.mark.parametrize("seed", SEEDS)
def test_a_rank_that_skips_a_barrier_of_a_warp_specialized_kernel(seed: int) -> None:
    text = (EXAMPLES / "allgather_gemm.tk").read_text().replace("    barrier_all()\n",
                                                                 "    if rank() != 1:\n        barrier_all()\n")
    k = compile_kernel(text, GEMM, stop="hopper", cache=False).kernel_op
    assert any(op.name == "hopper.role" for op in k.walk())
    rng = np.random.default_rng(0)
    args = [[_bf16(rng, 80, 72), _bf16(rng, 72, 48), torch.zeros(2, 80, 48, dtype=torch.bfloat16)] for _ in range(2)]
    with pytest.raises(DeadlockError) as info:
        emulate_ranks(k, args, seed=seed)
    msg = str(info.value)
    line = _line(text, "barrier_all()")
    assert f"rank 0 CTA (0,) warpgroup 0 (producer) waits at barrier_all() (line {line}, its barrier 1)" in msg, msg
    assert "rank 1 CTA (0,) warpgroup 0 (producer) has finished without reaching it" in msg, msg
    assert info.value.loc.line == line


@pytest.mark.parametrize("seed", SEEDS)
def test_a_barrier_waits_for_every_role_of_the_program(seed: int) -> None:
    """allgather_gemm's barrier runs in its producer and its consumer roles (docs/hopper.md §4:
    the barrier completes once every role of the program on every rank has arrived); without
    the consumers' copy the producers wait for them on every rank."""
    text = compile_kernel(EXAMPLES / "allgather_gemm.tk", GEMM, stop="hopper", cache=False).asm["hopper"]
    consumers = text.index('name = "consumers"')
    at = text.index("tile.rank_barrier", consumers)
    start, end = text.rindex("\n", 0, at), text.index("\n", at)
    k = parse_module(text[:start] + text[end:]).kernel()
    rng = np.random.default_rng(0)
    args = [[_bf16(rng, 80, 72), _bf16(rng, 72, 48), torch.zeros(2, 80, 48, dtype=torch.bfloat16)] for _ in range(2)]
    with pytest.raises(DeadlockError) as info:
        emulate_ranks(k, args, seed=seed)
    msg = str(info.value)
    line = _line((EXAMPLES / "allgather_gemm.tk").read_text(), "barrier_all()")
    for r in range(2):
        assert f"rank {r} CTA (0,) warpgroup 0 (producer) waits at barrier_all() (line {line}, its barrier 1) for " \
               f"rank 0 CTA (0,) warpgroup 1 (consumers) has not reached it; rank 1 CTA (0,) warpgroup 1 (consumers) " \
               f"has not reached it" in msg, msg


def test_a_rank_out_of_range_is_an_error_at_its_line() -> None:
    k = _compiled("""@kernel
def past(x: f32[N] @ ranks):
    grid(1)
    barrier_all()
    t = x.on(rank() + 1)[0:16]
    x[0:16] = t
""")
    with pytest.raises(TkcEmulatorError) as info:
        emulate_ranks(k, [[np.zeros(16, np.float32)] for _ in range(2)])
    assert "rank 2 is out of range: the launch has 2 ranks (0..1)" in str(info.value), str(info.value)
    assert "'tile.peer'" in str(info.value) and "rank 1 CTA (0,)" in str(info.value), str(info.value)
    assert info.value.loc.line == 5


@pytest.mark.parametrize("seed", SEEDS)
def test_a_wait_for_a_flag_nobody_sets_in_an_example(seed: int) -> None:
    text = (EXAMPLES / "gemm_reducescatter.tk").read_text().replace("wait(flags[src, pm, pn] >= 1)",
                                                                      "wait(flags[src, pm, pn] >= 2)")
    k = compile_kernel(text, GEMM, stop="hopper", cache=False).kernel_op
    rng = np.random.default_rng(0)
    args = [[_bf16(rng, 2 * 40, 24), _bf16(rng, 24, 40), torch.zeros(40, 40, dtype=torch.bfloat16),
             torch.zeros(2, 40, 40), torch.zeros(2, 1, 1, dtype=torch.int32)] for _ in range(2)]
    with pytest.raises(DeadlockError) as info:
        emulate_ranks(k, args, seed=seed)
    msg = str(info.value)
    assert "deadlock across ranks" in msg, msg
    assert re.search(rf"rank 0 CTA \(0,\) warpgroup \d waits at line {_line(text, 'wait(flags')} for "
                     r"flags\[\d, 0, 0\] >= 2 \(it is 1\)", msg), msg
    assert "rank 1 CTA (0,)" in msg, msg


PUT = """@kernel
def put(a: bf16[M, K], b: bf16[K, N], x: bf16[M, N] @ ranks, y: bf16[M, N], flags: i32[R] @ ranks,
        BM: const = 64, BN: const = 64, BK: const = 32):
    grid(1)
    barrier_all()
    nxt = (rank() + 1) % num_ranks()
    prv = (rank() + num_ranks() - 1) % num_ranks()
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        acc += a[0:BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, 0:BN]
    x.on(nxt)[0:BM, 0:BN] = acc.to(bf16)
    signal(flags.on(nxt)[rank()], 1)
    wait(flags[prv] >= 1)
    y[0:BM, 0:BN] = x[0:BM, 0:BN]
"""


def _put_args(ranks: int) -> list[list]:
    rng = np.random.default_rng(1)
    return [[_bf16(rng, 64, 96), _bf16(rng, 96, 64), torch.zeros(64, 64, dtype=torch.bfloat16),
             torch.zeros(64, 64, dtype=torch.bfloat16), torch.zeros(ranks, dtype=torch.int32)] for _ in range(ranks)]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_signal_after_a_tma_store_lets_it_land(seed: int) -> None:
    k = _compiled(PUT)
    assert any(op.name == "hopper.tma_store" and op.tensor.owner is not None for op in k.walk())  # to a peer
    args = _put_args(3)
    emulate_ranks(k, args, seed=seed)
    for r in range(3):
        _close(args[r][3], args[(r + 2) % 3][0].float() @ args[(r + 2) % 3][1].float())


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("reader", ["hopper.load", "hopper.tma_load"])
def test_a_read_of_a_tma_store_still_in_flight(seed: int, reader: str) -> None:
    """A relaxed flag orders nothing: the peer's TMA store into x may still be in flight when
    the owner reads x after its wait (with loads, or with TMA as a product's operand)."""
    text = PUT.replace("signal(flags.on(nxt)[rank()], 1)", 'atomic_exch(flags.on(nxt)[rank()], 1, sem="relaxed")')
    args = _put_args(2)
    if reader == "hopper.tma_load":
        text = text.replace("flags: i32[R] @ ranks,", "flags: i32[R] @ ranks, e: bf16[N, N],").replace(
            "y[0:BM, 0:BN] = x[0:BM, 0:BN]", "y[0:BM, 0:BN] = (x[0:BM, 0:BN] @ e[0:BN, 0:BN]).to(bf16)")
        args = [a + [torch.eye(64, dtype=torch.bfloat16)] for a in args]
    with pytest.raises(TkcEmulatorError) as info:
        emulate_ranks(_compiled(text), args, seed=seed)
    msg = str(info.value)
    assert re.search(r"reads element \[0, 0\] of 'x' of rank (\d) while the TMA store at line 11 by rank (?!\1)\d "
                     r"CTA \(0,\) warpgroup 0 still writes it", msg), msg
    assert f"'{reader}'" in msg and info.value.loc.line == 14, msg


# ------------------------------------------------------------------ the lowering, as the emulator sees it
@pytest.mark.xfail(raises=PhaseError, strict=True,
                   reason="lowering: the ring count of moe_dispatch's K loop (nested in the rank loop and a loop of "
                          "data-dependent length) restarts at 0 in every tile of a persistent program, while the "
                          "ring's barriers go on: a program with two tiles waits for the wrong phase")
def test_moe_dispatch_with_more_tiles_than_programs() -> None:
    args, y, want = _moe(2, 0, F=200, EL=3)  # 3 experts x 2 column tiles: 6 tiles over 4 programs
    emulate_ranks(_hopper("moe_dispatch.tk"), args)
    for r in range(2):
        torch.testing.assert_close(y[r].float(), want[r].bfloat16().float(), atol=0.1, rtol=2e-2, equal_nan=True)


@pytest.mark.xfail(raises=DeadlockError, strict=True,
                   reason="lowering: specialize-warps puts a barrier_all() (or a wait) under an if or in a loop into "
                          "the producer role only, while a barrier completes once every role has arrived")
def test_a_barrier_under_a_branch_in_a_warp_specialized_kernel() -> None:
    text = (EXAMPLES / "allgather_gemm.tk").read_text().replace("    barrier_all()\n",
                                                                 "    if num_ranks() > 0:\n        barrier_all()\n")
    rng = np.random.default_rng(0)
    a = [_bf16(rng, 80, 72) for _ in range(2)]
    b = [_bf16(rng, 72, 48) for _ in range(2)]
    c = [torch.zeros(2, 80, 48, dtype=torch.bfloat16) for _ in range(2)]
    emulate_ranks(compile_kernel(text, GEMM, stop="hopper", cache=False).kernel_op,
                  [[a[r], b[r], c[r]] for r in range(2)])
    for r in range(2):
        _close(c[r].reshape(160, 48), torch.cat(a).float() @ b[r].float())
