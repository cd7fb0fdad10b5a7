"""Clusters in the hopper-level machine: the persistent GEMM compiled with ``cluster = 2``
(``persistent`` pairs the programs, ``multicast`` shares the B copies) runs with its two CTAs
interleaved, each multicast copy landing in both, against numpy; and each broken piece of the
cluster protocol is caught.  The broken protocols are textual edits of the compiled kernel;
where the outcome depends on the interleaving, the seeds show it (the scheduler is seeded)."""

from __future__ import annotations

import pathlib
from pathlib import Path

import numpy as np
import pytest
from test_machine import edit, gemm_args, gemm_ref, load

from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.emulator.mbarrier import MBarrierError
from tkc.emulator.scheduler import DeadlockError
from tkc.emulator.smem import RaceError
from tkc.errors import TkcEmulatorError

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
SMALL = {"BN": 128, "cluster": 2}  # two B boxes a stage: rank 0 copies one, rank 1 the other


def hopper(consts: dict) -> str:
    return compile_kernel(EXAMPLES / "gemm.tk", consts, stop="hopper", cache=False).asm["hopper"]


@pytest.fixture(scope="module")
def small() -> str:
    return hopper(SMALL)


def run(text: str, mnk: tuple[int, int, int], seed: int = 0, grid=None) -> tuple[np.ndarray, np.ndarray]:
    a, b, c = gemm_args(*mnk, seed)
    emulate(load(text, "gemm.hopper.tkir"), [a, b, c], grid=grid, seed=seed)
    return c, gemm_ref(a, b)


# ------------------------------------------------------------------ correct kernels
@pytest.mark.parametrize("consts", [SMALL, {"cluster": 2}, {"BM": 256, "BN": 128, "consumers": 2, "cluster": 2}],
                         ids=["BN128", "BN256", "BM256-consumers2"])
@pytest.mark.parametrize("m, n, k, seed", [
    (256, 128, 64, 0),    # one cluster tile, one K step
    (300, 200, 136, 1),   # three tile rows: the cluster's second row repeats the last; K and N tails
    (640, 264, 520, 2),   # several cluster tiles per cluster, stages refilled, parities flip
])
def test_cluster_gemm_matches_numpy(consts, m, n, k, seed):
    c, want = run(hopper(consts), (m, n, k), seed)
    np.testing.assert_array_equal(c, want)


def test_four_ctas_a_cluster():
    """Rank r of four copies box r of each B stage (BN = 256: four boxes); 600 rows are five
    tile rows, the second cluster's last three repeat the fifth."""
    c, want = run(hopper({"cluster": 4}), (600, 320, 200), 5)
    np.testing.assert_array_equal(c, want)


@pytest.mark.parametrize("seed", range(3))
def test_every_interleaving_seed_with_fewer_clusters_than_tiles(small, seed):
    c, want = run(small, (512, 384, 200), seed, grid=(4,))  # 2 clusters walk 6 cluster tiles
    np.testing.assert_array_equal(c, want)


def test_the_pass_multicasts_b_and_not_a(small):
    loads = [line for line in small.splitlines() if "hopper.tma_load" in line]
    assert loads and all(("multicast = 2" in line) == ("%b," in line) for line in loads)
    assert "cluster = 2, smem_bytes" in small
    assert small.count("hopper.cluster_barrier") == 2
    assert "{count = 4}" in small  # the empty ring: two consumers in each of two CTAs


# ------------------------------------------------------------ broken protocols
def errors(text: str, mnk: tuple[int, int, int], kinds=TkcEmulatorError) -> list[str]:
    """The errors of ``kinds`` that eight interleavings of a broken kernel run into."""
    caught = []
    for seed in range(8):
        try:
            run(text, mnk, seed)
        except kinds as e:
            caught.append(str(e))
    return caught


def test_grid_not_whole_clusters(small):
    with pytest.raises(TkcEmulatorError, match="multiple of 2"):
        run(small, (256, 128, 64), grid=(3,))


def test_releases_that_stay_in_their_cta_deadlock(small):
    broken = small.replace(" {cluster = true}", "")
    with pytest.raises(DeadlockError, match="empty"):
        run(broken, (256, 128, 512))  # 8 K steps through 4 stages: the refills wait


def test_empty_ring_counting_one_cta_runs_over_a_stage_in_use(small):
    """Releases stay in their CTA and the ring counts one CTA's: a producer refills a stage
    of its peer while the peer's wgmma still reads it."""
    broken = edit(small.replace(" {cluster = true}", ""), "{count = 4}", "{count = 2}")
    caught = errors(broken, (256, 128, 512), (RaceError, MBarrierError))
    assert caught, "no seed caught a producer refilling a stage its peer still reads"
    assert any("race on '%b_smem" in m for m in caught), caught


def test_no_cluster_barrier_after_init_reaches_an_uninitialized_barrier(small):
    first = small.index("hopper.cluster_barrier")
    broken = small[:first] + "hopper.barrier {id = 0}" + small[first + len("hopper.cluster_barrier"):]
    assert any("before mbarrier.init" in m for m in errors(broken, (256, 128, 256)))


def test_exiting_before_the_peer_is_done(small):
    last = small.rindex("hopper.cluster_barrier")
    start = small.rindex("\n", 0, last)
    broken = small[:start] + small[small.index("\n", last):]
    assert any("has exited" in m for m in errors(broken, (256, 128, 256)))


def test_copies_that_differ_across_the_cluster_are_refused(small):
    """A multicast copy at a coordinate that depends on the CTA's rank (A's rows) would give
    each CTA a tile put together from two places."""
    broken = small.replace("{map = 0, box = [128, 64]}", "{map = 0, box = [128, 64], multicast = 2}")
    with pytest.raises(TkcEmulatorError, match="the same in every CTA"):
        run(broken, (256, 128, 64))


# ------------------------------------------------- cluster reductions: split-K
SPLIT_K = (Path(__file__).resolve().parents[1] / "data" / "splitk.tk").read_text()


@pytest.mark.parametrize("m, n, k", [(128, 128, 520), (64, 192, 64), (200, 136, 304)])
def test_split_k_sums_the_two_halves_of_k_across_the_cluster(m, n, k):
    """A GEMM-shaped kernel whose two programs of a cluster take alternate K blocks: it stays
    as written (persistent would pair other programs, warp specialization would leave the
    producer out of the cluster barrier) and its ring still pipelines each half."""
    text = compile_kernel(SPLIT_K, {}, stop="hopper", cache=False, file="splitk.tk").asm["hopper"]
    assert "tile.num_sms" not in text and "hopper.role" not in text and "stages = " in text
    a, b, c = gemm_args(m, n, k, 9)
    emulate(load(text, "splitk.hopper.tkir"), [a, b, c])
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-4)


def test_split_k_refuses_a_pinned_tile_walk():
    from tkc.errors import TkcUnsupportedError

    with pytest.raises(TkcUnsupportedError, match="cluster reductions combine the programs"):
        compile_kernel(SPLIT_K, {"persistent": True}, stop="hopper", cache=False, file="splitk.tk")


LOOP_REDUCE = (Path(__file__).resolve().parents[1] / "data" / "loopred.tk").read_text()


@pytest.mark.parametrize("seed", range(4))
def test_cluster_reductions_in_a_loop_match_the_interpreter(seed):
    """Consecutive iterations' reductions alternate between two buffers and barriers: a fast
    CTA's next values land in the other buffer, never on slots a peer has not read yet (one
    reduction a loop, so no other reduction's barrier stands in)."""
    _emulates_like_the_interpreter(LOOP_REDUCE, {}, "loopred.tk", seed)


def _emulates_like_the_interpreter(source: str, consts: dict, file: str, seed: int) -> None:
    """The kernel after HOPPER_PIPELINE, emulated over 8 rows with interleaving ``seed``, writes
    exactly what the interpreter computes from its tile IR."""
    from tkc.interpreter import random_args, run_kernel

    text = compile_kernel(source, consts, stop="hopper", cache=False, file=file).asm["hopper"]
    tile_kernel = compile_kernel(source, consts, stop="tkir", cache=False, file=file).kernel_op
    kernel = load(text, file.replace(".tk", ".hopper.tkir")).kernel()
    x, y = random_args(kernel, {"M": 8}, seed)
    want = np.full_like(y, np.nan)
    run_kernel(tile_kernel, [x, want])
    emulate(kernel, [x, y], seed=seed)
    np.testing.assert_array_equal(y, want)


def test_a_loop_reduction_that_keeps_one_buffer_is_a_phase_error():
    """With the phase pinned to 0, every iteration's exchange waits for parity 0 of the same
    barrier: the second wait finds the barrier a phase on (the GPU would pass on the first
    exchange's completion and read slots the peers are rewriting)."""
    from tkc.emulator.mbarrier import PhaseError
    from tkc.interpreter import random_args

    text = compile_kernel(LOOP_REDUCE, {}, stop="hopper", cache=False, file="loopred.tk").asm["hopper"]
    broken = text.replace("%phase_1 {kind", "%0 {kind")
    assert broken != text
    kernel = load(broken, "loopred.hopper.tkir").kernel()
    x, y = random_args(kernel, {"M": 8}, 0)
    with pytest.raises(PhaseError, match="wrong phase"):
        emulate(kernel, [x, y], seed=0)


NESTED_REDUCE = (Path(__file__).resolve().parents[1] / "data" / "nestedred.tk").read_text()


@pytest.mark.parametrize("consts", [{}, {"cluster": 4, "outer": 2, "inner": 5}, {"warps": 8}], ids=str)
@pytest.mark.parametrize("seed", range(3))
def test_cluster_reductions_in_nested_loops_and_branches_match_the_interpreter(consts, seed):
    """Three reductions, two under the arms of a branch in an inner loop and one in the outer
    loop: each one's exchange count is threaded through both loops and both arms."""
    _emulates_like_the_interpreter(NESTED_REDUCE, consts, "nestedred.tk", seed)
