"""The hopper-level machine (``tkc/emulator/machine.py``): hand-written hopper kernels against
numpy, broken protocols caught with errors that name the op, barrier and CTA, and
``interpret(tile IR) == emulate(hopper IR)`` for the examples, serial, pipelined into rings
(``pipeline-loops``), warp-specialized (``specialize-warps``) and persistent.  Rings and roles written
by hand are in test_machine_rings.py."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tkc.compiler import compile_kernel
from tkc.dtypes import bf16, round_to
from tkc.emulator.machine import emulate, emulate_module
from tkc.emulator.mbarrier import PhaseError
from tkc.emulator.scheduler import DeadlockError
from tkc.emulator.smem import RaceError
from tkc.errors import TkcEmulatorError, TkcVerifyError
from tkc.ir.core import Module
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify

DATA = Path(__file__).resolve().parents[1] / "data" / "hopper"
KERNELS = Path(__file__).resolve().parent / "kernels"
GEMM = (DATA / "gemm.tkir").read_text()


def load(text: str, name: str = "kernel.tkir", verified: bool = True) -> Module:
    """``text`` parsed and, unless ``verified`` is False, verified (the emulator's own checks of
    what the verifier also refuses run on unverified IR)."""
    module = parse_module(text, name)
    if verified:
        verify(module)
    return module


def refused_statically(text: str, name: str) -> None:
    """The verifier refuses ``text`` before anything runs (tests/ir/test_hopper_verifier.py has
    its messages); the emulator still checks the same when it runs unverified IR."""
    with pytest.raises(TkcVerifyError):
        load(text, name)


def edit(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced once; fails loudly if the fixture changed under the test."""
    assert text.count(old) == 1, f"{old!r} is not in the kernel exactly once"
    return text.replace(old, new)


def gemm_args(m: int, n: int, k: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    a = round_to(rng.standard_normal((m, k)), bf16)
    b = round_to(rng.standard_normal((k, n)), bf16)
    return [a, b, np.full((m, n), np.nan, np.float32)]  # NaN: an unwritten element fails


def wgmma_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """fp32 accumulation as wgmma does it: each k16 instruction adds its exact (float64) dot
    products to the f32 accumulator with one rounding."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(0, a.shape[1], 16):
        acc = (acc + a[:, k:k + 16].astype(np.float64) @ b[k:k + 16].astype(np.float64)).astype(np.float32)
    return acc


def gemm_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return round_to(wgmma_sum(a, b), bf16)


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
def run_broken(text: str, seed: int = 0, mnk: tuple[int, int, int] = (200, 136, 256),
               verified: bool = True) -> np.ndarray:
    a, b, c = gemm_args(*mnk, seed)
    emulate(load(text, "gemm.tkir", verified), [a, b, c], seed=seed)
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
    # the copy over tiles warpgroup 1 has not waited for (lost data, a race with its read), or
    # warpgroup 1's wait two phases behind (a copy over tiles every waiter saw is no loss)
    said = str(e.value)
    assert "CTA (0, 0)" in said and ("hopper.tma_load" in said or "wrong phase: 'warpgroup 1'" in said), said


def test_reading_wgmma_result_before_wait():
    text = edit(GEMM, "    %acc_3 = hopper.wgmma_wait",
                "    %early = tile.cast %d : tile<128x128xbf16, reg, #wgmma_acc<128, wg=2>>\n"
                "    %acc_3 = hopper.wgmma_wait")
    refused_statically(text, "gemm.tkir")
    with pytest.raises(TkcEmulatorError, match=r"'tile.cast' \(%early\) at gemm.tkir:\d+:\d+: reads "
                                               r"'hopper.wgmma' \(%d\)") as e:
        run_broken(text, verified=False)
    assert e.value.loc is not None and e.value.loc.line == 38  # the cast


def test_wgmma_never_waited():
    text = edit(GEMM, "%acc_3 = hopper.wgmma_wait %d {pending = 0}", "%acc_3 = hopper.wgmma_wait %d {pending = 1}")
    with pytest.raises(TkcEmulatorError, match=r"pending = 1.*leaves 'hopper.wgmma' \(%d\) at gemm.tkir:\d+:\d+ "
                                               r"in flight"):
        run_broken(text)


def test_tensor_map_must_match_the_destination():
    text = edit(GEMM, "[1, [64, 64], 128]", "[1, [64, 64], 64]")
    refused_statically(text, "gemm.tkir")
    with pytest.raises(TkcEmulatorError, match=r"hopper.tma_load.*tensor map 1 has box \[64, 64\] and swizzle 64"):
        run_broken(text, verified=False)


def test_tensor_strides_must_suit_a_tensor_map():
    with pytest.raises(TkcEmulatorError, match=r"hopper.tma_load.*byte strides \[200\].*pad its last axis, or "
                                             r"compile with the pin tma=False \(-D tma=false\)"):
        run_broken(GEMM, mnk=(64, 64, 100))


def test_allocation_outside_smem_bytes():
    text = edit(GEMM, "smem_bytes = 32776", "smem_bytes = 32768")
    refused_statically(text, "gemm.tkir")
    with pytest.raises(TkcEmulatorError, match=r"CTA \(0, 0\): 'hopper.mbarrier_alloc' \(%bar\) at gemm.tkir:\d+:\d+: "
                                               r"\[0x8000, 0x8008\) is outside the kernel's smem_bytes"):
        run_broken(text, verified=False)


def test_layout_must_span_the_kernel_threads():
    text = edit(GEMM, "threads = 256", "threads = 384")
    refused_statically(text, "gemm.tkir")
    with pytest.raises(TkcEmulatorError, match=r"'tile.constant' \(%acc\).*#wgmma_acc<128, wg=2> spans 256 threads, "
                                               r"the kernel has 384"):
        run_broken(text, verified=False)


# ------------------------------------------------------------ hand-written kernels
def kernel(name: str) -> Module:
    return load((KERNELS / name).read_text(), name)


def nan_like(shape: tuple[int, ...]) -> np.ndarray:
    return np.full(shape, np.nan, np.float32)


def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("seed", range(2))
def test_load_store_tails_and_other(seed):
    rng = np.random.default_rng(seed)
    m, n, p, q = 50, 70, 70, 100  # y and z are larger than x: their extra elements read `other`
    x, w = normal(rng, m, n), normal(rng, n)
    y, z = nan_like((p, q)), nan_like((q,))
    emulate(kernel("load_store.tkir"), [x, w, y, z], seed=seed)
    want_y = np.full((p, q), -1.5, np.float32)
    want_y[:m, :n] = x
    want_z = np.full(q, 2.0, np.float32)
    want_z[:n] = x[0] + w
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(z, want_z)


@pytest.mark.parametrize("seed", range(3))
def test_row_reductions_across_warps_and_warpgroups(seed):
    rng = np.random.default_rng(seed)
    m, n = 40, 200  # the last CTA's rows and every CTA's columns hang over the edge
    x = normal(rng, m, n)
    s, mx, y = nan_like((m,)), nan_like((m,)), nan_like((m, n))
    emulate(kernel("reduce_blocked.tkir"), [x, s, mx, y], seed=seed)
    np.testing.assert_allclose(s, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)  # f32 adds, tree order
    np.testing.assert_array_equal(mx, x.max(1))
    np.testing.assert_array_equal(y, x - x.max(1)[:, None])


@pytest.mark.parametrize("seed", range(3))
def test_reductions_across_a_grid_of_warps_combine_each_warps_group(seed):
    rng = np.random.default_rng(seed)
    m, n = 60, 50  # rows and columns past the tensor's edge: 0 for the sums, -inf for the maxima
    x = normal(rng, m, n)
    cs, rm = nan_like((n,)), nan_like((m,))
    emulate(kernel("reduce_grid.tkir"), [x, cs, rm], seed=seed)
    np.testing.assert_allclose(cs, x.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(rm, x.max(1))


@pytest.mark.parametrize("seed", range(3))
def test_a_group_of_reductions_crosses_warps_in_one_round_trip(seed):
    rng = np.random.default_rng(seed)
    m, n = 60, 50
    x = normal(rng, m, n)
    cs, rm, rs = nan_like((n,)), nan_like((m,)), nan_like((m,))
    emulate(kernel("reduce_group.tkir"), [x, cs, rm, rs], seed=seed)
    np.testing.assert_allclose(cs, x.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(rm, x.max(1))
    np.testing.assert_allclose(rs, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


def test_a_group_whose_parts_share_a_scratch_tile_is_refused():
    text = (KERNELS / "reduce_group.tkir").read_text().replace("%s0, %s1, %s2 {", "%s0, %s1, %s1 {")
    with pytest.raises(TkcVerifyError, match="scratch tile of its own"):
        verify(parse_module(text))


@pytest.mark.parametrize("seed", range(3))
def test_accumulator_reductions_rows_columns_scalar(seed):
    rng = np.random.default_rng(seed)
    m, n = 100, 48
    x = normal(rng, m, n)
    rsum, cmax, tot, y = nan_like((m,)), nan_like((n,)), nan_like((1,)), nan_like((m, n))
    emulate(kernel("reduce_acc.tkir"), [x, rsum, cmax, tot, y], seed=seed)
    np.testing.assert_allclose(rsum, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cmax, x.max(0))
    np.testing.assert_allclose(tot, [x.astype(np.float64).sum()], rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(y, x - x.max(0)[None, :])


def test_reduction_max_propagates_nan():
    x = np.zeros((100, 48), np.float32)
    x[7, 5] = np.nan
    rsum, cmax, tot, y = nan_like((100,)), np.zeros(48, np.float32), np.zeros(1, np.float32), nan_like((100, 48))
    emulate(kernel("reduce_acc.tkir"), [x, rsum, cmax, tot, y])
    assert np.isnan(cmax[5]) and not np.isnan(np.delete(cmax, 5)).any()
    assert np.isnan(rsum[7]) and np.isnan(tot[0])


def pv_args(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    m, k, n = 100, 50, 40
    return [normal(rng, m, k), round_to(rng.standard_normal((k, n)), bf16), nan_like((m, n))]


@pytest.mark.parametrize("seed", range(3))
def test_register_a_operand(seed):
    p, v, o = pv_args(seed)
    emulate(kernel("pv.tkir"), [p, v, o], seed=seed)
    np.testing.assert_array_equal(o, wgmma_sum(round_to(p, bf16), v))


def test_smem_store_without_fence_is_caught():
    text = edit((KERNELS / "pv.tkir").read_text(), "  hopper.fence_proxy_async\n", "")
    with pytest.raises(TkcEmulatorError, match=r"'hopper.wgmma' \(%d\).*async proxy.*'%sv'.*hopper.smem_store"):
        emulate(load(text, "pv.tkir"), pv_args(0))


def test_smem_store_without_barrier_is_caught():
    # Each warpgroup writes half of V; without the bar.sync one of them may read the other
    # half before it is written.
    text = edit((KERNELS / "pv.tkir").read_text(), "  hopper.barrier {id = 0}\n", "")
    errors = []
    for seed in range(6):
        try:
            emulate(load(text, "pv.tkir"), pv_args(0), seed=seed)
        except TkcEmulatorError as e:
            errors.append(str(e))
    assert errors and all("'%sv'" in e and "nothing has written" in e for e in errors)


@pytest.mark.parametrize("seed", range(3))
def test_convert_layout_through_scratch(seed):
    rng = np.random.default_rng(seed)
    x = normal(rng, 100, 60)
    y, z = nan_like((100, 60)), nan_like((100, 60))
    emulate(kernel("convert.tkir"), [x, y, z], seed=seed)
    np.testing.assert_array_equal(z, x)
    np.testing.assert_array_equal(y, x)


def test_convert_layout_without_scratch_must_not_move_values():
    text = edit((KERNELS / "convert.tkir").read_text(), "%xa = hopper.convert_layout %xb, %scratch",
                "%xa = hopper.convert_layout %xb")
    x = np.zeros((100, 60), np.float32)
    refused_statically(text, "convert.tkir")
    with pytest.raises(TkcEmulatorError, match=r"'hopper.convert_layout' \(%xa\) at convert.tkir:\d+:\d+: "
                                               r"#blocked<128x64.*-> #wgmma_acc<64, wg=2> without a scratch"):
        emulate(load(text, "convert.tkir", verified=False), [x, x.copy(), x.copy()])


# A wgmma reads an A operand in registers until a wait covers it, and the next run of the op
# that computes A (the K loop's next iteration) writes the same registers.
GATHER_GEMM = """\
# y = x[idx] @ w: the rows of x that idx names, multiplied as they are gathered (A in registers).
@kernel
def gather_gemm(x: bf16[T, D], idx: i32[M], w: bf16[D, F], y: f32[M, F], BM: const = 64, BF: const = 64,
                BK: const = 64):
    grid(cdiv(M, BM), cdiv(F, BF))
    pm = program_id(0)
    pf = program_id(1)
    rows = idx[pm*BM:(pm+1)*BM]
    acc = zeros([BM, BF], f32)
    for k in range(cdiv(D, BK)):
        acc += x[rows, k*BK:(k+1)*BK] @ w[k*BK:(k+1)*BK, pf*BF:(pf+1)*BF]
    y[pm*BM:(pm+1)*BM, pf*BF:(pf+1)*BF] = acc
"""
PRODUCT_LINE = 11  # GATHER_GEMM's `acc += ... @ ...`


def gather_gemm_args(seed: int, t: int = 90, m: int = 100, d: int = 150, f: int = 72) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    x = round_to(rng.standard_normal((t, d)), bf16)
    w = round_to(rng.standard_normal((d, f)), bf16)
    return [x, rng.integers(0, t, m).astype(np.int32), w, nan_like((m, f))]


@pytest.mark.parametrize("seed", range(2))
def test_gathered_a_operand_waited_each_iteration(seed):
    """The K loop as the compiler lowers it (its wgmma waited for before the next A) runs and
    multiplies the gathered rows; tails in every dimension, three K tiles."""
    kernel = compile_kernel(GATHER_GEMM, stop="hopper", cache=False).kernel_op
    x, idx, w, y = gather_gemm_args(seed)
    emulate(kernel, [x, idx, w, y], seed=seed)
    np.testing.assert_array_equal(y, wgmma_sum(x[idx], w))


@pytest.mark.parametrize("seed", range(2))
def test_a_operand_written_while_its_wgmma_is_in_flight(seed):
    """The same loop with the wgmma left in flight across iterations (wgmma_wait_group 1): the
    next iteration's A is written into the registers the previous wgmma still reads."""
    with pytest.raises(TkcEmulatorError, match=rf"'hopper.convert_layout' \(%\w+\) at gather_gemm.tk:"
                                               rf"{PRODUCT_LINE}:\d+: writes the registers of the A operand that "
                                               rf"the product at line {PRODUCT_LINE} still reads \('hopper.wgmma' "
                                               rf"\(%\w+\) is in flight\): wait for it \(a wgmma_wait with "
                                               rf"pending 0\) before computing the next A") as e:
        emulate(kernel("gather_gemm_overlap.tkir"), gather_gemm_args(seed), seed=seed)
    assert e.value.loc.line == PRODUCT_LINE


def pv_carried(wait: str) -> str:
    """pv.tkir with P carried through a loop of two products, doubled after each (O = 3 P @ V),
    ``wait`` between the product and the yield that gives P its new value."""
    acc, pa = "tile<128x64xf32, reg, #wgmma_acc<64, wg=2>>", "tile<128x64xbf16, reg, #wgmma_a<64, wg=2>>"
    return edit((KERNELS / "pv.tkir").read_text(), f"""\
  %d = hopper.wgmma %pa, %sv, %acc : {acc}
""", f"""\
  %c2 = tile.constant {{value = 2}} : i32
  %p_1, %d = tile.for %c0, %c2, %c1, %pa, %acc : {pa}, {acc} {{
  ^(%i: i32, %pc: {pa}, %acc_1: {acc}):
    %d_1 = hopper.wgmma %pc, %sv, %acc_1 : {acc}
{wait}    %p_2 = tile.add %pc, %pc : {pa}
    tile.yield %p_2, %d_1
  }}
""")


def test_a_operand_carried_by_a_loop():
    p, v, o = pv_args(0)
    emulate(load(pv_carried("    hopper.wgmma_wait_group {pending = 0}\n"), "pv.tkir"), [p, v, o])
    np.testing.assert_allclose(o, 3 * wgmma_sum(round_to(p, bf16), v), rtol=1e-5, atol=1e-5)


def test_a_operand_carried_by_a_loop_written_while_in_flight():
    """The yield gives the loop argument P its next value while the wgmma reading it is in flight."""
    p, v, o = pv_args(0)
    text = pv_carried("")
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "tile.yield %p_2" in s)
    with pytest.raises(TkcEmulatorError, match=rf"'tile.yield' at pv.tkir:{line}:\d+: writes the registers of the A "
                                               rf"operand that the product at line {line - 2} still reads"):
        emulate(load(text, "pv.tkir"), [p, v, o])


# ------------------------------------------------ interpret(tile IR) == emulate(hopper IR)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# (example, constants, dims, atol): shapes that are not multiples of the tiles.  Results are
# bf16: rtol allows 2 bf16 ulps for a different f32 summation order (wgmma rounds per k16
# step, reductions add in a tree).  Attention also rounds p to bf16 before P @ V, where an
# f32-ulp difference in s can flip p's rounding: a 2^-8 change of one weight, hence its atol.
DIFFERENTIAL = [
    ("gemm.tk", {}, {"M": 200, "N": 136, "K": 96}, 2**-10),
    ("gemm.tk", {}, {"M": 130, "N": 72, "K": 456}, 2**-10),  # 8 k-tiles: rings go round twice
    ("gemm.tk", {"BM": 64, "BN": 64, "BK": 32}, {"M": 100, "N": 72, "K": 40}, 2**-10),
    # 20 tiles: persistent, each of the 4 programs (CPU_SMS) walks 5, its ring carried over.
    ("gemm.tk", {"BM": 64, "BN": 64, "BK": 32}, {"M": 300, "N": 200, "K": 104}, 2**-10),
    ("gemm_fp8.tk", {"BM": 64, "BN": 64, "BK": 64}, {"M": 100, "N": 72, "K": 80}, 2**-10),
    # Without TMA (operands loaded per thread, stored to shared memory): odd K strides work.
    ("gemm.tk", {"BM": 64, "BN": 64, "BK": 32, "tma": False}, {"M": 100, "N": 72, "K": 130}, 2**-10),
    ("attn.tk", {"D": 64, "BM": 64, "BN": 64, "causal": True, "tma": False}, {"B": 1, "H": 2, "N": 100}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 64, "BN": 64, "causal": True}, {"B": 1, "H": 2, "N": 160}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 64, "BN": 64, "causal": False}, {"B": 1, "H": 2, "N": 160}, 2**-6),
    ("attn.tk", {"D": 128, "BM": 128, "BN": 64, "causal": True}, {"B": 1, "H": 1, "N": 160}, 2**-6),
    # Two consumers taking turns (ping-pong) over 5 key blocks, the last one partial.
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "causal": False, "pingpong": True}, {"B": 1, "H": 1, "N": 300}, 2**-6),
    # The next block's S = Q K^T issued an iteration early (issue-ahead): several blocks, causal,
    # and a single block (the steady-state loop runs zero times).
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "issue_ahead": True}, {"B": 1, "H": 1, "N": 300}, 2**-6),
    ("attn.tk", {"D": 128, "BM": 64, "BN": 64, "causal": True, "issue_ahead": True}, {"B": 1, "H": 2, "N": 200}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 64, "BN": 64, "issue_ahead": True}, {"B": 2, "H": 1, "N": 50}, 2**-6),
    ("attn.tk", {"D": 128, "BM": 64, "BN": 64, "causal": False}, {"B": 2, "H": 1, "N": 72}, 2**-6),
    # Two programs an SM (ctas_per_sm): the ring sized for half the shared memory.
    ("attn.tk", {"D": 128, "BM": 64, "BN": 64, "ctas_per_sm": 2, "issue_ahead": True},
     {"B": 1, "H": 2, "N": 200}, 2**-6),
    # Three consumer warpgroups (192 query rows a program), the last block partial.
    ("attn.tk", {"D": 64, "BM": 192, "BN": 64, "causal": True}, {"B": 1, "H": 1, "N": 200}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 64, "BN": 64, "causal": True}, {"B": 1, "H": 1, "N": 330}, 2**-6),
    # Persistent attention: 18 tiles over 4 programs, a Q tile per output tile.  Two Q stages;
    # one Q stage (two programs an SM leave room for one); a single K/V block per tile with
    # S issued ahead.
    ("attn.tk", {"D": 64, "BM": 64, "BN": 64, "persistent": True}, {"B": 2, "H": 3, "N": 160}, 2**-6),
    ("attn.tk", {"D": 128, "BM": 64, "BN": 64, "ctas_per_sm": 2, "persistent": True},
     {"B": 1, "H": 3, "N": 330}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 64, "BN": 64, "persistent": True, "issue_ahead": True},
     {"B": 3, "H": 3, "N": 50}, 2**-6),
    # Persistent causal: the K/V loop's length changes from tile to tile, the tile loop
    # carries the ring's count of earlier iterations (in both roles).
    ("attn.tk", {"D": 64, "BM": 64, "BN": 64, "causal": True, "persistent": True}, {"B": 2, "H": 3, "N": 160}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "causal": True, "persistent": True, "issue_ahead": True},
     {"B": 1, "H": 5, "N": 300}, 2**-6),
    # Persistent with the consumers taking turns: the turns start and end around every tile's loop.
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "causal": True, "persistent": True, "pingpong": True},
     {"B": 2, "H": 3, "N": 300}, 2**-6),
    # Both of FlashAttention-3's overlaps: turns, and S issued ahead with its turn; a single
    # key block (the steady-state loop runs zero times), causal, persistent causal.
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "pingpong": True, "issue_ahead": True},
     {"B": 1, "H": 1, "N": 300}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "pingpong": True, "issue_ahead": True},
     {"B": 2, "H": 1, "N": 50}, 2**-6),
    ("attn.tk", {"D": 128, "BM": 128, "BN": 64, "causal": True, "pingpong": True, "issue_ahead": True},
     {"B": 1, "H": 2, "N": 200}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "causal": True, "persistent": True, "pingpong": True,
                 "issue_ahead": True},
     {"B": 2, "H": 3, "N": 300}, 2**-6),
    # P V of block j - 1 issued right after S of block j, in flight through the softmax
    # (defer-last): several blocks, a single block (the steady-state loop runs zero times),
    # causal, two stages, pingpong (one turn for both products), persistent causal, two
    # programs an SM.
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "defer_last": True}, {"B": 1, "H": 1, "N": 300}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 64, "BN": 64, "defer_last": True}, {"B": 2, "H": 1, "N": 50}, 2**-6),
    ("attn.tk", {"D": 128, "BM": 128, "BN": 64, "causal": True, "defer_last": True, "stages": 2},
     {"B": 1, "H": 2, "N": 200}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "pingpong": True, "defer_last": True},
     {"B": 1, "H": 1, "N": 300}, 2**-6),
    ("attn.tk", {"D": 128, "BM": 128, "BN": 64, "causal": True, "pingpong": True, "defer_last": True},
     {"B": 1, "H": 2, "N": 200}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "causal": True, "persistent": True, "defer_last": True},
     {"B": 1, "H": 5, "N": 300}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "causal": True, "persistent": True, "pingpong": True,
                 "defer_last": True}, {"B": 2, "H": 3, "N": 300}, 2**-6),
    ("attn.tk", {"D": 128, "BM": 64, "BN": 64, "ctas_per_sm": 2, "defer_last": True},
     {"B": 1, "H": 2, "N": 200}, 2**-6),
    # Warpgroups of 128 or 192 rows (two or three 64-row wgmma slices each, the pin consumers):
    # a 256-row GEMM tile on two warpgroups, 128- and 192-row ones on one warpgroup;
    # attention's 128 query rows on one warpgroup, P fed back as a two-slice A operand.
    ("gemm.tk", {"BM": 256, "BN": 64, "BK": 32, "consumers": 2}, {"M": 300, "N": 72, "K": 80}, 2**-6),
    ("gemm.tk", {"BM": 128, "BN": 64, "BK": 32, "consumers": 1}, {"M": 150, "N": 72, "K": 80}, 2**-6),
    ("gemm.tk", {"BM": 192, "BN": 64, "BK": 32, "consumers": 1}, {"M": 200, "N": 72, "K": 80}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "causal": True, "consumers": 1}, {"B": 1, "H": 2, "N": 200}, 2**-6),
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "consumers": 1, "defer_last": True}, {"B": 1, "H": 1, "N": 300},
     2**-6),
    # D = 256 with 80-row K and V blocks: O staged in Q's bytes (no room for a tile of its own
    # beside two stages of K and V).
    ("attn.tk", {"D": 256, "BN": 80, "defer_last": True}, {"B": 1, "H": 1, "N": 200}, 2**-6),
    ("attn.tk", {"D": 256, "BN": 80, "causal": True, "pingpong": True}, {"B": 1, "H": 1, "N": 200}, 2**-6),
    ("attn.tk", {"D": 128, "BN": 176, "defer_last": True}, {"B": 1, "H": 1, "N": 400}, 2**-6),
    ("softmax.tk", {}, {"M": 20, "N": 700}, 2**-12),
    ("layernorm.tk", {}, {"M": 20, "N": 600}, 2**-10),
    ("layernorm.tk", {"BM": 64, "BN": 64}, {"M": 70, "N": 100}, 2**-10),
    # One row a program, in two sweeps of 256-column blocks, the last one partial.
    ("softmax.tk", {"BN": 256}, {"M": 3, "N": 700}, 2**-12),
    ("layernorm.tk", {"BN": 256}, {"M": 3, "N": 600}, 2**-10),
    # Eight warps a program (the warps pin): the row's reductions cross two warpgroups.
    ("softmax.tk", {"BN": 1024, "warps": 8}, {"M": 3, "N": 700}, 2**-12),
    ("layernorm.tk", {"BN": 256, "warps": 8}, {"M": 3, "N": 600}, 2**-10),
    # A row split over the programs of a cluster: cluster_max / cluster_sum through the
    # peers' shared memory, one block a program and two sweeps.
    ("softmax_split.tk", {"BN": 256, "cluster": 4}, {"M": 3, "N": 900}, 2**-12),
    ("softmax_split.tk", {"BN": 128, "cluster": 2, "warps": 8}, {"M": 2, "N": 700}, 2**-12),
    ("layernorm_split.tk", {"BN": 256, "cluster": 4}, {"M": 3, "N": 900}, 2**-10),
    ("layernorm_split.tk", {"BN": 128, "cluster": 2, "warps": 8}, {"M": 2, "N": 700}, 2**-10),
]


# The scheduling passes each variant runs: (before select-layouts, after lower-to-hopper).
VARIANTS = {
    "serial": ([], []),
    "ring": ([], ["pipeline-loops"]),
    "roles": ([], ["pipeline-loops", "specialize-warps"]),
    "persistent": (["persistent"], ["pipeline-loops", "specialize-warps"]),
}
SCHEDULING = {"persistent", "pipeline-loops", "specialize-warps"}


def _hopper_pipeline(variant: str | None = None) -> str:
    """DEFAULT_PIPELINE then HOPPER_PIPELINE; with a ``variant``, with exactly its scheduling
    passes, whether or not HOPPER_PIPELINE already runs them."""
    from tkc.passes.pipeline import DEFAULT_PIPELINE, HOPPER_PIPELINE

    passes = HOPPER_PIPELINE.split(",")
    if variant is not None:
        before, after = VARIANTS[variant]
        passes = [p for p in passes if p not in SCHEDULING]
        i = passes.index("lower-to-hopper") + 1
        passes[i:i] = after
        i = passes.index("select-layouts")
        passes[i:i] = before
    return ",".join([DEFAULT_PIPELINE, *passes])


def compile_both(name: str, consts: dict, variant: str | None = None) -> tuple[Module, Module]:
    from tkc.frontend import compile_file
    from tkc.passes.manager import PassManager
    from tkc.passes.pipeline import DEFAULT_PIPELINE

    tile, hopper = (compile_file(str(EXAMPLES / name), consts) for _ in range(2))
    PassManager(DEFAULT_PIPELINE).run(tile)
    PassManager(_hopper_pipeline(variant)).run(hopper)
    verify(hopper)
    return tile, hopper


def assert_same_run(tile: Module, hopper: Module, dims: dict, seed: int, atol: float) -> None:
    from tkc.interpreter import random_args, run_kernel

    want = random_args(tile.kernel(), dims, seed)
    got = [x.copy() if isinstance(x, np.ndarray) else x for x in want]
    run_kernel(tile.kernel(), want)
    emulate(hopper.kernel(), got, seed=seed)
    for i, (w, g) in enumerate(zip(want, got)):
        if isinstance(w, np.ndarray):
            np.testing.assert_allclose(g, w, rtol=2**-7, atol=atol, equal_nan=True, err_msg=f"argument {i}")
            # Summation order moves few results; a systematic error would move many.
            assert np.count_nonzero(~np.isclose(g, w, rtol=0, atol=0, equal_nan=True)) <= max(0.02 * w.size, 2)


def _differential_cases() -> list:
    """Every case in every variant; the default run takes each case in one variant, in turn,
    so every case and every variant runs (``--slow``: all of them)."""
    out = []
    for i, case in enumerate(DIFFERENTIAL):
        name = case[0] + "".join(f"-{k}{v}" for k, v in case[1].items())
        for j, variant in enumerate(VARIANTS):
            marks = () if j == i % len(VARIANTS) else (pytest.mark.slow,)
            out.append(pytest.param(*case, variant, marks=marks, id=f"{name}-{variant}"))
    return out


@pytest.mark.parametrize("name, consts, dims, atol, variant", _differential_cases())
def test_examples_emulate_like_the_interpreter(name, consts, dims, atol, variant):
    tile, hopper = compile_both(name, consts, variant)
    ops = {op.name for op in hopper.walk()}
    if not consts.get("tma", True):
        # No TMA: nothing to pipeline; every thread stores the operands (single role).
        assert "hopper.smem_store" in ops and "hopper.tma_load" not in ops and "hopper.role" not in ops
    elif variant != "serial" and name.startswith(("gemm", "attn")):
        # The K/V loops are what the passes are for: make sure the emulator sees what they made.
        assert "hopper.stage" in ops and ("hopper.role" in ops) == (variant != "ring")
        # A persistent walk launches a 1-D grid of programs (num_sms() appears without one too:
        # causal programs launched longest first count an SM's share of them).
        walked = any(op.name == "tile.grid" and len(op.operands) == 1 for op in hopper.walk())
        assert walked == (variant == "persistent" and (name.startswith("gemm") or consts.get("persistent", False)))
        # Consumer warpgroups take turns where the pin says so; S is issued ahead (a second
        # S wgmma before the loop) only where a producer role issues the copies.
        assert ("hopper.turn" in ops) == (variant != "ring" and consts.get("pingpong", False))
        products = sum(op.name == "hopper.wgmma" for op in hopper.walk())
        # issue-ahead and defer-last each issue one product once more, before or after the loop.
        moved = variant != "ring" and name == "attn.tk" and (consts.get("issue_ahead", False)
                                                              or consts.get("defer_last", False))
        assert products == (4 if moved else 2 if name == "attn.tk" else 1), products
    for seed in range(2):
        assert_same_run(tile, hopper, dims, seed, atol)


def test_rmsnorm_kernel_emulates_like_the_interpreter():
    import importlib.util

    from tkc.passes.pipeline import DEFAULT_PIPELINE

    spec = importlib.util.spec_from_file_location("rmsnorm_example", EXAMPLES / "rmsnorm.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    consts = {"BM": 16, "BN": 128}
    tile = mod.rmsnorm.compile(DEFAULT_PIPELINE, **consts)
    hopper = mod.rmsnorm.compile(_hopper_pipeline(), **consts)
    for seed in range(2):
        assert_same_run(tile, hopper, {"M": 40, "N": 300}, seed, 2**-10)


# ------------------------------------------------------------------ turns (ping-pong)
def _attention_with_turns(edit_text=None) -> tuple[Module, Module]:
    tile, hopper = compile_both("attn.tk", {"D": 64, "BM": 128, "BN": 64, "pingpong": True}, "roles")
    if edit_text is None:
        return tile, hopper
    from tkc.ir.printer import print_module

    return tile, load(edit_text(print_module(hopper)), "attn.tkir")


def test_a_missing_first_turn_deadlocks():
    start = r' *hopper.turn \{kind = "start"\}[^\n]*\n'
    _, hopper = _attention_with_turns(lambda t: edit(t, re.search(start, t)[0], ""))
    tile, _ = _attention_with_turns()
    with pytest.raises(DeadlockError, match=r"bar.sync 3 \(the turn of warpgroup 0"):
        assert_same_run(tile, hopper, {"B": 1, "H": 1, "N": 200}, 0, 2**-6)


def test_passing_the_turn_twice_is_caught():
    def twice(t: str) -> str:
        line = re.search(r' *hopper.turn \{kind = "pass"\}[^\n]*\n', t)[0]
        return edit(t, line, line + line)

    tile, _ = _attention_with_turns()
    _, hopper = _attention_with_turns(twice)
    with pytest.raises(TkcEmulatorError, match=r"arrives twice on bar.sync"):
        assert_same_run(tile, hopper, {"B": 1, "H": 1, "N": 200}, 0, 2**-6)



# --------------------------------------------------------------------------- TMA stores

TMA_STORE = (Path(__file__).resolve().parents[1] / "codegen" / "kernels" / "tma_store.tkir").read_text()


def test_tma_store_copies_tiles_out_clipped_at_the_edge() -> None:
    rng = np.random.default_rng(3)
    x = round_to(rng.standard_normal((200, 128)), bf16)  # 4 tiles of 64 rows, the last one partial
    y = np.full_like(x, np.nan)
    emulate(load(TMA_STORE, "tma_store.tkir"), [x, y], grid=(1,))
    np.testing.assert_array_equal(y, x)


def test_tma_store_tile_rewritten_before_the_copy_read_it_is_a_race() -> None:
    text = edit(TMA_STORE, "    hopper.tma_store_wait {pending = 0}\n    hopper.smem_store", "    hopper.smem_store")
    x = np.zeros((128, 128), np.float32)
    with pytest.raises(RaceError, match=r"'hopper.smem_store'.*writes it while 'hopper.tma_store.*is still reading"):
        emulate(load(text, "tma_store.tkir"), [x, np.zeros_like(x)], grid=(1,))


TMA_STORE_SLICES = (Path(__file__).resolve().parents[1] / "codegen" / "kernels" / "tma_store_slices.tkir").read_text()


def test_tma_store_slices_copy_a_wide_tile_out() -> None:
    rng = np.random.default_rng(4)
    x = round_to(rng.standard_normal((150, 232)), bf16)  # 3 tiles of 64 rows, clipped in rows and columns
    y = np.full_like(x, np.nan)
    emulate(load(TMA_STORE_SLICES, "tma_store_slices.tkir"), [x, y], grid=(1,))
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("slice_col", [128, 192])
def test_tma_store_slice_written_while_its_last_copy_may_still_read_is_a_race(slice_col: int) -> None:
    """Allowing two copies in flight before a slice reuses a shared tile lets the copy two
    slices back still read it."""
    wait = "    hopper.tma_store_wait {pending = 1}\n"
    store = f"    hopper.smem_store %t, %s{slice_col // 64 % 2} {{col = {slice_col}}}"
    text = edit(TMA_STORE_SLICES, wait + store, wait.replace("1", "2") + store)
    x = np.zeros((64, 256), np.float32)
    with pytest.raises(RaceError, match=r"'hopper.smem_store'.*writes it while 'hopper.tma_store.*is still reading"):
        emulate(load(text, "tma_store_slices.tkir"), [x, np.zeros_like(x)], grid=(1,))


def test_tma_store_not_waited_for_before_the_end_is_an_error() -> None:
    text = edit(TMA_STORE, "  }\n  hopper.tma_store_wait {pending = 0}\n", "  }\n")
    x = np.zeros((64, 128), np.float32)
    with pytest.raises(TkcEmulatorError, match=r"still reading shared memory when the kernel ends"):
        emulate(load(text, "tma_store.tkir"), [x, np.zeros_like(x)], grid=(1,))


def test_read_only_output_is_a_launch_error() -> None:
    """As in the interpreter: storing to a read-only numpy array names the parameter."""
    from tkc.compiler import compile_kernel
    from tkc.errors import TkcLaunchError
    from tkc.frontend import compile_source

    source = ("@kernel\ndef copy(x: f32[N], z: f32[N], B: const = 16):\n    grid(cdiv(N, B))\n"
              "    i = program_id(0)\n    z[i*B:(i+1)*B] = x[i*B:(i+1)*B]\n")
    kernel = compile_kernel(compile_source(source), stop="hopper", cache=False).kernel_op
    x, z = np.arange(20, dtype=np.float32), np.zeros(20, np.float32)
    z.flags.writeable = False
    with pytest.raises(TkcLaunchError, match="z: the kernel stores to it, but the numpy array is read-only"):
        emulate(kernel, [x, z])
    assert not z.any()
