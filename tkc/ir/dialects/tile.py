"""The ``tile`` dialect: target-independent tile programs.

What the frontend emits and the interpreter runs.  Elementwise and math ops
work on scalars and tiles alike (operands of one type; the frontend inserts
``splat``/``broadcast``/``cast`` to make them agree).  Shapes are static;
tensor sizes are runtime values read with ``tile.dim``.
"""

from __future__ import annotations

from tkc import dtypes
from tkc.errors import TkcVerifyError
from tkc.ir.core import Operation, Region, Value, register
from tkc.ir.dialects.elementwise import *  # noqa: F403  (the elementwise ops are tile ops)
from tkc.ir.dialects.elementwise import CMP_PREDICATES, ELEMENTWISE_OPS, constant_value, is_value_type  # noqa: F401
from tkc.pins import MAX_CLUSTER, is_cluster_size
from tkc.ir.types import ScalarType, TensorType, TileType, Type, shape_of

I32 = ScalarType(dtypes.i32)
I64 = ScalarType(dtypes.i64)
I1 = ScalarType(dtypes.i1)


def _same_elements(a: Type, b: Type) -> bool:
    """Equal types up to where a tile lives: shape-changing ops may change a tile's layout
    (select-layouts gives a reduction the slice of its operand's layout); whether the
    layouts fit is the hopper dialect's check."""
    if isinstance(a, TileType) and isinstance(b, TileType):
        return a.shape == b.shape and a.dtype == b.dtype
    return a == b


# ------------------------------------------------------------------ structure
@register
class KernelOp(Operation):
    """A kernel.  Its block's arguments are the kernel's parameters; its
    ``consts`` are the compile-time constants it was specialized with; ``choices`` the
    candidates of those declared ``choose(...)`` and left to tkc.schedule (the value in
    ``consts`` is the first)."""

    name = "tile.kernel"
    SURFACE = '@kernel def f(...)'
    EXAMPLE = '@kernel  def gemm(a: bf16[M, K], b: bf16[K, N], c: bf16[M, N], BM: const = 128):'
    # threads / target / smem_bytes / tma_maps / cluster: set by the Hopper passes (docs/hopper.md
    # section 4; target: the GPU select-layouts chose the layouts for).
    ATTRS = {"sym_name": str, "consts?": dict, "choices?": dict, "threads?": int, "target?": str,
             "smem_bytes?": int, "tma_maps?": list, "cluster?": int}
    REGIONS = 1
    TRAITS = frozenset({"isolated"})

    @property
    def body(self):
        return self.regions[0].block

    def verify(self) -> None:
        term = self.body.terminator
        if term is None or term.name != "tile.return":
            raise self.error("kernel body must end with 'tile.return'")
        for a in self.body.args:
            if not isinstance(a.type, (TensorType, ScalarType)):
                raise self.error(f"kernel parameters are tensors or scalars, got {a.type}")
        grids = [op for op in self.body.ops if op.name == "tile.grid"]
        if len(grids) > 1:
            raise grids[1].error("a kernel has at most one launch grid")
        if not is_cluster_size(self.attributes.get("cluster", 1)):
            raise self.error(f"cluster = {self.attributes['cluster']}: a cluster has a power of two of CTAs, "
                             f"at most {MAX_CLUSTER}")
        made_for = self.attributes.get("target")
        if made_for is not None:
            from tkc.target import TARGETS

            if made_for not in TARGETS:
                raise self.error(f"target = {made_for!r}: the kernel was laid out for a GPU tkc does not compile for "
                                 f"({', '.join(TARGETS)})")


@register
class ReturnOp(Operation):
    """Ends a kernel body."""

    name = "tile.return"
    SURFACE = "(the end of a kernel's body)"
    EXAMPLE = ''
    TRAITS = frozenset({"terminator"})

    def verify(self) -> None:
        parent = self.parent.parent_op if self.parent else None
        if parent is None or parent.name != "tile.kernel":
            raise self.error("'tile.return' ends a kernel body only")


@register
class YieldOp(Operation):
    """Ends a loop body, a branch or a role: the values it carries out."""

    name = "tile.yield"
    SURFACE = '(the end of a loop body or a branch)'
    EXAMPLE = ''
    OPERANDS = ("*values",)
    TRAITS = frozenset({"terminator"})

    def verify(self) -> None:
        parent = self.parent.parent_op if self.parent else None
        if parent is None or parent.name not in ("tile.for", "tile.if", "hopper.role"):
            raise self.error("'tile.yield' ends a 'tile.for', 'tile.if' or 'hopper.role' region only")
        want = [r.type for r in parent.results]
        got = [v.type for v in self.operands]
        if want != got:
            raise self.error(f"yields ({', '.join(map(str, got))}) but '{parent.name}' "
                             f"results are ({', '.join(map(str, want))})")


@register
class GridOp(Operation):
    """The launch grid: 1-3 extents, computed from dims and constants only."""

    name = "tile.grid"
    SURFACE = 'grid'
    EXAMPLE = 'grid(cdiv(M, BM), cdiv(N, BN))'
    OPERANDS = ("*extents",)

    def verify(self) -> None:
        parent = self.parent.parent_op if self.parent else None
        if parent is None or parent.name != "tile.kernel":
            raise self.error("the grid belongs in the kernel body, outside loops and branches")
        if not 1 <= len(self.operands) <= 3:
            raise self.error("takes 1 to 3 extents")
        if any(v.type != I32 for v in self.operands):
            raise self.error("grid extents are i32 scalars")


@register
class ForOp(Operation):
    """``for iv in range(lb, ub, step)`` carrying ``init`` values through the
    loop; the block's arguments are (iv, carried...), and the results are the
    carried values after the last iteration."""

    name = "tile.for"
    SURFACE = 'for ... in range / static_range'
    EXAMPLE = 'for k in range(cdiv(K, BK)):'
    OPERANDS = ("lb", "ub", "step", "*init")
    RESULTS = ("*results",)
    REGIONS = 1

    @property
    def body(self):
        return self.regions[0].block

    def verify(self) -> None:
        g = self.operand_groups()
        for v in (g["lb"], g["ub"], g["step"]):
            if v.type != I32:
                raise self.error("loop bounds and step are i32 scalars")
        init_types = [v.type for v in g["init"]]
        if [r.type for r in self.results] != init_types:
            raise self.error("result types must match the carried values' types")
        arg_types = [a.type for a in self.body.args]
        if arg_types != [I32, *init_types]:
            raise self.error("body arguments must be (i32 induction variable, carried values...)")


def innermost_uncapped(loop: Operation) -> bool:
    """Whether the ``tile.for`` ``loop`` holds no other loop and its trip count is not capped
    by a constant (a ring's prologue, ``range(min(S - 1, trip))``): the loops where taking a
    runtime division out of every iteration pays (codegen's reciprocal form, the pass
    ``count-divisions``).  A loop around another runs its divisions once an inner run, where the
    registers a cheaper form holds are worth more."""
    if any(inner is not loop and inner.name == "tile.for" for inner in loop.walk()):
        return False
    ub = loop.operands[1]
    owner = getattr(ub, "owner", None)
    return not (owner is not None and owner.name == "tile.minimum"
                and any(constant_value(x) is not None for x in owner.operands))  # noqa: F405


@register
class IfOp(Operation):
    """Two regions (then, else), each ending in ``tile.yield`` of the results."""

    name = "tile.if"
    SURFACE = 'if / else'
    EXAMPLE = 'if pn <= pm:'
    OPERANDS = ("cond",)
    RESULTS = ("*results",)
    REGIONS = 2

    @classmethod
    def of(cls, cond, then, otherwise, result_types=(), loc=None) -> IfOp:
        """``if cond: then else: otherwise`` (two blocks, each ending in its ``tile.yield``)."""
        op = cls([cond], list(result_types), **({} if loc is None else {"loc": loc}))
        for blk in (then, otherwise):
            op.regions.append(Region([blk]))
            op.regions[-1].parent = op
        return op

    def verify(self) -> None:
        if self.cond.type != I1:
            raise self.error(f"condition must be an i1 scalar, got {self.cond.type}")
        for r in self.regions:
            if r.block.args:
                raise self.error("branches take no arguments")


# ---------------------------------------------------------- scalars and ids
@register
class ProgramIdOp(Operation):
    """``program_id(axis)``: this program's index along a grid axis."""

    name = "tile.program_id"
    SURFACE = 'program_id'
    EXAMPLE = 'pm = program_id(0)'
    RESULTS = ("result",)
    ATTRS = {"axis": int}
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        if self.axis not in (0, 1, 2) or self.result.type != I32:
            raise self.error("axis must be 0, 1 or 2 and the result i32")


@register
class NumProgramsOp(ProgramIdOp):
    """``num_programs(axis)``: the grid's extent along an axis."""

    name = "tile.num_programs"
    SURFACE = 'num_programs'
    EXAMPLE = 'step = num_programs(0)'


@register
class NumSmsOp(Operation):
    """The number of streaming multiprocessors of the device running the kernel (what a
    persistent kernel sizes its grid by).  The interpreter and the emulator pretend to have
    ``tkc.semantics.CPU_SMS``."""

    name = "tile.num_sms"
    SURFACE = 'num_sms'
    EXAMPLE = 'grid(num_sms())'
    RESULTS = ("result",)
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        if self.result.type != I32:
            raise self.error("the result is an i32")


@register
class DimOp(Operation):
    """The runtime size of one axis of a tensor parameter."""

    name = "tile.dim"
    SURFACE = "(a tensor's dim name)"
    EXAMPLE = 'n = N.to(f32)'
    OPERANDS = ("tensor",)
    RESULTS = ("result",)
    ATTRS = {"axis": int}
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        t = self.tensor.type
        if not isinstance(t, TensorType) or not 0 <= self.axis < t.rank:
            raise self.error(f"axis {self.axis} is not an axis of {t}")
        if self.result.type != I32:
            raise self.error("result must be i32")


@register
class ArangeOp(Operation):
    """The 1-D i32 tile [start, start + n)."""

    name = "tile.arange"
    SURFACE = 'arange'
    EXAMPLE = 'rows = r + arange(BM)'
    RESULTS = ("result",)
    ATTRS = {"start": int}
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        t = self.result.type
        if not isinstance(t, TileType) or t.rank != 1 or t.dtype != dtypes.i32:
            raise self.error(f"result must be a 1-D i32 tile, got {t}")


# -------------------------------------------------------------- elementwise
# Math and logic ops, one class each, live in tkc/ir/dialects/elementwise.py.

@register
class CastOp(Operation):
    """Convert elements to another dtype (round-to-nearest-even for floats,
    saturating for fp8; the magnitude to a power of two for f8e8m0, tkc/dtypes.py; truncation
    toward zero for float -> int)."""

    name = "tile.cast"
    SURFACE = 'x.to(dtype)'
    EXAMPLE = 'c[r:r+BM, 0:BN] = acc.to(bf16)'
    OPERANDS = ("x",)
    RESULTS = ("result",)
    TRAITS = frozenset({"pure", "elementwise"})

    def verify(self) -> None:
        a, r = self.x.type, self.result.type
        if not is_value_type(a) or type(a) is not type(r) or shape_of(a) != shape_of(r):
            raise self.error(f"casts keep the shape: {a} -> {r}")
        if a.dtype.is_packed or r.dtype.is_packed:
            raise self.error(f"FP4 pairs are not cast but unpacked and packed (tile.unpack_fp4, tile.pack_fp4): "
                             f"{a} -> {r}")


@register
class UnpackFp4Op(Operation):
    """One value of each ``f4e2m1x2`` pair as f32: the first (``half`` 0, the low nibble) or
    the second (``half`` 1).  ``x.to(f32)`` of a tile of pairs [..., C] is the two halves
    stacked and reshaped to [..., 2C] (:func:`unpacked_fp4`)."""

    name = "tile.unpack_fp4"
    SURFACE = 'x.to(f32) of an f4e2m1x2 tile'
    EXAMPLE = 'w = wt.to(f32)'
    OPERANDS = ("x",)
    RESULTS = ("result",)
    ATTRS = {"half": int}
    TRAITS = frozenset({"pure", "elementwise"})

    def verify(self) -> None:
        a, r = self.x.type, self.result.type
        if not is_value_type(a) or a.dtype != dtypes.f4e2m1x2 or r != _with_dtype(a, dtypes.f32):
            raise self.error(f"unpacks an f4e2m1x2 scalar or tile into f32 of its shape: {a} -> {r}")
        if self.half not in (0, 1):
            raise self.error(f"half is 0 (the low nibble) or 1, got {self.half}")


@register
class PackFp4Op(Operation):
    """Two f32 values rounded to E2M1 (to nearest even, saturating at ±6; tkc/dtypes.py) as
    one ``f4e2m1x2`` pair, ``lo`` in the low nibble.  ``x.to(f4e2m1x2)`` of a float tile
    [..., 2C] packs its even and odd columns (:func:`packed_fp4`)."""

    name = "tile.pack_fp4"
    SURFACE = 'x.to(f4e2m1x2)'
    EXAMPLE = 'q[r:r+BM, 0:BK // 2] = (xt / scale).to(f4e2m1x2)'
    OPERANDS = ("lo", "hi")
    RESULTS = ("result",)
    TRAITS = frozenset({"pure", "elementwise"})

    def verify(self) -> None:
        a, c, r = self.lo.type, self.hi.type, self.result.type
        if not is_value_type(a) or a.dtype != dtypes.f32 or c != a or r != _with_dtype(a, dtypes.f4e2m1x2):
            raise self.error(f"packs two f32 values of one shape into f4e2m1x2: {a}, {c} -> {r}")


def _with_dtype(t: Type, dt: dtypes.DType) -> Type:
    return t.with_dtype(dt) if isinstance(t, TileType) else ScalarType(dt)


def unpacked_fp4(b, x: Value, axis: int, loc=None) -> Value:
    """The f32 values of the ``f4e2m1x2`` tile ``x`` whose pairs run along ``axis``: each
    pair's two values side by side on that axis (twice its extent), the first of the pair
    first.  Two ``tile.unpack_fp4`` of the tile, stacked on a new axis after ``axis`` and
    reshaped: ops that select-layouts gives each thread whole pairs of."""
    t = x.type
    halves = [b.value(UnpackFp4Op, [x], t.with_dtype(dtypes.f32), {"half": h}, loc=loc) for h in (0, 1)]
    shape = (*t.shape[:axis + 1], 2, *t.shape[axis + 1:])
    both = b.value(StackOp, halves, TileType(shape, dtypes.f32), {"axis": axis + 1}, loc=loc)
    wide = (*t.shape[:axis], 2 * t.shape[axis], *t.shape[axis + 1:])
    return b.value(ReshapeOp, [both], TileType(wide, dtypes.f32), loc=loc)


def packed_fp4(b, x: Value, loc=None) -> Value:
    """The f32 tile ``x`` [..., 2C] as ``f4e2m1x2`` pairs [..., C] of its even and odd columns."""
    t = x.type
    pairs = (*t.shape[:-1], t.shape[-1] // 2)
    r = b.value(ReshapeOp, [x], TileType((*pairs, 2), dtypes.f32), loc=loc)
    lo, hi = (b.value(TakeOp, [r], TileType(pairs, dtypes.f32), {"axis": len(pairs), "index": i}, loc=loc)
              for i in (0, 1))
    return b.value(PackFp4Op, [lo, hi], TileType(pairs, dtypes.f4e2m1x2), loc=loc)


# ------------------------------------------------------------------- shapes
@register
class SplatOp(Operation):
    """A tile with every element equal to a scalar."""

    name = "tile.splat"
    SURFACE = 'full (of a runtime scalar); a scalar broadcast against a tile'
    EXAMPLE = 'b = full([BM, 1], bias_value, f32)'
    OPERANDS = ("x",)
    RESULTS = ("result",)
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        a, r = self.x.type, self.result.type
        if not isinstance(a, ScalarType) or not isinstance(r, TileType) or a.dtype != r.dtype:
            raise self.error(f"splats a scalar to a tile of its dtype: {a} -> {r}")


@register
class BroadcastOp(Operation):
    """Repeat size-1 axes to the result shape (same rank)."""

    name = "tile.broadcast"
    SURFACE = '(numpy broadcasting)'
    EXAMPLE = 'y = x * w[None, :]'
    OPERANDS = ("x",)
    RESULTS = ("result",)
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        a, r = self.x.type, self.result.type
        if not (isinstance(a, TileType) and isinstance(r, TileType)) or a.dtype != r.dtype \
                or a.rank != r.rank or any(s != d and s != 1 for s, d in zip(a.shape, r.shape)):
            raise self.error(f"cannot broadcast {a} to {r}")


@register
class ExpandDimsOp(Operation):
    """Insert a size-1 axis at ``axis``."""

    name = "tile.expand_dims"
    SURFACE = 'x[:, None], x[None, :]'
    EXAMPLE = 's = s - m[:, None]'
    OPERANDS = ("x",)
    RESULTS = ("result",)
    ATTRS = {"axis": int}
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        a, r = self.x.type, self.result.type
        if not isinstance(a, TileType) or not isinstance(r, TileType):
            raise self.error("operates on tiles")
        want = list(a.shape)
        if not 0 <= self.axis <= a.rank:
            raise self.error(f"axis {self.axis} out of range for {a}")
        want.insert(self.axis, 1)
        if not _same_elements(r, a.with_shape(tuple(want))):
            raise self.error(f"result must be {a.with_shape(tuple(want))}, got {r}")


@register
class TransposeOp(Operation):
    """``x.T``: a 2-D tile transposed.  A shared tile's is a view of its bytes (a wgmma operand);
    a register tile's keeps every value in its register (``#transpose<...>`` of the operand's
    layout, ``tkc.ir.layouts.transposes``): it moves nothing."""

    name = "tile.transpose"
    SURFACE = 'x.T'
    EXAMPLE = 's = q @ k.T'
    OPERANDS = ("x",)
    RESULTS = ("result",)
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        from tkc.ir.layouts import transposes

        a, r = self.x.type, self.result.type
        if not isinstance(a, TileType) or a.rank != 2 or not _same_elements(r, a.with_shape(a.shape[::-1])):
            raise self.error(f"transposes a 2-D tile: {a} -> {r}")
        if a.space == "reg" and r.space == "reg" and a.layout is not None and r.layout is not None \
                and not transposes(a.layout, r.layout):
            raise self.error(f"{r.layout} does not hold the transpose of {a.layout} in the same registers")


@register
class ReshapeOp(Operation):
    """``x.reshape(shape)``: the same elements in row-major order as a tile of another shape.
    Once tiles have register layouts, each thread must hold its values in the same registers
    (``tkc.ir.layouts.same_registers``): a reshape moves nothing."""

    name = "tile.reshape"
    SURFACE = 'x.reshape'
    EXAMPLE = 'y = x.reshape([64, 2])'
    OPERANDS = ("x",)
    RESULTS = ("result",)
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        from tkc.ir.layouts import same_registers

        a, r = self.x.type, self.result.type
        if not (isinstance(a, TileType) and isinstance(r, TileType)) or a.dtype != r.dtype or a.numel != r.numel:
            raise self.error(f"reshapes keep the dtype and the element count: {a} -> {r}")
        if a.space == "reg" and r.space == "reg" and a.layout is not None and r.layout is not None \
                and not same_registers(a.layout, r.layout):
            raise self.error(f"{a.layout} and {r.layout} hold different elements in the same registers")


def _check_takes(op: Operation, whole: TileType, part: TileType, axis: int) -> None:
    """Register layouts of ``tile.take``/``tile.stack``: the part's is the slice of the whole's
    along ``axis``, which each thread holds whole (``tkc.ir.layouts.take_registers``)."""
    from tkc.ir.layouts import picked_registers

    if whole.space != "reg" or part.space != "reg" or whole.layout is None or part.layout is None:
        return
    if picked_registers(whole.layout, part.layout, axis, 0) is None:
        raise op.error(f"{part.layout} is not {whole.layout} without axis {axis}, held whole in each "
                       f"thread's registers")


@register
class TakeOp(Operation):
    """``x[:, index]`` on ``axis``: the elements at ``index`` (a constant) along ``axis``, which
    is dropped.  With register layouts each thread holds that axis whole and the result is in
    the slice of the operand's layout along it: a take picks registers, it moves nothing.  A
    slice of a register tile (``acc[:, 0:64]`` of a 128-column tile) is a reshape and a take;
    the pass ``merge-steps`` makes takes of stepped slices (``x[:, 0:D:2]``) read as one range."""

    name = "tile.take"
    SURFACE = 'x[:, i], x[i, :]'
    EXAMPLE = 'col = t[:, 5]'
    OPERANDS = ("x",)
    RESULTS = ("result",)
    ATTRS = {"axis": int, "index": int}
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        a, r = self.x.type, self.result.type
        if not isinstance(a, TileType) or a.rank < 2 or not 0 <= self.axis < a.rank \
                or not _same_elements(r, a.with_shape(a.shape[:self.axis] + a.shape[self.axis + 1:])):
            raise self.error(f"takes the elements at one index of an axis of a tile of rank 2 or more, dropping "
                             f"the axis: {a} -> {r}")
        if not 0 <= self.index < a.shape[self.axis]:
            raise self.error(f"index {self.index} out of range for axis {self.axis} of {a}")
        _check_takes(self, a, r, self.axis)


@register
class StackOp(Operation):
    """Tiles of one type as the elements of a new axis (element ``p`` of it from ``xs[p]``);
    not written in kernels (the language has no ``stack``).  With register layouts the operands
    are in the slice of the result's layout along that axis, which each thread holds whole: a
    stack moves nothing.  The pass ``merge-steps`` makes it from stepped slices stored together
    (``y[:, 0:D:2] = a``, ``y[:, 1:D:2] = b``)."""

    name = "tile.stack"
    SURFACE = '(made by the compiler)'
    EXAMPLE = ''
    OPERANDS = ("*xs",)
    RESULTS = ("result",)
    ATTRS = {"axis": int}
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        xs, r = list(self.operands), self.result.type
        first = xs[0].type if xs else None
        ok = len(xs) >= 2 and all(isinstance(x.type, TileType) for x in xs) and isinstance(r, TileType) \
            and all(_same_elements(x.type, first) for x in xs) and 0 <= self.axis <= first.rank
        if not ok or not _same_elements(r, first.with_shape((*first.shape[:self.axis], len(xs),
                                                              *first.shape[self.axis:]))):
            raise self.error(f"stacks two or more tiles of one shape and dtype along a new axis {self.axis}, got "
                             f"{', '.join(str(x.type) for x in xs)} -> {r}")
        for x in xs:
            _check_takes(self, r, x.type, self.axis)


REDUCE_KINDS = ("sum", "max", "min")
#: What ``tile.reduce`` computes: the kinds every level has, and ``mean`` (a float sum over the
#: axis divided by its extent), which the ``decompose`` pass rewrites into a sum.
TILE_REDUCE_KINDS = (*REDUCE_KINDS, "mean")


@register
class ReduceOp(Operation):
    """Reduce one axis (dropped from the shape; a 1-D tile reduces to a
    scalar).  Float sums and means accumulate at least as precisely as f32 and
    round once to the dtype; a mean takes float tiles only."""

    name = "tile.reduce"
    SURFACE = 'sum, mean, max, min, x.sum(axis)'
    EXAMPLE = 'm = s.max(1)'
    OPERANDS = ("x",)
    RESULTS = ("result",)
    ATTRS = {"kind": str, "axis": int}
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        a, r = self.x.type, self.result.type
        if self.kind not in TILE_REDUCE_KINDS:
            raise self.error(f"kind must be one of {', '.join(TILE_REDUCE_KINDS)}")
        if self.kind == "mean" and isinstance(a, TileType) and not a.dtype.is_float:
            raise self.error(f"a mean takes a float tile, got {a}")
        if not isinstance(a, TileType) or not 0 <= self.axis < a.rank:
            raise self.error(f"axis {self.axis} is not an axis of {a}")
        shape = a.shape[: self.axis] + a.shape[self.axis + 1:]
        want = a.with_shape(shape) if shape else ScalarType(a.dtype)
        if not _same_elements(r, want):
            raise self.error(f"result must be {want}, got {r}")


class _AlongAxis(Operation):
    """An op of one kind of ``_KINDS`` along ``axis`` of a float or integer tile; ``_result``
    says its result type."""

    OPERANDS = ("x",)
    RESULTS = ("result",)
    ATTRS = {"kind": str, "axis": int}
    TRAITS = frozenset({"pure"})
    _KINDS: tuple[str, ...] = ()

    def _result(self, a: TileType) -> Type:
        raise NotImplementedError

    def verify(self) -> None:
        a, r = self.x.type, self.result.type
        if self.kind not in self._KINDS:
            raise self.error(f"kind must be one of {', '.join(self._KINDS)}")
        if not isinstance(a, TileType) or not 0 <= self.axis < a.rank:
            raise self.error(f"axis {self.axis} is not an axis of {a}")
        if a.dtype.is_bool:
            raise self.error(f"takes float or integer tiles, got {a}")
        want = self._result(a)
        if not _same_elements(r, want):
            raise self.error(f"result must be {want}, got {r}")


ARG_KINDS = ("argmax", "argmin")


@register
class ArgReduceOp(_AlongAxis):
    """``argmax``/``argmin`` along one axis (dropped, as in ``tile.reduce``): the i32 index of
    the largest or smallest element, the first one on ties; a NaN counts as both the largest
    and the smallest (the first NaN wins), as in torch.  Bool tiles are refused."""

    name = "tile.arg_reduce"
    SURFACE = 'argmax, argmin'
    EXAMPLE = 'i = argmax(s, 1)'
    _KINDS = ARG_KINDS

    def _result(self, a: TileType) -> Type:
        shape = a.shape[: self.axis] + a.shape[self.axis + 1:]
        return TileType(shape, dtypes.i32) if shape else I32


SCAN_KINDS = ("sum", "prod")


@register
class ScanOp(_AlongAxis):
    """``cumsum``/``cumprod``: the inclusive prefix sum or product along one axis (the shape
    stays).  Float scans accumulate at least as precisely as f32 and round each result once to
    the dtype; i32 wraps; bool tiles are refused."""

    name = "tile.scan"
    SURFACE = 'cumsum, cumprod'
    EXAMPLE = 'c = x.cumsum(1)'
    _KINDS = SCAN_KINDS

    def _result(self, a: TileType) -> Type:
        return a


@register
class ClusterReduceOp(Operation):
    """Combine an f32 tile value by value across the programs of a cluster (the pin
    ``cluster``: programs ``c * n .. c * n + n - 1`` along axis 0): every program gets the
    max, min or sum (in rank order) of the ``n`` programs' tiles.  Every program of a cluster
    must reach each of these ops as often as its peers, in the same order."""

    name = "tile.cluster_reduce"
    SURFACE = 'cluster_sum, cluster_max, cluster_min'
    EXAMPLE = 'total = cluster_sum(part)'
    OPERANDS = ("x",)
    RESULTS = ("result",)
    ATTRS = {"kind": str}

    def verify(self) -> None:
        if self.kind not in REDUCE_KINDS:
            raise self.error(f"kind must be one of {', '.join(REDUCE_KINDS)}")
        if not isinstance(self.x.type, TileType) or self.x.type.dtype != dtypes.f32:
            raise self.error(f"combines an f32 tile across a cluster, got {self.x.type}")
        if not _same_elements(self.result.type, self.x.type):
            raise self.error(f"result must be {self.x.type}, got {self.result.type}")
        kernel = next((p for p in self.ancestors() if p.name == "tile.kernel"), None)
        consts = (kernel.attributes.get("consts") or {}) if kernel is not None else {}
        if not is_cluster_size(consts.get("cluster")) or consts["cluster"] < 2:
            raise self.error("combines the programs of a cluster: the kernel needs the pin cluster = 2 or 4")


def has_cluster_reductions(kernel: Operation) -> bool:
    """Whether ``kernel``'s programs combine values across their cluster: such a kernel is
    launched in clusters as it is written (the pin ``cluster`` then asks for nothing else)."""
    return any(op.name in ("tile.cluster_reduce", "hopper.cluster_reduce") for op in kernel.walk())


MMA_DTYPES = ("f16", "bf16", "f8e4m3", "f8e5m2", "f32")


@register
class MmaOp(Operation):
    """``acc + a @ b`` with an f32 accumulator: a is MxK, b is KxN, acc MxN.  ``a_major`` /
    ``b_major`` are set by select-layouts on a product that reads a shared operand with
    another major than its layout's (``hopper.wgmma`` takes them over).

    With ``scales`` (``a_scale`` [M, K/32] and ``b_scale`` [K/32, N], f8e8m0), the product is
    block-scaled, ``dot_scaled``'s meaning with 8-bit operands: what ``decompose`` leaves of a
    ``tile.dot_scaled`` on a target whose tensor cores scale blocks themselves (sm_100a's
    ``kind::mxf8f6f4.block_scale``)."""

    name = "tile.mma"
    SURFACE = '@'
    EXAMPLE = 'acc += a @ b'
    OPERANDS = ("a", "b", "acc", "*scales")
    RESULTS = ("result",)
    ATTRS = {"a_major?": str, "b_major?": str}
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        a, b, c, r = self.a.type, self.b.type, self.acc.type, self.result.type
        if not all(isinstance(t, TileType) and t.rank == 2 for t in (a, b, c)):
            raise self.error("operands must be 2-D tiles")
        if a.shape[1] != b.shape[0] or c.shape != (a.shape[0], b.shape[1]):
            raise self.error(f"shapes do not agree: {a} @ {b} into {c}")
        fp4 = a.dtype.is_packed and b.dtype.is_packed and bool(self.scales)
        if not fp4 and (a.dtype.name not in MMA_DTYPES or b.dtype.name not in MMA_DTYPES):
            raise self.error(f"operands must be one of {', '.join(MMA_DTYPES)} (FP4 pairs only with scales)")
        fp8 = a.dtype.bits == 8 and b.dtype.bits == 8
        if a.dtype != b.dtype and not fp8:
            raise self.error(f"operand dtypes differ: {a.dtype.name} and {b.dtype.name}")
        if c.dtype != dtypes.f32 or r != c:
            raise self.error("the accumulator and result are f32 tiles of one type")
        if self.scales:
            check_block_scales(self, a, b, [v.type for v in self.scales])
            if a.dtype.bits != 8 or b.dtype.bits != 8 or a.dtype.is_packed != b.dtype.is_packed:
                raise self.error("a block-scaled @ takes 8-bit float operands, or FP4 pairs on both sides")
            if self.scales[0].type.dtype != dtypes.f8e8m0 and not fp4:
                raise self.error("a block-scaled @ of 8-bit floats takes f8e8m0 scales (NVFP4's f8e4m3 scale FP4 "
                                 "pairs)")


def operand_k(t: TileType, axis: int) -> int:
    """The K extent of a product operand whose K runs along ``axis``: twice the tile's for
    ``f4e2m1x2`` pairs (packed along K)."""
    return t.shape[axis] * (2 if t.dtype.is_packed else 1)


def scale_dtype(op: Operation) -> dtypes.DType:
    """The dtype of a block-scaled product's scales (``tile.dot_scaled``, a block-scaled
    ``tile.mma``; both sides' are one, check_block_scales says)."""
    return (op.a_scale if op.name == DotScaledOp.name else op.scales[0]).type.dtype


def scale_block(op: Operation) -> int:
    """Values along K one scale of a block-scaled product covers (:data:`SCALE_BLOCK_OF`)."""
    return SCALE_BLOCK_OF[scale_dtype(op).name]


def check_block_scales(op: Operation, a: TileType, b: TileType, scales: list) -> int:
    """``scales`` are an [M, K/B] and a [K/B, N] tile for ``a`` [M, K] @ ``b`` [K, N] of one
    scale dtype, each scale covering the B values along K its dtype does (:data:`SCALE_BLOCK_OF`);
    returns B."""
    if len(scales) != 2 or not all(isinstance(t, TileType) and t.rank == 2 for t in scales):
        raise op.error("takes two scale tiles, A's and B's")
    sa, sb = scales
    if sa.dtype.name not in SCALE_BLOCK_OF or sb.dtype != sa.dtype:
        raise op.error(f"scales must be {' or '.join(SCALE_BLOCK_OF)} tiles, both of one dtype")
    block = SCALE_BLOCK_OF[sa.dtype.name]
    k = operand_k(a, 1)
    if k % block:
        raise op.error(f"K ({k}) is a multiple of {block} in a block-scaled product with {sa.dtype.name} scales")
    kb = k // block
    if sa.shape != (a.shape[0], kb) or sb.shape != (kb, b.shape[1]):
        raise op.error(f"scales must be {a.shape[0]}x{kb} and {kb}x{b.shape[1]}, got {sa} and {sb}")
    return block


#: Values a block-scaled product's scale covers along K (OCP MX: 32 values, one E8M0 byte).
SCALE_BLOCK = 32
#: A scale's dtypes and the values along K each covers: OCP MX's E8M0 (a power of two) 32,
#: NVFP4's e4m3 (counted by its magnitude) 16.
SCALE_BLOCK_OF = {"f8e8m0": SCALE_BLOCK, "f8e4m3": 16}
#: What ``dot_scaled`` multiplies: OCP MX's 8-bit element types, pairs of FP4 (E2M1) values
#: packed along K, and bf16 (an operand without scales, e.g. activations beside MXFP8 weights,
#: takes scales of 1).
SCALED_DTYPES = ("f8e4m3", "f8e5m2", "f4e2m1x2", "bf16")


@register
class DotScaledOp(Operation):
    """``acc + (a * a_scale) @ (b * b_scale)``, a block-scaled product (OCP MX's MXFP8 and
    MXFP4, NVIDIA's NVFP4): ``a`` is MxK and ``b`` KxN of e4m3, e5m2, FP4 pairs or bf16, each
    run of B values along K (B = 32, or 16) scaled by one f8e8m0 (a power of two) or f8e4m3
    (NVFP4's, unsigned: its magnitude) of ``a_scale`` (M x K/B) or ``b_scale`` (K/B x N); f32
    accumulator.  An ``f4e2m1x2`` operand holds its pairs along K: ``a`` is M x K/2 of them,
    ``b`` K/2 x N (a weight [N, K/2] read transposed).  Each operand times its scale is a bf16
    (exact in bf16's range; tkc/semantics.py).  The ``decompose`` pass writes it as casts, a
    scaling multiply and a bf16 ``tile.mma``, or, on a target whose tensor cores scale blocks
    (sm_100a) and for the products they take, as a block-scaled ``tile.mma`` (its ``scales``)."""

    name = "tile.dot_scaled"
    SURFACE = 'dot_scaled(a, a_scale, b, b_scale)'
    EXAMPLE = 'acc += dot_scaled(a, sa, w.T, sw.T)'
    OPERANDS = ("a", "a_scale", "b", "b_scale", "acc")
    RESULTS = ("result",)
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        a, sa, b, sb, c, r = (v.type for v in (self.a, self.a_scale, self.b, self.b_scale, self.acc,
                                                self.result))
        if not all(isinstance(t, TileType) and t.rank == 2 for t in (a, sa, b, sb, c)):
            raise self.error("operands must be 2-D tiles")
        if operand_k(a, 1) != operand_k(b, 0) or c.shape != (a.shape[0], b.shape[1]):
            raise self.error(f"shapes do not agree: {a} @ {b} into {c}")
        check_block_scales(self, a, b, [sa, sb])
        if a.dtype.name not in SCALED_DTYPES or b.dtype.name not in SCALED_DTYPES:
            raise self.error(f"operands must be one of {', '.join(SCALED_DTYPES)}")
        if c.dtype != dtypes.f32 or r != c:
            raise self.error("the accumulator and result are f32 tiles of one type")


def is_product(op: Operation) -> bool:
    """A tensor-core product: ``@`` or ``dot_scaled``."""
    return op.name in (MmaOp.name, DotScaledOp.name)


# ------------------------------------------------------------------- memory
def check_steps(op: Operation, rank: int) -> None:
    """``steps`` (of a load or store): a positive element stride per tensor axis, 1 on squeezed
    axes; element ``j`` of the box along axis ``a`` is tensor element ``offset + j * step``."""
    steps = op.attributes.get("steps")
    if steps is None:
        return
    squeeze = op.attributes.get("squeeze") or []
    if len(steps) != rank or any(type(s) is not int or s < 1 for s in steps) or any(steps[a] != 1 for a in squeeze):
        raise op.error(f"steps {steps} must give a positive stride per tensor axis, 1 on squeezed axes")


class _Access(Operation):
    """Shared checks of load/store: one i32 offset per tensor axis; ``box``
    is the extent per axis, ``squeeze`` the axes dropped from the tile, ``steps`` (optional)
    the element stride per axis (``x[0:D:2]``)."""

    def _check_box(self, tensor: Type, offsets: list, tile: Type) -> None:
        if not isinstance(tensor, TensorType):
            raise self.error(f"expects a tensor, got {tensor}")
        if len(offsets) != tensor.rank or any(o.type != I32 for o in offsets):
            raise self.error(f"needs {tensor.rank} i32 offsets, one per axis of {tensor}")
        box, squeeze = self.box, self.squeeze or []
        if len(box) != tensor.rank or any(type(b) is not int or b < 1 for b in box):
            raise self.error(f"box must give a positive extent per axis of {tensor}")
        if any(not isinstance(s, int) or not 0 <= s < tensor.rank or box[s] != 1 for s in squeeze):
            raise self.error("squeezed axes must be axes of the tensor with extent 1")
        shape = tuple(b for i, b in enumerate(box) if i not in squeeze)
        want = TileType(shape, tensor.dtype) if shape else ScalarType(tensor.dtype)
        if isinstance(tile, TileType) and isinstance(want, TileType):
            ok = tile.shape == want.shape and tile.dtype == want.dtype
        else:
            ok = tile == want
        if not ok:
            raise self.error(f"the box {box} of {tensor} is {want}, not {tile}")
        check_steps(self, tensor.rank)


@register
class LoadOp(_Access):
    """Read a box of a tensor at element offsets (every ``steps[a]``-th element along axis
    ``a`` when given).  Elements outside the tensor read as ``other`` (0 when absent)."""

    name = "tile.load"
    SURFACE = 'x[a:b, c:d], load(..., other=)'
    EXAMPLE = 't = x[r:r+BM, 0:64]'
    OPERANDS = ("tensor", "*offsets")
    RESULTS = ("result",)
    ATTRS = {"box": list, "squeeze?": list, "other?": (int, float, bool), "steps?": list}
    TRAITS = frozenset({"readonly"})

    def verify(self) -> None:
        self._check_box(self.tensor.type, self.offsets, self.result.type)
        other = self.other
        if other is not None:
            dt = self.tensor.type.dtype
            ok = isinstance(other, bool) if dt.is_bool else (
                not isinstance(other, bool) and (dt.is_float or isinstance(other, int)))
            if not ok:
                raise self.error(f"other = {other!r} is not a {dt.name} value")


@register
class GatherOp(_Access):
    """Read a tile whose coordinate along tensor axis ``axis`` is picked per element by
    ``index`` (an i32 tile of the result's shape): element ``e`` reads the tensor at
    ``offsets[a] + e[a]`` on every other axis and ``offsets[axis] + index[e]`` on ``axis``
    (``x[idx, c:c+D]``: rows picked by ``idx``).  ``box`` and ``squeeze`` are a load's, with
    the result's extent on ``axis``.  Elements outside the tensor read ``other`` (0)."""

    name = "tile.gather"
    SURFACE = 'x[idx, c:d] (an i32 index tile)'
    EXAMPLE = 'rows = emb[ids, 0:D]'
    OPERANDS = ("tensor", "index", "*offsets")
    RESULTS = ("result",)
    ATTRS = {"axis": int, "box": list, "squeeze?": list, "other?": (int, float, bool)}
    TRAITS = frozenset({"readonly"})

    def verify(self) -> None:
        self._check_box(self.tensor.type, self.offsets, self.result.type)
        t, idx = self.result.type, self.index.type
        if not isinstance(t, TileType) or not isinstance(idx, TileType) or idx.shape != t.shape \
                or idx.dtype != dtypes.i32:
            raise self.error(f"the index is an i32 tile of the result's shape {t}, got {idx}")
        if not 0 <= self.axis < self.tensor.type.rank or self.axis in (self.squeeze or []):
            raise self.error(f"axis {self.axis} must be a kept axis of {self.tensor.type}")


@register
class StoreOp(_Access):
    """Write a tile into a box of a tensor; elements outside are not written."""

    name = "tile.store"
    SURFACE = 'x[a:b, c:d] = v'
    EXAMPLE = 'c[r:r+BM, 0:BN] = acc.to(bf16)'
    OPERANDS = ("tensor", "value", "*offsets")
    ATTRS = {"box": list, "squeeze?": list, "steps?": list}

    def verify(self) -> None:
        self._check_box(self.tensor.type, self.offsets, self.value.type)


@register
class MaskedStoreOp(_Access):
    """Write a tile into a box of a tensor where ``mask`` (an i1 tile of its shape) is true;
    other elements, and elements outside the tensor, are not written."""

    name = "tile.masked_store"
    SURFACE = 'store(view, v, mask=)'
    EXAMPLE = 'store(y[r:r+BM, :], t, mask=keep[:, None])'
    OPERANDS = ("tensor", "value", "mask", "*offsets")
    ATTRS = {"box": list, "squeeze?": list}

    def verify(self) -> None:
        self._check_box(self.tensor.type, self.offsets, self.value.type)
        v, m = self.value.type, self.mask.type
        if not isinstance(v, TileType) or not isinstance(m, TileType) or m.shape != v.shape \
                or not m.dtype.is_bool:
            raise self.error(f"the mask is an i1 tile of the value's shape, got {m}")


# ------------------------------------------------------------------ atomics
#: What each atomic kind takes (element dtypes), where the GPU has an instruction for it.
ATOMIC_KINDS = {
    "add": ("f32", "f16", "bf16", "i32"),
    "max": ("f32", "i32"),
    "min": ("f32", "i32"),
    "exch": ("f32", "i32"),
    "cas": ("f32", "i32"),
}
#: Memory orderings of an atomic (PTX's ``.sem``), at GPU scope.
ATOMIC_SEMS = ("relaxed", "acquire", "release", "acq_rel")


def check_atomic_kind(op: Operation, kind: str, dtype: dtypes.DType, sem: str | None) -> None:
    """The kind, the element dtype and the ordering of an atomic (tile or hopper level)."""
    if kind not in ATOMIC_KINDS:
        raise op.error(f"kind must be one of {', '.join(ATOMIC_KINDS)}, got {kind!r}")
    if dtype.name not in ATOMIC_KINDS[kind]:
        raise op.error(f"atomic {kind} takes {', '.join(ATOMIC_KINDS[kind])} tensors, not {dtype.name}")
    if (sem or "relaxed") not in ATOMIC_SEMS:
        raise op.error(f"sem must be one of {', '.join(ATOMIC_SEMS)}, got {sem!r}")


class _AtomicAccess(_Access):
    def _check_atomic(self, kind: str) -> None:
        t = self.tensor.type
        self._check_box(t, self.offsets, self.value.type)
        check_atomic_kind(self, kind, t.dtype, self.sem)
        sem = self.sem or "relaxed"
        if self.results:
            if isinstance(self.value.type, TileType) or len(self.results) != 1 \
                    or self.results[0].type != ScalarType(t.dtype):
                raise self.error("only an atomic on one element returns a value: the element's old value")
        elif sem in ("acquire", "acq_rel"):
            raise self.error(f"sem = {sem!r} orders what comes after a read: only an atomic that returns "
                             f"the old value reads")


@register
class AtomicOp(_AtomicAccess):
    """Combine a tile (or a scalar) into a box of a tensor, element by element, atomically:
    ``kind`` is ``add``, ``max``, ``min`` or ``exch`` (replace).  Elements outside the tensor
    are left alone.  On one element (every axis squeezed) it may return the element's old
    value.  ``sem`` orders the program's other memory accesses around it (default relaxed)."""

    name = "tile.atomic"
    SURFACE = 'atomic_add, atomic_max, atomic_min, atomic_exch, signal'
    EXAMPLE = 'atomic_add(c[r:r+BM, 0:BN], acc)'
    OPERANDS = ("tensor", "value", "*offsets")
    RESULTS = ("*results",)
    ATTRS = {"kind": str, "box": list, "squeeze?": list, "sem?": str}

    def verify(self) -> None:
        if self.kind not in ATOMIC_KINDS or self.kind == "cas":
            raise self.error(f"kind must be one of add, max, min, exch, got {self.kind!r}")
        self._check_atomic(self.kind)


@register
class AtomicCasOp(_AtomicAccess):
    """Compare and swap one element: where it equals ``expected`` (bit for bit) it becomes
    ``value``; returns the old element either way."""

    name = "tile.atomic_cas"
    SURFACE = 'atomic_cas'
    EXAMPLE = 'old = atomic_cas(flag[0], 0, 1)'
    OPERANDS = ("tensor", "expected", "value", "*offsets")
    RESULTS = ("*results",)
    ATTRS = {"box": list, "squeeze?": list, "sem?": str}

    def verify(self) -> None:
        self._check_atomic("cas")
        if isinstance(self.value.type, TileType) or self.expected.type != self.value.type:
            raise self.error("compare-and-swap takes one element and scalar expected and new values of its dtype")


def atomic_kind(op: Operation) -> str:
    """``add``, ``max``, ``min``, ``exch`` or ``cas``: what an atomic op does to its elements."""
    return "cas" if op.name.endswith("cas") else op.kind


def is_atomic(op: Operation) -> bool:
    """Whether ``op`` is an atomic, at tile level or lowered (``hopper.atomic_fetch``)."""
    return op.name in ("tile.atomic", "tile.atomic_cas", "hopper.atomic_fetch")


def picks_scalars(op: Operation) -> bool:
    """Whether ``op`` is an if that only picks scalars: its results scalars, every op inside it
    pure and scalar (or such an if).  Passes may compute it wherever its operands are (both
    warp roles, an iteration ahead, the grid's slice): a launch order's program ids, as
    the persistent pass's longest-first launch order picks them."""
    if op.name != "tile.if" or any(isinstance(r.type, TileType) for r in op.results):
        return False
    for o in op.walk():
        if o is op or o.name == "tile.yield":
            continue
        if o.name == "tile.if":
            if any(isinstance(r.type, TileType) for r in o.results):
                return False
        elif not o.has_trait("pure") or o.regions or any(isinstance(r.type, TileType) for r in o.results):
            return False
    return True


def outside_operands(op: Operation) -> list[Value]:
    """The values the ops inside ``op`` (and ``op``) read that are defined outside it."""
    inside = [o for o in op.walk()]
    own = {r for o in inside for r in o.results} | {a for o in inside for r in o.regions for b in r.blocks
                                                    for a in b.args}
    return [v for o in inside for v in o.operands if v not in own]


# -------------------------------------------------------------------- ranks
# A multi-GPU launch runs the same kernel on R ranks (one GPU each); tensors declared
# ``@ ranks`` exist on every rank and programs may read and write peers' copies.  The
# interpreter runs the ranks in one process (tkc/ranks.py); docs/language.md "Several GPUs".

@register
class RankOp(NumSmsOp):
    """``rank()``: the rank (GPU) this program runs on, 0..num_ranks()-1."""

    name = "tile.rank"
    SURFACE = 'rank'
    EXAMPLE = 'me = rank()'


@register
class NumRanksOp(RankOp):
    """``num_ranks()``: how many ranks the launch has (1 on a single GPU)."""

    name = "tile.num_ranks"
    SURFACE = 'num_ranks'
    EXAMPLE = 'dst = (rank() + 1) % num_ranks()'


def _kernel_param(v) -> bool:
    from tkc.ir.core import BlockArgument

    return isinstance(v, BlockArgument) and v.block.parent_op is not None and v.block.parent_op.name == "tile.kernel"


@register
class PeerOp(Operation):
    """``x.on(r)``: rank ``r``'s copy of the ``@ ranks`` tensor parameter ``x`` (the address
    of the same tensor in peer memory); loads, stores and atomics on it read and write rank
    ``r``'s memory.  A rank outside 0..num_ranks()-1 is an error at run time."""

    name = "tile.peer"
    SURFACE = 'x.on(r)'
    EXAMPLE = 'out.on(dst)[rank(), r:r+BM, :] = t'
    OPERANDS = ("tensor", "rank")
    RESULTS = ("result",)
    TRAITS = frozenset({"pure"})

    def verify(self) -> None:
        t = self.tensor.type
        if not isinstance(t, TensorType) or not t.ranks or not _kernel_param(self.tensor):
            raise self.error(f"takes a tensor parameter declared '@ ranks', got {t}")
        if self.rank.type != I32:
            raise self.error(f"the rank is an i32 scalar, got {self.rank.type}")
        if self.result.type != t:
            raise self.error(f"the result is the tensor's type {t}, got {self.result.type}")


#: What ``wait`` compares a flag with (``flags[i] >= v``), by the compare op's predicate names.
WAIT_PREDICATES = CMP_PREDICATES  # a wait compares as tile.cmp does


def is_peer(v) -> bool:
    """Whether tensor value ``v`` is a peer's copy (``x.on(r)``) rather than a parameter."""
    return getattr(v, "owner", None) is not None and v.owner.name == "tile.peer"


def tensor_param(v):
    """The tensor parameter ``v`` reaches: ``v`` itself, or ``x`` for a peer's copy ``x.on(r)``."""
    return v.owner.tensor if is_peer(v) else v


@register
class WaitOp(_Access):
    """``wait(flags[i] >= v)``: spin until one element of a local i32 tensor (a flag) compares
    true with ``v``, then read it with acquire ordering at system scope: what the programs
    that signalled it wrote before their release signal is visible after the wait.  ``copies``:
    the wait guards the TMA copies behind it, issued ahead of their iteration (``pipeline-loops``
    issues a loop's wait again for each iteration's copies); only the role that issues copies
    runs it (``specialize-warps``)."""

    name = "tile.wait"
    SURFACE = 'wait'
    EXAMPLE = 'wait(ready[src] >= 1)'
    OPERANDS = ("tensor", "value", "*offsets")
    ATTRS = {"pred": str, "box": list, "squeeze?": list, "copies?": bool}

    def verify(self) -> None:
        t = self.tensor.type
        self._check_box(t, self.offsets, ScalarType(t.dtype) if isinstance(t, TensorType) else t)
        if t.dtype != dtypes.i32:
            raise self.error(f"waits on an i32 flag, got {t}")
        if self.value.type != I32:
            raise self.error(f"compares the flag with an i32 scalar, got {self.value.type}")
        if self.pred not in WAIT_PREDICATES:
            raise self.error(f"pred must be one of {', '.join(WAIT_PREDICATES)}")
        if is_peer(self.tensor):
            raise self.error("waits on a local flag, not on a peer's copy")


@register
class RankBarrierOp(Operation):
    """``barrier_all()``: the programs with this program id on every rank wait for each
    other; every memory access before it, on any rank, happens before every access after it
    (release and acquire at system scope)."""

    name = "tile.rank_barrier"
    SURFACE = 'barrier_all'
    EXAMPLE = 'barrier_all()'

    def verify(self) -> None:
        """Every rank meets a barrier equally often (program ``p`` counts its arrivals on
        every rank's pad, never reset): no ``if`` or loop around it may differ across ranks."""
        kernel = next((a for a in self.ancestors() if a.name == "tile.kernel"), None)
        if kernel is None:
            return
        if not any(a.name in ("tile.if", "tile.for") for a in self.ancestors()):
            return
        divergent = rank_divergent(kernel)
        for a in self.ancestors():
            if a.name not in ("tile.if", "tile.for"):
                continue
            source = next((divergent[v] for v in a.operands[:1 if a.name == "tile.if" else 3] if v in divergent),
                          None)
            if source is not None:
                what, of = ("if", "condition") if a.name == "tile.if" else ("loop", "trip count")
                raise TkcVerifyError(
                    f"barrier_all() under {'an' if what == 'if' else 'a'} {what} (line {_line(a)}) whose {of} "
                    f"depends on {_divergence(source)}: every rank must meet every barrier_all() equally often; "
                    f"move it out of the {what}, or make its {of} depend only on program ids, constants, dims "
                    f"and scalar arguments", self.loc)


#: Ops that only a multi-GPU launch gives meaning to beyond rank 0 of 1.
RANK_OPS = ("tile.rank", "tile.num_ranks", "tile.peer", "tile.wait", "tile.rank_barrier")


def ranked_params(kernel: Operation) -> list[int]:
    """The indices of ``kernel``'s tensor parameters declared ``@ ranks``."""
    return [a.index for a in kernel.regions[0].block.args if isinstance(a.type, TensorType) and a.type.ranks]


def rank_divergent(kernel: Operation) -> dict:
    """The values of ``kernel`` that may differ between ranks at the same program id, each
    with the op it comes from: ``rank()``, a load, an atomic (any op with results that is not
    pure), and what they flow into, through loops (a carried value, or any result of a loop
    whose bounds differ) and branches (any result of an ``if`` whose condition differs).
    Program ids, constants, dims and scalar parameters are the same on every rank (the
    launch's grid, which every rank shares, comes from them)."""
    out: dict = {}

    def first(values) -> Operation | None:
        return next((out[v] for v in values if v in out), None)

    def mark(v, source: Operation | None) -> None:
        if source is not None and v not in out:
            out[v] = source

    loops: list[Operation] = []

    def visit(op: Operation) -> None:
        if op.name == "tile.for":  # what the body reads first, then the body, then the results
            loops.append(op)
            lb, ub, step, *init = op.operands
            mark(op.body.args[0], first([lb, step]))
            for arg, i, y in zip(op.body.args[1:], init, op.body.terminator.operands):
                mark(arg, first([i, y]))
        for region in op.regions:
            for inner in region.block.ops:
                visit(inner)
        if op.name == "tile.for":
            lb, ub, step, *init = op.operands
            for res, i, y in zip(op.results, init, op.body.terminator.operands):
                mark(res, first([i, y, lb, ub, step]))
        elif op.name == "tile.if":
            for k, res in enumerate(op.results):
                mark(res, first([op.cond, *(r.block.terminator.operands[k] for r in op.regions)]))
        elif op.results and (op.name == "tile.rank" or not op.has_trait("pure")):
            for res in op.results:
                mark(res, op)
        else:
            source = first(op.operands)
            for res in op.results:
                mark(res, source)

    stale = True
    while stale:  # again while a loop's yield turned out divergent after its carried value was read
        loops.clear()
        visit(kernel)
        stale = any(y in out and a not in out for loop in loops
                    for a, y in zip(loop.body.args[1:], loop.body.terminator.operands))
    return out


def _line(op: Operation) -> str:
    return str(op.loc.line) if op.loc is not None else "?"


def _divergence(source: Operation) -> str:
    """What makes a value differ across ranks, in words."""
    if source.name == "tile.rank":
        return f"rank() (line {_line(source)})"
    if source.name in ("tile.load", "tile.gather"):
        return f"data loaded at line {_line(source)}"
    if source.name.startswith("tile.atomic"):
        return f"an atomic's result (line {_line(source)})"
    return f"the result of '{source.name}' (line {_line(source)})"


def has_rank_barrier(kernel: Operation) -> bool:
    """Whether ``kernel`` meets other ranks at a ``barrier_all()`` (it takes barrier pads)."""
    return any(op.name == "tile.rank_barrier" for op in kernel.walk())


#: Ops that write a tensor (operand 0) and ops that read one, for :func:`read_and_written`.
TENSOR_WRITES = frozenset({"tile.store", "tile.masked_store", "tile.atomic", "tile.atomic_cas"})
TENSOR_READS = frozenset({"tile.load", "tile.gather"})


def read_and_written(kernel: Operation) -> frozenset:
    """The tensor parameters ``kernel`` both reads and writes (``hs[t] = f(hs[t - 1])``,
    ``x[r] = x[r] * 2``).  A program's own accesses to such a tensor must happen in program
    order for every thread: the passes copy them through no TMA (an asynchronous copy would
    land out of that order) and put a barrier around each write (another thread may read or
    write the element next)."""
    params = set(kernel.regions[0].block.args)
    reads = {op.operands[0] for op in kernel.walk() if op.name in TENSOR_READS and op.operands}
    writes = {op.operands[0] for op in kernel.walk() if op.name in TENSOR_WRITES and op.operands}
    return frozenset(reads & writes & params)


def ordered_tensors(kernel: Operation) -> frozenset:
    """The tensor parameters whose accesses by one program must keep program order on every
    thread: those it reads and writes (:func:`read_and_written`), and those it writes twice,
    the second write after the first in one pass over the code (not in the other branch of an
    if, nor in a loop's next iteration or after the loop, which write its next tile), where the
    two boxes may share an element (``y[r] = acc`` then ``y[r, 0] = 0``; two atomics excepted:
    each applies whole)."""
    out = set(read_and_written(kernel))
    params = set(kernel.regions[0].block.args)

    def writes(op: Operation) -> list[Operation]:  # op itself, or the writes in its regions
        return [w for w in op.walk() if w.name in TENSOR_WRITES and w.operands and w.operands[0] in params]

    for op in kernel.walk():
        for block in (b for r in op.regions for b in r.blocks):
            groups = [writes(o) for o in block.ops]  # a write under one op (an if's branches) vs a later op's
            for i, first in enumerate(groups):
                if block.ops[i].name == "tile.for":
                    continue  # a loop writes a tile an iteration; what comes after writes the next
                for a in first:
                    out.update(a.operands[0] for later in groups[i + 1:] for b in later
                               if b.operands[0] is a.operands[0] and not (is_atomic(a) and is_atomic(b))
                               and _boxes_may_meet(a, b))
    return frozenset(out)


def _boxes_may_meet(a: Operation, b: Operation) -> bool:
    """Whether two accesses' boxes may share an element: not where on some axis both start at
    one value plus constants and their extents do not meet (``y[r, 0:64]``, ``y[r, 64:128]``)."""
    for axis, (oa, ob) in enumerate(zip(a.offsets, b.offsets)):
        (base_a, lo_a), (base_b, lo_b) = split_constant(oa), split_constant(ob)
        if base_a is not base_b:
            continue
        if lo_a + _extent(a, axis) <= lo_b or lo_b + _extent(b, axis) <= lo_a:
            return False
    return True


def _extent(op: Operation, axis: int) -> int:
    box, steps = op.attributes["box"], op.attributes.get("steps") or []
    return (box[axis] - 1) * (steps[axis] if axis < len(steps) else 1) + 1


def int_constant(v: Value) -> int | None:
    """``v``'s value where it is an integer constant, else None."""
    c = constant_value(v)
    return c if type(c) is int else None


def split_constant(v: Value) -> tuple[Value | None, int]:
    """``v`` as (a value, a constant) it is the sum of: ``k + 1`` and ``(k + 128) + 1`` are
    ``(k, 1)`` and ``(k, 129)``, ``32 + k`` is ``(k, 32)``, a constant ``c`` is ``(None, c)``."""
    c = int_constant(v)
    if c is not None:
        return None, c
    d = getattr(v, "owner", None)
    if d is not None and d.name == "tile.add":
        for x, y in ((d.operands[0], d.operands[1]), (d.operands[1], d.operands[0])):
            c = int_constant(y)
            if c is not None:
                base, more = split_constant(x)
                return base, c + more
    return v, 0


def uses_ranks(kernel: Operation) -> bool:
    """Whether ``kernel`` is a multi-GPU kernel: a tensor parameter ``@ ranks``, or an op of
    ``RANK_OPS`` (a wait on a local flag included: it needs the ranks' scheduler)."""
    if ranked_params(kernel):
        return True
    return any(op.name in RANK_OPS for op in kernel.walk())
