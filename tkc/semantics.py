"""What every ``tile`` op computes, on numpy: the meaning of tile IR.

The one home of the ops' semantics: the interpreter runs kernels with it (``tkc/interpreter.py``
launches programs over a grid), the launch grid is evaluated with it (``tkc/grid.py``),
``canonicalize`` folds constants through :func:`evaluate`, and the emulator computes scalar and
value-by-value ops through :func:`evaluate`.  What an elementwise op computes is declared on its
class (``tkc/ir/dialects/elementwise.py``); this module applies it, and holds the meaning of
every other op (memory, reductions, ``mma``, loops, branches, ids).  The ops that only mean
something across the ranks of a multi-GPU launch (``tile.peer``, ``tile.wait``,
``tile.rank_barrier``) are ``tkc/ranks.py``'s, which runs these programs on several ranks.

It favours being obviously right over being fast, while staying vectorized (one numpy op per
IR op, never a Python loop over elements).  It must not know how values round -- every
rounding goes through :func:`tkc.dtypes.round_to` -- and it must not depend on torch.

Numerics (decisions the op docstrings leave open):

* Values are numpy arrays in their dtype's storage form (``DType.np_storage``):
  float32 for every float dtype, int32 for ``i32``, int64 for ``i64``, bool for ``i1``, the
  byte (uint8) for a pair of FP4 values (``f4e2m1x2``).  Scalars
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
* ``i32`` arithmetic wraps modulo 2**32, ``i64`` modulo 2**64.  ``floordiv`` and ``rem`` use floor
  semantics like Python (``-7 // 2 == -4``, ``-7 % 2 == 1``: the remainder has
  the divisor's sign); ``cdiv(a, b)`` is ``ceil(a / b) == -(-a // b)``.
  Integer division by zero is unspecified on the GPU; here it gives 0, so
  lanes masked off by a later ``select`` are harmless.
* Shifts read their count as unsigned: ``x << n`` is 0 and ``x >> n`` (arithmetic) the
  sign for a count of the width (32 for ``i32``, 64 for ``i64``) or more, or a negative one
  (PTX clamps the count the same way).
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
* ``arg_reduce`` (``argmax``/``argmin``) gives the first index of the extreme on ties, and
  of the first NaN if there is one (NaN counts as the largest and the smallest, as in torch).
* ``scan`` (``cumsum``/``cumprod``) likewise accumulates floats in float64 and rounds each
  prefix once.  The GPU adds in f32 in its layout's order (in thread, then lanes, then warps:
  ``scan_plan``), so a prefix of n terms may differ from this by about
  ``log2(n) * 2**-24 * sum(|x|)`` plus a rounding of the dtype; integer scans are exact
  (wrapping like the sums).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from tkc import dtypes
from tkc.dtypes import round_to
from tkc.errors import TkcError, TkcInterpretError
from tkc.ir.core import Block, Operation, Value
from tkc.ir.dialects import philox, tile
from tkc.ir.types import shape_of
from tkc.races import WriteLog

__all__ = ["CPU_SMS", "Program", "Suspended", "combine_ranks", "evaluate"]


# --------------------------------------------------------------- execution
@dataclass
class Program:
    """One program's state: its ids, the grid, and the value of every SSA
    value computed so far (SSA, so one flat dict serves nested regions)."""

    pid: tuple[int, ...] | None  # None while evaluating the launch grid
    grid: tuple[int, ...]
    env: dict[Value, Any]
    written: set[int] = field(default_factory=set)  # id() of tensors stored to
    sms: int = 0  # what tile.num_sms reads (CPU_SMS unless a launch says otherwise)
    cluster: Any = None  # while a cluster's programs run: (rank, results, parts, occurrences)
    log: WriteLog | None = None  # who wrote which element: write-write races (tkc/races.py)
    rank: int = 0  # what tile.rank reads: this program's rank of a multi-GPU launch (tkc/ranks.py)
    num_ranks: int = 1
    #: What runs each op, by name; tkc/ranks.py's programs add the ops of several ranks.
    handlers: ClassVar[dict[str, Callable[..., Any]]]

    @property
    def who(self) -> Any:
        """This program, as races (tkc/races.py) name it."""
        return self.pid

    def run(self, block: Block) -> list[Any]:
        """Run a block's ops; return what its ``tile.yield`` yields ([] for ``tile.return``)."""
        env = self.env
        for op in block.ops:
            if op.name == "tile.yield":
                return [env[v] for v in op.operands]
            if op.name == "tile.return":
                return []
            handler = self.handlers.get(op.name)
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
def _for(ctx: Program, op: Operation, lb: Any, ub: Any, step: Any, *init: Any) -> list[Any]:
    if int(step) <= 0:
        raise TkcInterpretError(f"loop step must be positive, got {int(step)}", op.loc)
    body = op.regions[0].block
    carried = list(init)
    for i in range(int(lb), int(ub), int(step)):
        ctx.env[body.args[0]] = np.asarray(i, np.int32)
        ctx.env.update(zip(body.args[1:], carried))
        carried = ctx.run(body)
    return carried


def _if(ctx: Program, op: Operation, cond: Any) -> list[Any]:
    return ctx.run(op.regions[0 if bool(cond) else 1].block)


def _program_id(ctx: Program, op: Operation) -> np.ndarray:
    if ctx.pid is None:
        raise TkcInterpretError("the launch grid cannot depend on program ids", op.loc)
    return np.asarray(ctx.pid[op.axis] if op.axis < len(ctx.pid) else 0, np.int32)


#: The SM count the interpreter and the emulator pretend to have: small, so that a persistent
#: kernel's programs each walk several output tiles in the tests.
CPU_SMS = 4


def _num_sms(ctx: Program, op: Operation) -> np.ndarray:
    return np.asarray(ctx.sms or CPU_SMS, np.int32)


def _num_programs(ctx: Program, op: Operation) -> np.ndarray:
    if ctx.pid is None:
        raise TkcInterpretError("the launch grid cannot depend on num_programs", op.loc)
    return np.asarray(ctx.grid[op.axis] if op.axis < len(ctx.grid) else 1, np.int32)


# ------------------------------------------------------------------ memory
def _box_slices(shape: Sequence[int], offsets: Sequence[Any], box: Sequence[int],
                steps: Sequence[int] | None = None):
    """(tensor slices, box slices) of the in-bounds part of a box (element ``j`` along an axis
    at ``offset + j * step``), or None if no element of the box lies inside the tensor."""
    src, dst = [], []
    for size, off, ext, step in zip(shape, offsets, box, steps or [1] * len(box)):
        off = int(off)  # python int: off + ext must not wrap like i32
        lo = max(-(off // step), 0)  # the first j with off + j * step >= 0
        hi = min(ext, -((off - size) // step))  # past the last j with off + j * step < size
        if lo >= hi:
            return None
        src.append(slice(off + lo * step, off + (hi - 1) * step + 1, step))
        dst.append(slice(lo, hi))
    return tuple(src), tuple(dst)


def _load(ctx: Program, op: Operation, tensor: np.ndarray, *offsets: Any) -> np.ndarray:
    dt = op.operands[0].type.dtype
    out = np.full(op.box, round_to(0 if op.other is None else op.other, dt), dt.np_storage)
    sl = _box_slices(tensor.shape, offsets, op.box, op.steps)
    if sl is not None:
        out[sl[1]] = tensor[sl[0]]  # a copy: later stores must not change a loaded tile
    return out.reshape(shape_of(op.results[0].type))  # drops the squeezed size-1 axes


def gather_elements(op: Operation, tensor: np.ndarray, index: np.ndarray, offsets: Sequence[Any]
                    ) -> tuple[list[np.ndarray], np.ndarray]:
    """Where a gather reads: per tensor axis the coordinate of each result element, and
    whether the element lies inside the tensor."""
    squeeze = set(op.squeeze or [])
    shape = shape_of(op.results[0].type)
    kept = [a for a in range(tensor.ndim) if a not in squeeze]
    grids = np.indices(shape, dtype=np.int64)
    idx, inb = [], np.ones(shape, bool)
    for a, off in enumerate(offsets):
        if a in squeeze:
            pos = np.full(shape, int(off), np.int64)
        elif a == op.axis:
            pos = int(off) + index.astype(np.int64)
        else:
            pos = int(off) + grids[kept.index(a)]
        inb &= (pos >= 0) & (pos < tensor.shape[a])
        idx.append(np.where(inb, pos, 0))
    return idx, inb


def _gather(ctx: Program, op: Operation, tensor: np.ndarray, index: np.ndarray, *offsets: Any) -> np.ndarray:
    dt = op.tensor.type.dtype
    other = round_to(0 if op.other is None else op.other, dt)
    shape = shape_of(op.results[0].type)
    if tensor.size == 0:
        return np.full(shape, other, dt.np_storage)
    idx, inb = gather_elements(op, tensor, index, offsets)
    return np.where(inb, tensor[tuple(np.where(inb, i, 0) for i in idx)], other).astype(dt.np_storage)


def _store(ctx: Program, op: Operation, tensor: np.ndarray, value: Any, *offsets: Any) -> None:
    sl = _box_slices(tensor.shape, offsets, op.box, op.steps)
    if sl is not None:
        _log_write(ctx, op, tensor, sl[0], atomic=False)
        tensor[sl[0]] = np.reshape(value, op.box)[sl[1]]
    ctx.written.add(id(tensor))


def _masked_store(ctx: Program, op: Operation, tensor: np.ndarray, value: Any, mask: Any, *offsets: Any) -> None:
    sl = _box_slices(tensor.shape, offsets, op.box)
    if sl is not None:
        keep = np.reshape(mask, op.box)[sl[1]]
        region = tensor[sl[0]]  # a view: writing it writes the tensor
        where = tuple(i + s.start for i, s in zip(np.nonzero(keep), sl[0]))
        _log_write(ctx, op, tensor, where, atomic=False)
        region[keep] = np.reshape(value, op.box)[sl[1]][keep]
    ctx.written.add(id(tensor))


def _log_write(ctx: Program, op: Operation, tensor: np.ndarray, index: Any, atomic: bool) -> None:
    if ctx is None or ctx.log is None:
        return
    race = ctx.log.write(tensor, index, ctx.who, op.loc, atomic)
    if race is not None:
        raise TkcInterpretError(race.message(ctx.who, atomic), op.loc)


#: The NaN an f32 atomic max/min takes for any NaN value (the GPU's ``max.NaN`` result).
CANONICAL_NAN = 0x7FFFFFFF


def atomic_update(kind: str, dt: Any, old: np.ndarray, value: np.ndarray,
                  expected: np.ndarray | None = None) -> np.ndarray:
    """The new elements of an atomic ``kind`` from the ``old`` ones and ``value`` (storage form).

    ``add`` rounds each sum once to the dtype (i32 wraps).  An f32 ``max``/``min`` is what the
    GPU does, which has no float atomic max: an integer max (min) of the bits where ``value``'s
    sign is clear, an unsigned min (max) where it is set -- the float order for every pair of
    non-NaN values, -0.0 below +0.0.  A NaN ``value`` is first made the one NaN 0x7fffffff (the
    GPU's own): it wins every max and loses every min, whatever sign the arithmetic that made it
    left (numpy's NaNs are negative, the GPU's positive).  ``cas`` compares bits."""
    if kind == "add":
        if dt.is_float:
            return round_to(old.astype(np.float32) + value.astype(np.float32), dt)
        return (old.astype(np.int64) + value).astype(np.int32)
    if kind in ("max", "min"):
        if not dt.is_float:
            return (np.maximum if kind == "max" else np.minimum)(old, value)
        v = np.asarray(value, np.float32)
        ob, vb = old.astype(np.float32).view(np.int32), np.where(np.isnan(v), np.int32(CANONICAL_NAN), v.view(np.int32))
        signed, unsigned = (np.maximum, np.minimum) if kind == "max" else (np.minimum, np.maximum)
        bits = np.where(vb >= 0, signed(ob, vb), unsigned(ob.view(np.uint32), vb.view(np.uint32)).view(np.int32))
        return bits.astype(np.int32).view(np.float32)
    if kind == "exch":
        return np.array(value, dtype=old.dtype)
    if kind == "cas":
        st = np.int32 if dt.bits == 32 else np.int16
        same = old.astype(dt.np_storage).view(st) == np.asarray(expected, dt.np_storage).view(st)
        return np.where(same, value, old).astype(old.dtype)
    raise ValueError(f"unknown atomic kind {kind!r}")


def _atomic(ctx: Program, op: Operation, tensor: np.ndarray, *rest: Any) -> np.ndarray | None:
    """``tile.atomic``/``tile.atomic_cas``: exact, in program order.  On one element the old value
    comes back (0 where the element lies outside the tensor, which is left alone)."""
    kind = tile.atomic_kind(op)
    n = 2 if kind == "cas" else 1
    values, offsets = rest[:n], rest[n:]
    dt = op.tensor.type.dtype
    if ctx.cluster is not None:  # a cluster's programs rerun up to each reduction: apply once
        rank, results, _, seen = ctx.cluster
        k = seen.get(op, 0)
        seen[op] = k + 1
        if (op, k, rank) in results:
            return results[(op, k, rank)]
    old = np.zeros((), dt.np_storage)
    sl = _box_slices(tensor.shape, offsets, op.box)
    if sl is not None:
        _log_write(ctx, op, tensor, sl[0], atomic=True)
        cur = tensor[sl[0]]
        value = np.reshape(np.broadcast_to(values[-1], shape_of(op.value.type)), op.box)[sl[1]]
        expected = values[0] if kind == "cas" else None
        if op.results:  # one element
            old = np.reshape(cur.copy(), ())
        tensor[sl[0]] = atomic_update(kind, dt, cur, value, expected)
    ctx.written.add(id(tensor))
    out = old if op.results else None
    if ctx.cluster is not None:
        ctx.cluster[1][(op, ctx.cluster[3][op] - 1, ctx.cluster[0])] = out
    return out


def _reduce(ctx: Program, op: Operation, x: np.ndarray) -> np.ndarray:
    if op.kind in ("sum", "mean"):
        # float64 for floats (see the module docstring); int64 (wrapping) then wrap for i32.
        acc = np.float64 if op.operands[0].type.dtype.is_float else np.int64
        total = np.sum(x, axis=op.axis, dtype=acc)
        return _rounded(total / x.shape[op.axis] if op.kind == "mean" else total, op)
    return _rounded((np.max if op.kind == "max" else np.min)(x, axis=op.axis), op)


def _scan(ctx: Program, op: Operation, x: np.ndarray) -> np.ndarray:
    # float64 for floats (see the module docstring); int64 then wrap for i32.
    acc = np.float64 if op.operands[0].type.dtype.is_float else np.int64
    fn = np.cumsum if op.kind == "sum" else np.cumprod
    return _rounded(fn(x, axis=op.axis, dtype=acc), op)


def _arg_reduce(ctx: Program, op: Operation, x: np.ndarray) -> np.ndarray:
    # numpy's argmax/argmin pick the first index on ties and the first NaN, like torch.
    return (np.argmax if op.kind == "argmax" else np.argmin)(x, axis=op.axis).astype(np.int32)


def _mma(ctx: Program, op: Operation, a: np.ndarray, b: np.ndarray, acc: np.ndarray, *scales: np.ndarray) -> np.ndarray:
    if scales:  # block-scaled (a dot_scaled the target's tensor cores scale themselves)
        return _dot_scaled(ctx, op, a, scales[0], b, scales[1], acc)
    return _rounded(np.matmul(a, b, dtype=np.float32) + acc, op)


def _dot_scaled(ctx: Program, op: Operation, a: np.ndarray, sa: np.ndarray, b: np.ndarray, sb: np.ndarray,
                acc: np.ndarray) -> np.ndarray:
    # Each operand times its scale is a bf16 (exact in bf16's range, as MX and NVFP4
    # quantizations of bf16 data are; beyond it inf, below it bf16's subnormals or 0, through
    # f32 as the compiler's decomposition rounds it); the products are summed in float64 and
    # rounded to f32 once with the accumulator.  FP4 pairs run along K: a's along its rows, b's
    # down its columns.
    block = tile.scale_block(op)
    if tile.scale_dtype(op) == dtypes.f8e4m3:  # NVFP4's scales are unsigned (UE4M3): their magnitudes
        sa, sb = np.abs(sa), np.abs(sb)
    if op.a.type.dtype.is_packed:
        a = dtypes.unpack_fp4(a)
    if op.b.type.dtype.is_packed:
        b = dtypes.unpack_fp4(b.T).T
    a = round_to(round_to(a.astype(np.float64) * np.repeat(sa.astype(np.float64), block, axis=1),
                          dtypes.f32), dtypes.bf16)
    b = round_to(round_to(b.astype(np.float64) * np.repeat(sb.astype(np.float64), block, axis=0),
                          dtypes.f32), dtypes.bf16)
    return _rounded(np.matmul(a.astype(np.float64), b.astype(np.float64)) + acc, op)


def _unpack_fp4(ctx: Program, op: Operation, x: np.ndarray) -> np.ndarray:
    return dtypes.e2m1_value(np.asarray(x).astype(np.uint8) >> np.uint8(4 * op.half))


def _pack_fp4(ctx: Program, op: Operation, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.asarray(dtypes.e2m1_code(lo) | (dtypes.e2m1_code(hi) << np.uint8(4)), np.uint8)


def _constant(ctx: Program, op: Operation) -> np.ndarray:
    t = op.results[0].type
    return np.full(shape_of(t), round_to(op.value, t.dtype), t.dtype.np_storage)


class Suspended(Exception):
    """A program reached a cluster reduction whose other programs' parts are not all in."""


def combine_ranks(kind: str, parts: Sequence[np.ndarray]) -> np.ndarray:
    """A cluster reduction's result from its ranks' f32 parts: combined in rank order, each
    step rounded to f32 (what every thread does with the slots on the GPU)."""
    fn = {"max": np.maximum, "min": np.minimum, "sum": np.add}[kind]
    acc = np.asarray(parts[0], np.float32)
    for p in parts[1:]:
        acc = fn(acc, p).astype(np.float32)
    return acc


def _cluster_reduce(ctx: Program, op: Operation, x: np.ndarray) -> np.ndarray:
    if ctx.cluster is None:
        raise TkcInterpretError("a cluster reduction outside a launch in clusters", op.loc)
    rank, results, parts, seen = ctx.cluster
    k = seen.get(op, 0)
    seen[op] = k + 1
    if (op, k) in results:
        return results[(op, k)]
    parts.setdefault((op, k), {})[rank] = np.asarray(x, np.float32).copy()
    raise Suspended()


_HANDLERS: dict[str, Callable[..., Any]] = {
    # What each elementwise op computes is declared on its class (tkc/ir/dialects/elementwise.py).
    **{cls.name: _elementwise(cls.compute) for cls in tile.ELEMENTWISE_OPS},
    "tile.cmp": lambda ctx, op, a, b: _CMP[op.pred](a, b),
    "tile.select": lambda ctx, op, c, a, b: np.where(c, a, b),
    "tile.cast": lambda ctx, op, x: _rounded(x, op),
    "tile.unpack_fp4": _unpack_fp4,
    "tile.pack_fp4": _pack_fp4,
    "tile.constant": _constant,
    "tile.rand": lambda ctx, op, seed, offset: philox.uniform(seed, offset),
    "tile.arange": lambda ctx, op: np.arange(op.start, op.start + op.results[0].type.shape[0],
                                             dtype=np.int32),
    "tile.splat": lambda ctx, op, x: np.full(shape_of(op.results[0].type), x, x.dtype),
    "tile.broadcast": lambda ctx, op, x: np.broadcast_to(x, op.results[0].type.shape),
    "tile.expand_dims": lambda ctx, op, x: np.expand_dims(x, op.axis),
    "tile.transpose": lambda ctx, op, x: np.transpose(x),
    "tile.reshape": lambda ctx, op, x: np.reshape(x, op.results[0].type.shape),
    "tile.take": lambda ctx, op, x: np.ascontiguousarray(np.take(x, op.index, axis=op.axis)),
    "tile.stack": lambda ctx, op, *xs: np.stack(xs, axis=op.axis),
    "tile.reduce": _reduce,
    "tile.scan": _scan,
    "tile.arg_reduce": _arg_reduce,
    "tile.cluster_reduce": _cluster_reduce,
    "tile.mma": _mma,
    "tile.dot_scaled": _dot_scaled,
    "tile.load": _load,
    "tile.gather": _gather,
    "tile.store": _store,
    "tile.masked_store": _masked_store,
    "tile.atomic": _atomic,
    "tile.atomic_cas": _atomic,
    "tile.dim": lambda ctx, op, t: np.asarray(t.shape[op.axis], np.int32),
    "tile.program_id": _program_id,
    "tile.num_programs": _num_programs,
    "tile.num_sms": _num_sms,
    "tile.rank": lambda ctx, op: np.asarray(ctx.rank, np.int32),
    "tile.num_ranks": lambda ctx, op: np.asarray(ctx.num_ranks, np.int32),
    "tile.for": _for,
    "tile.if": _if,
    "tile.grid": lambda ctx, op, *extents: None,  # read by launch_grid; nothing to do per program
    # select-layouts output stays interpretable: a layout change moves no element.
    "hopper.convert_layout": lambda ctx, op, x, *scratch: x,
    "hopper.to_smem": lambda ctx, op, x: x,
    "hopper.transpose_smem": lambda ctx, op, x: x,
}


Program.handlers = _HANDLERS


def evaluate(op: Operation, operands: Sequence[np.ndarray]) -> np.ndarray:
    """What a pure, region-free op computes from ``operands`` (storage-form
    arrays; 0-d arrays stand for splat tiles, since elementwise ops do not
    depend on the shape).  Passes fold constants through this, so a fold is
    exactly what running the op would give -- there is no second copy of an
    op's meaning."""
    with np.errstate(all="ignore"):
        return np.asarray(_HANDLERS[op.name](None, op, *operands))


