"""``hopper.load`` and ``hopper.store``: a thread's register values to and from global memory.

Owns: the address and bounds test of each value (docs/hopper.md §3: out-of-bounds values
read ``other`` and are never written; §4: i32 sizes, i64 strides in elements), and the
vector accesses that move several values at once.

A *run* is a stretch of values ``i .. i+L-1`` of a thread whose tile coordinates differ only
in the last axis, by +1 each, starting at a multiple of ``L`` on every thread
(:func:`tkc.codegen.runs.vector_runs` reads this off the layout's coordinates; ``L`` is a power of two and
``L`` elements are at most 16 B); a value in no longer run is a run of 1.  Each tile op
branches once at run time:

- *by runs*: the tensor *fast* for every run length (last-axis stride 1, the last-axis
  offset, the other strides and the base address multiples of ``L`` elements) and every run
  wholly inside the tensor or wholly outside it (the box in bounds, or reaching past the
  tensor's end where offset and size are multiples of the run lengths: a row shorter than its
  block).  Straight-line code, one access a run (``ld``/``st.global[.v2|.v4]``), each
  predicated on its run's first element lying inside (a load's runs outside read its
  ``other``), nothing between them, so the accesses of the whole tile are in flight together
  and no address or bounds test stays live across the loop that holds the op.  A box in
  bounds takes this side too, its predicates all true: a side of its own without them cost
  LLVM and ptxas a third more code and gained LayerNorm 0.8-1.0% of its bandwidth on an H200.
- *edge* (a tile at the tensor's edge, or a strided tensor): one rolled loop over the runs
  of each length, whose body is written once: the run's coordinates (this thread's plus the
  run's constant offset, from a table or an affine formula), then its vector access where
  the run is whole in bounds and the tensor fast, else one predicated scalar access per
  element, touching only the in-bounds ones.  The values pass through a per-thread local
  array (stored before a store's loop, read after a load's).  Edge code is then a few dozen
  instructions an op instead of the tile's values unrolled, which halves what LLVM and
  ptxas see for the examples and their compile time; the local memory is touched only at
  edges.

Both sides touch exactly the in-bounds elements, so neither the strides nor the alignment
of a tensor change what an op reads or writes.  The loads merge as the words of the access,
unpacked after the branch, so the vector side holds nothing that waits for the data.  Every
access is side-effecting inline PTX: LLVM neither moves a load across a store nor merges or
speculates accesses, and no out-of-bounds address is touched.

A store whose value comes from deferred loads (tkc/codegen/deferred.py) takes their boxes
into its own branch: its side by runs issues their runs a few runs ahead of its own accesses,
its edge side runs their edge loops and reads their values back run by run.

Must not: choose a layout or know a layout formula; runs come from ``layout.coords``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import NamedTuple

import llvmlite.ir as ir
import numpy as np

from tkc.codegen import nvvm
from tkc.codegen.deferred import LOOKAHEAD, Deferred, Packed, emitting
from tkc.codegen.lower_values import (Sym, as_value, bits_type, const_i32, constant, fp8_decode_words, from_mem,
                                      mem_type, pack_words, packs_in_fours, packs_in_pairs, to_mem, widen)
from tkc.codegen.lowerer import Lowerer, TensorArg
from tkc.codegen.runs import elem_bytes, private_run_offset, runs_of, vector_runs
from tkc.codegen.nvvm import I16, I32, I64
from tkc.dtypes import DType
from tkc.ir.core import Operation
from tkc.ir.types import TileType

#: Stores are streaming (``st.global.cs``: evict first from L1 and L2).  A kernel does not read
#: back what it stores, and a norm kernel's second sweep over its input finds more of it in L2
#: when the output it streams out does not push it out.
STORE = "st.global.cs"


# --------------------------------------------------------------------------- addresses


class _Element(NamedTuple):
    addr: ir.Value  # global pointer (meaningless where ``ok`` is false)
    ok: ir.Value  # i1: in bounds on every axis


def _locate(lw: Lowerer, op: Operation, tensor: TensorArg, offs: list, coord: tuple,
            signed_last: bool = False) -> tuple[ir.Value, ir.Value | None, ir.Value]:
    """The address of the tensor element at tile coordinate ``coord``, whether it is in
    bounds on every axis but the last (None for a 1-D tensor), and its last-axis position.
    With ``signed_last`` the last axis's position is taken as signed, so that strides from
    an element before the tensor still land on the right ones."""
    b = lw.b
    squeeze = set(op.squeeze or [])
    it = iter(coord)
    last = len(offs) - 1
    index = ok = pos = None
    for axis, off in enumerate(offs):
        pos = off if axis in squeeze else b.add(off, as_value(next(it)))
        if axis < last:
            inb = b.icmp_unsigned("<", pos, tensor.sizes[axis])  # also rejects negatives
            ok = inb if ok is None else b.and_(ok, inb)
        wide = b.sext(pos, I64) if signed_last and axis == last else widen(b, pos)
        term = b.mul(wide, tensor.strides[axis])
        index = term if index is None else b.add(index, term)
    return b.gep(tensor.ptr, [index], source_etype=mem_type(tensor.type.dtype)), ok, pos


def _global_element(lw: Lowerer, op: Operation, tensor: TensorArg, offs: list, coord: tuple) -> _Element:
    """The address and bounds test of the tensor element at tile coordinate ``coord``."""
    b = lw.b
    addr, ok, pos = _locate(lw, op, tensor, offs, coord)
    inb = b.icmp_unsigned("<", pos, tensor.sizes[-1])
    return _Element(addr, inb if ok is None else b.and_(ok, inb))


def _run_bounds(lw: Lowerer, op: Operation, tensor: TensorArg, offs: list, coord: tuple,
                n: int) -> tuple[ir.Value, ir.Value, ir.Value]:
    """For the run of ``n`` elements from tile coordinate ``coord`` (along the last axis,
    which a run never squeezes): the address of its first element, signed along the last
    axis so that ``e`` strides on reach element ``e`` even where the first lies before the
    tensor, and ``[lo, hi)``, the elements in bounds (empty where the row is outside)."""
    b = lw.b
    base, row_ok, pos = _locate(lw, op, tensor, offs, coord, signed_last=True)
    first = b.sext(pos, I64)
    last = len(offs) - 1

    def clamp(x: ir.Value) -> ir.Value:  # into [0, n], in i64 so that nothing wraps
        x = b.select(b.icmp_signed("<", x, ir.Constant(I64, 0)), ir.Constant(I64, 0), x)
        return b.trunc(b.select(b.icmp_signed(">", x, ir.Constant(I64, n)), ir.Constant(I64, n), x), I32)

    lo = clamp(b.neg(first))
    hi = clamp(b.sub(b.zext(tensor.sizes[last], I64), first))
    if row_ok is not None:
        hi = b.select(row_ok, hi, const_i32(0))
    return base, lo, hi


def _fast(lw: Lowerer, tensor: TensorArg, offs: list, n: int) -> ir.Value:
    """i1: runs of ``n`` elements of this op are contiguous and ``n``-element aligned in
    memory: last-axis stride 1, and the last-axis offset, every other stride and the base
    address multiples of ``n`` elements.  (The run's first coordinate is a multiple of
    ``n`` by construction, so its address is then too.)"""
    b = lw.b
    eb = elem_bytes(tensor.type.dtype)

    def multiple(x: ir.Value, m: int) -> ir.Value:
        ty = x.type
        return b.icmp_unsigned("==", b.and_(x, ir.Constant(ty, m - 1)), ir.Constant(ty, 0))

    conds = [b.icmp_unsigned("==", tensor.strides[-1], ir.Constant(I64, 1)), multiple(offs[-1], n)]
    conds += [multiple(s, n) for s in tensor.strides[:-1]]
    conds.append(multiple(b.ptrtoint(tensor.ptr, I64), n * eb))
    out = conds[0]
    for c in conds[1:]:
        out = b.and_(out, c)
    return out


# --------------------------------------------------------------------------- PTX


def _ld_asm(dt: DType) -> tuple[str, str, ir.IntType]:
    """(type suffix, asm constraint, LLVM type) of one element's access."""
    ty = bits_type(dt)
    if ty == I64:
        return "b64", "l", ty
    if ty == I32:
        return "b32", "r", ty
    return ("b16", "h", I16) if ty == I16 else ("u8", "h", I16)


def _words(total_bytes: int, eb: int) -> tuple[int, str, str, ir.IntType]:
    """(word count, type suffix, constraint, LLVM type) of a vector access of ``total_bytes``
    (elements of ``eb`` bytes): b32 words, b64 ones for 8-byte elements."""
    if eb == 8:
        return total_bytes // 8, "b64", "l", I64
    if total_bytes >= 4:
        return total_bytes // 4, "b32", "r", I32
    return 1, "b16", "h", I16


def _vector_operand(regs: list[str]) -> str:
    return regs[0] if len(regs) == 1 else "{" + ", ".join(regs) + "}"


def _vector_op(w: int) -> str:
    return "" if w == 1 else f".v{w}"


def _pred(b: ir.IRBuilder, ok: ir.Value) -> ir.Value:
    return b.zext(ok, I32)


def _load_element(b: ir.IRBuilder, addr: ir.Value, ok: ir.Value, dt: DType) -> ir.Value:
    """The bits (an int of its memory width) of the element at ``addr``, 0 where ``ok`` is false."""
    suffix, cons, ty = _ld_asm(dt)
    asm = ("{ .reg .pred p; setp.ne.b32 p, $2, 0; "
           f"mov.b{ty.width} $0, 0; @p ld.global.{suffix} $0, [$1]; }}")
    fty = ir.FunctionType(ty, [nvvm.ptr(nvvm.GLOBAL), I32])
    raw = b.asm(fty, asm, f"={cons},l,r", [addr, _pred(b, ok)], side_effect=True)
    width = elem_bytes(dt) * 8
    return b.trunc(raw, ir.IntType(width)) if width < ty.width else raw


def _pack(b: ir.IRBuilder, bits: list[ir.Value], dt: DType) -> list[ir.Value]:
    """The words of one vector access holding the element bits ``bits``, little-endian:
    element k is byte ``k * size`` of the run."""
    eb = elem_bytes(dt)
    w, _, _, ty = _words(len(bits) * eb, eb)
    per_word = ty.width // 8 // eb
    words = []
    for j in range(w):
        word = None
        for k in range(per_word):
            v = bits[j * per_word + k]
            v = b.zext(v, ty) if v.type.width < ty.width else v
            v = b.shl(v, ir.Constant(ty, k * eb * 8)) if k else v
            word = v if word is None else b.or_(word, v)
        words.append(word)
    return words


def _unpack(b: ir.IRBuilder, words: list[ir.Value], dt: DType, n: int) -> list[ir.Value]:
    """The element bits of ``n`` elements packed in ``words`` (inverse of :func:`_pack`)."""
    eb = elem_bytes(dt)
    ty = words[0].type
    per_word = ty.width // 8 // eb
    out = []
    for k in range(n):
        word = words[k // per_word]
        shift = k % per_word * eb * 8
        v = b.lshr(word, ir.Constant(ty, shift)) if shift else word
        out.append(b.trunc(v, ir.IntType(eb * 8)) if eb * 8 < ty.width else v)
    return out


def _load_vector(b: ir.IRBuilder, addr: ir.Value, dt: DType, n: int, ok: ir.Value | None = None,
                 fill: list[ir.Value] | None = None) -> list[ir.Value]:
    """The words of ``n`` consecutive elements at ``addr`` (aligned to their size), one access;
    with ``ok``, only where it holds: elsewhere the words ``fill`` (zeros without)."""
    w, suffix, cons, ty = _words(n * elem_bytes(dt), elem_bytes(dt))
    ld = f"ld.global{_vector_op(w)}.{suffix} {_vector_operand([f'${j}' for j in range(w)])}, [${w}];"
    ret = ty if w == 1 else ir.LiteralStructType([ty] * w)
    if ok is None:
        raw = b.asm(ir.FunctionType(ret, [nvvm.ptr(nvvm.GLOBAL)]), ld, ",".join([f"={cons}"] * w + ["l"]), [addr],
                    side_effect=True)
    else:
        ins = [addr, _pred(b, ok), *(fill or [])]
        first = " ".join(f"mov.b{ty.width} ${j}, {f'${w + 2 + j}' if fill else 0};" for j in range(w))
        asm = f"{{ .reg .pred p; setp.ne.b32 p, ${w + 1}, 0; {first} @p {ld} }}"
        raw = b.asm(ir.FunctionType(ret, [x.type for x in ins]), asm,
                    ",".join([f"={cons}"] * w + ["l", "r"] + [cons] * len(fill or [])), ins, side_effect=True)
    return [raw] if w == 1 else [b.extract_value(raw, j) for j in range(w)]


def _store_element(b: ir.IRBuilder, addr: ir.Value, ok: ir.Value, bits: ir.Value, dt: DType) -> None:
    suffix, cons, ty = _ld_asm(dt)
    asm = f"{{ .reg .pred p; setp.ne.b32 p, $2, 0; @p {STORE}.{suffix} [$0], $1; }}"
    fty = ir.FunctionType(ir.VoidType(), [nvvm.ptr(nvvm.GLOBAL), ty, I32])
    v = b.zext(bits, ty) if bits.type.width < ty.width else bits
    b.asm(fty, asm, f"l,{cons},r", [addr, v, _pred(b, ok)], side_effect=True)


def _store_words(b: ir.IRBuilder, bits: list[ir.Value], dt: DType, vals: list[ir.Value]) -> list[ir.Value]:
    """The words one vector access stores for the element bits ``bits`` (their register
    values ``vals``).  bf16/f16 pairs are converted straight from their values into each b32
    word (one ``cvt.rn.*x2.f32`` a pair)."""
    if packs_in_pairs(dt) and len(vals) % 2 == 0:
        return pack_words(b, vals, dt)
    return _pack(b, bits, dt)


def _store_vector(b: ir.IRBuilder, addr: ir.Value, words: list[ir.Value], ok: ir.Value | None = None) -> None:
    """Store ``words`` (consecutive elements from ``addr``, aligned to their size) in one access,
    only where ``ok`` (an i1) holds when it is given."""
    w, ty = len(words), words[0].type
    suffix, cons = {64: ("b64", "l"), 32: ("b32", "r")}.get(ty.width, ("b16", "h"))
    st = f"{STORE}{_vector_op(w)}.{suffix} [$0], {_vector_operand([f'${j + 1}' for j in range(w)])};"
    types, constraints, args = [nvvm.ptr(nvvm.GLOBAL), *[ty] * w], ["l"] + [cons] * w, [addr, *words]
    if ok is not None:
        st = f"{{ .reg .pred p; setp.ne.b32 p, ${w + 1}, 0; @p {st} }}"
        types, constraints, args = [*types, I32], [*constraints, "r"], [*args, _pred(b, ok)]
    b.asm(ir.FunctionType(ir.VoidType(), types), st, ",".join(constraints), args, side_effect=True)


def _value_of(b: ir.IRBuilder, bits: ir.Value, dt: DType) -> ir.Value:
    """Register form of an element's memory bits."""
    mem = mem_type(dt)
    return from_mem(b, bits if isinstance(mem, ir.IntType) else b.bitcast(bits, mem), dt)


def _bits_of(b: ir.IRBuilder, v: ir.Value, dt: DType) -> ir.Value:
    """Memory bits (an int of the element's width) of a register value."""
    m = to_mem(b, v, dt)
    return m if isinstance(m.type, ir.IntType) else b.bitcast(m, ir.IntType(elem_bytes(dt) * 8))


# --------------------------------------------------------------------------- the ops


def _box_inside(lw: Lowerer, op: Operation, tensor: TensorArg, offs: list) -> ir.Value:
    """i1: the op's whole box is in bounds: on every axis ``0 <= off`` and ``off + box <=
    size``, in i64 so that neither sum can wrap."""
    b = lw.b
    out = None
    for off, extent, size in zip(offs, op.box, tensor.sizes):
        lo = b.sext(off, I64)
        ok = b.and_(b.icmp_signed(">=", lo, ir.Constant(I64, 0)),
                    b.icmp_signed("<=", b.add(lo, ir.Constant(I64, extent)), b.zext(size, I64)))
        out = ok if out is None else b.and_(out, ok)
    return out


def _word_type(dt: DType, n: int) -> tuple[int, ir.IntType]:
    """(count, type) of the words a run of ``n`` elements moves as: the words of its vector
    access, or for a single element its bits."""
    if n == 1:
        return 1, ir.IntType(elem_bytes(dt) * 8)
    w, _, _, ty = _words(n * elem_bytes(dt), elem_bytes(dt))
    return w, ty


class _Access(NamedTuple):
    """One tile op's operands: the tensor, its offsets, this thread's tile coordinates and
    each value's constant offset from them, the runs (every value in exactly one; ``(i, 1)``
    where it has no vector access) and the fast flag of each run length above 1."""

    tensor: TensorArg
    offs: list
    thread: tuple
    regs: list
    runs: tuple[tuple[int, int], ...]
    fast: dict[int, ir.Value]

    def coord(self, i: int) -> tuple:
        return tuple(tc + rc for tc, rc in zip(self.thread, self.regs[i]))

    def addr(self, lw: Lowerer, op: Operation, i: int) -> ir.Value:
        return _locate(lw, op, self.tensor, self.offs, self.coord(i))[0]

    def whole_tile(self, lw: Lowerer, op: Operation) -> ir.Value:
        """i1: every run of the op may take its vector access (the box in bounds and the
        tensor fast for each run length)."""
        out = _box_inside(lw, op, self.tensor, self.offs)
        for f in self.fast.values():
            out = lw.b.and_(out, f)
        return out

    def kept_local(self, lw: Lowerer) -> _Access:
        """The same access with the tensor's sizes and strides and the offsets made opaque
        here: the addresses and bounds tests built from them stay on this side of the
        branch instead of being hoisted out of the enclosing loop by LLVM, where they would
        hold registers for the whole loop (the edge path is for the tile's edges only)."""
        b = lw.b
        t = self.tensor
        tensor = TensorArg(t.ptr, tuple(nvvm.opaque(b, x) for x in t.sizes),
                           tuple(nvvm.opaque(b, x) for x in t.strides), t.type)
        return self._replace(tensor=tensor, offs=[nvvm.opaque(b, x) for x in self.offs])


def _stepped(lw: Lowerer, op: Operation, tensor: TensorArg, offs: list) -> tuple[TensorArg, list]:
    """A box with ``steps`` as a plain box of a strided view of the tensor: along an axis of
    step ``s``, offset ``o = s q + p`` (``0 <= p < s``) reads view element ``q + j`` for box
    element ``j``, the view starting at element ``p`` with ``ceil((size - p) / s)`` elements
    ``s`` strides apart -- so the bounds tests and addresses below need no other change."""
    steps = op.attributes.get("steps")  # gathers and atomics have none
    if not steps or all(s == 1 for s in steps):
        return tensor, offs
    b = lw.b
    ptr, sizes, strides, new_offs = tensor.ptr, list(tensor.sizes), list(tensor.strides), list(offs)
    for a, s in enumerate(steps):
        if s == 1:
            continue
        k = const_i32(s)
        q, p = b.sdiv(offs[a], k), b.srem(offs[a], k)
        neg = b.icmp_signed("<", p, const_i32(0))  # floor division: the phase is never negative
        q, p = b.select(neg, b.sub(q, const_i32(1)), q), b.select(neg, b.add(p, k), p)
        ptr = b.gep(ptr, [b.mul(b.zext(p, I64), strides[a])], source_etype=mem_type(tensor.type.dtype))
        sizes[a] = b.udiv(b.add(b.sub(sizes[a], p), const_i32(s - 1)), k)
        strides[a] = b.mul(strides[a], ir.Constant(I64, s))
        new_offs[a] = q
    return TensorArg(ptr, tuple(sizes), tuple(strides), tensor.type), new_offs


def _access(lw: Lowerer, op: Operation, t: TileType) -> _Access:
    tensor, offs = _stepped(lw, op, lw.get(op.tensor), [lw.get(v) for v in op.offsets])
    thread, regs = lw.coord_parts(op, t.layout)
    runs = runs_of(op, tensor.type, t) or tuple((i, 1) for i in range(len(regs)))
    fast = {n: _fast(lw, tensor, offs, n) for n in sorted({n for _, n in runs if n > 1})}
    acc = _Access(tensor, offs, thread, regs, runs, fast)
    return acc.kept_local(lw) if _beside_a_loop(op) or _in_a_role_loop(op) else acc


def _in_a_role_loop(op: Operation) -> bool:
    """Whether ``op`` is in a loop of a role (a consumer loop, whose accumulators hold most of
    the registers): LLVM would hoist its addresses out of the loop, two registers a run held
    through it (attention backward's lse and delta vectors and its dQ atomic: 64 of them)."""
    names = [a.name for a in op.ancestors()]
    return "tile.for" in names and "hopper.role" in names


def _beside_a_loop(op: Operation) -> bool:
    """Whether ``op`` is in a loop that also holds another loop (a persistent kernel's tile
    loop around attention's K/V loop, with the epilogue's store beside it).  LLVM would hoist
    the access's addresses, which depend only on the thread and the strides, out of the outer
    loop: a register each, held through the inner loop where every register counts (32 64-bit
    offsets of a 128 x 256 tile are 64 registers)."""
    for loop in op.ancestors():
        if loop.name == "tile.for" and any(inner is not loop and inner.name == "tile.for"
                                           and inner not in op.ancestors() for inner in loop.walk()):
            return True
    return False


# ------------------------------------------------------------------ the edge path: loops over runs


def _groups(runs: tuple[tuple[int, int], ...]) -> list[tuple[int, list[int]]]:
    """The runs as ``(length, first values)`` of maximal stretches of one length."""
    out: list[tuple[int, list[int]]] = []
    for first, n in runs:
        if out and out[-1][0] == n:
            out[-1][1].append(first)
        else:
            out.append((n, [first]))
    return out


def _local_array(lw: Lowerer, ty: ir.Type, count: int) -> tuple[ir.Value, ir.ArrayType]:
    """A per-thread array of ``count`` ``ty`` (local memory), allocated in the entry block
    so that it is one fixed slot of the stack frame however often the op runs."""
    arr_ty = ir.ArrayType(ty, count)
    entry = lw.fn.entry_basic_block
    b = ir.IRBuilder(entry)
    b.position_at_start(entry)
    return b.alloca(arr_ty), arr_ty


def _slot(b: ir.IRBuilder, arr: tuple[ir.Value, ir.ArrayType], index: ir.Value | int) -> ir.Value:
    index = const_i32(index) if isinstance(index, int) else index
    return b.gep(arr[0], [const_i32(0), index], inbounds=True)


def _per_run(lw: Lowerer, offsets: list[int], k: ir.Value) -> ir.Value:
    """Run ``k``'s entry of ``offsets`` (one constant per run): the constant itself, an
    affine expression of ``k``, or a load from a constant table."""
    b = lw.b
    if all(o == offsets[0] for o in offsets):
        return const_i32(offsets[0])
    step = offsets[1] - offsets[0]
    if all(o == offsets[0] + j * step for j, o in enumerate(offsets)):
        return b.add(const_i32(offsets[0]), b.mul(k, const_i32(step)))
    module = lw.fn.module
    arr_ty = ir.ArrayType(I32, len(offsets))
    tables = [g for name, g in module.globals.items() if name.startswith("tkc_offsets_")]
    table = next((g for g in tables if g.type.pointee == arr_ty  # one table per distinct contents
                  and [int(c.constant) for c in g.initializer.constant] == list(offsets)), None)
    if table is None:
        table = ir.GlobalVariable(module, arr_ty, f"tkc_offsets_{len(tables)}", addrspace=nvvm.CONST)
        table.global_constant = True
        table.linkage = "internal"
        table.initializer = ir.Constant(arr_ty, [int(o) for o in offsets])
    return b.load(b.gep(table, [const_i32(0), k], inbounds=True))


def _loop(lw: Lowerer, count: int, body: Callable[[ir.Value], None]) -> None:
    """``body(k)`` for ``k`` in ``[0, count)``, as a loop that stays rolled (opaque trip
    count, unrolling disabled): the edge path is there to be small, not fast."""
    b = lw.b
    limit = nvvm.opaque(b, const_i32(count))
    pre = b.block
    head = lw.fn.append_basic_block("edge.loop")
    done = lw.fn.append_basic_block("edge.done")
    b.branch(head)
    b.position_at_end(head)
    k = b.phi(I32)
    k.add_incoming(const_i32(0), pre)
    body(k)
    nxt = b.add(k, const_i32(1))
    k.add_incoming(nxt, b.block)
    nvvm.rolled(b.cbranch(b.icmp_unsigned("<", nxt, limit), head, done))
    b.position_at_end(done)


def _edge_runs(lw: Lowerer, op: Operation, acc: _Access, n: int, firsts: list[int],
               body: Callable[[ir.Value, ir.Value, ir.Value, ir.Value, ir.Value], None]) -> None:
    """One loop over the runs of length ``n`` starting at ``firsts``: ``body(k, first
    address, lo, hi, vector ok)`` for run ``k`` (:func:`_run_bounds`; ``vector ok``: the run
    is whole in bounds and the tensor fast for it, None for single elements)."""
    b = lw.b

    def one(k: ir.Value) -> None:
        coord = tuple(Sym(b, b.add(as_value(tc), _per_run(lw, [acc.regs[f][axis] for f in firsts], k)))
                      for axis, tc in enumerate(acc.thread))
        base, lo, hi = _run_bounds(lw, op, acc.tensor, acc.offs, coord, n)
        ok = None
        if n > 1:
            whole = b.and_(b.icmp_unsigned("==", lo, const_i32(0)), b.icmp_unsigned("==", hi, const_i32(n)))
            ok = b.and_(acc.fast[n], whole)
        body(k, base, lo, hi, ok)

    _loop(lw, len(firsts), one)


def _element_oks(b: ir.IRBuilder, base: ir.Value, stride: ir.Value, lo: ir.Value, hi: ir.Value, n: int,
                 dt: DType) -> list[tuple[ir.Value, ir.Value]]:
    """(address, in bounds) of each element of a run (:func:`_run_bounds`)."""
    out = []
    for e in range(n):
        ok = b.and_(b.icmp_signed("<=", lo, const_i32(e)), b.icmp_signed(">", hi, const_i32(e)))
        out.append((b.gep(base, [b.mul(stride, ir.Constant(I64, e))], source_etype=mem_type(dt)), ok))
    return out


# ------------------------------------------------------------------ hopper.load / hopper.store


def load(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    t = op.result.type
    tensor: TensorArg = lw.get(op.tensor)
    dt = tensor.type.dtype
    if not isinstance(t, TileType):
        other = constant(dt, 0 if op.other is None else op.other)
        e = _global_element(lw, op, tensor, [lw.get(v) for v in op.offsets], ())
        lw.set(op.result, b.select(e.ok, _value_of(b, _load_element(b, e.addr, e.ok, dt), dt), other))
    elif op in lw.plan.deferred:
        lw.set(op.result, _DeferredLoad(op, lw.regs(op, t), dt))
    elif op in lw.plan.packed:
        lw.set(op.result, _load_packed(lw, op))
    else:
        lw.set(op.result, _load_tile(lw, op))


def gather(lw: Lowerer, op: Operation) -> None:
    """``tile.gather``: a load whose coordinate along ``op.axis`` is each value's index register.
    Runs along the last axis (when the gathered axis is another) share their index, so each
    is one vector access where it lies whole in the tensor (checked run by run: the rows are
    anywhere), else one predicated access per element."""
    b = lw.b
    t = op.result.type
    tensor: TensorArg = lw.get(op.tensor)
    dt = tensor.type.dtype
    offs = [lw.get(v) for v in op.offsets]
    thread, regs = lw.coord_parts(op, t.layout)
    kept = [a for a in range(tensor.type.rank) if a not in (op.squeeze or [])]
    at = kept.index(op.axis)
    index = lw.tile(op, op.index)
    runs = (runs_of(op, tensor.type, t) if at != len(kept) - 1 else None) or tuple((i, 1) for i in range(len(regs)))
    fast = {n: _fast(lw, tensor, offs, n) for n in sorted({n for _, n in runs if n > 1})}
    other_bits = _bits_of(b, constant(dt, 0 if op.other is None else op.other), dt)
    out: list[ir.Value] = []
    for first, n in runs:
        coord = [tc + rc for tc, rc in zip(thread, regs[first])]
        coord[at] = Sym(b, index[first])
        base, lo, hi = _run_bounds(lw, op, tensor, offs, tuple(coord), n)

        def elements(base=base, lo=lo, hi=hi, n=n) -> list[ir.Value]:
            bits = [b.select(e_ok, _load_element(b, addr, e_ok, dt), other_bits)
                    for addr, e_ok in _element_oks(b, base, tensor.strides[-1], lo, hi, n, dt)]
            return _pack(b, bits, dt) if n > 1 else bits

        if n > 1:
            whole = b.and_(fast[n], b.and_(b.icmp_unsigned("==", lo, const_i32(0)),
                                           b.icmp_unsigned("==", hi, const_i32(n))))
            words = lw.either(whole, lambda base=base, n=n: _load_vector(b, base, dt, n), elements, "ld.gather")
        else:
            words = elements()
        out.extend(_run_values(b, words, dt, n))
    lw.set(op.result, out)


def masked_store(lw: Lowerer, op: Operation) -> None:
    """``tile.masked_store``: one predicated store per value, where it lies in the tensor and
    its mask value is true.  Where every run of the access has one mask value for all its
    elements (a row mask broadcast along the row a thread holds: MoE's and varlen attention's
    last rows) and runs reach 16 bytes, a tile inside the tensor takes each run's vector access
    under that predicate instead: a 128 x 256 accumulator held a row a thread (sm_100a's
    ``#tmem_acc``) then stores 16 bytes at a time, not an address and a predicate for each of
    its 128 values (a masked bf16 store of it spilled 36 B, now 4)."""
    b = lw.b
    t = op.value.type
    tensor: TensorArg = lw.get(op.tensor)
    dt = tensor.type.dtype
    acc = _access(lw, op, t)
    vals, mask = lw.tile(op, op.value), lw.tile(op, op.mask)

    def elements(a: _Access) -> list:
        for i, (v, m) in enumerate(zip(vals, mask)):
            e = _global_element(lw, op, a.tensor, a.offs, a.coord(i))
            _store_element(b, e.addr, b.and_(e.ok, m), _bits_of(b, v, dt), dt)
        return []

    # Runs shorter than 16 bytes (wgmma's accumulator holds 2 columns of a row together) keep
    # the one path: a branch between both sides held more registers than it saved (MoE's
    # masked store spilled 44 B on sm_90a with it).
    if max(n for _, n in acc.runs) * elem_bytes(dt) < 16 or any(m is not mask[first] for first, n in acc.runs
                                                                for m in mask[first:first + n]):
        elements(acc.kept_local(lw))
        return

    def whole_tile() -> list:  # each side converts the values itself: nothing converted lives across
        for first, n in acc.runs:
            addr = acc.addr(lw, op, first)
            bits = [_bits_of(b, v, dt) for v in vals[first:first + n]]
            if n > 1:
                _store_vector(b, addr, _run_words(b, vals[first:first + n], bits, dt), mask[first])
            else:
                _store_element(b, addr, mask[first], bits[0], dt)
        return []

    lw.either(acc.whole_tile(lw, op), whole_tile, lambda: elements(acc.kept_local(lw)), "st.masked")


def _load_packed(lw: Lowerer, op: Operation) -> Packed:
    """A 16-bit float tile loaded here and kept as its words (:class:`Packed`)."""
    b = lw.b
    t = op.result.type
    dt = lw.get(op.tensor).type.dtype
    acc = _access(lw, op, t)

    def by_runs() -> list[ir.Value]:
        return [x for first, n in acc.runs for x in _load_run(lw, op, acc, first, n, dt)]

    def edge() -> list[ir.Value]:
        a = acc.kept_local(lw)
        slots = _edge_slots(lw, op, a)
        return [x for first, _ in a.runs for x in _read_slots(b, slots[first])]

    words = lw.either(_runs_ok(lw, op, acc), by_runs, edge, "ld.tile")
    runs, k = [], 0
    for first, n in acc.runs:
        w = _word_type(dt, n)[0]
        runs.append((first, n, words[k:k + w]))
        k += w
    return Packed(runs, lambda b, ws, n: _run_values(b, ws, dt, n), lw.regs(op, t))


def _load_run(lw: Lowerer, op: Operation, acc: _Access, first: int, n: int, dt: DType) -> list[ir.Value]:
    """The access of the run of ``n`` values at ``first`` on the side by runs: its words (the
    load's ``other`` where the run lies outside the tensor)."""
    b = lw.b
    addr, ok = _run_access(lw, op, acc, first)
    other = op.attributes.get("other")
    bits = None if other is None else _bits_of(b, constant(dt, other), dt)
    if n > 1:
        return _load_vector(b, addr, dt, n, ok, None if bits is None else _pack(b, [bits] * n, dt))
    got = _load_element(b, addr, ok, dt)
    return [got if bits is None else b.select(ok, got, bits)]


def _run_access(lw: Lowerer, op: Operation, acc: _Access, first: int) -> tuple[ir.Value, ir.Value]:
    """The address of the run at ``first`` and whether it lies inside the tensor (its first
    element does: on the side by runs every run lies wholly inside or wholly outside)."""
    e = _global_element(lw, op, acc.tensor, acc.offs, acc.coord(first))
    return e.addr, e.ok


def _runs_ok(lw: Lowerer, op: Operation, acc: _Access) -> ir.Value:
    """i1: the access may go by runs: every run lies wholly inside the tensor or wholly
    outside it, and the inside ones may take their vector access.  Either the box lies in the
    tensor (``whole_tile``), or the tensor is fast for each run length and along the last axis
    the offset is non-negative and, like the size, a multiple of every run length (each run
    starts at a multiple of its length): a row shorter than its block, on every row."""
    return lw.b.or_(acc.whole_tile(lw, op), _runs_aligned_to_size(lw, acc))


def _runs_aligned_to_size(lw: Lowerer, acc: _Access) -> ir.Value:
    """i1: the runs are aligned (:func:`_runs_aligned`) and the last-axis offset and size are
    multiples of every run length."""
    b = lw.b
    step = math.lcm(*(n for _, n in acc.runs))
    ok = _runs_aligned(lw, acc)
    for x in (acc.offs[-1], acc.tensor.sizes[-1]):
        ok = b.and_(ok, b.icmp_unsigned("==", b.urem(x, const_i32(step)), const_i32(0)))
    return ok


def _runs_aligned(lw: Lowerer, acc: _Access) -> ir.Value:
    """i1: each run may be one vector access (the tensor fast for its length) and starts at or
    past the tensor's first column (a non-negative last-axis offset), so the part of a run
    inside the tensor is a prefix of it."""
    b = lw.b
    ok = b.icmp_signed(">=", acc.offs[-1], const_i32(0))
    for f in acc.fast.values():
        ok = b.and_(ok, f)
    return ok


def _run_values(b: ir.IRBuilder, words: list[ir.Value], dt: DType, n: int) -> list[ir.Value]:
    """The register values of a run from the words its access moved (fp8 two bytes a
    conversion)."""
    if packs_in_fours(dt) and n % 2 == 0 and words[0].type.width >= 16:
        return fp8_decode_words(b, words, dt, n)
    return [_value_of(b, x, dt) for x in _unpack(b, words, dt, n)]


def _load_edge_runs(lw: Lowerer, op: Operation, a: _Access, n: int, firsts: list[int]
                    ) -> tuple[ir.Value, ir.ArrayType]:
    """The edge side of a load for its runs of length ``n`` starting at ``firsts``: one loop
    that leaves run ``j``'s words in slots ``j * w ..`` of the local array it returns."""
    b = lw.b
    dt = a.tensor.type.dtype
    other_bits = _bits_of(b, constant(dt, 0 if op.other is None else op.other), dt)
    w, ty = _word_type(dt, n)
    arr = _local_array(lw, ty, w * len(firsts))

    def run(k: ir.Value, base: ir.Value, lo: ir.Value, hi: ir.Value, ok: ir.Value | None) -> None:
        def elements() -> list[ir.Value]:
            bits = [b.select(e_ok, _load_element(b, addr, e_ok, dt), other_bits)
                    for addr, e_ok in _element_oks(b, base, a.tensor.strides[-1], lo, hi, n, dt)]
            return _pack(b, bits, dt) if n > 1 else bits

        words = elements() if ok is None else \
            lw.either(ok, lambda: _load_vector(b, base, dt, n), elements, "ld")
        for q, x in enumerate(words):
            b.store(x, _slot(b, arr, b.add(b.mul(k, const_i32(w)), const_i32(q))))

    _edge_runs(lw, op, a, n, firsts, run)
    return arr


def _edge_slots(lw: Lowerer, op: Operation, a: _Access) -> dict[int, tuple[ir.Value, int, int]]:
    """The edge side of a load up to its local arrays: each run length's loop, and per run
    (by its first value) where its words wait: (array, first slot, words)."""
    slots = {}
    for n, firsts in _groups(a.runs):
        arr = _load_edge_runs(lw, op, a, n, firsts)
        w = _word_type(a.tensor.type.dtype, n)[0]
        slots.update({first: (arr, j * w, w) for j, first in enumerate(firsts)})
    return slots


def _read_slots(b: ir.IRBuilder, slot: tuple[ir.Value, int, int]) -> list[ir.Value]:
    """A run's words back from its local array (:func:`_edge_slots`)."""
    arr, at, w = slot
    return [b.load(_slot(b, arr, at + q)) for q in range(w)]


def _load_tile(lw: Lowerer, op: Operation) -> list[ir.Value]:
    """The values of a register-tile ``hopper.load``, loaded here."""
    b = lw.b
    t = op.result.type
    tensor: TensorArg = lw.get(op.tensor)
    dt = tensor.type.dtype
    acc = _access(lw, op, t)

    def values(words: list[ir.Value], n: int) -> list[ir.Value]:
        return _run_values(b, words, dt, n)

    # A vector run merges the words of its access, not values: the vector side holds only
    # the load, so nothing waits for the data before the next run's load is issued.
    def by_runs() -> list[ir.Value]:
        return [v for first, n in acc.runs for v in values(_load_run(lw, op, acc, first, n, dt), n)]

    def edge() -> list[ir.Value]:
        a = acc.kept_local(lw)
        slots = _edge_slots(lw, op, a)
        return [v for first, n in a.runs for v in values(_read_slots(b, slots[first]), n)]

    return lw.either(_runs_ok(lw, op, acc), by_runs, edge, "ld.tile")


class _DeferredLoad(Deferred):
    """A deferred ``hopper.load`` (tkc/codegen/deferred.py).  On the side by runs of its
    store, each run is loaded with its vector access where it is first issued or needed; on
    the edge side, the load's edge loops fill local arrays where its first value is needed,
    and each run is read back where used."""

    def __init__(self, op: Operation, n: int, dt: DType) -> None:
        self.op, self.n, self.dt = op, n, dt
        self.acc: _Access | None = None
        self.run_of: dict[int, tuple[int, int]] = {}

    def prepare(self, lw: Lowerer) -> None:
        """Build the access before the store's branch, which tests its box."""
        self.acc = _access(lw, self.op, self.op.result.type)
        self.run_of = {i: (first, n) for first, n in self.acc.runs for i in range(first, first + n)}

    def _run(self, lw: Lowerer, i: int) -> list[ir.Value]:
        first, n = self.run_of[i]
        memo = lw.deferred_scope.values
        if (self, first) not in memo:
            memo[self, first] = _load_run(lw, self.op, self.acc, first, n, self.dt)
        return memo[self, first]

    def issue(self, lw: Lowerer, i: int) -> None:
        if lw.deferred_scope.whole:
            self._run(lw, i)

    def _edge_words(self, lw: Lowerer, first: int) -> list[ir.Value]:
        """The words of the run at ``first`` on the edge side: every run is loaded into local
        arrays where the first is needed (the load's edge loops), each read back where used."""
        memo = lw.deferred_scope.values
        if (self, None) not in memo:
            memo[self, None] = _edge_slots(lw, self.op, self.acc.kept_local(lw))
        return _read_slots(lw.b, memo[self, None][first])

    def at(self, lw: Lowerer, i: int) -> ir.Value:
        memo = lw.deferred_scope.values
        first, n = self.run_of[i]
        if (self, first, n) not in memo:
            words = self._run(lw, i) if lw.deferred_scope.whole else self._edge_words(lw, first)
            memo[self, first, n] = _run_values(lw.b, words, self.dt, n)
        return memo[self, first, n][i - first]

    def loads(self) -> Iterator[Deferred]:
        yield self


def store(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    t = op.value.type
    tensor: TensorArg = lw.get(op.tensor)
    dt = tensor.type.dtype
    if not isinstance(t, TileType):
        e = _global_element(lw, op, tensor, [lw.get(v) for v in op.offsets], ())
        _store_element(b, e.addr, e.ok, _bits_of(b, lw.get(op.value), dt), dt)
        return
    acc = _access(lw, op, t)
    value = lw.get(op.value)
    if isinstance(value, Deferred):
        _store_deferred(lw, op, acc, value, dt)
        return
    vals = lw.tile(op, op.value)
    bits = [_bits_of(b, v, dt) for v in vals]

    def by_runs() -> list:
        for first, n in acc.runs:
            _store_run(lw, op, acc, first, n, vals[first:first + n], bits[first:first + n], dt)
        return []

    def words_of(first: int, n: int) -> list[ir.Value]:
        return _run_words(b, vals[first:first + n], bits[first:first + n], dt)

    lw.either(_runs_ok(lw, op, acc), by_runs, lambda: _store_edge(lw, op, acc, words_of, dt), "st.tile")


def _store_run(lw: Lowerer, op: Operation, acc: _Access, first: int, n: int, vals: list[ir.Value],
               bits: list[ir.Value], dt: DType) -> None:
    """The access of the run of ``n`` values at ``first`` (``vals``, ``bits``) on the side by
    runs, where the run lies inside the tensor."""
    b = lw.b
    addr, ok = _run_access(lw, op, acc, first)
    if n > 1:
        _store_vector(b, addr, _run_words(b, vals, bits, dt), ok)
    else:
        _store_element(b, addr, ok, bits[0], dt)


def _run_words(b: ir.IRBuilder, vals: list[ir.Value], bits: list[ir.Value], dt: DType) -> list[ir.Value]:
    """The words a run of values (``vals``, their ``bits``) is stored as: its vector access's,
    or a single element's bits."""
    return _store_words(b, bits, dt, vals) if len(vals) > 1 else bits


def _store_edge(lw: Lowerer, op: Operation, acc: _Access, words_of: Callable[[int, int], list[ir.Value]],
                dt: DType) -> list:
    """The edge side of a store: the words of each run (``words_of(first, n)``) through a
    local array, then a loop over the runs."""
    b = lw.b
    a = acc.kept_local(lw)
    for n, firsts in _groups(a.runs):
        w, ty = _word_type(dt, n)
        arr = _local_array(lw, ty, w * len(firsts))
        for j, first in enumerate(firsts):
            for q, x in enumerate(words_of(first, n)):
                b.store(x, _slot(b, arr, j * w + q))

        def run(k: ir.Value, base: ir.Value, lo: ir.Value, hi: ir.Value, ok: ir.Value | None) -> None:
            words = [b.load(_slot(b, arr, b.add(b.mul(k, const_i32(w)), const_i32(q)))) for q in range(w)]

            def elements() -> list:
                run_bits = _unpack(b, words, dt, n)
                for (addr, e_ok), x in zip(_element_oks(b, base, a.tensor.strides[-1], lo, hi, n, dt), run_bits):
                    _store_element(b, addr, e_ok, x, dt)
                return []

            if ok is None:
                elements()
            else:
                lw.either(ok, lambda: _store_vector(b, base, words) or [], elements, "st")

        _edge_runs(lw, op, a, n, firsts, run)
    return []


def _store_deferred(lw: Lowerer, op: Operation, acc: _Access, value: Deferred, dt: DType) -> None:
    """A store whose value is deferred (tkc/codegen/deferred.py).  By runs, taken when the
    store's box and every deferred load's box are whole, or all their runs are aligned to their
    sizes (:func:`_runs_aligned_to_size`): run by run, the deferred loads of the run LOOKAHEAD
    runs ahead, then this run's values and its access.  Edge side: the deferred
    loads' edge loops into local arrays, then run by run the values into the store's local
    array, then the store's edge loop: on either side a few runs of the loads are live."""
    b = lw.b
    loads = list(value.loads())
    # Every box whole, or every access's runs aligned to its size (one test of each kind over
    # all the accesses: each access's own either-or cost layernorm_residual.tk a spill at five
    # programs an SM).
    whole, aligned = acc.whole_tile(lw, op), _runs_aligned_to_size(lw, acc)
    for ld in loads:
        ld.prepare(lw)
        whole = b.and_(whole, ld.acc.whole_tile(lw, ld.op))
        aligned = b.and_(aligned, _runs_aligned_to_size(lw, ld.acc))
    ok = b.or_(whole, aligned)

    def by_runs() -> list:
        with emitting(lw, whole=True):
            for k, (first, n) in enumerate(acc.runs):
                for ahead, m in acc.runs[k:k + LOOKAHEAD + 1]:
                    for i in range(ahead, ahead + m):
                        value.issue(lw, i)
                vals = [value.at(lw, i) for i in range(first, first + n)]
                _store_run(lw, op, acc, first, n, vals, [_bits_of(b, v, dt) for v in vals], dt)
        return []

    def words_of(first: int, n: int) -> list[ir.Value]:
        vals = [value.at(lw, i) for i in range(first, first + n)]
        return _run_words(b, vals, [_bits_of(b, v, dt) for v in vals], dt)

    def edge() -> list:
        with emitting(lw, whole=False):
            return _store_edge(lw, op, acc, words_of, dt)

    lw.either(ok, by_runs, edge, "st.tile")


def prefetch(lw: Lowerer, op: Operation) -> None:
    """Thread 0 (docs/hopper.md §3): one ``cp.async.bulk.prefetch.L2`` for each row of the box
    whose in-bounds part, its ends moved inward to 16-byte boundaries, is not empty; nothing
    where the last axis is strided (a hint need not cover every layout)."""
    b = lw.b
    tensor: TensorArg = lw.get(op.tensor)
    offs = [lw.get(v) for v in op.offsets]
    eb = elem_bytes(tensor.type.dtype)
    squeeze = set(op.squeeze or [])  # never the last axis (the verifier checks)
    *outer, n = [extent for axis, extent in enumerate(op.box) if axis not in squeeze]
    contiguous = b.icmp_unsigned("==", tensor.strides[-1], ir.Constant(I64, 1))
    fty = ir.FunctionType(ir.VoidType(), [I64, I32])
    for row in np.ndindex(*outer):
        coord = (*(int(c) for c in row), 0)
        base, lo, hi = _run_bounds(lw, op, tensor, offs, coord, n)
        addr = b.ptrtoint(base, I64)
        start = b.add(addr, b.mul(b.zext(lo, I64), ir.Constant(I64, eb)))
        end = b.add(addr, b.mul(b.zext(hi, I64), ir.Constant(I64, eb)))
        start = b.and_(b.add(start, ir.Constant(I64, 15)), ir.Constant(I64, ~15))
        end = b.and_(end, ir.Constant(I64, ~15))
        with b.if_then(b.and_(contiguous, b.icmp_signed(">", end, start))):
            size = b.trunc(b.sub(end, start), I32)
            b.asm(fty, "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r", [start, size], side_effect=True)


# --------------------------------------------------- hopper.async_load / async_read


def _private_at(lw: Lowerer, layout: object, t: ir.Value, first: int, n: int, eb: int) -> ir.Value:
    """:func:`~tkc.codegen.runs.private_run_offset` of thread ``t``'s run of ``n`` values at ``first``."""
    return as_value(private_run_offset(int(layout.threads), first, n, eb, Sym(lw.b, t)))


def _own_thread(lw: Lowerer, layout: object) -> ir.Value:
    """The thread index the private offsets of one op are computed from, opaque: LLVM would
    otherwise compute every staged run's offset once, at the kernel's entry, and hold them all
    through the kernel (a norm backward's rows and their rings: 40 registers more)."""
    return lw.thread(layout, opaque=True).v


def _cp_async(lw: Lowerer, to: ir.Value, src: ir.Value, size: int, src_size: ir.Value | None = None) -> None:
    """``cp.async`` of ``size`` bytes (4, 8 or 16; ``.cg``, past L1, for 16) from global ``src``
    to the 32-bit shared address ``to``; with ``src_size`` (i32, at most ``size``) only that
    many bytes are read and the rest of the ``size`` written as zeros."""
    kind = f"cp.async.{'cg' if size == 16 else 'ca'}.shared.global [$0], [$1], {size}"
    if src_size is None:
        nvvm.asm(lw.b, f"{kind};", "r,l,~{memory}", [to, lw.b.ptrtoint(src, I64)])
    else:
        nvvm.asm(lw.b, f"{kind}, $2;", "r,l,r,~{memory}", [to, lw.b.ptrtoint(src, I64), src_size])


def async_load(lw: Lowerer, op: Operation) -> None:
    """Where the whole box is in bounds and each run one aligned access, a ``cp.async`` a run.
    Where runs are aligned but the box reaches past the tensor's end (a row shorter than its
    block, the rows past M), and what lies outside reads 0: a ``cp.async`` a run still, of the
    bytes in bounds (``src-size``; a run wholly outside reads none, from the tensor's start),
    the rest zero-filled.  (That side alone, for whole boxes too, is less code, but held the
    residual LayerNorm backward to 0.87x at 16384 x 4096 on an H200.)  Elsewhere (a misaligned
    tensor, a negative last-axis offset, another ``other``) the load's edge path, its words
    stored into the thread's bytes at once (the same thread reads them back, after its own
    stores)."""
    b = lw.b
    t = op.tile_type
    dst = lw.shared(op, op.dst)
    dt = t.dtype
    eb = elem_bytes(dt)
    acc = _access(lw, op, t).kept_local(lw)  # addresses at the copy: see _own_thread
    me = _own_thread(lw, t.layout)

    def copies() -> list:
        for first, n in acc.runs:
            to = lw.smem_addr(lw.offset(dst, _private_at(lw, t.layout, me, first, n, eb)))
            _cp_async(lw, to, acc.addr(lw, op, first), n * eb)
        return []

    def filled() -> list:
        for first, n in acc.runs:
            base, lo, hi = _run_bounds(lw, op, acc.tensor, acc.offs, acc.coord(first), n)
            # (lo is 0 but where the run's i32 position wrapped: an offset near 2**31)
            inside = b.and_(b.icmp_unsigned("==", lo, const_i32(0)), b.icmp_unsigned(">", hi, const_i32(0)))
            to = lw.smem_addr(lw.offset(dst, _private_at(lw, t.layout, me, first, n, eb)))
            _cp_async(lw, to, b.select(inside, base, acc.tensor.ptr), n * eb,
                      b.select(inside, b.mul(hi, const_i32(eb)), const_i32(0)))
        return []

    def edge() -> list:
        slots = _edge_slots(lw, op, acc)
        for first, n in acc.runs:
            at = lw.ptr(dst, _private_at(lw, t.layout, me, first, n, eb))
            for q, word in enumerate(_read_slots(b, slots[first])):
                b.store(word, b.gep(at, [const_i32(q * word.type.width // 8)], source_etype=nvvm.I8))
        return []

    other = op.attributes.get("other")
    if other is None or (other == 0 and math.copysign(1.0, other) > 0):  # zero-filled bytes read +0
        lw.either(acc.whole_tile(lw, op), copies,
                  lambda: lw.either(_runs_aligned(lw, acc), filled, edge, "cp.async.fill"), "cp.async")
    else:
        lw.either(acc.whole_tile(lw, op), copies, edge, "cp.async")


def async_commit(lw: Lowerer, op: Operation) -> None:
    nvvm.asm(lw.b, "cp.async.commit_group;", "~{memory}")


def async_wait(lw: Lowerer, op: Operation) -> None:
    nvvm.asm(lw.b, f"cp.async.wait_group {op.pending};", "~{memory}")


def async_read(lw: Lowerer, op: Operation) -> None:
    """Each run back with one shared load of its words."""
    b = lw.b
    t = op.result.type
    src = lw.shared(op, op.src)
    eb = elem_bytes(t.dtype)
    runs = []
    me = _own_thread(lw, t.layout)
    for first, n in vector_runs(t.layout, eb):
        at = lw.ptr(src, _private_at(lw, t.layout, me, first, n, eb))
        w, ty = _word_type(t.dtype, n)
        if w == 1:
            words = [b.load(at, typ=ty, align=n * eb)]
        else:
            vec = b.load(at, typ=ir.VectorType(ty, w), align=n * eb)
            words = [b.extract_element(vec, const_i32(q)) for q in range(w)]
        runs.append((first, n, words))
    if op in lw.plan.packed:  # kept as the words read, as a packed load's (tkc/codegen/deferred.py)
        lw.set(op.result, Packed(runs, lambda b, ws, n: _run_values(b, ws, t.dtype, n), lw.regs(op, t)))
    else:
        lw.set(op.result, [v for _, n, words in runs for v in _run_values(b, words, t.dtype, n)])


HANDLERS = {"hopper.async_load": async_load, "hopper.async_commit": async_commit, "hopper.async_wait": async_wait,
            "hopper.async_read": async_read,
            "hopper.load": load, "hopper.store": store, "hopper.prefetch": prefetch, "tile.gather": gather,
            "tile.masked_store": masked_store}
