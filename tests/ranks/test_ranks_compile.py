"""Multi-GPU kernels compiled for sm_90a (docs/hopper.md §4 "Ranks"): the parameters a launch
passes beyond the kernel's own, the PTX of peers' copies, signals, waits and rank barriers,
where the passes put waits and barriers, and ptxas without spills."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from device_checks import HAVE_PTXAS, assert_no_spills, is_multi_gpu
from tkc.compiler import compile_kernel
from tkc.errors import TkcUsageError

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
MULTI_GPU = sorted(p.name for p in EXAMPLES.glob("*.tk") if is_multi_gpu(p))


def _ptx_params(ptx: str) -> list[str]:
    """The entry's parameter declarations, in order."""
    head = ptx[ptx.index(".entry"):ptx.index(")", ptx.index(".entry"))]
    return re.findall(r"\.param (?:\.align \d+ )?\.(\w+) [\w$.]+(\[\d+\])?", head)


def test_the_multi_gpu_examples() -> None:
    assert MULTI_GPU == ["allgather.tk", "allgather_gemm.tk", "gemm_allreduce.tk", "gemm_reducescatter.tk",
                         "moe_dispatch.tk", "reducescatter.tk", "ring_attn.tk"]


@pytest.mark.parametrize("example", MULTI_GPU)
def test_multi_gpu_examples_compile_without_spills(example: str) -> None:
    c = compile_kernel(EXAMPLES / example, {}, stop="cubin" if HAVE_PTXAS else "ptx", cache=False)
    if HAVE_PTXAS:
        assert_no_spills(c)
    ptx = c.asm["ptx"]
    assert "multimem" not in ptx  # NVLink multicast stays off
    abi = c.ranks
    assert abi is not None and abi.tensors
    # Item 1 (the kernel's own parameters), item 2 (rank, num_ranks, one peers array per ranked
    # tensor, the pads), item 3 (a map, or an array of per-rank maps, per tma_maps entry).
    params = c.params
    own = sum(1 + 2 * t.rank if hasattr(t, "ranks") else 1 for _, t in params)
    maps = c.tma_maps
    declared = _ptx_params(ptx)
    assert len(declared) == own + 2 + len(abi.tensors) + bool(abi.barrier) + len(maps), declared
    tail = declared[len(declared) - len(maps):] if maps else []
    for n, (kind, array) in enumerate(tail):
        ranked = n in abi.maps
        assert (kind, array) == (("u64", "") if ranked else ("b8", "[128]")), (n, kind, array)
    if abi.barrier:
        # one release fence, then relaxed adds to every rank's pad (no fence per rank)
        body = ptx[ptx.index("fence.acq_rel.sys;"):]
        assert ptx.count("fence.acq_rel.sys;") == ptx.count("atom.relaxed.sys.global.add.u32")
        assert body.index("atom.relaxed.sys.global.add.u32") < body.index("red.relaxed.sys.global.add.u32")
        assert "red.release" not in ptx and "atom.acq_rel.sys" not in ptx
    if abi.waits:
        assert "ld.acquire.sys.global.b32" in ptx and "nanosleep" in ptx and "fence.proxy.async.global" in ptx


def test_abi_of_the_examples() -> None:
    ag = compile_kernel(EXAMPLES / "allgather_gemm.tk", {}, stop="hopper", cache=False)
    assert ag.ranks.tensors == (2, 3) and ag.ranks.barrier == 2 and ag.ranks.waits  # both roles meet
    assert ag.ranks.maps == tuple(n for n, (i, _, _) in enumerate(ag.tma_maps) if i == 2) != ()
    rs = compile_kernel(EXAMPLES / "gemm_reducescatter.tk", {}, stop="hopper", cache=False)
    assert rs.ranks.tensors == (2,) and rs.ranks.barrier and rs.ranks.maps == (2,)  # TMA adds into peers
    ar = compile_kernel(EXAMPLES / "gemm_allreduce.tk", {}, stop="hopper", cache=False)
    assert ar.ranks.tensors == (2, 3) and ar.ranks.barrier and ar.ranks.waits
    plain = compile_kernel(EXAMPLES / "gemm.tk", {}, stop="hopper", cache=False)
    assert plain.ranks is None


def _hopper(example: str) -> str:
    return compile_kernel(EXAMPLES / example, {}, stop="hopper", cache=False).asm["hopper"]


def test_both_roles_meet_once_per_program_not_per_tile() -> None:
    """allgather_gemm starts with barrier_all(): persistent, each role meets its peers once,
    before its walk over tiles; the producer (which copies peers' tiles) as much as the consumers."""
    ir = _hopper("allgather_gemm.tk")
    roles = ir.split("hopper.role")[1:]
    assert len(roles) == 2
    for role in roles:
        body = role.splitlines()
        barrier = next(i for i, line in enumerate(body) if "tile.rank_barrier" in line)
        walk = next(i for i, line in enumerate(body) if "tile.for" in line)
        assert barrier < walk and role.count("tile.rank_barrier") == 1, role[:2000]


def test_a_barrier_that_ends_every_program_is_met_after_the_walk() -> None:
    """A kernel made persistent (tests/data/ranks/moe_pull.tk, a program a column tile of an
    expert) whose programs end with barrier_all(): met once, after the walk over tiles."""
    ir = _hopper(str(Path(__file__).parents[1] / "data" / "ranks" / "moe_pull.tk"))
    for role in ir.split("hopper.role")[1:]:
        assert role.count("tile.rank_barrier") == 2
        lines = [line for line in role.splitlines() if line.strip()]
        closing = max(i for i, line in enumerate(lines) if line.strip() == "}")
        last = max(i for i, line in enumerate(lines) if "tile.rank_barrier" in line)
        # the second barrier comes after the tile loop closes, at the role's top level
        assert lines[last].startswith("    tile.rank_barrier"), lines[last]
        assert last < closing


def test_a_producer_that_runs_rank_ops_keeps_40_registers() -> None:
    for example in ("allgather_gemm.tk", "ring_attn.tk", "moe_dispatch.tk"):
        ir = _hopper(example)
        assert 'name = "producer", first = 0, warpgroups = 1, regs = 40' in ir, example
        assert 'name = "consumers", first = 1, warpgroups = 2, regs = 232' in ir, example


def test_the_producer_regs_pin() -> None:
    ir = compile_kernel(EXAMPLES / "ring_attn.tk", {"producer_regs": 24}, stop="hopper", cache=False).asm["hopper"]
    assert 'name = "producer", first = 0, warpgroups = 1, regs = 24' in ir
    assert 'name = "consumers", first = 1, warpgroups = 2, regs = 240' in ir
    with pytest.raises(TkcUsageError, match="pin producer_regs = 20: setmaxnreg takes a multiple of 8 from 24 to 256"):
        compile_kernel(EXAMPLES / "ring_attn.tk", {"producer_regs": 20}, stop="hopper", cache=False)


def test_a_signal_follows_the_programs_stores(tmp_path: Path) -> None:
    """A release atomic on one element: thread 0 waits for its TMA stores to complete, fences
    the async proxy, the threads meet, then the release (docs/hopper.md §4)."""
    ptx = compile_kernel(EXAMPLES / "gemm_allreduce.tk", {}, stop="ptx", cache=False).asm["ptx"]
    # the release after the walk (the one in the loop announces the previous tile, whose add
    # comes after it in the text): the last partial goes to its owner by a TMA copy that adds
    at = ptx.index("atom.release.sys.global.exch.b32", ptx.rindex("cp.reduce.async.bulk.tensor"))
    before = ptx[:at]
    steps = ("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add", "cp.async.bulk.wait_group \t0",
             "fence.proxy.async.global", "bar.sync")
    order = [before.rindex(what) for what in steps]
    assert order == sorted(order), "the TMA copies complete, the async proxy is fenced, the threads meet, then release"
    # the sums go to every rank by the threads' own stores: they meet after them
    before = ptx[:ptx.rindex("atom.release.sys.global.exch.b32")]
    assert before.rindex("bar.sync") > before.rindex("st.global"), "the threads meet after their stores"


def test_a_peer_rank_out_of_range_traps_and_with_the_pin_says_where(tmp_path: Path) -> None:
    src = tmp_path / "k.tk"
    src.write_text("@kernel\ndef k(x: f32[N] @ ranks, y: f32[N]):\n    grid(1)\n"
                   "    y[0:16] = x.on(rank() + 1)[0:16]\n")

    def texts(ptx: str) -> list[str]:
        return [bytes(int(x) for x in m.split(",")).decode(errors="replace")
                for m in re.findall(r"\.b8 printf\S*\[\d+\] = \{([\d, ]+)\}", ptx)]

    plain = compile_kernel(src, {}, stop="ptx", cache=False).asm["ptx"]
    assert "trap;" in plain and "vprintf" not in plain  # no call: nothing live spills around it
    pinned = compile_kernel(src, {"wait_timeout_ms": 1000}, stop="ptx", cache=False).asm["ptx"]
    assert "trap;" in pinned
    assert any(t.startswith("tkc: ") and ":4:" in t and "x.on(r) with r = %d, but the launch has %d ranks" in t
               for t in texts(pinned)), texts(pinned)


UNIFORM = """
@kernel
def uniform(x: f32[N] @ ranks, n: i32):
    grid(cdiv(N, 16))
    i = program_id(0)
    peer = (rank() + 1) % num_ranks()
    t = x.on(peer)[i*16:(i+1)*16]
    steps = 0
    for s in range(num_ranks()):
        barrier_all()
        steps = steps + 1
    if i % 2 == 0:
        barrier_all()
    for j in range(steps, cdiv(N, 16) + n):
        if n > 0:
            barrier_all()
    x[i*16:(i+1)*16] = t
"""


def test_a_barrier_under_control_flow_the_same_on_every_rank_compiles(tmp_path: Path) -> None:
    """Program ids, constants, dims, scalar arguments and num_ranks() are the same on every
    rank, so barriers under them are met equally often (tests/frontend/bad/ranks_barrier_*
    are the refusals); through every pass, whose verifier checks it again."""
    path = tmp_path / "uniform.tk"
    path.write_text(UNIFORM)
    c = compile_kernel(path, {}, stop="hopper", cache=False)
    assert c.asm["hopper"].count("tile.rank_barrier") >= 3


@pytest.mark.parametrize("example", MULTI_GPU)
def test_per_rank_tensor_maps_are_acquired_for_the_tensormap_proxy_first(example: str) -> None:
    """The per-rank maps are copied into global memory from the host: every warpgroup's first
    thread acquires each rank's map (fence.proxy.tensormap::generic, PTX ISA 8.3) before any
    TMA copy; a kernel without them keeps its target's PTX version and has no such fence."""
    c = compile_kernel(EXAMPLES / example, {}, stop="ptx", cache=False)
    ptx = c.asm["ptx"]
    fences = ptx.count("fence.proxy.tensormap::generic.acquire.sys [")
    if not c.ranks.maps:
        assert fences == 0 and ".version 8.1" in ptx
        return
    assert ".version 8.3" in ptx and fences > 0
    assert ptx.index("fence.proxy.tensormap::generic") < ptx.index("cp.async.bulk.tensor")


def test_an_epilogue_into_a_peer_stages_every_slice_in_a_buffer_of_its_own() -> None:
    """A TMA copy into a peer reads its shared slice for as long as the link takes: the
    reduce-scatter's 128 x 256 partial goes out in four 64-column slices, each with its own
    buffer (64 KB), so a slice waits only for the previous tile's copy of its buffer
    (``wait_group.read 3``); a local epilogue keeps two buffers used in turn (32 KB)."""
    ptx = compile_kernel(EXAMPLES / "gemm_reducescatter.tk", {}, stop="ptx", cache=False).asm["ptx"]
    assert re.findall(r"cp\.async\.bulk\.wait_group\.read \t(\d)", ptx) == ["3", "3", "3", "3", "0"]
    assert ptx.count("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add") == 4
    local = compile_kernel(EXAMPLES / "gemm.tk", {}, stop="ptx", cache=False).asm["ptx"]
    assert re.findall(r"cp\.async\.bulk\.wait_group\.read \t(\d)", local) == ["0", "1", "1", "1", "0"]


def test_ring_attention_as_a_launch_schedules_it_compiles_without_spills() -> None:
    """defer_last, which a launch picks for ring_attn.tk's loop (tkc.schedule)."""
    c = compile_kernel(EXAMPLES / "ring_attn.tk", {"defer_last": True}, stop="cubin" if HAVE_PTXAS else "ptx",
                       cache=False)
    if HAVE_PTXAS:
        assert_no_spills(c)


def test_the_producer_waits_for_a_ranks_blocks_before_copying_them_ahead() -> None:
    """ring_attn.tk waits for a rank's K/V blocks at the first of them; the producer copies blocks
    up to three iterations ahead, so it waits again, for the copied block's rank, right before
    each copy (``copies = true``: the consumers keep only the loop's own wait)."""
    ir = _hopper("ring_attn.tk")
    producer, consumers = ir[ir.index('name = "producer"'):ir.index('name = "consumers"')], \
        ir[ir.index('name = "consumers"'):]
    waits = [line.strip() for line in producer.splitlines() if "tile.wait %ready" in line]
    assert len(waits) == 3 and sum("copies = true" in w for w in waits) == 2, waits  # prologue, loop, refill
    lines = producer.splitlines()
    for i, line in enumerate(lines):
        if "copies = true" in line:  # the next copy is K's block, behind this wait
            after = next(x for x in lines[i:] if "hopper.tma_load" in x)
            assert "hopper.tma_load %kg" in after, after
    assert "tile.wait %ready" in consumers and "copies = true" not in consumers
