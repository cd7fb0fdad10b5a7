"""The ``decompose`` pass: ops a target does not render directly become simpler tile ops.

Each op says how it decomposes (``ElementwiseOp.decompose`` in
``tkc/ir/dialects/elementwise.py``: ``sigmoid`` into ``exp`` and a division, ``erf`` into
polynomials, ``x ** y`` into ``exp2``/``log2`` with the sign rules); this pass only asks, for
every op of the kernel that the target does not list as native, and puts the answer in its
place.  ``argmax``/``argmin`` become a max (min) reduction, a compare and a min reduction of
the indices that hold it (or a NaN).  (``rand`` stays whole: codegen shares one Philox call
among four values a thread holds, which tile ops could not say.)
``dot_scaled`` (a block-scaled product) becomes its operands scaled in f32, cast to bf16
and multiplied by ``tile.mma`` where the target has no block-scaled product; where it has one
(``target.native_ops``) and takes the operands, a ``tile.mma`` with the two scales.
``mean`` reductions become an f32 sum divided by the extent (the interpreter sums in
float64: the two agree within the f32 sum's rounding, as a ``sum`` on the GPU does).  It runs first on the way
to a target, before layouts are chosen, so the new ops get layouts like any other; the
interpreter runs the ops themselves, so ``interpret(before) == emulate(after)`` checks each
decomposition.
"""

from __future__ import annotations

from tkc import dtypes
from tkc.ir.builder import Builder
from tkc.ir.core import Module, Operation, replace_all_uses
from tkc.ir.dialects import tile
from tkc.ir.types import ScalarType, TileType
from tkc.pins import Options
from tkc.target import Target


def decompose(module: Module, options: Options, target: Target) -> None:
    """Replace every decomposable op the target does not render (``target.native_ops``)."""
    for kernel in module.ops:
        for op in list(kernel.walk()):
            if op.name == "tile.dot_scaled":
                new = _dot_scaled(op, target, Builder.before(op))
            elif op.name in target.native_ops:
                continue
            elif isinstance(op, tile.ElementwiseOp) and op.decomposes():
                new = _elementwise(op)
            elif op.name == "tile.reduce" and op.kind == "mean":
                new = _mean(op, Builder.before(op))
            elif op.name == "tile.arg_reduce":
                new = _arg_reduce(op, Builder.before(op))
            else:
                continue
            if new is not None:
                replace_all_uses(kernel, op.result, new)
                op.erase()


def _elementwise(op: tile.ElementwiseOp):
    """``op``'s decomposition, computed in f32 when ``op`` is on a narrower float (one rounding
    at the end, as the op itself rounds)."""
    t = op.result.type
    if not t.dtype.is_float or t.dtype == dtypes.f32:
        return op.decompose(Builder.before(op))
    b = Builder.before(op)
    # A constant operand becomes an f32 constant (not a cast of one), so that a decomposition
    # that looks at constants (x ** 2.0) sees it.
    wide = [b.value(tile.ConstantOp, [], _f32(v.type), {"value": float(c)})
            if (c := tile.constant_value(v)) is not None else b.value(tile.CastOp, [v], _f32(v.type))
            for v in op.operands]
    twin = b.create(type(op), wide, [_f32(t)], dict(op.attributes))
    new = twin.decompose(Builder.before(twin))
    twin.erase()
    return Builder.before(op).value(tile.CastOp, [new], t)


def _f32(t):
    return t.with_dtype(dtypes.f32) if isinstance(t, TileType) else ScalarType(dtypes.f32)


def _mean(op: Operation, b: Builder):
    """``mean(x, axis)`` as ``sum(x.to(f32), axis) / n``, cast back to x's dtype."""
    x, t = op.x, op.result.type
    f32 = dtypes.f32
    if x.type.dtype != f32:
        x = b.value(tile.CastOp, [x], x.type.with_dtype(f32))
    wide = _f32(t)
    total = b.value(tile.ReduceOp, [x], wide, {"kind": "sum", "axis": op.axis})
    n = b.value(tile.ConstantOp, [], wide, {"value": float(op.x.type.shape[op.axis])})
    mean = b.value(tile.DivOp, [total, n], wide)
    return mean if wide == t else b.value(tile.CastOp, [mean], t)


def _scales_natively(op: Operation, target: Target) -> bool:
    """Whether ``target``'s tensor cores take this ``dot_scaled`` as one block-scaled product
    (sm_100a's ``kind::mxf8f6f4.block_scale``, and ``kind::mxf4nvf4`` for FP4): both operands
    8-bit floats with E8M0 scales of 32 values, or both FP4 pairs with those (MXFP4) or e4m3
    scales of 16 (NVFP4); ``target.mma_rows`` rows (the block-scaled MMA's only M on one CTA)
    and N a multiple of 16 up to 256.  Else it is decomposed."""
    m, n = op.acc.type.shape
    a, b = op.a.type.dtype, op.b.type.dtype
    eight = all(t.bits == 8 and t.is_float for t in (a, b)) and tile.scale_dtype(op) == dtypes.f8e8m0
    fp4 = a.is_packed and b.is_packed
    return ("tile.dot_scaled" in target.native_ops and (eight or fp4)
            and m == target.mma_rows and n % 16 == 0 and 16 <= n <= 256)


def _dot_scaled(op: Operation, target: Target, b: Builder):
    """``dot_scaled(a, sa, b, sb)`` as a block-scaled ``tile.mma`` where ``target`` takes it
    (:func:`_scales_natively`), else as ``A @ B`` in bf16, where ``A`` is ``a`` times its
    scales: ``a`` cast to f32 (FP4 pairs unpacked along K) and seen as rows of B values
    (``[M * K/B, B]``, B the values a scale covers), each row times its scale (``sa``
    flattened), back to ``[M, K]`` and to bf16; ``B`` the same on ``b``'s transpose: each
    scaled value rounded to f32 and then bf16, as the interpreter defines the op (exact in
    bf16's range: an 8-bit or 4-bit float times an E8M0 or e4m3 scale)."""
    loc = op.loc
    sa, sb = op.a_scale, op.b_scale
    if tile.scale_dtype(op) == dtypes.f8e4m3:  # NVFP4's scales count by their magnitudes (UE4M3)
        sa, sb = (s if tile.constant_value(s) == 1.0 else b.value(tile.AbsOp, [s], s.type, loc=loc) for s in (sa, sb))
    if _scales_natively(op, target):
        return b.value(tile.MmaOp, [op.a, op.b, op.acc, sa, sb], op.result.type, loc=loc)
    block = tile.scale_block(op)
    f32, bf16 = dtypes.f32, dtypes.bf16

    def wide(x):  # x [R, K] (or FP4 pairs [R, K / 2]) -> f32 [R, K]
        if x.type.dtype.is_packed:
            return tile.unpacked_fp4(b, x, 1, loc)
        return b.value(tile.CastOp, [x], x.type.with_dtype(f32), loc=loc)

    def scaled(x, s):  # x [R, K], s [R, K / B] -> bf16 [R, K]
        if tile.constant_value(s) == 1.0:  # no scales (None): a bf16 operand as it is, fp8 exactly in bf16
            if x.type.dtype == bf16:
                return x
            if not x.type.dtype.is_packed:
                return b.value(tile.CastOp, [x], x.type.with_dtype(bf16), loc=loc)
            x = wide(x)
            return b.value(tile.CastOp, [x], x.type.with_dtype(bf16), loc=loc)
        x = wide(x)
        r, k = x.type.shape
        rows = r * (k // block)
        x = b.value(tile.ReshapeOp, [x], TileType((rows, block), f32), loc=loc)
        s = b.value(tile.CastOp, [s], s.type.with_dtype(f32), loc=loc)
        s = b.value(tile.ReshapeOp, [s], TileType((rows, 1), f32), loc=loc)
        s = b.value(tile.BroadcastOp, [s], TileType((rows, block), f32), loc=loc)
        x = b.value(tile.MulOp, [x, s], TileType((rows, block), f32), loc=loc)
        x = b.value(tile.ReshapeOp, [x], TileType((r, k), f32), loc=loc)
        return b.value(tile.CastOp, [x], TileType((r, k), bf16), loc=loc)

    def transposed(x):
        return b.value(tile.TransposeOp, [x], x.type.with_shape(x.type.shape[::-1]), loc=loc)

    a = scaled(op.a, sa)
    if tile.constant_value(sb) == 1.0 and not op.b.type.dtype.is_packed:
        w = scaled(op.b, sb)  # (no scales: a cast at most, in b's own orientation)
    else:
        w = transposed(scaled(transposed(op.b), transposed(sb)))
    return b.value(tile.MmaOp, [a, w, op.acc], op.result.type, loc=loc)


def _arg_reduce(op: Operation, b: Builder):
    """``argmax(x, axis)`` as ``min(where((x == m) | (x != x), index, n), axis)`` with
    ``m = max(x, axis)`` (NaN-propagating: a row with a NaN has m = NaN, which no element
    equals, and ``x != x`` picks its NaNs); ``argmin`` the same with ``min``."""
    x, axis = op.x, op.axis
    t = x.type
    n = t.shape[axis]
    kept = t.shape[:axis] + t.shape[axis + 1:]
    kind = "max" if op.kind == "argmax" else "min"
    m = b.value(tile.ReduceOp, [x], t.with_shape(kept) if kept else ScalarType(t.dtype), {"kind": kind, "axis": axis})
    if kept:
        m = b.value(tile.ExpandDimsOp, [m], t.with_shape(t.shape[:axis] + (1,) + t.shape[axis + 1:]), {"axis": axis})
        if n != 1:  # (a broadcast changes one axis: none here)
            m = b.value(tile.BroadcastOp, [m], t)
    else:
        m = b.value(tile.SplatOp, [m], t)
    mask = t.with_dtype(dtypes.i1)
    hit = b.value(tile.CmpOp, [x, m], mask, {"pred": "eq"})
    if t.dtype.is_float:
        nan = b.value(tile.CmpOp, [x, x], mask, {"pred": "ne"})
        hit = b.value(tile.OrOp, [hit, nan], mask)
    it = t.with_dtype(dtypes.i32)
    index = b.value(tile.ArangeOp, [], TileType((n,), dtypes.i32), {"start": 0})
    if t.rank == 2:
        other = 1 - axis
        index = b.value(tile.ExpandDimsOp, [index], TileType((1, n) if axis == 1 else (n, 1), dtypes.i32),
                        {"axis": other})
        if t.shape[other] != 1:
            index = b.value(tile.BroadcastOp, [index], it)
    elif t.rank != 1:
        return None
    past = b.value(tile.ConstantOp, [], it, {"value": n})
    picked = b.value(tile.SelectOp, [hit, index, past], it)
    return b.value(tile.ReduceOp, [picked], op.result.type, {"kind": "min", "axis": axis})
