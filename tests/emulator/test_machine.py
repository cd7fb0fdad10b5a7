"""The hopper-level machine (``tkc/emulator/machine.py``): hand-written hopper kernels against
numpy, broken protocols caught with errors that name the op, barrier and CTA, and (once the
passes exist) ``interpret(tile IR) == emulate(hopper IR)`` for the examples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tkc.dtypes import bf16, round_to
from tkc.emulator.machine import emulate, emulate_module
from tkc.emulator.mbarrier import PhaseError
from tkc.emulator.scheduler import DeadlockError
from tkc.emulator.smem import RaceError
from tkc.errors import TkcEmulatorError
from tkc.ir.core import Module
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify

DATA = Path(__file__).resolve().parents[1] / "data" / "hopper"
KERNELS = Path(__file__).resolve().parent / "kernels"
GEMM = (DATA / "gemm.tkir").read_text()


def load(text: str, name: str = "kernel.tkir") -> Module:
    module = parse_module(text, name)
    verify(module)
    return module


def edit(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced once; fails loudly if the fixture changed under the test."""
    assert text.count(old) == 1, f"{old!r} is not in the kernel exactly once"
    return text.replace(old, new)


def gemm_args(m: int, n: int, k: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    a = round_to(rng.standard_normal((m, k)), bf16)
    b = round_to(rng.standard_normal((k, n)), bf16)
    return [a, b, np.full((m, n), np.nan, np.float32)]  # NaN: an unwritten element fails


def gemm_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """fp32 accumulation as wgmma does it: each k16 instruction adds its exact (float64) dot
    products to the f32 accumulator with one rounding; the output is rounded to bf16."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(0, a.shape[1], 16):
        acc = (acc + a[:, k:k + 16].astype(np.float64) @ b[k:k + 16].astype(np.float64)).astype(np.float32)
    return round_to(acc, bf16)


# ------------------------------------------------------------------ gemm.tkir
@pytest.mark.parametrize("m, n, k, seed", [
    (128, 128, 64, 0),    # one tile, one K step
    (200, 136, 96, 1),    # tails in M, N and K (K = 64 + 32, zero-filled by TMA)
    (256, 256, 192, 2),   # 2 x 2 CTAs, three loop rounds: the phase flips and flips back
    (72, 8, 8, 3),        # far smaller than the tile
])
def test_gemm_matches_numpy(m, n, k, seed):
    a, b, c = gemm_args(m, n, k, seed)
    emulate(load(GEMM, "gemm.tkir"), [a, b, c], seed=seed)
    np.testing.assert_array_equal(c, gemm_ref(a, b))


@pytest.mark.parametrize("seed", range(4))
def test_gemm_every_interleaving_seed(seed):
    a, b, c = gemm_args(136, 72, 136, 10 + seed)
    emulate(load(GEMM, "gemm.tkir"), [a, b, c], seed=seed)
    np.testing.assert_array_equal(c, gemm_ref(a, b))


def test_gemm_torch_tensors_written_back():
    torch = pytest.importorskip("torch")
    a, b, _ = gemm_args(100, 64, 64, 5)
    ta = torch.tensor(a).to(torch.bfloat16)
    tb = torch.tensor(b).to(torch.bfloat16)
    tc = torch.full((100, 64), float("nan"), dtype=torch.bfloat16)
    emulate(load(GEMM, "gemm.tkir"), [ta, tb, tc])
    np.testing.assert_array_equal(tc.float().numpy(), gemm_ref(a, b))


def test_emulate_module_random_args():
    a, b, c = emulate_module(load(GEMM, "gemm.tkir"), dims={"M": 130, "N": 24, "K": 40}, seed=7)
    np.testing.assert_array_equal(c, gemm_ref(a, b))


def test_explicit_grid_runs_only_those_ctas():
    a, b, c = gemm_args(256, 128, 64, 8)
    emulate(load(GEMM, "gemm.tkir"), [a, b, c], grid=(1, 1))
    np.testing.assert_array_equal(c[:128], gemm_ref(a, b)[:128])
    assert np.isnan(c[128:]).all()


# ------------------------------------------------------------ broken protocols
def run_broken(text: str, seed: int = 0, mnk: tuple[int, int, int] = (200, 136, 256)) -> np.ndarray:
    a, b, c = gemm_args(*mnk, seed)
    emulate(load(text, "gemm.tkir"), [a, b, c], seed=seed)
    return c


def test_missing_expect_tx_deadlocks_naming_the_barrier():
    text = edit(GEMM, "    hopper.expect_tx %bar {bytes = 32768}\n", "")
    with pytest.raises(DeadlockError) as e:
        run_broken(text)
    msg = str(e.value)
    assert "CTA (0, 0)" in msg and "mbarrier '%bar'" in msg and "'hopper.mbarrier_wait' at gemm.tkir:" in msg
    assert "tx-count -32768" in msg  # the copies landed, but no arrival came


def test_expect_tx_too_small_is_tx_underflow():
    text = edit(GEMM, "{bytes = 32768}", "{bytes = 16384}")
    with pytest.raises(TkcEmulatorError, match=r"CTA \(0, 0\).*hopper\.tma_load.*tx underflow.*'%bar'"):
        run_broken(text)


def test_parity_never_flipped_deadlocks():
    text = edit(GEMM, "%phase_2 = tile.xor %phase, %c1", "%phase_2 = tile.xor %phase, %c0")
    with pytest.raises(DeadlockError, match=r"waits for parity 0 of mbarrier '%bar' in phase 2"):
        run_broken(text)


def test_wrong_initial_parity_passes_early_and_is_caught():
    # Parity 1 names the phase before init, which counts as complete: the wait passes at once
    # and the wgmma reads a tile whose copy has not been issued (or an older phase's data).
    text = edit(GEMM, "%acc, %c0 :", "%acc, %c1 :")
    for seed in range(4):
        with pytest.raises((PhaseError, TkcEmulatorError), match=r"hopper\.(wgmma|mbarrier_wait)"):
            run_broken(text, seed)


@pytest.mark.parametrize("seed", range(4))
def test_missing_loop_barrier_is_a_race(seed):
    # Without the bar.sync, warpgroup 0 issues the next copy while warpgroup 1 still reads (or
    # has not yet read) the tiles: a race with its in-flight wgmma or lost data.
    text = edit(GEMM, "    %kk = tile.mul %k, %c64 : i32\n    hopper.barrier {id = 0}\n",
                "    %kk = tile.mul %k, %c64 : i32\n")
    with pytest.raises((RaceError, PhaseError)) as e:
        run_broken(text, seed)
    assert "CTA (0, 0)" in str(e.value) and "hopper.tma_load" in str(e.value)


def test_reading_wgmma_result_before_wait():
    text = edit(GEMM, "    %acc_3 = hopper.wgmma_wait",
                "    %early = tile.cast %d : tile<128x128xbf16, reg, #wgmma_acc<128, wg=2>>\n"
                "    %acc_3 = hopper.wgmma_wait")
    with pytest.raises(TkcEmulatorError, match=r"'tile.cast' \(%early\) at gemm.tkir:\d+:\d+: reads "
                                               r"'hopper.wgmma' \(%d\)") as e:
        run_broken(text)
    assert e.value.loc is not None and e.value.loc.line == 38  # the cast


def test_wgmma_never_waited():
    text = edit(GEMM, "%acc_3 = hopper.wgmma_wait %d {pending = 0}", "%acc_3 = hopper.wgmma_wait %d {pending = 1}")
    with pytest.raises(TkcEmulatorError, match=r"pending = 1.*leaves 'hopper.wgmma' \(%d\) at gemm.tkir:\d+:\d+ "
                                               r"in flight"):
        run_broken(text)


def test_tensor_map_must_match_the_destination():
    text = edit(GEMM, "[1, [64, 64], 128]", "[1, [64, 64], 64]")
    with pytest.raises(TkcEmulatorError, match=r"hopper.tma_load.*tensor map 1 has box \[64, 64\] and swizzle 64"):
        run_broken(text)


def test_tensor_strides_must_suit_a_tensor_map():
    with pytest.raises(TkcEmulatorError, match=r"hopper.tma_load.*byte strides \[200\]"):
        run_broken(GEMM, mnk=(64, 64, 100))
