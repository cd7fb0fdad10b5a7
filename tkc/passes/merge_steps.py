"""The ``merge-steps`` pass: stepped slices that together cover a range are read and written as
that range, and so are stores of blocks side by side.

``x[:, 0:D:2]`` and ``x[:, 1:D:2]`` (interleaved RoPE's pairs, a complex tensor's real and
imaginary parts) are loads whose every element is its own access: a thread's neighbours in the
tile are two elements apart in memory, so nothing is read as a vector.  Loads of the same
tensor that differ only in the last axis's offset, ``o, o+1, ..., o+s-1`` with that axis's step
``s`` (a power of two, of at most 16 bytes of elements), read together every element of
``x[:, o:o+W*s]``: they become one load of that range,
a ``tile.reshape`` to ``[..., W, s]`` and a ``tile.take`` of each phase.  Stores of such a set
of slices become a ``tile.stack`` of their values, a reshape and one store of the range.
``select-layouts`` then gives the range the ``#blocked`` layout of its flat shape, so each
thread holds whole groups of ``s`` and a take or a stack only picks registers: the range goes
through memory as 16-byte vectors.

Stores of blocks side by side along the last axis (``y[r, o:o+W] = u``, ``y[r, o+W:o+2W] = v``:
a RoPE projection's head halves) become one store of their values stacked along a new axis
and reshaped to the whole width.  Where the values are slices of one accumulator (a product's
column blocks, ``acc[:, 0:64]``) that whole is the accumulator again, in its own layout, and
goes out through the TMA-store epilogue instead of thread by thread.

Element ``j`` of phase ``p`` is the range's element ``j*s + p``, in bounds exactly where the
slice's was (``o + p + j*s < dim``), and reads ``other`` where not: the merged ops read and
write the same elements as the slices.  The loads move to the first of them and the stores to
the last, so only sets whose ops between the first and the last touch no memory (a store, an
atomic, a wait) are merged, besides other loads between loads.

Runs after ``decompose``, before ``select-layouts``.  Must not: merge slices of different
tensors, boxes or steps on other axes, leave a phase of the range (a block of the row) out, or
move an access past a write (a store past a read).
"""

from __future__ import annotations

from tkc.ir.builder import Builder
from tkc.ir.core import Block, Module, Operation, Value, replace_all_uses
from tkc.ir.dialects import tile
from tkc.ir.types import ScalarType, TileType
from tkc.pins import Options
from tkc.target import Target


def merge_steps(module: Module, *_: Options | Target) -> None:
    for kernel in module.ops:
        blocks = [b for op in kernel.walk() for r in op.regions for b in r.blocks]
        for block in blocks:
            for group in _groups(block, "tile.load"):
                _merge_loads(kernel, group)
            for group in _groups(block, "tile.store"):
                _merge_stores(group)
            for group in _block_groups(block):
                _merge_blocks(group)


def _last_offset(op: Operation) -> tuple[Value | None, int]:
    """The access's offset along the tensor's last axis as (value, constant): ``k + 1`` and
    ``(k + 128) + 1`` are ``(k, 1)`` and ``(k, 129)``, a constant ``c`` is ``(None, c)``."""
    return tile.split_constant(op.offsets[-1])


def _key(op: Operation) -> tuple | None:
    """What the accesses of one range share: the tensor, every offset but the last, the box,
    squeezed axes, steps, fill, the last offset's base and which range of ``s`` its constant
    falls in (``k + 0`` to ``k + s - 1``: a range starts on a multiple of the step); None for an
    access that is not a stepped slice of the last axis."""
    steps = op.attributes.get("steps")
    if not steps or steps[-1] < 2 or not isinstance(op.result.type if op.results else op.value.type, TileType):
        return None
    base, c = _last_offset(op)
    return (op.tensor, tuple(op.offsets[:-1]), tuple(op.box), tuple(op.squeeze or ()), tuple(steps),
            op.attributes.get("other"), base, c // steps[-1])


def _quiet(op: Operation, loads: bool) -> bool:
    """Whether ``op`` may stand between accesses that move together: it touches no memory (or,
    between loads, only reads it)."""
    for inner in op.walk():
        if inner.regions or inner.has_trait("terminator"):
            continue
        if not (inner.has_trait("pure") or loads and inner.name == "tile.load"):
            return False
    return True


def _fits_a_vector(op: Operation) -> bool:
    """Whether a thread's 16-byte vector holds whole groups of the step's phases: a step that
    is a power of two of at most 16 bytes of elements.  (Others would not stay in their
    threads' registers as ``[..., W, s]``; their slices stay as written.)"""
    s = op.attributes["steps"][-1]
    return s & (s - 1) == 0 and s * max(1, op.tensor.type.dtype.bits // 8) <= 16


def _groups(block: Block, name: str) -> list[list[Operation]]:
    """Sets of ``name`` ops in ``block`` that read (write) every phase of one range once each,
    with nothing but quiet ops between the first and the last, in program order."""
    by_key: dict[tuple, list[Operation]] = {}
    for op in block.ops:
        if op.name == name and not op.attributes.get("sem"):
            key = _key(op)
            if key is not None:
                by_key.setdefault(key, []).append(op)
    out = []
    ops = block.ops
    for members in by_key.values():
        s = members[0].attributes["steps"][-1]
        phases = sorted(_last_offset(op)[1] for op in members)
        if len(members) != s or phases != list(range(phases[0], phases[0] + s)) or not _fits_a_vector(members[0]):
            continue
        first, last = ops.index(members[0]), ops.index(members[-1])
        if all(_quiet(op, name == "tile.load") for op in ops[first + 1:last] if op not in members):
            out.append(members)
    return out


def _cut_from(v: Value) -> set[Value]:
    """The tiles whose slices (``tile.take``s, of the tile or of its reshape) ``v`` is computed
    from through register ops."""
    out: set[Value] = set()
    seen: set[Value] = set()
    todo = [v]
    while todo:
        x = todo.pop()
        d = getattr(x, "owner", None)
        if x in seen or d is None or not d.has_trait("pure") or d.regions:
            continue
        seen.add(x)
        if d.name == "tile.take":
            whole = d.x.owner if getattr(d.x, "owner", None) is not None else None
            out.add(whole.x if whole is not None and whole.name == "tile.reshape" else d.x)
        todo.extend(d.operands)
    return out


def _block_groups(block: Block) -> list[list[Operation]]:
    """Sets of stores in ``block`` (no step on the last axis) of blocks side by side along it,
    ``y[r, o:o+W]``, ``y[r, o+W:o+2W]``, ...: the same tensor, rows and width, in program order
    by their offset, with nothing but pure ops between the first and the last, whose values
    are all computed from slices of one tile (a product's column blocks put back together;
    blocks of other values keep their own stores, which vectorize as well)."""
    by_key: dict[tuple, list[Operation]] = {}
    for op in block.ops:
        steps = op.attributes.get("steps") or [1]
        if op.name == "tile.store" and steps[-1] == 1 and isinstance(op.value.type, TileType) \
                and op.value.type.rank >= 1 and len(op.box) - 1 not in (op.squeeze or []):
            base, _ = _last_offset(op)
            key = (op.tensor, tuple(op.offsets[:-1]), tuple(op.box), tuple(op.squeeze or ()), tuple(steps), base)
            by_key.setdefault(key, []).append(op)
    out = []
    ops = block.ops
    for members in by_key.values():
        width = members[0].box[-1]
        starts = [_last_offset(op)[1] for op in members]
        if len(members) < 2 or starts != [starts[0] + k * width for k in range(len(members))]:
            continue
        first, last = ops.index(members[0]), ops.index(members[-1])
        if not set.intersection(*(_cut_from(op.value) for op in members)):
            continue
        if all(_quiet(op, False) for op in ops[first + 1:last] if op not in members):
            out.append(members)
    return out


def _merge_blocks(group: list[Operation]) -> None:
    """One store of the blocks' values stacked along a new axis before the last and reshaped
    to the whole width: where the values are slices of one accumulator (a product's column
    blocks), the whole is that accumulator again and leaves through TMA."""
    last, first = group[-1], group[0]
    t = first.value.type
    n = len(group)
    b = Builder.before(last)
    stacked = b.value(tile.StackOp, [op.value for op in group], TileType((*t.shape[:-1], n, t.shape[-1]), t.dtype),
                      {"axis": t.rank - 1})
    whole = b.value(tile.ReshapeOp, [stacked], TileType((*t.shape[:-1], n * t.shape[-1]), t.dtype))
    attrs = dict(first.attributes)
    attrs["box"] = [*attrs["box"][:-1], attrs["box"][-1] * n]
    off = _range_offset(b, last, _last_offset(first)[1])
    b.create(tile.StoreOp, [last.tensor, whole, *last.offsets[:-1], off], [], attrs)
    for op in group:
        op.parent.ops.remove(op)


def _range_offset(b: Builder, op: Operation, phase0: int) -> Value:
    """The range's last-axis offset, from ``op``'s: ``op``'s minus its phase."""
    _, c = _last_offset(op)
    if c == phase0:
        return op.offsets[-1]
    delta = b.value(tile.ConstantOp, [], ScalarType(op.offsets[-1].type.dtype), {"value": phase0 - c})
    return b.value(tile.AddOp, [op.offsets[-1], delta], op.offsets[-1].type)


def _range_attrs(op: Operation) -> dict:
    attrs = dict(op.attributes)
    s = attrs["steps"][-1]
    attrs["box"] = [*attrs["box"][:-1], attrs["box"][-1] * s]
    steps = [*attrs["steps"][:-1], 1]
    if all(x == 1 for x in steps):
        attrs.pop("steps")
    else:
        attrs["steps"] = steps
    return attrs


def _merge_loads(kernel: Operation, group: list[Operation]) -> None:
    first = group[0]
    s = first.attributes["steps"][-1]
    phase0 = min(_last_offset(op)[1] for op in group)
    t = first.result.type
    b = Builder.before(first)
    off = _range_offset(b, first, phase0)
    whole = b.value(tile.LoadOp, [first.tensor, *first.offsets[:-1], off],
                    TileType((*t.shape[:-1], t.shape[-1] * s), t.dtype), _range_attrs(first))
    pairs = b.value(tile.ReshapeOp, [whole], TileType((*t.shape, s), t.dtype))
    for op in group:
        part = b.value(tile.TakeOp, [pairs], t, {"axis": t.rank, "index": _last_offset(op)[1] - phase0})
        replace_all_uses(kernel, op.result, part)
        op.parent.ops.remove(op)


def _merge_stores(group: list[Operation]) -> None:
    last = group[-1]
    s = last.attributes["steps"][-1]
    phase0 = min(_last_offset(op)[1] for op in group)
    values = [op.value for op in sorted(group, key=lambda op: _last_offset(op)[1])]
    t = values[0].type
    b = Builder.before(last)
    off = _range_offset(b, last, phase0)
    pairs = b.value(tile.StackOp, values, TileType((*t.shape, s), t.dtype), {"axis": t.rank})
    whole = b.value(tile.ReshapeOp, [pairs], TileType((*t.shape[:-1], t.shape[-1] * s), t.dtype))
    b.create(tile.StoreOp, [last.tensor, whole, *last.offsets[:-1], off], [], _range_attrs(last))
    for op in group:
        op.parent.ops.remove(op)
