"""Register tiles emitted where they are used: a store's inputs run by run, 16-bit rows kept packed.

A store's value is often the end of a chain that reads a vector only to write the tile:
LayerNorm's ``(x - mean) * rstd * w + b``, RMSNorm's ``x * rms * w``.  Lowered op by op,
all of ``w`` and ``b`` are loaded (and widened to f32) before the first multiply and stay
live beside ``x`` until the store: a 16k-column block over four warps holds 128 registers
of ``x`` and 128 more of ``w`` and ``b``, so ptxas spills or the SM holds fewer programs.

Such loads are *deferred* instead: the load's handler records the load, and every
elementwise or register shape op fed by a deferred value records how to compute its value
``i`` (:class:`Deferred`).  The store then emits, run by run of its own vector accesses,
the deferred loads of the run :data:`LOOKAHEAD` runs ahead, this run's arithmetic and this
run's store (``lower_global.store``), so only a few runs of ``w`` and ``b`` are live at a
time.

Which loads (:func:`store_plan`): a register-tile ``hopper.load``

- holding more of a thread's values than the first ``LOOKAHEAD + 1`` runs of the store load
  anyway (at most 16 B a run): a row of 256 bf16 over 32 lanes is 16 B a thread, issued
  whole before the first store either way, and left where the program put it;
- whose tile has fewer axes than the stored tile: a vector broadcast along the tile's other
  axes, which every program reads again and which is therefore likely in L2, where a short
  lookahead hides its latency.  Loads of the stored tile's own shape stay where the program
  put them, all in flight together: the kernel's bandwidth is theirs;
- whose every use, transitively, is an elementwise op or a register shape op that only picks
  values (:func:`_through`) in the same block, ending in the value of exactly one
  ``hopper.store``;
- of a tensor the kernel never writes, so reading it later, after some of the kernel's own
  stores, reads the same values.  (Tensors a kernel reads and tensors it writes must not
  overlap, as for every tkc kernel: programs run in no fixed order.)

The ops between such loads and the store are the store's *cone* (``StorePlan.cones``: such
ops whose every use leads to that one store).  A cone op is emitted by the store,
value by value, whenever one of its operands is deferred or packed.

*Packed* tiles (``StorePlan.packed``, :class:`Packed`): a 16-bit float tile that stays live
until a store because one of its uses is in that store's cone (LayerNorm's ``x``, read for
both statistics and again for the output) is kept as the 32-bit words its load moved, two
values a register, and unpacked again by each op that uses it (each reduction, and the store
run by run); each run's words pass through one empty asm statement first, so that LLVM does
not merge the unpackings back into one long-lived f32 value.  ptxas then fits a 16k-column,
4-warp LayerNorm block (128 values a thread) in the 128 registers of four programs an SM, where
it spilled 594 B before.  A tile whose uses all come before the store
(softmax's ``x``, whose exponentials the store reads) is unpacked once, as before: packing it
only adds the unpacking of each use.  (Its second read in a two-sweep softmax feeds only the
output, and is packed.)  Packing softmax's one-block ``x`` anyway and computing ``exp(x - m)``
again in the store instead of holding it raised ptxas's count (16k columns over 8 warps: 80 ->
128 registers; 4k over 4 warps: 47 -> 56): ptxas merges the unpackings of the max and of the
sum, which sit close together, and holds ``x`` widened after all.

Must not: change what any op computes or which elements it touches; only where the
instructions of a deferred load, of a packed tile's unpacking and of the cone ops they feed
are emitted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

import llvmlite.ir as ir

from tkc.codegen import nvvm
from tkc.codegen.runs import elem_bytes, vector_runs, vectorized
from tkc.ir.core import Operation, uses
from tkc.ir.dialects import hopper
from tkc.ir.types import TileType

if TYPE_CHECKING:  # the lowering state sits above the values it holds
    from tkc.codegen.lowerer import Lowerer

#: Runs of the store ahead of the one being stored whose deferred loads are already issued:
#: their latency (an L2 hit) overlaps the arithmetic and stores of the runs before them.
LOOKAHEAD = 2

#: Register shape ops a deferred value passes through besides the elementwise ops (the
#: ``elementwise`` trait, ``lower_elementwise._map``): they only pick values (a
#: ``convert_layout`` only when it has no scratch tile).
_PICKING = frozenset({"tile.expand_dims", "tile.broadcast", "hopper.convert_layout"})


def _through(op: Operation) -> bool:
    """Whether a deferred value passes through ``op`` value by value."""
    # rand computes four of its values in one call (lower_rand.py): never value by value.
    if op.name == "tile.rand":
        return False
    return op.has_trait("elementwise") or (op.name in _PICKING and not (op.name == "hopper.convert_layout"
                                                                         and op.scratch))


class StorePlan(NamedTuple):
    """What a kernel's stores emit where they use it (module doc): the deferred loads, the
    stores' cones, and the loads kept packed."""

    deferred: frozenset[Operation]
    cones: frozenset[Operation]
    packed: frozenset[Operation]


def store_plan(kernel: Operation) -> StorePlan:
    """The :class:`StorePlan` of ``kernel`` (a hopper-level ``tile.kernel``)."""
    users = uses(kernel)
    written = {op.tensor for op in kernel.walk() if op.name in hopper.LOWERED_WRITES}
    loads = [op for op in kernel.walk() if op.name == "hopper.load" and isinstance(op.result.type, TileType)]
    deferred = frozenset(op for op in loads if op.tensor not in written and _worth_deferring(op)
                         and _broadcast_into(op, _sole_store(op, users)))
    cones = frozenset(op for op in kernel.walk() if _through(op) and _sole_store(op, users) is not None)
    # A staged load's read (stage-loads) keeps its words packed alike: its runs are vector reads.
    reads = [op for op in kernel.walk() if op.name == "hopper.async_read"]
    packed = frozenset(op for op in [*loads, *reads] if op not in deferred
                       and op.result.type.dtype.name in ("bf16", "f16")
                       and (vectorized(op) if op.name == "hopper.load" else _vector_reads(op))
                       and _live_until_a_store(op, users, cones))
    return StorePlan(deferred, cones, packed)


def _vector_reads(read: Operation) -> bool:
    """Whether every run of a ``hopper.async_read`` is one vector read of words."""
    t = read.result.type
    return all(n > 1 for _, n in vector_runs(t.layout, elem_bytes(t.dtype)))


def _worth_deferring(load: Operation) -> bool:
    """More of a thread's values than the first store's lookahead would issue anyway."""
    t = load.result.type
    return int(t.layout.regs) * load.tensor.type.dtype.bits > 8 * nvvm.VECTOR_BYTES * (LOOKAHEAD + 1)


def _broadcast_into(load: Operation, store: Operation | None) -> bool:
    """``store`` exists and writes a tile of more axes than ``load`` reads."""
    return store is not None and len(store.value.type.shape) > len(load.result.type.shape)


def _live_until_a_store(load: Operation, users: dict, cones: frozenset[Operation]) -> bool:
    """Whether ``load``'s values, as they are or widened to f32 (the same values in
    registers), feed an op of a store's cone."""
    values = [load.result] + [u.result for u in users.get(load.result, [])
                              if u.name == "tile.cast" and u.result.type.dtype.name == "f32"]
    return any(u in cones for v in values for u in users.get(v, []))


def _sole_store(op: Operation, users: dict) -> Operation | None:
    """The one ``hopper.store`` that every use of ``op`` leads to through ops a deferred
    value passes through (:func:`_through`) in its block, or None."""
    stores: set[Operation] = set()
    seen: set[Operation] = set()
    todo = [op.result]
    while todo:
        v = todo.pop()
        for u in users.get(v, []):
            if u.parent is not op.parent:
                return None
            if u.name == "hopper.store" and u.value is v and v is not u.tensor and v not in u.offsets:
                stores.add(u)
            elif _through(u):
                if u not in seen:
                    seen.add(u)
                    todo.append(u.result)
            else:
                return None
    return stores.pop() if len(stores) == 1 else None


# --------------------------------------------------------------------------- deferred values


class Scope:
    """Where deferred values are being emitted: one side of a store's branch.  Values
    emitted on one side are reused on that side only (``values``); ``whole``: the side
    by runs (every deferred load's access may go by runs), which loads run by run."""

    def __init__(self, whole: bool) -> None:
        self.whole = whole
        self.values: dict[tuple[Any, Any], Any] = {}


@contextmanager
def emitting(lw: Lowerer, whole: bool) -> Iterator[None]:
    """Emit deferred values in a fresh :class:`Scope` (one side of a store's branch)."""
    saved = lw.deferred_scope
    lw.deferred_scope = Scope(whole)
    try:
        yield
    finally:
        lw.deferred_scope = saved


class Deferred:
    """A register tile of ``n`` values per thread, emitted value by value where used."""

    n: int

    def __len__(self) -> int:
        return self.n

    def at(self, lw: Lowerer, i: int) -> ir.Value:
        """Value ``i``, emitted here unless this scope has it already."""
        raise NotImplementedError

    def issue(self, lw: Lowerer, i: int) -> None:
        """Emit the loads value ``i`` needs (on the side by runs), not yet the arithmetic."""
        raise NotImplementedError

    def loads(self) -> Iterator[Deferred]:
        """The deferred loads this value is computed from (each once)."""
        raise NotImplementedError

    def values(self, lw: Lowerer) -> list[ir.Value]:
        return [self.at(lw, i) for i in range(self.n)]


class Packed:
    """A register tile of 16-bit floats held as the 32-bit words its load moved, unpacked
    again by each op that uses it: two values a register between the uses instead of one."""

    def __init__(self, runs: list[tuple[int, int, list[ir.Value]]],
                 unpack: Callable[[ir.IRBuilder, list[ir.Value], int], list[ir.Value]], n: int) -> None:
        self.runs, self.unpack, self.n = runs, unpack, n
        self.run_of = {i: k for k, (first, m, _) in enumerate(runs) for i in range(first, first + m)}

    def __len__(self) -> int:
        return self.n

    def _run(self, lw: Lowerer, k: int) -> list[ir.Value]:
        first, m, words = self.runs[k]
        return self.unpack(lw.b, nvvm.opaque_all(lw.b, words), m)

    def values(self, lw: Lowerer) -> list[ir.Value]:
        """Every value, unpacked here."""
        return [v for k in range(len(self.runs)) for v in self._run(lw, k)]

    def at(self, lw: Lowerer, i: int) -> ir.Value:
        k = self.run_of[i]
        memo = lw.deferred_scope.values
        if (self, k) not in memo:
            memo[self, k] = self._run(lw, k)
        return memo[self, k][i - self.runs[k][0]]


def value_at(lw: Lowerer, x: Any, i: int) -> Any:
    """Value ``i`` of an operand: a deferred tile's, a register tile's, or a scalar itself."""
    if isinstance(x, (Deferred, Packed)):
        return x.at(lw, i)
    return x[i] if isinstance(x, list) else x


class Mapped(Deferred):
    """``fn`` applied value by value to operands of which at least one is deferred."""

    def __init__(self, fn: Callable[..., ir.Value], xs: tuple, n: int) -> None:
        self.fn, self.xs, self.n = fn, xs, n

    def at(self, lw: Lowerer, i: int) -> ir.Value:
        memo = lw.deferred_scope.values
        key = (self, i)
        if key not in memo:
            memo[key] = self.fn(*(value_at(lw, x, i) for x in self.xs))
        return memo[key]

    def issue(self, lw: Lowerer, i: int) -> None:
        for x in self.xs:
            if isinstance(x, Deferred):
                x.issue(lw, i)

    def loads(self) -> Iterator[Deferred]:
        seen: set[Deferred] = set()
        for x in self.xs:
            if isinstance(x, Deferred):
                for ld in x.loads():
                    if ld not in seen:
                        seen.add(ld)
                        yield ld


class Picked(Deferred):
    """Value ``i`` is value ``index[i]`` of ``src`` (a broadcast, a register-only layout change)."""

    def __init__(self, src: Deferred, index: list[int]) -> None:
        self.src, self.index, self.n = src, index, len(index)

    def at(self, lw: Lowerer, i: int) -> ir.Value:
        return self.src.at(lw, self.index[i])

    def issue(self, lw: Lowerer, i: int) -> None:
        self.src.issue(lw, self.index[i])

    def loads(self) -> Iterator[Deferred]:
        return self.src.loads()
