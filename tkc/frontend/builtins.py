"""The builtin functions of the tile language: ``zeros``, ``program_id``,
``where``, ``exp``, ``load``...  Each takes the lowering, the call node and its
evaluated arguments and returns a value; typing goes through ``emit``."""

from __future__ import annotations

from collections.abc import Callable

from tkc import dtypes
from tkc.errors import TkcTypeError
from tkc.frontend.emit import check_const, check_tile_dims
from tkc.frontend.values import NO_SCALE, NONE, REQUIRED, Const, DTypeName, Dyn, View
from tkc.ir.dialects import elementwise as E
from tkc.ir.dialects import tile as T
from tkc.ir.dialects.philox import RandOp
from tkc.ir.types import ScalarType, TileType
from tkc.pins import is_cluster_size

#: One-operand elementwise functions, also methods (``x.exp()``): from the op declarations.
MATH_FUNCS = tuple(n for n, c in E.FUNCTIONS.items() if len(c.OPERANDS) == 1)


def _program_id(lw, e, args, kwargs, op=T.ProgramIdOp, what="program_id()"):
    a = lw.bind(what, e, args, kwargs, [("axis", REQUIRED)])
    axis = lw.const_int(a["axis"], "the axis", e)
    if axis not in (0, 1, 2):
        raise TkcTypeError(f"{what} axis must be 0, 1 or 2, got {axis}", e.loc)
    return Dyn(lw.b.value(op, [], T.I32, {"axis": axis}, loc=e.loc))


def _num_programs(lw, e, args, kwargs):
    return _program_id(lw, e, args, kwargs, T.NumProgramsOp, "num_programs()")


def _binary_builtin(op: str) -> Callable:
    def impl(lw, e, args, kwargs):
        if op in ("max", "min") and (len(args) + len(kwargs) != 2 or "axis" in kwargs or "keepdim" in kwargs):
            a = lw.bind(f"{op}()", e, args, kwargs, [("x", REQUIRED), ("axis", REQUIRED),
                                                     ("keepdim", Const(False))])
            return lw._reduce(op, a["x"], a, e)
        a = lw.bind(f"{op}()", e, args, kwargs, [("a", REQUIRED), ("b", REQUIRED)])
        x, y = lw.value_of(a["a"], e), lw.value_of(a["b"], e)
        if op in ("max", "min") and not kwargs and isinstance(x, Dyn) and isinstance(x.type, TileType) \
                and isinstance(y, Const) and isinstance(y.value, int) and not isinstance(y.value, bool):
            # torch's max(x, 1) reduces along axis 1, sum(x, 1) does here: the elementwise
            # reading would be silently different
            raise TkcTypeError(f"{op}(x, {y.value}) of a tile: write x.{op}({y.value}) (or {op}(x, axis={y.value})) "
                               f"for the {op}imum along axis {y.value}, or {op}imum(x, {y.value}) for the "
                               f"elementwise {op}imum", e.loc)
        return lw.em.binary(op, x, y, e.loc)
    return impl


def _reduction(kind: str) -> Callable:
    def impl(lw, e, args, kwargs):
        a = lw.bind(f"{kind}()", e, args, kwargs, [("x", REQUIRED), ("axis", REQUIRED), ("keepdim", Const(False))])
        return lw._reduce(kind, a["x"], a, e)
    return impl


def _scan(name: str) -> Callable:
    def impl(lw, e, args, kwargs):
        a = lw.bind(f"{name}()", e, args, kwargs, [("x", REQUIRED), ("axis", REQUIRED)])
        return lw.scan(name, a["x"], a, e)
    return impl


def _function(name: str) -> Callable:
    """An elementwise function of three or more operands (``fma(a, b, c)``)."""
    params = [(p, REQUIRED) for p in E.FUNCTIONS[name].OPERANDS]

    def impl(lw, e, args, kwargs):
        a = lw.bind(f"{name}()", e, args, kwargs, params)
        return lw.em.call(name, [lw.value_of(a[p], e) for p, _ in params], e.loc)
    return impl


def _math(name: str) -> Callable:
    def impl(lw, e, args, kwargs):
        a = lw.bind(f"{name}()", e, args, kwargs, [("x", REQUIRED)])
        return lw.em.unary(name, lw.value_of(a["x"], e), e.loc)
    return impl


def _full_like(fill: object | None) -> Callable:
    def impl(lw, e, args, kwargs):
        what = "full()" if fill is None else ("zeros()" if fill == 0 else "ones()")
        spec = [("shape", REQUIRED)] + ([("value", REQUIRED)] if fill is None else []) + \
            [("dtype", DTypeName(dtypes.f32))]
        a = lw.bind(what, e, args, kwargs, spec)
        if fill is None and isinstance(a["value"], DTypeName):
            raise TkcTypeError("full() is missing the fill value: full(shape, value, dtype)", e.loc)
        shape = lw.shape_arg(a["shape"], e)
        dt = lw.dtype_arg(a["dtype"], e)
        t = TileType(shape, dt)
        v = Const(fill) if fill is not None else lw.value_of(a["value"], e)
        if isinstance(v, Const):
            if fill is None and not (dt.is_float and isinstance(v.value, (int, bool))):  # ones([..], f32)
                check_const(v, dt, e.loc)  # zeros/ones fit every dtype, bool included
            return lw.em.constant(v.value, t, e.loc)
        if isinstance(v.type, TileType):
            raise TkcTypeError(f"{what} fills with a scalar, got {v.type}", e.loc)
        return lw.em.splat(lw.em.cast(v, dt, e.loc), t, e.loc)
    return impl


def _arange(lw, e, args, kwargs):
    a = lw.bind("arange()", e, args, kwargs, [("start", REQUIRED), ("stop", None)])
    start, stop = a["start"], a["stop"]
    if stop is None:
        start, stop = Const(0), start
    lo = lw.const_int(start, "arange() start", e)
    hi = lw.const_int(stop, "arange() stop", e)
    n = hi - lo
    check_tile_dims((n,), "arange()", e.loc)
    return Dyn(lw.b.value(T.ArangeOp, [], TileType((n,), dtypes.i32), {"start": lo}, loc=e.loc))


def _where(lw, e, args, kwargs):
    a = lw.bind("where()", e, args, kwargs, [("cond", REQUIRED), ("a", REQUIRED), ("b", REQUIRED)])
    c = lw.value_of(a["cond"], e)
    return lw.em.select(c, lw.value_of(a["a"], e), lw.value_of(a["b"], e), e.loc)


def _dot_scaled(lw, e, args, kwargs):
    names = ("a", "a_scale", "b", "b_scale")
    a = lw.bind("dot_scaled()", e, args, kwargs, [(n, REQUIRED) for n in names])
    if a["a_scale"] is NO_SCALE and a["b_scale"] is NO_SCALE:
        raise TkcTypeError("dot_scaled() without scales on either side is a plain product: write a @ b", e.loc)
    xs = [None if a[n] is NO_SCALE else lw.value_of(a[n], e) for n in names]
    for n, x in zip(names, xs):
        if x is not None and (not isinstance(x, Dyn) or not isinstance(x.type, TileType)):
            raise TkcTypeError(f"dot_scaled() needs tiles; {n} is {lw._kind(x)}", e.loc)
    return lw.em.dot_scaled(*xs, e.loc)


#: Builtins that take ``None`` as an argument (``NO_SCALE``).
NONE_ARGUMENTS = frozenset({"dot_scaled"})


def _load(lw, e, args, kwargs):
    a = lw.bind("load()", e, args, kwargs, [("view", REQUIRED), ("other", None)])
    if not isinstance(a["view"], View):
        raise TkcTypeError(f"load() takes a tensor slice like x[i*BM:(i+1)*BM, :], got "
                           f"{lw._kind(a['view'])}", e.loc)
    return lw.load(a["view"], a["other"])


def _store(lw, e, args, kwargs):
    a = lw.bind("store()", e, args, kwargs, [("view", REQUIRED), ("value", REQUIRED), ("mask", None)])
    if not isinstance(a["view"], View):
        raise TkcTypeError(f"store() takes a tensor slice like y[i*BM:(i+1)*BM, :], got "
                           f"{lw._kind(a['view'])}", e.loc)
    value = lw.load(a["value"], None) if isinstance(a["value"], View) else a["value"]
    lw.store(a["view"], value, e.loc, a["mask"])
    return NONE


def _cluster_reduce(kind: str) -> Callable:
    def impl(lw, e, args, kwargs):
        a = lw.bind(f"cluster_{kind}()", e, args, kwargs, [("x", REQUIRED)])
        x = lw.value_of(a["x"], e)
        if not isinstance(x, Dyn) or not isinstance(x.type, TileType) or x.type.dtype != dtypes.f32:
            raise TkcTypeError(f"cluster_{kind}() combines an f32 tile across a cluster's programs, "
                               f"got {x.type if isinstance(x, Dyn) else 'a constant'}", e.loc)
        cluster = lw.kernel_consts.get("cluster")
        if not is_cluster_size(cluster) or cluster < 2:
            given = "" if cluster in (None, 1) else f" (cluster = {cluster!r} was given)"
            raise TkcTypeError(f"cluster_{kind}() combines the programs of a cluster: declare or pass the "
                               f"pin cluster (2 or 4){given}", e.loc)
        return Dyn(lw.b.value(T.ClusterReduceOp, [x.value], x.type, {"kind": kind}, loc=e.loc))
    return impl


def _atomic(kind: str) -> Callable:
    values = [("expected", REQUIRED), ("value", REQUIRED)] if kind == "cas" else [("value", REQUIRED)]

    def impl(lw, e, args, kwargs):
        a = lw.bind(f"atomic_{kind}()", e, args, kwargs, [("view", REQUIRED), *values, ("sem", None)])
        return lw.atomic(kind, a["view"], [a[n] for n, _ in values], a["sem"], e)
    return impl


def _rand(lw, e, args, kwargs):
    a = lw.bind("rand()", e, args, kwargs, [("seed", REQUIRED), ("offset", REQUIRED)])
    seed, off = lw.value_of(a["seed"], e), lw.value_of(a["offset"], e)
    for v, what in ((seed, "seed"), (off, "offset")):
        t = ScalarType(dtypes.i32) if isinstance(v, Const) and type(v.value) is int else getattr(v, "type", None)
        if t is None or t.dtype not in (dtypes.i32, dtypes.i64) or (what == "seed" and isinstance(t, TileType)):
            kind = "an i32 or i64 scalar" if what == "seed" else "i32 or i64 offsets (a scalar or a tile)"
            raise TkcTypeError(f"rand() takes {kind} as its {what}, got {t if t is not None else lw._kind(v)}", e.loc)
    off = lw.em.cast(off, dtypes.i32, e.loc) if isinstance(off, Const) else off
    rt = off.type.with_dtype(dtypes.f32) if isinstance(off.type, TileType) else ScalarType(dtypes.f32)
    return Dyn(lw.b.value(RandOp, [lw.em.cast(seed, dtypes.i64, e.loc).value, off.value], rt, loc=e.loc))


def _rank(op, what: str) -> Callable:
    """A builtin of no arguments that is one i32 of the launch (rank(), num_ranks(), num_sms())."""
    def impl(lw, e, args, kwargs):
        lw.bind(what, e, args, kwargs, [])
        return Dyn(lw.b.value(op, [], T.I32, loc=e.loc))
    return impl


def _signal(lw, e, args, kwargs):
    a = lw.bind("signal()", e, args, kwargs, [("flag", REQUIRED), ("value", REQUIRED), ("sem", None)])
    return lw.signal(a["flag"], a["value"], a["sem"], e)


def _barrier_all(lw, e, args, kwargs):
    lw.bind("barrier_all()", e, args, kwargs, [])
    lw.b.create(T.RankBarrierOp, loc=e.loc)
    return NONE


def _cdiv(lw, e, args, kwargs):
    a = lw.bind("cdiv()", e, args, kwargs, [("a", REQUIRED), ("b", REQUIRED)])
    return lw.em.binary("cdiv", lw.value_of(a["a"], e), lw.value_of(a["b"], e), e.loc)


BUILTIN_IMPLS: dict[str, Callable] = {
    "program_id": _program_id, "num_programs": _num_programs, "cdiv": _cdiv, "rand": _rand,
    "rank": _rank(T.RankOp, "rank()"), "num_ranks": _rank(T.NumRanksOp, "num_ranks()"), "signal": _signal,
    "barrier_all": _barrier_all, "num_sms": _rank(T.NumSmsOp, "num_sms()"),
    "zeros": _full_like(0), "ones": _full_like(1), "full": _full_like(None), "arange": _arange,
    **{f"atomic_{kind}": _atomic(kind) for kind in T.ATOMIC_KINDS},
    "where": _where, "dot_scaled": _dot_scaled, "load": _load, "store": _store,
    "sum": _reduction("sum"), "mean": _reduction("mean"),
    "argmax": _reduction("argmax"), "argmin": _reduction("argmin"),
    "cumsum": _scan("cumsum"), "cumprod": _scan("cumprod"),
    **{f"cluster_{kind}": _cluster_reduce(kind) for kind in ("max", "min", "sum")},
    "maximum": _binary_builtin("maximum"), "minimum": _binary_builtin("minimum"),
    "max": _binary_builtin("max"), "min": _binary_builtin("min"),
    **{name: _math(name) for name in MATH_FUNCS},
    **{name: _function(name) for name, c in E.FUNCTIONS.items() if len(c.OPERANDS) > 2},
}
