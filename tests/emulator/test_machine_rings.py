"""Rings and roles in the hopper-level machine (``tkc/emulator/machine.py``): the hand-written
pipelined GEMMs (tests/data/hopper/gemm_ring.tkir, one role; gemm_ws.tkir, a producer and two
consumer warpgroups) against numpy, and each broken ring protocol caught with an error that
names the barrier or stage, the op and the warpgroup's role.

The broken protocols are textual edits of the reference kernels.  Where the outcome depends
on the interleaving, the seeds below were picked to show the race; the scheduler is seeded,
so they are reproducible."""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_machine import DATA, KERNELS, edit, gemm_args, gemm_ref, load, nan_like, normal, refused_statically

from tkc.emulator.machine import emulate
from tkc.emulator.mbarrier import PhaseError
from tkc.emulator.scheduler import DeadlockError
from tkc.emulator.smem import RaceError
from tkc.errors import TkcEmulatorError

RING = (DATA / "gemm_ring.tkir").read_text()
WS = (DATA / "gemm_ws.tkir").read_text()
# The producer as the last warpgroup: "thread 0" of its copies is CTA thread 256, and the
# consumers' threads count from CTA thread 0.
WS_PRODUCER_LAST = edit(edit(WS, 'name = "producer", first = 0', 'name = "producer", first = 2'),
                        'name = "consumers", first = 1', 'name = "consumers", first = 0')
GEMMS = {"ring": RING, "ws": WS, "ws-producer-last": WS_PRODUCER_LAST}


def run(text: str, seed: int = 0, mnk: tuple[int, int, int] = (200, 136, 448), verified: bool = True) -> np.ndarray:
    a, b, c = gemm_args(*mnk, seed)
    emulate(load(text, "gemm_ws.tkir", verified), [a, b, c], seed=seed)
    return c


# ------------------------------------------------------------------ correct kernels
@pytest.mark.parametrize("kernel", GEMMS)
@pytest.mark.parametrize("m, n, k, seed", [
    (128, 128, 64, 0),    # one k-tile: fewer tiles than stages, no refill
    (200, 136, 448, 1),   # 7 k-tiles through 4 stages: stages refilled, parities flip; tails in M, N
    (130, 264, 200, 2),   # a K tail (200 = 3 * 64 + 8, zero-filled) and a 2 x 3 grid
    (72, 8, 8, 3),        # far smaller than the tile
])
def test_matches_numpy(kernel, m, n, k, seed):
    a, b, c = gemm_args(m, n, k, seed)
    emulate(load(GEMMS[kernel], f"{kernel}.tkir"), [a, b, c], seed=seed)
    np.testing.assert_array_equal(c, gemm_ref(a, b))


@pytest.mark.parametrize("kernel", ["ring", "ws"])
@pytest.mark.parametrize("seed", range(4))
def test_every_interleaving_seed(kernel, seed):
    a, b, c = gemm_args(136, 72, 576, 10 + seed)  # 9 k-tiles: every stage goes round twice or more
    emulate(load(GEMMS[kernel], f"{kernel}.tkir"), [a, b, c], seed=seed)
    np.testing.assert_array_equal(c, gemm_ref(a, b))


# ------------------------------------------------------------------ broken ring protocols
ACC = "tile<128x128xf32, reg, #wgmma_acc<128, wg=2>>"
RELEASE_BEFORE_WAIT = (f"""      %acc_3 = hopper.wgmma_wait %d {{pending = 0}} : {ACC}
      %e = hopper.stage %empty, %s : mbarrier
      hopper.mbarrier_arrive %e
""", f"""      %e = hopper.stage %empty, %s : mbarrier
      hopper.mbarrier_arrive %e
      %acc_3 = hopper.wgmma_wait %d {{pending = 0}} : {ACC}
""")

RACE = (r"CTA \(0, 0\): role 'warpgroup 0 \(producer\)': 'hopper.tma_load' at gemm_ws.tkir:68:9: race on "
        r"'%sa\[{stage}\]' \[[0-9a-fx, ]+\): \"hopper.tma_load at gemm_ws.tkir:68:9 \(warpgroup 0, role 'producer'\)\" "
        r"writes it while \"hopper.wgmma at gemm_ws.tkir:\d+:7 \(warpgroup [12], role 'consumers'\)\" is still reading "
        r"it \(the reader has not released the stage\)")


@pytest.mark.parametrize("seed, stage", [(0, 0), (1, 2), (2, 0)])
def test_stage_released_before_wgmma_wait_is_a_race(seed, stage):
    # The consumers arrive on `empty` while their wgmma still reads the stage: the producer
    # refills it under the running wgmma.
    with pytest.raises(RaceError, match=RACE.format(stage=stage)):
        run(edit(WS, *RELEASE_BEFORE_WAIT), seed)


def test_single_role_ring_released_before_wgmma_wait_is_a_race():
    text = edit(RING, *(s.replace("      ", "    ") for s in RELEASE_BEFORE_WAIT))
    with pytest.raises(RaceError, match=r"CTA \(1, 1\): role 'warpgroup 0': 'hopper.tma_load' at gemm_ws.tkir:78:7: "
                                        r"race on '%sa\[1\]' .* while 'hopper.wgmma at gemm_ws.tkir:61:5 "
                                        r"\(warpgroup 1\)' is still reading it"):
        run(text, seed=2)


def test_producer_parity_never_flipped_passes_early():
    # Waiting `empty` with parity 1 every round: the second round's wait would pass at once on
    # the barrier's initial phase and overwrite a stage whose tile the consumers are reading.
    text = edit(WS, "hopper.mbarrier_wait %e2, %free2", "hopper.mbarrier_wait %e2, %c1")
    with pytest.raises(PhaseError, match=r"role 'warpgroup 0 \(producer\)' at \"'hopper.mbarrier_wait' at "
                                         r"gemm_ws.tkir:63:9\": wrong phase: .* waits for parity 1 of mbarrier "
                                         r"'%empty\[0\]' in phase 0 .* the GPU would pass at once on phase -1's "
                                         r"completion \(parity not flipped\?\)"):
        run(text, seed=0)
    # Where the consumers had already released stage 0, the wait is for a phase that never comes.
    with pytest.raises(DeadlockError, match=r"'warpgroup 0 \(producer\)' blocked at .*: waits for parity 1 of "
                                            r"mbarrier '%empty\[0\]' in phase 1"):
        run(text, seed=3)


@pytest.mark.parametrize("seed, what", [(0, "race on '%sa[0]'"), (2, "lost data in '%sa[0]'")])
def test_producer_without_empty_wait_overwrites_a_stage_in_use(seed, what):
    text = edit(WS, "        hopper.mbarrier_wait %e2, %free2\n", "")
    with pytest.raises(RaceError) as e:
        run(text, seed)
    msg = str(e.value)
    assert "role 'warpgroup 0 (producer)': 'hopper.tma_load'" in msg and what in msg


def test_missing_arrive_deadlocks_naming_barriers_and_roles():
    text = edit(WS, "      hopper.mbarrier_arrive %e\n", "")
    with pytest.raises(DeadlockError) as e:
        run(text)
    lines = str(e.value).splitlines()
    assert lines[0] == "error: CTA (0, 0): deadlock: no role can run"
    assert re.fullmatch(r"  role 'warpgroup 0 \(producer\)' blocked at \"'hopper.mbarrier_wait' at "
                        r"gemm_ws.tkir:63:9\": waits for parity 0 of mbarrier '%empty\[0\]' in phase 0 \(parity 0\), "
                        r"2/2 arrivals pending, tx-count 0 bytes", lines[1])
    for g, line in zip((1, 2), lines[2:]):
        assert f"role 'warpgroup {g} (consumers)' blocked at" in line and "mbarrier '%full[0]' in phase 1" in line


def test_a_producer_on_four_warps_can_leave_a_warp_two_phases_behind():
    """Only thread 0 issues the producer's copies; on all four warps, warps 1..3 spin on the
    empty waits with nothing tying them to the ring, and one unscheduled while a stage's
    barrier completes two phases waits forever (on an H100: persistent attention stalled)."""
    text = edit(WS, "regs = 40, warps = 1", "regs = 40")
    with pytest.raises(TkcEmulatorError, match=r"gemm_ws.tkir:\d+:\d+: error: CTA \(0, 0\): 'hopper.mbarrier_wait' "
                                               r"at gemm_ws.tkir:\d+:\d+: warpgroup 0, role 'producer': "
                                               r"'%empty\[0\]' completed 2 phases after this warpgroup "
                                               r"passed the wait, before its four warps meet again: a warp still "
                                               r"spinning here would see its parity again and wait forever"):
        run(text)
    run(text, mnk=(64, 64, 4 * 64))  # each stage's barrier completes one phase: no warp can miss it


def test_empty_count_too_high_deadlocks():
    text = edit(WS, "hopper.mbarrier_init %empty {count = 2}", "hopper.mbarrier_init %empty {count = 3}")
    with pytest.raises(DeadlockError, match=r"'warpgroup 0 \(producer\)' blocked at .*'%empty\[0\]' in phase 0 "
                                            r"\(parity 0\), 1/3 arrivals pending"):
        run(text)


@pytest.mark.parametrize("seed, error, message", [
    # The first consumer's arrival frees the stage: the producer refills it under the other's wgmma,
    (0, RaceError, r"race on '%sa\[0\]' .* while \"hopper.wgmma at gemm_ws.tkir:\d+:7 "
                   r"\(warpgroup 2, role 'consumers'\)\""),
    # or before the slower consumer even waited for its half of A (which it then waits for two
    # phases late: the copy over it came after every waiter the barrier had seen so far),
    (4, PhaseError, r"'warpgroup 1 \(consumers\)' waits for parity 0 \(phase 0\) of mbarrier '%full\[0\]' in "
                    r"phase 2 .*phases 0..1 completed without this waiter seeing phase 0"),
    # or the two arrivals complete two phases and the producer's next wait has missed one.
    (1, PhaseError, r"'warpgroup 0 \(producer\)' waits for parity 0 \(phase 0\) of mbarrier '%empty\[0\]' in phase 2 "
                    r".*phases 0..1 completed without this waiter seeing phase 0"),
])
def test_empty_count_one_for_two_consumers(seed, error, message):
    text = edit(WS, "hopper.mbarrier_init %empty {count = 2}", "hopper.mbarrier_init %empty {count = 1}")
    with pytest.raises(error, match=message):
        run(text, seed)


def test_consumer_parity_never_flipped():
    text = edit(WS, "      hopper.mbarrier_wait %f, %par\n", "      hopper.mbarrier_wait %f, %c0\n")
    with pytest.raises(PhaseError, match=r"role 'warpgroup 2 \(consumers\)' at \"'hopper.mbarrier_wait' at "
                                         r"gemm_ws.tkir:87:7\": wrong phase: .* parity 0 of mbarrier '%full\[0\]' "
                                         r"in phase 1 .* would pass at once on phase 0's completion"):
        run(text, seed=2)


@pytest.mark.parametrize("seed, error, message", [
    # Parity 1 first: the wait passes at once (the phase before init) and wgmma reads an empty stage,
    (0, TkcEmulatorError, r"'hopper.wgmma' \(%d\) at gemm_ws.tkir:91:7: \"hopper.wgmma at gemm_ws.tkir:91:7 "
                          r"\(warpgroup 1, role 'consumers'\) \(A\)\" reads '%sa\[0\]' .* which nothing has written"),
    # or, the copy having landed, the next round waits for a phase already behind it.
    (6, PhaseError, r"'warpgroup 1 \(consumers\)' waits for parity 1 \(phase -1\) of mbarrier '%full\[0\]' in phase 1"),
])
def test_consumer_waits_full_with_the_wrong_parity(seed, error, message):
    text = edit(WS, "      hopper.mbarrier_wait %f, %par\n",
                "      %wrong = tile.xor %par, %c1 : i32\n      hopper.mbarrier_wait %f, %wrong\n")
    with pytest.raises(error, match=message):
        run(text, seed)


# ------------------------------------------------------------------ rings
def test_stage_index_outside_the_ring():
    wait = "      hopper.mbarrier_wait %f, %par\n"
    text = edit(WS, "      %f = hopper.stage %full, %s : mbarrier\n" + wait,
                "      %f = hopper.stage %full, %k : mbarrier\n" + wait)
    with pytest.raises(TkcEmulatorError, match=r"role 'warpgroup [12] \(consumers\)': 'hopper.stage' \(%f\) at "
                                               r"gemm_ws.tkir:\d+:\d+: stage 4 of the 4-stage ring %full is outside "
                                               r"\[0, 4\)"):
        run(text)


def test_ring_used_without_stage():
    text = edit(WS, "      hopper.mbarrier_wait %f, %par\n", "      hopper.mbarrier_wait %full, %par\n")
    refused_statically(text, "gemm_ws.tkir")
    with pytest.raises(TkcEmulatorError, match=r"'hopper.mbarrier_wait' at gemm_ws.tkir:\d+:\d+: takes the ring "
                                               r"%full itself; a ring is used through hopper.stage"):
        run(text, verified=False)


def test_ring_must_fit_smem_bytes():
    # The empty ring is 4 barriers (32 B) from 131104: one stage short of the end.
    text = edit(WS, "smem_bytes = 131136", "smem_bytes = 131128")
    refused_statically(text, "gemm_ws.tkir")
    with pytest.raises(TkcEmulatorError, match=r"'hopper.mbarrier_alloc' \(%empty\) at gemm_ws.tkir:\d+:\d+: "
                                               r"\[0x20020, 0x20040\) is outside the kernel's smem_bytes = 131128"):
        run(text, verified=False)


# ------------------------------------------------------------------ roles
def test_register_budget_over_the_register_file():
    text = edit(WS, "regs = 232", "regs = 240")
    refused_statically(text, "gemm_ws.tkir")
    with pytest.raises(TkcEmulatorError, match=r"gemm_ws.tkir:\d+:\d+: error: CTA \(0, 0\): kernel @gemm: roles need "
                                               r"66560 registers, the CTA holds 64512 \(384 threads x 168 at entry; "
                                               r"roles 'producer' 1 x 128 threads x 40 \+ 'consumers' 2 x 128 threads "
                                               r"x 240; .*\): setmaxnreg.inc would wait forever"):
        run(text, verified=False)


def test_register_budget_over_the_ctas_pool_though_within_the_file():
    """Budgets are held to what the CTA was launched with, not to the register file: 384
    threads start at 168 each, 64512 registers.  Producer 24 + two consumers at 240 is exactly
    that; producer 32 + 2 x 240 is 65536, the whole file, and over the pool."""
    run(edit(edit(WS, "regs = 40", "regs = 24"), "regs = 232", "regs = 240"), mnk=(64, 64, 64))  # exactly the pool
    text = edit(edit(WS, "regs = 40", "regs = 32"), "regs = 232", "regs = 240")  # 65536: the file, not the pool
    refused_statically(text, "gemm_ws.tkir")
    with pytest.raises(TkcEmulatorError, match=r"roles need 65536 registers, the CTA holds 64512"):
        run(text, verified=False)


def test_role_without_regs_keeps_the_entry_budget():
    # A producer that never gives its registers back keeps 65536 / 384 -> 168 per thread.
    text = edit(WS, "regs = 40", "regs = 0")
    want = (r"roles need 80896 registers, the CTA holds 64512 \(384 threads x 168 at entry; roles 'producer' "
            r"1 x 128 threads x 168 .*keeps the entry budget")
    refused_statically(text, "gemm_ws.tkir")
    with pytest.raises(TkcEmulatorError, match=want):
        run(text, verified=False)
    run(edit(edit(WS, "regs = 40", "regs = 0"), "regs = 232", "regs = 0"), mnk=(64, 64, 64))  # 3 x 168 fits


def test_one_warpgroup_one_register_budget():
    text = edit(WS, 'name = "consumers", first = 1, warpgroups = 2', 'name = "consumers", first = 0, warpgroups = 3')
    refused_statically(text, "gemm_ws.tkir")
    with pytest.raises(TkcEmulatorError, match=r"'hopper.role' at gemm_ws.tkir:\d+:\d+: warpgroup 0 runs role "
                                               r"'producer' with regs = 40 and role 'consumers' with regs = 232"):
        run(text, verified=False)


def test_register_tiles_live_inside_roles():
    acc = "    %acc = tile.constant {value = 0.0} : tile<128x128xf32, reg, #wgmma_acc<128, wg=2>>\n"
    text = edit(edit(WS, acc, ""), '  hopper.role {name = "producer"', acc[2:] + '  hopper.role {name = "producer"')
    refused_statically(text, "gemm_ws.tkir")
    with pytest.raises(TkcEmulatorError, match=r"'tile.constant' \(%acc\) at gemm_ws.tkir:\d+:\d+: uses register "
                                               r"tiles outside the kernel's roles"):
        run(text, verified=False)


def test_layouts_span_the_role_not_the_kernel():
    text = edit(WS, 'name = "consumers", first = 1, warpgroups = 2', 'name = "consumers", first = 1, warpgroups = 1')
    refused_statically(text, "gemm_ws.tkir")
    with pytest.raises(TkcEmulatorError, match=r"'tile.constant' \(%acc\) at gemm_ws.tkir:\d+:\d+: "
                                               r"#wgmma_acc<128, wg=2> spans 256 threads, role 'consumers' has 128"):
        run(text, verified=False)


def in_role(path: str, first_role_op: str) -> str:
    """The 256-thread kernel at ``path`` as warpgroups 1 and 2 of a 384-thread kernel: its ops
    from ``first_role_op`` on run in a role; warpgroup 0 runs none."""
    text = edit((KERNELS / path).read_text(), "threads = 256", "threads = 384")
    head, rest = text.split(first_role_op, 1)
    body, tail = rest.split("  tile.return\n", 1)
    body = "".join("  " + line + "\n" for line in (first_role_op + body).splitlines())
    return (head + '  hopper.role {name = "work", first = 1, warpgroups = 2, regs = 0} {\n' + body
            + "    tile.yield\n  }\n  tile.return\n" + tail)


@pytest.mark.parametrize("seed", range(3))
def test_conversion_inside_a_role_synchronizes_the_role(seed):
    # Every value changes threads, half of them warpgroups, through the scratch tile and two
    # bar.syncs; those count the role's two warpgroups, not the CTA's three (else: deadlock).
    rng = np.random.default_rng(seed)
    x = normal(rng, 100, 60)
    y, z = nan_like((100, 60)), nan_like((100, 60))
    emulate(load(in_role("convert.tkir", "  %xb = "), "convert.tkir"), [x, y, z], seed=seed)
    np.testing.assert_array_equal(z, x)
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("seed", range(3))
def test_reduction_inside_a_role_exchanges_between_its_warps(seed):
    rng = np.random.default_rng(seed)
    m, n = 40, 200
    x = normal(rng, m, n)
    s, mx, y = nan_like((m,)), nan_like((m,)), nan_like((m, n))
    emulate(load(in_role("reduce_blocked.tkir", "  %x0 = "), "reduce_blocked.tkir"), [x, s, mx, y], seed=seed)
    np.testing.assert_allclose(s, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mx, x.max(1))
    np.testing.assert_array_equal(y, x - x.max(1)[:, None])


WAIT_AND_RELEASE = f"""      %acc_3 = hopper.wgmma_wait %d {{pending = 0}} : {ACC}
      %e = hopper.stage %empty, %s : mbarrier
      hopper.mbarrier_arrive %e
      tile.yield %acc_3
    }}
    %out = tile.cast %acc_1"""


def in_flight(release: str) -> str:
    """gemm_ws.tkir with pipeline-loops' accumulating loop: the accumulator stays in flight
    across iterations (``wgmma_wait_group 1``) and is waited for behind the loop; ``release``
    arrives on a stage's ``empty`` barrier in between."""
    return edit(WS, WAIT_AND_RELEASE, f"""      hopper.wgmma_wait_group {{pending = 1}}
{release}      tile.yield %d
    }}
    %acc_w = hopper.wgmma_wait %acc_1 {{pending = 0}} : {ACC}
    %out = tile.cast %acc_w""")


@pytest.mark.parametrize("seed", range(3))
def test_wgmma_wait_group_keeps_the_newest_in_flight(seed):
    # Iteration k waits for the wgmma of k - 1 and only then releases k - 1's stage.
    text = in_flight("""      %more = tile.cmp %c0, %k {pred = "lt"} : i1
      tile.if %more {
        %k1 = tile.sub %k, %c1 : i32
        %s1 = tile.rem %k1, %c4 : i32
        %e = hopper.stage %empty, %s1 : mbarrier
        hopper.mbarrier_arrive %e
        tile.yield
      } {
        tile.yield
      }
""")
    a, b, c = gemm_args(200, 136, 448, seed)
    emulate(load(text, "gemm_ws.tkir"), [a, b, c], seed=seed)
    np.testing.assert_array_equal(c, gemm_ref(a, b))


def test_wgmma_wait_group_then_releasing_the_newest_stage_is_a_race():
    # wait_group 1 leaves iteration k's own wgmma running: releasing k's stage is too early.
    text = in_flight("""      %e = hopper.stage %empty, %s : mbarrier
      hopper.mbarrier_arrive %e
""")
    with pytest.raises(RaceError, match=r"race on '%sa\[\d\]' .* while \"hopper.wgmma at gemm_ws.tkir:\d+:7 "
                                        r"\(warpgroup \d, role 'consumers'\)\" is still reading it"):
        run(text, seed=0)
