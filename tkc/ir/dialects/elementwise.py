"""The ``tile`` dialect's elementwise ops, each declared once.

An elementwise op is one class here, and the class is everything tkc knows about the op
apart from its PTX: the names it has in tile code (``SURFACE``: a function such as ``exp``,
also callable as a method ``x.exp()``, or an operator such as ``+``), the element kinds it
takes (``KINDS``, the type rule the verifier and the frontend both apply), what it computes
(``compute``: numpy on storage-form arrays, which the interpreter, constant folding and the
emulator all call), how the frontend folds Python constants (``fold``), whether
``canonicalize`` may fold it (``FOLDS``), and a one-line summary with an example (``tkc
ops``).  Codegen registers a lowering per class (``tkc/codegen/lower_elementwise.py``); an
op a target cannot render directly says how it ``decompose``\\s into simpler ones, and the
``decompose`` pass does that before layouts are chosen.

Must not: know any target, layout or pass.  Numerics the summaries leave open are in
``tkc/semantics.py``'s docstring (float ops compute in float32 and round once to the
result dtype; i32 and i64 arithmetic wraps).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from tkc import dtypes
from tkc.ir.core import OPS, Operation, register
from tkc.ir.types import ScalarType, TileType, Type, element_dtype, shape_of

if TYPE_CHECKING:
    from tkc.ir.builder import Builder
    from tkc.ir.core import Value


_INT_MINS = (dtypes.i32.min, dtypes.i64.min)


def kind_of(t: Type) -> str:
    """'float', 'int', 'bool' or 'packed' (FP4 pairs, which no elementwise op takes): the element
    kind of a scalar or tile type."""
    dt = t.dtype
    return "float" if dt.is_float else "bool" if dt.is_bool else "packed" if dt.is_packed else "int"


class ElementwiseOp(Operation):
    """Operands and result of one scalar or tile type; the result computed value by value."""

    RESULTS = ("result",)
    TRAITS = frozenset({"pure", "elementwise"})
    #: The op's names in tile code: identifiers are functions (and methods), others operators.
    SURFACE: ClassVar[tuple[str, ...]] = ()
    #: The element kinds it takes: a subset of {"float", "int", "bool"}.
    KINDS: ClassVar[frozenset[str]] = frozenset({"float"})
    SUMMARY: ClassVar[str] = ""
    EXAMPLE: ClassVar[str] = ""
    #: Whether canonicalize may replace it, on constant operands, by what ``compute`` gives.
    #: False where numpy's scalar and vector paths may differ in the last bit (exp, log...).
    FOLDS: ClassVar[bool] = True
    #: What to tell a user who passed the wrong kind (None: said from ``KINDS``).
    HINT: ClassVar[str | None] = None

    # ------------------------------------------------------------ semantics
    @staticmethod
    def compute(*xs: np.ndarray) -> np.ndarray:
        """The result from storage-form operands (float32 for every float dtype), before it is
        rounded to the result dtype (the caller rounds once)."""
        raise NotImplementedError

    @classmethod
    def fold(cls, *xs: int | float | bool) -> int | float | bool:
        """The value of the op on Python constants (the frontend folds ``exp(1.0)``): by
        default ``compute`` in float64.  Finite operands with no finite value (``log1p(-1.0)``)
        are a ValueError, as Python's ``math`` functions say it."""
        with np.errstate(all="ignore"):
            r = float(cls.compute(*(np.float64(x) for x in xs)))
        if not math.isfinite(r) and all(math.isfinite(x) for x in xs):
            raise ValueError("math domain error" if math.isnan(r) else "no finite value")
        return r

    @classmethod
    def target_defined(cls, values: list[Any]) -> bool:
        """Whether these constant operands give a result the target chooses (integer division
        by zero, which zero max(-0.0, 0.0) is): canonicalize leaves such ops alone."""
        return False

    def decompose(self, b: Builder) -> Value | None:
        """The op rebuilt from simpler ones of its own type at ``b`` (its result), or None when
        every target renders it directly.  The ``decompose`` pass calls it on f32 operands (a
        narrower float op is widened around it, so that it rounds once, as ``compute``)."""
        return None

    @classmethod
    def decomposes(cls) -> bool:
        """Whether the op has a decomposition (for targets that do not render it)."""
        return cls.decompose is not ElementwiseOp.decompose

    # ------------------------------------------------------------ typing
    @classmethod
    def refusal(cls, what: str, t: Type) -> str:
        """Why ``what`` (how the user wrote the op) does not take operands of type ``t``."""
        kind = kind_of(t)
        dt = t.dtype.name
        if kind == "packed":
            return (f"{what} on {dt}, pairs of FP4 values, which have no arithmetic: unpack them with "
                    f".to(f32) first")
        if cls.HINT is not None:
            return cls.HINT.format(what=what, type=t, dtype=dt)
        if kind == "bool":
            if len(cls.OPERANDS) == 1:
                return f"{what} of a bool value; use ~ for logical not"
            return f"{what} on bool values; use & and | for logic"
        if cls.KINDS == {"float"}:
            if len(cls.OPERANDS) == 1:
                return f"{what} takes a float operand, got {t}; cast with .to(f32)"
            return f"{what} takes float operands, got {dt}; cast with .to(f32)"
        if cls.KINDS == {"int"}:
            return f"{what} needs integer operands, got {dt}"
        return f"{what} needs bool or integer operands, got {dt}"

    def verify(self) -> None:
        ts = [v.type for v in self.operands] + [r.type for r in self.results]
        if not isinstance(ts[0], (ScalarType, TileType)):
            raise self.error(f"expects scalars or tiles, got {ts[0]}")
        if any(t != ts[0] for t in ts):
            raise self.error("operands and result must have one type, got " + ", ".join(map(str, ts)))
        if kind_of(ts[0]) not in self.KINDS:
            raise self.error(f"does not take {ts[0].dtype.name} operands")


def is_value_type(t: Type) -> bool:
    """A scalar or a tile: what elementwise ops take."""
    return isinstance(t, (ScalarType, TileType))


# --------------------------------------------------- constants, compare, select
@register
class ConstantOp(Operation):
    """A scalar constant, or a tile with every element equal to ``value``."""

    name = "tile.constant"
    SURFACE = 'a literal; zeros, ones, full of a constant'
    EXAMPLE = 'acc = zeros([BM, BN], f32)'
    RESULTS = ("result",)
    ATTRS = {"value": (int, float, bool)}
    TRAITS = frozenset({"pure", "constant"})

    def verify(self) -> None:
        t = self.result.type
        if not is_value_type(t):
            raise self.error(f"result must be a scalar or tile, got {t}")
        v = self.value
        if t.dtype.is_bool and not isinstance(v, bool):
            raise self.error("an i1 constant takes true or false")
        if t.dtype.is_int and (isinstance(v, bool) or not isinstance(v, int)):
            raise self.error("an integer constant takes an integer value")


def constant_value(v: object) -> int | float | bool | None:
    """The value of ``v`` when a ``tile.constant`` defines it (a scalar, or a tile's every
    element), rounded to its dtype as the interpreter materializes it; else None."""
    owner = getattr(v, "owner", None)
    if owner is None or owner.name != "tile.constant":
        return None
    return dtypes.round_to(owner.attributes["value"], element_dtype(v.type)).item()


CMP_PREDICATES = ("lt", "le", "gt", "ge", "eq", "ne")


@register
class CmpOp(Operation):
    """``a < b`` (``pred``: lt, le, gt, ge, eq, ne) value by value: a bool of the operands' shape; NaN compares
    unequal to everything."""

    name = "tile.cmp"
    SURFACE = '<, <=, >, >=, ==, !='
    EXAMPLE = 'keep = rows < n'
    OPERANDS = ("lhs", "rhs")
    RESULTS = ("result",)
    ATTRS = {"pred": str}
    TRAITS = frozenset({"pure", "elementwise"})

    def verify(self) -> None:
        a, b, r = self.lhs.type, self.rhs.type, self.result.type
        if a != b or not is_value_type(a):
            raise self.error(f"operands must have one scalar or tile type, got {a}, {b}")
        if self.pred not in CMP_PREDICATES:
            raise self.error(f"predicate must be one of {', '.join(CMP_PREDICATES)}")
        if shape_of(r) != shape_of(a) or r.dtype != dtypes.i1 or type(r) is not type(a):
            raise self.error(f"result must be i1 of the operands' shape, got {r}")


@register
class SelectOp(Operation):
    """``where(cond, a, b)``: cond is i1 of the same shape (or a scalar)."""

    name = "tile.select"
    SURFACE = 'where'
    EXAMPLE = 'p = where(cols <= rows, p, 0.0)'
    OPERANDS = ("cond", "a", "b")
    RESULTS = ("result",)
    TRAITS = frozenset({"pure", "elementwise"})

    def verify(self) -> None:
        c, a, b, r = self.cond.type, self.a.type, self.b.type, self.result.type
        if not (a == b == r) or not is_value_type(a):
            raise self.error(f"branches and result must have one type, got {a}, {b} -> {r}")
        if not is_value_type(c) or c.dtype != dtypes.i1 or (shape_of(c) != shape_of(a) and shape_of(c) != ()):
            raise self.error(f"condition must be i1 of the result's shape, got {c}")



class _Unary(ElementwiseOp):
    OPERANDS = ("x",)


class _Binary(ElementwiseOp):
    OPERANDS = ("lhs", "rhs")


_INT = frozenset({"int"})
_NUMBERS = frozenset({"float", "int"})
_BITS = frozenset({"int", "bool"})


def _same_type(b: Builder, cls: type[Operation], *xs: Value) -> Value:
    return b.value(cls, list(xs), xs[0].type)


def _const(b: Builder, like: Value, value: float) -> Value:
    return b.value(ConstantOp, [], like.type, {"value": value})


def _poly(b: Builder, x: Value, coefficients: list[float]) -> Value:
    """c0 + x (c1 + x (c2 + ...)) by Horner's rule (coefficients lowest first)."""
    acc = _const(b, x, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        acc = _same_type(b, AddOp, _same_type(b, MulOp, acc, x), _const(b, x, c))
    return acc


def _where(b: Builder, cond: Value, a: Value, c: Value) -> Value:
    return b.value(SelectOp, [cond, a, c], a.type)


def _cmp(b: Builder, pred: str, x: Value, y: Value) -> Value:
    i1 = dtypes.i1
    return b.value(CmpOp, [x, y], x.type.with_dtype(i1) if isinstance(x.type, TileType) else ScalarType(i1),
                   {"pred": pred})


# ----------------------------------------------------------------- binary
def _op(name: str, base: type[ElementwiseOp], surface: tuple[str, ...], kinds: frozenset[str], summary: str,
        example: str, compute: Callable[..., Any], fold: Callable[..., Any] | None = None,
        commutative: bool = False, folds: bool = True, hint: str | None = None,
        cls_name: str | None = None) -> type[ElementwiseOp]:
    """Declare and register a plain elementwise op (one whose class needs no methods of its own)."""
    traits = base.TRAITS | ({"commutative"} if commutative else set())
    body: dict[str, Any] = {"name": name, "SURFACE": surface, "KINDS": kinds, "SUMMARY": summary,
                            "EXAMPLE": example, "FOLDS": folds, "HINT": hint, "TRAITS": frozenset(traits),
                            "compute": staticmethod(compute)}
    if fold is not None:
        body["fold"] = classmethod(lambda cls, *xs: fold(*xs))
    cls_name = cls_name or "".join(p.title() for p in name.split(".")[1].split("_")) + "Op"
    return register(type(cls_name, (base,), body))


AddOp = _op("tile.add", _Binary, ("+",), _NUMBERS, "sum", "y = a + b", np.add, operator.add, commutative=True)
SubOp = _op("tile.sub", _Binary, ("-",), _NUMBERS, "difference", "y = a - b", np.subtract, operator.sub)
MulOp = _op("tile.mul", _Binary, ("*",), _NUMBERS, "product", "y = a * b", np.multiply, operator.mul,
            commutative=True)
DivOp = _op("tile.div", _Binary, ("/",), frozenset({"float"}), "IEEE division (div.rn.f32)", "y = a / b",
            np.true_divide, operator.truediv,
            hint="{what} on {dtype} values; use // for integer division or cast with .to(f32)")


def _cdiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.negative(np.floor_divide(np.negative(a), b))


class _IntDivision(_Binary):
    KINDS = _INT

    @classmethod
    def target_defined(cls, values: list[Any]) -> bool:
        # Integer division by zero (and INT_MIN // -1) is the target's choice.
        if isinstance(values[1], float):
            return False
        return values[1] == 0 or (cls.name == "tile.floordiv" and values[0] in _INT_MINS and values[1] == -1)


FloorDivOp = _op("tile.floordiv", _IntDivision, ("//",), _INT, "floor division (Python's: -7 // 2 == -4)",
                 "q = a // b", np.floor_divide, operator.floordiv, cls_name="FloorDivOp")
RemOp = _op("tile.rem", _IntDivision, ("%",), _INT, "remainder with the divisor's sign (Python's)",
            "r = a % b", np.remainder, operator.mod)
CdivOp = _op("tile.cdiv", _IntDivision, ("cdiv",), _INT, "ceiling division, -(-a // b)", "n = cdiv(N, BN)",
             _cdiv, lambda a, b: -(-a // b))


class _MinMax(_Binary):
    KINDS = _NUMBERS

    @classmethod
    def target_defined(cls, values: list[Any]) -> bool:
        if not isinstance(values[0], float):
            return False
        a, b = values  # NaN propagation, and which zero of two wins, stay the target's
        return math.isnan(a) or math.isnan(b) or (a == 0 and b == 0)


MaximumOp = _op("tile.maximum", _MinMax, ("maximum",), _NUMBERS, "larger of two, NaN propagating",
                "m = maximum(m, s)", np.maximum, max, commutative=True)
MinimumOp = _op("tile.minimum", _MinMax, ("minimum",), _NUMBERS, "smaller of two, NaN propagating",
                "m = minimum(a, b)", np.minimum, min, commutative=True)


def _bool_op(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda a, b: bool(fn(a, b)) if isinstance(a, bool) and isinstance(b, bool) else fn(a, b)


AndOp = _op("tile.and", _Binary, ("&",), _BITS, "bitwise and (logical on bool)", "m = (i < n) & (j < n)",
            np.bitwise_and, _bool_op(operator.and_), commutative=True)
OrOp = _op("tile.or", _Binary, ("|",), _BITS, "bitwise or (logical on bool)", "y = a | b",
           np.bitwise_or, _bool_op(operator.or_), commutative=True)
XorOp = _op("tile.xor", _Binary, ("^",), _BITS, "bitwise exclusive or", "y = a ^ b",
            np.bitwise_xor, _bool_op(operator.xor), commutative=True)


def _shift_count(x: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, int]:
    """The count read as unsigned (a negative one is past the width), and the width in bits."""
    width = np.asarray(x).dtype.itemsize * 8
    return np.asarray(n).astype(np.uint32 if width == 32 else np.uint64), width


def _shl(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    n, width = _shift_count(x, n)
    return np.where(n < width, np.left_shift(x, (n & (width - 1)).astype(x.dtype)), np.zeros_like(x))


def _shr(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    n, width = _shift_count(x, n)
    return np.right_shift(x, np.minimum(n, width - 1).astype(x.dtype))  # the width or more: every bit is the sign


ShlOp = _op("tile.shl", _Binary, ("<<",), _INT,
            "shift left; a count of the width (32, 64) or more (unsigned) gives 0", "h = x << 5", _shl,
            operator.lshift)
ShrOp = _op("tile.shr", _Binary, (">>",), _INT,
            "arithmetic shift right; a count of the width (32, 64) or more (unsigned) gives the sign", "q = x >> 1",
            _shr, operator.rshift)


class PowOp(_Binary):
    """``x ** y`` on floats: NaN for a negative base and a non-integer exponent, like torch.
    A constant integer exponent from 1 to 16 is multiplied out by the frontend instead."""

    name = "tile.pow"
    SURFACE = ("**",)
    SUMMARY = "power of floats (x ** y; exp2(y log2 |x|) on the GPU: relative error about |y log2 x| 2**-22)"
    EXAMPLE = "y = x ** 0.75"
    FOLDS = False

    @staticmethod
    def compute(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        # C's pow on every element, in float64, then rounded once (numpy's f32 pow is off by an
        # ulp).  Both operands as arrays: with a scalar exponent numpy takes shortcuts (sqrt for
        # 0.5) whose -0.0 and -inf differ from pow's.
        xs, ys = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(y, np.float64))
        return np.power(xs.reshape(-1), ys.reshape(-1)).reshape(xs.shape)

    @classmethod
    def fold(cls, x: float, y: float) -> int | float | complex:
        return operator.pow(x, y)  # constants follow Python: 2 ** 3 is the integer 8

    def decompose(self, b: Builder) -> Value:
        x, y = self.lhs, self.rhs
        c = constant_value(y)
        if c == 1.0:
            return x
        if c == 2.0:  # exactly what np.power gives: x * x rounded once
            return _same_type(b, MulOp, x, x)
        one, zero = _const(b, x, 1.0), _const(b, x, 0.0)
        if c == 0.5:  # sqrt, but +0 for -0 and +inf for -inf (sqrt gives -0 and NaN)
            r = b.value(SqrtOp, [x], x.type)
            r = _where(b, _cmp(b, "eq", x, zero), zero, r)
            return _where(b, _cmp(b, "eq", x, _const(b, x, -math.inf)), _const(b, x, math.inf), r)
        if c == -1.0:
            return _same_type(b, DivOp, one, x)
        magnitude = b.value(Exp2Op, [_same_type(b, MulOp, y, b.value(Log2Op, [b.value(AbsOp, [x], x.type)],
                                                                             x.type))], x.type)
        # A base with its sign bit set (-0.0 too) keeps it for an odd integer exponent; a finite
        # negative base with a fractional exponent has no real power (NaN); -inf and -0.0 with a
        # fractional one give +inf or +0 (C's pow, numpy's).
        fraction = _cmp(b, "ne", b.value(FloorOp, [y], y.type), y)
        half = _same_type(b, MulOp, y, _const(b, x, 0.5))
        odd = _same_type(b, AndOp, _cmp(b, "eq", b.value(FloorOp, [y], y.type), y),
                         _cmp(b, "ne", b.value(FloorOp, [half], y.type), half))
        negative = _cmp(b, "lt", x, zero)
        signed = _same_type(b, OrOp, negative, _same_type(b, AndOp, _cmp(b, "eq", x, zero),
                                                          _cmp(b, "lt", _same_type(b, DivOp, one, x), zero)))
        r = _where(b, _same_type(b, AndOp, signed, odd), b.value(NegOp, [magnitude], x.type), magnitude)
        finite = _cmp(b, "gt", x, _const(b, x, -math.inf))
        r = _where(b, _same_type(b, AndOp, _same_type(b, AndOp, negative, finite), fraction),
                   _const(b, x, math.nan), r)
        # x ** 0 == 1 and 1 ** y == 1 for every x and y, NaN included; (-1) ** +-inf == 1 (C's pow).
        one_anyway = _same_type(b, OrOp, _cmp(b, "eq", y, zero), _cmp(b, "eq", x, one))
        minus_one_inf = _same_type(b, AndOp, _cmp(b, "eq", x, _const(b, x, -1.0)),
                                   _cmp(b, "eq", b.value(AbsOp, [y], y.type), _const(b, x, math.inf)))
        return _where(b, _same_type(b, OrOp, one_anyway, minus_one_inf), one, r)


register(PowOp)


class FmaOp(ElementwiseOp):
    """``a * b + c`` rounded once."""

    name = "tile.fma"
    OPERANDS = ("a", "b", "c")
    SURFACE = ("fma",)
    SUMMARY = "fused multiply-add, a * b + c rounded once (fma.rn.f32)"
    EXAMPLE = "y = fma(x, w, b)"

    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        # Exact product of two f32 values in float64, one rounding of the sum there, then the
        # caller's rounding to the dtype: differs from a true fma only in double-rounding ties.
        return np.add(np.multiply(a, b, dtype=np.float64), c, dtype=np.float64)

    @classmethod
    def fold(cls, a: float, b: float, c: float) -> float:
        return float(a) * float(b) + float(c)


register(FmaOp)


# ------------------------------------------------------------------ unary
def _rsqrt(x: np.ndarray) -> np.ndarray:
    return np.float32(1) / np.sqrt(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))  # then rounded once


_erf = np.vectorize(math.erf, otypes=[np.float64])  # numpy has no erf; math's is exact to a double


NegOp = _op("tile.neg", _Unary, ("-",), _NUMBERS, "negation", "y = -x", np.negative, operator.neg,
            hint=None)
AbsOp = _op("tile.abs", _Unary, ("abs",), _NUMBERS, "absolute value", "y = abs(x)", np.abs, abs)
NotOp = _op("tile.not", _Unary, ("~", "not"), _BITS, "bitwise not (logical on bool)", "keep = ~masked",
            np.invert, lambda x: (not x) if isinstance(x, bool) else ~x,
            hint="'not'/'~' needs bool or integer operands, got {dtype}")
ExpOp = _op("tile.exp", _Unary, ("exp",), frozenset({"float"}), "e ** x (ex2.approx of x log2 e)",
            "p = exp(s - m)", np.exp, math.exp, folds=False)
Exp2Op = _op("tile.exp2", _Unary, ("exp2",), frozenset({"float"}), "2 ** x (ex2.approx)", "p = exp2(s)",
             np.exp2, lambda x: 2.0 ** x, folds=False)
LogOp = _op("tile.log", _Unary, ("log",), frozenset({"float"}), "natural logarithm (lg2.approx times ln 2)",
            "lse = m + log(l)", np.log, math.log, folds=False)
Log2Op = _op("tile.log2", _Unary, ("log2",), frozenset({"float"}), "base-2 logarithm (lg2.approx)",
             "y = log2(x)", np.log2, math.log2, folds=False)
SqrtOp = _op("tile.sqrt", _Unary, ("sqrt",), frozenset({"float"}), "square root, correctly rounded",
             "y = sqrt(x)", np.sqrt, math.sqrt)
RsqrtOp = _op("tile.rsqrt", _Unary, ("rsqrt",), frozenset({"float"}), "1 / sqrt(x) (rsqrt.approx)",
              "r = rsqrt(var + eps)", _rsqrt, lambda x: 1.0 / math.sqrt(x), folds=False)
TanhOp = _op("tile.tanh", _Unary, ("tanh",), frozenset({"float"}),
             "hyperbolic tangent (tanh.approx, 2**-11 relative)", "y = tanh(x)", np.tanh, math.tanh, folds=False)
SinOp = _op("tile.sin", _Unary, ("sin",), frozenset({"float"}),
            "sine (sin.approx: 2**-20.5 absolute on [-pi, pi], less precise far from 0)", "y = sin(t)",
            np.sin, math.sin, folds=False)
CosOp = _op("tile.cos", _Unary, ("cos",), frozenset({"float"}),
            "cosine (cos.approx: 2**-20.5 absolute on [-pi, pi], less precise far from 0)", "y = cos(t)",
            np.cos, math.cos, folds=False)
FloorOp = _op("tile.floor", _Unary, ("floor",), frozenset({"float"}), "largest integer not above x (a float)",
              "k = floor(x)", np.floor)
CeilOp = _op("tile.ceil", _Unary, ("ceil",), frozenset({"float"}), "smallest integer not below x (a float)",
             "k = ceil(x)", np.ceil)


class SigmoidOp(_Unary):
    name = "tile.sigmoid"
    SURFACE = ("sigmoid",)
    SUMMARY = "logistic function 1 / (1 + exp(-x)) (ex2.approx, and rsqrt.approx squared: 2**-21 relative)"
    EXAMPLE = "g = x * sigmoid(x)"
    FOLDS = False

    compute = staticmethod(_sigmoid)

    def decompose(self, b: Builder) -> Value:
        # 1 / d as rsqrt(d)^2: two instructions where IEEE division takes a dozen and a slow path
        # ptxas calls as a subroutine (SiLU epilogues run it on every accumulator); d >= 1, and
        # d = inf (x below -88) gives 0.
        x = self.x
        e = b.value(ExpOp, [b.value(NegOp, [x], x.type)], x.type)
        r = b.value(RsqrtOp, [_same_type(b, AddOp, _const(b, x, 1.0), e)], x.type)
        return _same_type(b, MulOp, r, r)


register(SigmoidOp)

# erf in two pieces, each a polynomial fitted for it by weighted least squares on Chebyshev nodes:
# below 1 in size x P(x^2) (erf(x)/x is even and smooth there; 2**-22.4 relative in f32), above
# 1 - 2**Q(|x|) with Q ~ log2 erfc on [1, 3.92] (2**-23.5 absolute before ex2.approx's own
# error; |x| is held at 3.92, past which erf rounds to 1).  Eleven multiply-adds, one ex2 and
# no division or square root: a GEMM's GELU epilogue runs it on every accumulator.
_ERF_SMALL = [1.1283791065216064, -0.3761235475540161, 0.11280414462089539, -0.026717770844697952,
              0.00492485286667943, -0.0005660386523231864]
_LOG2_ERFC = [-0.0005102819413878024, -1.6259751319885254, -0.9207648038864136, -0.14865167438983917,
              0.03145850822329521, -0.004240978974848986, 0.0002677289885468781]
_ERF_ONE = 3.92


class ErfOp(_Unary):
    name = "tile.erf"
    SURFACE = ("erf",)
    SUMMARY = "error function (x P(x^2) below 1, 1 - 2^Q(|x|) above: 2**-22 relative, then absolute)"
    EXAMPLE = "g = 0.5 * x * (1.0 + erf(x * 0.7071067811865476))"
    FOLDS = False

    compute = staticmethod(_erf)

    def decompose(self, b: Builder) -> Value:
        x = self.x
        z = b.value(AbsOp, [x], x.type)
        t = _same_type(b, MinimumOp, z, _const(b, x, _ERF_ONE))
        large = _same_type(b, SubOp, _const(b, x, 1.0), b.value(Exp2Op, [_poly(b, t, _LOG2_ERFC)], x.type))
        # x P(u^2) with u = min(|x|, 1): erf below 1 (-0.0 for -0.0), and above it a value of
        # x's sign (P(1) > 0) that signs the large piece, so x is dead after these two ops.
        u = _same_type(b, MinimumOp, t, _const(b, x, 1.0))
        small = _same_type(b, MulOp, x, _poly(b, _same_type(b, MulOp, u, u), _ERF_SMALL))
        signed = _where(b, _cmp(b, "lt", small, _const(b, x, 0.0)), b.value(NegOp, [large], x.type), large)
        return _where(b, _cmp(b, "lt", t, _const(b, x, 1.0)), small, signed)


register(ErfOp)

# log1p(x) = 2 atanh(s), s = x / (2 + x): s^2 <= 1/9 for x in [-1/2, 1], where eight terms of the
# odd series leave under 2**-26; elsewhere log(1 + x) is at least log 2 in size.
_ATANH_SERIES = [2.0 / (2 * n + 1) for n in range(8)]


class Log1pOp(_Unary):
    name = "tile.log1p"
    SURFACE = ("log1p",)
    SUMMARY = "log(1 + x), precise near 0 (a series on [-1/2, 1], lg2.approx elsewhere)"
    EXAMPLE = "y = log1p(exp(-abs(x)))"
    FOLDS = False

    compute = staticmethod(np.log1p)

    def decompose(self, b: Builder) -> Value:
        x = self.x
        s = _same_type(b, DivOp, x, _same_type(b, AddOp, _const(b, x, 2.0), x))
        near = _same_type(b, MulOp, s, _poly(b, _same_type(b, MulOp, s, s), _ATANH_SERIES))
        far = b.value(LogOp, [_same_type(b, AddOp, _const(b, x, 1.0), x)], x.type)
        inside = _same_type(b, AndOp, _cmp(b, "ge", x, _const(b, x, -0.5)), _cmp(b, "le", x, _const(b, x, 1.0)))
        return _where(b, inside, near, far)


register(Log1pOp)

# expm1(x) = x + x^2/2! + ... for |x| < 1/2 (ten terms leave under 2**-32); exp(x) - 1 beyond.
_EXPM1_SERIES = [1.0 / math.factorial(n + 1) for n in range(10)]


class Expm1Op(_Unary):
    name = "tile.expm1"
    SURFACE = ("expm1",)
    SUMMARY = "exp(x) - 1, precise near 0 (a series below 1/2 in size, ex2.approx beyond)"
    EXAMPLE = "y = expm1(x)"
    FOLDS = False

    compute = staticmethod(np.expm1)

    def decompose(self, b: Builder) -> Value:
        x = self.x
        near = _same_type(b, MulOp, x, _poly(b, x, _EXPM1_SERIES))
        far = _same_type(b, SubOp, b.value(ExpOp, [x], x.type), _const(b, x, 1.0))
        return _where(b, _cmp(b, "lt", b.value(AbsOp, [x], x.type), _const(b, x, 0.5)), near, far)


register(Expm1Op)


# ------------------------------------------------------------- the tables
#: Every elementwise op class, in declaration order (the order they were registered).
ELEMENTWISE_OPS: tuple[type[ElementwiseOp], ...] = tuple(
    c for c in OPS.values() if isinstance(c, type) and issubclass(c, ElementwiseOp))


def _surface(pick: Callable[[type[ElementwiseOp], str], bool]) -> dict[str, type[ElementwiseOp]]:
    return {s: c for c in ELEMENTWISE_OPS for s in c.SURFACE if pick(c, s)}


#: Function names (``exp(x)``, ``fma(a, b, c)``; unary ones are methods too: ``x.exp()``).
FUNCTIONS = _surface(lambda c, s: s.isidentifier() and s != "not")
#: Operators by their symbol, by arity.
BINARY_OPERATORS = _surface(lambda c, s: not s.isidentifier() and len(c.OPERANDS) == 2)
UNARY_OPERATORS = _surface(lambda c, s: (not s.isidentifier() or s == "not") and len(c.OPERANDS) == 1)

#: What the ``tile`` dialect re-exports: the op classes and tables here.
__all__ = ["ConstantOp", "constant_value", "CmpOp", "CMP_PREDICATES", "SelectOp", "ElementwiseOp", "ELEMENTWISE_OPS",
           "FUNCTIONS", "BINARY_OPERATORS", "UNARY_OPERATORS", "kind_of",
           *(n for n, v in list(globals().items()) if v in ELEMENTWISE_OPS)]
