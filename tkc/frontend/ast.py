"""The syntax tree of the tile language: what the Lark grammar produces.

Every node carries the ``Loc`` of its first token, so that every later
diagnostic can point at the source.  The tree is a small Python subset; it
holds no types and no meaning -- ``lower.py`` gives it both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tkc.errors import Loc


@dataclass
class Node:
    loc: Loc = field(repr=False, compare=False, kw_only=True)


# ---------------------------------------------------------------- expressions
@dataclass
class Name(Node):
    id: str


@dataclass
class Num(Node):
    value: int | float


@dataclass
class Bool(Node):
    value: bool


@dataclass
class Str(Node):
    value: str


@dataclass
class NoneLit(Node):
    pass


@dataclass
class BinOp(Node):
    op: str  # '+', '-', '*', '/', '//', '%', '@', '**'
    left: Expr
    right: Expr


@dataclass
class UnaryOp(Node):
    op: str  # '-', '+', 'not', '~'
    operand: Expr


@dataclass
class Compare(Node):
    """A single comparison; chains (a < b < c) are rejected by the parser."""

    op: str  # '<', '<=', '>', '>=', '==', '!='
    left: Expr
    right: Expr


@dataclass
class BoolOp(Node):
    op: str  # 'and', 'or'
    left: Expr
    right: Expr


@dataclass
class IfExp(Node):
    cond: Expr
    then: Expr
    orelse: Expr


@dataclass
class Keyword(Node):
    name: str
    value: Expr


@dataclass
class Call(Node):
    func: Expr
    args: list[Expr]
    keywords: list[Keyword]


@dataclass
class Attribute(Node):
    value: Expr
    attr: str


@dataclass
class Slice(Node):
    """``lower:upper`` or ``lower:upper:step`` inside a subscript; any part may be None."""

    lower: Expr | None
    upper: Expr | None
    step: Expr | None = None


@dataclass
class Subscript(Node):
    value: Expr
    index: list[Expr]  # each an Expr, a Slice, or NoneLit (new axis)


@dataclass
class Tuple(Node):
    elts: list[Expr]


@dataclass
class List(Node):
    elts: list[Expr]


Expr = (
    Name | Num | Bool | Str | NoneLit | BinOp | UnaryOp | Compare | BoolOp | IfExp | Call
    | Attribute | Slice | Subscript | Tuple | List
)


# ----------------------------------------------------------------- statements
@dataclass
class Assign(Node):
    """``a = e``, ``a, b = e`` (targets is a Tuple), or ``t[...] = e`` (a store)."""

    target: Expr
    value: Expr


@dataclass
class AugAssign(Node):
    op: str  # '+', '-', '*', '/', ...
    target: Expr
    value: Expr


@dataclass
class AnnAssign(Node):
    """``x: f32 = e`` -- accepted so users may annotate locals."""

    target: Name
    annotation: Expr
    value: Expr | None


@dataclass
class ExprStmt(Node):
    value: Expr


@dataclass
class Return(Node):
    value: Expr | None


@dataclass
class Pass(Node):
    pass


@dataclass
class Break(Node):
    pass


@dataclass
class Continue(Node):
    pass


@dataclass
class For(Node):
    target: Expr  # a Name (tuples are rejected later with a location)
    iter: Expr
    body: list[Stmt]


@dataclass
class While(Node):
    """Parsed only so the lowering can reject it with a clear message."""

    cond: Expr
    body: list[Stmt]


@dataclass
class If(Node):
    cond: Expr
    body: list[Stmt]
    orelse: list[Stmt]  # an elif chain nests an If here


@dataclass
class Param(Node):
    name: str
    annotation: Expr | None
    default: Expr | None


@dataclass
class FunctionDef(Node):
    name: str
    params: list[Param]
    body: list[Stmt]
    decorators: list[Expr]
    returns: Expr | None = None


@dataclass
class Import(Node):
    """``import x`` / ``from x import y``: ignored by the lowering (a ``@tkc.kernel``
    module may import tkc) but kept so a located error can be given inside a kernel."""

    text: str


Stmt = (
    Assign | AugAssign | AnnAssign | ExprStmt | Return | Pass | Break | Continue | For | While | If
    | FunctionDef | Import
)


@dataclass
class Module(Node):
    body: list[Stmt]
    file: str
    source: str
