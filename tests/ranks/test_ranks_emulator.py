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
import rank_cases as cases
import torch
from click.testing import CliRunner
from test_ranks_protocol import PAST, RING, SKIP, STARTED_RING, _ring_args

from tkc.cli import cli
from tkc.compiler import compile_kernel
from tkc.emulator import emulate, emulate_ranks
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


def _line(text: str, piece: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if piece in line and not line.startswith("#"))


# ------------------------------------------------------------------ the examples
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_allgather_gemm(ranks: int, seed: int) -> None:
    case = cases.allgather_gemm(ranks, seed, M=80, K=72, N=48)
    emulate_ranks(_hopper("allgather_gemm.tk", **GEMM), case.args, seed=seed)
    case.check()


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_gemm_reducescatter(ranks: int, seed: int) -> None:
    case = cases.gemm_reducescatter(ranks, seed, MS=80, K=72, N=48, BM=GEMM["BM"], BN=GEMM["BN"])
    emulate_ranks(_hopper("gemm_reducescatter.tk", **GEMM), case.args, seed=seed)
    case.check()


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_gemm_allreduce(ranks: int, seed: int) -> None:
    case = cases.gemm_allreduce(ranks, seed, MS=80, K=72, N=48, BM=GEMM["BM"], BN=GEMM["BN"])
    emulate_ranks(_hopper("gemm_allreduce.tk", **GEMM), case.args, seed=seed)
    case.check()


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("defer_last", [False, True])  # True: what a launch schedules
def test_ring_attn(ranks: int, defer_last: bool) -> None:
    # The loop waits for a rank's K/V blocks at its first; pipelined, the copies of a later
    # block are issued iterations ahead, each behind its own rank's wait (issued again there).
    case = cases.ring_attn(ranks, ranks, B=1, H=2, N=80, D=64)
    emulate_ranks(_hopper("ring_attn.tk", D=64, BM=64, BN=64, defer_last=defer_last), case.args, seed=ranks)
    case.check()


def test_a_loop_that_waits_behind_its_copies_stays_serial() -> None:
    """Ring attention waiting for the next rank's blocks at the last block of a rank: copies
    issued ahead would pass that wait, so the loop keeps one copy at a time, and computes right."""
    text = (EXAMPLES / "ring_attn.tk").read_text()
    before = """            if (j == 0) & (src != me):
                wait(ready[src] >= pushers)
"""
    assert before in text
    text = text.replace(before, "").replace("""            vt = vg[src, b, h, j*BN:(j+1)*BN, :]
""", """            vt = vg[src, b, h, j*BN:(j+1)*BN, :]
            if (j == nb - 1) & ((src + 1) % num_ranks() != me):
                wait(ready[(src + 1) % num_ranks()] >= pushers)
""")
    compiled = compile_kernel(text, {"D": 64, "BM": 64, "BN": 64}, stop="hopper", cache=False)
    kernel = compiled.kernel_op
    assert len(compiled.remarks) == 1 and ": note: this loop's tile loads stay one at a time" in compiled.remarks[0] \
        and "a wait() after them" in compiled.remarks[0], compiled.remarks  # and the author is told why
    stages = {op.result.name_hint: op.attributes.get("stages", 1) for op in kernel.walk()
              if op.name == "hopper.smem_alloc"}
    assert stages["kg_smem"] == stages["vg_smem"] == 1, stages  # K and V: no ring
    case = cases.ring_attn(2, 0, B=1, H=2, N=80, D=64)
    emulate_ranks(kernel, case.args, seed=0)
    case.check()


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_moe_dispatch(ranks: int, seed: int) -> None:
    case = cases.moe_dispatch(ranks, seed, T=150, D=80, F=96, EL=2)
    emulate_ranks(_hopper("moe_dispatch.tk"), case.args, seed=seed)
    case.check()


def test_moe_pulled_from_peers() -> None:
    """The pull form (tests/data/ranks/moe_pull.tk): gathers from peers as wgmma A operands."""
    case = cases.moe_dispatch(2, 0, T=150, D=80, F=96, EL=2)
    emulate_ranks(_hopper(str(Path(__file__).parents[1] / "data" / "ranks" / "moe_pull.tk")),
                  [args[:5] for args in case.args])
    case.check()


def test_one_rank_runs_through_emulate() -> None:
    """A multi-GPU kernel on one GPU is rank 0 of 1: emulate runs it (waits included)."""
    (args,), check = cases.gemm_reducescatter(1, 3, MS=80, K=40, N=80, BM=GEMM["BM"], BN=GEMM["BN"])
    emulate(_hopper("gemm_reducescatter.tk", **GEMM), args)
    check()


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


def test_tiles_that_wait_for_each_other_stay_one_program_a_tile() -> None:
    """The persistent pass leaves a kernel with waits alone by default: walking its tiles, one
    program would wait for a flag only a tile it reaches later raises."""
    path = Path(__file__).parents[1] / "data" / "ranks" / "cross_tile_wait.tk"
    kernel = compile_kernel(path, {}, stop="hopper", cache=False).kernel_op
    assert not any(op.name == "tile.num_sms" for op in kernel.walk())
    r = CliRunner().invoke(cli, ["run", str(path), "--ranks", "2", "--backend", "emulate", "--check", "--dim", "M=192",
                                 "--dim", "N=128", "--dim", "K=64"], env={"TKC_INTERPRET": None})
    assert r.exit_code == 0 and "MISMATCH" not in r.output, r.output


# ------------------------------------------------------------------ protocol errors
@pytest.mark.parametrize("seed", SEEDS)
def test_a_wait_nobody_signals_is_a_deadlock_across_ranks(seed: int) -> None:
    with pytest.raises(DeadlockError) as info:
        emulate_ranks(_compiled(RING), _ring_args(3), seed=seed)
    msg = str(info.value)
    assert "deadlock across ranks" in msg, msg
    for r in range(3):
        assert f"rank {r} CTA (0,) warpgroup 0 waits at line 7 for flags[{(r + 2) % 3}] >= 1 (it is 0)" in msg, msg
    assert info.value.loc.line == 7


def test_a_wait_that_can_never_be_satisfied() -> None:
    with pytest.raises(DeadlockError) as info:
        emulate_ranks(_compiled(RING), _ring_args(1))
    assert "a wait that can never be satisfied: rank 0 CTA (0,) warpgroup 0 waits at line 7 for flags[0] >= 1 " \
           "(it is 0), and every other program has finished" in str(info.value), str(info.value)


def test_a_ring_that_starts_runs() -> None:
    k = _compiled(STARTED_RING)
    for seed in SEEDS:
        args = _ring_args(4)
        emulate_ranks(k, args, seed=seed)
        assert [float(a[0][0]) for a in args] == [0.0, 1.0, 2.0, 3.0]


def test_a_rank_that_skips_a_barrier_leaves_the_others_waiting() -> None:
    k = _compiled(SKIP)
    with pytest.raises(DeadlockError) as info:
        emulate_ranks(k, [[np.zeros(16, np.float32), r] for r in range(3)])
    msg = str(info.value)
    assert re.search(r"ranks meet barrier_all\(\) a different number of times: rank (0|2) CTA \(0,\) warpgroup 0 "
                     r"waits at its barrier 1 \(line 6\), but rank 1 CTA \(0,\) warpgroup 0 has finished after "
                     r"meeting none;", msg), msg
    assert info.value.loc.line == 6


@pytest.mark.parametrize("seed", SEEDS)
def test_a_rank_that_skips_a_barrier_of_a_warp_specialized_kernel(seed: int) -> None:
    # rank() in the condition would not compile; a scalar argument that differs across ranks does
    text = (EXAMPLES / "allgather_gemm.tk").read_text()
    text = text.replace("        barrier_all()\n", "        if skipper != 1:\n            barrier_all()\n")
    text = text.replace("ready: i32[P, GM] @ ranks,", "ready: i32[P, GM] @ ranks, skipper: i32,")
    k = compile_kernel(text, GEMM, stop="hopper", cache=False).kernel_op
    assert any(op.name == "hopper.role" for op in k.walk())
    args = cases.allgather_gemm(2, 0, M=80, K=72, N=48).args
    with pytest.raises(TkcEmulatorError) as info:
        emulate_ranks(k, [[*a, r] for r, a in enumerate(args)], seed=seed)
    msg = str(info.value)
    # rank 1 went past: its pushers store into rank 0's ag before rank 0 is in the kernel (the
    # deadlock at the barrier rank 0 waits at would come later)
    line = _line(text, "ag.on(dst)[me")
    assert re.search(r"data race on element \[1, \d+, \d+\] of 'ag' of rank 0: rank 1 CTA \(\d+,\) stores to it here "
                     r"with no release/acquire chain after the launch on rank 0; .* a barrier_all\(\) first", msg), msg
    assert info.value.loc.line == line


LOOPED_BARRIER = """
@kernel
def k(a: bf16[M, K], b: bf16[K, N], c: bf16[M, N], x: f32[N] @ ranks, n: i32,
      BM: const = 64, BN: const = 64, BK: const = 32):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    for i in range(n):
        barrier_all()
    acc = zeros([BM, BN], f32)
    for kk in range(cdiv(K, BK)):
        acc += a[pm*BM:(pm+1)*BM, kk*BK:(kk+1)*BK] @ b[kk*BK:(kk+1)*BK, pn*BN:(pn+1)*BN]
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc.to(bf16)
"""


def test_a_finished_role_counts_the_barriers_it_met() -> None:
    """A warp-specialized kernel whose rank 0 meets one barrier_all() and finishes while rank 1
    waits at its second: the finished producer is named with the barrier it met (its role is
    kept once its region ends)."""
    k = _compiled(LOOPED_BARRIER)
    assert any(op.name == "hopper.role" for op in k.walk())
    rng = np.random.default_rng(0)
    args = [[cases.bf16(rng, 64, 64), cases.bf16(rng, 64, 64), torch.zeros(64, 64, dtype=torch.bfloat16),
             torch.zeros(64), n] for n in (1, 2)]
    with pytest.raises(DeadlockError) as info:
        emulate_ranks(k, args, seed=0)
    msg = str(info.value)
    assert re.search(r"rank 1 CTA \(0,\) warpgroup \d \(\w+\) waits at its barrier 2 \(line 9\), but rank 0 CTA "
                     r"\(0,\) warpgroup \d \(\w+\) has finished after meeting 1 \(line 9\)", msg), msg


@pytest.mark.parametrize("seed", SEEDS)
def test_a_barrier_waits_for_every_role_of_the_program(seed: int) -> None:
    """allgather_gemm's barrier runs in its producer and its consumer roles (docs/hopper.md §4:
    the barrier completes once every role of the program on every rank has arrived); without
    the producers' copy the consumers wait for them on every rank.  (Without the consumers'
    copy, their pushes reach a peer before it is in the kernel: a data race, found first.)"""
    text = compile_kernel(EXAMPLES / "allgather_gemm.tk", GEMM, stop="hopper", cache=False).asm["hopper"]
    producer = text.index('name = "producer"')
    at = text.index("tile.rank_barrier", producer)
    start, end = text.rindex("\n", 0, at), text.index("\n", at)
    k = parse_module(text[:start] + text[end:]).kernel()
    with pytest.raises(DeadlockError) as info:
        emulate_ranks(k, cases.allgather_gemm(2, 0, M=80, K=72, N=48).args, seed=seed)
    msg = str(info.value)
    line = _line((EXAMPLES / "allgather_gemm.tk").read_text(), "barrier_all()")
    # a program's producer finishes (its loads wait for nothing of this barrier), its consumers
    # wait for it on every rank
    assert re.search(rf"rank \d CTA \((\d+),\) warpgroup 1 \(consumers\) waits at its barrier 1 \(line {line}\), "
                     r"but rank 0 CTA \(\1,\) warpgroup 0 \(producer\) has finished after meeting none, "
                     r"rank 1 CTA \(\1,\) warpgroup 0 \(producer\) has finished after meeting none", msg), msg


@pytest.mark.parametrize("seed", SEEDS)
def test_a_copy_issued_ahead_of_the_wait_that_guards_it_is_a_race(seed: int) -> None:
    """ring_attn.tk's producer without the waits pipeline-loops issues again ahead of the copies
    (copies = true): it copies a peer's K/V blocks iterations before its loop waits for them.
    Whether the peer's pushes land before the copy or after it, the copy is not ordered after
    them: an error naming both CTAs and lines (a wrong result before)."""
    text = compile_kernel(EXAMPLES / "ring_attn.tk", {"D": 64, "BM": 64, "BN": 64}, stop="hopper",
                          cache=False).asm["hopper"]
    lines = text.splitlines()
    guards = [i for i, line in enumerate(lines) if "copies = true" in line]
    assert len(guards) == 2  # the prologue's and the refill's
    for i in guards:
        lines[i] = ""
    k = parse_module("\n".join(lines)).kernel()
    case = cases.ring_attn(2, 0, B=1, H=2, N=200, D=64)
    with pytest.raises(TkcEmulatorError) as info:
        emulate_ranks(k, case.args, seed=seed)
    msg = str(info.value)
    assert re.search(r"data race on element \[\d, 0, \d, \d+, \d+\] of '[kv]g' of rank \d: ", msg), msg
    assert "rank 0 CTA" in msg and "rank 1 CTA" in msg, msg


def test_a_rank_out_of_range_is_an_error_at_its_line() -> None:
    with pytest.raises(TkcEmulatorError) as info:
        emulate_ranks(_compiled(PAST), [[np.zeros(16, np.float32)] for _ in range(2)])
    assert "rank 2 is out of range: the launch has 2 ranks (0..1)" in str(info.value), str(info.value)
    assert "'tile.peer'" in str(info.value) and "rank 1 CTA (0,)" in str(info.value), str(info.value)
    assert info.value.loc.line == 6


@pytest.mark.parametrize("seed", SEEDS)
def test_a_wait_for_a_flag_nobody_sets_in_an_example(seed: int) -> None:
    text = (EXAMPLES / "gemm_allreduce.tk").read_text().replace("wait(flags[0, src, pm, pn] >= 1)",
                                                                  "wait(flags[0, src, pm, pn] >= 2)")
    k = compile_kernel(text, GEMM, stop="hopper", cache=False).kernel_op
    rng = np.random.default_rng(0)
    args = [[cases.bf16(rng, 2 * 40, 24), cases.bf16(rng, 24, 40), torch.zeros(2, 40, 40, dtype=torch.bfloat16),
             torch.zeros(2, 2, 1, 1, dtype=torch.int32)] for _ in range(2)]
    with pytest.raises(DeadlockError) as info:
        emulate_ranks(k, args, seed=seed)
    msg = str(info.value)
    assert "deadlock across ranks" in msg, msg
    assert re.search(rf"rank 0 CTA \(0,\) warpgroup \d( \(\w+\))? waits at line {_line(text, 'wait(flags[0')} for "
                     r"flags\[0, \d, 0, 0\] >= 2 \(it is 1\)", msg), msg
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
    return [[cases.bf16(rng, 64, 96), cases.bf16(rng, 96, 64), torch.zeros(64, 64, dtype=torch.bfloat16),
             torch.zeros(64, 64, dtype=torch.bfloat16), torch.zeros(ranks, dtype=torch.int32)] for _ in range(ranks)]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_signal_after_a_tma_store_lets_it_land(seed: int) -> None:
    k = _compiled(PUT)
    assert any(op.name == "hopper.tma_store" and op.tensor.owner is not None for op in k.walk())  # to a peer
    args = _put_args(3)
    emulate_ranks(k, args, seed=seed)
    for r in range(3):
        cases.close(args[r][3], args[(r + 2) % 3][0].float() @ args[(r + 2) % 3][1].float())


@pytest.mark.parametrize("seed", SEEDS)
def test_a_tiles_releasing_atomic_releases_every_threads_writes(seed: int) -> None:
    """A tile atomic_add with sem="release" releases the program's writes, as the interpreter
    says: the lowering makes the threads meet (and the TMA stores land) before each thread's
    red.release, so the peer that waits for one element of the tile reads x whole."""
    text = PUT.replace("flags: i32[R] @ ranks,", "flags: i32[R, 16] @ ranks,").replace(
        "signal(flags.on(nxt)[rank()], 1)",
        'atomic_add(flags.on(nxt)[rank(), 0:16], full([16], 1, i32), sem="release")').replace(
        "wait(flags[prv] >= 1)", "wait(flags[prv, 3] >= 1)")
    args = _put_args(3)
    for a in args:
        a[4] = torch.zeros(3, 16, dtype=torch.int32)
    emulate_ranks(_compiled(text), args, seed=seed)
    for r in range(3):
        cases.close(args[r][3], args[(r + 2) % 3][0].float() @ args[(r + 2) % 3][1].float())


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
                     r"CTA \(0,\) warpgroup \d( \(consumers\))? still writes it", msg), msg
    assert f"'{reader}'" in msg and info.value.loc.line == 14, msg


# ------------------------------------------------------------------ the lowering, as the emulator sees it
def test_moe_dispatch_with_more_tiles_than_programs() -> None:
    """The ring count of moe_dispatch's K loop (in the loop over work items and a loop of
    data-dependent length) goes on from item to item of a program, as the ring's barriers do."""
    case = cases.moe_dispatch(2, 0, T=150, D=80, F=200, EL=3)  # 2 sources x 3 experts x 2 column tiles over 4 programs
    emulate_ranks(_hopper("moe_dispatch.tk"), case.args)
    case.check()


@pytest.mark.parametrize("seed", [0, 1])
def test_moe_dispatch_a_written_while_its_wgmma_is_in_flight(seed: int) -> None:
    """The pull form of moe_dispatch (tests/data/ranks/moe_pull.tk: each expert gathers its rows
    from the peers inside its K loop, the A operand in registers) with the wgmma of the gathered
    rows left in flight across iterations (as it ran wrong on an H200): the next iteration's A,
    written into the registers the in-flight wgmma reads, is an error at the product's line.
    The lowering of today waits for such a wgmma in each iteration
    (test_gather_products_wait_every_iteration)."""
    text = (Path(__file__).parents[1] / "data" / "hopper" / "moe_dispatch_overlap.tkir").read_text()
    line = _line((Path(__file__).parents[1] / "data" / "ranks" / "moe_pull.tk").read_text(), "acc += x.on(src)")
    case = cases.moe_dispatch(2, seed, T=150, D=80, F=96, EL=2)  # two K tiles
    case.args[:] = [args[:5] for args in case.args]  # the pull form: no recv, no arrived
    with pytest.raises(TkcEmulatorError, match=rf"'hopper.convert_layout' \(%\w+\) at moe_dispatch.tk:{line}:\d+: "
                                               rf"writes the registers of the A operand that the product at "
                                               rf"line {line} still reads"):
        emulate_ranks(parse_module(text, "moe_dispatch_overlap.tkir").kernel(), case.args, seed=seed)


def test_a_barrier_under_a_branch_in_a_warp_specialized_kernel() -> None:
    """A barrier_all() under an if reaches both roles (it completes once every role arrived)."""
    text = (EXAMPLES / "allgather_gemm.tk").read_text()
    text = text.replace("        barrier_all()\n", "        if num_ranks() > 0:\n            barrier_all()\n")
    case = cases.allgather_gemm(2, 0, M=80, K=72, N=48)
    emulate_ranks(compile_kernel(text, GEMM, stop="hopper", cache=False).kernel_op, case.args)
    case.check()
