"""The state of lowering one kernel to LLVM IR, which every ``lower*`` module shares.

Owns: :class:`Lowerer` (the builder, the lowered value of every IR value, the thread index as
a warpgroup role sees it, the kernel's shared memory and tensor maps, its pins and target) and
the values it holds beside LLVM values: :class:`TensorArg`, :class:`SmemTile`,
:class:`Barrier`, :class:`Ring`.  It sits below the handler modules (``lower_elementwise``,
``lower_global``, ``lower_hopper``) and ``lower``, which builds a ``Lowerer`` with their
handlers; it imports none of them.

Must not: lower any op itself (the handler modules do) or choose anything about the kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import llvmlite.ir as ir

from tkc.codegen import nvvm
from tkc.codegen.deferred import Deferred, Packed, Scope, StorePlan
from tkc.codegen.lower_values import Lowered, Sym, const_i32
from tkc.codegen.nvvm import I8, I32, I64
from tkc.errors import TkcCodegenError, TkcError
from tkc.ir.core import Block, Operation, Value
from tkc.ir.dialects.hopper import ONE_THREAD_OPS
from tkc.ir.layouts import SharedLayout
from tkc.ir.types import TensorType, TileType, Type
from tkc.pins import Options
from tkc.target import Target

__all__ = ["Barrier", "Handler", "Lowerer", "Ring", "SmemTile", "TensorArg"]


@dataclass(frozen=True)
class TensorArg:
    """A tensor parameter: its global address, one i32 size and one i64 stride (elements) per
    axis; for a ``@ ranks`` tensor, ``rank``, the rank whose copy the address is."""

    ptr: ir.Value
    sizes: tuple[ir.Value, ...]
    strides: tuple[ir.Value, ...]
    type: TensorType
    rank: ir.Value | None = None


@dataclass(frozen=True)
class SmemTile:
    """A shared tile: byte ``offset`` from the dynamic shared base, laid out by ``layout``,
    plus ``at`` bytes known only at run time (a ring stage picked by a run-time index)."""

    offset: int
    layout: SharedLayout
    at: ir.Value | None = None


@dataclass(frozen=True)
class Barrier:
    """An mbarrier at byte ``offset`` from the dynamic shared base, plus ``at`` run-time bytes
    (a ring stage)."""

    offset: int
    at: ir.Value | None = None


@dataclass(frozen=True)
class Ring:
    """``stages`` shared tiles or mbarriers ``stride`` bytes apart, ``first`` being stage 0
    (docs/hopper.md "Rings and roles"); only ``hopper.stage``, ``hopper.mbarrier_init`` and
    ``hopper.cluster_reduce`` (its pair of barriers) take one."""

    first: SmemTile | Barrier
    stages: int
    stride: int


Handler = Callable[["Lowerer", Operation], None]


class Lowerer:
    """The state of lowering one kernel: the builder, the value of every IR value so far
    (an LLVM value, a list of them for a register tile, or a :class:`TensorArg`,
    :class:`SmemTile`, :class:`Barrier`), the thread index, the kernel's resources, its pins
    and target, and the handler of every op (``handlers``, by op name)."""

    def __init__(self, kernel: Operation, fn: ir.Function, threads: int,
                 smem: ir.GlobalVariable | None, tmaps: Sequence[ir.Argument], handlers: Mapping[str, Handler],
                 plan: StorePlan, options: Options, target: Target) -> None:
        self.kernel = kernel
        self.options, self.target = options, target
        self.fn = fn
        self.threads = threads
        self.smem = smem
        self.tmaps = list(tmaps)
        # A multi-GPU kernel's rank parameters (lower_ranks.bind_params sets them): ``rank``,
        # ``num_ranks``, each ``@ ranks`` parameter's peers array by index, the barrier pads.
        self.rank: ir.Value | None = None
        self.num_ranks: ir.Value | None = None
        self.peers: dict[int, ir.Value] = {}
        self.pads: ir.Value | None = None
        self.env: dict[Value, Any] = {}
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        # Inside a hopper.role, ``tid`` counts from the role's first thread and ``threads`` is
        # the role's size: layouts, thread-0 ops and warp ids all see the role as a CTA.
        self.tid: ir.Value = nvvm.sreg(self.b, "tid.x", "tid")
        self.role: Operation | None = None
        self.handlers = handlers
        # The loads a store emits run by run, the ops stores compute run by run, the rows
        # kept packed, and where deferred values are being emitted (tkc/codegen/deferred.py).
        self.plan = plan
        self.deferred_scope: Scope | None = None

    # ------------------------------------------------------------------ values
    def get(self, v: Value, packed: bool = False) -> Any:
        """The lowered value of ``v``; a :class:`Packed` tile unpacked here unless ``packed``."""
        x = self.env[v]
        return x.values(self) if isinstance(x, Packed) and not packed else x

    def set(self, v: Value, x: Any) -> None:
        self.env[v] = x

    def tile(self, op: Operation, v: Value, deferred: bool = False) -> list | Deferred:
        """The values of register tile ``v`` (a scalar is an error at ``op``); with
        ``deferred``, a deferred tile as it is (for the ops that pass one through)."""
        x = self.get(v)
        if isinstance(x, Deferred) and deferred:
            return x
        if isinstance(x, Deferred):
            # store_plan lets a deferred value reach only ops that take one.
            raise TkcCodegenError(f"'{op.name}': {v.type} is deferred to its store and cannot be "
                                  f"used here", op.loc)
        if not isinstance(x, list):
            raise TkcCodegenError(f"'{op.name}': expected a register tile, got {v.type}", op.loc)
        return x

    def thread(self, layout: object, opaque: bool = False) -> Sym:
        """The thread index as a symbol over the threads ``layout`` spans (replicated beyond
        them).  ``opaque``: through an :func:`~tkc.codegen.nvvm.opaque` copy of ``tid`` made
        here, so what is computed from it is neither shared with earlier code nor hoisted out
        of a loop."""
        span = int(getattr(layout, "threads", self.threads))
        t = Sym(self.b, nvvm.opaque(self.b, self.tid) if opaque else self.tid)
        return t if span >= self.threads else t % span

    def coords(self, op: Operation, layout: object, opaque: bool = False) -> list[tuple[Sym | int, ...]]:
        """Per value of this thread, the tile coordinates it holds (docs/hopper.md §2).
        ``opaque``: each value's from an opaque thread index of its own (:meth:`thread`), so
        LLVM cannot compute them all up front and hold them through a loop."""
        t, regs = self.coord_parts(op, layout, opaque)
        out = []
        for i, r in enumerate(regs):
            if opaque and i:
                t = layout.thread_coords(self.thread(layout, opaque=True))
            out.append(tuple(tc + rc for tc, rc in zip(t, r)))
        return out

    def coord_parts(self, op: Operation, layout: object,
                    opaque: bool = False) -> tuple[tuple[Sym | int, ...], list[tuple[int, ...]]]:
        """The two terms of :meth:`coords`: this thread's coordinates (from an opaque thread
        index with ``opaque``), and per value the constant offset from them (a layout places
        value ``i`` at ``thread_coords + reg_coords(i)``)."""
        try:
            t = layout.thread_coords(self.thread(layout, opaque))
            return t, [tuple(int(rc) for rc in layout.reg_coords(i)) for i in range(layout.regs)]
        except (ValueError, TypeError, AttributeError) as e:
            raise TkcCodegenError(f"'{op.name}': cannot place the values of layout {layout}: {e}",
                                  op.loc) from None

    def regs(self, op: Operation, t: Type) -> int:
        if not isinstance(t, TileType) or t.space != "reg" or t.layout is None:
            raise TkcCodegenError(f"'{op.name}': {t} has no register layout", op.loc)
        return int(t.layout.regs)

    def shared(self, op: Operation, v: Value) -> SmemTile:
        """The shared tile ``v`` (a whole ring is an error: it is used through ``hopper.stage``)."""
        x = self.env[v]
        if not isinstance(x, SmemTile):
            raise TkcCodegenError(f"'{op.name}': expected a shared tile, got {self._what(x)}", op.loc)
        return x

    def barrier(self, op: Operation, v: Value) -> Barrier:
        """The mbarrier ``v`` (a whole ring is an error: it is used through ``hopper.stage``)."""
        x = self.env[v]
        if not isinstance(x, Barrier):
            raise TkcCodegenError(f"'{op.name}': expected an mbarrier, got {self._what(x)}", op.loc)
        return x

    @staticmethod
    def _what(x: Any) -> str:
        if isinstance(x, Ring):
            return f"a ring of {x.stages} stages (pick one with hopper.stage)"
        return type(x).__name__

    def offset(self, x: SmemTile | Barrier, extra: int | ir.Value = 0) -> int | ir.Value:
        """Byte offset from the dynamic shared base of ``extra`` bytes into ``x``: a constant
        unless ``x`` is a ring stage or ``extra`` is known only at run time."""
        static = x.offset + (extra if isinstance(extra, int) else 0)
        dynamic = [v for v in (x.at, None if isinstance(extra, int) else extra) if v is not None]
        if not dynamic:
            return static
        out = dynamic[0] if static == 0 else self.b.add(dynamic[0], const_i32(static))
        return out if len(dynamic) == 1 else self.b.add(out, dynamic[1])

    def ptr(self, x: SmemTile | Barrier, extra: int | ir.Value = 0) -> ir.Value:
        """A shared pointer ``extra`` bytes into tile or barrier ``x``."""
        return self.smem_ptr(self.offset(x, extra))

    def smem_ptr(self, offset: int | ir.Value) -> ir.Value:
        """``offset`` bytes into the dynamic shared array (addrspace 3)."""
        if self.smem is None:
            raise TkcCodegenError("the kernel uses shared memory but has no smem_bytes", self.kernel.loc)
        off = const_i32(offset) if isinstance(offset, int) else offset
        return self.b.gep(self.smem, [off], source_etype=I8)

    def smem_addr(self, offset: int | ir.Value) -> ir.Value:
        """The 32-bit shared address of ``offset`` (what descriptors and address math use)."""
        return self.b.trunc(self.b.ptrtoint(self.smem_ptr(offset), I64), I32)

    # ----------------------------------------------------------------- roles
    @contextmanager
    def in_role(self, role: Operation, tid: ir.Value) -> Iterator[None]:
        """Lower the ops of ``role`` with ``tid`` (rebased to the role's first thread) as the
        thread index and the role's threads as the CTA."""
        saved = self.tid, self.threads, self.role
        self.tid, self.threads, self.role = tid, self.target.warpgroup * role.attributes["warpgroups"], role
        try:
            yield
        finally:
            self.tid, self.threads, self.role = saved

    def sync(self) -> None:
        """``bar.sync`` over the threads that run this code: the CTA (barrier 0) outside roles,
        named barrier ``1 + first`` over the role's threads inside one (docs/hopper.md), so a
        role never waits for warpgroups that skip its region."""
        if self.role is None:
            nvvm.call(self.b, "barrier.cta.sync.aligned.all", 0)
        else:
            # A role narrowed to a few warps (``warps``) meets over the warps that run it.
            warps = self.role.attributes.get("warps")
            count = 32 * warps if warps else self.threads
            nvvm.call(self.b, "barrier.cta.sync.aligned.count", 1 + self.role.attributes["first"], count)

    def if_then(self, cond: ir.Value, body: Callable[[], None], name: str) -> None:
        """Run ``body``'s code only where ``cond`` holds (no values flow out)."""
        then = self.fn.append_basic_block(f"{name}.then")
        done = self.fn.append_basic_block(f"{name}.end")
        self.b.cbranch(cond, then, done)
        self.b.position_at_end(then)
        body()
        self.b.branch(done)
        self.b.position_at_end(done)

    def either(self, cond: ir.Value, then: Callable[[], list], otherwise: Callable[[], list],
               name: str) -> list[ir.Value]:
        """``then()`` where ``cond`` holds, else ``otherwise()``, as a branch (each side's
        instructions run only on its side); the values they return merge pairwise in phis."""
        b = self.b
        yes = self.fn.append_basic_block(f"{name}.vec")
        no = self.fn.append_basic_block(f"{name}.elem")
        done = self.fn.append_basic_block(f"{name}.end")
        b.cbranch(cond, yes, no)
        ends = []
        for block, body in ((yes, then), (no, otherwise)):
            b.position_at_end(block)
            ends.append((body(), b.block))
            b.branch(done)
        b.position_at_end(done)
        out = []
        for x, y in zip(ends[0][0], ends[1][0]):
            phi = b.phi(x.type)
            phi.add_incoming(x, ends[0][1])
            phi.add_incoming(y, ends[1][1])
            out.append(phi)
        return out

    # -------------------------------------------------------------------- ops
    def block(self, block: Block) -> list[Lowered] | None:
        """Lower a block's ops; returns the lowered ``tile.yield`` operands (None otherwise)."""
        ops = block.ops
        i = 0
        while i < len(ops):
            op = ops[i]
            if op.name == "tile.yield":
                return [self.get(v) for v in op.operands]
            if op.name == "tile.return":
                return None
            if op.name in ONE_THREAD_OPS:
                # A run of thread-0 ops shares one branch (docs/hopper.md §3: thread 0 executes them;
                # inside a role, the role's first thread, as self.tid is rebased there).
                j = i
                while j < len(ops) and ops[j].name in ONE_THREAD_OPS:
                    j += 1
                run = ops[i:j]
                is0 = self.b.icmp_unsigned("==", self.tid, const_i32(0))
                self.if_then(is0, lambda run=run: [self.op(o) for o in run], "thread0")
                i = j
                continue
            self.op(op)
            i += 1
        return None

    def op(self, op: Operation) -> None:
        handler = self.handlers.get(op.name)
        if handler is None:
            raise TkcCodegenError(f"codegen does not lower '{op.name}' (is this hopper-level IR after "
                                  f"allocate-smem?)", op.loc)
        try:
            handler(self, op)
        except TkcError as e:
            if e.loc is None or e.loc.line == 0:
                raise type(e)(e.message, op.loc) from None
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise TkcCodegenError(f"'{op.name}': {e}", op.loc) from None
