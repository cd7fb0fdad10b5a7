"""Launching a compiled kernel on torch CUDA tensors.

Owns: the order of a launch (check every argument, evaluate the grid, build the
parameter list of docs/hopper.md §4, with a multi-GPU kernel's rank, peers, barrier pads and
per-rank tensor maps from ``tkc.runtime.ranks``, load the image once per device, set dynamic
shared memory, ``cuLaunchKernelEx``), the host-side encoding of each parameter
(:func:`param_values`, pure Python), the tensor maps of the kernel's ``tma_maps``, the
check that the device is the one the kernel was compiled for, and what is kept of a
kernel between launches (:class:`LaunchState`: its loaded function per device and its
checked launch plans, which a launch with tensors of the same shapes at other addresses
reuses, found by a key of the arguments or, the last one, by a :class:`Match`), beside the
``Compiled``, which stays a plain result of compilation.

Must not: compile anything (``tkc.compiler``), choose a box or a swizzle (they come from
the kernel's ``tma_maps``, which the passes set), copy or convert tensors (a wrong one is
a :class:`~tkc.errors.TkcLaunchError`), or reach the driver before every check passed.
"""

from __future__ import annotations

import ctypes
import math
import operator
import weakref
from collections.abc import Sequence
from threading import get_ident
from typing import Any, NamedTuple

from tkc import signature
from tkc.errors import TkcLaunchError, TkcUsageError
from tkc.ir.types import ScalarType, TensorType
from tkc.runtime import driver

__all__ = ["LaunchState", "Match", "TensorArg", "address_slots", "call_key", "launch", "launch_planned", "launch_ranks",
           "launch_state", "param_values", "plan_of", "rematch", "to_ctypes", "tma_operands", "swizzle_enum"]


class TensorArg(NamedTuple):
    """What the parameter list needs of a tensor: its address, shape and strides (elements)."""

    data_ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


def swizzle_enum(swizzle_bytes: int) -> int:
    """``CU_TENSOR_MAP_SWIZZLE_*`` for a swizzle width in bytes (0 = none), inverting the
    runtime's own enum table so the two cannot disagree."""
    from tkc.runtime.tensormap import SWIZZLE_BYTES

    by_bytes = {b or 0: e for e, b in SWIZZLE_BYTES.items()}
    if swizzle_bytes not in by_bytes:
        raise TkcLaunchError(f"tma_maps: swizzle of {swizzle_bytes} B is not one of 0, 32, 64, 128")
    return by_bytes[swizzle_bytes]


def tma_operands(params: Sequence[signature.Param], tma_maps: Sequence[Any]) -> list[tuple[int, tuple[int, ...], int]]:
    """Each ``tma_maps`` entry as (parameter index, box innermost first as the driver takes
    it, swizzle enum); the entry's box is outermost first, one extent per tensor axis."""
    out = []
    for entry in tma_maps:
        index, box, swizzle = entry
        if not 0 <= index < len(params) or not isinstance(params[index][1], TensorType):
            raise TkcLaunchError(f"tma_maps entry {entry} does not name a tensor parameter")
        rank = params[index][1].rank
        if len(box) != rank:
            raise TkcLaunchError(f"tma_maps entry {entry}: {len(box)} box extents for a rank-{rank} tensor")
        out.append((index, tuple(int(b) for b in reversed(box)), swizzle_enum(swizzle)))
    return out


def param_values(params: Sequence[signature.Param], args: Sequence[Any]) -> list[tuple[str, int | float]]:
    """The kernel parameters before the tensor maps, as (PTX type, value) in order
    (docs/hopper.md §4): per tensor its address (``u64``), one ``u32`` size per axis and one
    ``u64`` stride (elements) per axis; ``f32`` scalars and other floats as ``f32``; ``i32``
    and ``i1`` as ``u32``, ``i64`` as ``u64``.  Tensors come as :class:`TensorArg` (or anything with
    ``data_ptr()``, ``shape`` and ``stride()``), scalars as Python numbers."""
    out: list[tuple[str, int | float]] = []
    for (name, t), x in zip(params, args):
        if isinstance(t, TensorType):
            if not isinstance(x, TensorArg):
                x = TensorArg(int(x.data_ptr()), tuple(x.shape), tuple(x.stride()))
            out.append(("u64", x.data_ptr))
            for axis, n in enumerate(x.shape):
                signature.check_axis(name, axis, n)
                out.append(("u32", int(n)))
            out += [("u64", int(s)) for s in x.strides]
        elif isinstance(t, ScalarType):
            v = signature.check_scalar(name, t.dtype, x)
            if t.dtype.is_bool:
                out.append(("u32", int(bool(v))))
            elif t.dtype.is_int and t.dtype.bits == 64:
                out.append(("u64", int(v) & 0xFFFFFFFFFFFFFFFF))  # the i64's two's-complement bits
            elif t.dtype.is_int:
                out.append(("u32", int(v) & 0xFFFFFFFF))  # the i32's two's-complement bits
            else:
                out.append(("f32", float(v)))  # narrower floats are rounded in the kernel
        else:
            raise TkcLaunchError(f"{name}: parameters of type {t} cannot be passed at launch")
    return out


def address_slots(params: Sequence[signature.Param]) -> list[int]:
    """Where each tensor's address is in :func:`param_values`' list, in parameter order: a
    tensor takes one entry for its address and two per axis, a scalar one."""
    out, at = [], 0
    for _, t in params:
        if isinstance(t, TensorType):
            out.append(at)
            at += 1 + 2 * t.rank
        else:
            at += 1
    return out


_CTYPES = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32, "f32": ctypes.c_float}


def to_ctypes(values: Sequence[tuple[str, int | float]]) -> list[Any]:
    """:func:`param_values` as the ctypes values ``driver.Function.launch`` takes."""
    return [_CTYPES[kind](v) for kind, v in values]


def _check_device(target: str, device: Any) -> None:
    import torch

    from tkc.target import target as lookup_target

    want = lookup_target(target).capability
    have = torch.cuda.get_device_capability(device)
    if tuple(have) != want:
        raise TkcLaunchError(f"the kernel is compiled for {target} (compute capability {want[0]}.{want[1]}) but "
                             f"{device} ({torch.cuda.get_device_name(device)}) is {have[0]}.{have[1]}")


class LaunchState:
    """What the runtime keeps of one :class:`~tkc.compiler.Compiled` between launches (never
    saved with it): the kernel's driver function per device (its image loaded once), the
    checked launch plans (:class:`_Plan`), at most ``_MAX_PLANS``, the last one launched, and
    ``compiled.ranks``."""

    __slots__ = ("functions", "plans", "ranks", "last", "writes")

    def __init__(self) -> None:
        self.functions: dict[int, driver.Function] = {}
        self.plans: dict[tuple, _Plan] = {}
        self.ranks: Any = _UNKNOWN  # compiled.ranks, once asked
        self.last: _Plan | None = None  # the plan of the last launch, tried first (its ``match``)
        self.writes: frozenset[int] | None = None  # the tensor parameters the kernel writes, once asked


_UNKNOWN = object()

# id(compiled) -> its LaunchState, dropped when the Compiled is collected.  Keyed by identity,
# not by the cache key: a copy with other PTX (dataclasses.replace) is another kernel.
_states: dict[int, LaunchState] = {}


def launch_state(compiled: Any) -> LaunchState:
    """The runtime's state of ``compiled``, made on first use."""
    state = _states.get(id(compiled))
    if state is None:
        state = _states.setdefault(id(compiled), LaunchState())
        weakref.finalize(compiled, _states.pop, id(compiled), None)
    return state


def _function(compiled: Any, device_index: int) -> Any:
    """The kernel's driver function on this device: its image loaded once (the cubin when
    there is one, else the PTX, which the driver JIT-compiles), dynamic smem allowed."""
    functions = launch_state(compiled).functions
    fn = functions.get(device_index)
    if fn is None:
        if "cubin" in compiled.asm:
            module = driver.Module.load(compiled.asm["cubin"], "cubin")
        elif "ptx" in compiled.asm:
            module = driver.Module.load(compiled.asm["ptx"], "ptx")
        else:
            raise TkcUsageError(f"kernel '{compiled.name}' has neither a cubin nor PTX to load; compile it "
                                "past the ptx stage")
        fn = module.function(compiled.name)
        if compiled.smem_bytes:
            fn.set_max_dynamic_shared(compiled.smem_bytes)
        functions[device_index] = fn
    return fn


_torch: Any = None  # torch, bound by the first checked launch: importing this module imports no torch


def launch(compiled: Any, args: Sequence[Any], grid: Any = None, stream: int | None = None) -> tuple[int, ...]:
    """Launch ``compiled`` (a :class:`tkc.compiler.Compiled` at the hopper stage or later) on
    ``args``, torch CUDA tensors and Python scalars in the kernel's parameter order, on
    torch's current device and stream (or ``stream``).  Every argument is checked before
    the driver is called.  ``grid`` defaults to the kernel's own ``grid(...)``; a grid with
    a zero extent launches nothing.  Returns the grid.

    A multi-GPU kernel (``compiled.ranks``) runs on the ranks of the process group its ``@ ranks``
    arguments were allocated with (:func:`tkc.runtime.ranks.symmetric_empty`), else of the
    default group (:func:`launch_ranks` takes another); every rank launches it."""
    done = launch_planned(compiled, args, grid, stream)
    return done if done is not None else _launch_checked(compiled, args, grid, stream)


def launch_planned(compiled: Any, args: Sequence[Any], grid: Any = None,
                   stream: int | None = None) -> tuple[int, ...] | None:
    """:func:`launch` of ``compiled`` when an earlier launch's plan fits ``args`` (returning the
    grid), else None, having launched nothing (the caller then takes :func:`launch`'s checked
    way, which says what is wrong, if anything).  A ``@tkc.kernel`` call tries it on the
    compilation of its constants before anything else.

    A plan fits arguments like those of the launch that made it: tensors of the same shapes,
    strides, dtypes and devices; the same scalars, device, grid and thread.  That launch
    checked them, computed the grid and built the parameters, so what is left is to check
    that the tensors' addresses are aligned, put them into the parameters and tensor maps,
    and call the driver: no synchronisation, allocation on the GPU or driver query, so a
    CUDA graph can capture it.  A program that allocates its outputs afresh at every call
    (``c = torch.empty(...)``) pays for the Python-side work once per shape."""
    state = _states.get(id(compiled))
    if state is None or not state.plans:
        return None
    last = state.last
    if last is not None and grid is None:
        match = last.match
        if match is not None:
            addresses = match.addresses(args)
            if addresses is not None and last.launch(addresses, match.device, stream):
                return last.grid
    # A plan exists only once a launch has initialised CUDA: torch's raw getter of the device,
    # without torch.cuda's checks.
    device = _torch._C._cuda_getDevice()
    addresses = []
    plan = state.plans.get(_plan_key(_torch, args, grid, device, addresses))
    if plan is None or not plan.launch(addresses, device, stream):
        return None
    if grid is None:
        if plan is last:
            rematch(plan, args, device)
        state.last = plan
    return plan.grid


def plan_of(compiled: Any, args: Sequence[Any], grid: Any = None) -> _Plan | None:
    """The plan a launch of ``compiled`` on ``args`` from this thread would take now (None if
    none), for a caller that keeps it and launches it again with :meth:`_Plan.launch` on
    arguments that differ at most in addresses, which it knows by a key of its own
    (:func:`call_key` of the arguments those depend on: a ``tkc.ops`` operator's inputs)."""
    state = _states.get(id(compiled))
    if state is None or _torch is None:
        return None
    return state.plans.get(_plan_key(_torch, args, grid, _torch._C._cuda_getDevice(), []))


def call_key(args: Sequence[Any], addresses: list[int]) -> tuple[int, tuple | None]:
    """(torch's current device, what a plan's key holds of ``args`` there), the tensors'
    addresses appended to ``addresses``: see :func:`plan_of`.  Only once a launch has been
    made (it binds torch)."""
    device = _torch._C._cuda_getDevice()
    return device, _plan_key(_torch, args, None, device, addresses)


class _Plan:
    """A checked launch, kept for later launches whose arguments differ from its own at most
    in the tensors' addresses.  ``addresses`` are those its parameters hold, in tensor order;
    ``slots`` the ``u64`` parameters the addresses go to, one ctypes array that the launch's
    parameter pointers point into (None where nothing is launched); ``maps`` a :class:`_MapSlot` per TMA
    operand; ``aligned`` the tensors whose address must be 16-byte aligned (all but empty
    ones, as :func:`tkc.runtime.args.check_layout` says); ``go(stream)`` launches the
    parameters (None for a grid with a zero extent, which launches nothing); ``stream(device)``
    is torch's current stream there; ``match`` recognises the arguments of the launch that
    made it (:class:`Match`; None: only its key does).

    :meth:`rebase` rewrites the parameters in place, so a plan belongs to the thread that made
    it (the thread is part of the plan's key): no other thread's addresses can reach the driver
    between one thread's rebasing and its launch."""

    __slots__ = ("grid", "go", "addresses", "slots", "maps", "aligned", "stream", "match", "rematches", "apart")

    def __init__(self, grid: tuple[int, ...], go: Any, addresses: list[int], slots: ctypes.Array | None = None,
                 maps: Sequence[_MapSlot] = (), aligned: Sequence[int] = (), stream: Any = None,
                 match: Match | None = None, apart: Sequence[tuple[int, int, int, int]] = ()):
        self.grid, self.go, self.addresses = grid, go, addresses
        self.slots, self.maps, self.aligned, self.stream = slots, maps, aligned, stream
        self.match, self.rematches = match, 0
        # (written tensor, other tensor, their byte spans), in tensor order: tensors that must
        # not overlap (tkc.signature.check_separate), checked on every new set of addresses
        self.apart = apart

    def launch(self, addresses: list[int], device: int, stream: int | None = None) -> bool:
        """Launch on the tensors at ``addresses`` on torch's current stream of ``device`` (or
        ``stream``); False, launching nothing, when one of them is not 16-byte aligned."""
        if addresses != self.addresses and not self.rebase(addresses):
            return False
        go = self.go
        if go is not None:
            go(self.stream(device) if stream is None else int(stream))
        return True

    def rebase(self, addresses: list[int]) -> bool:
        """Put the tensors at ``addresses`` into the parameters and tensor maps.  False,
        changing nothing, when one of them is not 16-byte aligned: the caller's full checks
        say which and why."""
        for i in self.aligned:
            if addresses[i] % 16:
                return False
        for w, j, span_w, span_j in self.apart:
            if addresses[w] < addresses[j] + span_j and addresses[j] < addresses[w] + span_w:
                return False  # a written tensor overlapping another: the checked launch says so
        if self.slots is not None:
            self.slots[:] = addresses
        for m in self.maps:
            m.point(addresses[m.tensor])
        self.addresses = addresses
        return True


_MAX_MAPS = 8  # per TMA operand of a plan; the caching allocator hands out a few addresses again and again


def _apart(tensors: Sequence[int], writes: frozenset[int], args: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
    """:attr:`_Plan.apart` of a launch on ``args`` (``tensors``: the tensor parameters' positions)."""
    spans = [hi - lo for lo, hi in (signature.byte_range(args[i]) for i in tensors)]
    return tuple((a, b, spans[a], spans[b]) for a, i in enumerate(tensors) if i in writes
                 for b, k in enumerate(tensors) if b != a and spans[a] and spans[b] and not (k in writes and b < a))


class _MapSlot:
    """A TMA operand of a plan: the launch parameter ``ptrs[index]`` points to the tensor map of
    the tensor at position ``tensor`` (in the plan's tensor order), one map per address the
    operand has been at (at most ``_MAX_MAPS``), so a launch on a tensor at an address seen
    before costs no driver call, and one at a new address a copy of the map re-based there.
    The driver copies the parameters at each launch (into the stream or the graph being
    captured), so a map may change once its launch call has returned."""

    __slots__ = ("tensor", "name", "ptrs", "index", "base", "maps")

    def __init__(self, tensor: int, name: str, tm: Any, ptrs: Any, index: int):
        self.tensor, self.name, self.ptrs, self.index = tensor, name, ptrs, index
        self.base = tm.base
        self.maps = {tm.base: tm}

    def point(self, address: int) -> None:
        if address == self.base:
            return
        tm = self.maps.get(address)
        if tm is None:
            current = self.maps[self.base]
            if len(self.maps) >= _MAX_MAPS:
                self.maps = {self.base: current}
            tm = current.copy()
            tm.rebase(address, self.name)
            self.maps[address] = tm
        self.ptrs[self.index] = tm.address
        self.base = address


class Match:
    """Arguments like those of the launch that made a plan, recognised without building its
    key: the same thread, torch device, count, tensor positions and scalars (equal and of the
    same types), and tensors that torch's own guard of compiled graphs
    (``torch._C._dynamo.guards.TensorGuards``, C++) finds alike: the same class, dispatch keys
    (device type, autograd ...), dtype, device index, gradient flag, sizes and strides.  A
    check in one call instead of five attribute reads per tensor; what it refuses, the plan's
    key may still find.  :meth:`of` makes none where the guard is missing (another torch),
    where equal scalars may encode differently (a float zero, NaN: the key's sign tells) or
    where a tensor is passed twice (the guard wants distinct tensors).
    ``grads``: whether a tensor it finds alike needs a gradient."""

    __slots__ = ("thread", "device", "count", "pick", "guard", "scalar_at", "scalars", "type_of", "types", "grads")

    @classmethod
    def of(cls, args: Sequence[Any], device: int) -> Match | None:
        guards = _tensor_guards()
        tensors = [i for i, a in enumerate(args) if isinstance(a, _torch.Tensor)]
        others = [i for i in range(len(args)) if i not in tensors]
        scalars = tuple(args[i] for i in others)
        if guards is None or not tensors or any(isinstance(v, float) and (v == 0 or v != v) for v in scalars):
            return None
        if len({id(args[i]) for i in tensors}) < len(tensors):
            return None  # one tensor passed twice: the guard refuses such arguments (it wants them distinct)
        try:
            guard = guards(*[args[i] for i in tensors], dynamic_dims_sizes=None, dynamic_dims_strides=None)
        except (TypeError, RuntimeError, SystemError):  # another torch's way of making one: the key decides
            return None
        self = cls()
        self.thread, self.device, self.count, self.guard = get_ident(), device, len(args), guard
        # the tensors as a sequence, in C (one of them: a slice of one)
        self.pick = operator.itemgetter(*tensors) if len(tensors) > 1 else \
            operator.itemgetter(slice(tensors[0], tensors[0] + 1))
        self.grads = any(args[i].requires_grad for i in tensors)  # the guard checks each tensor's flag
        # the scalars: one as itself, several as a tuple
        self.scalar_at = operator.itemgetter(*others) if others else None
        self.scalars = self.scalar_at(args) if others else None
        self.type_of = type if len(others) == 1 else _types
        self.types = self.type_of(self.scalars) if others else None
        return self

    def addresses(self, args: Sequence[Any]) -> list[int] | None:
        """The tensors' addresses when ``args`` are like the plan's own, else None."""
        if len(args) != self.count or get_ident() != self.thread:
            return None
        tensors = self.pick(args)
        if not self.guard.check(*tensors) or _torch._C._cuda_getDevice() != self.device:
            return None
        if self.scalar_at is not None:
            scalars = self.scalar_at(args)
            if scalars != self.scalars or self.type_of(scalars) != self.types:
                return None
        return list(map(_data_ptr, tensors))


def _types(values: tuple) -> tuple:
    return tuple(map(type, values))


_MAX_REMATCHES = 8  # per plan: arguments taking turns at what only a match sees go by the key


def rematch(plan: Any, args: Sequence[Any], device: int) -> None:
    """A new ``plan.match`` (a :class:`_Plan`'s, or anything with ``match`` and ``rematches``)
    made of ``args``, which its match refused and its key then found: they differ from the
    arguments it was made of in what only the match sees (a tensor's gradient flag ...), and the
    calls after are likely to be like them.  At most ``_MAX_REMATCHES`` times per plan."""
    if plan.match is not None and plan.rematches < _MAX_REMATCHES:
        plan.rematches += 1
        plan.match = Match.of(args, device)


_guards: Any = _UNKNOWN  # TensorGuards, or None where this torch has none


def _tensor_guards() -> Any:
    global _guards, _data_ptr
    if _guards is _UNKNOWN:
        try:
            from torch._C._dynamo.guards import TensorGuards as _guards
        except ImportError:
            _guards = None
        _data_ptr = _torch.Tensor.data_ptr
    return _guards


_data_ptr: Any = None  # torch.Tensor.data_ptr, bound with _guards


def launch_ranks(compiled: Any, args: Sequence[Any], grid: Any = None, stream: int | None = None,
                 group: Any = None) -> tuple[int, ...]:
    """:func:`launch` of a multi-GPU kernel on the ranks of ``group`` (a
    ``torch.distributed`` process group or its name; None: as :func:`launch` picks), checked
    at every call."""
    return _launch_checked(compiled, args, grid, stream, group, keep=group is None)


class _RankPlan(_Plan):
    """A checked launch of a multi-GPU kernel, kept for later launches on the very same tensors
    (its parameters point to device arrays of their peers' addresses) while the symmetric buffers
    and barrier pads tkc knows are the ones it was made with (``tkc.runtime.ranks.generation``).
    Its ``addresses`` are None, which no launch's equal, so :func:`launch` asks :meth:`rebase`."""

    __slots__ = ("fixed", "generation", "keep")

    def __init__(self, grid: tuple[int, ...], go: Any, addresses: list[int], generation: int, keep: Any,
                 stream: Any):
        super().__init__(grid, go, None, stream=stream)  # type: ignore[arg-type]
        self.fixed, self.generation, self.keep = addresses, generation, keep

    def rebase(self, addresses: list[int]) -> bool:
        from tkc.runtime.ranks import generation

        return addresses == self.fixed and generation() == self.generation


def _launch_checked(compiled: Any, args: Sequence[Any], grid: Any, stream: int | None, group: Any = None,
                    keep: bool = True) -> tuple[int, ...]:
    """:func:`launch` with every check, kept as a plan for arguments like these next time
    (unless ``keep`` is False)."""
    global _torch
    import torch

    _torch = torch

    from tkc.grid import check_grid, launch_grid
    from tkc.runtime import args as arg_checks

    if "hopper" not in compiled.asm:
        raise TkcUsageError(f"kernel '{compiled.name}' stopped at tile IR; compile it to ptx or cubin to launch")
    addresses: list[int] = []
    key = _plan_key(torch, args, grid, torch.cuda.current_device(), addresses) \
        if keep and torch.cuda.is_initialized() else None
    state = launch_state(compiled)
    if state.ranks is _UNKNOWN:
        state.ranks = compiled.ranks
    params = compiled.params
    maps = tma_operands(params, compiled.tma_maps)
    tma_names = {params[i][0] for i, _, _ in maps}
    if state.writes is None:
        state.writes = signature.written(compiled.kernel_op)
    arg_checks.check_launch(compiled.name, params, args, tma=tma_names, writes=state.writes)
    device = torch.device("cuda", torch.cuda.current_device())
    _check_device(compiled.target, device)
    # A persistent kernel sizes its grid by the SM count (tile.num_sms): this device's, or
    # for a kernel of clusters, the CTAs of as many clusters as the device holds at once.
    cluster = compiled.kernel_op.attributes.get("cluster") or 1
    if grid is None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        if cluster > 1:
            fn = _function(compiled, device.index)
            held = fn.max_active_clusters(cluster, compiled.threads, compiled.smem_bytes or 0)
            if held < 1:
                raise TkcLaunchError(f"kernel '{compiled.name}': this device holds no cluster of {cluster} CTAs "
                                     f"of {compiled.threads} threads and {compiled.smem_bytes or 0} B of shared "
                                     f"memory (cuOccupancyMaxActiveClusters)")
            sms = cluster * held
        grid = launch_grid(compiled.kernel_op, args, sms=sms)
    else:
        grid = check_grid(grid, compiled.kernel_op)
    if grid[0] % cluster:
        raise TkcLaunchError(f"kernel '{compiled.name}' runs in clusters of {cluster} CTAs along x: its grid "
                             f"{grid} must have a multiple of {cluster} there")
    tensors = [i for i, (_, t) in enumerate(params) if isinstance(t, TensorType)]
    aligned = [n for n, i in enumerate(tensors) if 0 not in args[i].shape]
    if 0 in grid:
        _keep_plan(compiled, key, _Plan(grid, None, addresses, aligned=aligned))
        return grid
    values = to_ctypes(param_values(params, args))
    if state.ranks is not None:
        return _launch_ranks(compiled, state.ranks, params, args, maps, values, grid, device, stream, group, key,
                             addresses)

    from tkc.runtime.tensormap import encode_tiled

    # The maps do not keep their tensors alive: a later launch re-bases them on its own.
    maps_enc = [encode_tiled(args[i], box, swizzle, name=params[i][0], keep=False) for i, box, swizzle in maps]
    fn = _function(compiled, device.index)
    prepared = fn.prepare(grid, compiled.threads, compiled.smem_bytes or 0, [*values, *maps_enc])
    # The tensors' addresses in one array that their parameters point into: a launch on new
    # tensors writes them with one slice assignment.
    where = address_slots(params)
    slots = (ctypes.c_uint64 * len(where))(*[values[j].value for j in where])
    for n, j in enumerate(where):
        prepared.ptrs[j] = ctypes.addressof(slots) + 8 * n
    go = fn.launcher(prepared)
    stream_of = driver.stream_getter(torch)
    go(stream_of(device.index) if stream is None else int(stream))
    named = [_MapSlot(tensors.index(i), params[i][0], tm, prepared.ptrs, len(values) + n)
             for n, ((i, _, _), tm) in enumerate(zip(maps, maps_enc))]
    match = Match.of(args, device.index) if key is not None and key[2] is None else None  # key[2]: the grid given
    _keep_plan(compiled, key, _Plan(grid, go, addresses, slots, named, aligned, stream_of, match,
                                    _apart(tensors, state.writes, args)))
    return grid


def _launch_ranks(compiled: Any, abi: Any, params: Sequence[signature.Param], args: Sequence[Any], maps: list,
                  values: list, grid: tuple[int, ...], device: Any, stream: int | None, group: Any, key: tuple | None,
                  addresses: list[int]) -> tuple[int, ...]:
    """The rest of a checked launch of a multi-GPU kernel: the parameters of docs/hopper.md §4
    items 2-3 from :func:`tkc.runtime.ranks.prepare` after the kernel's own, each ranked tensor
    map as the device address of its per-rank maps."""
    import torch

    from tkc.runtime import ranks
    from tkc.runtime.tensormap import encode_tiled

    fn = _function(compiled, device.index)
    extra = ranks.prepare(abi, compiled.name, params, args, maps, grid, device, group,
                          held=lambda: _resident(compiled, fn, torch.cuda.get_device_properties(device)))
    maps_enc = [ctypes.c_uint64(extra.maps[n]) if n in extra.maps
                else encode_tiled(args[i], box, swizzle, name=params[i][0], keep=False)
                for n, (i, box, swizzle) in enumerate(maps)]
    prepared = fn.prepare(grid, compiled.threads, compiled.smem_bytes or 0,
                          [*values, *to_ctypes(extra.values), *maps_enc])
    go = fn.launcher(prepared)
    stream_of = driver.stream_getter(torch)
    go(stream_of(device.index) if stream is None else int(stream))
    _keep_plan(compiled, key, _RankPlan(grid, go, addresses, ranks.generation(), (extra, prepared), stream_of))
    return grid


def _resident(compiled: Any, fn: Any, props: Any) -> int:
    """How many programs of ``compiled`` the device runs at once: clusters as the driver counts
    them, else the programs an SM holds (ptxas's count, or the driver's) times the SMs."""
    threads, smem = compiled.threads, compiled.smem_bytes or 0
    cluster = compiled.kernel_op.attributes.get("cluster") or 1
    if cluster > 1:
        return cluster * fn.max_active_clusters(cluster, threads, smem)
    per_sm = compiled.programs_per_sm
    return (fn.max_active_blocks(threads, smem) if per_sm is None else per_sm) * props.multi_processor_count


_MAX_PLANS = 64  # per kernel; a program cycling through more shapes just pays full price


def _keep_plan(compiled: Any, key: tuple | None, plan: _Plan) -> None:
    if key is None:
        return
    state = launch_state(compiled)
    if len(state.plans) >= _MAX_PLANS:
        state.plans.clear()
    state.plans[key] = plan
    state.last = plan if plan.match is not None else None


def _plan_key(torch: Any, args: Sequence[Any], grid: Any, device: int, addresses: list[int]) -> tuple | None:
    """What makes two launches on ``device`` from this thread interchangeable but for the
    tensors' addresses (everything the checks, the grid and the parameters depend on but the
    alignment of those addresses), with the addresses appended to ``addresses``.  None for
    arguments the plan cache does not handle (anything but torch tensors and Python numbers).

    The key is flat, one tuple for the whole launch (nested tuples per argument cost an
    allocation each, on every launch); it still tells argument lists apart, since each
    argument's run of items starts with what says how long the run is: a tensor's with its
    class (a torch.Tensor), a number's with its type (a float or an int)."""
    # repr(grid): (1.0,) == (1,), but is refused
    parts: list[Any] = [device, get_ident(), None if grid is None else repr(grid)]
    address, tensor = addresses.append, torch.Tensor
    for x in args:
        if isinstance(x, tensor):
            address(x.data_ptr())
            parts += (type(x), x.shape, x.stride(), x.dtype, x.device)
        elif isinstance(x, float):
            # 0.0 == -0.0, but the kernel gets a float's bits: the sign tells them apart.
            parts += (type(x), x, math.copysign(1.0, x))
        elif isinstance(x, int):  # bool too: True == 1, and its type tells them apart
            parts += (type(x), x)
        else:
            return None
    return tuple(parts)
