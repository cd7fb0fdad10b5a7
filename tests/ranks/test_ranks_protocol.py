"""Protocol errors of multi-GPU kernels on simulated ranks: deadlocks, waits that can never
be satisfied, data races across ranks (a read of a peer's data before its signal, a write
onto memory a peer still reads, two ranks writing one element), ranks out of range.  Each
kernel plants one bug, most of them in the examples, and the error must name the ranks and
the source lines whatever order the programs happen to run in (several seeds)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import tkc
from tkc.errors import TkcInterpretError, TkcLaunchError

EXAMPLES = Path(__file__).parents[2] / "examples"
TILES = {"BM": 32, "BN": 32, "BK": 32}
SEEDS = [0, 1, 2, 3]


def _load(tmp_path: Path, text: str, name: str = "k.tk") -> tkc.Kernel:
    path = tmp_path / name
    path.write_text(text)
    return tkc.load(path)


def _planted(tmp_path: Path, example: str, old: str, new: str) -> tuple[tkc.Kernel, str]:
    text = (EXAMPLES / example).read_text()
    assert old in text
    text = text.replace(old, new)
    return _load(tmp_path, text, example), text


def _line(text: str, piece: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if piece in line and not line.startswith("#"))


def _allreduce_args(ranks: int, MS: int = 40, K: int = 24, N: int = 40) -> list[list]:
    rng = np.random.default_rng(0)
    gm, gn = -(-MS // TILES["BM"]), -(-N // TILES["BN"])
    return [[torch.from_numpy(rng.standard_normal((ranks * MS, K)).astype(np.float32)).bfloat16(),
             torch.from_numpy(rng.standard_normal((K, N)).astype(np.float32)).bfloat16(),
             torch.zeros(ranks, MS, N, dtype=torch.bfloat16), torch.zeros(2, ranks, gm, gn, dtype=torch.int32)]
            for _ in range(ranks)]


def _allgather_args(ranks: int, M: int = 40, K: int = 24, N: int = 40) -> list[list]:
    rng = np.random.default_rng(0)
    return [[torch.from_numpy(rng.standard_normal((K, N)).astype(np.float32)).bfloat16(),
             torch.zeros(ranks, M, N, dtype=torch.bfloat16),
             torch.from_numpy(rng.standard_normal((ranks, M, K)).astype(np.float32)).bfloat16(),
             torch.zeros(ranks, -(-M // TILES["BM"]), dtype=torch.int32)] for _ in range(ranks)]


def _error(k: tkc.Kernel, args: list[list], seed: int) -> TkcInterpretError:
    with pytest.raises(TkcInterpretError) as info:
        tkc.interpret_ranks(k, args, seed=seed, **TILES)
    return info.value


@pytest.mark.parametrize("seed", SEEDS)
def test_missing_wait_is_a_race_on_the_peers_partial(tmp_path: Path, seed: int) -> None:
    k, text = _planted(tmp_path, "gemm_allreduce.tk",
                       "        for src in range(num_ranks()):\n            wait(flags[0, src, pm, pn] >= 1)\n", "")
    # 4 tiles over 4 programs: the program that reads a tile's sum added this rank's own partial
    # into it, so only the peer's addition, unordered with the read, is the race
    err = _error(k, _allreduce_args(2), seed)
    msg = str(err)
    assert "data race on element" in msg and "of 'out' of rank" in msg, msg
    assert "no release/acquire chain" in msg, msg
    # whichever came first: the owner's read of its sum or the peer's atomic add into it
    lines = {_line(text, "result = out[me"), _line(text, "atomic_add(out.on(dst)")}
    assert err.loc.line in lines and f"(line {(lines - {err.loc.line}).pop()})" in msg, msg
    assert re.search(r"rank \d program \(\d+,( \d+)?\) (reads it|updates it atomically)", msg), msg


@pytest.mark.parametrize("seed", SEEDS)
def test_signal_before_the_store_is_a_race(tmp_path: Path, seed: int) -> None:
    # each tile announced before its own store, not one tile later
    k, text = _planted(tmp_path, "gemm_allreduce.tk",
                       "        if r > 0:\n            announce(flags, t - num_programs(0), gm, gn)\n",
                       "        announce(flags, t, gm, gn)\n")
    err = _error(k, _allreduce_args(2), seed)
    assert "data race on element" in str(err) and "'out'" in str(err), str(err)
    assert err.loc.line in (_line(text, "result = out[me"), _line(text, "atomic_add(out.on(dst)"))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_count_one_short_is_a_race_on_the_last_peers_slot(tmp_path: Path, seed: int) -> None:
    # at 4 ranks a sum that starts after two of its three peers' pushes reads the third's too early
    k, text = _planted(tmp_path, "reducescatter.tk", ">= num_ranks() - 1)", ">= num_ranks() - 2)")
    MS, N = 40, 40
    rng = np.random.default_rng(seed)
    args = [[torch.from_numpy(rng.standard_normal((4 * MS, N)).astype(np.float32)).bfloat16(),
             torch.zeros(MS, N, dtype=torch.bfloat16), torch.zeros(4, MS, N, dtype=torch.bfloat16),
             torch.zeros(2, 2, dtype=torch.int32)] for _ in range(4)]
    with pytest.raises(TkcInterpretError) as info:
        tkc.interpret_ranks(k, args, seed=seed, BM=32, BN=32)
    msg = str(info.value)
    assert "data race on element" in msg and "of 'stage' of rank" in msg, msg
    assert info.value.loc.line in (_line(text, "total += stage"), _line(text, "stage.on(dst)[rank()"))


@pytest.mark.parametrize("seed", SEEDS)
def test_missing_barrier_writes_a_peers_buffer_too_early(tmp_path: Path, seed: int) -> None:
    k, text = _planted(tmp_path, "allgather_gemm.tk", "        barrier_all()\n", "")
    err = _error(k, _allgather_args(2), seed)
    msg = str(err)
    assert "data race on element" in msg and "of 'ag' of rank" in msg, msg
    assert "before the launch" in msg and "barrier_all()" in msg, msg
    assert err.loc.line == _line(text, "ag.on(dst)[me")


@pytest.mark.parametrize("seed", SEEDS)
def test_waits_for_a_flag_nobody_sets_deadlock(tmp_path: Path, seed: int) -> None:
    k, text = _planted(tmp_path, "gemm_allreduce.tk", "wait(flags[0, src, pm, pn] >= 1)",
                       "wait(flags[0, src, pm, pn] >= 2)")
    err = _error(k, _allreduce_args(2), seed)
    msg = str(err)
    assert msg.count("waits at line") >= 2 and "deadlock across ranks" in msg, msg
    assert f"waits at line {_line(text, 'wait(flags[0')} for flags[0, " in msg and ">= 2 (it is 1)" in msg, msg
    assert "rank 0 program" in msg and "rank 1 program" in msg, msg


RING = """
@kernel
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
def test_every_rank_waiting_for_the_previous_one_is_a_deadlock(tmp_path: Path, seed: int) -> None:
    k = _load(tmp_path, RING)
    with pytest.raises(TkcInterpretError) as info:
        tkc.interpret_ranks(k, _ring_args(3), seed=seed)
    msg = str(info.value)
    assert "deadlock across ranks" in msg, msg
    for r in range(3):
        assert f"rank {r} program (0,) waits at line 7 for flags[{(r + 2) % 3}] >= 1 (it is 0)" in msg, msg
    assert info.value.loc.line == 7


def test_a_wait_that_can_never_be_satisfied(tmp_path: Path) -> None:
    k = _load(tmp_path, RING)
    with pytest.raises(TkcInterpretError) as info:
        tkc.interpret_ranks(k, _ring_args(1))
    assert "a wait that can never be satisfied: rank 0 program (0,) waits at line 7 for flags[0] >= 1 (it is 0)" \
        in str(info.value), str(info.value)


# The same ring with rank 0 starting it: each rank adds one to what it got.
STARTED_RING = RING.replace("    wait(flags[prv] >= 1)\n",
                            "    barrier_all()\n    if rank() > 0:\n        wait(flags[prv] >= 1)\n") \
    .replace("    x.on(nxt)[0:16] = x[0:16] + 1.0\n    signal(",
             "    if nxt > 0:\n        x.on(nxt)[0:16] = x[0:16] + 1.0\n        signal(")


def test_a_ring_that_starts_runs(tmp_path: Path) -> None:
    k = _load(tmp_path, STARTED_RING)
    for seed in SEEDS:
        args = _ring_args(4)
        tkc.interpret_ranks(k, args, seed=seed)
        assert [float(a[0][0]) for a in args] == [0.0, 1.0, 2.0, 3.0]


OVERWRITE = """
@kernel
def overwrite(x: f32[N] @ ranks, y: f32[N]):
    grid(1)
    barrier_all()
    y[0:16] = x[0:16]
    x.on((rank() + 1) % num_ranks())[0:16] = zeros([16], f32)
"""


@pytest.mark.parametrize("seed", SEEDS)
def test_overwriting_what_a_peer_still_reads_is_a_race(tmp_path: Path, seed: int) -> None:
    k = _load(tmp_path, OVERWRITE)
    with pytest.raises(TkcInterpretError) as info:
        tkc.interpret_ranks(k, [[np.ones(16, np.float32), np.zeros(16, np.float32)] for _ in range(2)], seed=seed)
    msg = str(info.value)
    assert "data race on element [0] of 'x' of rank" in msg, msg
    assert ("reads it (line 6)" in msg and "stores to it here" in msg) or \
        ("stores to it (line 7)" in msg and "reads it here" in msg), msg


@pytest.mark.parametrize("seed", SEEDS)
def test_two_ranks_storing_to_one_element_race(tmp_path: Path, seed: int) -> None:
    k = _load(tmp_path, """
@kernel
def both(x: f32[N] @ ranks):
    grid(1)
    barrier_all()
    x.on(0)[0:16] = full([16], 1.0, f32) * rank().to(f32)
""")
    with pytest.raises(TkcInterpretError) as info:
        tkc.interpret_ranks(k, [[np.zeros(16, np.float32)] for _ in range(2)], seed=seed)
    msg = str(info.value)
    assert re.search(r"rank (0|1) program \(0,\) stores to it \(line 6\) and rank (1|0) program \(0,\) stores to it "
                     r"here", msg), msg
    assert "of 'x' of rank 0" in msg, msg


def test_atomics_from_every_rank_onto_one_counter_do_not_race(tmp_path: Path) -> None:
    k = _load(tmp_path, """
@kernel
def count(c: i32[N] @ ranks):
    grid(2)
    barrier_all()
    atomic_add(c.on(0)[0], 1)
    barrier_all()
""")
    args = [[np.zeros(4, np.int32)] for _ in range(4)]
    tkc.interpret_ranks(k, args, seed=5)
    assert int(args[0][0][0]) == 8


PAST = """
@kernel
def past(x: f32[N] @ ranks):
    grid(1)
    barrier_all()
    t = x.on(rank() + 1)[0:16]
    x[0:16] = t
"""


def test_a_rank_out_of_range_is_an_error_at_its_line(tmp_path: Path) -> None:
    k = _load(tmp_path, PAST)
    with pytest.raises(TkcInterpretError) as info:
        tkc.interpret_ranks(k, [[np.zeros(16, np.float32)] for _ in range(2)])
    assert "rank 2 is out of range: the launch has 2 ranks (0..1)" in str(info.value)
    assert info.value.loc.line == 6 and "(in rank 1, program (0,))" in str(info.value)


# rank() itself under the if would not compile (barrier_all() under control flow that differs
# across ranks); a scalar argument is taken to be the same on every rank, and is not here.
SKIP = """
@kernel
def skip(x: f32[N] @ ranks, skipper: i32):
    grid(1)
    if skipper != 1:
        barrier_all()
    x[0:16] = zeros([16], f32)
"""


def test_a_rank_that_skips_a_barrier_leaves_the_others_waiting(tmp_path: Path) -> None:
    k = _load(tmp_path, SKIP)
    for seed in SEEDS:
        with pytest.raises(TkcInterpretError) as info:
            tkc.interpret_ranks(k, [[np.zeros(16, np.float32), r] for r in range(3)], seed=seed)
        msg = str(info.value)
        assert re.search(r"ranks meet barrier_all\(\) a different number of times: rank (0|2) program \(0,\) waits "
                         r"at its barrier 1 \(line 6\), but rank 1 program \(0,\) has finished after meeting none; "
                         r"every rank must meet every barrier_all\(\) equally often", msg), msg
        assert info.value.loc.line == 6


def test_a_rank_that_meets_more_barriers_names_the_lines(tmp_path: Path) -> None:
    """Rank 1 goes round the loop once more: ranks 0 and 2 finish after two barriers."""
    k = _load(tmp_path, """
@kernel
def extra(x: f32[N] @ ranks, rounds: i32):
    grid(2)
    barrier_all()
    for j in range(rounds):
        barrier_all()
    i = program_id(0)
    x[i*16:(i+1)*16] = zeros([16], f32)
""")
    for seed in SEEDS:
        with pytest.raises(TkcInterpretError) as info:
            tkc.interpret_ranks(k, [[np.zeros(32, np.float32), 2 if r == 1 else 1] for r in range(3)], seed=seed)
        msg = str(info.value)
        assert re.search(r"rank 1 program \((0|1),\) waits at its barrier 3 \(line 7\), but rank 0 program \(\1,\) "
                         r"has finished after meeting 2 \(lines 5, 7\), rank 2 program \(\1,\) has finished after "
                         r"meeting 2 \(lines 5, 7\);", msg), msg


def test_the_seed_changes_the_interleaving(tmp_path: Path) -> None:
    """Which rank's exchange lands last on rank 0 depends on the order: seeds explore orders."""
    k = _load(tmp_path, """
@kernel
def last(x: i32[N] @ ranks):
    grid(1)
    barrier_all()
    atomic_exch(x.on(0)[0], rank())
    barrier_all()
""")
    seen = set()
    for seed in range(12):
        args = [[np.full(4, -1, np.int32)] for _ in range(4)]
        tkc.interpret_ranks(k, args, seed=seed)
        seen.add(int(args[0][0][0]))
    assert len(seen) > 1


@pytest.mark.parametrize("seed", SEEDS)
def test_a_write_into_a_peer_that_nobody_waits_for(tmp_path: Path, seed: int) -> None:
    """The all-reduce without its last waits: a rank's kernel may end before its peers' sums land."""
    k, text = _planted(tmp_path, "gemm_allreduce.tk", "        wait(flags[1, src, pm, pn] >= 1)\n", "        pass\n")
    err = _error(k, _allreduce_args(2), seed)
    assert "and no program of rank" in str(err) and "before it lands" in str(err), str(err)
    assert err.loc.line in (_line(text, "out.on((me + s) % num_ranks())[me"), _line(text, "signal(flags.on((me + s)"))


def test_tensors_on_every_rank_have_one_shape(tmp_path: Path) -> None:
    k = _load(tmp_path, RING)
    with pytest.raises(TkcLaunchError, match=r"'x' is a tensor on every rank \(@ ranks\): every rank passes the "
                                             r"same shape, got rank 0: \[16\], rank 1: \[32\]"):
        tkc.interpret_ranks(k, [[np.zeros(16, np.float32), np.zeros(2, np.int32)],
                                [np.zeros(32, np.float32), np.zeros(2, np.int32)]])


def test_tile_ir_of_a_multi_gpu_kernel() -> None:
    ir = tkc.compile_kernel(EXAMPLES / "allgather_gemm.tk", stop="tkir", cache=False).asm["tkir"]
    assert "tensor<bf16[P, M, K] @ranks>" in ir and "tile.peer" in ir and "tile.rank_barrier" in ir


def test_ranks_do_not_share_an_array(tmp_path: Path) -> None:
    k = _load(tmp_path, OVERWRITE)
    y = np.zeros(16, np.float32)
    with pytest.raises(TkcLaunchError, match="'y' of rank 1 shares memory with 'y' of rank 0"):
        tkc.interpret_ranks(k, [[np.ones(16, np.float32), y], [np.ones(16, np.float32), y]])


def test_every_unordered_atomic_writer_of_an_element_is_kept() -> None:
    """Two ranks add into one element; the reader added last itself: the peer's earlier add is
    still unordered with the read (the log keeps it beside the reader's own), and a flag the
    peer signals after its add orders it."""
    from tkc.races import HappensBefore

    def run(signalled: bool) -> str | None:
        hb = HappensBefore(["rank 0 program (0,)", "rank 1 program (0,)"], [0, 1])
        x, flag = np.zeros(4, np.float32), np.zeros(1, np.int32)
        hb.add_tensor(x, "x", 0)
        hb.add_tensor(flag, "flag", 0)
        hb.barrier([0, 1])
        assert hb.access(x, (2,), 1, None, "atomic") is None  # the peer's partial
        if signalled:
            hb.release(flag, (0,), 1)
            hb.acquire(flag, (0,), 0)
        assert hb.access(x, (2,), 0, None, "atomic") is None  # this rank's own, last
        return hb.access(x, (2,), 0, None, "read")

    msg = run(signalled=False)
    assert msg is not None and "rank 1 program (0,) updates it atomically" in msg, msg
    assert "rank 0 program (0,) reads it here" in msg, msg
    assert run(signalled=True) is None
