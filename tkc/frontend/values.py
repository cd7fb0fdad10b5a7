"""What a name or expression means while a kernel is being lowered.

The frontend evaluates kernel source abstractly: every expression becomes one
of these.  Compile-time constants stay Python numbers (``Const``) until an op
needs them in the IR; runtime scalars and tiles are IR values (``Dyn``);
tensors, dtypes, helpers and builtins are names with no IR value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tkc.dtypes import DType
from tkc.frontend import ast
from tkc.ir.core import Value
from tkc.ir.types import TensorType


REQUIRED = object()  # marks a builtin's or helper's argument that has no default


@dataclass(frozen=True)
class Const:
    """A compile-time int, float or bool."""

    value: int | float | bool


@dataclass(frozen=True)
class Dyn:
    """A runtime scalar or tile: an SSA value of the IR being built."""

    value: Value

    @property
    def type(self):
        return self.value.type


@dataclass(frozen=True)
class Tensor:
    """A global tensor parameter."""

    value: Value
    name: str

    @property
    def type(self) -> TensorType:
        return self.value.type


@dataclass(frozen=True)
class View:
    """``tensor[...]`` before it is known whether it is read or written."""

    tensor: Tensor
    index: list[ast.Expr]
    node: ast.Subscript
    # where the index expressions are evaluated: a slice passed to a helper is
    # loaded inside it, but its names are the caller's (None: the current scope)
    scope: Scope | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Text:
    """A string literal given as a keyword argument (``sem="acquire"``): the only place the
    language takes one."""

    value: str


@dataclass(frozen=True)
class DTypeName:
    dtype: DType


@dataclass(frozen=True)
class Function:
    """A helper function, inlined at each call; ``closure`` is the scope it was
    defined in (None for a module-level helper)."""

    node: ast.FunctionDef
    closure: Scope | None


@dataclass(frozen=True)
class Builtin:
    name: str


@dataclass(frozen=True)
class Method:
    """``obj.name`` waiting to be called, e.g. ``x.to`` or ``x.sum``."""

    obj: object
    name: str


@dataclass(frozen=True)
class TupleV:
    items: tuple


NONE = TupleV(())  # what a helper without 'return' and a call that returns nothing evaluate to


@dataclass(frozen=True)
class NoScale:
    """``None`` passed to a builtin that takes it: ``dot_scaled``'s operand without scales."""


NO_SCALE = NoScale()


Meaning = Const | Dyn | Tensor | View | DTypeName | Function | Builtin | Method | TupleV


@dataclass
class Scope:
    """Names bound in a function body; lookups fall back to ``parent``."""

    names: dict[str, object] = field(default_factory=dict)
    parent: Scope | None = None

    def lookup(self, name: str) -> object | None:
        s: Scope | None = self
        while s is not None:
            if name in s.names:
                return s.names[name]
            s = s.parent
        return None

    def all_names(self) -> set[str]:
        out: set[str] = set()
        s: Scope | None = self
        while s is not None:
            out |= set(s.names)
            s = s.parent
        return out


@dataclass(frozen=True)
class Affine:
    """``const + sum(coeff * atom)`` over i32 SSA values: enough to prove that
    ``(i+1)*BM - i*BM`` is the constant ``BM`` when sizing a slice."""

    terms: tuple[tuple[Value, int], ...] = ()
    const: int = 0

    @staticmethod
    def atom(v: Value) -> Affine:
        return Affine(((v, 1),), 0)

    def _combine(self, other: Affine, sign: int) -> Affine:
        d: dict[Value, int] = dict(self.terms)
        for v, c in other.terms:
            d[v] = d.get(v, 0) + sign * c
        return Affine(tuple((v, c) for v, c in d.items() if c), self.const + sign * other.const)

    def __add__(self, other: Affine) -> Affine:
        return self._combine(other, 1)

    def __sub__(self, other: Affine) -> Affine:
        return self._combine(other, -1)

    def scale(self, k: int) -> Affine:
        return Affine(tuple((v, c * k) for v, c in self.terms if c * k), self.const * k)

    @property
    def is_const(self) -> bool:
        return not self.terms
