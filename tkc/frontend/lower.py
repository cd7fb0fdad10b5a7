"""Lowers the syntax tree of a kernel to tile IR.

The kernel body is evaluated abstractly, statement by statement: constants
fold in Python, helpers inline at each call, ``if`` on a constant picks a
branch, and runtime values become SSA values built with ``emit.Emitter``
(which owns every typing rule).  Loop-carried and branch-merged variables are
found from the names a body assigns.  Every diagnostic is a located TkcError.
"""

from __future__ import annotations

import difflib

import numpy as np

from tkc import dtypes
from tkc.errors import (
    Loc, TkcNameError, TkcSyntaxError, TkcTypeError, TkcUnsupportedError, TkcUsageError, kernel_choice_error,
)
from tkc.frontend import ast
from tkc.frontend.builtins import BUILTIN_IMPLS, MATH_FUNCS, NONE_ARGUMENTS
from tkc.frontend.emit import CMP_PREDS, Emitter, check_const, check_tile_dims, const_dtype
from tkc.frontend.values import (
    NO_SCALE, NONE, REQUIRED, Builtin, Const, DTypeName, Dyn, Function, Method, Scope, Tensor, Text, TupleV, View,
)
from tkc.ir.builder import Builder
from tkc.pins import PINS, check_kernel_pins, check_pins
from tkc.ir.core import Block, Module, OpResult, Region, Value, uses
from tkc.ir.dialects import tile as T
from tkc.ir.types import ScalarType, TensorType, TileType, Type


BUILTIN_FUNCS = ("grid", "range", "static_range", "wait", *BUILTIN_IMPLS)
REDUCTIONS = ("sum", "mean", "max", "min")
SCANS = {"cumsum": "sum", "cumprod": "prod"}
ARG_REDUCTIONS = ("argmax", "argmin")
#: What ``x.name(...)`` may call on a tile (or a tensor slice, loaded first).
METHODS = ("to", "reshape", *REDUCTIONS, *ARG_REDUCTIONS, *SCANS, *MATH_FUNCS)
CONST_ANNOTATIONS = ("const", "constexpr")


def is_const_annotation(a: ast.Expr | None) -> bool:
    """Whether a parameter's annotation makes it a compile-time constant (``const``,
    ``tkc.constexpr``...), which a launch does not pass."""
    if isinstance(a, ast.Name):
        return a.id in CONST_ANNOTATIONS
    return isinstance(a, ast.Attribute) and a.attr in CONST_ANNOTATIONS
NAMESPACES = ("tkc", "tk")  # ``tkc.exp(x)`` reads as ``exp(x)`` in @tkc.kernel code
DTYPE_NAMES = ("f32", "f16", "bf16", "f8e4m3", "f8e5m2", "f8e8m0", "f4e2m1x2", "i32", "i64", "bool")
#: torch's and numpy's names for the dtypes, for what a user from there writes first.
_DTYPE_ALIASES = {"float32": "f32", "float": "f32", "float16": "f16", "half": "f16", "bfloat16": "bf16",
                  "int32": "i32", "int": "i32", "int64": "i64",
                  "long": "i64", "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2",
                  "float8_e8m0fnu": "f8e8m0", "float4_e2m1fn_x2": "f4e2m1x2"}


#: ``wait(flags[i] OP v)``: the comparison's spelling -> ``tile.wait``'s predicate.


def _unknown_dtype(name: str, loc: Loc) -> TkcTypeError:
    near = difflib.get_close_matches(name, DTYPE_NAMES, n=1)
    hint = f"did you mean '{near[0]}'? " if near else ""
    return TkcTypeError(f"unknown dtype '{name}'; {hint}the dtypes are {', '.join(DTYPE_NAMES)}", loc)


class _LoopLocal:
    """Marks a name assigned only inside a loop or one branch: using it after
    is an error that says why (it has no SSA value there)."""

    def __init__(self, name: str, where: str, loc: Loc):
        self.name, self.where, self.loc = name, where, loc


def _dim_names(annotation: ast.Expr | None) -> list[ast.Name]:
    """The symbolic dims of a tensor annotation (``M`` and ``K`` of ``bf16[M, K]``)."""
    if not isinstance(annotation, ast.Subscript):
        return []
    return [i for i in annotation.index if isinstance(i, ast.Name)]


def _is_input(v: Value) -> bool:
    """Whether ``v`` is a runtime input of the program rather than computed from others: a
    parameter, a loop index, program_id(0), a tensor's dim.  A slice that starts at inputs alone
    and has no constant extent surely spans a runtime one (x[0:i], x[i:j])."""
    return not isinstance(v, OpResult) or not any(isinstance(o, OpResult) for o in v.owner.operands)


def _is_kernel_decorator(d: ast.Expr) -> bool:
    if isinstance(d, ast.Call):
        d = d.func
    if isinstance(d, ast.Name):
        return d.id == "kernel"
    return isinstance(d, ast.Attribute) and d.attr == "kernel"


def _no_decorators(f: ast.FunctionDef) -> None:
    """A helper function takes no decorator: nothing would apply it (``@kernel`` marks kernels)."""
    if f.decorators:
        d = f.decorators[0]
        what = "@kernel marks a kernel, which is not nested in another" if _is_kernel_decorator(d) else \
            "helpers are inlined where they are called, so a decorator would be ignored: remove it"
        raise TkcUnsupportedError(f"a helper function takes no decorator; {what}", d.loc)


def _assigned_names(stmts: list[ast.Stmt]) -> list[str]:
    """Names a block of statements may bind, in order of first appearance."""
    out: list[str] = []

    def target(t: ast.Expr) -> None:
        if isinstance(t, ast.Name) and t.id not in out:
            out.append(t.id)
        elif isinstance(t, ast.Tuple):
            for e in t.elts:
                target(e)

    def visit(ss: list[ast.Stmt]) -> None:
        for s in ss:
            if isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                target(s.target)
            elif isinstance(s, ast.For):
                target(s.target)
                visit(s.body)
            elif isinstance(s, ast.If):
                visit(s.body)
                visit(s.orelse)
            elif isinstance(s, ast.FunctionDef) and s.name not in out:
                out.append(s.name)

    visit(stmts)
    return out


def _last_assignment(stmts: list[ast.Stmt], name: str) -> Loc | None:
    """The last statement in ``stmts`` (nested blocks included) that may assign ``name``."""
    loc = None
    for s in stmts:
        if isinstance(s, (ast.For, ast.If)):
            loc = _last_assignment(s.body + getattr(s, "orelse", []), name) or loc
        elif isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and name in _assigned_names([s]):
            loc = s.loc
    return loc


#: Where a tile of FP4 pairs (f4e2m1x2) may go as it is: the ops that move pairs whole.
_FP4_USES = frozenset({"tile.store", "tile.masked_store", "tile.unpack_fp4", "tile.dot_scaled"})


def _check_fp4_uses(kernel: T.KernelOp) -> None:
    """A pair of FP4 values is not a number: tiles of pairs are stored, unpacked with ``.to()``,
    or multiplied by ``dot_scaled`` (a transpose only as its ``b``), and nothing else."""
    used = uses(kernel)
    for op in kernel.walk():
        if op.name in ("tile.load", "tile.gather") and op.results and op.result.type.dtype.is_packed \
                and op.attributes.get("other") not in (None, 0, 0.0):
            raise TkcTypeError("a tile of f4e2m1x2 pairs reads 0 past the tensor: other= cannot fill a pair (fill "
                               "after unpacking, with where)", op.loc)
        packed = [v for v in op.operands if isinstance(v.type, (TileType, ScalarType)) and v.type.dtype.is_packed]
        if not packed:
            continue
        if op.name == T.TransposeOp.name and all(u.name == T.DotScaledOp.name and u.b is op.result
                                                   for u in used.get(op.result, [])):
            continue
        if op.name in _FP4_USES and not (op.name == "tile.masked_store" and op.mask in packed):
            continue
        raise TkcTypeError("a tile of f4e2m1x2 holds pairs of FP4 values, which have no arithmetic: store it, "
                           "multiply it with dot_scaled, or unpack it with .to(f32) first", op.loc)


class KernelLowering:
    """Lowers one kernel function to a ``tile.kernel`` op."""

    def __init__(self, fn: ast.FunctionDef, helpers: dict[str, Function], consts: dict[str, object],
                 pins: dict[str, object] | None = None):
        self.fn = fn
        self.helpers = helpers
        self.consts_in = consts
        self.pins_in = pins or {}  # pins passed that the kernel does not declare
        self.b = Builder()
        self.em = Emitter(self.b)
        self.scope = Scope()
        self.call_stack: list[str] = []
        self.grid_seen = False
        self.python_function = False  # an @tkc.kernel function (its Python names are not seen)
        self.choices: dict[str, list[int]] = {}  # constants declared choose(...) and not given

    # ================================================================ entry
    def lower(self) -> T.KernelOp:
        fn = self.fn
        consts, params = self._signature()
        block = Block()
        for p, t in params:
            block.add_arg(t, p.name)
        attributes: dict[str, object] = {"sym_name": fn.name, "consts": dict(consts)}
        if self.choices:  # constants tkc.schedule may pick at launch, with their candidates
            attributes["choices"] = dict(self.choices)
        kernel = T.KernelOp([], [], attributes, [Region([block])], fn.loc)
        self.kernel_consts = {**self.pins_in, **self.consts_in, **consts}  # declared constants and passed pins
        self.b.block = block
        self.b.loc = fn.loc
        for name, v in consts.items():
            self.scope.names[name] = Const(v)
        dims: dict[str, object] = {}
        for (p, t), arg in zip(params, block.args):
            if isinstance(t, TensorType):
                self.scope.names[p.name] = Tensor(arg, p.name)
                for axis, d in enumerate(t.dims):
                    if isinstance(d, str) and d not in dims:
                        dims[d] = Dyn(self.b.value(T.DimOp, [arg], T.I32, {"axis": axis}, loc=p.loc))
                        dims[d].value.name_hint = d
            else:
                self.scope.names[p.name] = Dyn(arg)
        for d, v in dims.items():
            if d in self.scope.names:
                where = next((p.loc for p in fn.params if p.name == d), fn.loc)  # at the parameter
                raise TkcTypeError(f"'{d}' names both a tensor dim and a parameter", where)
            self.scope.names[d] = v
        body = fn.body
        if body and isinstance(body[0], ast.ExprStmt) and isinstance(body[0].value, ast.Str):
            body = body[1:]  # docstring
        self.stmts(body, top=True)
        self.b.create(T.ReturnOp, loc=fn.loc)
        _check_fp4_uses(kernel)
        return kernel

    def _signature(self) -> tuple[dict[str, object], list[tuple[ast.Param, Type]]]:
        fn = self.fn
        consts: dict[str, object] = {}
        seen: set[str] = set()
        before = Scope()  # a constant's default may use the constants declared before it
        for p in fn.params:
            if p.name in seen:
                raise TkcTypeError(f"duplicate parameter '{p.name}'", p.loc)
            seen.add(p.name)
            if p.annotation is None:
                raise TkcTypeError(f"parameter '{p.name}' needs a type: a tensor like bf16[M, K], "
                                   f"a scalar dtype like f32, or const", p.loc)
            if is_const_annotation(p.annotation):
                if p.name in self.consts_in:
                    v = self._check_kind_of_default(p, self.consts_in[p.name], before)
                elif (options := self._choices(p, before)) is not None:
                    v = options[0]  # where no launch picks (tkc compile, the interpreter)
                    self.choices[p.name] = options
                elif p.default is not None:
                    d = self.expr(p.default, before)
                    if not isinstance(d, Const):
                        raise TkcTypeError(f"the default of constant '{p.name}' must be a number or "
                                           f"bool", p.default.loc)
                    v = d.value
                else:
                    raise TkcTypeError(f"constant '{p.name}' has no value; give it a default, or its value at "
                                       f"the call ({p.name}=... from Python, -D {p.name}=... with tkc)", p.loc)
                if isinstance(v, np.generic) and isinstance(v.item(), (int, float, bool)):
                    v = v.item()  # BM=np.int64(64): a shape computed with numpy
                if not isinstance(v, (int, float, bool)):
                    raise TkcTypeError(f"constant '{p.name}' must be an int, float or bool, got {v!r}",
                                       p.loc)
                consts[p.name] = v
                before.names[p.name] = Const(v)
        params: list[tuple[ast.Param, Type]] = []
        for p in fn.params:
            if p.name in consts:
                continue
            if p.default is not None:
                raise TkcTypeError(f"runtime parameter '{p.name}' cannot have a default; "
                                   f"declare it '{p.name}: const = ...' to make it a constant", p.default.loc)
            params.append((p, self._param_type(p, consts)))
        return consts, params

    def _choices(self, p: ast.Param, before: Scope) -> list[int] | None:
        """The candidates of a constant declared ``BM: const = choose(128, 192)`` (tkc.schedule
        picks one per launch), also as the branch a conditional default takes (``BN: const =
        choose(64, 80) if D > 128 else 128``), or None for any other default."""
        d = p.default
        while isinstance(d, ast.IfExp):
            cond = self.expr(d.cond, before)
            if not isinstance(cond, Const):
                return None  # evaluated as a default, which says what is wrong
            d = d.then if cond.value else d.orelse
        if not (isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "choose"):
            return None
        values = [self.expr(a, before) for a in d.args]
        if d.keywords or len(values) < 2 or not all(
                isinstance(v, Const) and isinstance(v.value, int) and not isinstance(v.value, bool) for v in values):
            raise TkcTypeError(f"choose() lists the sizes tkc may pick for constant '{p.name}': two or more "
                               f"integers, like choose(128, 192)", d.loc)
        options = [int(v.value) for v in values]
        if len(set(options)) != len(options):
            raise TkcTypeError(f"choose() lists {p.name}'s candidates once each", d.loc)
        return options

    def _check_kind_of_default(self, p: ast.Param, value: object, before: Scope) -> object:
        """``value`` for a constant: one whose default is true/false takes true or false, and one
        whose default is a number takes a number (``causal=2`` would otherwise read as true); one
        whose default is an integer takes an integer (``BN=128.0`` is 128; ``BN=128.5`` would
        otherwise surface as a float mixed into the grid's integer arithmetic, far from here)."""
        if p.default is None:
            return value
        options = self._choices(p, before)
        d = Const(options[0]) if options is not None else self.expr(p.default, before)
        if not isinstance(d, Const):
            return value
        whole = type(d.value) is int and isinstance(value, float) and value.is_integer()
        fraction = type(d.value) is int and isinstance(value, float) and not whole
        if isinstance(d.value, bool) == isinstance(value, bool) and not fraction:
            return int(value) if whole else value
        kind = "true or false" if isinstance(d.value, bool) else "an integer" if fraction else "a number"
        shown = str(value).lower() if isinstance(value, bool) else value
        raise TkcUsageError(f"{p.name}={shown}: constant '{p.name}' of kernel '{self.fn.name}' takes {kind} "
                            f"(its default is {str(d.value).lower() if isinstance(d.value, bool) else d.value})",
                            p.loc)

    def _param_type(self, p: ast.Param, consts: dict[str, object]) -> Type:
        a = p.annotation
        if isinstance(a, ast.BinOp) and a.op == "@":  # x: bf16[M, K] @ ranks
            if not (isinstance(a.right, ast.Name) and a.right.id == "ranks"):
                raise TkcTypeError("a tensor on every rank is written like bf16[M, K] @ ranks", a.right.loc)
            if not isinstance(a.left, ast.Subscript):
                raise TkcTypeError(f"only tensors exist on every rank: '{p.name}' needs dims, like "
                                   f"bf16[M, K] @ ranks", a.loc)
            t = self._param_type(ast.Param(p.name, a.left, None, loc=p.loc), consts)
            return TensorType(t.dtype, t.dims, ranks=True)
        if isinstance(a, ast.Subscript):
            dt = self._dtype_of(a.value)
            if dt is None and isinstance(a.value, ast.Name):
                raise _unknown_dtype(a.value.id, a.value.loc)
            if dt is None:
                raise TkcTypeError("a tensor type is a dtype with dims, like bf16[M, K]", a.loc)
            dims: list[str | int] = []
            for d in a.index:
                if isinstance(d, ast.Num) and isinstance(d.value, int) and d.value > 0:
                    dims.append(d.value)
                elif isinstance(d, ast.Name) and d.id in consts:
                    v = consts[d.id]
                    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                        raise TkcTypeError(f"dim '{d.id}' is the constant {v!r}, not a positive int", d.loc)
                    dims.append(v)
                elif isinstance(d, ast.Name):
                    dims.append(d.id)
                else:
                    raise TkcTypeError("tensor dims are names (runtime sizes) or positive integers",
                                       d.loc)
            return TensorType(dt, tuple(dims))
        dt = self._dtype_of(a)
        if dt is None and isinstance(a, ast.Name):
            raise _unknown_dtype(a.id, a.loc)
        if dt is None:
            raise TkcTypeError(f"cannot read the type of parameter '{p.name}'; use a tensor like "
                               f"bf16[M, K], a scalar dtype like f32, or const", a.loc)
        return ScalarType(dt)

    @staticmethod
    def _dtype_of(e: ast.Expr) -> dtypes.DType | None:
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id in NAMESPACES:
            return dtypes.from_name(e.attr)
        if isinstance(e, ast.Name):
            return dtypes.from_name(e.id)
        return None

    # =========================================================== statements
    def stmts(self, stmts: list[ast.Stmt], top: bool = False) -> None:
        for i, s in enumerate(stmts):
            self.b.loc = s.loc
            if isinstance(s, ast.ExprStmt) and self._is_grid_call(s.value):
                if self.grid_seen:
                    raise TkcUnsupportedError("the kernel already has a grid; give grid(...) once, as the "
                                              "first statement", s.loc)
                if not top or i != 0 or self.call_stack:
                    raise TkcUnsupportedError("grid(...) must be the first statement of the kernel", s.loc)
                self._grid(s.value)
                continue
            self.stmt(s)

    def _is_grid_call(self, e: ast.Expr) -> bool:
        return isinstance(e, ast.Call) and isinstance(self._lookup_quiet(e.func), Builtin) and \
            self._lookup_quiet(e.func).name == "grid"

    def stmt(self, s: ast.Stmt) -> None:
        if isinstance(s, ast.Assign):
            self.assign(s.target, self.expr(s.value), s.value)
        elif isinstance(s, ast.AugAssign):
            self._aug_assign(s)
        elif isinstance(s, ast.AnnAssign):
            if s.value is None:
                raise TkcUnsupportedError("a declaration needs a value: x: f32 = ...", s.loc)
            v = self.expr(s.value)
            dt = self._dtype_of(s.annotation)
            if dt is None and isinstance(s.annotation, ast.Name):  # a typo must not pass unchecked
                raise _unknown_dtype(s.annotation.id, s.annotation.loc)
            if dt is not None and isinstance(v, Const):
                check_const(v, dt, s.value.loc)
            if dt is not None and isinstance(v, Dyn) and v.type.dtype != dt:
                raise TkcTypeError(f"'{s.target.id}' is annotated {dt.name} but the value is {v.type}",
                                   s.value.loc)
            self.assign(s.target, v, s.value)
        elif isinstance(s, ast.ExprStmt):
            if isinstance(s.value, ast.Str):
                return  # a string statement is a comment
            self.expr(s.value)
        elif isinstance(s, ast.For):
            self._for(s)
        elif isinstance(s, ast.If):
            self._if(s)
        elif isinstance(s, ast.FunctionDef):
            _no_decorators(s)
            self.scope.names[s.name] = Function(s, self.scope)
        elif isinstance(s, ast.Pass):
            pass
        elif isinstance(s, ast.Return):
            raise TkcUnsupportedError(
                "'return' is allowed only as the last statement of a helper function"
                if self.call_stack else "a kernel returns nothing and cannot stop early: store results into a "
                                        "tensor, and put what should not run under an if",
                s.loc)
        elif isinstance(s, ast.While):
            raise TkcUnsupportedError("'while' loops are not supported; use 'for ... in range(...)'", s.loc)
        elif isinstance(s, (ast.Break, ast.Continue)):
            word = "break" if isinstance(s, ast.Break) else "continue"
            raise TkcUnsupportedError(f"'{word}' is not supported in tile kernels", s.loc)
        elif isinstance(s, ast.Import):
            raise TkcUnsupportedError("imports belong at the top of the file, not inside a kernel", s.loc)
        else:  # pragma: no cover - the parser produces no other statements
            raise TkcUnsupportedError(f"unsupported statement {type(s).__name__}", s.loc)

    def assign(self, target: ast.Expr, v: object, value_node: ast.Node) -> None:
        if isinstance(target, ast.Name):
            if isinstance(v, View):
                v = self.load(v, None)
            bound = self._lookup_quiet(target)
            if isinstance(bound, Tensor) and (not isinstance(v, Tensor) or bound.name == target.id and v is not bound):
                # Rebinding the name (a parameter's, even to another tensor) would send the
                # stores after it elsewhere and leave the tensor unwritten, without a word.
                raise TkcTypeError(f"'{target.id}' is a tensor: store into it with {target.id}[...] = ..., "
                                   f"or give the new value another name", target.loc)
            if isinstance(v, Dyn) and v.value.name_hint is None:
                v.value.name_hint = target.id
            self.scope.names[target.id] = v
        elif isinstance(target, ast.Tuple):
            if not isinstance(v, TupleV):
                raise TkcTypeError(f"cannot unpack {self._kind(v)} into {len(target.elts)} names", target.loc)
            if len(v.items) != len(target.elts):
                raise TkcTypeError(f"cannot unpack {len(v.items)} values into {len(target.elts)} names",
                                   target.loc)
            for t, item in zip(target.elts, v.items):
                self.assign(t, item, value_node)
        elif isinstance(target, ast.Subscript):
            base = self.expr(target.value)
            if isinstance(base, View):  # c[0:64, 0:64][0:16, :] = ...
                raise TkcUnsupportedError("a slice of a slice cannot be assigned: index the tensor once "
                                          "(c[r:r+16, 0:64] = ...)", target.loc)
            if not isinstance(base, Tensor):
                raise TkcUnsupportedError(f"only tensor slices can be assigned; this is {self._kind(base)}",
                                          target.loc)
            if isinstance(v, View):
                v = self.load(v, None)
            self.store(View(base, target.index, target), v, value_node.loc)
        else:
            raise TkcUnsupportedError("cannot assign to this expression", target.loc)

    def _aug_assign(self, s: ast.AugAssign) -> None:
        old = self.expr(s.target)
        rhs = self.expr(s.value)
        new = self.binop(s.op, self.value_of(old, s.target), self.value_of(rhs, s.value), s.loc)
        if isinstance(s.target, ast.Name) and isinstance(old, Dyn) and isinstance(new, Dyn) \
                and new.type != old.type:
            raise TkcTypeError(f"'{s.target.id} {s.op}= ...' changes its type from {old.type} to "
                               f"{new.type}", s.loc)
        self.assign(s.target, new, s.value)

    # --------------------------------------------------------------- for
    def _for(self, s: ast.For) -> None:
        if not isinstance(s.target, ast.Name):
            raise TkcUnsupportedError("a for loop binds one name", s.target.loc)
        it = s.iter
        kind = self._lookup_quiet(it.func) if isinstance(it, ast.Call) else None
        if not isinstance(kind, Builtin) or kind.name not in ("range", "static_range"):
            raise TkcUnsupportedError("for loops iterate over range(...) or static_range(...)", it.loc)
        if it.keywords:
            raise TkcTypeError(f"{kind.name}() takes no keyword arguments", it.keywords[0].loc)
        if not 1 <= len(it.args) <= 3:
            raise TkcTypeError(f"{kind.name}() takes 1 to 3 arguments, got {len(it.args)}", it.loc)
        bounds = [self._element(self.expr(a)) for a in it.args]
        for a, n in zip(bounds, it.args):
            if not self._is_index(a):
                raise TkcTypeError(f"range bounds are i32 or i64 scalars, got {self._kind(a)}", n.loc)
        if len(bounds) == 1:
            bounds = [Const(0), bounds[0], Const(1)]
        elif len(bounds) == 2:
            bounds.append(Const(1))
        lb, ub, step = bounds
        if not isinstance(step, Const) or step.value <= 0:
            raise TkcTypeError("the range step must be a positive constant", it.args[-1].loc)
        if kind.name == "static_range":
            self._static_for(s, lb, ub, step)
            return
        local = self.scope.names
        carried = [n for n in _assigned_names(s.body)
                   if n != s.target.id and isinstance(local.get(n), (Dyn, Const))]
        for n in _assigned_names(s.body):
            if n in local and n not in carried and n != s.target.id and \
                    not isinstance(local[n], _LoopLocal):
                raise TkcTypeError(f"'{n}' is {self._kind(local[n])}; it cannot be reassigned in a loop",
                                   s.loc)
        inits = [self.dyn(local[n], s) for n in carried]
        types = [v.type for v in inits]
        block = Block([T.I32, *types], [s.target.id, *carried])
        before = dict(local)
        with self.b.at_end(block):
            local[s.target.id] = Dyn(block.args[0])
            for n, a in zip(carried, block.args[1:]):
                local[n] = Dyn(a)
            self.stmts(s.body)
            self.b.loc = s.loc
            yields = [self._coerce_carried(n, local.get(n), t, s, s.body) for n, t in zip(carried, types)]
            self.b.create(T.YieldOp, yields, loc=s.loc)
        operands = [self.em.index(self.value_of(x, s), s.loc).value for x in (lb, ub, step)]
        op = self.b.create(T.ForOp, operands + [v.value for v in inits], types,
                           regions=[Region([block])], loc=s.loc)
        self._restore_after_region(before, _assigned_names(s.body) + [s.target.id], "the loop", s.loc)
        for n, r in zip(carried, op.results):
            r.name_hint = n
            local[n] = Dyn(r)

    def _static_for(self, s: ast.For, lb: object, ub: object, step: Const) -> None:
        if not isinstance(lb, Const) or not isinstance(ub, Const):
            raise TkcTypeError("static_range() bounds must be compile-time constants", s.iter.loc)
        trips = range(lb.value, ub.value, step.value)
        if len(trips) > 256:
            raise TkcTypeError(f"static_range() would unroll {len(trips)} times (at most 256)", s.iter.loc)
        for i in trips:
            self.scope.names[s.target.id] = Const(i)
            self.stmts(s.body)

    def _coerce_carried(self, name: str, v: object, t: Type, s: ast.Node, body: list[ast.Stmt] | None = None):
        loc = (_last_assignment(body, name) if body else None) or s.loc  # a loop body: where it changed
        if isinstance(v, View):
            v = self.load(v, None)
        if isinstance(v, Const):
            v = self._const_as(v, t, loc)
        if not isinstance(v, Dyn):
            raise TkcTypeError(f"'{name}' must stay a value across iterations", loc)
        if v.type != t:
            raise TkcTypeError(f"loop-carried '{name}' is {t} before the loop but {v.type} after an "
                               f"iteration; give it its final type before the loop", loc)
        return v.value

    def _const_as(self, c: Const, t: Type, loc: Loc) -> Dyn:
        if isinstance(t, TileType):
            check_const(c, t.dtype, loc)
            return self.em.constant(c.value, t, loc)
        return self.em.materialize(c, t, loc)

    def _restore_after_region(self, before: dict, assigned: list[str], where: str, loc: Loc) -> None:
        """Names first bound inside a region have no value after it."""
        local = self.scope.names
        for n in assigned:
            if n in before:
                local[n] = before[n]
            elif n in local:
                local[n] = _LoopLocal(n, where, loc)

    # ---------------------------------------------------------------- if
    def _if(self, s: ast.If) -> None:
        cond = self.expr(s.cond)
        if isinstance(cond, Const):
            self.stmts(s.body if cond.value else s.orelse)
            return
        cond = self.value_of(cond, s.cond)
        if cond.type != T.I1:
            hint = "; use where() for tiles" if isinstance(cond.type, TileType) else \
                "; compare it, e.g. x != 0"
            raise TkcTypeError(f"an if condition must be a bool scalar, got {cond.type}{hint}", s.cond.loc)
        local = self.scope.names
        before = dict(local)
        assigned = _assigned_names(s.body + s.orelse)
        branches = []
        for body in (s.body, s.orelse):
            block = Block()
            with self.b.at_end(block):
                self.stmts(body)
            branches.append((block, dict(local)))
            local.clear()
            local.update(before)
        merged: list[tuple[str, object, object]] = []
        for n in assigned:
            a, b = branches[0][1].get(n), branches[1][1].get(n)
            if a is before.get(n) and b is before.get(n):
                continue
            if isinstance(a, (Dyn, Const, View)) and isinstance(b, (Dyn, Const, View)):
                merged.append((n, a, b))
            elif a is b or isinstance(a, TupleV) and a == b:
                local[n] = a
            elif n in before or not {type(a), type(b)} & {type(None), _LoopLocal}:  # bound in both branches
                raise TkcTypeError(f"'{n}' is {self._kind(a)} in one branch and {self._kind(b)} in the other; "
                                   f"a runtime if can only choose between values", s.loc)
            else:
                inner = a if isinstance(a, _LoopLocal) else b  # bound only in a loop inside a branch
                local[n] = inner if isinstance(inner, _LoopLocal) else _LoopLocal(n, "one branch of the if", s.loc)
        types: list[Type] = []
        keep: list[tuple[str, object]] = []
        for n, a, b in merged:
            if isinstance(a, Const) and isinstance(b, Const) and a == b:
                keep.append((n, a))
                continue
            ta = a.type if isinstance(a, Dyn) else None
            tb = b.type if isinstance(b, Dyn) else None
            if ta is not None and tb is not None and ta != tb:
                raise TkcTypeError(f"'{n}' is {ta} in one branch and {tb} in the other", s.loc)
            c = b if isinstance(b, Const) and isinstance(b.value, float) or not isinstance(a, Const) else a
            types.append(ta or tb or ScalarType(const_dtype(c.value)))  # 1 and 2.0 merge as f32
        names = [n for n, _, _ in merged if n not in dict(keep)]
        for block, env in branches:
            with self.b.at_end(block):
                self.b.loc = s.loc
                vals = [self._coerce_carried(n, env[n], t, s) for n, t in zip(names, types)]
                self.b.create(T.YieldOp, vals, loc=s.loc)
        op = self.b.create(T.IfOp, [cond.value], types,
                           regions=[Region([branches[0][0]]), Region([branches[1][0]])], loc=s.loc)
        for n, r in zip(names, op.results):
            r.name_hint = n
            local[n] = Dyn(r)
        for n, c in keep:
            local[n] = c

    # ---------------------------------------------------------------- grid
    def _grid(self, call: ast.Call) -> None:
        if self.grid_seen:
            raise TkcUnsupportedError("the kernel already has a grid", call.loc)
        self.grid_seen = True
        if call.keywords or not 1 <= len(call.args) <= 3:
            raise TkcTypeError("grid() takes 1 to 3 positional extents", call.loc)
        start = len(self.b.block.ops)
        extents = []
        for a in call.args:
            v = self.expr(a)
            if isinstance(v, Const) and (not isinstance(v.value, int) or isinstance(v.value, bool)
                                         or v.value < 0):
                raise TkcTypeError(f"a grid extent must be a non-negative integer, got {v.value!r}", a.loc)
            if isinstance(v, Dyn) and v.type != T.I32:
                hint = "; cast it with .to(i32)" if v.type == T.I64 else ""
                raise TkcTypeError(f"a grid extent must be an i32 scalar, got {v.type}{hint}", a.loc)
            if not isinstance(v, (Const, Dyn)):
                raise TkcTypeError(f"a grid extent must be an integer, got {self._kind(v)}", a.loc)
            extents.append(self.dyn(v, a, T.I32).value)
        allowed = {"tile.dim", "tile.constant", "tile.add", "tile.sub", "tile.mul", "tile.floordiv",
                   "tile.cdiv", "tile.rem", "tile.maximum", "tile.minimum", "tile.num_sms"}
        for op in self.b.block.ops[start:]:
            if op.name not in allowed:
                raise TkcTypeError("grid extents may use only tensor sizes, scalars, constants and num_sms()", op.loc)
        self.b.create(T.GridOp, extents, loc=call.loc)

    # =========================================================== expressions
    def expr(self, e: ast.Expr, scope: Scope | None = None) -> object:
        if scope is not None:
            saved, self.scope = self.scope, scope
            try:
                return self.expr(e)
            finally:
                self.scope = saved
        if isinstance(e, ast.Num):
            return Const(e.value)
        if isinstance(e, ast.Bool):
            return Const(e.value)
        if isinstance(e, ast.Name):
            return self.lookup(e)
        if isinstance(e, ast.BinOp):
            if e.op == "@":
                return self.matmul(e)
            a = self.value_of(self.expr(e.left), e.left)
            b = self.value_of(self.expr(e.right), e.right)
            return self.binop(e.op, a, b, e.loc)
        if isinstance(e, ast.UnaryOp):
            x = self.value_of(self.expr(e.operand), e.operand)
            if e.op == "+":
                return x
            if e.op == "not":
                self._need_bool(x, "'not'", e.loc)
            return self.em.unary(e.op, x, e.loc)
        if isinstance(e, ast.Compare):
            a = self.value_of(self.expr(e.left), e.left)
            b = self.value_of(self.expr(e.right), e.right)
            return self.em.compare(e.op, a, b, e.loc)
        if isinstance(e, ast.BoolOp):
            a = self.value_of(self.expr(e.left), e.left)
            self._need_bool(a, f"'{e.op}'", e.left.loc)
            if isinstance(a, Const):  # short-circuit at compile time, like Python
                if (e.op == "and") != bool(a.value):
                    return a
                b = self.value_of(self.expr(e.right), e.right)
                self._need_bool(b, f"'{e.op}'", e.right.loc)
                return b
            b = self.value_of(self.expr(e.right), e.right)
            self._need_bool(b, f"'{e.op}'", e.right.loc)
            return self.em.binary("&" if e.op == "and" else "|", a, b, e.loc)
        if isinstance(e, ast.IfExp):
            c = self.value_of(self.expr(e.cond), e.cond)
            if isinstance(c, Const):
                return self.expr(e.then if c.value else e.orelse)
            a = self.value_of(self.expr(e.then), e.then)
            b = self.value_of(self.expr(e.orelse), e.orelse)
            return self.em.select(c, a, b, e.loc)
        if isinstance(e, ast.Call):
            return self.call(e)
        if isinstance(e, ast.Attribute):
            return self.attribute(e)
        if isinstance(e, ast.Subscript):
            return self.subscript(e)
        if isinstance(e, (ast.Tuple, ast.List)):
            return TupleV(tuple(self.expr(x) for x in e.elts))
        if isinstance(e, ast.Str):
            raise TkcUnsupportedError("strings are not values in tile kernels", e.loc)
        if isinstance(e, ast.NoneLit):
            raise TkcUnsupportedError("None is only allowed as a new axis in x[:, None]", e.loc)
        if isinstance(e, ast.Slice):
            raise TkcUnsupportedError("a slice is only allowed inside [...]", e.loc)
        raise TkcUnsupportedError(f"unsupported expression {type(e).__name__}", e.loc)

    def _need_bool(self, x: object, what: str, loc: Loc) -> None:
        ok = isinstance(x, Const) and isinstance(x.value, bool) or \
            isinstance(x, Dyn) and x.type.dtype == dtypes.i1
        if not ok:
            raise TkcTypeError(f"{what} needs bool operands, got {self._kind(x)}", loc)

    def binop(self, op: str, a: object, b: object, loc: Loc) -> object:
        for x in (a, b):
            if not isinstance(x, (Const, Dyn)):
                raise TkcTypeError(f"'{op}' cannot take {self._kind(x)}", loc)
        if op == "@":
            raise TkcTypeError("'@=' is not supported; write acc += a @ b", loc)
        return self.em.binary(op, a, b, loc)

    def matmul(self, e: ast.BinOp) -> Dyn:
        a = self.value_of(self.expr(e.left), e.left)
        b = self.value_of(self.expr(e.right), e.right)
        for x, n in ((a, e.left), (b, e.right)):
            if not isinstance(x, Dyn) or not isinstance(x.type, TileType):
                raise TkcTypeError(f"'@' needs tiles, got {self._kind(x)}", n.loc)
        return self.em.mma(a, b, None, e.loc)

    # ---------------------------------------------------------------- names
    def _lookup_quiet(self, e: ast.Expr) -> object | None:
        if isinstance(e, ast.Name):
            v = self.scope.lookup(e.id)
            if v is None:
                v = self.helpers.get(e.id) or self._builtin(e.id)
            return v
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id in NAMESPACES \
                and self.scope.lookup(e.value.id) is None:
            return self._builtin(e.attr)
        return None

    @staticmethod
    def _builtin(name: str) -> object | None:
        if name in BUILTIN_FUNCS:
            return Builtin(name)
        if name in ("inf", "nan"):
            return Const(float(name))
        dt = dtypes.from_name(name)
        if dt is not None:
            return DTypeName(dt)
        if name in NAMESPACES:
            return Builtin(name)
        return None

    def lookup(self, e: ast.Name) -> object:
        v = self._lookup_quiet(e)
        if v is None:
            # A near miss of one of the kernel's own names is suggested; for anything else the
            # builtins are listed rather than guessed at ('sinh' is no misspelling of 'sin').
            mine = self.scope.all_names() | set(self.helpers)
            near = difflib.get_close_matches(e.id, sorted(mine), n=1)
            if e.id == "choose":
                raise TkcNameError("choose(...) is written only as a constant's default in the signature "
                                   "(BM: const = choose(64, 128)), where the compiler picks one of its values",
                                   e.loc)
            if near:
                hint = f"; did you mean '{near[0]}'?"
            elif self.python_function:
                # a module's variable, a closure's or a helper defined outside the kernel
                hint = (f" in the kernel: an @tkc.kernel function sees none of Python's names, only its "
                        f"parameters, its own helpers and the builtins; make it a parameter "
                        f"({e.id}: const = ... for a constant) or define the helper inside the kernel")
            else:
                near = [_DTYPE_ALIASES[e.id]] if e.id in _DTYPE_ALIASES else difflib.get_close_matches(
                    e.id, sorted({*BUILTIN_FUNCS, *DTYPE_NAMES}), n=1)
                hint = f"; did you mean '{near[0]}'?" if near else \
                    " (no parameter, local name or builtin has that name: `tkc ops` lists the builtins)"
            raise TkcNameError(f"name '{e.id}' is not defined{hint}", e.loc)
        if isinstance(v, _LoopLocal):
            raise TkcNameError(f"'{e.id}' is assigned only inside {v.where} (line {v.loc.line}); "
                               f"assign it before to use it after", e.loc)
        return v

    def attribute(self, e: ast.Attribute) -> object:
        if isinstance(e.value, ast.Name) and e.value.id in NAMESPACES and self.scope.lookup(e.value.id) is None:
            v = self._builtin(e.attr)
            if v is None or v == Builtin(e.attr) and e.attr in NAMESPACES:
                raise TkcNameError(f"'{e.value.id}.{e.attr}' is not part of the tile language", e.loc)
            return v
        obj = self.expr(e.value)
        if e.attr == "on" and isinstance(obj, Tensor):
            return Method(obj, "on")
        if e.attr == "T":
            return self.em.transpose(self._tile(obj, ".T", e.value), e.loc)
        if e.attr == "shape":
            if isinstance(obj, Tensor):
                return TupleV(tuple(self._dim(obj, i, e.loc) for i in range(obj.type.rank)))
            if isinstance(obj, View):
                obj = self.load(obj, None)
            if isinstance(obj, Dyn):
                return TupleV(tuple(Const(s) for s in getattr(obj.type, "shape", ())))
        if e.attr == "dtype" and isinstance(obj, (Dyn, Tensor, View)):
            return DTypeName(obj.type.dtype if not isinstance(obj, View) else obj.tensor.type.dtype)
        if e.attr in METHODS and isinstance(obj, (Dyn, View, Const)):
            return Method(obj, e.attr)
        raise TkcTypeError(f"{self._kind(obj)} has no attribute '{e.attr}'", e.loc)

    def _dim(self, t: Tensor, axis: int, loc: Loc) -> object:
        d = t.type.dims[axis]
        if isinstance(d, int):
            return Const(d)
        v = self.scope.lookup(d)
        if isinstance(v, Dyn):
            return v
        return Dyn(self.b.value(T.DimOp, [t.value], T.I32, {"axis": axis}, loc=loc))

    # ---------------------------------------------------------------- values
    def value_of(self, v: object, node: ast.Node) -> Const | Dyn:
        """A runtime or constant value; loads a pending tensor slice."""
        if isinstance(v, View):
            return self.load(v, None)
        if isinstance(v, (Const, Dyn)):
            return v
        hint = f": slice it, e.g. {v.name}[i*BN:(i+1)*BN]" if isinstance(v, Tensor) else ""
        raise TkcTypeError(f"expected a value, got {self._kind(v)}{hint}", node.loc)

    def dyn(self, v: object, node: ast.Node, like: Type | None = None) -> Dyn:
        """An IR value: constants are materialized (in ``like``'s dtype)."""
        v = self.value_of(v, node)
        return self.em.materialize(v, like, node.loc) if isinstance(v, Const) else v

    def _tile(self, v: object, what: str, node: ast.Node) -> Dyn:
        v = self.value_of(v, node)
        if not isinstance(v, Dyn) or not isinstance(v.type, TileType):
            raise TkcTypeError(f"{what} needs a tile, got {self._kind(v)}", node.loc)
        return v

    def const_int(self, v: object, what: str, node: ast.Node) -> int:
        if isinstance(v, Const) and isinstance(v.value, int) and not isinstance(v.value, bool):
            return v.value
        raise TkcTypeError(f"{what} must be a compile-time integer constant, got {self._kind(v)}", node.loc)

    def _element(self, v: object) -> object:
        """``v``, or the scalar it reads where it is one element of a tensor (``n[0]``,
        ``lens[b]``: every axis indexed, none sliced), as a loop bound or slice offset takes it."""
        if isinstance(v, View) and len(v.index) == v.tensor.type.rank \
                and not any(i is None or isinstance(i, (ast.Slice, ast.NoneLit)) for i in v.index):
            return self.load(v, None)
        return v

    @staticmethod
    def _is_index(v: object) -> bool:
        """An integer constant or an i32/i64 scalar: what offsets and loop bounds take."""
        if isinstance(v, Const):
            return isinstance(v.value, int) and not isinstance(v.value, bool)
        return isinstance(v, Dyn) and v.type in (T.I32, T.I64)

    @staticmethod
    def _kind(v: object) -> str:
        if isinstance(v, Const):
            return f"the constant {v.value!r}"
        if isinstance(v, Dyn):
            return f"a {v.type}" if isinstance(v.type, TileType) else f"a scalar {v.type}"  # not 'a tile tile<..>'
        if isinstance(v, (Tensor, View)):
            return f"the tensor '{(v if isinstance(v, Tensor) else v.tensor).name}'" + (
                "" if isinstance(v, Tensor) else " slice")
        if isinstance(v, DTypeName):
            return f"the dtype {v.dtype.name}"
        if isinstance(v, Function):
            return f"the function '{v.node.name}'"
        if isinstance(v, Builtin):
            return f"the builtin '{v.name}'"
        if isinstance(v, Method):
            return f"the method '.{v.name}'"
        if isinstance(v, Text):
            return f"the string {v.value!r}"
        if isinstance(v, TupleV):
            return f"a tuple of {len(v.items)}" if v.items else \
                "no value (a helper without 'return', or an atomic on a tile, which returns nothing)"
        return "this expression"

    # ---------------------------------------------------------------- memory
    def subscript(self, e: ast.Subscript) -> object:
        base = self.expr(e.value)
        if isinstance(base, Tensor):
            return View(base, e.index, e, self.scope)
        if isinstance(base, TupleV):
            if len(e.index) != 1:
                raise TkcTypeError("a tuple takes one index", e.loc)
            i = self.const_int(self.expr(e.index[0]), "a tuple index", e.index[0])
            if not -len(base.items) <= i < len(base.items):
                raise TkcTypeError(f"index {i} is out of range for a tuple of {len(base.items)}", e.loc)
            return base.items[i]
        x = self._tile(base, "indexing", e.value)
        kept = sum(not isinstance(i, ast.NoneLit) for i in e.index)
        if kept > x.type.rank:
            raise TkcTypeError(f"too many indices for {x.type}", e.loc)
        # A tile takes ':', None (a new axis), a constant index (the axis dropped) and a
        # constant aligned block (acc[:, 0:64] of a 128-column tile): registers picked, never
        # moved; what memory holds is sliced on the tensor instead.
        axis, out = 0, x
        for item in e.index:
            if isinstance(item, ast.NoneLit):
                out = self.em.expand_dims(out, axis, item.loc)
                axis += 1
            elif isinstance(item, ast.Slice) and item.lower is None and item.upper is None and item.step is None:
                axis += 1
            elif isinstance(item, ast.Slice):
                n = out.type.shape[axis]
                lo = 0 if item.lower is None else self.const_int(self.expr(item.lower), "a tile's slice bound", item)
                hi = n if item.upper is None else self.const_int(self.expr(item.upper), "a tile's slice bound", item)
                step = 1 if item.step is None else self.const_int(self.expr(item.step), "a tile's slice step", item)
                out = self.em.block(out, axis, lo + n if lo < 0 else lo, hi + n if hi < 0 else hi, step, item.loc)
                axis += 1
            else:
                out = self.em.take(out, axis, self.const_int(self.expr(item), "a tile's index", item), item.loc)
        return out

    def _box(self, view: View, what: str | None = None
             ) -> tuple[list, list[int], list[int], list[int], tuple | None]:
        """Offsets, box extents, squeezed axes and steps of a tensor slice, and ``(axis, index
        tile)`` where an axis is indexed by a 1-D i32 tile (a gather; ``what`` names the access
        where that is refused)."""
        gather = None
        t = view.tensor.type
        index = list(view.index)
        if len(index) > t.rank:
            raise TkcTypeError(f"too many indices for tensor '{view.tensor.name}' of rank {t.rank}",
                               view.node.loc)
        offsets, box, squeeze, steps = [], [], [], []

        def ev(x: ast.Expr) -> object:  # in the scope that wrote the slice
            return self.expr(x, view.scope)

        for axis in range(t.rank):
            item = index[axis] if axis < len(index) else None
            if item is None or isinstance(item, ast.Slice):
                lo = ev(item.lower) if item is not None and item.lower is not None else Const(0)
                if item is not None and item.upper is not None:
                    hi = ev(item.upper)
                else:
                    hi = self._dim(view.tensor, axis, view.node.loc)
                loc = item.loc if item is not None else view.node.loc
                for v, n in ((lo, "start"), (hi, "stop")):
                    if not self._is_index(v):
                        hint = ""
                        if isinstance(v, View):  # x[ids[b]:ids[b]+1]: two reads, which need not agree
                            hint = "; read the element into a name first (n = ids[b], then x[n:n+1])"
                        raise TkcTypeError(f"slice {n} on axis {axis} must be an integer, got "
                                           f"{self._kind(v)}{hint}", loc)
                step = 1
                if item is not None and item.step is not None:
                    sv = ev(item.step)
                    if not (isinstance(sv, Const) and type(sv.value) is int) or sv.value < 1:
                        raise TkcTypeError(f"slice step on axis {axis} must be a positive compile-time integer, "
                                           f"got {self._kind(sv)}", item.step.loc)
                    step = sv.value
                fa, fb = self.em.affine_of(lo), self.em.affine_of(hi)
                ext = fb - fa
                if fa.is_const and fa.const < 0:
                    # as a negative index is: Python's x[-16:] counts from the end, here it would
                    # read 16 masked zeros before the first element (checked first: x[-16:] also
                    # spans the runtime size)
                    raise TkcTypeError(f"slice start {fa.const} on axis {axis} of '{view.tensor.name}': tensor "
                                       f"indices count from 0 (a slice may run past the end, where it reads 0, "
                                       f"but not start before 0)", loc)
                if not ext.is_const and item is not None and item.upper is not None \
                        and not all(_is_input(v) for v, _ in fa.terms):
                    # a start computed from other values (through a load, say) that the stop does not
                    # visibly repeat: the bounds may well differ by a constant, only not provably
                    raise TkcTypeError(f"cannot prove that the slice on axis {axis} of '{view.tensor.name}' has "
                                       f"a compile-time constant extent (stop - start); name the start first "
                                       f"so both bounds use it: g = ...; x[g*BN:(g+1)*BN]", loc)
                if not ext.is_const:
                    size = f"the runtime size {t.dims[axis]}" if item is None or item.upper is None \
                        else "a runtime extent"
                    raise TkcTypeError(f"slice on axis {axis} of '{view.tensor.name}' spans {size}; tile "
                                       f"extents must be compile-time constants, e.g. i*BM:(i+1)*BM", loc)
                if ext.const < 1:
                    raise TkcTypeError(f"slice on axis {axis} has extent {ext.const}; it must be positive", loc)
                if fa.is_const and isinstance(t.dims[axis], int) and fa.const >= t.dims[axis]:
                    raise TkcTypeError(f"slice on axis {axis} of '{view.tensor.name}' starts at {fa.const}, past "
                                       f"its {t.dims[axis]} elements", loc)
                offsets.append(self.value_of(lo, view.node))
                box.append(-(-ext.const // step))
                steps.append(step)
            elif isinstance(item, ast.NoneLit):
                raise TkcUnsupportedError("None (new axis) cannot index a tensor", item.loc)
            else:
                c = ev(item)
                if isinstance(c, Const) and type(c.value) is int and c.value < 0:
                    # Python's x[-1] is the last element; here it would be before the first (read as
                    # the masked 0), so a constant negative index is refused rather than misread.
                    raise TkcTypeError(f"index {c.value} on axis {axis} of '{view.tensor.name}': tensor indices "
                                       f"count from 0 (the last element is {t.dims[axis]} - 1)", item.loc)
                v = self.value_of(c, item)
                if isinstance(v, Dyn) and isinstance(v.type, TileType) and v.type.dtype == dtypes.i32 \
                        and v.type.rank == 1:
                    if gather is not None:
                        raise TkcUnsupportedError("one axis of a tensor may be indexed by a tile; index "
                                                  "the others with scalars or slices", item.loc)
                    gather = (axis, v)  # rows (or columns...) picked by a tile of indices
                    offsets.append(Const(0))
                    box.append(v.type.shape[0])
                    steps.append(1)
                    continue
                if not self._is_index(v):
                    raise TkcTypeError(f"a tensor index must be an i32 or i64 scalar or a 1-D i32 tile, got "
                                       f"{self._kind(v)}", item.loc)
                offsets.append(v)
                box.append(1)
                squeeze.append(axis)
                steps.append(1)
        if gather is not None and what is not None:
            raise TkcUnsupportedError(f"{what} through a tile of indices (a scatter) is not supported; "
                                      f"index the tensor with scalars or slices there", view.node.loc)
        if gather is not None and any(st != 1 for st in steps):
            raise TkcUnsupportedError("a slice with a step and a tile of indices in one access are not supported; "
                                      "gather first, then slice the tensor", view.node.loc)
        kept = tuple(b for i, b in enumerate(box) if i not in squeeze)
        check_tile_dims(kept, f"tile of '{view.tensor.name}'", view.node.loc)
        values = [self.em.index(self.value_of(o, view.node), view.node.loc) for o in offsets]
        return [v.value for v in values], box, squeeze, steps, gather

    def load(self, view: View, other: object) -> Dyn:
        offsets, box, squeeze, steps, gather = self._box(view)
        t = view.tensor.type
        kept = tuple(b for i, b in enumerate(box) if i not in squeeze)
        rt = TileType(kept, t.dtype) if kept else ScalarType(t.dtype)
        attrs: dict[str, object] = {"box": box}
        if squeeze:
            attrs["squeeze"] = squeeze
        if any(s != 1 for s in steps):
            attrs["steps"] = steps
        if other is not None:
            if not isinstance(other, Const):
                raise TkcTypeError("load(..., other=) takes a compile-time constant", view.node.loc)
            if isinstance(other.value, float) and not t.dtype.is_float:
                raise TkcTypeError(f"other={other.value} does not fit {t.dtype.name}", view.node.loc)
            attrs["other"] = other.value
        if gather is not None:
            axis, idx = gather
            at = [a for a in range(len(box)) if a not in squeeze].index(axis)
            index = idx
            for a in range(len(kept)):  # the index along its axis, broadcast over the others
                if a != at:
                    index = self.em.expand_dims(index, a, view.node.loc)
            index = self.em.broadcast_to(index, kept, view.node.loc)
            attrs["axis"] = axis
            return Dyn(self.b.value(T.GatherOp, [view.tensor.value, index.value, *offsets], rt, attrs,
                                    loc=view.node.loc))
        return Dyn(self.b.value(T.LoadOp, [view.tensor.value, *offsets], rt, attrs, loc=view.node.loc))

    def store(self, view: View, v: object, loc: Loc, mask: object = None) -> None:
        offsets, box, squeeze, steps, _ = self._box(view, "storing")
        v = self._stored(view, box, squeeze, v, "store", loc)
        attrs: dict[str, object] = {"box": box}
        if squeeze:
            attrs["squeeze"] = squeeze
        if mask is not None:
            self._masked_store(view, v, mask, offsets, attrs, steps, loc)
            return
        if any(st != 1 for st in steps):
            attrs["steps"] = steps
        self.b.create(T.StoreOp, [view.tensor.value, v.value, *offsets], attrs=attrs, loc=view.node.loc)

    def _masked_store(self, view: View, v: Dyn, mask: object, offsets: list, attrs: dict, steps: list,
                      loc: Loc) -> None:
        """``store(view, v, mask=m)``: only the elements where the bool tile ``m`` (broadcast to
        the slice) is true are written."""
        if not isinstance(v.type, TileType):
            raise TkcTypeError("store(..., mask=) writes a tile; index a single element with an if instead", loc)
        if any(st != 1 for st in steps):
            raise TkcUnsupportedError("store(..., mask=) into a slice with a step is not supported", loc)
        m = self.value_of(mask, view.node)
        if isinstance(m, Const) or not m.type.dtype.is_bool or not isinstance(m.type, TileType) \
                or len(m.type.shape) != len(v.type.shape) \
                or any(a != b and a != 1 for a, b in zip(m.type.shape, v.type.shape)):
            raise TkcTypeError(f"store(..., mask=) takes a bool tile of the slice's shape {list(v.type.shape)} "
                               f"(or size 1 along an axis), got {self._kind(m)}", loc)
        m = self.em.broadcast_to(m, v.type.shape, loc)
        self.b.create(T.MaskedStoreOp, [view.tensor.value, v.value, m.value, *offsets], attrs=attrs,
                      loc=view.node.loc)

    def atomic(self, kind: str, view: View, values: list[object], sem: object, e: ast.Call) -> object:
        """``atomic_<kind>(view, *values, sem=...)``: a ``tile.atomic`` (``tile.atomic_cas``), which
        on one element returns its old value; on a tile, nothing."""
        what = f"atomic_{kind}()"
        if not isinstance(view, View):
            raise TkcTypeError(f"{what} takes a tensor slice or element like x[i] or x[r:r+BM, :], got "
                               f"{self._kind(view)}", e.loc)
        offsets, box, squeeze, steps, _ = self._box(view, what)
        if any(st != 1 for st in steps):
            raise TkcUnsupportedError(f"{what} into a slice with a step is not supported; use a step of 1",
                                      view.node.loc)
        t = view.tensor.type
        if t.dtype.name not in T.ATOMIC_KINDS[kind]:
            raise TkcTypeError(f"{what} takes a tensor of {', '.join(T.ATOMIC_KINDS[kind])}, and "
                               f"'{view.tensor.name}' is {t.dtype.name}", view.node.loc)
        one = len(squeeze) == len(box)
        if sem is not None and not (isinstance(sem, Text) and sem.value in T.ATOMIC_SEMS):
            raise TkcTypeError(f"{what}: sem is one of {', '.join(map(repr, T.ATOMIC_SEMS))}", e.loc)
        sem = sem.value if sem is not None else ("acq_rel" if one else "relaxed")
        if not one and sem in ("acquire", "acq_rel"):
            raise TkcTypeError(f"{what} into a tile reads nothing back, so sem={sem!r} has nothing to "
                               f"order; use 'relaxed' or 'release'", e.loc)
        if kind == "cas" and not one:
            raise TkcTypeError("atomic_cas() swaps one element: index every axis, like flags[i]", view.node.loc)
        vals = [self._stored(view, box, squeeze, self.load(v, None) if isinstance(v, View) else v,
                             f"combine atomically ({what})", e.loc).value for v in values]
        attrs: dict[str, object] = {"box": box}
        if squeeze:
            attrs["squeeze"] = squeeze
        if kind != "cas":
            attrs["kind"] = kind
        if sem != "relaxed":
            attrs["sem"] = sem
        cls = T.AtomicCasOp if kind == "cas" else T.AtomicOp
        result = [ScalarType(t.dtype)] if one else []
        op = self.b.create(cls, [view.tensor.value, *vals, *offsets], result, attrs, loc=e.loc)
        return Dyn(op.results[0]) if one else NONE

    def _stored(self, view: View, box: list[int], squeeze: list[int], v: object, verb: str, loc: Loc) -> Dyn:
        """``v`` as the value a store (or an atomic) writes into the box: constants made
        values, scalars and size-1 axes broadcast to the box; a dtype other than the tensor's
        is an error."""
        t = view.tensor.type
        kept = tuple(b for i, b in enumerate(box) if i not in squeeze)
        if not isinstance(v, (Const, Dyn)):  # located at the value, not at the tensor
            raise TkcTypeError(f"expected a value to {verb.split(' (')[0]} into '{view.tensor.name}', got "
                               f"{self._kind(v)}", loc)
        if isinstance(v, Const):
            v = self.em.materialize(v, ScalarType(t.dtype), loc)
        doing = "storing" if verb == "store" else "adding" if "atomic_add" in verb else "combining"
        if v.type.dtype != t.dtype:
            raise TkcTypeError(f"{doing} {v.type} into {t.dtype.name} tensor '{view.tensor.name}'; "
                               f"cast with .to({t.dtype.name})", loc)
        if kept:
            if v.type.shape if isinstance(v.type, TileType) else False:
                if len(v.type.shape) != len(kept) or any(
                        a != b and a != 1 for a, b in zip(v.type.shape, kept)):
                    raise TkcTypeError(f"{doing} {v.type} into a slice of shape {list(kept)}", loc)
            v = self.em.broadcast_to(v, kept, loc)
        elif isinstance(v.type, TileType):
            raise TkcTypeError(f"{doing} {v.type} into a single element", loc)
        return v

    # ---------------------------------------------------------------- ranks
    def peer(self, t: Tensor, rank: object, e: ast.Call) -> Tensor:
        """``x.on(r)``: rank ``r``'s copy of the ``@ ranks`` tensor ``x``, sliced like ``x``."""
        if not t.type.ranks:
            raise TkcTypeError(f"'{t.name}' exists on this rank only, so it has no copy on rank r; declare it "
                               f"{t.name}: {t.type.dtype.name}[{', '.join(map(str, t.type.dims))}] @ ranks to "
                               f"read and write peers' copies", e.loc)
        if T.is_peer(t.value):
            base = t.name.split(".on(")[0]
            raise TkcTypeError(f"'{t.name}' is already a peer's copy: call .on() on '{base}' itself "
                               f"({base}.on(s) is rank s's copy)", e.loc)
        r = self.value_of(rank, e)
        if not self._is_index(r) or isinstance(r, Dyn) and r.type != T.I32:
            raise TkcTypeError(f".on() takes a rank, an i32 scalar like rank() or (rank() + 1) % num_ranks(), got "
                               f"{self._kind(r)}", e.loc)
        v = self.b.value(T.PeerOp, [t.value, self.dyn(r, e, T.I32).value], t.type, loc=e.loc)
        return Tensor(v, f"{t.name}.on(r)")

    def _flag(self, view: object, what: str, node: ast.Node) -> tuple[list, list[int], list[int]]:
        """Offsets, box and squeezed axes of one element of an i32 tensor: a flag."""
        if not isinstance(view, View):
            raise TkcTypeError(f"{what} takes a flag, one element of an i32 tensor like flags[i], got "
                               f"{self._kind(view)}", node.loc)
        t = view.tensor.type
        if t.dtype != dtypes.i32:
            raise TkcTypeError(f"{what} takes a flag, an element of an i32 tensor; '{view.tensor.name}' is "
                               f"{t.dtype.name}", view.node.loc)
        offsets, box, squeeze, steps, _ = self._box(view, what)
        if len(squeeze) != len(box):
            raise TkcTypeError(f"{what} takes one flag: index every axis of '{view.tensor.name}', like "
                               f"flags[i] or flags[r, i]", view.node.loc)
        return offsets, box, squeeze

    def wait(self, e: ast.Call) -> object:
        """``wait(flags[i] >= v)``: a ``tile.wait`` on one element of a local i32 tensor."""
        form = "wait() takes one comparison of a flag with a value, like wait(flags[i] >= 1)"
        if e.keywords or len(e.args) != 1 or not isinstance(e.args[0], ast.Compare):
            raise TkcTypeError(form, e.loc)
        c = e.args[0]
        if c.op not in CMP_PREDS:
            raise TkcTypeError(f"{form}; the comparison is one of {', '.join(CMP_PREDS)}", c.loc)
        view = self.expr(c.left)
        offsets, box, squeeze = self._flag(view, "wait()", c.left)
        if T.is_peer(view.tensor.value):
            raise TkcTypeError(f"wait() reads a local flag; a peer's copy ({view.tensor.name}) is read over the "
                               f"interconnect: have that rank signal this rank's copy with "
                               f"signal({view.tensor.name.split('.on(')[0]}.on(r)[...], v)", c.left.loc)
        v = self.value_of(self.expr(c.right), c.right)
        if not self._is_index(v) or isinstance(v, Dyn) and v.type != T.I32:
            raise TkcTypeError(f"wait() compares the flag with an i32 scalar, got {self._kind(v)}", c.right.loc)
        self.b.create(T.WaitOp, [view.tensor.value, self.dyn(v, c.right, T.I32).value, *offsets],
                      attrs={"pred": CMP_PREDS[c.op], "box": box, "squeeze": squeeze}, loc=e.loc)
        return NONE

    def signal(self, view: object, value: object, sem: object, e: ast.Call) -> object:
        """``signal(flags.on(r)[i], v)``: set a flag (of any rank) to ``v`` with release ordering:
        a ``tile.atomic`` exch on one element that returns nothing."""
        offsets, box, squeeze = self._flag(view, "signal()", e)
        if sem is not None and not (isinstance(sem, Text) and sem.value in ("release", "relaxed")):
            raise TkcTypeError("signal(): sem is 'release' (the default: what the program wrote before is "
                               "visible to whoever waits for the flag) or 'relaxed'", e.loc)
        v = self.value_of(value, e)
        if not self._is_index(v) or isinstance(v, Dyn) and v.type != T.I32:
            raise TkcTypeError(f"signal() sets the flag to an i32 scalar, got {self._kind(v)}", e.loc)
        attrs: dict[str, object] = {"kind": "exch", "box": box, "squeeze": squeeze}
        if sem is None or sem.value == "release":
            attrs["sem"] = "release"
        self.b.create(T.AtomicOp, [view.tensor.value, self.dyn(v, e, T.I32).value, *offsets], attrs=attrs, loc=e.loc)
        return NONE

    # ---------------------------------------------------------------- calls
    def call(self, e: ast.Call) -> object:
        f = self.expr(e.func)
        if f == Builtin("wait"):  # its argument is a condition on a flag, not a value
            return self.wait(e)
        # None is an argument of the builtins that take one (dot_scaled's missing scales)
        takes_none = isinstance(f, Builtin) and f.name in NONE_ARGUMENTS

        def arg(a: ast.Expr) -> object:
            return NO_SCALE if takes_none and isinstance(a, ast.NoneLit) else self.expr(a)

        args = [arg(a) for a in e.args]
        kwargs = {}
        for k in e.keywords:
            if k.name in kwargs:
                raise TkcTypeError(f"keyword '{k.name}' given twice", k.loc)
            # A string is a value only as a keyword argument (``sem="acquire"``).
            kwargs[k.name] = (Text(k.value.value) if isinstance(k.value, ast.Str) else arg(k.value), k)
        if isinstance(f, Function):
            return self.inline(f, args, kwargs, e)
        if isinstance(f, Method):
            return self.method(f, args, kwargs, e)
        if isinstance(f, Builtin) and f.name not in NAMESPACES:
            if f.name == "grid":
                raise TkcUnsupportedError("grid(...) must be the first statement of the kernel", e.loc)
            if f.name in ("range", "static_range"):
                raise TkcUnsupportedError(f"{f.name}() is only allowed as the iterable of a for loop", e.loc)
            return BUILTIN_IMPLS[f.name](self, e, args, kwargs)
        raise TkcTypeError(f"{self._kind(f)} is not callable", e.func.loc)

    def bind(self, what: str, e: ast.Call, args: list, kwargs: dict, spec: list[tuple[str, object]]) -> dict:
        """Match call arguments to ``spec`` [(name, default or REQUIRED)]."""
        if len(args) > len(spec):
            most = {0: "no arguments", 1: "at most 1 argument"}.get(len(spec), f"at most {len(spec)} arguments")
            raise TkcTypeError(f"{what} takes {most}, got {len(args)}", e.loc)
        out = dict(zip([n for n, _ in spec], args))
        names = [n for n, _ in spec]
        for k, (v, node) in kwargs.items():
            if k not in names:
                raise TkcTypeError(f"{what} has no argument '{k}'", node.loc)
            if k in out:
                raise TkcTypeError(f"{what} got '{k}' twice", node.loc)
            out[k] = v
        for n, d in spec:
            if n not in out:
                if d is REQUIRED:
                    raise TkcTypeError(f"{what} is missing the argument '{n}'", e.loc)
                out[n] = d
        return out

    def inline(self, f: Function, args: list, kwargs: dict, e: ast.Call) -> object:
        node = f.node
        if node.name in self.call_stack:
            raise TkcUnsupportedError(f"recursive call of '{node.name}' cannot be inlined", e.loc)
        if len(self.call_stack) > 32:
            raise TkcUnsupportedError("helpers nest too deeply", e.loc)
        scope = Scope(parent=f.closure)
        spec = []
        for p in node.params:
            d = REQUIRED if p.default is None else self.expr(p.default, f.closure or Scope())
            spec.append((p.name, d))
        for k, v in self.bind(f"'{node.name}'", e, args, kwargs, spec).items():
            scope.names[k] = v
        body = node.body
        if body and isinstance(body[0], ast.ExprStmt) and isinstance(body[0].value, ast.Str):
            body = body[1:]
        ret = body[-1] if body and isinstance(body[-1], ast.Return) else None
        saved = self.scope
        self.scope = scope
        self.call_stack.append(node.name)
        try:
            self.stmts(body[:-1] if ret else body)
            if ret is None or ret.value is None:
                return NONE
            v = self.expr(ret.value)
            return self.load(v, None) if isinstance(v, View) else v
        finally:
            self.call_stack.pop()
            self.scope = saved

    def method(self, m: Method, args: list, kwargs: dict, e: ast.Call) -> object:
        if m.name == "on":
            return self.peer(m.obj, self.bind(".on()", e, args, kwargs, [("rank", REQUIRED)])["rank"], e)
        obj = self.value_of(m.obj, e)
        if m.name == "to":
            a = self.bind(".to()", e, args, kwargs, [("dtype", REQUIRED)])
            if not isinstance(a["dtype"], DTypeName):
                raise TkcTypeError(f".to() takes a dtype like bf16, got {self._kind(a['dtype'])}", e.loc)
            return self.em.cast(obj, a["dtype"].dtype, e.loc)
        if m.name in REDUCTIONS or m.name in ARG_REDUCTIONS:
            a = self.bind(f".{m.name}()", e, args, kwargs, [("axis", REQUIRED), ("keepdim", Const(False))])
            return self._reduce(m.name, obj, a, e)
        if m.name == "reshape":
            if len(args) > 1 and not kwargs:  # x.reshape(64, 32), as torch and numpy allow
                args = [TupleV(tuple(args))]
            a = self.bind(".reshape()", e, args, kwargs, [("shape", REQUIRED)])
            x = self._tile(obj, ".reshape()", e)
            return self.em.reshape(x, self.shape_arg(a["shape"], e), e.loc)
        if m.name in SCANS:
            a = self.bind(f".{m.name}()", e, args, kwargs, [("axis", REQUIRED)])
            return self.scan(m.name, obj, a, e)
        if m.name in MATH_FUNCS:
            self.bind(f".{m.name}()", e, args, kwargs, [])
            return self.em.unary(m.name, obj, e.loc)
        raise TkcTypeError(f"unknown method '.{m.name}'", e.loc)  # pragma: no cover

    def _reduce(self, kind: str, x: object, a: dict, e: ast.Call) -> Dyn:
        x = self._tile(x, f"{kind}()", e)  # first: max(a, b, c) is not a reduction at all
        axis = self.const_int(a["axis"], "the reduction axis", e)
        keep = a["keepdim"]
        if not isinstance(keep, Const) or not isinstance(keep.value, bool):
            raise TkcTypeError("keepdim must be True or False", e.loc)
        if kind in ARG_REDUCTIONS:
            return self.em.arg_reduce(kind, x, axis, keep.value, e.loc)
        return self.em.reduce(kind, x, axis, keep.value, e.loc)

    def scan(self, name: str, x: object, a: dict, e: ast.Call) -> Dyn:
        x = self._tile(x, f"{name}()", e)
        axis = self.const_int(a["axis"], f"the {name} axis", e)
        return self.em.scan(name, SCANS[name], x, axis, e.loc)

    def shape_arg(self, v: object, node: ast.Node) -> tuple[int, ...]:
        items = v.items if isinstance(v, TupleV) else (v,)
        shape = tuple(self.const_int(x, "a tile extent", node) for x in items)
        if not shape:
            raise TkcTypeError("a tile shape needs at least one extent", node.loc)
        check_tile_dims(shape, "tile shape", node.loc)
        return shape

    def dtype_arg(self, v: object, node: ast.Node) -> dtypes.DType:
        if not isinstance(v, DTypeName):
            raise TkcTypeError(f"expected a dtype like f32, got {self._kind(v)}", node.loc)
        return v.dtype


# -------------------------------------------------------------------- module
def lower_module(tree: ast.Module, consts: dict[str, object] | None = None,
                 python_function: bool = False, only: str | None = None) -> Module:
    """Lower every kernel of a parsed file.  In a ``.tk`` file kernels are the
    ``@kernel`` functions; with ``python_function`` the first function is the
    kernel (the source of one ``@tkc.kernel`` function).  ``only``: the kernel of that name
    alone (the constants are still checked against every kernel; a name the file lacks is an
    error listing those it has), so compiling one kernel of a file of several lowers one."""
    consts = dict(consts or {})
    funcs = [s for s in tree.body if isinstance(s, ast.FunctionDef)]
    for s in tree.body:
        if not isinstance(s, (ast.FunctionDef, ast.Import, ast.Pass)) and not (
                isinstance(s, ast.ExprStmt) and isinstance(s.value, ast.Str)):
            raise TkcUnsupportedError("only functions and imports may appear at the top level", s.loc)
    if python_function:
        kernels = funcs[:1]
    else:
        kernels = [f for f in funcs if any(_is_kernel_decorator(d) for d in f.decorators)]
    if not kernels:
        raise TkcSyntaxError("no kernel found: mark a function with @kernel", Loc(tree.file, 1, 1, tree.source))
    helpers = {f.name: Function(f, None) for f in funcs if f not in kernels}
    if not python_function:
        for f in funcs:
            if f not in kernels:
                _no_decorators(f)
    names = [k.name for k in kernels]
    for k in kernels:
        if names.count(k.name) > 1:
            raise TkcTypeError(f"kernel '{k.name}' is defined twice", k.loc)
    known = {p.name for k in kernels for p in k.params}
    unknown = sorted(set(consts) - known - set(PINS))
    dims: dict[str, ast.Name] = {}
    for n in (n for k in kernels for p in k.params for n in _dim_names(p.annotation) if n.id in unknown):
        dims.setdefault(n.id, n)
    if dims:
        name, node = next(iter(dims.items()))
        raise TkcUsageError(f"'{name}' is a tensor dim, not a constant: its size comes from the tensors passed "
                            f"(tkc run: --dim {name}={consts[name]})", node.loc)
    if unknown:
        constants = sorted({p.name for k in kernels for p in k.params if is_const_annotation(p.annotation)})
        near = difflib.get_close_matches(unknown[0], [*constants, *PINS], n=1)
        raise TkcUsageError(f"unknown constant {', '.join(map(repr, unknown))}"
                            + (f"; did you mean '{near[0]}'?" if near else "")
                            + f" (the kernel's constants: {', '.join(constants) or 'none'}; pins: {', '.join(PINS)})",
                            kernels[0].loc)
    runtime = [p for k in kernels for p in k.params
               if p.name in consts and p.name not in PINS and not is_const_annotation(p.annotation)]
    if runtime:
        p = runtime[0]
        scalar = not isinstance(p.annotation, ast.Subscript)  # a tensor's annotation has its dims
        raise TkcUsageError(f"'{p.name}' is an argument given at each call, not a constant: pass it there"
                            + (f" (tkc run: --scalar {p.name}={consts[p.name]})" if scalar else ""), p.loc)
    m = Module()
    if only is not None:
        if only not in names:
            raise kernel_choice_error(tree.file, only, names)
        kernels = [k for k in kernels if k.name == only]
    for k in kernels:
        mine = {n: v for n, v in consts.items() if n in {p.name for p in k.params}}
        # Pins the kernel does not declare still reach the passes through its consts.
        pins = {n: v for n, v in consts.items() if n in PINS and n not in mine}
        lowering = KernelLowering(k, helpers, mine, pins)
        lowering.python_function = python_function
        try:
            kernel = lowering.lower()
            kernel.attributes["consts"].update(pins)
            check_pins(kernel.attributes["consts"], k.loc)
            check_kernel_pins(kernel, k.loc)
            m.body.append(kernel)
        except RecursionError:  # 'a + a + ... + a' a few thousand long: the tree is deeper than Python's stack
            raise TkcUnsupportedError("this statement is nested too deeply to compile; split it up",
                                      lowering.b.loc or k.loc) from None
    return m
