"""Elementwise, constant and shape ops on scalars and register tiles, value by value.

Owns: the LLVM arithmetic that gives each ``tile`` elementwise op the interpreter's meaning
(``tkc/interpreter.py`` is the reference), and the register-only shape ops of docs/hopper.md
§3 (``constant``, ``splat``, ``arange``, ``expand_dims``, ``broadcast``).

Must not: look at a layout except through the protocol (``regs``, coordinates,
``slot_of``); elementwise ops never look at it at all.  Codegen never chooses a layout; it
reads the one on the type.

Numerics:

- Float dtypes are computed in f32 and rounded once to the result dtype, like the
  interpreter (``fptrunc`` is round-to-nearest-even; fp8 rounds with
  ``cvt.rn.satfinite``).  ``div`` is IEEE ``div.rn.f32``, ``sqrt`` is ``sqrt.rn.f32``.
- f32 ``add``/``sub``/``mul`` may contract (LLVM ``contract``): a product feeding a sum
  becomes one ``fma.rn.f32``, rounded once where the interpreter rounds twice (as CUDA's
  default ``-fmad=true`` does).  Attention's ``s * scale - m`` and a norm's ``(x - mean) *
  rstd * w + b`` are one instruction fewer per element.
- ``maximum``/``minimum`` are ``llvm.maximum/minimum.f32`` = ``max.NaN.f32``: NaN propagates.
- i32 ``floordiv``/``rem``/``cdiv`` have Python's floor semantics; division by zero gives 0
  (the interpreter's choice), so masked-off lanes are harmless.
- Approximate instructions (PTX ISA accuracy, f32 results):
  ``exp(x) = ex2.approx.ftz(x * log2 e)`` and ``exp2 = ex2.approx.ftz``: at most 2 ulp, plus
  the rounding of ``x * log2 e`` (relative error about ``|x| * 2**-24``, below 6e-6 for
  every x whose exp is a normal f32); results below 2**-126 flush to zero.
  ``log2 = lg2.approx`` and ``log(x) = lg2.approx(x) * ln 2``: absolute error at most
  2**-22.6 for x in [0.5, 2], relative 2**-22 elsewhere.  ``rsqrt = rsqrt.approx``:
  relative error at most 2**-22.9.  ``tanh = tanh.approx``: relative error at most 2**-11,
  enough for bf16/f16 results, coarse for f32 ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import llvmlite.ir as ir

from tkc import dtypes
from tkc.codegen import nvvm
from tkc.codegen.deferred import Deferred, Mapped, Packed, Picked
from tkc.codegen.lower_values import (
    BF16,
    HALF,
    Lowered,
    as_value,
    const_i32,
    constant,
    llvm_call,
    round_to,
)
from tkc.codegen.nvvm import F32, I32
from tkc.dtypes import DType
from tkc.errors import TkcCodegenError
from tkc.ir.core import Operation
from tkc.ir.types import TileType, element_dtype

if TYPE_CHECKING:
    from tkc.codegen.lowerer import Handler, Lowerer

Fn = Callable[..., ir.Value]


def _map(lw: Lowerer, op: Operation, fn: Fn, *xs: Lowered) -> None:
    """Apply ``fn`` value by value; scalar operands are shared by every value of a tile."""
    n = next((len(x) for x in xs if isinstance(x, (list, Deferred, Packed))), None)
    if n is None:
        lw.set(op.result, fn(*xs))
        return
    if any(len(x) != n for x in xs if isinstance(x, (list, Deferred, Packed))):
        raise TkcCodegenError(f"'{op.name}': operands hold different numbers of values", op.loc)
    if any(isinstance(x, Deferred) for x in xs) or (op in lw.plan.cones and any(isinstance(x, Packed) for x in xs)):
        lw.set(op.result, Mapped(fn, xs, n))  # emitted value by value by its store
        return
    xs = tuple(x.values(lw) if isinstance(x, Packed) else x for x in xs)
    cols = [x if isinstance(x, list) else [x] * n for x in xs]
    lw.set(op.result, [fn(*vals) for vals in zip(*cols)])


# --------------------------------------------------------------------------- integers


def _floordiv(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    zero = const_i32(0)
    is0 = b.icmp_signed("==", y, zero)
    safe = b.select(is0, const_i32(1), y)  # sdiv by 0 is undefined in LLVM
    q, r = b.sdiv(x, safe), b.srem(x, safe)
    # Truncated -> floored: step down when the remainder is non-zero and its sign differs.
    fix = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, safe), zero))
    return b.select(is0, zero, b.sub(q, b.zext(fix, I32)))


def _rem(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    zero = const_i32(0)
    is0 = b.icmp_signed("==", y, zero)
    safe = b.select(is0, const_i32(1), y)
    r = b.srem(x, safe)
    fix = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, safe), zero))
    return b.select(is0, zero, b.select(fix, b.add(r, safe), r))


def _cdiv(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    zero = const_i32(0)
    return b.sub(zero, _floordiv(b, b.sub(zero, x), y))


_INT_BINARY: dict[str, Fn] = {
    "tile.add": lambda b, x, y: b.add(x, y),
    "tile.sub": lambda b, x, y: b.sub(x, y),
    "tile.mul": lambda b, x, y: b.mul(x, y),
    "tile.floordiv": _floordiv,
    "tile.rem": _rem,
    "tile.cdiv": _cdiv,
    "tile.maximum": lambda b, x, y: b.select(b.icmp_signed(">", x, y), x, y),
    "tile.minimum": lambda b, x, y: b.select(b.icmp_signed("<", x, y), x, y),
    "tile.and": lambda b, x, y: b.and_(x, y),
    "tile.or": lambda b, x, y: b.or_(x, y),
    "tile.xor": lambda b, x, y: b.xor(x, y),
}

def _contract(inst: ir.Instruction) -> ir.Instruction:
    inst.flags.append("contract")
    return inst


_FLOAT_BINARY: dict[str, Fn] = {
    "tile.add": lambda b, x, y: _contract(b.fadd(x, y)),
    "tile.sub": lambda b, x, y: _contract(b.fsub(x, y)),
    "tile.mul": lambda b, x, y: _contract(b.fmul(x, y)),
    "tile.div": lambda b, x, y: b.fdiv(x, y),
    "tile.maximum": lambda b, x, y: llvm_call(b, "llvm.maximum.f32", F32, x, y),
    "tile.minimum": lambda b, x, y: llvm_call(b, "llvm.minimum.f32", F32, x, y),
}


def _binary(lw: Lowerer, op: Operation) -> None:
    dt = element_dtype(op.result.type)
    b = lw.b
    if dt.is_float:
        f = _FLOAT_BINARY.get(op.name)
        fn = None if f is None else (lambda x, y: round_to(b, f(b, x, y), dt))
    else:
        f = _INT_BINARY.get(op.name)
        fn = None if f is None else (lambda x, y: f(b, x, y))
    if fn is None:
        raise TkcCodegenError(f"'{op.name}' on {dt.name} is not lowered", op.loc)
    _map(lw, op, fn, lw.get(op.lhs, packed=True), lw.get(op.rhs, packed=True))


# --------------------------------------------------------------------------- unary


def _nvvm1(name: str) -> Fn:
    return lambda b, x: nvvm.call(b, name, x)


_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)

_FLOAT_UNARY: dict[str, Fn] = {
    "tile.neg": lambda b, x: b.fneg(x),
    "tile.abs": lambda b, x: llvm_call(b, "llvm.fabs.f32", F32, x),
    "tile.exp": lambda b, x: nvvm.call(b, "ex2.approx.ftz.f", b.fmul(x, ir.Constant(F32, _LOG2E))),
    "tile.exp2": _nvvm1("ex2.approx.ftz.f"),
    "tile.log": lambda b, x: b.fmul(nvvm.call(b, "lg2.approx.f", x), ir.Constant(F32, _LN2)),
    "tile.log2": _nvvm1("lg2.approx.f"),
    "tile.sqrt": lambda b, x: llvm_call(b, "llvm.sqrt.f32", F32, x),
    "tile.rsqrt": _nvvm1("rsqrt.approx.f"),
    "tile.tanh": _nvvm1("tanh.approx.f32"),
}


def _unary(lw: Lowerer, op: Operation) -> None:
    dt = element_dtype(op.result.type)
    b = lw.b
    x = lw.get(op.x, packed=True)
    if dt.is_float:
        f = _FLOAT_UNARY[op.name] if op.name in _FLOAT_UNARY else None
        fn = None if f is None else (lambda v: round_to(b, f(b, v), dt))
    elif op.name == "tile.not":
        fn = lambda v: b.not_(v)  # noqa: E731  (bitwise for i32, logical for i1)
    elif op.name == "tile.neg" and dt.is_int:
        fn = lambda v: b.neg(v)  # noqa: E731
    elif op.name == "tile.abs" and dt.is_int:
        fn = lambda v: b.select(b.icmp_signed("<", v, const_i32(0)), b.neg(v), v)  # noqa: E731
    else:
        fn = None
    if fn is None:
        raise TkcCodegenError(f"'{op.name}' on {dt.name} is not lowered", op.loc)
    _map(lw, op, fn, x)


# --------------------------------------------------------------------------- compare, select, cast

# Ordered compares are false on NaN; ``ne`` is unordered (NaN != NaN), as in numpy.
_FCMP = {"lt": ("<", True), "le": ("<=", True), "gt": (">", True), "ge": (">=", True),
         "eq": ("==", True), "ne": ("!=", False)}
_ICMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _cmp(lw: Lowerer, op: Operation) -> None:
    dt = element_dtype(op.lhs.type)
    b = lw.b
    if dt.is_float:
        pred, ordered = _FCMP[op.pred]
        fn = (lambda x, y: b.fcmp_ordered(pred, x, y)) if ordered else (lambda x, y: b.fcmp_unordered(pred, x, y))
    elif dt.is_int:
        fn = lambda x, y: b.icmp_signed(_ICMP[op.pred], x, y)  # noqa: E731
    else:
        fn = lambda x, y: b.icmp_unsigned(_ICMP[op.pred], x, y)  # noqa: E731  (false < true)
    _map(lw, op, fn, lw.get(op.lhs, packed=True), lw.get(op.rhs, packed=True))


def _select(lw: Lowerer, op: Operation) -> None:
    _map(lw, op, lambda c, x, y: lw.b.select(c, x, y), lw.get(op.cond), lw.get(op.a), lw.get(op.b))


def cast_value(b: ir.IRBuilder, x: ir.Value, src: DType, dst: DType) -> ir.Value:
    """``x`` (register form of ``src``) converted to ``dst`` with the semantics of ``tile.cast``."""
    if src == dst:
        return x
    if dst.is_bool:
        if src.is_float:
            return b.fcmp_unordered("!=", x, ir.Constant(F32, 0.0))  # NaN is true, as in C
        return b.icmp_signed("!=", x, const_i32(0))
    if src.is_bool:
        return b.zext(x, I32) if dst.is_int else b.uitofp(x, F32)
    if dst.is_int:
        # Truncate toward zero, saturate, NaN -> 0: exactly cvt.rzi.s32.f32.
        return llvm_call(b, "llvm.fptosi.sat.i32.f32", I32, x)
    if src.is_int:
        if dst in (dtypes.bf16, dtypes.f16):
            return b.fpext(b.sitofp(x, BF16 if dst == dtypes.bf16 else HALF), F32)  # one rounding
        return round_to(b, b.sitofp(x, F32), dst)  # exact below 2**24; fp8 saturates long before
    return round_to(b, x, dst)


def _cast(lw: Lowerer, op: Operation) -> None:
    src, dst = element_dtype(op.x.type), element_dtype(op.result.type)
    x = lw.get(op.x, packed=True)
    if isinstance(x, Packed) and src in (dtypes.bf16, dtypes.f16) and dst == dtypes.f32:
        lw.set(op.result, x)  # the register form of a 16-bit float is its f32 value already
        return
    _map(lw, op, lambda v: cast_value(lw.b, v, src, dst), x)


# --------------------------------------------------------------------------- constants and shapes


def _constant(lw: Lowerer, op: Operation) -> None:
    t = op.result.type
    c = constant(element_dtype(t), op.value)
    lw.set(op.result, [c] * lw.regs(op, t) if isinstance(t, TileType) else c)


def _splat(lw: Lowerer, op: Operation) -> None:
    lw.set(op.result, [lw.get(op.x)] * lw.regs(op, op.result.type))


def _arange(lw: Lowerer, op: Operation) -> None:
    layout = op.result.type.layout
    lw.regs(op, op.result.type)
    lw.set(op.result, [as_value(c[0] + int(op.start)) for c in lw.coords(op, layout)])


def _expand_dims(lw: Lowerer, op: Operation) -> None:
    # A slice and its keep form hold the same values in the same slots (docs/hopper.md §2).
    x = lw.get(op.x)
    if len(x) != lw.regs(op, op.result.type):
        raise TkcCodegenError(f"'{op.name}': {op.x.type} -> {op.result.type} is not a slice "
                              f"becoming its keep form", op.loc)
    lw.set(op.result, x if isinstance(x, Deferred) else list(x))


def _broadcast(lw: Lowerer, op: Operation) -> None:
    src, dst = op.x.type.layout, op.result.type.layout
    x = lw.tile(op, op.x, deferred=True)
    n = lw.regs(op, op.result.type)
    if src == dst:
        lw.set(op.result, x if isinstance(x, Deferred) else list(x))
        return
    if getattr(src, "parent", None) != dst or not hasattr(src, "slot_of"):
        raise TkcCodegenError(f"'{op.name}': broadcast goes from a keep slice to its parent, "
                              f"not {src} -> {dst}", op.loc)
    index = [int(src.slot_of(i)) for i in range(n)]
    lw.set(op.result, Picked(x, index) if isinstance(x, Deferred) else [x[j] for j in index])


HANDLERS: dict[str, Handler] = {
    **{name: _binary for name in ("tile.add", "tile.sub", "tile.mul", "tile.div", "tile.floordiv",
                                  "tile.rem", "tile.cdiv", "tile.maximum", "tile.minimum", "tile.and",
                                  "tile.or", "tile.xor")},
    **{name: _unary for name in ("tile.neg", "tile.abs", "tile.not", "tile.exp", "tile.exp2", "tile.log",
                                 "tile.log2", "tile.sqrt", "tile.rsqrt", "tile.tanh")},
    "tile.cmp": _cmp,
    "tile.select": _select,
    "tile.cast": _cast,
    "tile.constant": _constant,
    "tile.splat": _splat,
    "tile.arange": _arange,
    "tile.expand_dims": _expand_dims,
    "tile.broadcast": _broadcast,
}


