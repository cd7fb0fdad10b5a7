"""The reference interpreter: runs ``tile`` dialect kernels on numpy.

This module launches kernels: it binds arguments to a kernel's parameters (checked through
:func:`tkc.signature.bind`, which the GPU runtime shares), evaluates the launch grid
(:mod:`tkc.grid`), runs the programs one after another in row-major order of their ids (a
cluster's programs in turns, up to each cluster reduction), and writes the outputs back.  What
each op computes is :mod:`tkc.semantics`.  The emulator binds and writes back arguments with
the same public functions here (:func:`bind_arguments`, :func:`write_back`).

It is the ground truth the passes and the hopper emulator are compared against.  It must not
depend on torch: torch is touched only when a caller passes torch tensors.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from tkc import dtypes, signature
from tkc.dtypes import DType, round_to
from tkc.errors import TkcInterpretError, TkcLaunchError
from tkc.grid import as_kernel, check_args, check_grid, eval_grid, param_name, scalar_value
from tkc.ir.core import BlockArgument, Module, Operation, Value
from tkc.ir.dialects import tile
from tkc.ir.types import TensorType
from tkc.races import WriteLog
from tkc.semantics import Program, Suspended, combine_ranks

__all__ = ["bind_arguments", "interpret_module", "random_args", "run_kernel", "run_ranks", "tensor_names",
           "write_back"]


def bind_arguments(kernel: Operation, args: Sequence[Any]) -> tuple[dict[Value, Any], dict[int, np.ndarray]]:
    """The value of each parameter in storage form, and the working array of each tensor
    argument (by ``id``): the argument itself where it already is exactly the storage form
    and writeable (the kernel then runs in place), else a rounded copy.  A tensor passed
    twice stays one tensor.  Arguments are checked first (:func:`tkc.signature.bind`)."""
    check_args(kernel, args)
    signature.check_separate(kernel.sym_name, signature.kernel_params(kernel), args, signature.written(kernel))
    env: dict[Value, Any] = {}
    working: dict[int, np.ndarray] = {}
    for p, x in zip(kernel.regions[0].block.args, args):
        if not isinstance(p.type, TensorType):
            env[p] = scalar_value(p, p.type.dtype, x)
        elif id(x) in working:
            env[p] = working[id(x)]
        elif isinstance(x, np.ndarray) and x.dtype == p.type.dtype.np_storage and p.type.dtype in (
                dtypes.f32, dtypes.i32, dtypes.i64, dtypes.i1) and x.flags.writeable:
            env[p] = working[id(x)] = x
        else:
            if signature.is_torch(x) and x.is_meta:  # shapes only: fine for binding, not for running
                raise TkcLaunchError(f"{param_name(p)}: a meta tensor holds no data; pass a CPU tensor to the "
                                     f"interpreter (or a CUDA one to the GPU)")
            st = dtypes.from_torch_tensor(x)[0] if signature.is_torch(x) else x
            env[p] = working[id(x)] = round_to(st, p.type.dtype)
    return env, working


def run_kernel(kernel: Operation | Module, args: Sequence[Any], grid: Any = None) -> None:
    """Run ``kernel`` over ``grid`` (default: :func:`tkc.grid.launch_grid`), writing its
    outputs in place into the tensors in ``args``.

    Tensors are numpy arrays in storage form (float32 for every float dtype;
    float16 is also accepted for f16) or torch tensors; their values are rounded
    to the declared dtype on entry.  Scalars are python or numpy numbers.
    """
    kernel = as_kernel(kernel)
    if tile.uses_ranks(kernel):  # one rank of a multi-GPU kernel: its waits need the ranks' scheduler
        run_ranks(kernel, [args], grid)
        return
    params = kernel.regions[0].block.args
    env, working = bind_arguments(kernel, args)
    ctx = Program(None, (), env, log=WriteLog(tensor_names(params, env)))
    with np.errstate(all="ignore"):
        ctx.grid = eval_grid(kernel, dict(env)) if grid is None else check_grid(grid, kernel)
        try:
            if tile.has_cluster_reductions(kernel):
                _run_clusters(ctx, kernel, env)
                return
            for pid in itertools.product(*(range(g) for g in ctx.grid)):
                ctx.pid = pid
                ctx.env = dict(env)
                try:
                    ctx.run(kernel.regions[0].block)
                except TkcInterpretError as e:
                    raise TkcInterpretError(f"{e.message} (in program {pid})", e.loc) from e
        finally:
            write_back(params, args, working, ctx.written)


def run_ranks(kernel: Operation | Module, rank_args: Sequence[Sequence[Any]], grid: Any = None, seed: int = 0,
              sms: int = 0) -> None:
    """Run a multi-GPU ``kernel`` on ``len(rank_args)`` simulated ranks (``tkc/ranks.py``),
    rank ``r`` on the arguments ``rank_args[r]`` (as :func:`run_kernel` takes them), writing
    every rank's outputs in place; ``seed`` picks how the programs of all ranks interleave.
    ``sms``: what ``num_sms()`` reads (a GPU's SM count, so ``grid(num_sms())`` launches as
    many programs as there; default: a few, the CPU's stand-in)."""
    from tkc.ranks import check_own_memory, run_programs

    kernel = as_kernel(kernel)
    params = kernel.regions[0].block.args
    check_own_memory(params, rank_args)
    bound = [bind_arguments(kernel, args) for args in rank_args]
    written: set[int] = set()
    try:
        run_programs(kernel, [env for env, _ in bound], grid, seed, written, sms)
    finally:
        for (_, working), args in zip(bound, rank_args):
            write_back(params, args, working, written)


def _run_clusters(ctx: Program, kernel: Operation, env: dict[Value, Any]) -> None:
    """Run a kernel with ``tile.cluster_reduce``: the programs of each cluster (``cluster``
    consecutive programs along axis 0) run from the start until each reaches the next
    reduction it has no result for, leaving its part there; once every program of the
    cluster has left its part of that reduction, the result is known and they run again.
    A program's work before a reduction is done again on every rerun: the same stores of the
    same values, since a program computes the same thing from the same inputs."""
    n = kernel.consts["cluster"]
    if ctx.grid[0] % n:
        raise TkcLaunchError(f"kernel @{kernel.sym_name} runs in clusters of {n} programs along axis 0: its "
                             f"grid {ctx.grid} must have a multiple of {n} there")
    rest = list(itertools.product(*(range(g) for g in ctx.grid[1:])))
    for first in range(0, ctx.grid[0], n):
        for other in rest:
            pids = [(first + r, *other) for r in range(n)]
            results: dict[tuple[Operation, int], np.ndarray] = {}
            while True:
                parts: dict[tuple[Operation, int], dict[int, np.ndarray]] = {}
                for rank, pid in enumerate(pids):
                    ctx.pid, ctx.env = pid, dict(env)
                    ctx.cluster = (rank, results, parts, {})
                    try:
                        ctx.run(kernel.regions[0].block)
                    except Suspended:
                        pass
                    except TkcInterpretError as e:
                        raise TkcInterpretError(f"{e.message} (in program {pid})", e.loc) from e
                if not parts:
                    break
                for (op, k), got in parts.items():
                    if len(got) != n:
                        missing = sorted(set(range(n)) - set(got))
                        raise TkcInterpretError(
                            f"programs {[pids[r] for r in sorted(got)]} reach this cluster reduction (its "
                            f"{_ordinal(k + 1)} time) while programs {[pids[r] for r in missing]} of their "
                            f"cluster do not", op.loc)
                    results[(op, k)] = combine_ranks(op.kind, [got[r] for r in range(n)])
            ctx.cluster = None


def _ordinal(k: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(k, f"{k}th")


def tensor_names(params: Sequence[BlockArgument], env: dict[Value, Any]) -> dict[int, str]:
    """``id`` of each working tensor -> its parameter's name, for messages."""
    return {id(env[p]): param_name(p) for p in params if isinstance(p.type, TensorType)}


def write_back(params: Sequence[BlockArgument], args: Sequence[Any], working: dict[int, np.ndarray],
               written: set[int]) -> None:
    """Copy the working arrays of stored-to tensors back into the caller's tensors.  A
    read-only numpy array never runs in place, so storing to it ends here, as a launch error."""
    done: set[int] = set()
    for p, x in zip(params, args):
        w = working.get(id(x))
        if w is None or w is x or id(w) not in written or id(x) in done:
            continue
        done.add(id(x))
        if isinstance(x, np.ndarray) and not x.flags.writeable:
            raise TkcLaunchError(f"{param_name(p)}: the kernel stores to it, but the numpy array is read-only "
                                 "(pass a writeable array, e.g. a copy)")
        if signature.is_torch(x):
            import torch

            with torch.no_grad():
                x.copy_(dtypes.to_torch(w, p.type.dtype))
        else:
            x[...] = w  # exact: w holds values of the array's own dtype


# ----------------------------------------------------------- random inputs
def random_args(kernel: Operation | Module, dims: dict[str, int], seed: int = 0,
                int_range: tuple[int, int] = (-8, 8)) -> list[Any]:
    """Fresh random arguments for every parameter of ``kernel``.

    Float tensors are N(0, 1) rounded to their dtype, i32 and i64 tensors integers in
    ``int_range`` (both ends included), bool tensors fair coins (outputs too: the
    interpreter cannot tell them apart).  Float scalars are uniform in [0.5, 1.5],
    i32 and i64 scalars in [1, 8].  Symbolic tensor dims come from ``dims``.
    """
    kernel = as_kernel(kernel)
    params = kernel.regions[0].block.args
    missing = sorted({d for p in params if isinstance(p.type, TensorType)
                      for d in p.type.dims if isinstance(d, str) and d not in dims})
    if missing:
        raise TkcLaunchError(f"random_args: no size given for dim(s) {', '.join(missing)}")
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for p in params:
        dt = p.type.dtype
        if isinstance(p.type, TensorType):
            shape = tuple(d if isinstance(d, int) else dims[d] for d in p.type.dims)
            out.append(_random(rng, dt, shape, int_range))
        else:
            out.append(_random(rng, dt, (), int_range).item())
    return out


def _random(rng: np.random.Generator, dt: DType, shape: tuple[int, ...], int_range: tuple[int, int]
            ) -> np.ndarray:
    if dt.is_bool:
        return rng.random(shape) < 0.5
    if dt.is_packed:  # pairs of FP4 values: every byte is a pair
        return rng.integers(0, 256, shape, dtype=np.int64).astype(np.uint8)
    if dt.is_int:
        lo, hi = int_range if shape else (1, 8)
        if not dt.min <= lo <= hi <= dt.max:
            raise TkcLaunchError(f"random_args: integer range [{lo}, {hi}] is empty or does not fit in {dt.name}")
        return rng.integers(lo, hi, shape, dtype=np.int64, endpoint=True).astype(dt.np_storage)
    return round_to(rng.standard_normal(shape) if shape else rng.uniform(0.5, 1.5), dt)


def interpret_module(module: Module, kernel_name: str | None = None, args: Sequence[Any] | None = None,
                     grid: Any = None, dims: dict[str, int] | None = None, seed: int = 0) -> list[Any]:
    """Run one kernel of ``module`` (random arguments from ``dims`` when
    ``args`` is None) and return the arguments, outputs written."""
    kernel = module.kernel(kernel_name)
    if args is None:
        args = random_args(kernel, dims or {}, seed)
    run_kernel(kernel, args, grid)
    return list(args)
