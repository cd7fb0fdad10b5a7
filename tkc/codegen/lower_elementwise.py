"""Elementwise, constant and shape ops on scalars and register tiles, value by value.

Owns: the LLVM arithmetic that gives each ``tile`` elementwise op the interpreter's meaning
(``tkc/semantics.py`` is the reference), and the register-only shape ops of docs/hopper.md
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
- i32/i64 ``floordiv``/``rem``/``cdiv`` have Python's floor semantics; division by zero gives 0
  (the interpreter's choice), so masked-off lanes are harmless.  An i32 scalar division inside
  an innermost loop by a runtime divisor computed outside it multiplies by the divisor's
  reciprocal instead (:func:`_floordiv_invariant`): a ``div.s32`` is about 30 instructions on
  every iteration (attention backward's ``t // n_i`` for grouped heads), the reciprocal one
  ``div.u32`` and a ``mul.hi.u32``.
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
    constant,
    e2m1_decode,
    e2m1_pack,
    int_type,
    llvm_call,
    round_to,
)
from tkc.codegen.nvvm import F32
from tkc.dtypes import DType
from tkc.errors import TkcCodegenError
from tkc.ir.core import Operation, defined_inside
from tkc.ir.dialects import tile as T
from tkc.ir.layouts import broadcast_slots
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


def _zero(x: ir.Value) -> ir.Constant:
    return ir.Constant(x.type, 0)


def _floordiv(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    zero = _zero(x)
    is0 = b.icmp_signed("==", y, zero)
    safe = b.select(is0, ir.Constant(x.type, 1), y)  # sdiv by 0 is undefined in LLVM
    q, r = b.sdiv(x, safe), b.srem(x, safe)
    # Truncated -> floored: step down when the remainder is non-zero and its sign differs.
    fix = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, safe), zero))
    return b.select(is0, zero, b.sub(q, b.zext(fix, x.type)))


def _rem(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    zero = _zero(x)
    is0 = b.icmp_signed("==", y, zero)
    safe = b.select(is0, ir.Constant(x.type, 1), y)
    r = b.srem(x, safe)
    fix = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, safe), zero))
    return b.select(is0, zero, b.select(fix, b.add(r, safe), r))


def _cdiv(b: ir.IRBuilder, x: ir.Value, y: ir.Value, floordiv: Fn | None = None) -> ir.Value:
    """``-(-x // y)`` through ``floordiv`` (:func:`_floordiv` unless given)."""
    zero = _zero(x)
    return b.sub(zero, (floordiv or _floordiv)(b, b.sub(zero, x), y))


_I64 = ir.IntType(64)


def mulhi(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """The high 32 bits of the unsigned product of i32 ``x`` and ``y``: ``mul.hi.u32`` on the
    GPU.  Not the 64-bit product shifted down: from that form ptxas 13.0 rewrote a remainder
    by a kernel parameter into a 64-bit product with the parameter widened by reading the
    next parameter's word as its high half (gemm_allreduce.tk's ``(me + s) % num_ranks()``
    gave ranks like 18675200).  Elsewhere (the CPU tests' JIT) the portable form."""
    if b.module.triple.startswith("nvptx"):
        return nvvm.call(b, "mulhi.ui", x, y)
    return b.trunc(b.lshr(b.mul(b.zext(x, _I64), b.zext(y, _I64)), ir.Constant(_I64, 32)), x.type)


def _udiv_invariant(b: ir.IRBuilder, n: ir.Value, d: ir.Value, m: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(n / d, n % d)`` for unsigned i32 ``n`` and ``d >= 1`` from ``m = (2**32 - 1) / d``:
    ``q = (m n) >> 32`` is the quotient or one less (``m n / 2**32 > n / d - 1`` for ``n <
    2**32``), so one comparison of the remainder with ``d`` corrects it."""
    q = mulhi(b, m, n)
    r = b.sub(n, b.mul(q, d))
    over = b.icmp_unsigned(">=", r, d)
    return b.add(q, b.zext(over, n.type)), b.select(over, b.sub(r, d), r)


def _floordiv_invariant(b: ir.IRBuilder, x: ir.Value, y: ir.Value, rem: bool = False) -> ir.Value:
    """:func:`_floordiv` (or :func:`_rem`) of i32 values through :func:`_udiv_invariant` on the
    magnitudes, then Python's signs: quotient and remainder truncated towards zero (the
    remainder with x's sign), stepped where the remainder is non-zero and the signs differ.

    ``m`` depends on the divisor alone, one ``div.u32`` where the loop's ``div.s32`` was, and
    the quotient a ``mul.hi.u32``.  A divisor LLVM knows is positive (``max(n, 1)``) drops
    the sign and zero tests.  (Computed in the loop's preheader instead, ``m`` stays live
    through attention backward's whole loop and spills at D = 128.)"""
    zero, one = _zero(x), ir.Constant(x.type, 1)
    is0 = b.icmp_signed("==", y, zero)
    safe = b.select(is0, one, y)
    ay = llvm_call(b, "llvm.abs.i32", x.type, safe, ir.Constant(ir.IntType(1), 0))
    m = b.udiv(ir.Constant(x.type, 2**32 - 1), ay)
    neg_x, neg_y = b.icmp_signed("<", x, zero), b.icmp_signed("<", safe, zero)
    ax = b.select(neg_x, b.sub(zero, x), x)  # INT_MIN stays 2**31 read unsigned
    q, r = _udiv_invariant(b, ax, ay, m)
    differ = b.xor(neg_x, neg_y)
    step = b.and_(differ, b.icmp_unsigned("!=", r, zero))
    if rem:
        rt = b.select(neg_x, b.sub(zero, r), r)
        return b.select(is0, zero, b.select(step, b.add(rt, safe), rt))
    qt = b.select(differ, b.sub(zero, q), q)
    return b.select(is0, zero, b.sub(qt, b.zext(step, x.type)))


#: The loop-invariant divisor forms (:func:`_invariant_divisor`) of the i32 divisions.
INVARIANT: dict[type, Fn] = {
    T.FloorDivOp: _floordiv_invariant,
    T.RemOp: lambda b, x, y: _floordiv_invariant(b, x, y, rem=True),
    T.CdivOp: lambda b, x, y: _cdiv(b, x, y, _floordiv_invariant),
}


def _invariant_divisor(op: Operation) -> bool:
    """Whether ``op`` is an i32 scalar division in an innermost loop (one holding no other) by
    a runtime divisor defined outside that loop: a ``div.u32`` of a constant by the divisor and
    a ``mul.hi.u32`` then replace a ``div.s32`` on every iteration.  Constant divisors LLVM
    divides well itself.  A division in a loop around another (a persistent kernel's tile
    loop) runs once a tile, where the registers the longer form holds are worth more than its
    instructions, and one in a loop of at most a constant number of iterations (a ring's
    prologue, ``range(min(S - 1, trip))``) saves too little to matter."""
    t = op.result.type
    if type(op) not in INVARIANT or isinstance(t, TileType) or element_dtype(t) != dtypes.i32:
        return False
    loop = next((a for a in op.ancestors() if a.name == "tile.for"), None)
    if loop is None or not T.innermost_uncapped(loop):
        return False
    d = op.operands[1]
    return T.constant_value(d) is None and d not in defined_inside(loop)


def _shl(b: ir.IRBuilder, x: ir.Value, n: ir.Value) -> ir.Value:
    # LLVM's shl by the width or more is poison; the op's count is unsigned and shifts every bit out.
    width = ir.Constant(x.type, x.type.width)
    return b.select(b.icmp_unsigned("<", n, width), b.shl(x, n), _zero(x))


def _shr(b: ir.IRBuilder, x: ir.Value, n: ir.Value) -> ir.Value:
    width = x.type.width
    return b.ashr(x, b.select(b.icmp_unsigned("<", n, ir.Constant(x.type, width)), n,
                              ir.Constant(x.type, width - 1)))


#: The lowering of each elementwise op on i32, i64 (and i1) values, by op class.
INT: dict[type, Fn] = {
    T.AddOp: lambda b, x, y: b.add(x, y),
    T.SubOp: lambda b, x, y: b.sub(x, y),
    T.MulOp: lambda b, x, y: b.mul(x, y),
    T.FloorDivOp: _floordiv,
    T.RemOp: _rem,
    T.CdivOp: _cdiv,
    T.MaximumOp: lambda b, x, y: b.select(b.icmp_signed(">", x, y), x, y),
    T.MinimumOp: lambda b, x, y: b.select(b.icmp_signed("<", x, y), x, y),
    T.AndOp: lambda b, x, y: b.and_(x, y),
    T.OrOp: lambda b, x, y: b.or_(x, y),
    T.XorOp: lambda b, x, y: b.xor(x, y),
    T.ShlOp: _shl,
    T.ShrOp: _shr,
    T.NotOp: lambda b, x: b.not_(x),  # bitwise for i32, logical for i1
    T.NegOp: lambda b, x: b.neg(x),
    T.AbsOp: lambda b, x: b.select(b.icmp_signed("<", x, _zero(x)), b.neg(x), x),
}


def _contract(inst: ir.Instruction) -> ir.Instruction:
    inst.flags.append("contract")
    return inst


def _nvvm1(name: str) -> Fn:
    return lambda b, x: nvvm.call(b, name, x)


_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)

#: The lowering of each elementwise op on float values (f32 registers; the result is rounded to
#: the op's dtype after), by op class.  An op missing here is decomposed by the ``decompose``
#: pass before codegen (sigmoid, erf, log1p, expm1, pow).
FLOAT: dict[type, Fn] = {
    T.AddOp: lambda b, x, y: _contract(b.fadd(x, y)),
    T.SubOp: lambda b, x, y: _contract(b.fsub(x, y)),
    T.MulOp: lambda b, x, y: _contract(b.fmul(x, y)),
    T.DivOp: lambda b, x, y: b.fdiv(x, y),
    T.MaximumOp: lambda b, x, y: llvm_call(b, "llvm.maximum.f32", F32, x, y),
    T.MinimumOp: lambda b, x, y: llvm_call(b, "llvm.minimum.f32", F32, x, y),
    T.FmaOp: lambda b, x, y, z: llvm_call(b, "llvm.fma.f32", F32, x, y, z),
    T.NegOp: lambda b, x: b.fneg(x),
    T.AbsOp: lambda b, x: llvm_call(b, "llvm.fabs.f32", F32, x),
    T.ExpOp: lambda b, x: nvvm.call(b, "ex2.approx.ftz.f", b.fmul(x, ir.Constant(F32, _LOG2E))),
    T.Exp2Op: _nvvm1("ex2.approx.ftz.f"),
    T.LogOp: lambda b, x: b.fmul(nvvm.call(b, "lg2.approx.f", x), ir.Constant(F32, _LN2)),
    T.Log2Op: _nvvm1("lg2.approx.f"),
    T.SqrtOp: lambda b, x: llvm_call(b, "llvm.sqrt.f32", F32, x),
    T.RsqrtOp: _nvvm1("rsqrt.approx.f"),
    T.TanhOp: _nvvm1("tanh.approx.f32"),
    T.SinOp: _nvvm1("sin.approx.f"),
    T.CosOp: _nvvm1("cos.approx.f"),
    T.FloorOp: lambda b, x: llvm_call(b, "llvm.floor.f32", F32, x),
    T.CeilOp: lambda b, x: llvm_call(b, "llvm.ceil.f32", F32, x),
}


def _elementwise(lw: Lowerer, op: Operation) -> None:
    dt = element_dtype(op.result.type)
    b = lw.b
    f = (FLOAT if dt.is_float else INT).get(type(op))
    if f is None:
        raise TkcCodegenError(f"'{op.name}' on {dt.name} has no lowering (is the decompose pass in the "
                              f"pipeline?)", op.loc)
    if _invariant_divisor(op):
        f = INVARIANT[type(op)]
    fn = (lambda *xs: round_to(b, f(b, *xs), dt)) if dt.is_float else (lambda *xs: f(b, *xs))
    _map(lw, op, fn, *[lw.get(v, packed=True) for v in op.operands])


# --------------------------------------------------------------------------- compare, select, cast

# Ordered compares are false on NaN; ``ne`` is unordered (NaN != NaN), as in numpy.
_FCMP = {"lt": ("<", True), "le": ("<=", True), "gt": (">", True), "ge": (">=", True),
         "eq": ("==", True), "ne": ("!=", False)}
ICMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _cmp(lw: Lowerer, op: Operation) -> None:
    dt = element_dtype(op.lhs.type)
    b = lw.b
    if dt.is_float:
        pred, ordered = _FCMP[op.pred]
        fn = (lambda x, y: b.fcmp_ordered(pred, x, y)) if ordered else (lambda x, y: b.fcmp_unordered(pred, x, y))
    elif dt.is_int:
        fn = lambda x, y: b.icmp_signed(ICMP[op.pred], x, y)  # noqa: E731
    else:
        fn = lambda x, y: b.icmp_unsigned(ICMP[op.pred], x, y)  # noqa: E731  (false < true)
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
        return b.icmp_signed("!=", x, _zero(x))
    if src.is_bool:
        return b.zext(x, int_type(dst)) if dst.is_int else b.uitofp(x, F32)
    if dst.is_int:
        if src.is_int:  # i32 -> i64 sign-extends, i64 -> i32 keeps the low bits
            return b.sext(x, int_type(dst)) if dst.bits > src.bits else b.trunc(x, int_type(dst))
        # Truncate toward zero, saturate, NaN -> 0: exactly cvt.rzi.s32.f32 (.s64).
        return llvm_call(b, f"llvm.fptosi.sat.i{dst.bits}.f32", int_type(dst), x)
    if src.is_int:
        if dst in (dtypes.bf16, dtypes.f16):
            return b.fpext(b.sitofp(x, BF16 if dst == dtypes.bf16 else HALF), F32)  # one rounding
        # sitofp rounds once (cvt.rn.f32.s32/.s64): exact below 2**24; fp8 saturates long before.
        return round_to(b, b.sitofp(x, F32), dst)
    return round_to(b, x, dst)


def _cast(lw: Lowerer, op: Operation) -> None:
    src, dst = element_dtype(op.x.type), element_dtype(op.result.type)
    x = lw.get(op.x, packed=True)
    if isinstance(x, Packed) and src in (dtypes.bf16, dtypes.f16) and dst == dtypes.f32:
        lw.set(op.result, x)  # the register form of a 16-bit float is its f32 value already
        return
    _map(lw, op, lambda v: cast_value(lw.b, v, src, dst), x)


def _unpack_fp4(lw: Lowerer, op: Operation) -> None:
    _map(lw, op, lambda v: e2m1_decode(lw.b, v, op.half), lw.get(op.x))


def _pack_fp4(lw: Lowerer, op: Operation) -> None:
    _map(lw, op, lambda lo, hi: e2m1_pack(lw.b, lo, hi), lw.get(op.lo), lw.get(op.hi))


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


def _reshape(lw: Lowerer, op: Operation) -> None:
    # select-layouts keeps every value in its register (tile.reshape's verifier checks).
    x = lw.tile(op, op.x)
    if len(x) != lw.regs(op, op.result.type):
        raise TkcCodegenError(f"'{op.name}': {op.x.type} -> {op.result.type} moves values between registers",
                              op.loc)
    lw.set(op.result, list(x))


def _picks(op: Operation, whole: object, part: object, index: int) -> tuple[int, ...]:
    from tkc.ir.layouts import picked_registers

    picks = picked_registers(whole, part, op.axis, index)
    if picks is None:
        raise TkcCodegenError(f"'{op.name}': {part} is not {whole} without axis {op.axis}, held whole in each "
                              f"thread", op.loc)
    return picks


def _take(lw: Lowerer, op: Operation) -> None:
    x = lw.tile(op, op.x)
    lw.set(op.result, [x[j] for j in _picks(op, op.x.type.layout, op.result.type.layout, op.index)])


def _stack(lw: Lowerer, op: Operation) -> None:
    whole = op.result.type.layout
    out: list = [None] * lw.regs(op, op.result.type)
    for p, v in enumerate(op.operands):
        for value, j in zip(lw.tile(op, v), _picks(op, whole, v.type.layout, p)):
            out[j] = value
    lw.set(op.result, out)


def _transpose(lw: Lowerer, op: Operation) -> None:
    # A register tile's transpose keeps every value in its register (tile.transpose's verifier checks).
    lw.set(op.result, list(lw.tile(op, op.x)))


def _broadcast(lw: Lowerer, op: Operation) -> None:
    src, dst = op.x.type.layout, op.result.type.layout
    x = lw.tile(op, op.x, deferred=True)
    lw.regs(op, op.result.type)  # a register tile with a layout, or an error at op
    if src == dst:
        lw.set(op.result, x if isinstance(x, Deferred) else list(x))
        return
    axes = [a for a, (s, d) in enumerate(zip(op.x.type.shape, op.result.type.shape)) if s != d]
    slots = broadcast_slots(src, dst, axes)
    if slots is None:
        raise TkcCodegenError(f"'{op.name}': broadcast goes from a keep slice to its parent, or from one "
                              f"element every thread holds, not {src} -> {dst}", op.loc)
    index = list(slots)
    lw.set(op.result, Picked(x, index) if isinstance(x, Deferred) else [x[j] for j in index])


HANDLERS: dict[str, Handler] = {
    **{cls.name: _elementwise for cls in (*FLOAT, *INT)},
    "tile.cmp": _cmp,
    "tile.select": _select,
    "tile.cast": _cast,
    "tile.unpack_fp4": _unpack_fp4,
    "tile.pack_fp4": _pack_fp4,
    "tile.constant": _constant,
    "tile.splat": _splat,
    "tile.arange": _arange,
    "tile.expand_dims": _expand_dims,
    "tile.broadcast": _broadcast,
    "tile.reshape": _reshape,
    "tile.take": _take,
    "tile.stack": _stack,
    "tile.transpose": _transpose,
}
