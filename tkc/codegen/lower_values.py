"""Per-thread values of the hopper-level lowering: element types, rounding, thread symbols.

Owns: how a tkc dtype lives in an LLVM register (every float dtype as an ``f32`` holding a
value already rounded to the dtype, like the interpreter's float32 storage; ``i32`` as
``i32``, ``i64`` as ``i64``; ``i1`` as ``i1``; a pair of FP4 values, ``f4e2m1x2``, as its
byte, an ``i8``), how such a value is rounded to its dtype and converted to and
from its bytes in memory, and :class:`Sym`, the run-time thread index that a layout's
``thread_coords`` is evaluated on.

Must not: choose a layout or know a layout formula.  Coordinates come from the layout on
the type (``thread_coords(t)`` evaluated on a :class:`Sym`, plus ``reg_coords(i)``);
codegen never chooses a layout, it reads the one on the type.
"""

from __future__ import annotations

from collections.abc import Sequence

import llvmlite.ir as ir

from tkc import dtypes
from tkc.codegen.nvvm import F32, I1, I8, I16, I32, I64
from tkc.dtypes import DType



class _BFloatType(ir.types._BaseFloatType):
    """LLVM's ``bfloat``, which llvmlite.ir lacks; only ever converted to and from, never a constant."""

    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self) -> str:
        return "bfloat"


_BFloatType._create_instance()
BF16 = _BFloatType()
HALF = ir.HalfType()

#: One lowered IR value: a scalar is one LLVM value, a register tile a list of them
#: (value ``i`` of the list is the thread's value ``i`` of the layout).
Lowered = ir.Value | list


def const_i32(v: int) -> ir.Constant:
    return ir.Constant(I32, v)


def reg_type(dt: DType) -> ir.Type:
    """The LLVM type a value of ``dt`` is held in between ops."""
    if dt.is_float:
        return F32
    if dt.is_packed:
        return I8
    return int_type(dt) if dt.is_int else I1


def int_type(dt: DType) -> ir.IntType:
    """The LLVM integer type of an integer dtype (``i32`` or ``i64``)."""
    return I64 if dt.bits == 64 else I32


def constant(dt: DType, value: float | int | bool) -> ir.Constant:
    """``value`` rounded to ``dt`` (through :func:`tkc.dtypes.round_to`, the one rounding rule)."""
    v = dtypes.round_to(value, dt)
    if dt.is_float:
        return ir.Constant(F32, float(v))
    if dt.is_int:
        return ir.Constant(int_type(dt), int(v))
    if dt.is_packed:
        return ir.Constant(I8, int(v))
    return ir.Constant(I1, int(bool(v)))


def _intrinsic(b: ir.IRBuilder, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
    """A target-independent LLVM intrinsic (``llvm.maximum.f32``...), declared on first use."""
    fn = b.module.globals.get(name)
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ret, list(args)), name)
    return fn


def llvm_call(b: ir.IRBuilder, name: str, ret: ir.Type, *args: ir.Value) -> ir.Value:
    return b.call(_intrinsic(b, name, ret, [a.type for a in args]), list(args))


# fp8 <-> f32 through the PTX conversions the dtypes module models (cvt.rn.satfinite
# e4m3x2/e5m2x2 from f32, and the exact f16x2 widening back); LLVM has no fp8 type.
_FP8 = {"f8e4m3": "e4m3x2", "f8e5m2": "e5m2x2"}


def fp8_encode(b: ir.IRBuilder, x: ir.Value, dt: DType) -> ir.Value:
    """The fp8 byte (in the low half of an i16) of the f32 ``x``: round to nearest even, saturating."""
    asm = f"cvt.rn.satfinite.{_FP8[dt.name]}.f32 $0, 0f00000000, $1;"
    return b.asm(ir.FunctionType(I16, [F32]), asm, "=h,f", [x], side_effect=False)


def fp8_decode(b: ir.IRBuilder, byte16: ir.Value, dt: DType) -> ir.Value:
    """The f32 value of the fp8 byte in the low half of ``byte16`` (exact: fp8 fits in f16)."""
    asm = ("{ .reg .b32 h; .reg .f16 lo, hi; "
           f"cvt.rn.f16x2.{_FP8[dt.name]} h, $1; mov.b32 {{lo, hi}}, h; cvt.f32.f16 $0, lo; }}")
    return b.asm(ir.FunctionType(F32, [I16]), asm, "=f,h", [byte16], side_effect=False)


def fp8_decode_pair(b: ir.IRBuilder, bytes16: ir.Value, dt: DType) -> tuple[ir.Value, ir.Value]:
    """The f32 values of the two fp8 bytes of ``bytes16`` (an i16, low byte first): one
    ``cvt.rn.f16x2`` for both, where :func:`fp8_decode` converts one byte a time."""
    asm = ("{ .reg .b32 h; .reg .f16 lo, hi; "
           f"cvt.rn.f16x2.{_FP8[dt.name]} h, $2; mov.b32 {{lo, hi}}, h; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }}")
    pair = b.asm(ir.FunctionType(ir.LiteralStructType([F32, F32]), [I16]), asm, "=f,=f,h", [bytes16],
                 side_effect=False)
    return b.extract_value(pair, 0), b.extract_value(pair, 1)


def fp8_decode_words(b: ir.IRBuilder, words: Sequence[ir.Value], dt: DType, n: int) -> list[ir.Value]:
    """The f32 values of the first ``n`` (even) fp8 bytes packed in ``words`` (integers of 16
    bits or more, little-endian), two bytes a conversion."""
    out: list[ir.Value] = []
    for w in words:
        for j in range(w.type.width // 16):
            if len(out) == n:
                return out
            half = b.lshr(w, ir.Constant(w.type, 16 * j)) if j else w
            out.extend(fp8_decode_pair(b, b.trunc(half, I16) if w.type.width > 16 else half, dt))
    return out[:n]


def pack_fp8x4(b: ir.IRBuilder, vals: Sequence[ir.Value], dt: DType) -> ir.Value:
    """Four fp8 values (their f32 register form) as one b32, ``vals[0]`` in the low byte: two
    ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` and a ``mov.b32``.  A value that :func:`round_to` just
    rounded is converted from its unrounded f32 (rounding twice is rounding once), which leaves
    the separate rounding dead; the four bytes of one b32 that :func:`unpack_fp8x4` decoded, in
    order, are that b32 again."""
    froms = [_fp8_unpacked_from(v) for v in vals]
    if all(f is not None and f[0] is froms[0][0] and f[1] == k for k, f in enumerate(froms)):
        return froms[0][0]

    def source(v: ir.Value) -> ir.Value:
        # round_to's fp8_decode(fp8_encode(x)): a call whose argument is a call on x
        if isinstance(v, ir.CallInstr) and isinstance(v.callee, ir.InlineAsm) and "cvt.rn.f16x2" in v.callee.asm:
            enc = v.args[0]
            if isinstance(enc, ir.CallInstr) and isinstance(enc.callee, ir.InlineAsm) and "satfinite" in enc.callee.asm:
                return enc.args[0]
        return v

    src = [source(v) for v in vals]
    cvt = ir.FunctionType(I16, [F32, F32])
    asm = f"cvt.rn.satfinite.{_FP8[dt.name]}.f32 $0, $1, $2;"
    lo, hi = (b.asm(cvt, asm, "=h,f,f", [src[2 * h + 1], src[2 * h]], side_effect=False) for h in (0, 1))
    return b.asm(ir.FunctionType(I32, [I16, I16]), "mov.b32 $0, {$1, $2};", "=r,h,h", [lo, hi], side_effect=False)


def unpack_fp8x4(b: ir.IRBuilder, word: ir.Value, dt: DType) -> list[ir.Value]:
    """The four fp8 bytes of a b32 (low byte first) in their f32 register form: the inverse of
    :func:`pack_fp8x4`, which gives ``word`` back for them without converting."""
    return fp8_decode_words(b, [word], dt, 4)


def _fp8_encoded(v: ir.Value, dt: DType) -> ir.Value | None:
    """The :func:`fp8_encode` of ``dt`` that ``v`` decodes (``round_to``'s pair), or None."""
    if not (isinstance(v, ir.CallInstr) and isinstance(v.callee, ir.InlineAsm) and "cvt.rn.f16x2" in v.callee.asm):
        return None
    enc = v.args[0]
    if isinstance(enc, ir.CallInstr) and isinstance(enc.callee, ir.InlineAsm) \
            and f"satfinite.{_FP8[dt.name]}.f32 $0, 0f00000000" in enc.callee.asm:
        return enc
    return None


def _fp8_unpacked_from(v: ir.Value) -> tuple[ir.Value, int] | None:
    """(b32, byte) when ``v`` is what :func:`unpack_fp8x4` or :func:`fp8_decode_words` decoded
    of that byte of that b32."""
    if isinstance(v, ir.ExtractValue) and isinstance(v.aggregate, ir.CallInstr) \
            and isinstance(v.aggregate.callee, ir.InlineAsm) and "cvt.rn.f16x2" in v.aggregate.callee.asm:
        half = _truncated_part(v.aggregate.args[0], 16)
        return None if half is None else (half[0], 2 * half[1] + v.indices[0])
    if not (isinstance(v, ir.CallInstr) and isinstance(v.callee, ir.InlineAsm) and "cvt.rn.f16x2" in v.callee.asm):
        return None
    return _truncated_part(v.args[0], 8)


def _truncated_part(t: ir.Value, bits: int) -> tuple[ir.Value, int] | None:
    """(b32, part) when ``t`` truncates that b32 shifted right by ``part * bits`` (part 0:
    unshifted), the parts ``bits`` wide."""
    if not (isinstance(t, ir.CastInstr) and t.opname == "trunc"):
        return None
    w = t.operands[0]
    if isinstance(w, ir.Instruction) and w.opname == "lshr" and isinstance(w.operands[1], ir.Constant) \
            and w.operands[1].constant % bits == 0 and 0 < w.operands[1].constant < 32:
        return w.operands[0], w.operands[1].constant // bits
    return w, 0


def e8m0_encode(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The E8M0 code (i8) of the f32 ``x``, as :func:`tkc.dtypes.e8m0_code` rounds: its
    exponent bits, plus one past the middle of its binade (at it for a normal number), 255 for
    NaN, inf and overflow.  Integer instructions: sm_90a has no conversion to ue8m0."""
    bits = b.bitcast(x, I32)
    exp = b.and_(b.lshr(bits, const_i32(23)), const_i32(0xFF))
    guard = b.icmp_unsigned("!=", b.and_(bits, const_i32(0x400000)), const_i32(0))
    rest = b.icmp_unsigned("!=", b.and_(bits, const_i32(0x3FFFFF)), const_i32(0))
    normal = b.icmp_unsigned("!=", exp, const_i32(0))
    up = b.zext(b.and_(guard, b.or_(rest, normal)), I32)
    code = b.add(exp, up)
    code = b.select(b.icmp_unsigned(">", code, const_i32(255)), const_i32(255), code)
    return b.trunc(code, I8)


def e8m0_decode(b: ir.IRBuilder, code: ir.Value) -> ir.Value:
    """The f32 value of an E8M0 code (i8): ``2**(code - 127)``, which f32 holds exactly (code 0
    as a subnormal), NaN for 255."""
    c = b.zext(code, I32)
    bits = b.select(b.icmp_unsigned("==", c, const_i32(0)), const_i32(0x00400000), b.shl(c, const_i32(23)))
    bits = b.select(b.icmp_unsigned("==", c, const_i32(255)), const_i32(0x7FC00000), bits)
    return b.bitcast(bits, F32)


def e2m1_decode(b: ir.IRBuilder, pair: ir.Value, half: int) -> ir.Value:
    """The f32 value of one E2M1 value of a pair (i8; ``half`` 1 the high nibble), as
    :func:`tkc.dtypes.e2m1_value`: the code's exponent and mantissa bits placed at the bottom of
    an f32's exponent field (a subnormal for code 1) and scaled by 2^126, which is exact: codes
    1-7 become 0.5, 1, 1.5, 2, 3, 4, 6.  Integer instructions and one multiply: sm_90a has no
    conversion from E2M1."""
    code = b.zext(pair, I32)
    if half:
        code = b.lshr(code, const_i32(4))
    bits = b.or_(b.shl(b.and_(code, const_i32(7)), const_i32(22)), b.shl(b.and_(code, const_i32(8)), const_i32(28)))
    return b.fmul(b.bitcast(bits, F32), ir.Constant(F32, 2.0**126))


def e2m1_encode(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The E2M1 code (i32, 0-15) of the f32 ``x``, as :func:`tkc.dtypes.e2m1_code` rounds: in
    each binade of E2M1 the codes are evenly spaced, so the magnitude (clamped to 8, past which
    everything saturates) times the binade's step count, rounded to nearest even by one
    ``cvt.rni``, plus the binade's first code is the code: ``rint(2 m)`` below 2 (0, 0.5 .. 2),
    ``rint(m) + 2`` below 4, ``rint(m / 2) + 4`` above, at most 7; the sign bit from ``x``'s, NaN
    giving +0.  The scalings are exact (powers of two), so the only rounding is the one RNE,
    and its ties are E2M1's.  sm_90a has no conversion to E2M1."""
    mag = llvm_call(b, "llvm.fabs.f32", F32, x)
    mag = llvm_call(b, "llvm.minnum.f32", F32, mag, ir.Constant(F32, 8.0))
    below2 = b.fcmp_ordered("<", mag, ir.Constant(F32, 2.0))
    below4 = b.fcmp_ordered("<", mag, ir.Constant(F32, 4.0))
    step = b.select(below2, ir.Constant(F32, 2.0), b.select(below4, ir.Constant(F32, 1.0), ir.Constant(F32, 0.5)))
    first = b.select(below2, const_i32(0), b.select(below4, const_i32(2), const_i32(4)))
    steps = b.fptosi(llvm_call(b, "llvm.rint.f32", F32, b.fmul(mag, step)), I32)
    code = b.add(steps, first)
    code = b.select(b.icmp_signed(">", code, const_i32(7)), const_i32(7), code)
    nan = b.fcmp_unordered("uno", x, x)
    code = b.or_(code, b.shl(b.lshr(b.bitcast(x, I32), const_i32(31)), const_i32(3)))
    return b.select(nan, const_i32(0), code)


def e2m1_pack(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """Two f32 values as one ``f4e2m1x2`` pair (i8), ``lo`` in the low nibble."""
    return b.trunc(b.or_(e2m1_encode(b, lo), b.shl(e2m1_encode(b, hi), const_i32(4))), I8)


def _narrow_type(dt: DType) -> ir.Type:
    return BF16 if dt == dtypes.bf16 else HALF


def round_to(b: ir.IRBuilder, x: ir.Value, dt: DType) -> ir.Value:
    """An f32 rounded to float dtype ``dt`` and held as f32 again (identity for f32).

    bf16/f16: ``fptrunc`` is round-to-nearest-even (cvt.rn.bf16.f32), the widening is exact.
    """
    if dt == dtypes.f32:
        return x
    if dt.name in _FP8:
        return fp8_decode(b, fp8_encode(b, x, dt), dt)
    if dt == dtypes.f8e8m0:
        return e8m0_decode(b, e8m0_encode(b, x))
    return b.fpext(b.fptrunc(x, _narrow_type(dt)), F32)


def packs_in_fours(dt: DType) -> bool:
    """Whether four values of ``dt`` travel as one b32 (:func:`pack_fp8x4`): the fp8 types."""
    return dt.name in _FP8


def packs_in_pairs(dt: DType) -> bool:
    """Whether two values of ``dt`` travel as one b32 (:func:`pack_pair`): bf16 and f16."""
    return dt in (dtypes.bf16, dtypes.f16)


def pack_pair(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, dt: DType) -> ir.Value:
    """Two bf16/f16 values (their f32 register form) as one b32, ``lo`` in the low half: one
    ``cvt.rn.{bf16,f16}x2.f32``.  A value that :func:`round_to` just rounded is converted from
    its unrounded f32 (the same bits: rounding twice is rounding once), which leaves the
    separate rounding dead."""
    def source(v: ir.Value) -> ir.Value:
        if (isinstance(v, ir.CastInstr) and v.opname == "fpext" and isinstance(v.operands[0], ir.CastInstr)
                and v.operands[0].opname == "fptrunc" and v.operands[0].type == _narrow_type(dt)):
            return v.operands[0].operands[0]
        return v

    low, high = _unpacked_from(lo, dt), _unpacked_from(hi, dt)
    if low is not None and high is not None and low[0] is high[0] and (low[1], high[1]) == (0, 1):
        return low[0]  # the two halves of one b32 (unpack_pair): that b32 again
    kind = "bf16x2" if dt == dtypes.bf16 else "f16x2"
    fty = ir.FunctionType(I32, [F32, F32])
    return b.asm(fty, f"cvt.rn.{kind}.f32 $0, $1, $2;", "=r,f,f", [source(hi), source(lo)], side_effect=False)


def pack_words(b: ir.IRBuilder, vals: Sequence[ir.Value], dt: DType) -> list[ir.Value]:
    """Register values of a bf16/f16 (pairs, :func:`pack_pair`) or fp8 (fours,
    :func:`pack_fp8x4`) tile as b32 words, consecutive values in each, the first lowest."""
    if packs_in_pairs(dt):
        return [pack_pair(b, vals[j], vals[j + 1], dt) for j in range(0, len(vals), 2)]
    return [pack_fp8x4(b, vals[j:j + 4], dt) for j in range(0, len(vals), 4)]


def unpack_pair(b: ir.IRBuilder, word: ir.Value, dt: DType) -> tuple[ir.Value, ir.Value]:
    """The two bf16/f16 halves of a b32 (low half first) in their f32 register form: the
    inverse of :func:`pack_pair`, which gives ``word`` back for them without converting."""
    nt = _narrow_type(dt)
    halves = (b.trunc(word, I16), b.trunc(b.lshr(word, const_i32(16)), I16))
    return tuple(b.fpext(b.bitcast(h, nt), F32) for h in halves)


def _unpacked_from(v: ir.Value, dt: DType) -> tuple[ir.Value, int] | None:
    """(b32, half) when ``v`` is what :func:`unpack_pair` made of that half of that b32."""
    if not (isinstance(v, ir.CastInstr) and v.opname == "fpext"):
        return None
    c = v.operands[0]
    if not (isinstance(c, ir.CastInstr) and c.opname == "bitcast" and c.type == _narrow_type(dt)):
        return None
    return _truncated_part(c.operands[0], 16)


def mem_type(dt: DType) -> ir.Type:
    """The LLVM type of one element of ``dt`` in memory (a tensor or a shared tile)."""
    if dt == dtypes.f32:
        return F32
    if dt in (dtypes.bf16, dtypes.f16):
        return _narrow_type(dt)
    if dt.is_int:
        return int_type(dt)
    return I8  # fp8 and e8m0 bytes, and i1 stored as one byte (0/1) like torch.bool


def to_mem(b: ir.IRBuilder, x: ir.Value, dt: DType) -> ir.Value:
    """A register value as its memory representation (:func:`mem_type`)."""
    if dt in (dtypes.bf16, dtypes.f16):
        return b.fptrunc(x, _narrow_type(dt))  # exact: the value is already rounded
    if dt.name in _FP8:
        # a value round_to just rounded is stored as the byte that rounding made (its second
        # conversion would give the same byte)
        made = _fp8_encoded(x, dt)
        return b.trunc(made if made is not None else fp8_encode(b, x, dt), I8)
    if dt == dtypes.f8e8m0:
        return e8m0_encode(b, x)
    if dt.is_bool:
        return b.zext(x, I8)
    return x


def from_mem(b: ir.IRBuilder, x: ir.Value, dt: DType) -> ir.Value:
    """A memory representation back in its register form."""
    if dt in (dtypes.bf16, dtypes.f16):
        return b.fpext(x, F32)
    if dt.name in _FP8:
        return fp8_decode(b, b.zext(x, I16), dt)
    if dt == dtypes.f8e8m0:
        return e8m0_decode(b, x)
    if dt.is_bool:
        return b.icmp_unsigned("!=", x, ir.Constant(I8, 0))
    return x


def bits_type(dt: DType) -> ir.IntType:
    """The integer type of the same width as :func:`mem_type` (for inline-asm loads/stores)."""
    return {64: I64, 32: I32, 16: I16}.get(dt.bits, I8) if not dt.is_bool else I8


# --------------------------------------------------------------------------- thread symbols


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class Sym:
    """A non-negative i32 known only at run time (the thread index and what layouts derive
    from it), with the operators the distributed-layout protocol allows (docs/hopper.md §2).

    Operations with Python ints fold at compile time where the result is known (``x * 0``,
    ``x % 1``, ...), and power-of-two ``//``, ``%`` and ``*`` become shifts and masks: the
    values are non-negative, so unsigned division is exact floor division.
    """

    __slots__ = ("b", "v")

    def __init__(self, b: ir.IRBuilder, v: ir.Value) -> None:
        self.b = b
        self.v = v

    def _val(self, o: Sym | int) -> ir.Value:
        return o.v if isinstance(o, Sym) else const_i32(int(o))

    def _new(self, v: ir.Value) -> Sym:
        return Sym(self.b, v)

    def __add__(self, o: Sym | int) -> Sym:
        if not isinstance(o, Sym) and int(o) == 0:
            return self
        return self._new(self.b.add(self.v, self._val(o)))

    __radd__ = __add__

    def __sub__(self, o: Sym | int) -> Sym:
        if not isinstance(o, Sym) and int(o) == 0:
            return self
        return self._new(self.b.sub(self.v, self._val(o)))

    def __rsub__(self, o: int) -> Sym:
        return self._new(self.b.sub(self._val(o), self.v))

    def __mul__(self, o: Sym | int) -> Sym | int:
        if isinstance(o, Sym):
            return self._new(self.b.mul(self.v, o.v))
        o = int(o)
        if o == 0:
            return 0
        if o == 1:
            return self
        if _pow2(o):
            return self._new(self.b.shl(self.v, const_i32(o.bit_length() - 1)))
        return self._new(self.b.mul(self.v, const_i32(o)))

    __rmul__ = __mul__

    def __floordiv__(self, o: int) -> Sym:
        o = int(o)
        if o == 1:
            return self
        if _pow2(o):
            return self._new(self.b.lshr(self.v, const_i32(o.bit_length() - 1)))
        return self._new(self.b.udiv(self.v, const_i32(o)))

    def __mod__(self, o: int) -> Sym | int:
        o = int(o)
        if o == 1:
            return 0
        if _pow2(o):
            return self._new(self.b.and_(self.v, const_i32(o - 1)))
        return self._new(self.b.urem(self.v, const_i32(o)))

    def __and__(self, o: Sym | int) -> Sym | int:
        if not isinstance(o, Sym) and int(o) == 0:
            return 0
        return self._new(self.b.and_(self.v, self._val(o)))

    __rand__ = __and__

    def __or__(self, o: Sym | int) -> Sym:
        if not isinstance(o, Sym) and int(o) == 0:
            return self
        return self._new(self.b.or_(self.v, self._val(o)))

    __ror__ = __or__

    def __xor__(self, o: Sym | int) -> Sym:
        if not isinstance(o, Sym) and int(o) == 0:
            return self
        return self._new(self.b.xor(self.v, self._val(o)))

    __rxor__ = __xor__

    def __rshift__(self, o: int) -> Sym:
        if int(o) == 0:
            return self
        return self._new(self.b.lshr(self.v, const_i32(int(o))))

    def __lshift__(self, o: int) -> Sym:
        if int(o) == 0:
            return self
        return self._new(self.b.shl(self.v, const_i32(int(o))))


def as_value(x: Sym | int) -> ir.Value:
    """An i32 LLVM value for a symbol or a (numpy or Python) int."""
    return x.v if isinstance(x, Sym) else const_i32(int(x))


def widen(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """A non-negative i32 as i64 (for address arithmetic)."""
    return b.zext(x, I64)
