"""The multi-GPU launch without a GPU (tkc/runtime/ranks.py): the extra parameters in the
order of docs/hopper.md §4, peers' addresses from symmetric buffers, barrier pads, and every
refusal before the GPU is reached.  Symmetric memory is faked: CPU tensors registered with
handles that say where "peers" keep their copies; device arrays are CPU tensors."""

from __future__ import annotations

import ctypes
import gc
import struct
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tkc.compiler import Compiled
from tkc.errors import TkcLaunchError
from tkc.runtime import launch as launch_mod
from tkc.runtime import ranks
from tkc.runtime.launch import tma_operands

torch = pytest.importorskip("torch")

RANKED = Path(__file__).resolve().parents[1] / "data" / "hopper" / "ranked.tkir"
CPU = torch.device("cpu")
PEER_BASE = 0x7F00_0000_0000  # where the fake peer (rank 1) keeps its copies


def compiled() -> Compiled:
    return Compiled.from_asm({"hopper": RANKED.read_text(), "ptx": "unused"})


class Group:
    def __init__(self, rank: int, size: int, name: str = "world"):
        self._rank, self._size, self.group_name = rank, size, name

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def symmetric(*shape: int, dtype: torch.dtype = torch.bfloat16, rank: int = 0, world: int = 2,
              group: str = "world") -> torch.Tensor:
    """A CPU tensor registered as this rank's copy of a symmetric buffer; rank r's copy is at
    ``PEER_BASE * r`` (rank 0 at the tensor itself)."""
    t = torch.zeros(*shape, dtype=dtype)
    ptrs = [t.data_ptr() if r == rank else PEER_BASE * (r + 1) for r in range(world)]
    handle = SimpleNamespace(rank=rank, world_size=world, buffer_ptrs=ptrs, buffer_size=t.untyped_storage().nbytes())
    ranks.register(t, handle, group)
    return t


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """No buffers, arrays or pads from another test; no collective peer check."""
    monkeypatch.setattr(ranks, "_buffers", [])
    monkeypatch.setattr(ranks, "_arrays", {})
    monkeypatch.setattr(ranks, "_pads", {})
    monkeypatch.setattr(ranks, "_retired", [])
    monkeypatch.setattr(ranks, "_peer_check", lambda group, device: None)
    monkeypatch.setattr(ranks, "_grids_checked", set())
    monkeypatch.setattr(ranks, "_gather_grids", lambda grid, group: [tuple(grid)] * 2)  # the peer's is the same

    def zeros(shape, dtype, group, device):  # a barrier pad: symmetric, on the fake peer at PEER_BASE * 3
        t = torch.zeros(shape, dtype=dtype)
        ptrs = [t.data_ptr(), PEER_BASE * 3]
        ranks.register(t, SimpleNamespace(rank=0, world_size=2, buffer_ptrs=ptrs), group)
        return t

    monkeypatch.setattr(ranks, "symmetric_zeros", zeros)


def u64s(address: int, n: int) -> list[int]:
    return list(struct.unpack(f"<{n}Q", ctypes.string_at(address, 8 * n)))


def fake_map(tensor, address, box, swizzle, name) -> bytes:
    return struct.pack("<Q", address) + bytes(120)


def test_rank_values_follow_the_abi() -> None:
    assert ranks.rank_values(1, 2, [0x100, 0x200], 0x300) == [("u32", 1), ("u32", 2), ("u64", 0x100),
                                                             ("u64", 0x200), ("u64", 0x300)]
    assert ranks.rank_values(0, 4, [], None) == [("u32", 0), ("u32", 4)]


def test_peer_addresses_keep_the_offset_into_the_buffer() -> None:
    handle = SimpleNamespace(rank=1, world_size=3, buffer_ptrs=[0x1000, 0x9000, 0x5000], buffer_size=0x800)
    buf = ranks.SymmetricBuffer(0, 0x9000, 0x9800, handle, "world")
    assert ranks.peer_addresses(0x9040, buf) == [0x1040, 0x9040, 0x5040]
    with pytest.raises(TkcLaunchError, match="not inside its symmetric buffer"):
        ranks.peer_addresses(0x9800, buf)


def test_views_inside_a_symmetric_buffer_are_found_and_forgotten_with_it() -> None:
    t = symmetric(4, 8)
    assert ranks.find(t[2:].data_ptr(), 2 * 16, -1) is not None
    assert ranks.find(t.data_ptr(), t.nbytes + 2, -1) is None  # past its end
    assert ranks.find(t.data_ptr(), 16, 0) is None  # another device
    before = ranks.generation()
    address = t.data_ptr()
    del t
    gc.collect()
    assert ranks.find(address, 16, -1) is None and ranks.generation() != before


def test_prepare_passes_rank_peers_pads_and_per_rank_maps() -> None:
    c = compiled()
    a, flags = symmetric(100, 64), symmetric(5, dtype=torch.int32)
    b = torch.zeros(64, 32, dtype=torch.bfloat16)
    args = [a[10:], b, flags, 0.5]  # a view inside a's buffer
    maps = tma_operands(c.params, c.tma_maps)
    extra = ranks.prepare(c.ranks, c.name, c.params, args, maps, (2,), CPU, held=lambda: 264, encode=fake_map)
    values = extra.values
    assert [k for k, _ in values] == ["u32", "u32", "u64", "u64", "u64"]
    assert values[:2] == [("u32", 0), ("u32", 2)]
    offset = 10 * 64 * 2
    assert u64s(values[2][1], 2) == [a.data_ptr() + offset, PEER_BASE * 2 + offset]
    assert u64s(values[3][1], 2) == [flags.data_ptr(), PEER_BASE * 2]
    pad = ranks.find(u64s(values[4][1], 1)[0], 4, -1)
    assert pad is not None and u64s(values[4][1], 2)[1] == PEER_BASE * 3
    assert set(extra.maps) == {1}  # the second tma_maps entry is a's, ranked
    address = extra.maps[1]
    assert address % 128 == 0
    assert [u64s(address + 128 * r, 1)[0] for r in range(2)] == [a.data_ptr() + offset, PEER_BASE * 2 + offset]
    # The same launch again makes no new device arrays.
    again = ranks.prepare(c.ranks, c.name, c.params, args, maps, (2,), CPU, held=lambda: 264, encode=fake_map)
    assert again.values == values and again.maps == extra.maps


def test_barrier_pads_grow_on_every_rank_together() -> None:
    c = compiled()
    args = [symmetric(64, 64), torch.zeros(64, 64, dtype=torch.bfloat16), symmetric(5, dtype=torch.int32), 1.0]
    maps = tma_operands(c.params, c.tma_maps)

    def pads(grid: tuple[int, ...]) -> int:
        extra = ranks.prepare(c.ranks, c.name, c.params, args, maps, grid, CPU, held=lambda: 10**6, encode=fake_map)
        return extra.values[-1][1]

    first = pads((2,))
    assert pads((2048,)) == first  # 2048 programs x 2 ranks fit in the first 4096 counters
    g = ranks.generation()
    grown = pads((2049,))
    assert grown != first and ranks.generation() != g
    (_, counters), = ranks._pads.values()
    assert counters == 8192 and ranks.pad_counters((2049,), 2, counters) == 0
    assert ranks.pad_counters((3,), 4, 0) == 4096 and ranks.pad_counters((5000,), 2, 4096) == 16384


def test_kernels_whose_barriers_meet_other_role_counts_count_on_other_pads() -> None:
    """A barrier's target is the next multiple of its role count: a pad one-role kernels left
    at an odd count would let one role of a two-role kernel pass alone."""
    c = compiled()
    args = [symmetric(64, 64), torch.zeros(64, 64, dtype=torch.bfloat16), symmetric(5, dtype=torch.int32), 1.0]
    maps = tma_operands(c.params, c.tma_maps)

    def pads(roles: int) -> int:
        abi = c.ranks._replace(barrier=roles)
        return ranks.prepare(abi, c.name, c.params, args, maps, (2,), CPU, held=lambda: 10**6,
                             encode=fake_map).values[-1][1]

    one, two = pads(1), pads(2)
    assert u64s(one, 1) != u64s(two, 1) and u64s(pads(2), 1) == u64s(two, 1)


def test_ranks_launching_a_kernel_with_barriers_with_other_grids_are_named() -> None:
    ranks.check_grids("k", [(4, 2), (4, 2), (4, 2)])
    with pytest.raises(TkcLaunchError, match=r"kernel 'k' meets at barrier_all\(\) across ranks, so every rank "
                                             r"launches it with the same grid .* but the grids differ: rank 0: "
                                             r"\(4, 2\), rank 1: \(4, 2\), rank 2: \(5, 2\); pass every rank"):
        ranks.check_grids("k", [(4, 2), (4, 2), (5, 2)])


def test_the_grid_is_gathered_once_per_kernel_group_and_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A collective on the checked path only, decided by the grids launched before (the same
    on every rank while they agree), never by which launches were kept."""
    c = compiled()
    args = [symmetric(64, 64), torch.zeros(64, 64, dtype=torch.bfloat16), symmetric(5, dtype=torch.int32), 1.0]
    maps = tma_operands(c.params, c.tma_maps)
    gathered: list[tuple] = []
    monkeypatch.setattr(ranks, "_gather_grids", lambda grid, group: gathered.append(tuple(grid)) or [tuple(grid)] * 2)

    def launch(grid: tuple[int, ...], abi=c.ranks) -> None:
        ranks.prepare(abi, c.name, c.params, args, maps, grid, CPU, held=lambda: 10**6, encode=fake_map)

    launch((2,))
    launch((2,))
    assert gathered == [(2,)]
    launch((3,))
    launch((2,))
    assert gathered == [(2,), (3,)]
    launch((4,), c.ranks._replace(barrier=0))  # no barrier: the grids may differ
    assert gathered == [(2,), (3,)]


def test_a_rank_launching_another_grid_is_refused_before_the_pads(monkeypatch: pytest.MonkeyPatch) -> None:
    c = compiled()
    args = [symmetric(64, 64), torch.zeros(64, 64, dtype=torch.bfloat16), symmetric(5, dtype=torch.int32), 1.0]
    maps = tma_operands(c.params, c.tma_maps)
    monkeypatch.setattr(ranks, "_gather_grids", lambda grid, group: [tuple(grid), (3,)])
    for _ in range(2):  # not taken as checked
        with pytest.raises(TkcLaunchError, match=r"kernel 'ranked' .* the grids differ: rank 0: \(2,\), rank 1: "
                                                 r"\(3,\)"):
            ranks.prepare(c.ranks, c.name, c.params, args, maps, (2,), CPU, held=lambda: 10**6, encode=fake_map)
    assert not ranks._pads and not ranks._grids_checked


GRID_WORKER = """
import os, sys
import torch.distributed as dist
from tkc.errors import TkcLaunchError
from tkc.runtime import ranks

dist.init_process_group("gloo")
rank = dist.get_rank()
ranks._same_grid("k", (4, 2), None)  # the same on both ranks: passes
try:
    ranks._same_grid("k", (5 + rank, 2), None)
except TkcLaunchError as e:
    print(e, flush=True)
    os._exit(3)  # not sys.exit: gloo's threads may abort the interpreter's teardown (SIGABRT)
"""


def test_the_grid_check_over_a_real_process_group(tmp_path: Path) -> None:
    """Two processes on gloo: the second launch's grids differ, and both ranks say so."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    procs = [subprocess.Popen([sys.executable, "-c", GRID_WORKER], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=tmp_path,
                              env={**env, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port)}) for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 3, out
        assert "kernel 'k' meets at barrier_all() across ranks" in out and \
            "the grids differ: rank 0: (5, 2), rank 1: (6, 2)" in out, out


def test_a_ranked_argument_outside_symmetric_memory_is_refused() -> None:
    c = compiled()
    args = [torch.zeros(64, 64, dtype=torch.bfloat16), torch.zeros(64, 64, dtype=torch.bfloat16),
            symmetric(5, dtype=torch.int32), 1.0]
    with pytest.raises(TkcLaunchError, match=r"a: a tensor @ ranks must be in symmetric memory .* "
                                             r"tkc.symmetric_empty\(shape, dtype\)"):
        ranks.prepare(c.ranks, c.name, c.params, args, tma_operands(c.params, c.tma_maps), (1,), CPU, encode=fake_map)


def test_a_group_of_another_size_is_refused() -> None:
    c = compiled()
    args = [symmetric(64, 64), torch.zeros(64, 64, dtype=torch.bfloat16), symmetric(5, dtype=torch.int32), 1.0]
    maps = tma_operands(c.params, c.tma_maps)
    with pytest.raises(TkcLaunchError, match="a: its symmetric memory spans the 2 ranks of group world, but the "
                                             "launch runs on the 3 ranks of group world"):
        ranks.prepare(c.ranks, c.name, c.params, args, maps, (1,), CPU, group=Group(0, 3), encode=fake_map)
    with pytest.raises(TkcLaunchError, match="group world, but the launch runs on the 2 ranks of group tp"):
        ranks.prepare(c.ranks, c.name, c.params, args, maps, (1,), CPU, group=Group(0, 2, "tp"), encode=fake_map)
    args[2] = symmetric(5, dtype=torch.int32, group="tp")
    with pytest.raises(TkcLaunchError, match="allocated with different process groups"):
        ranks.prepare(c.ranks, c.name, c.params, args, maps, (1,), CPU, encode=fake_map)


def test_a_grid_larger_than_the_device_holds_is_refused_for_a_kernel_with_waits() -> None:
    c = compiled()
    args = [symmetric(64, 64), torch.zeros(64, 64, dtype=torch.bfloat16), symmetric(5, dtype=torch.int32), 1.0]
    maps = tma_operands(c.params, c.tma_maps)
    with pytest.raises(TkcLaunchError, match=r"kernel 'ranked' waits .* grid \(3,\) has 3 programs and this "
                                             r"device holds 2 of them at once"):
        ranks.prepare(c.ranks, c.name, c.params, args, maps, (3,), CPU, held=lambda: 2, encode=fake_map)
    ranks.check_resident("k", (2, 66), 132)


def test_without_torch_distributed_a_launch_says_how_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(TkcLaunchError, match="torch.distributed, which is not initialized: start one process per "
                                             "GPU with torchrun"):
        ranks._group(None)


def test_peers_must_share_a_host_and_reach_each_other() -> None:
    visible = {"gpu-a": 0, "gpu-b": 1}
    ranks.check_peers(0, [("h", "gpu-a"), ("h", "gpu-b")], visible, lambda i, j: True)
    ranks.check_peers(1, [("h", "gpu-a"), ("h", "gpu-b"), ("h", "gpu-hidden")], visible, lambda i, j: True)
    with pytest.raises(TkcLaunchError, match="rank 1's GPU \\(cuda:1\\) cannot access rank 0's \\(cuda:0\\)"):
        ranks.check_peers(1, [("h", "gpu-a"), ("h", "gpu-b")], visible, lambda i, j: False)
    with pytest.raises(TkcLaunchError, match="rank 1 runs on host h2 and rank 0 on h"):
        ranks.check_peers(0, [("h", "gpu-a"), ("h2", "gpu-b")], visible, lambda i, j: True)


def test_the_launch_appends_the_rank_parameters_and_passes_ranked_maps_by_address(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole parameter list of a multi-GPU launch, in ABI order, with the driver faked."""
    c = compiled()
    a, flags = symmetric(100, 64), symmetric(5, dtype=torch.int32)
    b = torch.zeros(64, 32, dtype=torch.bfloat16)
    args = [a, b, flags, 0.5]
    seen = {}

    class Fn:
        def prepare(self, grid, threads, smem, params):
            seen.update(grid=grid, threads=threads, params=params)
            return "prepared"

        def launcher(self, prepared):
            return lambda stream: seen.update(stream=stream)

    b_map = object()
    monkeypatch.setattr(launch_mod, "_function", lambda compiled, index: Fn())
    monkeypatch.setattr(launch_mod, "_resident", lambda compiled, fn, props: 1000)
    monkeypatch.setattr(ranks, "_encode", fake_map)
    monkeypatch.setattr("tkc.runtime.tensormap.encode_tiled", lambda t, box, swizzle, name, keep: b_map)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: None)
    params, maps = c.params, tma_operands(c.params, c.tma_maps)
    values = launch_mod.to_ctypes(launch_mod.param_values(params, args))
    key = ("key",)
    grid = launch_mod._launch_ranks(c, c.ranks, params, args, maps, values, (2,), CPU, 7, None, key, [1, 2, 3])
    assert grid == (2,) and seen["stream"] == 7 and seen["threads"] == 128
    got = seen["params"]
    n = len(values)  # a: address, 2 sizes, 2 strides; b: the same; flags: 3; alpha: 1
    assert n == 5 + 5 + 3 + 1 and got[:n] == values
    kinds = [type(v) for v in got[n:]]
    assert kinds == [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                     object, ctypes.c_uint64]
    assert [v.value for v in got[n:n + 2]] == [0, 2]
    assert u64s(got[n + 2].value, 2) == [a.data_ptr(), PEER_BASE * 2]
    assert u64s(got[n + 3].value, 2) == [flags.data_ptr(), PEER_BASE * 2]
    assert got[n + 5] is b_map  # b's map by value, as on one GPU
    assert u64s(got[n + 6].value, 1) == [a.data_ptr()] and u64s(got[n + 6].value + 128, 1) == [PEER_BASE * 2]
    # Kept for the very same tensors, until the symmetric buffers change.
    plan = launch_mod.launch_state(c).plans[key]
    assert plan.addresses is None and plan.rebase([1, 2, 3]) and not plan.rebase([1, 2, 4])
    symmetric(8)
    assert not plan.rebase([1, 2, 3])


def _enable(events: list[str]) -> Any:
    return lambda name: events.append(f"enable {name}")


def _deprecated_enable(events: list[str]) -> Any:
    from typing_extensions import deprecated

    return deprecated("There is no need to call this function anymore.", category=FutureWarning)(_enable(events))


@pytest.mark.parametrize("enable", [_enable, _deprecated_enable, None], ids=["needed", "deprecated", "removed"])
def test_symmetric_zeros_land_before_the_rendezvous(monkeypatch: pytest.MonkeyPatch, enable: Any) -> None:
    """Allocation through torch's symmetric memory (faked): zeros written and waited for, the
    peers checked, then the rendezvous with the group's name, and the buffer remembered.  The
    group is enabled first only where torch still needs it: a deprecated enable_symm_mem_for_group
    (torch 2.11 on: a FutureWarning per rank) or none is not called."""
    from torch.distributed import _symmetric_memory as symm_mem

    monkeypatch.undo()  # this test's own fakes only
    monkeypatch.setattr(ranks, "_buffers", [])
    events: list[str] = []
    handle = SimpleNamespace(rank=1, world_size=2, buffer_ptrs=[PEER_BASE, 0])

    def empty(shape, dtype, device):
        t = torch.full(shape, 7, dtype=dtype)
        handle.buffer_ptrs[1] = t.data_ptr()
        return t

    def rendezvous(t, group):
        events.append(f"rendezvous {group} zeros={bool((t == 0).all())}")
        return handle

    class Stream:
        def synchronize(self) -> None:
            events.append("synchronize")

    monkeypatch.setattr(symm_mem, "empty", empty)
    monkeypatch.setattr(symm_mem, "rendezvous", rendezvous)
    if enable is None:
        monkeypatch.delattr(symm_mem, "enable_symm_mem_for_group", raising=False)
    else:
        monkeypatch.setattr(symm_mem, "enable_symm_mem_for_group", enable(events), raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: Stream())
    monkeypatch.setattr(ranks, "_peer_check", lambda group, device: events.append(f"peers {group.group_name}"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deprecated enable called would raise here
        t = ranks.symmetric_zeros((3, 4), torch.float32, group=Group(1, 2, "tp"), device="cpu")
    enabled = ["enable tp"] if enable is _enable else []
    assert events == ["synchronize", "peers tp", *enabled, "rendezvous tp zeros=True"]
    buf = ranks.find(t[1:].data_ptr(), 16, -1)
    assert buf is not None and buf.group == "tp" and ranks.peer_addresses(t[1].data_ptr(), buf)[0] == PEER_BASE + 16
