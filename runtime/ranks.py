"""Several GPUs: symmetric memory and what a multi-GPU kernel's launch passes beyond its
parameters (docs/hopper.md §4, items 2-3; docs/ranks.md).

One process per GPU (``torchrun``), process groups from ``torch.distributed`` (NCCL), and
peer-addressable memory from PyTorch's symmetric memory (``torch.distributed._symmetric_memory``:
``empty`` allocates, ``rendezvous`` maps every rank's buffer into every process and gives
their addresses, ``buffer_ptrs``).  tkc has no launcher or rendezvous of its own.

Owns: :func:`symmetric_empty` / :func:`symmetric_zeros` (allocation and rendezvous, remembering
each buffer's handle so a launch finds, for any tensor inside one, its peers' addresses:
:func:`peer_addresses`), :func:`init_process_group` (what ``tkc run`` and the benchmarks
call under torchrun, NVLink multicast kept off), and :func:`prepare`: a launch's rank, number
of ranks, per ``@ ranks`` tensor a device array of its peers' addresses, per ranked
``tma_maps`` entry a device array of every rank's tensor map, the barrier pads (a symmetric
``u32`` array per device and group, grown on every rank together, never reset), with the
checks before any of it reaches the GPU (a ranked argument outside symmetric memory, a group
of another size than the buffer's, GPUs that cannot reach each other, a grid of a kernel with
waits that the device cannot hold at once).

Must not: launch (``tkc.runtime.launch`` does, with the values :func:`prepare` returns), create
multicast objects, or import torch at import time.  Device arrays are cached by their bytes,
so a launch over the same tensors allocates nothing.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from tkc.errors import TkcLaunchError
from tkc.target import TENSOR_MAP_BYTES

__all__ = ["NO_MULTICAST", "RankLaunch", "SymmetricBuffer", "check_grids", "check_peers", "check_resident", "find",
           "generation", "init_process_group", "pad_counters", "peer_addresses", "prepare", "rank_values", "register",
           "symmetric_empty", "symmetric_zeros"]

#: Kept set in every process: NVLink multicast stays off on the machines tkc runs on (docs/ranks.md).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

_MIN_PAD = 4096  # counters of a first barrier pad; it grows by doubling


def no_multicast() -> None:
    """Set :data:`NO_MULTICAST` where the environment does not say otherwise (before NCCL or
    symmetric memory start)."""
    for name, value in NO_MULTICAST.items():
        os.environ.setdefault(name, value)


def init_process_group() -> tuple[int, int]:
    """Under ``torchrun``: multicast off, this process's GPU ``LOCAL_RANK`` made current, and the
    default process group (NCCL) initialized unless it is; returns (rank, world size)."""
    no_multicast()
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    return dist.get_rank(), dist.get_world_size()


# ------------------------------------------------------------ symmetric memory
class SymmetricBuffer(NamedTuple):
    """A rendezvoused symmetric buffer as tkc remembers it: this process's bytes
    ``start .. end`` on device ``device``, the torch handle (``rank``, ``world_size``,
    ``buffer_ptrs``) and the name of the group it was made with."""

    device: int
    start: int
    end: int
    handle: Any
    group: str


_buffers: list[SymmetricBuffer] = []  # few: one per symmetric allocation
_generation = [0]  # bumped whenever a buffer or a barrier pad comes or goes: a kept launch is stale


def generation() -> int:
    """A number that changes whenever the symmetric buffers tkc knows, or a barrier pad, change."""
    return _generation[0]


def register(tensor: Any, handle: Any, group: str) -> None:
    """Remember that ``tensor``'s memory (its whole storage) is the buffer of ``handle``, the
    result of ``rendezvous(tensor, group)``: for a tensor allocated with torch's
    ``symm_mem.empty`` rather than :func:`symmetric_empty`.  Forgotten when ``tensor`` is
    collected."""
    start = int(tensor.data_ptr())
    end = start + int(tensor.untyped_storage().nbytes())
    device = tensor.device.index if tensor.device.index is not None else -1
    _forget(device, start, end)
    buf = SymmetricBuffer(device, start, end, handle, str(group))
    _buffers.append(buf)
    _generation[0] += 1
    weakref.finalize(tensor, _drop, buf)


def _forget(device: int, start: int, end: int) -> None:
    for b in [b for b in _buffers if b.device == device and b.start < end and start < b.end]:
        _drop(b)


def _drop(buf: SymmetricBuffer) -> None:
    if buf in _buffers:
        _buffers.remove(buf)
        _generation[0] += 1


def find(address: int, nbytes: int, device: int) -> SymmetricBuffer | None:
    """The symmetric buffer holding the ``nbytes`` at ``address`` on ``device``, if any."""
    for b in _buffers:
        if b.device == device and b.start <= address and address + nbytes <= b.end:
            return b
    return None


def peer_addresses(address: int, buf: SymmetricBuffer) -> list[int]:
    """Every rank's address of what lies at ``address`` in this rank's copy of ``buf``: the
    same offset into each rank's buffer (``buffer_ptrs[r] + address - buffer_ptrs[rank]``)."""
    h = buf.handle
    ptrs = [int(p) for p in h.buffer_ptrs]
    offset = address - ptrs[h.rank]
    size = getattr(h, "buffer_size", None)
    if offset < 0 or size is not None and offset >= size:
        raise TkcLaunchError(f"the tensor at {address:#x} is not inside its symmetric buffer ({ptrs[h.rank]:#x}, "
                             f"{size} bytes); was it registered with another buffer's handle?")
    return [p + offset for p in ptrs]


def _group(group: Any) -> Any:
    """The process group ``group`` names: None, the default one; a name; or a group itself (a
    ProcessGroup, or anything with ``rank()``, ``size()`` and ``group_name``).  torch.distributed
    must be initialized to name one."""
    if group is not None and not isinstance(group, str):
        return group
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise TkcLaunchError("multi-GPU kernels and symmetric memory run under torch.distributed, which is not "
                             "initialized: start one process per GPU with torchrun and call "
                             "torch.distributed.init_process_group('nccl') (or "
                             "tkc.runtime.ranks.init_process_group()) first")
    if group is None:
        return dist.group.WORLD
    from torch.distributed import distributed_c10d as c10d

    return c10d._resolve_process_group(group)


def symmetric_empty(shape: Sequence[int] | int, dtype: Any, group: Any = None, device: Any = None) -> Any:
    """A CUDA tensor in symmetric memory, on every rank of ``group`` (default: the default
    process group): every rank calls this with the same shape and dtype, in the same order
    (a collective).  It can be the argument of a ``@ ranks`` parameter, or hold views that are."""
    return _symmetric(shape, dtype, group, device, zero=False)


def symmetric_zeros(shape: Sequence[int] | int, dtype: Any, group: Any = None, device: Any = None) -> Any:
    """:func:`symmetric_empty`, zeroed on every rank before any rank returns (flags start at zero)."""
    return _symmetric(shape, dtype, group, device, zero=True)


def _symmetric(shape: Sequence[int] | int, dtype: Any, group: Any, device: Any, zero: bool) -> Any:
    no_multicast()
    import torch
    from torch.distributed import _symmetric_memory as symm_mem

    pg = _group(group)
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    shape = (shape,) if isinstance(shape, int) else tuple(int(n) for n in shape)
    t = symm_mem.empty(shape, dtype=dtype, device=device)
    if zero:
        t.zero_()
        # Done before the rendezvous, which no rank leaves before every rank reached it: no
        # peer can write into this rank's copy before its zeros land.
        torch.cuda.current_stream(device).synchronize()
    _peer_check(pg, device)
    # Older torch needs the group enabled before a rendezvous.  Later torch finds the group by
    # its name, marks the call deprecated (PEP 702's __deprecated__: 2.11 prints a FutureWarning
    # on every rank when it is called) and then removes it: neither is called.
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None and getattr(enable, "__deprecated__", None) is None:
        enable(pg.group_name)
    handle = symm_mem.rendezvous(t, pg.group_name)
    register(t, handle, pg.group_name)
    return t


# ----------------------------------------------------------- which GPUs can meet
_peers_checked: set[tuple[str, int]] = set()


def check_peers(me: int, ranks: Sequence[tuple[str, str]], visible: dict[str, int],
                can_access: Callable[[int, int], bool]) -> None:
    """Every rank's GPU (``ranks[r]`` = (host, GPU uuid)) must be reachable from rank ``me``'s:
    on this host, and peer-accessible (``can_access(mine, theirs)`` on the device indices
    ``visible`` maps uuids to; a GPU this process does not see is left to the driver)."""
    host, mine = ranks[me]
    for r, (h, uuid) in enumerate(ranks):
        if h != host:
            raise TkcLaunchError(f"rank {r} runs on host {h} and rank {me} on {host}: multi-GPU kernels reach "
                                 f"peers' memory over NVLink/PCIe within one host")
        if r != me and uuid in visible and mine in visible and uuid != mine \
                and not can_access(visible[mine], visible[uuid]):
            raise TkcLaunchError(f"rank {me}'s GPU (cuda:{visible[mine]}) cannot access rank {r}'s "
                                 f"(cuda:{visible[uuid]}) as a peer (torch.cuda.can_device_access_peer is False); "
                                 f"multi-GPU kernels need GPUs with peer access (NVLink or PCIe P2P)")


def _peer_check(group: Any, device: Any) -> None:
    """:func:`check_peers` for ``group`` (a group or its name) on ``device``, once (a collective:
    the first symmetric allocation or launch of every rank in the group does it)."""
    key = (group if isinstance(group, str) else group.group_name, device.index)
    if key in _peers_checked:
        return
    import torch
    import torch.distributed as dist

    pg = _group(group)
    uuid = lambda i: str(torch.cuda.get_device_properties(i).uuid)  # noqa: E731
    ranks: list[Any] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(ranks, (socket.gethostname(), uuid(device.index)), group=pg)
    visible = {uuid(i): i for i in range(torch.cuda.device_count())}
    check_peers(dist.get_rank(pg), ranks, visible, torch.cuda.can_device_access_peer)
    _peers_checked.add(key)


def check_grids(name: str, grids: Sequence[Sequence[int]]) -> None:
    """Every rank launches kernel ``name`` (one with barriers) with one grid (``grids[r]`` is
    rank ``r``'s): program ``p`` meets program ``p`` of every rank, and counts on the pads'
    slots of ``p``, so a program one rank lacks leaves its peers waiting and the pads' counters
    out of step for every later kernel."""
    first = tuple(grids[0])
    if any(tuple(g) != first for g in grids):
        got = ", ".join(f"rank {r}: {tuple(g)}" for r, g in enumerate(grids))
        raise TkcLaunchError(f"kernel '{name}' meets at barrier_all() across ranks, so every rank launches it with "
                             f"the same grid (program p meets program p of every rank), but the grids differ: {got}; "
                             f"pass every rank arguments that give one grid")


def _gather_grids(grid: Sequence[int], group: Any) -> list[tuple[int, ...]]:
    """Every rank's ``grid`` (a collective on ``group``, a group or its name)."""
    import torch.distributed as dist

    pg = _group(group)
    grids: list[Any] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(grids, tuple(grid), group=pg)
    return grids


_grids_checked: set[tuple[str, str, tuple[int, ...]]] = set()  # (kernel, group, grid) every rank launched


def _same_grid(name: str, grid: Sequence[int], group: Any) -> None:
    """:func:`check_grids` for a launch of kernel ``name`` with ``grid`` on ``group`` (a group,
    its name, None: the default one): a
    collective at the first launch of each (kernel, group, grid), on the checked path only.
    Whether a rank gathers depends on the grids it launched before, not on its cached
    launches, so while every rank has launched the same grids every rank gathers in the same
    launch (the first one that differs is caught, unless one rank's grid is one it launched
    before: that rank goes on, and the other waits in the gather)."""
    key = (name, group if isinstance(group, str) else _group(group).group_name, tuple(grid))
    if key in _grids_checked:
        return
    check_grids(name, _gather_grids(grid, group))
    _grids_checked.add(key)


# ---------------------------------------------------------------- a launch
class RankLaunch(NamedTuple):
    """What a multi-GPU launch passes beyond the parameters: ``values``, the ``(PTX type,
    value)`` of item 2 of docs/hopper.md §4 in order (rank, num_ranks, peers..., pads);
    ``maps``, per ranked ``tma_maps`` entry (its index) the device address of its per-rank
    maps; ``keep``, the device arrays those addresses point into."""

    values: list[tuple[str, int]]
    maps: dict[int, int]
    keep: list[Any]


def rank_values(rank: int, num_ranks: int, peers: Sequence[int], pads: int | None) -> list[tuple[str, int]]:
    """Item 2 of the kernel ABI in order: ``u32 rank``, ``u32 num_ranks``, one ``u64`` device
    address of a peers array per ``@ ranks`` tensor, ``u64 pads`` for a kernel with barriers."""
    out = [("u32", rank), ("u32", num_ranks), *[("u64", p) for p in peers]]
    return out + [("u64", pads)] if pads is not None else out


def pad_counters(grid: Sequence[int], num_ranks: int, have: int) -> int:
    """How many counters a barrier pad needs for a launch of ``grid`` (0: the one of ``have``
    counters will do): one per (program, rank), doubling from ``_MIN_PAD``."""
    need = math.prod(grid) * num_ranks
    if need <= have:
        return 0
    n = max(have, _MIN_PAD)
    while n < need:
        n *= 2
    return n


def check_resident(name: str, grid: Sequence[int], held: int) -> None:
    """A kernel whose programs wait for other programs needs all of them resident at once: its
    grid at most the ``held`` programs the device runs at once."""
    programs = math.prod(grid)
    if programs > held:
        raise TkcLaunchError(f"kernel '{name}' waits for flags or meets at barriers across ranks, so all its programs "
                             f"must run at once, but its grid {tuple(grid)} has {programs} programs and this device "
                             f"holds {held} of them at once: use larger tiles or a persistent grid (num_sms())")


_arrays: dict[tuple[int, bytes], Any] = {}  # (device, bytes) -> a device tensor holding them
_MAX_ARRAYS = 256
_pads: dict[tuple[int, str, int], tuple[bytes, int]] = {}  # (device, group, roles) -> (pads' addresses, counters)
_retired: list[Any] = []  # every pad, kept: a peer's kernel may still be adding to a replaced one


def _device_array(data: bytes, device: Any) -> Any:
    """A device tensor holding ``data`` (128-byte aligned), made once per (device, bytes)."""
    key = (device.index if device.index is not None else -1, data)
    t = _arrays.get(key)
    if t is None:
        import torch

        if len(_arrays) >= _MAX_ARRAYS:
            _arrays.clear()  # launches in flight keep theirs (a kept launch holds its arrays)
        room = torch.empty(len(data) + TENSOR_MAP_BYTES - 1, dtype=torch.uint8, device=device)
        skip = -room.data_ptr() % TENSOR_MAP_BYTES  # none from torch's CUDA allocator (512-byte blocks)
        t = _arrays[key] = room[skip:skip + len(data)]
        t.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    return t


def _u64s(values: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def prepare(abi: Any, name: str, params: Sequence[Any], args: Sequence[Any], maps: Sequence[tuple[int, tuple, int]],
            grid: Sequence[int], device: Any, group: Any = None, held: Callable[[], int] | None = None,
            encode: Callable[..., bytes] | None = None) -> RankLaunch:
    """The extra parameters of a launch of the multi-GPU kernel ``name`` (its
    :class:`tkc.compiler.RankAbi` ``abi``) on ``args`` with ``grid`` on ``device``, checked.
    ``maps`` are the launch's TMA operands (:func:`tkc.runtime.launch.tma_operands`);
    ``group`` defaults to the one the ``@ ranks`` arguments were allocated with, else the
    default group; ``held()`` is how many of the kernel's programs the device runs at once
    (asked of a kernel with waits); ``encode(tensor, address, box, swizzle, name)`` makes one
    128-byte tensor map (default: the driver's, of the layout :func:`tiled_params` checks)."""
    dev = device.index if device.index is not None else -1
    bufs = {i: _buffer(params[i][0], args[i], dev) for i in abi.tensors}
    group, rank, num_ranks = _launch_group(group, {params[i][0]: b for i, b in bufs.items()})
    if abi.barrier:
        _same_grid(name, grid, group)  # before the pads, whose growth the grid decides on every rank
    if abi.waits and held is not None:
        check_resident(name, grid, held())
    if bufs:
        _peer_check(group, device)
    keep: list[Any] = []

    def on_device(data: bytes) -> int:
        keep.append(_device_array(data, device))
        return int(keep[-1].data_ptr())

    peers = [on_device(_u64s(peer_addresses(int(args[i].data_ptr()), b))) for i, b in bufs.items()]
    pads = on_device(_barrier_pads(grid, num_ranks, group, device, abi.barrier)) if abi.barrier else None
    tensor_maps = {}
    for n in abi.maps:
        i, box, swizzle = maps[n]
        tensor_maps[n] = on_device(b"".join((encode or _encode)(args[i], a, box, swizzle, params[i][0])
                                            for a in peer_addresses(int(args[i].data_ptr()), bufs[i])))
    return RankLaunch(rank_values(rank, num_ranks, peers, pads), tensor_maps, keep)


def _buffer(name: str, x: Any, device: int) -> SymmetricBuffer:
    """The symmetric buffer the ``@ ranks`` argument ``name`` lies in."""
    buf = find(int(x.data_ptr()), _extent(x), device)
    if buf is None:
        raise TkcLaunchError(f"{name}: a tensor @ ranks must be in symmetric memory (every rank's copy reachable from "
                             f"every GPU), but this one is not: allocate it with tkc.symmetric_empty(shape, dtype) "
                             f"(or symmetric_zeros) on every rank, in the same order, and pass it or a view of it")
    return buf


def _launch_group(group: Any, bufs: dict[str, SymmetricBuffer]) -> tuple[Any, int, int]:
    """The launch's group (a group, or the name of the buffers' one: resolved only where a
    collective needs it), this rank and the number of ranks; every buffer must span it."""
    if group is None and bufs:
        first = next(iter(bufs.values()))
        if any(b.group != first.group for b in bufs.values()):
            raise TkcLaunchError("the tensors @ ranks were allocated with different process groups (" +
                                 ", ".join(f"{n}: {b.group}" for n, b in bufs.items()) + "); pass the launch's group")
        group, rank, size, name = first.group, first.handle.rank, first.handle.world_size, first.group
    else:
        group = _group(group)
        rank, size, name = group.rank(), group.size(), group.group_name
    for arg, b in bufs.items():
        if b.handle.world_size != size or b.group != name:
            raise TkcLaunchError(f"{arg}: its symmetric memory spans the {b.handle.world_size} ranks of group "
                                 f"{b.group}, but the launch runs on the {size} ranks of group {name}")
    return group, rank, size


def _extent(x: Any) -> int:
    """The bytes from a tensor's first element to its last (0 for an empty one)."""
    if 0 in tuple(x.shape):
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride()))) * x.element_size()


def _encode(tensor: Any, address: int, box: tuple, swizzle: int, name: str) -> bytes:
    """One 128-byte tensor map of ``tensor``'s layout at ``address`` (a peer's copy)."""
    from tkc.runtime import driver
    from tkc.runtime.tensormap import TensorMap, tiled_params

    p = tiled_params(tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, address, box, swizzle, name=name)
    driver.context()
    tm = TensorMap(p)
    tm.encode(name=name)
    return tm.raw


def _barrier_pads(grid: Sequence[int], num_ranks: int, group: Any, device: Any, roles: int = 1) -> bytes:
    """Every rank's barrier pad address for ``group`` (a group or its name) on ``device`` for
    kernels whose barriers meet ``roles`` roles of a program, the pad grown first if ``grid``
    needs more counters: every rank launches the same kernels with the same grids, so every
    rank grows its pad in the same launch (a collective).  A pad serves one role count: a
    barrier's target is the next multiple of it, which a counter another count left odd would
    let one role pass alone."""
    key = (device.index if device.index is not None else -1, group if isinstance(group, str) else group.group_name,
           roles)
    addresses, have = _pads.get(key, (b"", 0))
    n = pad_counters(grid, num_ranks, have)
    if n:
        import torch

        pad = symmetric_zeros((n,), torch.int32, group, device)
        _retired.append(pad)  # never freed: a pad outlives every kernel that may count in it
        addresses = _u64s(peer_addresses(int(pad.data_ptr()), find(int(pad.data_ptr()), 4 * n, key[0])))
        _pads[key] = (addresses, n)
        _generation[0] += 1
    return addresses
