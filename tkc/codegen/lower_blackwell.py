"""The ``blackwell.*`` ops as per-thread code for sm_100a (docs/blackwell.md, PTX-FACTS §7).

Owns: tensor-memory allocation (the address slot in static shared memory, the role barrier
and tcgen05 fences around it), ``tcgen05.mma`` issue by one thread with the descriptors of
``tkc.ir.dialects.blackwell`` (shared-memory descriptors: Hopper's plus the version bit;
the instruction descriptor from the operands' layouts), ``tcgen05.commit`` onto an mbarrier,
``tcgen05.ld`` of a ``#tmem_acc`` tile (``.32x32b``) or of a 64-row product's ``#wgmma_acc``
tile (``.16x256b``), and ``#tmem_acc`` tiles (or column slices of them) stored to shared
memory, 16 bytes of a row a store where the tile's swizzle allows.  Everything is inline
PTX (the NVVM intrinsics exist but nothing here needs LLVM to know the ops).  On a tcgen05
target, what LLVM would hoist out of a loop and keep live through it is computed where it is
used (docs/blackwell.md, "Registers in loops"): descriptors inside the MMA's asm, shared
addresses of stores, reductions and layout changes from a thread index read again.

Must not: choose a layout, a column count or a barrier; every Hopper op keeps its handler in
``lower_hopper.py``, so sm_90a code is not touched by this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import llvmlite.ir as ir
import numpy as np

from tkc.codegen import lower_hopper, nvvm
from tkc.codegen.lower_elementwise import cast_value
from tkc.codegen.lower_values import const_i32, mem_type, to_mem
from tkc.codegen.lowerer import Handler, Lowerer, SmemTile
from tkc.codegen.nvvm import F32, I32, I64
from tkc.ir.core import Operation
from tkc.ir.dialects import blackwell
from tkc.dtypes import DType
from tkc.ir.layouts import SCALE_ATOM_BYTES, SharedLayout, TmemAccumulator, swizzle
from tkc.ir.types import element_dtype

_SLOT = "tkc_tmem_slot"
#: Registers of one tcgen05.ld whose values are added to an addend before the next is issued.
ADDEND_CHUNK = 8


def _asm(lw: Lowerer, text: str, constraints: str = "", args: list | None = None, ret: ir.Type | None = None):
    return nvvm.asm(lw.b, text, constraints, args or (), ret)


def _slot(lw: Lowerer) -> ir.Value:
    """The 32-bit shared-memory word tcgen05.alloc writes the address into (static shared)."""
    module = lw.b.module
    if _SLOT not in module.globals:
        g = ir.GlobalVariable(module, I32, _SLOT, addrspace=3)
        g.linkage = "internal"
        g.align = 4
        g.initializer = ir.Constant(I32, ir.Undefined)
    return module.globals[_SLOT]


def _first_warp(lw: Lowerer) -> ir.Value:
    return lw.b.icmp_unsigned("<", lw.tid, const_i32(32))


def _group(op: Operation) -> str:
    """The op's ``cta_group`` (a CTA pair's ops are ``::2``; a kernel uses one throughout)."""
    return "cta_group::2" if op.attributes.get("pair") else "cta_group::1"


def _in_even_cta(lw: Lowerer, cond: ir.Value) -> ir.Value:
    """``cond`` and this CTA is its pair's even one (the one that issues a pair's MMAs)."""
    b = lw.b
    rank = nvvm.sreg(b, "cluster.ctarank", "pair.rank")
    return b.and_(cond, b.icmp_unsigned("==", b.and_(rank, const_i32(1)), const_i32(0)))


def _tmem_alloc(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    slot = _slot(lw)
    addr = b.trunc(b.ptrtoint(slot, I64), I32)

    def alloc() -> None:
        # A pair's (cta_group::2): the same warp of each CTA, the same columns in both.
        g = _group(op)
        _asm(lw, f"tcgen05.alloc.{g}.sync.aligned.shared::cta.b32 [$0], {op.cols};", "r,~{memory}", [addr])
        _asm(lw, f"tcgen05.relinquish_alloc_permit.{g}.sync.aligned;", "~{memory}")

    lw.if_then(_first_warp(lw), alloc, "tmem_alloc")
    _asm(lw, "tcgen05.fence::before_thread_sync;", "~{memory}")
    lw.sync()
    _asm(lw, "tcgen05.fence::after_thread_sync;", "~{memory}")
    lw.set(op.result, b.load(slot))


def _tmem_dealloc(lw: Lowerer, op: Operation) -> None:
    tmem = lw.get(op.tmem)
    _asm(lw, "tcgen05.fence::before_thread_sync;", "~{memory}")
    lw.sync()
    _asm(lw, "tcgen05.fence::after_thread_sync;", "~{memory}")
    lw.if_then(_first_warp(lw), lambda: _asm(
        lw, f"tcgen05.dealloc.{_group(op)}.sync.aligned.b32 $0, {op.cols};", "r,~{memory}", [tmem]), "tmem_dealloc")


def _start4(lw: Lowerer, tile: SmemTile) -> ir.Value:
    """A shared tile's run-time part of a descriptor's start field: as lower_hopper's wgmma, the
    constant descriptor of the tile's offset plus the dynamic base (and a ring stage's offset)
    >> 4 in the 14-bit start field."""
    addr4 = lw.b.lshr(lw.smem_addr(tile.at if tile.at is not None else 0), const_i32(4))
    return lw.b.and_(addr4, const_i32(0x3FFF))


def _mma(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    sa, sb = lw.shared(op, op.a), lw.shared(op, op.b)
    la, lb = op.operand_layout("a"), op.operand_layout("b")
    kind = blackwell.mma_kind(la.dtype, lb.dtype)
    tmem = lw.get(op.tmem)
    accumulate = b.zext(lw.get(op.accumulate), I32)
    scales = op.scale_columns

    def issue() -> None:
        # The descriptors are summed inside the asm: as 64-bit values in LLVM they are loop
        # invariants that LICM hoists out of the loop, two registers each for every thread of
        # the role for the whole loop (attention's eight K steps took 16 of 112).
        a4, b4 = _start4(lw, sa), _start4(lw, sb)
        for k in range(la.k_steps):
            da, db = blackwell.smem_descriptor(la, sa.offset, k), blackwell.smem_descriptor(lb, sb.offset, k)
            # K steps after the first always accumulate.
            acc = accumulate if k == 0 else const_i32(1)
            if scales is None:
                idesc = blackwell.instr_descriptor(la, lb, op.instruction_m, op.n)
                instr = f"tcgen05.mma.{_group(op)}.kind::{kind} [$0], da, db, $3, p;"
            else:  # block-scaled: A's and B's scales at their columns from $0
                idesc, fa, fb = op.scale_step(k)
                vec = op.scale_vec
                instr = (f"tcgen05.mma.{_group(op)}.kind::{blackwell.SCALED_KINDS[vec]}.block_scale.scale_vec::{vec}X "
                         f"[$0], da, db, $3, [$0+{fa}], [$0+{fb}], p;")
            _asm(lw, "{\n\t.reg .pred p;\n\t.reg .b64 da, db;\n\tsetp.ne.b32 p, $4, 0;\n\t"
                     f"cvt.u64.u32 da, $1;\n\tadd.s64 da, da, {da};\n\t"
                     f"cvt.u64.u32 db, $2;\n\tadd.s64 db, db, {db};\n\t{instr}\n\t}}",
                 "r,r,r,r,r,~{memory}", [tmem, a4, b4, ir.Constant(I32, idesc), acc])

    def warp() -> None:
        # The first warp waits for the operands; its thread 0 issues after the fence that
        # orders the MMA behind the role's last barrier (the previous tile's tcgen05.ld).
        for bar, parity in op.waits():
            lower_hopper._wait_parity(lw, op, lw.ptr(lw.barrier(op, bar)), lw.get(parity))
        _asm(lw, "tcgen05.fence::after_thread_sync;", "~{memory}")
        lw.if_then(b.icmp_unsigned("==", lw.tid, const_i32(0)), issue, "tcgen05_mma")

    # A pair's MMA: the even CTA's first warp waits (on its own barrier, which counts both
    # CTAs' copies) and issues for both; the odd CTA skips it.
    first = _first_warp(lw)
    lw.if_then(_in_even_cta(lw, first) if op.attributes.get("pair") else first, warp, "mma_warp")


def _copy_scales(lw: Lowerer, op: Operation) -> None:
    """Thread 0 of the first warp copies each 512-byte block of the scale factors into four
    columns from ``tmem`` on (``tcgen05.cp .32x128b.warpx4``), after the fence that orders it
    behind the role's barrier that follows the threads' stores of the scales."""
    b = lw.b
    tile = lw.shared(op, op.scales)
    tmem = lw.get(op.tmem)

    def issue() -> None:
        s4 = _start4(lw, tile)
        for i in range(tile.layout.atoms):
            desc = blackwell.scale_descriptor(tile.offset + i * SCALE_ATOM_BYTES)
            _asm(lw, f"{{\n\t.reg .b64 d;\n\tcvt.u64.u32 d, $1;\n\tadd.s64 d, d, {desc};\n\t"
                     f"tcgen05.cp.cta_group::1.32x128b.warpx4 [$0+{4 * i}], d;\n\t}}", "r,r,~{memory}", [tmem, s4])

    def warp() -> None:
        _asm(lw, "tcgen05.fence::after_thread_sync;", "~{memory}")
        lw.if_then(b.icmp_unsigned("==", lw.tid, const_i32(0)), issue, "tcgen05_cp")

    lw.if_then(_first_warp(lw), warp, "cp_warp")


def _commit(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    bar = lw.smem_addr(lw.offset(lw.barrier(op, op.barrier)))
    commit = f"tcgen05.commit.{_group(op)}.mbarrier::arrive::one.shared::cluster"
    pair = bool(op.attributes.get("pair"))

    def issue() -> None:
        if op.attributes.get("cluster") or pair:
            # one arrival on the barrier at this offset in every CTA of the cluster (a pair's:
            # both CTAs, whose tensor memory its MMAs wrote); the mask is a 16-bit register
            mask = ir.Constant(ir.IntType(16), 0b11 if pair else (1 << lw.kernel.attributes["cluster"]) - 1)
            _asm(lw, f"{commit}.multicast::cluster.b64 [$0], $1;", "r,h,~{memory}", [bar, mask])
        else:
            _asm(lw, f"{commit}.b64 [$0];", "r,~{memory}", [bar])

    thread0 = b.icmp_unsigned("==", lw.tid, const_i32(0))
    lw.if_then(_in_even_cta(lw, thread0) if pair else thread0, issue, "tcgen05_commit")


def _chunk(regs: int) -> int:
    """Registers one tcgen05.ld moves per thread (32, 16 or 8; 4 for the last of a 64-row
    accumulator whose columns are an odd multiple of 8)."""
    return next(x for x in (32, 16, 8, 4) if regs % x == 0)


def _tmem_load(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    layout = op.result.type.layout
    tmem = lw.get(op.tmem)
    _asm(lw, "tcgen05.fence::after_thread_sync;", "~{memory}")
    # Warp w reads lanes 32 (w % 4) on; warpgroup g its columns g * regs on.
    lane = b.shl(b.and_(b.lshr(lw.tid, const_i32(5)), const_i32(3)), const_i32(21))
    if isinstance(layout, TmemAccumulator):
        # 32x32b.xN: thread t's lane (row), N consecutive columns.
        shape, cols_per_reg = "32x32b", 1
        col = b.mul(b.lshr(lw.tid, const_i32(7)), const_i32(layout.regs)) if layout.warpgroups > 1 else const_i32(0)
    else:
        # A 64-row accumulator (layout F: warp w's rows in its lanes 0-15): 16x256b.xN gives
        # register 4 i + q the row l/4 + 8 (q/2) and column 8 i + 2 (l%4) + q%2 of the warp's
        # 16 rows, wgmma's fragment (#wgmma_acc); 4 registers a repetition of 8 columns.
        shape, cols_per_reg, col = "16x256b", 2, const_i32(0)
    base = b.add(tmem, b.add(lane, col))
    written = lw.get(op.written)
    pin = ir.FunctionType(F32, [F32])
    addend = lw.tile(op, op.addend[0]) if op.addend else None
    # With an addend each chunk is waited for and added before the next is loaded (the sums
    # pass through an empty asm, so LLVM cannot sink the adds behind later loads): the
    # accumulator is never in registers whole beside the addend.  Else one wait for all.
    x = _chunk(layout.regs) if addend is None else min(_chunk(layout.regs), ADDEND_CHUNK)
    vals: list[ir.Value] = []
    for c in range(0, layout.regs, x):
        outs = ",".join(f"${i}" for i in range(x))
        ret = ir.LiteralStructType([I32] * x)
        reps = x if shape == "32x32b" else x // 4
        # The chunk's column as the address's immediate offset: one base register, not one
        # hoisted address a chunk.
        off = f"+{c * cols_per_reg}" if c else ""
        r = _asm(lw, f"tcgen05.ld.sync.aligned.{shape}.x{reps}.b32 {{{outs}}}, [${x}{off}];",
                 ",".join(["=r"] * x) + ",r", [base], ret)
        vals += [b.bitcast(b.extract_value(r, i), F32) for i in range(x)]
        if addend is not None:
            vals[c:] = _waited(lw, vals[c:], written)
            vals[c:] = [b.asm(pin, "", "=f,0", [b.fadd(a, v)], side_effect=True)
                        for a, v in zip(addend[c:c + x], vals[c:])]
    if addend is None:
        vals = _waited(lw, vals, written)
    _asm(lw, "tcgen05.fence::before_thread_sync;", "~{memory}")
    lw.set(op.result, vals)


def _waited(lw: Lowerer, vals: list[ir.Value], written: ir.Value) -> list[ir.Value]:
    """``tcgen05.wait::ld`` for the loads of ``vals``, whose uses stay behind it (as lower_hopper
    pins wgmma accumulators); zeros where ``written`` is false (no MMA ran)."""
    b = lw.b
    _asm(lw, "tcgen05.wait::ld.sync.aligned;", "~{memory}")
    pin = ir.FunctionType(F32, [F32])
    vals = [b.asm(pin, "", "=f,0", [v], side_effect=True) for v in vals]
    return [b.select(written, v, ir.Constant(F32, 0.0)) for v in vals]


@contextmanager
def _unhoisted_tid(lw: Lowerer) -> Iterator[None]:
    """``lw.tid`` read again through :func:`~tkc.codegen.nvvm.opaque` (as ``Lowerer.thread``'s
    ``opaque``, but one for every value of the op), so what is computed from it here stays here."""
    saved = lw.tid
    lw.tid = nvvm.opaque(lw.b, saved)
    try:
        yield
    finally:
        lw.tid = saved


def _row_runs(layout: TmemAccumulator, lay: SharedLayout, first: int) -> int:
    """Elements of one 16-byte store of a ``#tmem_acc`` thread's row into the shared tile
    ``lay`` (the thread's registers ``first`` on, consecutive columns, land in columns from a
    multiple of the warpgroup's share on), or 1 where the run would not start 16-byte
    aligned or the tile's layout does not keep every run contiguous (one store an element)."""
    eb = lay.dtype.bits // 8
    run = 16 // eb
    if lay.major != "k" or eb > 2 or lay.cols % run or first % run or layout.regs % run:
        return 1
    r, c = np.meshgrid(np.arange(lay.rows), np.arange(lay.cols), indexing="ij")
    lin = swizzle(lay.offset(r, c), lay.swizzle).reshape(lay.rows, lay.cols // run, run)
    if np.all(lin[..., :1] % 16 == 0) and np.array_equal(lin - lin[..., :1], np.broadcast_to(
            np.arange(run) * eb, lin.shape)):
        return run
    return 1


def _store_rows(lw: Lowerer, op: Operation, tile: SmemTile, vals: list, at: list, dt: DType, run: int) -> None:
    """``vals`` at tile coordinates ``at``, ``run`` consecutive columns a 16-byte store
    (``st.shared.v4.b32`` of the row's packed elements; one store an element for ``run`` 1)."""
    if run == 1:
        lower_hopper._smem_store_values(lw, op, tile, op.dst.type, vals, at, dt)
        return
    b, lay = lw.b, tile.layout
    vec = ir.VectorType(mem_type(lay.dtype), run)
    for i in range(0, len(vals), run):
        row, col = at[i]
        packed = ir.Constant(vec, None)
        for j, v in enumerate(vals[i:i + run]):
            packed = b.insert_element(packed, to_mem(b, cast_value(b, v, dt, lay.dtype), lay.dtype), const_i32(j))
        p = lower_hopper._smem_element_ptr(lw, tile, lower_hopper.smem_offset(lay, row, col))
        st = b.store(b.bitcast(packed, ir.VectorType(I32, 4)), b.bitcast(p, ir.PointerType(ir.VectorType(I32, 4), 3)))
        st.align = 16


def _smem_store(lw: Lowerer, op: Operation) -> None:
    """A ``#tmem_acc`` tile, or a column slice of one (the warpgroup that holds the columns
    stores its registers of them), a row's 16 bytes at a time where the shared layout keeps
    them together (attention's P, the epilogue's tile); everything else is Hopper's store."""
    layout, col = op.value.type.layout, op.attributes.get("col")
    if not isinstance(layout, TmemAccumulator):
        lower_hopper.HANDLERS["hopper.smem_store"](lw, op)
        return
    b = lw.b
    tile = lw.shared(op, op.dst)
    vals = lw.tile(op, op.value)
    # The addresses from a thread index LLVM cannot hoist: else every element's address (a
    # 64-bit shared pointer) is a loop invariant computed before the loop and live through it,
    # two registers a value stored (attention backward's dS, one store an element: 64).
    with _unhoisted_tid(lw):
        coords = lw.coords(op, layout)
    dt = element_dtype(op.value.type)
    if col is None:
        if op.dst.type.shape != (tile.layout.rows, tile.layout.cols):
            lower_hopper.HANDLERS["hopper.smem_store"](lw, op)  # a transposed view: element by element
            return
        _store_rows(lw, op, tile, vals, coords, dt, _row_runs(layout, tile.layout, 0))
        return
    width, per = op.dst.type.shape[-1], layout.regs
    g = col // per
    keep = range(col - g * per, col - g * per + width)
    kept, at = [vals[i] for i in keep], [(coords[i][0], coords[i][1] - col) for i in keep]
    run = _row_runs(layout, tile.layout, keep.start) if op.dst.type.shape == (
        tile.layout.rows, tile.layout.cols) and width % 16 == 0 else 1

    def store() -> None:
        _store_rows(lw, op, tile, kept, at, dt, run)

    if layout.warpgroups == 1:
        store()
    else:
        lw.if_then(b.icmp_unsigned("==", b.lshr(lw.tid, const_i32(7)), const_i32(g)), store, "tmem_slice")


def _unhoisted(name: str) -> Handler:
    """Hopper's handler of ``name``; on a tcgen05 target with the thread index read again
    (:func:`_unhoisted_tid`): the shared addresses of a cross-warp reduction or a layout
    change are loop invariants that LLVM hoists and ptxas keeps (Based's column sums)."""
    hopper_handler = lower_hopper.HANDLERS[name]

    def handler(lw: Lowerer, op: Operation) -> None:
        if lw.target.mma != "tcgen05":
            hopper_handler(lw, op)
            return
        with _unhoisted_tid(lw):
            hopper_handler(lw, op)

    return handler


HANDLERS: dict[str, Handler] = {
    blackwell.TmemAllocOp.name: _tmem_alloc,
    blackwell.TmemDeallocOp.name: _tmem_dealloc,
    blackwell.MmaOp.name: _mma,
    blackwell.CopyScalesOp.name: _copy_scales,
    blackwell.CommitOp.name: _commit,
    blackwell.TmemLoadOp.name: _tmem_load,
    "hopper.smem_store": _smem_store,
    "hopper.reduce": _unhoisted("hopper.reduce"),
    "hopper.reduce_group": _unhoisted("hopper.reduce_group"),
    "hopper.convert_layout": _unhoisted("hopper.convert_layout"),
}
