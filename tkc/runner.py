"""Running a kernel on random inputs, on any of tkc's three executors: what ``tkc run`` does.

- ``interpret``: the tile IR in the reference interpreter (``tkc.interpreter``);
- ``emulate``: the hopper IR in the emulator (``tkc.emulator``): shared memory, TMA,
  mbarriers and wgmma as sm_90a does them, on the CPU;
- ``gpu``: the compiled kernel through the runtime on torch CUDA tensors.

``check`` runs the interpreter on the same inputs as well and compares every tensor, so
``tkc run --check`` answers "does the compiled kernel compute what the program says?" on
any machine: a check of the interpreter runs the emulator instead, since the interpreter
is the reference.  Owns: the inputs' default sizes and their memory, turning random
arguments into each executor's form, timing, and the comparison.  Must not: compile
(``tkc.compiler``), launch by itself (``tkc.runtime``), or print (``tkc.cli`` does).
"""

from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tkc import dtypes, options
from tkc.errors import TkcEmulatorError, TkcUsageError
from tkc.ir.core import OpResult, Operation
from tkc.ir.dialects import tile
from tkc.ir.types import TensorType
from tkc.target import DEFAULT_TARGET
from tkc.passes.pipeline import is_lowered

if TYPE_CHECKING:
    from tkc.compiler import Compiled

BACKENDS = ("interpret", "emulate", "gpu")
#: What each backend runs, as the check names the two it compared.
EXECUTORS = {"interpret": "interpreter", "emulate": "emulator", "gpu": "GPU"}
#: The size of a dim no tile spans (a batch, heads, rows taken one a program): a few programs.
UNTILED_DIM = 3
#: The most host memory the inputs of one run may take, whatever the machine (the run keeps
#: two or three copies of them, and the comparison a few float64 ones of each output).
MAX_INPUT_BYTES = 16 << 30


def gpu_unavailable() -> str | None:
    """Why the GPU backend cannot run here, or None when it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return None if torch.cuda.is_available() else "torch sees no CUDA GPU"


def default_backend() -> tuple[str, str | None]:
    """The backend ``tkc run`` uses when none is named, and why, when it is not the GPU:
    ``TKC_INTERPRET=1`` picks the interpreter; otherwise the GPU when there is one."""
    if options.knobs().interpret:
        return "interpret", "TKC_INTERPRET=1"
    why = gpu_unavailable()
    return ("interpret", why) if why else ("gpu", None)


def tolerance(dt: dtypes.DType, rounded_bits: int = 32, scale: float = 0.0, staged_bits: int = 32,
              summed: bool = False, rounded_operands: bool = False) -> tuple[float, float]:
    """(atol, rtol) for comparing an executor with the interpreter: a few ulps of the output
    dtype, since summation order (wgmma's k16 steps, reduction trees) and the GPU's approximate
    exp2/rsqrt differ from numpy in the last bits.  ``rounded_bits``: the narrowest float the
    kernel casts a computed value to; an 8-bit one (attention's P to e4m3) turns a last-bit
    difference before the cast into one of its ulps (1/16 of the value), and everything computed
    from it moves with it, whatever its own size: a 16- or 8-bit float output is then compared
    within 8-bit ulps and within an 8-bit ulp of ``scale``, its largest magnitude.  f32 outputs
    keep theirs, and so does every output of a kernel whose narrowest cast is 16-bit (such a
    rounding moves results by less than a 16-bit output's own tolerance), except where the
    kernel stages 16-bit values in memory and reads them back (``staged_bits``, a
    reduce-scatter's partials): a last-bit difference turns into an ulp of a summand, which may
    be far larger than the sum, so a 16-bit output is compared within two 16-bit ulps of
    ``scale`` too.  ``summed``: the output is added to by atomic adds from several programs, in
    an order each executor picks, so an element is a sum whose rounding depends on that order:
    where its terms cancel, the difference is an ulp of a term, not of the sum (attention
    backward's dQ on random inputs), so an f32 output is compared within 16 f32 ulps of
    ``scale`` too, and a 16-bit one, each of whose additions rounds the running sum (a
    reduce-scatter by TMA adds into a peer), within two 16-bit ulps of ``scale``.
    ``rounded_operands``: the kernel rounds computed values to 16 bits and multiplies them
    (attention backward's P and dS, an FFT's stages): a last-bit difference before the
    rounding moves an operand by a 16-bit ulp, and every term of the product with it, so where
    terms cancel an output moves by ulps of the terms, not of itself: it is compared within
    2**-6 of ``scale`` too (two bf16 ulps of the largest value)."""
    if not dt.is_float or dt == dtypes.f8e8m0:
        # (an E8M0 code one off is a factor of 2: every backend computes the codes exactly)
        return (0.0, 0.0)
    if rounded_operands and rounded_bits <= 16:
        atol, rtol = tolerance(dt, rounded_bits, scale, staged_bits, summed)
        return (max(atol, 2**-6 * scale), rtol)
    if summed and dt.bits == 32:
        return (max(1e-4, 2**-19 * scale), 1e-4)
    if summed and dt.bits == 16:
        return (max(2**-6, 2**-6 * scale), 2**-6)
    if rounded_bits <= 8 and dt.bits <= 16:
        return (max(2**-3, 2**-4 * scale), 2**-3)
    if staged_bits <= 16 and dt.bits <= 16:
        return (max(2**-6, 2**-7 * scale), 2**-6)
    return {8: (2**-3, 2**-3), 16: (2**-6, 2**-6), 32: (1e-4, 1e-4)}[dt.bits]


def narrowest_cast(kernel: Operation) -> int:
    """The bits of the narrowest float dtype a ``tile.cast`` of ``kernel`` produces (32 if none)."""
    bits = [op.result.type.dtype.bits for op in kernel.walk() if op.name == "tile.cast"
            and getattr(op.result.type, "dtype", None) is not None and op.result.type.dtype.is_float]
    return min(bits, default=32)


def narrowest_staged(kernel: Operation) -> int:
    """The bits of the narrowest float tensor ``kernel`` stores a cast into and loads from (its
    own copy or a peer's), 32 if none: values it rounds, stages and reads back (copies, which
    round nothing, do not count)."""
    stored = {id(tile.tensor_param(op.tensor)) for op in kernel.walk() if op.name == "tile.store"
              and isinstance(op.value, OpResult) and op.value.owner.name == "tile.cast"}
    bits = [op.tensor.type.dtype.bits for op in kernel.walk() if op.name in ("tile.load", "tile.gather")
            and id(tile.tensor_param(op.tensor)) in stored and op.tensor.type.dtype.is_float]
    return min(bits, default=32)


def atomic_sums(kernel: Operation) -> frozenset[str]:
    """The names of the float tensors ``kernel`` adds to by atomic adds (summed by several
    programs in an order each executor picks)."""
    return frozenset(tile.tensor_param(op.tensor).name_hint for op in kernel.walk()
                     if op.name == "tile.atomic" and op.kind == "add" and op.tensor.type.dtype.is_float)


def multiplies_rounded(kernel: Operation) -> bool:
    """Whether ``kernel`` multiplies (``@``) a value it rounded to a 16-bit or narrower float
    (``x.to(bf16) @ y``), directly or through a transpose."""
    def rounded(v: Any) -> bool:
        while isinstance(v, OpResult) and v.owner.name == "tile.transpose":
            v = v.owner.operands[0]
        return isinstance(v, OpResult) and v.owner.name == "tile.cast" and v.type.dtype.is_float \
            and v.type.dtype.bits <= 16 and v.owner.operands[0].type.dtype.bits > v.type.dtype.bits
    return any(op.name == "tile.mma" and any(rounded(x) for x in op.operands[:2]) for op in kernel.walk())


class Rounding(NamedTuple):
    """What :func:`tolerance` needs to know of a kernel: its narrowest float cast, the narrowest
    float it stages and reads back, the tensors it sums by atomic adds, and whether it multiplies
    values it rounded."""
    cast: int = 32
    staged: int = 32
    summed: frozenset[str] = frozenset()
    rounded_operands: bool = False


#: A kernel that rounds nothing (f32 throughout, no atomic sums).
NOT_ROUNDED = Rounding()


def rounding(kernel: Operation) -> Rounding:
    """:class:`Rounding` of ``kernel``."""
    return Rounding(narrowest_cast(kernel), narrowest_staged(kernel), atomic_sums(kernel), multiplies_rounded(kernel))


def dim_names(kernel: Operation) -> list[str]:
    """The symbolic dims of the kernel's tensors, in the order of first use."""
    names: list[str] = []
    for a in kernel.regions[0].block.args:
        if isinstance(a.type, TensorType):
            names += [d for d in a.type.dims if isinstance(d, str) and d not in names]
    return names


def default_dims(kernel: Operation) -> dict[str, int]:
    """A size for every symbolic dim, small and not a multiple of any tile along it: one tile
    (the largest box a load or store spans along the dim) and a tail, so a run has several
    programs and partial tiles.  A multiple of 16 where one fits, since TMA takes rows of
    16-byte multiples only; ``UNTILED_DIM`` for a dim no box spans."""
    boxes: dict[str, set[int]] = {d: set() for d in dim_names(kernel)}
    for op in kernel.walk():
        # tile IR's accesses, and hopper IR's (TMA copies, per-thread loads and stores), which
        # carry the box too: a dumped kernel run by `tkc run` gets the source's sizes
        if "box" in op.attributes and op.operands and isinstance(op.operands[0].type, TensorType) \
                and len(op.attributes["box"]) == len(op.operands[0].type.dims):
            for d, b in zip(op.operands[0].type.dims, op.attributes["box"]):
                if isinstance(d, str) and b > 1:
                    boxes[d].add(b)
    return {d: _tile_and_tail(b) for d, b in boxes.items()}


def _tile_and_tail(boxes: set[int]) -> int:
    if not boxes:
        return UNTILED_DIM
    tile = max(boxes)
    tails = [tile >> k for k in range(1, tile.bit_length())]  # half a tile, a quarter, ..., 1
    sizes = [tile + t for t in tails if all((tile + t) % b for b in boxes)]
    return next((s for s in sizes if s % 16 == 0), sizes[0] if sizes else tile + 1)


def input_bytes(kernel: Operation, dims: dict[str, int]) -> int:
    """The host memory of one set of the kernel's tensors with these dim sizes (storage form:
    float32 for every float dtype)."""
    tensors = [a.type for a in kernel.regions[0].block.args if isinstance(a.type, TensorType)]
    return sum(math.prod(d if isinstance(d, int) else dims[d] for d in t.dims) * t.dtype.np_storage.itemsize
               for t in tensors)


def input_budget() -> int:
    """The most bytes ``input_bytes`` may be here: a quarter of the machine's memory, at most
    ``MAX_INPUT_BYTES``."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return MAX_INPUT_BYTES
    return min(MAX_INPUT_BYTES, memory // 4)


@dataclass
class Mismatch:
    name: str
    max_abs_error: float
    bad: int
    total: int


@dataclass
class RunResult:
    kernel: str
    backend: str
    grid: tuple[int, ...]
    seconds: float  # wall time (interpreter, emulator) or median kernel time (gpu)
    outputs: list[tuple[str, TensorType, np.ndarray]]
    checked: list[Mismatch] | None = None
    repeats: int = 1
    notes: list[str] = field(default_factory=list)  # the compiler's remarks on the kernel that ran

    @property
    def ok(self) -> bool:
        return self.checked is None or all(m.bad == 0 for m in self.checked)


def run(kernel: Operation, args: list[Any], backend: str, grid: tuple[int, ...] | None = None,
        check: bool = False, repeat: int = 1, seed: int = 0, target: str = DEFAULT_TARGET.name) -> RunResult:
    """Run the (tile IR) ``kernel`` on ``args`` (storage-form numpy arrays and scalars, as
    ``tkc.interpreter.random_args`` makes them) with ``backend``; outputs are returned, the
    arguments are not modified.  ``check``: compare with the interpreter, which then checks
    the emulator when ``backend`` is the interpreter itself (``RunResult.backend`` says so)."""
    from tkc.grid import launch_grid
    from tkc.interpreter import run_kernel

    if backend not in BACKENDS:
        raise TkcUsageError(f"unknown backend {backend!r}; one of {', '.join(BACKENDS)}")
    if repeat < 1:
        raise TkcUsageError("repeat must be at least 1")
    if check and backend == "interpret":
        backend = "emulate"
    name = kernel.attributes["sym_name"]
    # A given grid applies to every executor; otherwise each takes its kernel's own, which
    # differ once passes change the grid (a persistent kernel launches one program per SM).
    # A persistent kernel's grid counts programs, each walking tiles until all are done: the
    # interpreter, which runs one program per tile, then checks against every tile.
    user_grid = tuple(grid) if grid else None
    executed = kernel
    reference = copy.deepcopy(args) if check else None
    work = copy.deepcopy(args)
    if reference is not None:
        # Both sides poisoned: an element neither writes (outside a --grid smaller than the
        # kernel's) matches, one only the reference writes does not.
        _poison_outputs(kernel, work)
        _poison_outputs(kernel, reference)
    if backend == "interpret":
        grid = user_grid or launch_grid(kernel, args)
        seconds = _timed(lambda: run_kernel(kernel, work, grid=grid))
    elif backend == "emulate":
        from tkc.compiler import compile_kernel
        from tkc.emulator import emulate

        compiled = compile_kernel(kernel, stop="hopper", cache=False, target=target)
        executed = hopper = compiled.kernel_op
        notes = list(compiled.remarks)
        grid = user_grid or launch_grid(hopper, args)
        if reference is not None:
            # The reference first: a mistake of the kernel's own (a race, a read out of bounds)
            # is then the interpreter's error, in the language's words, not the emulator's.
            run_kernel(kernel, reference, grid=None if walks_tiles(executed) else user_grid)
        try:
            seconds = _timed(lambda: emulate(hopper, work, grid=grid, seed=seed))
        except TkcEmulatorError:
            if reference is None and not is_lowered(kernel):
                # Without --check the interpreter has not run: a mistake of the kernel's own (a
                # race, a read out of bounds) is its error, in the language's words; else the
                # emulator's stands (the lowering's fault, or lowered IR's own, which the
                # interpreter cannot run).
                run_kernel(kernel, copy.deepcopy(args), grid=None if walks_tiles(executed) else user_grid)
            raise
    else:
        seconds, repeat, grid, compiled = _run_gpu(kernel, work, user_grid, repeat, target)
        executed, notes = compiled.kernel_op, list(compiled.remarks)
    params = kernel.regions[0].block.args
    outputs = [(p.name_hint or f"arg{i}", p.type, np.asarray(w)) for i, (p, w) in enumerate(zip(params, work))
               if isinstance(p.type, TensorType)]
    result = RunResult(name, backend, grid, seconds, outputs, repeats=repeat,
                       notes=notes if backend != "interpret" else [])
    if reference is not None:
        if backend != "emulate":
            run_kernel(kernel, reference, grid=None if walks_tiles(executed) else user_grid)
        rounded = rounding(kernel)
        result.checked = [_compare(n, t, out, np.asarray(ref), rounded) for (n, t, out), ref, p in
                          zip(outputs, [r for r, p in zip(reference, params) if isinstance(p.type, TensorType)],
                              [p for p in params if isinstance(p.type, TensorType)])]
    return result


def run_ranks(kernel: Operation, rank_args: list[list[Any]], grid: tuple[int, ...] | None = None,
              check: bool = False, seed: int = 0, backend: str = "interpret",
              target: str = DEFAULT_TARGET.name) -> RunResult:
    """Run the multi-GPU ``kernel`` on ``len(rank_args)`` simulated ranks, the programs of all
    ranks interleaved in an order picked by ``seed``: in the interpreter
    (:func:`tkc.interpreter.run_ranks`), or with ``backend = "emulate"`` its hopper IR in the
    emulator (:func:`tkc.emulator.emulate_ranks`); outputs are named ``x (rank r)``.
    ``check``: the interpreter again, interleaved by seed ``seed + 1``, comparing every tensor
    of every rank (a kernel whose ranks synchronize properly computes the same whatever the
    order; the race detector has already run twice), or, for the emulator, the interpreter on
    the same inputs with the same seed."""
    from tkc.grid import launch_grid
    from tkc.interpreter import run_ranks as run

    if backend not in ("interpret", "emulate"):
        raise TkcUsageError(f"--backend {backend}: multi-GPU kernels run in the interpreter or the emulator "
                            f"for now")
    work = copy.deepcopy(rank_args)
    reference = copy.deepcopy(rank_args) if check else None
    executed = kernel
    if backend == "emulate":
        from tkc.compiler import compile_kernel
        from tkc.emulator import emulate_ranks

        if reference is not None:
            for args in work + reference:
                _poison_outputs(kernel, args)
        compiled = compile_kernel(kernel, stop="hopper", cache=False, target=target)
        executed = hopper = compiled.kernel_op
        notes = list(compiled.remarks)
        if reference is not None:
            # The reference first, as ``run`` does: a mistake of the kernel's own (a race, a rank
            # out of range, a wait nobody signals) is then the interpreter's error, in the
            # language's words, not the emulator's about the lowered ops.
            run(kernel, reference, grid=reference_grid(kernel, executed, grid), seed=seed)
        seconds = _timed(lambda: emulate_ranks(hopper, work, grid=grid, seed=seed))
    else:
        notes = []
        seconds = _timed(lambda: run(kernel, work, grid=grid, seed=seed))
    params = kernel.regions[0].block.args
    tensors = [(i, p) for i, p in enumerate(params) if isinstance(p.type, TensorType)]
    outputs = [(f"{p.name_hint or f'arg{i}'} (rank {r})", p.type, np.asarray(args[i]))
               for r, args in enumerate(work) for i, p in tensors]
    result = RunResult(kernel.attributes["sym_name"], backend, grid or launch_grid(executed, rank_args[0]), seconds,
                       outputs, notes=notes)
    if reference is not None:
        if backend != "emulate":
            run(kernel, reference, grid=grid, seed=seed + 1)
        wants = [np.asarray(args[i]) for args in reference for i, _ in tensors]
        rounded = rounding(kernel) if backend == "emulate" else Rounding(summed=atomic_sums(kernel))
        result.checked = [_compare(n, t, out, want, rounded) for (n, t, out), want in zip(outputs, wants)]
    return result


def run_ranks_gpu(kernel: Operation, args: list[Any], flags: list[int], grid: tuple[int, ...] | None = None,
                  check: bool = False, repeat: int = 1, seed: int = 0, target: str = DEFAULT_TARGET.name) -> RunResult:
    """Run the multi-GPU ``kernel`` on this process's GPU as one rank of torchrun's processes
    (:func:`tkc.runtime.ranks.init_process_group`), on ``args``, this rank's inputs in storage
    form; every rank calls this alike.  Tensors ``@ ranks`` live in symmetric memory; the
    tensors at ``flags`` (parameter indices) are zeroed before every launch, after every rank
    has finished the one before.  ``check``: rank 0 gathers every rank's inputs and outputs,
    runs the interpreter on all ranks (``seed`` interleaves them) and compares; every rank's
    result then holds the comparison.  Outputs are this rank's (rank 0: every rank's, named
    ``x (rank r)``, with ``check``); ``seconds`` is the median of ``repeat`` timed launches
    after the one whose results are kept."""
    import torch
    import torch.distributed as dist

    from tkc.compiler import compile_kernel
    from tkc.runtime import ranks
    from tkc.runtime.launch import launch

    rank, world = ranks.init_process_group()
    user_grid = tuple(grid) if grid else None
    compiled = compile_kernel(kernel, target=target)
    params = kernel.regions[0].block.args
    work = copy.deepcopy(args)
    if check:
        _poison_outputs(kernel, work)
    inputs = copy.deepcopy(work) if check else None
    dev: list[Any] = []
    for p, w in zip(params, work):
        if isinstance(p.type, TensorType):
            host = dtypes.to_torch(np.asarray(w), p.type.dtype)
            t = ranks.symmetric_empty(tuple(host.shape), host.dtype) if p.type.ranks else torch.empty_like(
                host, device="cuda")
            dev.append(t.copy_(host))
        else:
            dev.append(w)

    def start() -> None:  # every rank done with the last launch, flags zeroed, then in step
        torch.cuda.synchronize()
        dist.barrier()
        for i in flags:
            dev[i].zero_()
        torch.cuda.synchronize()
        dist.barrier()

    start()
    grid = launch(compiled, dev, grid=grid)
    torch.cuda.synchronize()
    host = [dtypes.from_torch_tensor(d.cpu())[0] if isinstance(p.type, TensorType) else d
            for p, d in zip(params, dev)]
    times = []
    for _ in range(repeat):
        start()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        launch(compiled, dev, grid=grid)
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    tensors = [(i, p) for i, p in enumerate(params) if isinstance(p.type, TensorType)]
    outputs = [(p.name_hint or f"arg{i}", p.type, np.asarray(host[i])) for i, p in tensors]
    result = RunResult(kernel.attributes["sym_name"], "gpu", tuple(grid), sorted(times)[len(times) // 2], outputs,
                       repeats=repeat)
    if check:
        every: list[Any] = [None] * world if rank == 0 else None  # type: ignore[assignment]
        dist.gather_object((inputs, host), every, dst=0)
        checked: list[Any] = [None]
        failure = None
        if rank == 0:
            from tkc.interpreter import run_ranks as interpret_ranks
            from tkc.schedule import device_sms

            reference = [i for i, _ in every]
            try:
                # num_sms() as on this GPU: a kernel's flags may count its programs (ring_attn's ready)
                interpret_ranks(kernel, reference, grid=reference_grid(kernel, compiled.kernel_op, user_grid),
                                seed=seed, sms=device_sms())
            except Exception as e:  # every rank stops: the others wait for the comparison
                failure = e
            else:
                rounded = rounding(kernel)
                result.outputs = [(f"{p.name_hint or f'arg{i}'} (rank {r})", p.type, np.asarray(out[i]))
                                  for r, (_, out) in enumerate(every) for i, p in tensors]
                wants = [np.asarray(ref[i]) for ref in reference for i, _ in tensors]
                checked[0] = [_compare(n, t, got, want, rounded) for (n, t, got), want in zip(result.outputs, wants)]
        dist.broadcast_object_list(checked, src=0)
        if failure is not None:
            raise failure
        if checked[0] is None:
            raise SystemExit(1)  # rank 0 says why
        result.checked = checked[0]
    return result


def _poison_outputs(kernel: Operation, args: list[Any]) -> None:
    """Fill the tensors the kernel stores to with values it would not compute (NaN, or the
    most negative integer), so an element the executor fails to write cannot match the
    reference by keeping the input's random value."""
    params = kernel.regions[0].block.args
    # Atomics read what is there, and so does a kernel that loads a tensor it stores to (an
    # in-place update): only tensors written by stores alone, and never read, are poisoned.
    stored = {op.operands[0] for op in kernel.walk() if op.name in ("tile.store", "tile.masked_store")}
    stored -= {op.operands[0] for op in kernel.walk() if tile.is_atomic(op)}
    stored -= tile.read_and_written(kernel)
    for i, p in enumerate(params):
        if p in stored:
            a = np.array(args[i], copy=True)
            a[...] = np.nan if p.type.dtype.is_float else (np.iinfo(a.dtype).min if p.type.dtype.is_int else a)
            args[i] = a


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def reference_grid(kernel: Operation, executed: Operation, grid: Any) -> Any:
    """The grid the interpreter checks a multi-GPU run of ``executed`` (``kernel`` lowered) on
    ``grid`` with: the same, unless the persistent pass made ``executed`` walk tiles that
    ``kernel`` takes a program each (its own grid then).  A kernel whose source walks tiles on
    ``num_sms()`` programs runs the caller's count in both: its flags may count its programs
    (moe_dispatch's ``arrived``, ring attention's pushers)."""
    return None if walks_tiles(executed) and not walks_tiles(kernel) else grid


def walks_tiles(kernel: Operation) -> bool:
    """Whether ``kernel`` is persistent: its grid is sized by the SM count, and each program
    walks output tiles, so any number of programs computes every tile."""
    return any(op.name == "tile.num_sms" for op in kernel.walk())


def _run_gpu(kernel: Operation, work: list[Any], grid: tuple[int, ...] | None, repeat: int,
             target: str = DEFAULT_TARGET.name) -> tuple[float, int, tuple[int, ...], Compiled]:
    """Launch on the GPU (the grid the runtime computes for this device unless given); the
    median time of ``repeat`` timed launches after the one whose results are kept, and the
    compiled kernel."""
    try:
        import torch
    except ImportError:
        raise TkcUsageError("the gpu backend needs torch with CUDA (pip install torch)") from None

    from tkc.compiler import compile_kernel
    from tkc.runtime.launch import launch
    from tkc.runtime.timing import gpu_time

    if not torch.cuda.is_available():
        raise TkcUsageError("torch sees no CUDA GPU; run with --backend interpret or emulate")
    compiled = compile_kernel(kernel, target=target)
    params = kernel.regions[0].block.args
    dev = [dtypes.to_torch(np.asarray(w), p.type.dtype).cuda() if isinstance(p.type, TensorType) else w
           for p, w in zip(params, work)]
    grid = launch(compiled, dev, grid=grid)  # the result; later launches rewrite the same outputs
    torch.cuda.synchronize()
    host = [dtypes.from_torch_tensor(d.cpu())[0] if isinstance(p.type, TensorType) else d
            for p, d in zip(params, dev)]
    t = gpu_time(lambda: launch(compiled, dev, grid=grid), runs=repeat, warmup=0)
    work[:] = host
    return t.median_s, repeat, tuple(grid), compiled


def _compare(name: str, t: TensorType, got: np.ndarray, want: np.ndarray,
             rounded: Rounding = NOT_ROUNDED) -> Mismatch:
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.abs(w[np.isfinite(w)])
    summed = name.split(" (rank ")[0] in rounded.summed
    atol, rtol = tolerance(t.dtype, rounded.cast, float(finite.max()) if finite.size else 0.0, rounded.staged,
                           summed, rounded.rounded_operands)
    same = (np.isnan(g) & np.isnan(w)) | (np.isinf(w) & (g == w))  # NaN and NaN, or one infinity twice
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, taken as a mismatch below
        err = np.where(same, 0.0, np.abs(g - w))
    err = np.where(np.isnan(err), np.inf, err)  # NaN on one side only is a mismatch
    if t.dtype.is_int:  # exactly: float64 cannot tell i64 values apart beyond 2**53
        bad = int((got != want).sum())
    else:
        bad = int((err > atol + rtol * np.abs(np.nan_to_num(w))).sum())
    return Mismatch(name, float(err.max()) if err.size else 0.0, bad, int(err.size))
