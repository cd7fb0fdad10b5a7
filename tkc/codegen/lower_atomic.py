"""Atomics into global memory: ``tile.atomic``, ``tile.atomic_cas`` and ``hopper.atomic_fetch``.

Owns the PTX of each atomic kind and dtype, and which thread issues what:

- A register tile: every thread combines the values it holds the first copy of
  (``layouts.first_holders``: a value a layout replicates over several threads is added once,
  not once a replica) with ``red.global`` -- two or four f32 values of a run at once
  (``red.global.add.v2/v4.f32``) on the whole-tile side, where the box is in bounds and the
  tensor fast (tkc/codegen/lower_global.py); one predicated ``red`` per value at the edges.
- One element: the first thread (of the CTA, or of the role) issues one ``atom``.  Where the
  program uses the old value, ``hopper.atomic_fetch`` brings it to every thread through a
  shared word: a barrier (nobody still reads the word from the last time), thread 0's ``atom``
  and its store of the old value, a barrier, every thread's load.

An f32 ``max``/``min`` has no PTX instruction: it is an ``s32`` max (min) of the bits where the
value's sign is clear and a ``u32`` min (max) where it is set (tkc/semantics.py:atomic_update
is the same formula).  ``exch`` and ``cas`` move bits.  Orderings are PTX's ``.sem`` at
``.gpu`` scope, ``.sys`` on a ``@ ranks`` tensor (peers' GPUs); ``red`` takes ``relaxed`` and
``release``, which is all a tile's atomic may ask.  A releasing atomic (on one element or a
tile) first lets the program's TMA stores complete and its threads meet
(``lower_ranks.before_release``), so its release covers every thread's writes.
"""

from __future__ import annotations

import llvmlite.ir as ir

from tkc.codegen import nvvm
from tkc.codegen.lower_global import _access, _bits_of, _global_element, _value_of
from tkc.semantics import CANONICAL_NAN
from tkc.codegen.lower_ranks import acquired, before_release, system_scope
from tkc.codegen.lower_values import const_i32
from tkc.codegen.lowerer import Lowerer, TensorArg
from tkc.codegen.nvvm import I16, I32
from tkc.dtypes import DType
from tkc.ir.core import Operation
from tkc.ir.dialects import tile
from tkc.ir.layouts import first_holders
from tkc.ir.types import TileType


def _type(kind: str, dt: DType) -> tuple[str, str, ir.IntType]:
    """(PTX op and type suffix, register constraint, operand type) of ``kind`` on ``dt``; for an
    f32 max/min the suffix of the positive half (``max.s32``)."""
    if kind in ("exch", "cas"):
        return f"{kind}.b32", "r", I32
    if dt.name == "i32":
        return f"{kind}.s32", "r", I32
    if dt.name == "f32":
        return ("add.f32" if kind == "add" else f"{kind}.s32"), "r", I32
    return f"add.noftz.{dt.name}", "h", I16  # f16, bf16: add only (the verifier checks)


def _sem(op: Operation) -> str:
    scope = "sys" if system_scope(op) else "gpu"  # a @ ranks tensor: peers' GPUs see the ordering
    return f".{op.sem or 'relaxed'}.{scope}.global"


def _releases(op: Operation) -> bool:
    return op.sem in ("release", "acq_rel")


def _float_extremum(kind: str, fetch: bool, sem: str, value: str) -> str:
    """PTX lines of an f32 max/min through the bits: ``$pos``/``$neg`` name the predicate
    halves; ``value`` the operand holding the bits."""
    signed = "max.s32" if kind == "max" else "min.s32"
    unsigned = "min.u32" if kind == "max" else "max.u32"
    if fetch:
        return (f"@pos atom{sem}.{signed} $0, [$1], {value};\n"
                f"@neg atom{sem}.{unsigned} $0, [$1], {value};")
    return (f"@pos red{sem}.{signed} [$0], {value};\n"
            f"@neg red{sem}.{unsigned} [$0], {value};")


def _red_element(lw: Lowerer, op: Operation, kind: str, dt: DType, addr: ir.Value, ok: ir.Value,
                 bits: ir.Value) -> None:
    """One ``red`` (no old value) of ``bits`` into ``addr`` where ``ok``."""
    b = lw.b
    suffix, cons, ty = _type(kind, dt)
    sem = _sem(op)
    fty = ir.FunctionType(ir.VoidType(), [nvvm.ptr(nvvm.GLOBAL), ty, I32])
    if kind in ("max", "min") and dt.name == "f32":
        body = ("{ .reg .pred p, pos, neg; setp.ne.b32 p, $2, 0; setp.ge.s32 pos, $1, 0; and.pred neg, p, !pos; "
                "and.pred pos, p, pos;\n" + _float_extremum(kind, False, sem, "$1") + " }")
    elif kind == "exch":
        body = f"{{ .reg .pred p; .reg .b32 d; setp.ne.b32 p, $2, 0; @p atom{sem}.exch.b32 d, [$0], $1; }}"
    else:
        body = f"{{ .reg .pred p; setp.ne.b32 p, $2, 0; @p red{sem}.{suffix} [$0], $1; }}"
    b.asm(fty, body, f"l,{cons},r", [addr, bits, b.zext(ok, I32)], side_effect=True)


def _red_vector(lw: Lowerer, op: Operation, addr: ir.Value, bits: list[ir.Value]) -> None:
    """``red.global.add.v2/v4.f32`` of a run (aligned to its size: the whole-tile side)."""
    n = len(bits)
    regs = ", ".join(f"${j + 1}" for j in range(n))
    fty = ir.FunctionType(ir.VoidType(), [nvvm.ptr(nvvm.GLOBAL), *[I32] * n])
    lw.b.asm(fty, f"red{_sem(op)}.add.v{n}.f32 [$0], {{{regs}}};", ",".join(["l"] + ["r"] * n),
             [addr, *bits], side_effect=True)


def _vectorizes(kind: str, dt: DType, n: int) -> bool:
    return kind == "add" and dt.name == "f32" and n in (2, 4)


def _tile_atomic(lw: Lowerer, op: Operation, t: TileType) -> None:
    b = lw.b
    if _releases(op):
        # each thread's red.release orders its own writes: meeting first makes every
        # thread's writes (and the TMA stores) precede each of them, as the language says
        before_release(lw)
    kind = tile.atomic_kind(op)
    tensor: TensorArg = lw.get(op.tensor)
    dt = tensor.type.dtype
    acc = _access(lw, op, t)
    vals = lw.tile(op, op.value)
    bits = [_atomic_bits(b, kind, v, dt) for v in vals]
    holders = first_holders(t.layout)
    if holders is None:  # select-layouts never picks such a layout for an atomic's value
        raise ValueError(f"the values of {t.layout} are held by threads that no mask names")
    mine = [None if mask == 0 else b.icmp_unsigned("==", b.and_(lw.tid, const_i32(mask)), const_i32(bits_))
            for mask, bits_ in holders]

    def ok(i: int, inb: ir.Value | None) -> ir.Value:
        x = inb if inb is not None else ir.Constant(ir.IntType(1), 1)
        return x if mine[i] is None else b.and_(x, mine[i])

    def whole_tile() -> list:
        for first, n in acc.runs:
            same = all(holders[i] == holders[first] for i in range(first, first + n))
            if _vectorizes(kind, dt, n) and same and mine[first] is None:
                _red_vector(lw, op, acc.addr(lw, op, first), bits[first:first + n])
                continue
            for i in range(first, first + n):
                _red_element(lw, op, kind, dt, acc.addr(lw, op, i), ok(i, None), _operand(b, bits[i], dt))
        return []

    def edge() -> list:
        a = acc.kept_local(lw)
        for i in range(len(vals)):
            e = _global_element(lw, op, a.tensor, a.offs, a.coord(i))
            _red_element(lw, op, kind, dt, e.addr, ok(i, e.ok), _operand(b, bits[i], dt))
        return []

    lw.either(acc.whole_tile(lw, op), whole_tile, edge, "atomic.tile")


def _atomic_bits(b: ir.IRBuilder, kind: str, v: ir.Value, dt: DType) -> ir.Value:
    """The bits an atomic takes for the register value ``v``: an f32 max/min's NaN as the one
    NaN 0x7fffffff (the bit order decides by the sign, which a NaN from arithmetic has
    differently on the GPU and on the host: tkc/semantics.py:atomic_update)."""
    bits = _bits_of(b, v, dt)
    if kind in ("max", "min") and dt.name == "f32":
        bits = b.select(b.fcmp_unordered("uno", v, v), ir.Constant(I32, CANONICAL_NAN), bits)
    return bits


def _operand(b: ir.IRBuilder, bits: ir.Value, dt: DType) -> ir.Value:
    return bits if dt.bits == 32 else b.trunc(bits, I16) if bits.type.width > 16 else bits


def _element(lw: Lowerer, op: Operation) -> tuple[DType, ir.Value, ir.Value, list[ir.Value]]:
    """(dtype, address, in bounds, operand bits) of an atomic on one element."""
    b = lw.b
    tensor: TensorArg = lw.get(op.tensor)
    dt = tensor.type.dtype
    e = _global_element(lw, op, tensor, [lw.get(v) for v in op.offsets], ())
    kind = tile.atomic_kind(op)
    values = [op.expected, op.value] if kind == "cas" else [op.value]
    return dt, e.addr, e.ok, [_operand(b, _atomic_bits(b, kind, lw.get(v), dt), dt) for v in values]


def _atom(lw: Lowerer, op: Operation, kind: str, dt: DType, addr: ir.Value, ok: ir.Value,
          operands: list[ir.Value]) -> ir.Value:
    """``atom`` on one element: its old bits (0 where ``ok`` is false: nothing is touched)."""
    b = lw.b
    suffix, cons, ty = _type(kind, dt)
    sem = _sem(op)
    args = ", ".join(f"${j + 3}" for j in range(len(operands)))
    if kind in ("max", "min") and dt.name == "f32":
        body = ("{ .reg .pred p, pos, neg; setp.ne.b32 p, $2, 0; setp.ge.s32 pos, $3, 0; and.pred neg, p, !pos; "
                "and.pred pos, p, pos; mov.b32 $0, 0;\n" + _float_extremum(kind, True, sem, "$3") + " }")
    else:
        body = (f"{{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b{ty.width} $0, 0; "
                f"@p atom{sem}.{suffix} $0, [$1], {args}; }}")
    fty = ir.FunctionType(ty, [nvvm.ptr(nvvm.GLOBAL), I32, *[ty] * len(operands)])
    return b.asm(fty, body, ",".join([f"={cons}", "l", "r"] + [cons] * len(operands)),
                 [addr, b.zext(ok, I32), *operands], side_effect=True)


def atomic(lw: Lowerer, op: Operation) -> None:
    """``tile.atomic``/``tile.atomic_cas`` whose old value nobody reads (module doc)."""
    t = op.value.type
    if isinstance(t, TileType):
        _tile_atomic(lw, op, t)
        return
    kind = tile.atomic_kind(op)
    dt, addr, ok, operands = _element(lw, op)
    b = lw.b
    if _releases(op):
        before_release(lw)  # the release covers every thread's writes (a signal's stores)
    first = b.icmp_unsigned("==", lw.tid, const_i32(0))
    lw.if_then(first, lambda: _atom(lw, op, kind, dt, addr, ok, operands), "atomic")
    if op.results:  # read by nobody (lower-to-hopper made the read ones hopper.atomic_fetch)
        lw.set(op.results[0], _value_of(b, ir.Constant(ir.IntType(dt.bits), 0), dt))


def atomic_fetch(lw: Lowerer, op: Operation) -> None:
    """``hopper.atomic_fetch``: thread 0's ``atom``, its old value to every thread (module doc)."""
    b = lw.b
    kind = op.kind
    dt, addr, ok, operands = _element(lw, op)
    slot = lw.ptr(lw.shared(op, op.slot))
    _, _, ty = _type(kind, dt)
    if _releases(op):
        before_release(lw)  # (ends with the barrier below's meeting)
    else:
        lw.sync()
    first = b.icmp_unsigned("==", lw.tid, const_i32(0))

    def issue() -> None:
        old = _atom(lw, op, kind, dt, addr, ok, operands)
        if op.sem in ("acquire", "acq_rel") and system_scope(op):
            acquired(lw)
        b.store(old, slot)

    lw.if_then(first, issue, "atomic")
    lw.sync()
    bits = b.load(slot, typ=ty)
    lw.set(op.result, _value_of(b, bits, dt))


HANDLERS = {"tile.atomic": atomic, "tile.atomic_cas": atomic, "hopper.atomic_fetch": atomic_fetch}
