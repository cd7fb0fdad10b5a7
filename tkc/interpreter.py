"""The reference interpreter: runs ``tile`` dialect kernels on numpy.

This module owns the *meaning* of tile IR: what every ``tile`` op computes,
how a kernel is launched over a grid, and how launch arguments are checked
(through :func:`tkc.signature.bind`, which the GPU runtime shares).
It is the ground truth the passes and the hopper emulator are compared
against, so it favours being obviously right over being fast, while staying
vectorized (one numpy op per IR op, never a Python loop over elements).

It must not know how values round -- every rounding goes through
:func:`tkc.dtypes.round_to` -- and it must not depend on torch: torch is
touched only when a caller passes torch tensors.

Numerics (decisions the op docstrings leave open):

* Values are numpy arrays in their dtype's storage form (``DType.np_storage``):
  float32 for every float dtype, int32 for ``i32``, bool for ``i1``.  Scalars
  are 0-d arrays.
* Float ops compute in float32 and round the result once to the result dtype.
  For f16/bf16/fp8 this models math done in f32 registers and converted back
  (what generated code does); it can differ by double rounding from a native
  bf16 instruction.  ``div`` is IEEE f32 division and ``rsqrt`` is
  ``1 / sqrt(x)`` in f32, both at least as accurate as the GPU's approximate
  instructions.  Overflow, 0/0, ``exp(-inf) = 0`` and ``log(0) = -inf`` are
  ordinary results: numpy's floating-point warnings are silenced.
* ``maximum``/``minimum`` and the ``max``/``min`` reductions propagate NaN,
  like numpy and torch (PTX ``max.NaN.f32``, not plain ``max.f32``); which
  zero ``maximum(-0.0, +0.0)`` returns is unspecified.
* ``i32`` arithmetic wraps modulo 2**32.  ``floordiv`` and ``rem`` use floor
  semantics like Python (``-7 // 2 == -4``, ``-7 % 2 == 1``: the remainder has
  the divisor's sign); ``cdiv(a, b)`` is ``ceil(a / b) == -(-a // b)``.
  Integer division by zero is unspecified on the GPU; here it gives 0, so
  lanes masked off by a later ``select`` are harmless.
* Shifts read their count as unsigned: ``x << n`` is 0 and ``x >> n`` (arithmetic) the
  sign for a count of 32 or more, or a negative one (PTX clamps the count the same way).
* ``pow``, ``sigmoid`` and ``fma`` compute in float64 and round once (numpy's float32
  ``pow`` is off by an ulp; ``fma`` thus rounds once, up to double-rounding ties).  ``erf``
  is Python's ``math.erf`` element by element (numpy has none): the one op here that loops
  in Python.  A ``mean`` is the float64 sum divided by the extent, rounded once.
* What each elementwise op computes is declared once, on its class
  (``tkc/ir/dialects/elementwise.py``); this module only applies it.
* ``mma`` is ``a @ b`` as a float32 matmul plus ``acc`` in float32.
* ``reduce`` sums floats in float64 and rounds once to the result dtype: the
  best answer any order of f32 additions can approach, independent of numpy's
  summation order.  Integer sums wrap; ``max``/``min`` are exact.
* Programs run one after another, in row-major order of their ids.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tkc import dtypes, signature
from tkc.dtypes import DType, round_to
from tkc.errors import TkcError, TkcInterpretError, TkcLaunchError
from tkc.ir.core import Block, BlockArgument, Module, Operation, OpResult, Value
from tkc.ir.dialects import tile
from tkc.ir.types import TensorType, shape_of

__all__ = ["evaluate", "interpret_module", "launch_grid", "random_args", "run_kernel"]


# --------------------------------------------------------------- execution
@dataclass
class _Ctx:
    """One program's state: its ids, the grid, and the value of every SSA
    value computed so far (SSA, so one flat dict serves nested regions)."""

    pid: tuple[int, ...] | None  # None while evaluating the launch grid
    grid: tuple[int, ...]
    env: dict[Value, Any]
    written: set[int] = field(default_factory=set)  # id() of tensors stored to
    sms: int = 0  # what tile.num_sms reads (CPU_SMS unless a launch says otherwise)
    cluster: Any = None  # while a cluster's programs run: (rank, results, parts, occurrences)

    def run(self, block: Block) -> list[Any]:
        """Run a block's ops; return what its ``tile.yield`` yields ([] for ``tile.return``)."""
        env = self.env
        for op in block.ops:
            if op.name == "tile.yield":
                return [env[v] for v in op.operands]
            if op.name == "tile.return":
                return []
            handler = _HANDLERS.get(op.name)
            if handler is None:
                raise TkcInterpretError(f"the interpreter cannot run op '{op.name}'", op.loc)
            try:
                out = handler(self, op, *[env[v] for v in op.operands])
            except TkcError:
                raise
            except (ValueError, TypeError, IndexError, KeyError) as e:
                # Malformed (unverified) IR usually surfaces as a numpy error; point at the op.
                raise TkcInterpretError(f"'{op.name}' failed: {e}", op.loc) from e
            if isinstance(out, list):
                env.update(zip(op.results, out))
            elif op.results:
                env[op.results[0]] = _checked(np.asarray(out), op)
        return []


def _checked(x: np.ndarray, op: Operation) -> np.ndarray:
    # A cheap self-check: a handler that disagrees with the result type is an
    # interpreter bug (or IR that skipped the verifier), not a kernel bug.
    t = op.results[0].type
    if x.shape != shape_of(t) or x.dtype != t.dtype.np_storage:
        raise TkcInterpretError(
            f"'{op.name}' produced {x.dtype}{list(x.shape)} for result type {t}", op.loc)
    return x


def _rounded(x: Any, op: Operation) -> np.ndarray:
    return round_to(x, op.results[0].type.dtype)


def _elementwise(fn: Callable[..., Any]) -> Callable[..., np.ndarray]:
    return lambda ctx, op, *xs: _rounded(fn(*xs), op)


_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "eq": np.equal, "ne": np.not_equal}


# ------------------------------------------------------------- structure
def _for(ctx: _Ctx, op: Operation, lb: Any, ub: Any, step: Any, *init: Any) -> list[Any]:
    if int(step) <= 0:
        raise TkcInterpretError(f"loop step must be positive, got {int(step)}", op.loc)
    body = op.regions[0].block
    carried = list(init)
    for i in range(int(lb), int(ub), int(step)):
        ctx.env[body.args[0]] = np.asarray(i, np.int32)
        ctx.env.update(zip(body.args[1:], carried))
        carried = ctx.run(body)
    return carried


def _if(ctx: _Ctx, op: Operation, cond: Any) -> list[Any]:
    return ctx.run(op.regions[0 if bool(cond) else 1].block)


def _program_id(ctx: _Ctx, op: Operation) -> np.ndarray:
    if ctx.pid is None:
        raise TkcInterpretError("the launch grid cannot depend on program ids", op.loc)
    return np.asarray(ctx.pid[op.axis] if op.axis < len(ctx.pid) else 0, np.int32)


#: The SM count the interpreter and the emulator pretend to have: small, so that a persistent
#: kernel's programs each walk several output tiles in the tests.
CPU_SMS = 4


def _num_sms(ctx: _Ctx, op: Operation) -> np.ndarray:
    return np.asarray(ctx.sms or CPU_SMS, np.int32)


def _num_programs(ctx: _Ctx, op: Operation) -> np.ndarray:
    if ctx.pid is None:
        raise TkcInterpretError("the launch grid cannot depend on num_programs", op.loc)
    return np.asarray(ctx.grid[op.axis] if op.axis < len(ctx.grid) else 1, np.int32)


# ------------------------------------------------------------------ memory
def _box_slices(shape: Sequence[int], offsets: Sequence[Any], box: Sequence[int]):
    """(tensor slices, box slices) of the in-bounds part of a box, or None if
    no element of the box lies inside the tensor."""
    src, dst = [], []
    for size, off, ext in zip(shape, offsets, box):
        off = int(off)  # python int: off + ext must not wrap like i32
        lo, hi = max(off, 0), min(off + ext, size)
        if lo >= hi:
            return None
        src.append(slice(lo, hi))
        dst.append(slice(lo - off, hi - off))
    return tuple(src), tuple(dst)


def _load(ctx: _Ctx, op: Operation, tensor: np.ndarray, *offsets: Any) -> np.ndarray:
    dt = op.operands[0].type.dtype
    out = np.full(op.box, round_to(0 if op.other is None else op.other, dt), dt.np_storage)
    sl = _box_slices(tensor.shape, offsets, op.box)
    if sl is not None:
        out[sl[1]] = tensor[sl[0]]  # a copy: later stores must not change a loaded tile
    return out.reshape(shape_of(op.results[0].type))  # drops the squeezed size-1 axes


def _store(ctx: _Ctx, op: Operation, tensor: np.ndarray, value: Any, *offsets: Any) -> None:
    sl = _box_slices(tensor.shape, offsets, op.box)
    if sl is not None:
        tensor[sl[0]] = np.reshape(value, op.box)[sl[1]]
    ctx.written.add(id(tensor))


def _reduce(ctx: _Ctx, op: Operation, x: np.ndarray) -> np.ndarray:
    if op.kind in ("sum", "mean"):
        # float64 for floats (see the module docstring); int64 then wrap for i32.
        acc = np.float64 if op.operands[0].type.dtype.is_float else np.int64
        total = np.sum(x, axis=op.axis, dtype=acc)
        return _rounded(total / x.shape[op.axis] if op.kind == "mean" else total, op)
    return _rounded((np.max if op.kind == "max" else np.min)(x, axis=op.axis), op)


def _mma(ctx: _Ctx, op: Operation, a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    return _rounded(np.matmul(a, b, dtype=np.float32) + acc, op)


def _constant(ctx: _Ctx, op: Operation) -> np.ndarray:
    t = op.results[0].type
    return np.full(shape_of(t), round_to(op.value, t.dtype), t.dtype.np_storage)


class _Suspend(Exception):
    """A program reached a cluster reduction whose other programs' parts are not all in."""


def combine_ranks(kind: str, parts: Sequence[np.ndarray]) -> np.ndarray:
    """A cluster reduction's result from its ranks' f32 parts: combined in rank order, each
    step rounded to f32 (what every thread does with the slots on the GPU)."""
    fn = {"max": np.maximum, "min": np.minimum, "sum": np.add}[kind]
    acc = np.asarray(parts[0], np.float32)
    for p in parts[1:]:
        acc = fn(acc, p).astype(np.float32)
    return acc


def _cluster_reduce(ctx: _Ctx, op: Operation, x: np.ndarray) -> np.ndarray:
    if ctx.cluster is None:
        raise TkcInterpretError("a cluster reduction outside a launch in clusters", op.loc)
    rank, results, parts, seen = ctx.cluster
    k = seen.get(op, 0)
    seen[op] = k + 1
    if (op, k) in results:
        return results[(op, k)]
    parts.setdefault((op, k), {})[rank] = np.asarray(x, np.float32).copy()
    raise _Suspend()


_HANDLERS: dict[str, Callable[..., Any]] = {
    # What each elementwise op computes is declared on its class (tkc/ir/dialects/elementwise.py).
    **{cls.name: _elementwise(cls.compute) for cls in tile.ELEMENTWISE_OPS},
    "tile.cmp": lambda ctx, op, a, b: _CMP[op.pred](a, b),
    "tile.select": lambda ctx, op, c, a, b: np.where(c, a, b),
    "tile.cast": lambda ctx, op, x: _rounded(x, op),
    "tile.constant": _constant,
    "tile.arange": lambda ctx, op: np.arange(op.start, op.start + op.results[0].type.shape[0],
                                             dtype=np.int32),
    "tile.splat": lambda ctx, op, x: np.full(shape_of(op.results[0].type), x, x.dtype),
    "tile.broadcast": lambda ctx, op, x: np.broadcast_to(x, op.results[0].type.shape),
    "tile.expand_dims": lambda ctx, op, x: np.expand_dims(x, op.axis),
    "tile.transpose": lambda ctx, op, x: np.transpose(x),
    "tile.reduce": _reduce,
    "tile.cluster_reduce": _cluster_reduce,
    "tile.mma": _mma,
    "tile.load": _load,
    "tile.store": _store,
    "tile.dim": lambda ctx, op, t: np.asarray(t.shape[op.axis], np.int32),
    "tile.program_id": _program_id,
    "tile.num_programs": _num_programs,
    "tile.num_sms": _num_sms,
    "tile.for": _for,
    "tile.if": _if,
    "tile.grid": lambda ctx, op, *extents: None,  # read by launch_grid; nothing to do per program
    # select-layouts output stays interpretable: a layout change moves no element.
    "hopper.convert_layout": lambda ctx, op, x, *scratch: x,
    "hopper.to_smem": lambda ctx, op, x: x,
}


def evaluate(op: Operation, operands: Sequence[np.ndarray]) -> np.ndarray:
    """What a pure, region-free op computes from ``operands`` (storage-form
    arrays; 0-d arrays stand for splat tiles, since elementwise ops do not
    depend on the shape).  Passes fold constants through this, so a fold is
    exactly what running the op would give -- there is no second copy of an
    op's meaning."""
    with np.errstate(all="ignore"):
        return np.asarray(_HANDLERS[op.name](None, op, *operands))


# ------------------------------------------------------------ launching
def _as_kernel(kernel: Operation | Module) -> Operation:
    if isinstance(kernel, Module):
        kernel = kernel.kernel()
    if not isinstance(kernel, Operation) or kernel.name != "tile.kernel":
        raise TkcLaunchError(f"expected a 'tile.kernel' op, got {kernel!r}")
    return kernel


def _pname(arg: BlockArgument) -> str:
    return arg.name_hint or f"argument {arg.index}"


_is_torch = signature.is_torch


def _scalar(p: BlockArgument, dt: DType, x: Any) -> np.ndarray:
    """A scalar argument as a 0-d array of ``dt``, or a TkcLaunchError."""
    return round_to(signature.check_scalar(_pname(p), dt, x), dt)


def _check_args(kernel: Operation, args: Sequence[Any]) -> None:
    signature.bind(kernel.sym_name, signature.kernel_params(kernel), args)


def _grid_op(kernel: Operation) -> Operation:
    for op in kernel.regions[0].block.ops:
        if op.name == "tile.grid":
            return op
    raise TkcInterpretError(f"kernel @{kernel.sym_name} has no grid(...) statement; pass grid=",
                            kernel.loc)


def _eval_grid(kernel: Operation, env: dict[Value, Any], sms: int = 0) -> tuple[int, ...]:
    """Evaluate only the ops the grid extents depend on (in program order):
    other ops before ``tile.grid`` may read tensors, which need not exist here."""
    grid_op = _grid_op(kernel)
    needed: set[Operation] = set()
    stack = list(grid_op.operands)
    while stack:
        v = stack.pop()
        if isinstance(v, OpResult) and v.owner not in needed:
            if v.owner.regions or v.owner.name in ("tile.load", "tile.store"):
                raise TkcInterpretError("grid extents must be computed from tensor sizes, scalar "
                                        "arguments and constants", v.owner.loc)
            needed.add(v.owner)
            stack.extend(v.owner.operands)
    ctx = _Ctx(None, (), env, sms=sms)
    block = Block()  # a scratch block holding the slice; ops keep their real parent
    block.ops = [op for op in kernel.regions[0].block.ops if op in needed]
    ctx.run(block)
    grid = tuple(int(env[v]) for v in grid_op.operands)
    if any(g < 0 for g in grid):
        raise TkcInterpretError(f"grid extents are negative: {grid}", grid_op.loc)
    return grid


class _Shape:
    """Stands in for a tensor while computing the grid: only its shape is read."""

    def __init__(self, shape: Sequence[int]):
        self.shape = tuple(shape)


def launch_grid(kernel: Operation | Module, args: Sequence[Any], sms: int = 0) -> tuple[int, ...]:
    """The grid a launch of ``kernel`` with ``args`` uses: the extents of its
    ``tile.grid`` op.  Tensor contents are never read (they may live on a GPU).
    ``sms``: the device's SM count, for grids sized by ``tile.num_sms`` (default
    ``CPU_SMS``)."""
    kernel = _as_kernel(kernel)
    _check_args(kernel, args)
    env: dict[Value, Any] = {}
    for p, x in zip(kernel.regions[0].block.args, args):
        env[p] = _Shape(x.shape) if isinstance(p.type, TensorType) else _scalar(p, p.type.dtype, x)
    with np.errstate(all="ignore"):
        return _eval_grid(kernel, env, sms)


def _check_grid(grid: Any) -> tuple[int, ...]:
    if isinstance(grid, (int, np.integer)):
        grid = (grid,)
    ok = isinstance(grid, (tuple, list)) and 1 <= len(grid) <= 3 and all(
        isinstance(g, (int, np.integer)) and not isinstance(g, bool) and g >= 0 for g in grid)
    if not ok:
        raise TkcLaunchError(f"grid must be 1 to 3 non-negative integers, got {grid!r}")
    return tuple(int(g) for g in grid)


def run_kernel(kernel: Operation | Module, args: Sequence[Any], grid: Any = None) -> None:
    """Run ``kernel`` over ``grid`` (default: :func:`launch_grid`), writing its
    outputs in place into the tensors in ``args``.

    Tensors are numpy arrays in storage form (float32 for every float dtype;
    float16 is also accepted for f16) or torch tensors; their values are rounded
    to the declared dtype on entry.  Scalars are python or numpy numbers.
    """
    kernel = _as_kernel(kernel)
    _check_args(kernel, args)
    params = kernel.regions[0].block.args
    env: dict[Value, Any] = {}
    working: dict[int, np.ndarray] = {}  # id(arg) -> the array the kernel runs on
    for p, x in zip(params, args):
        if not isinstance(p.type, TensorType):
            env[p] = _scalar(p, p.type.dtype, x)
        elif id(x) in working:  # the same tensor passed twice stays one tensor
            env[p] = working[id(x)]
        elif isinstance(x, np.ndarray) and x.dtype == p.type.dtype.np_storage and p.type.dtype in (
                dtypes.f32, dtypes.i32, dtypes.i1) and x.flags.writeable:
            env[p] = working[id(x)] = x  # already exactly the storage form: run in place
        else:
            st = dtypes.from_torch_tensor(x)[0] if _is_torch(x) else x
            env[p] = working[id(x)] = round_to(st, p.type.dtype)
    ctx = _Ctx(None, (), env)
    with np.errstate(all="ignore"):
        ctx.grid = _eval_grid(kernel, dict(env)) if grid is None else _check_grid(grid)
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
            _write_back(params, args, working, ctx.written)


def _run_clusters(ctx: _Ctx, kernel: Operation, env: dict[Value, Any]) -> None:
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
                    except _Suspend:
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


def _write_back(params: Sequence[BlockArgument], args: Sequence[Any], working: dict[int, np.ndarray],
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
            raise TkcLaunchError(f"{_pname(p)}: the kernel stores to it, but the numpy array is read-only "
                                 "(pass a writeable array, e.g. a copy)")
        if _is_torch(x):
            import torch

            with torch.no_grad():
                x.copy_(dtypes.to_torch(w, p.type.dtype))
        else:
            x[...] = w  # exact: w holds values of the array's own dtype


# ----------------------------------------------------------- random inputs
def random_args(kernel: Operation | Module, dims: dict[str, int], seed: int = 0,
                int_range: tuple[int, int] = (-8, 8)) -> list[Any]:
    """Fresh random arguments for every parameter of ``kernel``.

    Float tensors are N(0, 1) rounded to their dtype, i32 tensors integers in
    ``int_range`` (both ends included), bool tensors fair coins (outputs too: the
    interpreter cannot tell them apart).  Float scalars are uniform in [0.5, 1.5],
    i32 scalars in [1, 8].  Symbolic tensor dims come from ``dims``.
    """
    kernel = _as_kernel(kernel)
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
    if dt.is_int:
        lo, hi = int_range if shape else (1, 8)
        if not dt.min <= lo <= hi <= dt.max:
            raise TkcLaunchError(f"random_args: integer range [{lo}, {hi}] is empty or does not fit in {dt.name}")
        return rng.integers(lo, hi + 1, shape, dtype=np.int64).astype(np.int32)
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
