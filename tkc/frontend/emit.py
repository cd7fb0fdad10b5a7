"""Typed construction of tile-dialect ops: the frontend's type checker.

Every rule about which dtypes and shapes may meet lives here: literals take
the other operand's dtype, tiles of one dtype broadcast numpy-style, scalars
splat, and anything else is a located ``TkcTypeError``.  ``lower.py`` decides
*what* to compute; this module decides whether it is well typed and emits it.
"""

from __future__ import annotations

import math
import operator

from tkc import dtypes
from tkc.dtypes import DType
from tkc.errors import Loc, TkcTypeError
from tkc.frontend.values import Affine, Const, Dyn
from tkc.ir.builder import Builder
from tkc.ir.core import OpResult, Value
from tkc.ir.dialects import elementwise as E
from tkc.ir.dialects import tile as T
from tkc.ir.layouts import mma_k_step
from tkc.passes.cse import op_key
from tkc.ir.types import ScalarType, TileType, Type, shape_of

#: What each operator symbol or two-operand function name builds (the declarations'
#: ``SURFACE``); ``max``/``min`` of two values are ``maximum``/``minimum``.
BINARY_OPS: dict[str, type[E.ElementwiseOp]] = {
    **E.BINARY_OPERATORS, **{n: c for n, c in E.FUNCTIONS.items() if len(c.OPERANDS) == 2},
    "max": E.MaximumOp, "min": E.MinimumOp,
}
UNARY_OPS: dict[str, type[E.ElementwiseOp]] = {
    **E.UNARY_OPERATORS, **{n: c for n, c in E.FUNCTIONS.items() if len(c.OPERANDS) == 1},
}
CMP_PREDS = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}
_PY_CMP = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
           "==": operator.eq, "!=": operator.ne}
#: How the user wrote a one-operand op, in messages.
_UNARY_WORDS = {"-": "unary -", "~": "'~'", "not": "'not'"}


_MAX_CONST_BITS = 4096  # integer constants fold in Python; beyond this they are surely a mistake


def _no_pairs(what: str, t: Type, loc: Loc) -> None:
    if t.dtype.is_packed:
        raise TkcTypeError(f"{what} of a tile of {t.dtype.name}, pairs of FP4 values, which have no arithmetic: "
                           f"unpack them with .to(f32) first", loc)


def _is_transpose(v: Value) -> bool:
    return isinstance(v, OpResult) and v.owner.name == T.TransposeOp.name


def check_tile_dims(shape: tuple[int, ...], what: str, loc: Loc) -> None:
    """Tile axes are multiples of 16, as the tensor cores and the 16x16 register fragments
    need; 1 (for broadcasting), and 2, 4 or 8 for narrow tiles such as a block-scaled
    product's scales (one per 32 values along K: ``sa[r:r+BM, k*4:(k+1)*4]``), which are
    loaded, stored and computed on but are never a product's operand."""
    for i, s in enumerate(shape):
        if not isinstance(s, int) or isinstance(s, bool) or s < 1:
            raise TkcTypeError(f"{what}: extent {s!r} on axis {i} is not a positive integer", loc)
        if s not in (1, 2, 4, 8) and s % 16:
            raise TkcTypeError(f"{what}: extent {s} on axis {i} is not 1, 2, 4, 8 or a multiple of 16", loc)


def check_const(c: Const, dt: DType, loc: Loc) -> None:
    """May the constant ``c`` take the dtype ``dt``?  Floats never silently
    become ints, and bools mix only with bools."""
    if isinstance(c.value, float) and not dt.is_float:
        raise TkcTypeError(f"float constant {c.value} mixed with {dt.name}; cast with .to(f32) first", loc)
    if isinstance(c.value, bool) != dt.is_bool:
        raise TkcTypeError(f"constant {c.value!r} mixed with {dt.name} values", loc)


def const_dtype(v: int | float | bool) -> DType:
    """The dtype a bare Python constant gets when nothing else decides it."""
    if isinstance(v, bool):
        return dtypes.i1
    if isinstance(v, int):
        return dtypes.i32
    return dtypes.f32


class Emitter:
    def __init__(self, builder: Builder):
        self.b = builder
        self.affine: dict[Value, Affine] = {}
        self.first: dict[Value, Value] = {}  # a value -> the first one built as the same computation
        self.computed: dict[object, Value] = {}  # op_key (of first values) and result index -> value

    # ------------------------------------------------------------- constants
    def constant(self, value: int | float | bool, t: Type, loc: Loc) -> Dyn:
        dt = t.dtype
        if dt.is_packed:
            if value != 0:  # a byte's code is not a value: only the all-zero pair is both
                raise TkcTypeError(f"a constant of {dt.name} pairs is zeros only, not {value}: make the values in "
                                   f"f32 and pack them with .to({dt.name})", loc)
            value = 0
        elif dt.is_bool:
            value = bool(value)
        elif dt.is_int:
            if isinstance(value, float):
                raise TkcTypeError(f"float constant {value} used where {dt.name} is needed", loc)
            value = int(value)
            if not dt.min <= value <= dt.max:
                raise TkcTypeError(f"integer constant {value} does not fit in {dt.name}", loc)
        else:
            value = float(value)
            if dt == dtypes.f8e8m0:
                # converted as x.to(f8e8m0) converts: the magnitude, 0 to 2^-127
                if math.isfinite(value) and math.isnan(float(dtypes.round_to(value, dt))):
                    raise TkcTypeError(f"constant {value:g} is out of the range of f8e8m0 (powers of two from "
                                       f"2^-127 to 2^127): it would be NaN", loc)
            elif math.isfinite(value) and not dt.min <= value <= dt.max:
                # A finite literal would silently become inf (or saturate, for fp8).
                raise TkcTypeError(f"constant {value:g} is out of the range of {dt.name} "
                                   f"(largest finite: {dt.max:g})", loc)
            value = float(dtypes.round_to(value, dt))
        v = self.b.value(T.ConstantOp, [], t, {"value": value}, loc=loc)
        if isinstance(t, ScalarType) and dt.is_int:
            self.affine[v] = Affine((), value)
        return Dyn(v)

    def materialize(self, c: Const, like: Type | None, loc: Loc) -> Dyn:
        """A constant as an IR value of ``like``'s dtype (a scalar), or of its
        own default dtype.  Float constants never silently become ints."""
        if like is None:
            return self.constant(c.value, ScalarType(const_dtype(c.value)), loc)
        check_const(c, like.dtype, loc)
        return self.constant(c.value, ScalarType(like.dtype), loc)

    def affine_of(self, v: Dyn | Const) -> Affine | None:
        if isinstance(v, Const):
            return Affine((), int(v.value)) if isinstance(v.value, int) else None
        if v.type not in (T.I32, T.I64):
            return None
        return self.affine.get(v.value) or Affine.atom(self.same(v.value))

    def same(self, v: Value) -> Value:
        """The first value built as the same pure computation as ``v``: one op and attributes
        on equal operands (``cse``'s key), so that ``(i % 4)*BN:(i % 4 + 1)*BN`` spells one
        atom twice and its extent is BN.  Loads and other ops with effects are only ever
        equal to themselves: a store between two reads may change the second."""
        stack = [v]
        while stack:  # operand chains may be long: no recursion
            x = stack[-1]
            if x in self.first:
                stack.pop()
                continue
            op = x.owner if isinstance(x, OpResult) else None
            if op is None or op.regions or not op.has_trait("pure"):
                self.first[x] = x
                stack.pop()
                continue
            todo = [o for o in op.operands if o not in self.first]
            if todo:
                stack.extend(todo)
                continue
            key = op_key(op, [self.first[o] for o in op.operands])
            self.first[x] = x if key is None else self.computed.setdefault((key, x.index), x)
            stack.pop()
        return self.first[v]

    def index(self, x: Dyn | Const, loc: Loc) -> Dyn:
        """An integer scalar as the i32 that tensor offsets and loop bounds are.  An i64 is
        clamped to the i32 range first, never wrapped: every tensor axis is shorter than 2**31,
        so a clamped index is out of bounds exactly when the i64 one is (docs/language.md)."""
        if isinstance(x, Const):
            return self.materialize(x, T.I32, loc)
        if x.type == T.I64:
            lo = self.constant(dtypes.i32.min, T.I64, loc)
            hi = self.constant(dtypes.i32.max, T.I64, loc)
            x = Dyn(self.b.value(E.MaximumOp, [x.value, lo.value], T.I64, loc=loc))
            x = Dyn(self.b.value(E.MinimumOp, [x.value, hi.value], T.I64, loc=loc))
            return Dyn(self.b.value(T.CastOp, [x.value], T.I32, loc=loc))
        return x

    # -------------------------------------------------------------- shapes
    def splat(self, x: Dyn, t: TileType, loc: Loc) -> Dyn:
        return Dyn(self.b.value(T.SplatOp, [x.value], t, loc=loc))

    def broadcast_to(self, x: Dyn, shape: tuple[int, ...], loc: Loc) -> Dyn:
        t = x.type
        if isinstance(t, ScalarType):
            return self.splat(x, TileType(shape, t.dtype), loc)
        if t.shape == shape:
            return x
        v = x.value
        src = t.shape
        if len(src) > len(shape):
            raise TkcTypeError(f"cannot broadcast {t} to shape {list(shape)}", loc)
        for _ in range(len(shape) - len(src)):
            src = (1, *src)
            v = self.b.value(T.ExpandDimsOp, [v], TileType(src, t.dtype), {"axis": 0}, loc=loc)
        if any(s != d and s != 1 for s, d in zip(src, shape)):
            raise TkcTypeError(f"cannot broadcast {t} to shape {list(shape)}", loc)
        if src != shape:
            v = self.b.value(T.BroadcastOp, [v], TileType(shape, t.dtype), loc=loc)
        return Dyn(v)

    def expand_dims(self, x: Dyn, axis: int, loc: Loc) -> Dyn:
        t = x.type
        shape = list(t.shape)
        shape.insert(axis, 1)
        return Dyn(self.b.value(T.ExpandDimsOp, [x.value], t.with_shape(tuple(shape)),
                                {"axis": axis}, loc=loc))

    @staticmethod
    def broadcast_shape(a: Type, b: Type, what: str, loc: Loc) -> tuple[int, ...]:
        sa, sb = shape_of(a), shape_of(b)
        n = max(len(sa), len(sb))
        sa, sb = (1,) * (n - len(sa)) + sa, (1,) * (n - len(sb)) + sb
        out = []
        for x, y in zip(sa, sb):
            if x != y and 1 not in (x, y):
                raise TkcTypeError(f"shape mismatch in {what}: {a} and {b} do not broadcast", loc)
            out.append(max(x, y))
        return tuple(out)

    def unify(self, a: Dyn | Const, b: Dyn | Const, what: str, loc: Loc) -> tuple[Dyn, Dyn]:
        """Bring two operands to one type: constants take the other side's
        dtype, dtypes must otherwise agree, shapes broadcast."""
        if isinstance(a, Const) and isinstance(b, Const):
            a = self.materialize(a, None, loc)
        if isinstance(a, Const):
            a = self.materialize(a, b.type, loc)
        if isinstance(b, Const):
            b = self.materialize(b, a.type, loc)
        if a.type.dtype != b.type.dtype:
            raise TkcTypeError(f"dtype mismatch in {what}: {a.type.dtype.name} and {b.type.dtype.name}; "
                               f"cast one side with .to(...)", loc)
        if a.type == b.type:
            return a, b
        shape = self.broadcast_shape(a.type, b.type, what, loc)
        return self.broadcast_to(a, shape, loc), self.broadcast_to(b, shape, loc)

    # ---------------------------------------------------------- arithmetic
    def binary(self, op: str, a: Dyn | Const, b: Dyn | Const, loc: Loc) -> Dyn | Const:
        """``a op b`` for an operator symbol or a two-operand function name."""
        if isinstance(a, Const) and isinstance(b, Const):
            return self._fold(op, a, b, loc)
        if op == "**":
            return self._power(a, b, loc)
        what = f"'{op}'"
        x, y = self.unify(a, b, what, loc)
        cls = BINARY_OPS[op]
        if E.kind_of(x.type) not in cls.KINDS:
            raise TkcTypeError(cls.refusal(what, x.type), loc)
        v = self.b.value(cls, [x.value, y.value], x.type, loc=loc)
        self._track_affine(op, a, b, v)
        return Dyn(v)

    def call(self, name: str, args: list[Dyn | Const], loc: Loc) -> Dyn | Const:
        """An elementwise function of three or more operands (``fma``), operands unified."""
        cls = E.FUNCTIONS[name]
        if any(isinstance(x, Const) and isinstance(x.value, bool) for x in args) and "bool" not in cls.KINDS:
            raise TkcTypeError(cls.refusal(f"{name}()", ScalarType(dtypes.i1)), loc)
        if all(isinstance(x, Const) for x in args):
            return self._fold_call(name, cls, [x.value for x in args], loc)
        like = next(x for x in args if isinstance(x, Dyn))
        if E.kind_of(like.type) not in cls.KINDS:
            raise TkcTypeError(cls.refusal(f"{name}()", like.type), loc)
        for x in args:
            if isinstance(x, Dyn) and x.type.dtype != like.type.dtype:
                raise TkcTypeError(f"dtype mismatch in {name}(): {like.type.dtype.name} and {x.type.dtype.name}; "
                                   f"cast one side with .to(...)", loc)
        dyn = [self.materialize(x, like.type, loc) if isinstance(x, Const) else x for x in args]
        joined: Type = dyn[0].type
        for x in dyn[1:]:
            shape = self.broadcast_shape(joined, x.type, f"{name}()", loc)
            joined = TileType(shape, like.type.dtype) if shape else joined
        if isinstance(joined, TileType):
            dyn = [self.broadcast_to(x, joined.shape, loc) for x in dyn]
        return Dyn(self.b.value(cls, [x.value for x in dyn], joined, loc=loc))

    def _fold_call(self, name: str, cls: type[E.ElementwiseOp], values: list, loc: Loc) -> Const:
        try:
            r = cls.fold(*values)
        except (ValueError, OverflowError, ZeroDivisionError, TypeError) as e:
            raise TkcTypeError(f"{name}({', '.join(map(repr, values))}) fails: {e}", loc) from None
        return Const(r)

    def _track_affine(self, op: str, a: Dyn | Const, b: Dyn | Const, v: Value) -> None:
        if v.type not in (T.I32, T.I64):
            return
        fa, fb = self.affine_of(a), self.affine_of(b)
        if fa is None or fb is None:
            return
        if op == "+":
            self.affine[v] = fa + fb
        elif op == "-":
            self.affine[v] = fa - fb
        elif op == "*" and (fa.is_const or fb.is_const):
            self.affine[v] = fb.scale(fa.const) if fa.is_const else fa.scale(fb.const)

    def _fold(self, op: str, a: Const, b: Const, loc: Loc) -> Const:
        if op == "**" and isinstance(a.value, int) and isinstance(b.value, int) and abs(a.value) > 1 \
                and b.value * (abs(a.value).bit_length() - 1) > _MAX_CONST_BITS:  # 10 ** 10 ** 10 would not finish
            raise TkcTypeError(f"constant expression '{op}' is too large", loc)
        if op == "<<" and isinstance(a.value, int) and isinstance(b.value, int) and a.value \
                and b.value > _MAX_CONST_BITS:  # 1 << (1 << 40) would take all memory
            raise TkcTypeError(f"constant expression '{op}' is too large", loc)
        try:
            if op in _PY_CMP:
                return Const(_PY_CMP[op](a.value, b.value))
            r = BINARY_OPS[op].fold(a.value, b.value)
        except ZeroDivisionError:
            raise TkcTypeError(f"division by zero in constant expression '{op}'", loc) from None
        except OverflowError:
            raise TkcTypeError(f"constant expression '{op}' overflows", loc) from None
        except ValueError as e:
            raise TkcTypeError(f"constant expression '{op}' fails: {e}", loc) from None
        except TypeError:  # e.g. 1.5 & 2
            raise TkcTypeError(f"'{op}' cannot take the constants {a.value!r} and {b.value!r}", loc) from None
        if isinstance(r, complex):
            raise TkcTypeError("constant expression has no real value", loc)
        if isinstance(r, int) and r.bit_length() > _MAX_CONST_BITS:
            raise TkcTypeError(f"constant expression '{op}' is too large", loc)
        return Const(r)

    def _power(self, a: Dyn | Const, b: Dyn | Const, loc: Loc) -> Dyn:
        if isinstance(b, Const) and type(b.value) is int and 1 <= b.value <= 16:
            if not a.type.dtype.is_float and not a.type.dtype.is_int:
                raise TkcTypeError(f"'**' needs float or integer operands, got {a.type.dtype.name}", loc)
            result, base, n = None, a, b.value
            while n:  # square-and-multiply keeps the op count logarithmic (and is exact for i32)
                if n & 1:
                    result = base if result is None else self.binary("*", result, base, loc)
                n >>= 1
                if n:
                    base = self.binary("*", base, base, loc)
            return result
        if any(isinstance(x, Dyn) and not x.type.dtype.is_float for x in (a, b)) or \
                any(isinstance(x, Const) and isinstance(x.value, bool) for x in (a, b)):
            raise TkcTypeError("'**' needs a constant integer exponent from 1 to 16, or float operands", loc)
        x, y = self.unify(a, b, "'**'", loc)
        return Dyn(self.b.value(E.PowOp, [x.value, y.value], x.type, loc=loc))

    def unary(self, op: str, x: Dyn | Const, loc: Loc) -> Dyn | Const:
        """A one-operand op: an operator symbol ('-', '~', 'not') or a function name."""
        cls = UNARY_OPS[op]
        if isinstance(x, Const):
            if cls is E.NotOp and isinstance(x.value, float):
                raise TkcTypeError(f"'~' needs bool or integer operands, got the constant {x.value!r}", loc)
            if isinstance(x.value, bool) and "bool" not in cls.KINDS:
                raise TkcTypeError(cls.refusal(_UNARY_WORDS.get(op, op), ScalarType(dtypes.i1)), loc)
            try:
                return Const(cls.fold(x.value))
            except (ValueError, OverflowError, ZeroDivisionError) as e:
                raise TkcTypeError(f"{op}({x.value}) fails: {e}", loc) from None
        if E.kind_of(x.type) not in cls.KINDS:
            raise TkcTypeError(cls.refusal(_UNARY_WORDS.get(op, op), x.type), loc)
        v = self.b.value(cls, [x.value], x.type, loc=loc)
        if cls is E.NegOp and (fa := self.affine_of(x)) is not None:
            self.affine[v] = fa.scale(-1)
        return Dyn(v)

    def compare(self, op: str, a: Dyn | Const, b: Dyn | Const, loc: Loc) -> Dyn | Const:
        if isinstance(a, Const) and isinstance(b, Const):
            return self._fold(op, a, b, loc)
        x, y = self.unify(a, b, f"'{op}'", loc)
        rt = T.I1 if isinstance(x.type, ScalarType) else x.type.with_dtype(dtypes.i1)
        return Dyn(self.b.value(T.CmpOp, [x.value, y.value], rt, {"pred": CMP_PREDS[op]}, loc=loc))

    def select(self, c: Dyn | Const, a: Dyn | Const, b: Dyn | Const, loc: Loc) -> Dyn | Const:
        if isinstance(c, Const):
            return a if c.value else b
        if c.type.dtype != dtypes.i1:
            raise TkcTypeError(f"where() condition must be bool, got {c.type}", loc)
        x, y = self.unify(a, b, "where()", loc)
        shape = self.broadcast_shape(c.type, x.type, "where()", loc)
        if shape:  # all scalars (``n if c else 0`` on runtime scalars) stay scalars
            x, y = self.broadcast_to(x, shape, loc), self.broadcast_to(y, shape, loc)
            if shape_of(c.type) != shape:
                c = self.broadcast_to(c, shape, loc)
        return Dyn(self.b.value(T.SelectOp, [c.value, x.value, y.value], x.type, loc=loc))

    def cast(self, x: Dyn | Const, dt: DType, loc: Loc) -> Dyn:
        if isinstance(x, Const):
            return self.constant(x.value, ScalarType(dt), loc) if not (
                isinstance(x.value, float) and not dt.is_float) else self.cast(
                self.materialize(x, None, loc), dt, loc)
        if x.type.dtype == dt:
            return x
        if x.type.dtype.is_packed or dt.is_packed:
            return self._fp4(x, dt, loc)
        rt = ScalarType(dt) if isinstance(x.type, ScalarType) else x.type.with_dtype(dt)
        return Dyn(self.b.value(T.CastOp, [x.value], rt, loc=loc))

    def _fp4(self, x: Dyn, dt: DType, loc: Loc) -> Dyn:
        """``x.to(dt)`` where one side is ``f4e2m1x2``: a tile of pairs [..., C] unpacks into
        [..., 2C] values (the first of each pair first), a float tile [..., 2C] packs into
        pairs [..., C], its values rounded to E2M1 (tkc/dtypes.py)."""
        t, src = x.type, x.type.dtype
        if not isinstance(t, TileType):
            raise TkcTypeError(f"a scalar cannot be converted to or from {dtypes.f4e2m1x2.name} (pairs of FP4 "
                               f"values along a tile's last axis): convert a tile", loc)
        if src.is_packed:
            if not dt.is_float:
                raise TkcTypeError(f"f4e2m1x2 pairs unpack to floats, not {dt.name}: .to(f32)", loc)
            wide = Dyn(T.unpacked_fp4(self.b, x.value, t.rank - 1, loc))
            return self.cast(wide, dt, loc)
        if not src.is_float:
            raise TkcTypeError(f".to(f4e2m1x2) packs float values, not {src.name}: convert to f32 first", loc)
        if t.shape[-1] % 32:
            raise TkcTypeError(f".to(f4e2m1x2) packs the last axis in pairs into a tile whose extents are "
                               f"multiples of 16: its extent must be a multiple of 32, got {t}", loc)
        return Dyn(T.packed_fp4(self.b, self.cast(x, dtypes.f32, loc).value, loc))

    # ---------------------------------------------------------- tile ops
    def mma(self, a: Dyn, b: Dyn, acc: Dyn | None, loc: Loc) -> Dyn:
        ta, tb = a.type, b.type
        for t, side in ((ta, "left"), (tb, "right")):
            if not isinstance(t, TileType) or t.rank != 2:
                raise TkcTypeError(f"'@' needs 2-D tiles; the {side} operand is {t}", loc)
        if ta.shape[1] != tb.shape[0]:
            raise TkcTypeError(f"matmul shapes do not agree: {ta} @ {tb} "
                               f"(inner extents {ta.shape[1]} and {tb.shape[0]})", loc)
        for t in (ta, tb):
            if any(s % 16 for s in t.shape):
                raise TkcTypeError(f"matmul operands need extents that are multiples of 16, got {t}", loc)
        names = T.MMA_DTYPES
        if ta.dtype.name not in names or tb.dtype.name not in names:
            raise TkcTypeError(f"'@' takes {', '.join(names)} tiles, got {ta.dtype.name} @ {tb.dtype.name}",
                               loc)
        if ta.dtype != tb.dtype and not (ta.dtype.bits == 8 and tb.dtype.bits == 8):
            raise TkcTypeError(f"dtype mismatch in '@': {ta.dtype.name} and {tb.dtype.name}; "
                               f"cast one side with .to(...)", loc)
        step = mma_k_step(ta.dtype.bits)
        if ta.shape[1] % step:
            raise TkcTypeError(f"{ta.dtype.name} products take K in steps of {step}: this one has K = {ta.shape[1]}; "
                               f"make the K block a multiple of {step}", loc)
        out = TileType((ta.shape[0], tb.shape[1]), dtypes.f32)
        if acc is None:
            acc = self.constant(0.0, out, loc)
        return Dyn(self.b.value(T.MmaOp, [a.value, b.value, acc.value], out, loc=loc))

    def dot_scaled(self, a: Dyn, sa: Dyn | None, b: Dyn, sb: Dyn | None, loc: Loc) -> Dyn:
        """``dot_scaled(a, a_scale, b, b_scale)``: the block-scaled product, typed here; a scale
        given as None (``sa``/``sb`` None here) is a tile of ones.  Each scale covers 32 values
        along K (f8e8m0, OCP MX) or 16 (f8e4m3, NVFP4)."""
        names = dict(zip(("a", "a_scale", "b", "b_scale"), (a, sa, b, sb)))
        for n, x in names.items():
            if x is not None and (not isinstance(x.type, TileType) or x.type.rank != 2):
                raise TkcTypeError(f"dot_scaled() needs 2-D tiles; {n} is {x.type}", loc)
        ta, tb = a.type, b.type
        for n, t in (("a", ta), ("b", tb)):
            if t.dtype.name not in T.SCALED_DTYPES:
                raise TkcTypeError(f"dot_scaled() multiplies {', '.join(T.SCALED_DTYPES)} tiles; {n} is "
                                   f"{t.dtype.name} (quantize it first, e.g. examples/mx_fp8.tk, or cast it "
                                   f"to bf16 and give None for its scales)", loc)
        # FP4 pairs run along K: a's along its rows as loaded, b's down the columns of a weight
        # [N, K/2] read transposed (the pairs of a tensor run along its last axis).
        if ta.dtype.is_packed and _is_transpose(a.value):
            raise TkcTypeError("dot_scaled()'s a holds FP4 pairs along K, its last axis as loaded: pass the "
                               "tile of a [M, K/2] tensor, not a transpose", loc)
        if tb.dtype.is_packed and not _is_transpose(b.value):
            raise TkcTypeError("dot_scaled()'s b of FP4 pairs is a weight [N, K/2] read transposed, whose pairs "
                               "run along K: w[...].T", loc)
        k = T.operand_k(ta, 1)
        if k != T.operand_k(tb, 0):
            hint = ("; a weight stored [N, K] is read transposed: b[...].T, b_scale[...].T"
                    if T.operand_k(tb, 1) == k and not tb.dtype.is_packed else "")
            raise TkcTypeError(f"dot_scaled() shapes do not agree: {ta} @ {tb} "
                               f"(K = {k} and {T.operand_k(tb, 0)}, FP4 pairs counting two){hint}", loc)
        for t in (ta, tb):
            if any(s % 16 for s in t.shape):
                raise TkcTypeError(f"dot_scaled() operands need extents that are multiples of 16, got {t}", loc)
        # E8M0 scales (OCP MX) cover 32 values along K, e4m3 ones (NVFP4) 16 (a dtype that is
        # neither is refused below)
        given = sa if sa is not None else sb
        block = T.SCALE_BLOCK_OF.get(given.type.dtype.name, T.SCALE_BLOCK)
        if k % block:
            raise TkcTypeError(f"dot_scaled() scales runs of {block} values along K: K = {k} is not a multiple of "
                               f"{block}", loc)
        kb = k // block
        # (the other side's scales are a loaded tile: K / block is already a tile axis's extent)
        one = given.type.dtype
        sa, sb = [self.constant(1.0, TileType(shape, one), loc) if x is None else x
                  for x, shape in ((sa, (ta.shape[0], kb)), (sb, (kb, tb.shape[1])))]
        for n, x, want in (("a_scale", sa, (ta.shape[0], kb)), ("b_scale", sb, (kb, tb.shape[1]))):
            if x.type.dtype.name not in T.SCALE_BLOCK_OF:
                raise TkcTypeError(f"dot_scaled()'s {n} holds f8e8m0 scales (E8M0, one per 32 values along "
                                   f"K), or NVFP4's f8e4m3 (one per 16), got {x.type.dtype.name}", loc)
            if x.type.shape != want:
                got = "x".join(map(str, x.type.shape))
                hint = f"; scales stored [N, K/{block}] are read transposed: {n}[...].T" \
                    if x.type.shape == want[::-1] and want[0] != want[1] else ""
                raise TkcTypeError(f"dot_scaled()'s {n} must be {want[0]}x{want[1]} (one scale per "
                                   f"{block} values along K = {k}), got {got}{hint}", loc)
        if sa.type.dtype != sb.type.dtype:
            raise TkcTypeError(f"dot_scaled()'s scales are of one dtype, got {sa.type.dtype.name} and "
                               f"{sb.type.dtype.name}", loc)
        out = TileType((ta.shape[0], tb.shape[1]), dtypes.f32)
        acc = self.constant(0.0, out, loc)
        return Dyn(self.b.value(T.DotScaledOp, [a.value, sa.value, b.value, sb.value, acc.value], out, loc=loc))

    def transpose(self, x: Dyn, loc: Loc) -> Dyn:
        t = x.type
        if not isinstance(t, TileType) or t.rank != 2:
            raise TkcTypeError(f".T needs a 2-D tile, got {t}", loc)
        return Dyn(self.b.value(T.TransposeOp, [x.value], t.with_shape(t.shape[::-1]), loc=loc))

    def reduce(self, kind: str, x: Dyn, axis: int, keepdim: bool, loc: Loc) -> Dyn:
        t = x.type
        if not isinstance(t, TileType):
            raise TkcTypeError(f"{kind}() reduces a tile, got {t}", loc)
        if not -t.rank <= axis < t.rank:
            raise TkcTypeError(f"axis {axis} is out of range for {t}", loc)
        axis %= t.rank
        if t.dtype.is_bool:
            raise TkcTypeError(f"{kind}() of a bool tile; cast it with .to(i32)", loc)
        _no_pairs(f"{kind}()", t, loc)
        if kind == "mean" and not t.dtype.is_float:
            raise TkcTypeError(f"mean() takes a float tile, got {t}; cast it with .to(f32)", loc)
        shape = t.shape[:axis] + t.shape[axis + 1:]
        rt = t.with_shape(shape) if shape else ScalarType(t.dtype)
        r = Dyn(self.b.value(T.ReduceOp, [x.value], rt, {"kind": kind, "axis": axis}, loc=loc))
        if keepdim:
            r = self.expand_dims(r, axis, loc) if shape else self.splat(r, t.with_shape((1,)), loc)
        return r

    def reshape(self, x: Dyn, shape: tuple[int, ...], loc: Loc) -> Dyn:
        """``x.reshape(shape)``: the same elements, row-major, in another shape."""
        t = x.type
        if math.prod(shape) != t.numel:
            raise TkcTypeError(f"cannot reshape {t} ({t.numel} elements) to {list(shape)} "
                               f"({math.prod(shape)} elements)", loc)
        if shape == t.shape:
            return x
        return Dyn(self.b.value(T.ReshapeOp, [x.value], t.with_shape(shape), loc=loc))

    def take(self, x: Dyn, axis: int, index: int, loc: Loc) -> Dyn:
        """``x[..., index, ...]`` with a constant index on ``axis``: that axis dropped."""
        t = x.type
        if t.rank < 2:
            raise TkcTypeError(f"indexing {t} with a number would leave a scalar; reduce it instead", loc)
        if not -t.shape[axis] <= index < t.shape[axis]:
            raise TkcTypeError(f"index {index} is out of range for axis {axis} of {t} (extent {t.shape[axis]})", loc)
        return Dyn(self.b.value(T.TakeOp, [x.value], t.with_shape(t.shape[:axis] + t.shape[axis + 1:]),
                                {"axis": axis, "index": index % t.shape[axis]}, loc=loc))

    def block(self, x: Dyn, axis: int, lo: int, hi: int, step: int, loc: Loc) -> Dyn:
        """``x[..., lo:hi:step, ...]`` with constant bounds on ``axis``: an aligned block of it
        (the axis split into blocks by a reshape, one taken), and with a step, every
        ``step``-th element of that block from ``lo`` (the block split into groups of ``step``,
        one phase taken): registers picked, as ``tile.take`` does."""
        t = x.type
        n = t.shape[axis]
        if step < 1:
            raise TkcTypeError(f"a slice step must be a positive constant, got {step}", loc)
        base = lo - lo % step
        w = -(-(hi - base) // step) * step
        if step > 1 and len(range(lo, hi, step)) != w // step:
            raise TkcTypeError(f"a stepped slice of a tile takes one element of every group of {step} of an aligned "
                               f"block: {lo}:{hi}:{step} leaves out the block's last group (end it at {base + w})", loc)
        if not (0 <= lo < hi <= n and n % w == 0 and base % w == 0):
            raise TkcTypeError(f"a slice of a tile takes an aligned block of an axis: its length must divide the "
                               f"axis's {n} and its start be a multiple of its length, got {lo}:{hi}", loc)
        if (w // step) % 16:
            raise TkcTypeError(f"a slice of a tile keeps a multiple of 16 elements of an axis, got "
                               f"{w // step} of {lo}:{hi}:{step}", loc)
        if w != n:
            x = self.take(self.reshape(x, t.shape[:axis] + (n // w, w) + t.shape[axis + 1:], loc), axis, base // w, loc)
        if step == 1:
            return x
        groups = self.reshape(x, x.type.shape[:axis] + (w // step, step) + x.type.shape[axis + 1:], loc)
        return self.take(groups, axis + 1, lo % step, loc)

    def scan(self, name: str, kind: str, x: Dyn, axis: int, loc: Loc) -> Dyn:
        """``cumsum``/``cumprod`` (``name``) of a tile along ``axis``: same shape and dtype."""
        t = x.type
        if not -t.rank <= axis < t.rank:
            raise TkcTypeError(f"axis {axis} is out of range for {t}", loc)
        if t.dtype.is_bool:
            raise TkcTypeError(f"{name}() of a bool tile; cast it with .to(i32)", loc)
        _no_pairs(f"{name}()", t, loc)
        return Dyn(self.b.value(T.ScanOp, [x.value], t, {"kind": kind, "axis": axis % t.rank}, loc=loc))

    def arg_reduce(self, kind: str, x: Dyn, axis: int, keepdim: bool, loc: Loc) -> Dyn:
        """``argmax``/``argmin`` (``kind``) of a tile along ``axis``: an i32 index per line."""
        t = x.type
        if not -t.rank <= axis < t.rank:
            raise TkcTypeError(f"axis {axis} is out of range for {t}", loc)
        axis %= t.rank
        if t.dtype.is_bool:
            raise TkcTypeError(f"{kind}() of a bool tile; cast it with .to(i32)", loc)
        _no_pairs(f"{kind}()", t, loc)
        shape = t.shape[:axis] + t.shape[axis + 1:]
        rt = TileType(shape, dtypes.i32) if shape else T.I32
        r = Dyn(self.b.value(T.ArgReduceOp, [x.value], rt, {"kind": kind, "axis": axis}, loc=loc))
        if keepdim:
            r = self.expand_dims(r, axis, loc) if shape else self.splat(r, TileType((1,), dtypes.i32), loc)
        return r
