"""Hypothesis strategies that build random *valid* tile-dialect modules with ``Builder``.

``modules()`` draws 1-2 kernels whose parameters are tensors (symbolic and fixed dims, every
dtype) and scalars, and whose bodies are a random mix of tile ops with correctly typed
operands, nested ``tile.for`` (with carried values) and ``tile.if`` (with results), at most
one ``tile.grid``, random value name hints (None, duplicates, hints that collide with the
printer's generated ``_N`` suffixes, hints the printer cannot use) and random locations whose
file names hold quotes, backslashes, spaces and non-ASCII characters.  Every module drawn
passes ``verify`` (``modules()`` checks it).
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

from tkc import dtypes
from tkc.dtypes import bf16, f4e2m1x2, f8e4m3, f8e5m2, f8e8m0, f16, f32, i1, i32, i64
from tkc.errors import UNKNOWN, Loc
from tkc.ir.builder import Builder
from tkc.ir.core import OPS, Block, Module, Operation, Region, Value
from tkc.ir.dialects import tile as T
from tkc.ir.dialects.philox import RandOp
from tkc.ir.types import ScalarType, TensorType, TileType, Type
from tkc.ir.verifier import verify

ALL_DTYPES = [f32, f16, bf16, f8e4m3, f8e5m2, i32, i1]
FLOAT_DTYPES = [f32, f16, bf16, f8e4m3, f8e5m2]
I32 = ScalarType(i32)
I1 = ScalarType(i1)
DIMS = [1, 2, 4, 16, 64]

_BY_KIND = {"float": FLOAT_DTYPES, "int": [i32], "bool": [i1]}


def _takes(cls: type[T.ElementwiseOp]) -> list:
    """The dtypes an elementwise op takes, from its declaration."""
    return [dt for kind in ("float", "int", "bool") if kind in cls.KINDS for dt in _BY_KIND[kind]]


# op class -> dtypes it takes, by number of operands
BINARY = {c: _takes(c) for c in T.ELEMENTWISE_OPS if len(c.OPERANDS) == 2}
UNARY = {c: _takes(c) for c in T.ELEMENTWISE_OPS if len(c.OPERANDS) == 1}
TERNARY = {c: _takes(c) for c in T.ELEMENTWISE_OPS if len(c.OPERANDS) == 3}

# ------------------------------------------------------------ leaf strategies
ODD_FILES = [
    'k.tk', 'my kernel.py', 'quote"d.py', "it's.py", 'back\\slash.py', 'tab\there.py',
    'new\nline.py', 'ünïcödé/カーネル.py', '', '<stdin>', '"', '\\', 'emoji 🚀.py',
    'ctrl\x00\x1f.py', 'lone \ud800 surrogate', 'loc("x":1:2)', '}{',
]
files = st.one_of(st.sampled_from(ODD_FILES), st.text(max_size=12),
                  st.text(st.characters(codec=None), max_size=6))
locs = st.one_of(
    st.just(UNKNOWN),
    st.builds(Loc, files, st.integers(0, 10**6), st.integers(0, 10**4)),
)

ODD_HINTS = ["x", "x", "x_1", "x_1_1", "x_2", "acc", "acc_1", "0", "1", "0_1", "2", "a.b", "é",
             "_", "M", "N", "loc", "tile", "true", "nan", "ç_1"]
hints = st.one_of(
    st.none(),
    st.sampled_from(ODD_HINTS),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,5}", fullmatch=True),
    st.text(max_size=4),  # mostly unusable as a name: the printer must pick another one
)

SPECIAL_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-20, -1e-20, 1e20, 1e300, 5e-324,
                  math.inf, -math.inf, math.nan, 448.0, 57344.0, 65504.0, 0.1, -3.0e38]
float_values = st.one_of(st.sampled_from(SPECIAL_FLOATS), st.floats())
int_values = st.one_of(st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31), 64]),
                       st.integers(-(2**40), 2**40))
ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
scalar_attrs = st.one_of(st.booleans(), int_values, float_values, st.text(max_size=8))
attr_values = st.recursive(
    scalar_attrs,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(ident, inner, max_size=3)),
    max_leaves=6,
)


# ------------------------------------------------------------------ generator
class _Gen:
    """Builds one module op by op; ``scopes`` holds the values visible at the insertion point."""

    MAX_DEPTH = 2

    def __init__(self, draw: Any, require: str | None = None):
        self.draw = draw
        self.require = require  # an op name every kernel must contain
        self.b = Builder()
        self.scopes: list[list[Value]] = []
        self.depth = 0
        self.budget = draw(st.integers(4, 40))  # ops per module, all blocks together
        self.shapes: list[tuple[int, ...]] = draw(st.lists(
            st.lists(st.sampled_from(DIMS), min_size=1, max_size=3).map(tuple), min_size=1, max_size=3))

    # ------------------------------------------------------------- helpers
    def pick(self, xs: list) -> Any:
        return self.draw(st.sampled_from(xs))

    def coin(self, p: float = 0.5) -> bool:
        return self.draw(st.integers(0, 99)) < p * 100

    def visible(self) -> list[Value]:
        return [v for s in self.scopes for v in s]

    def named(self, op: Operation) -> Operation:
        for r in op.results:
            r.name_hint = self.draw(hints)
        self.scopes[-1].extend(op.results)
        return op

    def emit(self, cls: type[Operation], operands: list[Value], types: list[Type],
             attrs: dict[str, Any] | None = None, regions: list[Region] | None = None) -> Operation:
        self.budget -= 1
        return self.named(self.b.create(cls, operands, types, attrs, regions, loc=self.draw(locs)))

    def value_type(self, dts: list = ALL_DTYPES, scalar: bool | None = None) -> Type:
        dt = self.pick(dts)
        if scalar is None:
            scalar = self.coin(0.35)
        return ScalarType(dt) if scalar else TileType(self.pick(self.shapes), dt)

    def tile_type(self, dts: list = ALL_DTYPES, rank: int | None = None) -> TileType:
        shapes = [s for s in self.shapes if rank is None or len(s) == rank]
        shape = self.pick(shapes) if shapes else tuple(self.pick(DIMS) for _ in range(rank))
        return TileType(shape, self.pick(dts))

    def tensors(self) -> list[Value]:
        return [v for v in self.visible() if isinstance(v.type, TensorType)]

    # ---------------------------------------------------- operands of a type
    def get(self, t: Type) -> Value:
        """A visible value of type ``t``, or a freshly made one."""
        have = [v for v in self.visible() if v.type == t]
        if have and self.coin(0.8):
            return self.pick(have)
        return self.make(t)

    def constant_value(self, dt: dtypes.DType) -> Any:
        if dt.is_bool:
            return self.draw(st.booleans())
        if dt.is_int:
            return self.draw(int_values)
        return self.draw(st.one_of(float_values, int_values))  # an int literal is a fine float value

    def make(self, t: Type) -> Value:
        if isinstance(t, ScalarType):
            choice = self.draw(st.integers(0, 3)) if t == I32 else 0
            if choice == 1:
                return self.emit(T.ProgramIdOp, [], [I32], {"axis": self.draw(st.integers(0, 2))}).result
            if choice == 2 and self.tensors():
                tensor = self.pick([v for v in self.tensors() if v.type.rank] or [None])
                if tensor is not None:
                    axis = self.draw(st.integers(0, tensor.type.rank - 1))
                    return self.emit(T.DimOp, [tensor], [I32], {"axis": axis}).result
            return self.emit(T.ConstantOp, [], [t], {"value": self.constant_value(t.dtype)}).result
        assert isinstance(t, TileType)
        choice = self.draw(st.integers(0, 2))
        if choice == 1:
            return self.emit(T.SplatOp, [self.get(ScalarType(t.dtype))], [t]).result
        if choice == 2 and t.rank == 1 and t.dtype == i32:
            return self.emit(T.ArangeOp, [], [t], {"start": self.draw(int_values)}).result
        return self.emit(T.ConstantOp, [], [t], {"value": self.constant_value(t.dtype)}).result

    # ----------------------------------------------------------- op kinds
    def op_constant(self) -> None:
        t = self.value_type()
        self.emit(T.ConstantOp, [], [t], {"value": self.constant_value(t.dtype)})

    def op_ids(self, cls: type[Operation] | None = None) -> None:
        cls = cls or self.pick([T.ProgramIdOp, T.NumProgramsOp])
        self.emit(cls, [], [I32], {"axis": self.draw(st.integers(0, 2))})

    def op_num_sms(self) -> None:
        self.emit(T.NumSmsOp, [], [I32], {})

    def op_rank(self) -> None:
        self.emit(T.RankOp, [], [I32], {})

    def op_num_ranks(self) -> None:
        self.emit(T.NumRanksOp, [], [I32], {})

    def op_rank_barrier(self) -> None:
        # At the kernel's top level only: under an if or a loop the verifier refuses it when
        # the condition or trip count may differ across ranks (random operands often do).
        if self.depth == 0:
            self.emit(T.RankBarrierOp, [], [], {})

    def _on_ranks(self, dtype: dtypes.DType | None = None) -> list[Value]:
        """The kernel's tensor parameters declared ``@ ranks`` (of ``dtype``)."""
        return [v for v in self.kernel_op.body.args if isinstance(v.type, TensorType) and v.type.ranks
                and (dtype is None or v.type.dtype == dtype)]

    def op_peer(self) -> None:
        ts = self._on_ranks()
        if ts:
            t = self.pick(ts)
            self.emit(T.PeerOp, [t, self.get(I32)], [t.type])

    def op_wait(self) -> None:
        ts = self._on_ranks(i32)
        if ts:
            t = self.pick(ts)
            attrs = {"pred": self.pick(list(T.WAIT_PREDICATES)), "box": [1] * t.type.rank,
                     "squeeze": list(range(t.type.rank))}
            self.emit(T.WaitOp, [t, self.get(I32), *(self.get(I32) for _ in t.type.dims)], [], attrs)

    def op_dim(self) -> None:
        ts = [v for v in self.tensors() if v.type.rank]
        if ts:
            tensor = self.pick(ts)
            self.emit(T.DimOp, [tensor], [I32], {"axis": self.draw(st.integers(0, tensor.type.rank - 1))})

    def op_binary(self, cls: type[Operation] | None = None) -> None:
        cls = cls or self.pick(list(BINARY))
        t = self.value_type(BINARY[cls])
        self.emit(cls, [self.get(t), self.get(t)], [t])

    def op_unary(self, cls: type[Operation] | None = None) -> None:
        cls = cls or self.pick(list(UNARY))
        t = self.value_type(UNARY[cls])
        self.emit(cls, [self.get(t)], [t])

    def op_ternary(self, cls: type[Operation] | None = None) -> None:
        cls = cls or self.pick(list(TERNARY))
        t = self.value_type(TERNARY[cls])
        self.emit(cls, [self.get(t), self.get(t), self.get(t)], [t])

    def op_cmp(self) -> None:
        t = self.value_type()
        r = ScalarType(i1) if isinstance(t, ScalarType) else t.with_dtype(i1)
        self.emit(T.CmpOp, [self.get(t), self.get(t)], [r], {"pred": self.pick(list(T.CMP_PREDICATES))})

    def op_select(self) -> None:
        t = self.value_type()
        ct = t.with_dtype(i1) if isinstance(t, TileType) and self.coin() else I1
        self.emit(T.SelectOp, [self.get(ct), self.get(t), self.get(t)], [t])

    def op_cast(self) -> None:
        t = self.value_type()
        dt = self.pick(ALL_DTYPES)
        r = ScalarType(dt) if isinstance(t, ScalarType) else t.with_dtype(dt)
        self.emit(T.CastOp, [self.get(t)], [r])

    def op_unpack_fp4(self) -> None:
        t = self.value_type([f4e2m1x2])
        r = ScalarType(f32) if isinstance(t, ScalarType) else t.with_dtype(f32)
        self.emit(T.UnpackFp4Op, [self.get(t)], [r], {"half": self.draw(st.integers(0, 1))})

    def op_pack_fp4(self) -> None:
        t = self.value_type([f32])
        r = ScalarType(f4e2m1x2) if isinstance(t, ScalarType) else t.with_dtype(f4e2m1x2)
        self.emit(T.PackFp4Op, [self.get(t), self.get(t)], [r])

    def op_splat(self) -> None:
        t = self.tile_type()
        self.emit(T.SplatOp, [self.get(ScalarType(t.dtype))], [t])

    def op_broadcast(self) -> None:
        t = self.tile_type()
        src = t.with_shape(tuple(1 if self.coin() else d for d in t.shape))
        self.emit(T.BroadcastOp, [self.get(src)], [t])

    def op_expand_dims(self) -> None:
        t = self.tile_type()
        axis = self.draw(st.integers(0, t.rank))
        shape = list(t.shape)
        shape.insert(axis, 1)
        self.emit(T.ExpandDimsOp, [self.get(t)], [t.with_shape(tuple(shape))], {"axis": axis})

    def op_transpose(self) -> None:
        t = self.tile_type(rank=2)
        self.emit(T.TransposeOp, [self.get(t)], [t.with_shape(t.shape[::-1])])

    def op_reshape(self) -> None:
        t = self.tile_type()
        shape = (t.numel,) if t.rank == 2 or self.coin(0.5) else tuple(reversed(t.shape))
        self.emit(T.ReshapeOp, [self.get(t)], [t.with_shape(shape)])

    def op_take(self) -> None:
        t = self.tile_type(rank=2)
        axis = self.draw(st.integers(0, 1))
        self.emit(T.TakeOp, [self.get(t)], [t.with_shape(t.shape[:axis] + t.shape[axis + 1:])],
                  {"axis": axis, "index": self.draw(st.integers(0, t.shape[axis] - 1))})

    def op_stack(self) -> None:
        t = self.tile_type()
        n = self.draw(st.integers(2, 4))
        axis = self.draw(st.integers(0, t.rank))
        self.emit(T.StackOp, [self.get(t) for _ in range(n)], [t.with_shape((*t.shape[:axis], n, *t.shape[axis:]))],
                  {"axis": axis})

    def op_reduce(self) -> None:
        t = self.tile_type()
        axis = self.draw(st.integers(0, t.rank - 1))
        shape = t.shape[:axis] + t.shape[axis + 1:]
        r = t.with_shape(shape) if shape else ScalarType(t.dtype)
        kinds = T.TILE_REDUCE_KINDS if t.dtype.is_float else T.REDUCE_KINDS  # a mean takes floats
        self.emit(T.ReduceOp, [self.get(t)], [r], {"kind": self.pick(list(kinds)), "axis": axis})

    def op_scan(self) -> None:
        t = self.tile_type([d for d in ALL_DTYPES if not d.is_bool])
        axis = self.draw(st.integers(0, t.rank - 1))
        self.emit(T.ScanOp, [self.get(t)], [t], {"kind": self.pick(list(T.SCAN_KINDS)), "axis": axis})

    def op_arg_reduce(self) -> None:
        t = self.tile_type([d for d in ALL_DTYPES if not d.is_bool])
        axis = self.draw(st.integers(0, t.rank - 1))
        shape = t.shape[:axis] + t.shape[axis + 1:]
        r = TileType(shape, i32) if shape else I32
        self.emit(T.ArgReduceOp, [self.get(t)], [r], {"kind": self.pick(list(T.ARG_KINDS)), "axis": axis})

    def op_cluster_reduce(self) -> None:
        t = self.tile_type().with_dtype(f32)
        # The op combines the programs of a cluster: its kernel carries the pin.
        self.kernel_op.attributes.setdefault("consts", {})["cluster"] = self.pick([2, 4])
        self.emit(T.ClusterReduceOp, [self.get(t)], [t], {"kind": self.pick(list(T.REDUCE_KINDS))})

    def op_mma(self) -> None:
        m, k, n = (self.pick([1, 2, 16, 64]) for _ in range(3))
        if self.coin(0.25):
            da, db = self.pick([f8e4m3, f8e5m2]), self.pick([f8e4m3, f8e5m2])
        else:
            da = db = self.pick([f16, bf16, f8e4m3, f8e5m2, f32])
        acc = TileType((m, n), f32)
        self.emit(T.MmaOp, [self.get(TileType((m, k), da)), self.get(TileType((k, n), db)), self.get(acc)],
                  [acc])

    def op_dot_scaled(self) -> None:
        m, n, kb = self.pick([1, 2, 16, 64]), self.pick([1, 2, 16, 64]), self.pick([1, 2, 4])
        da, db = self.pick([f8e4m3, f8e5m2]), self.pick([f8e4m3, f8e5m2])
        acc = TileType((m, n), f32)
        self.emit(T.DotScaledOp, [self.get(TileType((m, 32 * kb), da)), self.get(TileType((m, kb), f8e8m0)),
                                  self.get(TileType((32 * kb, n), db)), self.get(TileType((kb, n), f8e8m0)),
                                  self.get(acc)], [acc])

    def op_rand(self) -> None:
        t = self.value_type([i32, i64])
        r = ScalarType(f32) if isinstance(t, ScalarType) else t.with_dtype(f32)
        self.emit(RandOp, [self.get(ScalarType(i64)), self.get(t)], [r])

    def op_arange(self) -> None:
        self.emit(T.ArangeOp, [], [TileType((self.pick(DIMS),), i32)], {"start": self.draw(int_values)})

    def _box(self, tensor: TensorType) -> tuple[dict[str, Any], Type]:
        box = [self.pick([1, 1, 2, 16, 64]) for _ in tensor.dims]
        attrs: dict[str, Any] = {"box": box}
        squeeze = [i for i, b in enumerate(box) if b == 1 and self.coin()]
        if squeeze or self.coin(0.2):
            attrs["squeeze"] = squeeze
        shape = tuple(b for i, b in enumerate(box) if i not in squeeze)
        return attrs, TileType(shape, tensor.dtype) if shape else ScalarType(tensor.dtype)

    def op_load(self) -> None:
        if not self.tensors():
            return
        tensor = self.pick(self.tensors())
        attrs, t = self._box(tensor.type)
        if self.coin(0.3):
            attrs["other"] = self.constant_value(tensor.type.dtype)
        self.emit(T.LoadOp, [tensor, *(self.get(I32) for _ in tensor.type.dims)], [t], attrs)

    def _tile_box(self) -> tuple[Value, dict[str, Any], TileType] | None:
        """A tensor of rank 1 or more and a box of it that keeps an axis (a tile, not a scalar)."""
        tensors = [v for v in self.tensors() if v.type.rank]
        if not tensors:
            return None
        tensor = self.pick(tensors)
        attrs, t = self._box(tensor.type)
        if not isinstance(t, TileType):  # every axis squeezed: keep them all instead
            attrs, t = {"box": [1] * tensor.type.rank}, TileType((1,) * tensor.type.rank, tensor.type.dtype)
        return tensor, attrs, t

    def op_masked_store(self) -> None:
        if (box := self._tile_box()) is None:
            return
        tensor, attrs, t = box
        self.emit(T.MaskedStoreOp, [tensor, self.get(t), self.get(TileType(t.shape, dtypes.i1)),
                                    *(self.get(I32) for _ in tensor.type.dims)], [], attrs)

    def op_gather(self) -> None:
        if (box := self._tile_box()) is None:
            return
        tensor, attrs, t = box
        kept = [a for a in range(tensor.type.rank) if a not in attrs.get("squeeze", [])]
        attrs["axis"] = self.pick(kept)
        index = self.get(TileType(t.shape, dtypes.i32))
        self.emit(T.GatherOp, [tensor, index, *(self.get(I32) for _ in tensor.type.dims)], [t], attrs)

    def _atomic_target(self, kind: str) -> tuple[Value, dict[str, Any], Type] | None:
        tensors = [v for v in self.tensors() if v.type.dtype.name in T.ATOMIC_KINDS[kind]]
        if not tensors:
            return None
        tensor = self.pick(tensors)
        attrs, t = self._box(tensor.type)
        if kind == "cas" and isinstance(t, TileType):
            attrs = {"box": [1] * tensor.type.rank, "squeeze": list(range(tensor.type.rank))}
            t = ScalarType(tensor.type.dtype)
        return tensor, attrs, t

    def op_atomic(self) -> None:
        kind = self.pick(["add", "max", "min", "exch"])
        target = self._atomic_target(kind)
        if target is None:
            return
        tensor, attrs, t = target
        fetch = isinstance(t, ScalarType) and self.coin()
        attrs["kind"] = kind
        attrs["sem"] = self.pick(["relaxed", "acq_rel", "acquire"] if fetch else ["relaxed", "release"])
        self.emit(T.AtomicOp, [tensor, self.get(t), *(self.get(I32) for _ in tensor.type.dims)],
                  [t] if fetch else [], attrs)

    def op_atomic_cas(self) -> None:
        target = self._atomic_target("cas")
        if target is None:
            return
        tensor, attrs, t = target
        self.emit(T.AtomicCasOp, [tensor, self.get(t), self.get(t), *(self.get(I32) for _ in tensor.type.dims)],
                  [t], attrs)

    def op_store(self) -> None:
        if not self.tensors():
            return
        tensor = self.pick(self.tensors())
        attrs, t = self._box(tensor.type)
        self.emit(T.StoreOp, [tensor, self.get(t), *(self.get(I32) for _ in tensor.type.dims)], [], attrs)

    def _region(self, arg_types: list[Type], yields: list[Type] | None) -> Region:
        """A one-block region whose body is random ops then ``tile.yield`` of ``yields``."""
        block = Block(arg_types, [self.draw(hints) for _ in arg_types])
        saved = (self.b.block, self.b.index)
        self.b.block, self.b.index = block, None
        self.scopes.append(list(block.args))
        self.depth += 1
        self.ops(self.draw(st.integers(0, 4)))
        values = [self.get(t) for t in yields or []]
        self.b.create(T.YieldOp, values, [], loc=self.draw(locs))
        self.depth -= 1
        self.scopes.pop()
        self.b.block, self.b.index = saved
        return Region([block])

    def op_for(self) -> None:
        if self.depth >= self.MAX_DEPTH:
            return
        bounds = [self.get(I32) for _ in range(3)]
        carried = [self.value_type() for _ in range(self.draw(st.integers(0, 2)))]
        init = [self.get(t) for t in carried]
        region = self._region([I32, *carried], carried)
        self.emit(T.ForOp, bounds + init, carried, regions=[region])

    def op_if(self) -> None:
        if self.depth >= self.MAX_DEPTH:
            return
        cond = self.get(I1)
        types = [self.value_type() for _ in range(self.draw(st.integers(0, 2)))]
        regions = [self._region([], types), self._region([], types)]
        self.emit(T.IfOp, [cond], types, regions=regions)

    OP_KINDS = ["op_constant", "op_ids", "op_num_sms", "op_dim", "op_binary", "op_unary", "op_ternary", "op_cmp",
                "op_select", "op_cast", "op_splat", "op_broadcast", "op_expand_dims", "op_transpose", "op_reduce",
                "op_scan", "op_arg_reduce", "op_reshape", "op_take", "op_stack", "op_mma", "op_arange", "op_load",
                "op_gather", "op_store", "op_masked_store", "op_atomic", "op_atomic_cas", "op_for", "op_if",
                "op_rank", "op_num_ranks", "op_peer", "op_wait", "op_rank_barrier",
                # weight the ops with the most structure
                "op_binary", "op_binary", "op_binary", "op_unary", "op_unary", "op_mma", "op_load",
                "op_store", "op_for", "op_if", "op_for", "op_if"]

    def ops(self, n: int) -> None:
        for _ in range(n):
            if self.budget <= 0:
                return
            getattr(self, self.pick(self.OP_KINDS))()

    # -------------------------------------------------------------- kernels
    def kernel(self, name: str) -> Operation:
        params: list[Type] = []
        for _ in range(self.draw(st.integers(0, 4))):
            dims = self.draw(st.lists(st.one_of(st.sampled_from(["M", "N", "K", "B", "H", "Ñ"]),
                                                st.sampled_from(DIMS + [3, 1000])), max_size=3))
            params.append(TensorType(self.pick(ALL_DTYPES), tuple(dims), self.coin(0.2)))
        if self.require in ("tile.peer", "tile.wait"):
            params.append(TensorType(i32, ("M", 64), ranks=True))
        if self.require in ("tile.dim", "tile.load", "tile.store", "tile.gather", "tile.masked_store"):
            params.append(TensorType(self.pick(ALL_DTYPES), ("M", 64)))
        if self.require in ("tile.atomic", "tile.atomic_cas"):
            params.append(TensorType(self.pick([dtypes.f32, dtypes.i32]), ("M", 64)))
        params += [ScalarType(self.pick(ALL_DTYPES)) for _ in range(self.draw(st.integers(0, 2)))]
        params = self.draw(st.permutations(params))
        block = Block(params, [self.draw(hints) for _ in params])
        attrs: dict[str, Any] = {"sym_name": name}
        if self.coin():
            attrs["consts"] = self.draw(st.dictionaries(ident, attr_values, max_size=4))
        op = T.KernelOp([], [], attrs, [Region([block])], self.draw(locs))
        self.kernel_op = op
        self.b.block, self.b.index = block, None
        self.scopes = [list(block.args)]
        grid_at = self.draw(st.integers(0, 2)) if self.coin(0.6) or self.require == "tile.grid" else None
        if self.require is not None:
            self.required_op(self.require)
        for part in range(3):
            if part == grid_at:
                n = self.draw(st.integers(1, 3))
                self.b.create(T.GridOp, [self.get(I32) for _ in range(n)], [], loc=self.draw(locs))
            self.ops(self.draw(st.integers(0, 6)))
        self.b.create(T.ReturnOp, [], [], loc=self.draw(locs))
        return op


    def required_op(self, name: str) -> None:
        cls = OPS[name]
        if cls in BINARY:
            self.op_binary(cls)
        elif cls in UNARY:
            self.op_unary(cls)
        elif cls in TERNARY:
            self.op_ternary(cls)
        elif cls in (T.ProgramIdOp, T.NumProgramsOp):
            self.op_ids(cls)
        elif name == "tile.yield":
            self.op_for()
        elif name not in ("tile.kernel", "tile.return", "tile.grid"):  # always there, or forced
            getattr(self, "op_" + name.split(".")[1])()


@st.composite
def modules(draw: Any, require: str | None = None) -> Module:
    """A random module of 1-2 kernels that passes ``verify``; with ``require``, each kernel
    contains at least one op of that name."""
    gen = _Gen(draw, require)
    names = draw(st.lists(ident, min_size=1, max_size=2, unique=True))
    m = Module([gen.kernel(n) for n in names])
    verify(m)  # a generator bug, not an IR bug, if this fails
    assert require is None or any(op.name == require for op in m.walk())
    return m
