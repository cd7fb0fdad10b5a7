"""The ``hopper.*`` ops as per-thread NVVM code (docs/hopper.md §3, PTX-FACTS §1-§4, §8).

Owns: shared memory (tiles and mbarriers at their ``allocate-smem`` offsets from the dynamic
shared base; rings, whose stages ``hopper.stage`` addresses at run time), mbarrier
init/expect_tx/arrive/wait, fences and ``bar.sync``, TMA loads box by box, wgmma issue
(descriptors, SS and RS forms) and wait, reductions executed as their ``reduce_plan``,
layout conversions and register-to-shared stores, and warpgroup roles (the warpgroup test,
``setmaxnreg``, the rebased thread index).  Global loads and stores are in
``lower_global.py``; their handlers are listed here with the rest.

Must not: choose a layout, an offset or a plan.  Every address, descriptor, box and shuffle
comes from the layout on the type (``SharedLayout.offset/descriptor/tma_box``, the register
layout's coordinates, ``reduce_plan``).  Codegen never chooses a layout; it reads the one on
the type.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, NamedTuple

import llvmlite.ir as ir
import numpy as np

from tkc import dtypes
from tkc.codegen import nvvm
from tkc.codegen.deferred import Deferred, Picked
from tkc.codegen.lower_elementwise import cast_value
from tkc.codegen.lower_global import HANDLERS as GLOBAL
from tkc.codegen.lower_values import (
    Sym,
    as_value,
    const_i32,
    from_mem,
    llvm_call,
    mem_type,
    pack_fp8x4,
    pack_pair,
    pack_words,
    packs_in_fours,
    packs_in_pairs,
    round_to,
    to_mem,
)
from tkc.codegen.lower_ranks import tensor_map
from tkc.codegen.lowerer import Barrier, Handler, Lowerer, Ring, SmemTile
from tkc.codegen.nvvm import F32, I8, I32, I64
from tkc.dtypes import DType
from tkc.errors import TkcCodegenError
from tkc.ir.core import Operation, Value
from tkc.ir.dialects.hopper import SLOT_ROW, TURN_BARRIER, is_vector_box, tma_row_axis
from tkc.ir.dialects.tile import constant_value
from tkc.ir.layouts import (TRANSPOSE_BLOCK, ScaleLayout, SharedLayout, WgmmaAccumulator, WgmmaOperandA8,
                            a8_logical_col, first_holders, register_map, swizzle, transpose_copy_block,
                            transpose_copy_blocks, is_accumulator, offset_step, transpose_copy_last,
                            transpose_word_steps, vector_coords)
from tkc.ir.types import TileType, element_dtype
from tkc.registers import entry_registers


# --------------------------------------------------------------------------- shared memory


def _placed(op: Operation, first: SmemTile | Barrier) -> SmemTile | Barrier | Ring:
    """The allocation's value: ``first``, or the ring of ``stages`` of them ``op.stride`` apart."""
    if op.offset < 0:
        raise TkcCodegenError(f"'{op.name}' has no offset: run allocate-smem first", op.loc)
    stages = op.attributes.get("stages", 1)
    return first if stages == 1 else Ring(first, stages, op.stride)


def _smem_alloc(lw: Lowerer, op: Operation) -> None:
    lw.set(op.result, _placed(op, SmemTile(op.offset, op.result.type.layout)))


def _mbarrier_alloc(lw: Lowerer, op: Operation) -> None:
    lw.set(op.result, _placed(op, Barrier(op.offset)))


def _stage(lw: Lowerer, op: Operation) -> None:
    # Stage k sits k strides after stage 0; the stride is a multiple of the tile's alignment,
    # so swizzle phases and descriptors of a stage are those of stage 0 moved by k * stride.
    ring = lw.get(op.ring)
    if not isinstance(ring, Ring):
        raise TkcCodegenError(f"'{op.name}' takes a ring, got {type(ring).__name__}", op.loc)
    at = as_value(Sym(lw.b, lw.get(op.index)) * ring.stride)
    first = ring.first
    lw.set(op.result, SmemTile(first.offset, first.layout, at) if isinstance(first, SmemTile)
           else Barrier(first.offset, at))


def _bar(lw: Lowerer, op: Operation) -> ir.Value:
    return lw.ptr(lw.barrier(op, op.barrier))


def _swizzle_sym(a: Sym | int, swizzle_bytes: int) -> Sym | int:
    """``layouts.swizzle`` applied to a run-time offset: ``a ^ ((a >> src) & mask) << shl``
    (:func:`_swizzle_field`)."""
    if swizzle_bytes == 0 or isinstance(a, int):
        return int(swizzle(a, swizzle_bytes)) if isinstance(a, int) else a
    src, mask, shl = _swizzle_field(swizzle_bytes)
    return a ^ (((a >> src) & mask) << shl)


@functools.cache
def _swizzle_field(swizzle_bytes: int) -> tuple[int, int, int]:
    """The swizzle XORs a bit field into a lower one: ``(src, mask, shl)``, read off
    ``layouts.swizzle`` itself (which bits of a single-bit address it toggles) and checked
    against it over 2^18 addresses, so there is one definition of the swizzle.  Once a
    swizzle (every shared address a kernel computes at run time asks)."""
    toggles = {k: int(swizzle(1 << k, swizzle_bytes)) ^ (1 << k) for k in range(18)}
    src = [k for k, t in toggles.items() if t]
    shift = src[0] - int(toggles[src[0]]).bit_length() + 1
    width = len(src)
    probe = np.arange(1 << 18)
    mask = (1 << width) - 1
    if any(toggles[k] != 1 << (k - shift) for k in src) or src != list(range(src[0], src[0] + width)) or \
            not np.array_equal(swizzle(probe, swizzle_bytes), probe ^ (((probe >> src[0]) & mask) << (src[0] - shift))):
        raise TkcCodegenError(f"the {swizzle_bytes}-B swizzle is not a shifted bit field")
    return src[0], mask, src[0] - shift


def smem_offset(layout: SharedLayout, row: Sym | int, col: Sym | int) -> Sym | int:
    """Byte offset of element (row, col) of a shared tile, where row/col may be run-time.

    Compile-time coordinates use ``layout.offset`` directly.  Otherwise the unswizzled
    offset (``swizzle`` is an involution) is fitted, exactly over the whole tile, as
    ``row * dr + (col // P) * A + (col % P) * B`` with ``P = layout.box_cols`` (rows
    inside a box, boxes back to back), and the swizzle is applied on top."""
    if not isinstance(row, Sym) and not isinstance(col, Sym):
        return int(layout.offset(int(row), int(col)))
    if isinstance(layout, ScaleLayout):  # not rows x boxes: its own formula, on the symbols
        return layout.byte(row, col)
    dr, p, a, bb = _rows_by_boxes(layout)
    return _swizzle_sym(row * dr + (col // p) * a + (col % p) * bb, layout.swizzle)


@functools.cache
def _rows_by_boxes(layout: SharedLayout) -> tuple[int, int, int, int]:
    """``(dr, P, A, B)`` of :func:`smem_offset`'s fit for ``layout``, checked over every
    element of the tile; once a layout."""
    r, c = np.meshgrid(np.arange(layout.rows), np.arange(layout.cols), indexing="ij")
    lin = swizzle(layout.offset(r, c), layout.swizzle)
    p = layout.box_cols
    dr = int(lin[1, 0] - lin[0, 0]) if layout.rows > 1 else 0
    a = int(lin[0, p] - lin[0, 0]) if layout.cols > p else 0
    bb = int(lin[0, 1] - lin[0, 0]) if layout.cols > 1 else 0
    if int(lin[0, 0]) != 0 or not np.array_equal(lin, r * dr + (c // p) * a + (c % p) * bb):
        raise TkcCodegenError(f"shared layout {layout} is not rows x boxes; cannot address it at run time")
    return dr, p, a, bb


def _tile_coords(t: TileType, layout: SharedLayout, coord: tuple) -> tuple:
    """(row, col) in the layout of tile coordinate ``coord`` of a shared tile (or its transposed view)."""
    if t.shape == (layout.rows, layout.cols):
        return coord
    return coord[1], coord[0]


def _smem_element_ptr(lw: Lowerer, tile: SmemTile, offset: Sym | int) -> ir.Value:
    return lw.ptr(tile, offset.v if isinstance(offset, Sym) else int(offset))


def _smem_store_values(lw: Lowerer, op: Operation, tile: SmemTile, t: TileType, vals: list, coords: list,
                       dt: DType) -> None:
    """Store register values (register form of ``dt``) at their tile coordinates."""
    lay = tile.layout
    for v, c in zip(vals, coords):
        row, col = _tile_coords(t, lay, c)
        p = _smem_element_ptr(lw, tile, smem_offset(lay, row, col))
        lw.b.store(to_mem(lw.b, cast_value(lw.b, v, dt, lay.dtype), lay.dtype), p)


def _words_of(b: ir.IRBuilder, vals: list, dt: DType) -> list[ir.Value]:
    """32-bit words of register values of ``dt`` in memory order: 16- and 8-bit floats packed
    (``pack_words``), f32 and i32 as they are."""
    if packs_in_pairs(dt) or packs_in_fours(dt):
        return pack_words(b, vals, dt)
    return [b.bitcast(v, I32) if v.type != I32 else v for v in vals]


def _store_words(b: ir.IRBuilder, ptr: ir.Value, words: list[ir.Value], nbytes: int) -> None:
    """One store of ``words`` at ``ptr`` (aligned to ``nbytes``: a ``st.shared.v2``/``v4``)."""
    if len(words) == 1:
        b.store(words[0], ptr, align=nbytes)
        return
    vec = ir.Constant(ir.VectorType(I32, len(words)), None)
    for j, w in enumerate(words):
        vec = b.insert_element(vec, w, const_i32(j))
    b.store(vec, ptr, align=nbytes)


def _smem_load_values(lw: Lowerer, tile: SmemTile, t: TileType, coords: list, dt: DType) -> list:
    lay = tile.layout
    out = []
    for c in coords:
        row, col = _tile_coords(t, lay, c)
        p = _smem_element_ptr(lw, tile, smem_offset(lay, row, col))
        v = from_mem(lw.b, lw.b.load(p, typ=mem_type(lay.dtype)), lay.dtype)
        out.append(cast_value(lw.b, v, lay.dtype, dt))
    return out


def _held_coords(lw: Lowerer, op: Operation, layout: object, shape: tuple, held: SmemTile, held_shape: tuple
                 ) -> list:
    """Per value of ``layout`` (a tile of ``shape``), where the shared tile ``held`` keeps it: its
    tile coordinates, or, for a tile kept in order in rows of one atom (``vector_scratch``, whose
    shape ``held_shape`` differs), ``vector_coords``."""
    coords = lw.coords(op, layout)
    return coords if held_shape == shape else [vector_coords(c, shape, held.layout) for c in coords]


def _smem_load(lw: Lowerer, op: Operation) -> None:
    """Every thread reads its values from the shared tile (a 1-D tile held in order in rows of
    one atom at ``vector_coords``)."""
    src = lw.shared(op, op.src)
    t = op.result.type
    coords = _held_coords(lw, op, t.layout, t.shape, src, op.src.type.shape)
    lw.set(op.result, _smem_load_values(lw, src, op.src.type, coords, element_dtype(t)))


def _smem_store(lw: Lowerer, op: Operation) -> None:
    tile = lw.shared(op, op.dst)
    vals = lw.tile(op, op.value)
    layout, dt = op.value.type.layout, element_dtype(op.value.type)
    col = op.attributes.get("col")
    width = op.dst.type.shape[-1]
    if _stmatrix_fits(layout, tile.layout, op.dst.type, dt, col or 0):
        _stmatrix_store(lw, tile, layout, vals, dt, col or 0, width, _under_pressure(op))
        return
    # Under pressure in a loop, each value's address from its own opaque thread index,
    # computed at the store: LLVM would otherwise hoist one address per value out of the loop
    # and hold them all through it (attention backward's staged dQ: 32 of them spilled 128 B;
    # one opaque index for all still spilled 4 B with the causal mask).
    coords = lw.coords(op, layout, opaque=_under_pressure(op) and any(a.name == "tile.for" for a in op.ancestors()))
    keep = list(range(layout.regs))
    if col is not None:
        # The value's columns [col, col + width), shifted to the tile's origin; the verifier
        # made them whole 8-column groups of an accumulator, which each register's own
        # column offset decides (a thread's column is below 8).
        keep = [i for i in range(layout.regs) if col <= layout.reg_coords(i)[1] < col + width]
        vals, coords = [vals[i] for i in keep], [(coords[i][0], coords[i][1] - col) for i in keep]
    steps = _offset_steps(layout, tile.layout, op.dst.type, keep, col or 0)
    if steps is None:
        _smem_store_values(lw, op, tile, op.dst.type, vals, coords, dt)
        return
    # A value whose address is another's with bits flipped or a constant added, for every
    # thread, is stored there (an XOR and an immediate offset): attention backward's staged
    # dQ^T, 32 f32 values a thread through a 128-B swizzle, needs one address, not 32 (each a
    # dozen instructions an iteration).  Values at consecutive addresses go out together, in
    # one vector store of 32-bit words (``_store_runs``).
    lay, offs, ptrs = tile.layout, {}, {}
    runs = [(i, 1) for i in range(len(vals))]
    if not is_accumulator(layout) and lay.dtype == dt and (packs_in_pairs(dt) or packs_in_fours(dt) or dt.bits == 32):
        runs = _store_runs(_value_offsets(layout, lay, op.dst.type, keep, col or 0), dt)
    for first, n in runs:
        base, xor, delta = steps[first]
        if base not in offs:
            row, col_ = _tile_coords(op.dst.type, lay, coords[base])
            offs[base] = smem_offset(lay, row, col_)
        if (base, xor) not in ptrs:
            ptrs[base, xor] = _smem_element_ptr(lw, tile, offs[base] ^ xor)
        p = ptrs[base, xor] if not delta else lw.b.gep(ptrs[base, xor], [const_i32(delta)], source_etype=I8)
        if n == 1:
            lw.b.store(to_mem(lw.b, cast_value(lw.b, vals[first], dt, lay.dtype), lay.dtype), p)
        else:
            _store_words(lw.b, p, _words_of(lw.b, vals[first:first + n], dt), n * lay.elem_bytes)


def _value_offsets(layout: object, shared: SharedLayout, t: TileType, regs: list[int],
                   col: int) -> list[np.ndarray] | None:
    """Per stored value ``k`` (register ``regs[k]`` of ``layout``, its column less ``col``), its
    byte offset in ``shared`` in every thread, or None when the layout's coordinates cannot be
    evaluated for all threads here."""
    try:
        threads = np.arange(int(layout.threads))
        tc = [np.asarray(x) for x in layout.thread_coords(threads)]
        rows, cols = np.meshgrid(np.arange(shared.rows), np.arange(shared.cols), indexing="ij")
        table = shared.offset(rows, cols)  # the byte offsets, swizzle included
        offs = []
        for i in regs:
            rc = [int(x) for x in layout.reg_coords(i)]
            coord = (tc[0] + rc[0], tc[1] + rc[1] - col)
            r, c = _tile_coords(t, shared, coord)
            offs.append(np.asarray(table[r, c], dtype=np.int64))
    except (ValueError, TypeError, AttributeError, IndexError):
        return None
    return offs


def _store_runs(offs: list[np.ndarray], dt: DType) -> list[tuple[int, int]]:
    """``(first, length)`` runs covering the stored values in order: values ``first ..
    first + length - 1`` sit at consecutive offsets in every thread, the first aligned to the
    run's bytes (at most 16, whole 32-bit words), so one vector store writes them; a value in
    no such run is a run of 1.  A dequantized bf16 operand stores 8 values a ``st.shared.v4``
    instead of 8 ``st.shared.b16``."""
    eb = max(dt.bits // 8, 1)
    widest = 16 // eb
    shortest = max(4 // eb, 1)  # a run packs whole 32-bit words
    runs, i = [], 0
    while i < len(offs):
        n = widest
        while n >= shortest and not (i + n <= len(offs) and np.all(offs[i] % (n * eb) == 0)
                                     and all(np.all(offs[i + j] == offs[i] + j * eb) for j in range(1, n))):
            n //= 2
        n = n if n >= shortest and n > 1 else 1
        runs.append((i, n))
        i += n
    return runs


def _offset_steps(layout: object, shared: SharedLayout, t: TileType, regs: list[int],
                  col: int) -> list[tuple[int, int, int]] | None:
    """Per stored value ``k`` (register ``regs[k]`` of ``layout``, its column less ``col``),
    ``(j, xor, add)``: its byte offset in ``shared`` is value ``j``'s, XORed with ``xor`` and
    plus ``add``, in every thread (``layouts.offset_step``; ``(k, 0, 0)`` for the values whose
    addresses are computed), or None when the layout's coordinates cannot be evaluated for all
    threads here."""
    offs = _value_offsets(layout, shared, t, regs, col)
    if offs is None:
        return None
    out: list[tuple[int, int, int]] = []
    bases: list[int] = []
    for k, o in enumerate(offs):
        steps = [(j, step) for j in bases if (step := offset_step(o, offs[j])) is not None]
        if steps:  # an immediate offset from a base where one is, else an XOR too
            j, (xor, add) = min(steps, key=lambda s: s[1][0] != 0)
            out.append((j, xor, add))
        else:
            bases.append(k)
            out.append((k, 0, 0))
    return out


def _prmt(b: ir.IRBuilder, x: ir.Value, y: ir.Value, selector: int) -> ir.Value:
    """``prmt.b32``: bytes of (``y``:``x``) picked by the four nibbles of ``selector``."""
    return b.asm(ir.FunctionType(I32, [I32, I32]), f"prmt.b32 $0, $1, $2, {selector:#x};", "=r,r,r", [x, y],
                 side_effect=False)


def _smem_copy(lw: Lowerer, op: Operation) -> None:
    """The transposing copy, 4 x 4 blocks of bytes a thread (``transpose_copy_block``): four
    4-byte words read along the source's rows (the block's four destination columns), bytes
    regrouped with eight ``prmt``, four words written along the destination's rows.

    Addresses: where ``transpose_word_steps`` finds one (every word of a producer warpgroup's
    copy), a word's offset is its side's first word of round 0, XORed with one constant and
    plus another, exact for every thread, so a block costs a few XORs and adds on 32-bit shared
    addresses with the rest in the instructions' immediates, not the ~50 integer instructions
    of deriving each address from the thread index (which the other words still take)."""
    src, dst = lw.shared(op, op.src), lw.shared(op, op.dst)
    lay, b = dst.layout, lw.b
    if lay.elem_bytes != 1:
        raise TkcCodegenError(f"'{op.name}' transposes 8-bit tiles, not {lay.dtype.name}", op.loc)
    try:
        per = transpose_copy_blocks(lay.rows, lay.cols, lw.threads)
        steps = transpose_word_steps(src.layout, lay, lw.threads)
    except ValueError as e:
        raise TkcCodegenError(f"'{op.name}': {e}", op.loc) from None
    stored = replace(lay, kperm=False)  # addressed by stored column
    # Computed here, not hoisted out of the loop: the thread index is opaque to LLVM.
    t = Sym(b, nvvm.opaque(b, lw.tid))
    row0, col0 = transpose_copy_block(lay.rows, lay.cols, lw.threads, t, 0)
    k0 = a8_logical_col(col0) if lay.kperm else col0
    bases = [as_value(smem_offset(src.layout, k0, row0)), as_value(smem_offset(stored, row0, col0))]
    tiles = [lw.smem_addr(lw.offset(src)), lw.smem_addr(lw.offset(dst))]
    made: dict[tuple[int, int], ir.Value] = {}

    def word(r: int, w: int) -> tuple[ir.Value, int]:
        """The 32-bit shared address of word ``w`` (0-3 read, 4-7 written) of round ``r``, less
        the immediate that the instruction adds."""
        side, step = w // TRANSPOSE_BLOCK, steps[r][w]
        if step is None:  # from the thread index
            row, col = transpose_copy_block(lay.rows, lay.cols, lw.threads, t, r)
            u = w % TRANSPOSE_BLOCK
            k = a8_logical_col(col + u) if lay.kperm else col + u
            off = smem_offset(src.layout, k, row) if side == 0 else smem_offset(stored, row + u, col)
            return b.add(tiles[side], as_value(off)), 0
        xor, add = step
        if (side, xor) not in made:
            off = bases[side] if xor == 0 else b.xor(bases[side], const_i32(xor))
            made[side, xor] = b.add(tiles[side], off)
        return made[side, xor], add

    last = transpose_copy_last(lay.rows, lay.cols, lw.threads)
    for r in range(per):
        if r == per - 1 and last < lw.threads:  # the threads past the blocks move none
            lw.if_then(b.icmp_unsigned("<", lw.tid, const_i32(last)),
                       lambda r=r: _transpose_block(lw, word, r), "transpose.last")
        else:
            _transpose_block(lw, word, r)


def _transpose_block(lw: Lowerer, word: Callable[[int, int], tuple[ir.Value, int]], r: int) -> None:
    """Round ``r`` of the transposing copy: this thread's 4 x 4 block of bytes."""
    b = lw.b
    words = [nvvm.asm(b, f"ld.shared.b32 $0, [$1+{add}];", "=r,r", [a], ret=I32)
             for a, add in (word(r, w) for w in range(TRANSPOSE_BLOCK))]
    # A 4 x 4 byte transpose in eight prmt: interleave bytes 0-1 and 2-3 of word pairs, then
    # halves; word v of the result holds byte v of each source word.
    pairs = [_prmt(b, words[i], words[i + 1], sel) for i in (0, 2) for sel in (0x5140, 0x7362)]
    out = [_prmt(b, pairs[h], pairs[2 + h], sel) for h in (0, 1) for sel in (0x5410, 0x7632)]
    for v in range(TRANSPOSE_BLOCK):
        a, add = word(r, TRANSPOSE_BLOCK + v)
        nvvm.asm(b, f"st.shared.b32 [$0+{add}], $1;", "r,r", [a, out[v]])


def _stmatrix_fits(layout: object, shared: SharedLayout, t: TileType, dt: DType, col: int) -> bool:
    """A 16-bit wgmma accumulator tile (or its columns from ``col`` on) into a tile stored as
    its own shape, rows contiguous (either major: it changes descriptors, not bytes; attention
    backward's dS^T is an ``mn`` B): 8 values of a row at a multiple of 8 columns are one 16-byte
    chunk, whatever the swizzle, which is what a stmatrix lane address points at."""
    return (isinstance(layout, WgmmaAccumulator) and layout.n % 16 == 0 and dt in (dtypes.bf16, dtypes.f16)
            and shared.dtype == dt and t.shape == (shared.rows, shared.cols)
            and col % 16 == 0 and shared.cols % 16 == 0)


def _stmatrix_store(lw: Lowerer, tile: SmemTile, layout: WgmmaAccumulator, vals: list, dt: DType,
                    col: int, width: int, local: bool = False) -> None:
    """The epilogue of PTX-FACTS §6: one ``stmatrix.x4`` per 16 columns, each lane giving the
    address of one 8-value row chunk and four bf16x2/f16x2 words, instead of a shared
    address per value (which held a register each and spilled a 128 x 256 tile).  Columns
    ``col`` to ``col + width`` of the accumulator go to columns 0 to ``width`` of the tile.
    ``local``: the lane addresses are computed here, not shared with (or hoisted to) earlier
    code."""
    b = lw.b
    plan = layout.stmatrix_x4()
    row, col0 = layout.stmatrix_lane(lw.thread(layout, opaque=local))
    for m in range(layout.slices):
        for s in range(col // 16, (col + width) // 16):
            p = _smem_element_ptr(lw, tile, smem_offset(tile.layout, row + 64 * m, col0 + 16 * s - col))
            words = [pack_pair(b, vals[int(plan.regs[m, s, j, 0])], vals[int(plan.regs[m, s, j, 1])], dt)
                     for j in range(4)]
            nvvm.call(b, "stmatrix.sync.aligned.m8n8.x4.b16.p3", p, *words)


# --------------------------------------------------------------------------- barriers and fences


def _mbarrier_init(lw: Lowerer, op: Operation) -> None:
    # A ring is initialized whole: every stage gets the same arrival count.
    ring = lw.get(op.barrier)
    if isinstance(ring, Ring) and isinstance(ring.first, Barrier):
        stages = [Barrier(ring.first.offset + s * ring.stride) for s in range(ring.stages)]
    else:
        stages = [lw.barrier(op, op.barrier)]
    for bar in stages:
        nvvm.call(lw.b, "mbarrier.init.shared", lw.ptr(bar), op.count)


def _mbarrier_arrive(lw: Lowerer, op: Operation) -> None:
    # One arrival per warpgroup (docs/hopper.md): its first thread arrives, with release
    # semantics so the warpgroup's reads of the stage (its wgmma has completed) happen before
    # the producer's next copy into it.  Inline PTX: LLVM's arrive intrinsic prints the form
    # without .release.cta and wants a state register.
    b = lw.b
    bar = _bar(lw, op)
    first = b.icmp_unsigned("==", b.and_(lw.tid, const_i32(127)), const_i32(0))
    if op.attributes.get("cluster"):
        lw.if_then(first, lambda: _arrive_cluster(lw, bar), "arrive")
        return
    fty = ir.FunctionType(ir.VoidType(), [bar.type])

    def arrive() -> None:
        b.asm(fty, "mbarrier.arrive.release.cta.shared::cta.b64 _, [$0];", "l,~{memory}", [bar], side_effect=True)

    if op.attributes.get("threads"):
        arrive()  # every thread, each ordering its own reads of the stage (hopper.smem_load)
        return
    lw.if_then(first, arrive, "arrive")


def _arrive_cluster(lw: Lowerer, bar: ir.Value) -> None:
    """One arrival on the barrier at ``bar``'s offset in every CTA of the cluster (PTX-FACTS
    §4: ``mapa`` to the peer's shared::cluster address, then the arrive, with the default
    release at CTA scope: the warpgroup's reads of the stage were its wgmmas', complete by
    the wait before this, and a cluster-scope release costs a fence on every arrival)."""
    b = lw.b
    addr = b.ptrtoint(bar, nvvm.I32)
    fty = ir.FunctionType(ir.VoidType(), [nvvm.I32, nvvm.I32])
    for rank in range(lw.kernel.attributes["cluster"]):
        b.asm(fty, "{\n.reg .b32 r;\nmapa.shared::cluster.u32 r, $0, $1;\n"
                   "mbarrier.arrive.shared::cluster.b64 _, [r];\n}",
              "r,r,~{memory}", [addr, const_i32(rank)], side_effect=True)


def _cluster_barrier(lw: Lowerer, op: Operation) -> None:
    # Every thread: arrive (release: its barrier inits, copies and arrivals before it), then
    # wait (acquire).  Kernel level only, where all threads have converged (.aligned).
    nvvm.call(lw.b, "barrier.cluster.arrive.aligned")
    nvvm.call(lw.b, "barrier.cluster.wait.aligned")


def _expect_tx(lw: Lowerer, op: Operation) -> None:
    if op.attributes.get("pair"):
        # On the pair's even CTA's barrier (mapa to rank & ~1), which counts both CTAs' copies.
        addr = lw.b.ptrtoint(_bar(lw, op), nvvm.I32)
        lw.b.asm(ir.FunctionType(ir.VoidType(), [nvvm.I32]),
                 f"{{\n.reg .b32 r;\n{_EVEN_CTA_BARRIER}"
                 f"mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64 _, [r], {op.bytes};\n}}",
                 "r,~{memory}", [addr], side_effect=True)
        return
    nvvm.call(lw.b, "mbarrier.arrive.expect.tx.scope.cta.space.cta", _bar(lw, op), op.bytes)


#: PTX that leaves in ``r`` the shared::cluster address of the barrier at ``$0``'s offset in the
#: even CTA of this CTA's pair (``mapa`` to ``%cluster_ctarank & ~1``).
_EVEN_CTA_BARRIER = "mov.u32 r, %cluster_ctarank;\nand.b32 r, r, 0xfffffffe;\nmapa.shared::cluster.u32 r, $0, r;\n"


def _mbarrier_wait(lw: Lowerer, op: Operation) -> None:
    _wait_parity(lw, op, _bar(lw, op), lw.get(op.parity))


def _wait_parity(lw: Lowerer, op: Operation, bar: ir.Value, parity: ir.Value) -> None:
    """Spin until the phase of parity ``parity`` of the mbarrier at ``bar`` has completed
    (try_wait.parity returns after a bounded time even when the phase is not done)."""
    b = lw.b
    timeout_ms = lw.options.wait_timeout_ms
    start = nvvm.call(b, "read.ptx.sreg.globaltimer") if timeout_ms else None
    spin = lw.fn.append_basic_block("mbar.wait")
    done = lw.fn.append_basic_block("mbar.done")
    b.branch(spin)
    b.position_at_end(spin)
    ok = nvvm.call(b, "mbarrier.try.wait.parity.scope.cta.space.cta", bar, parity)
    if not timeout_ms:
        b.cbranch(ok, done, spin)
        b.position_at_end(done)
        return
    # The pin wait_timeout_ms: a wait that has not passed after that long names itself and
    # stops the kernel, so a hang becomes a launch error with the wait's source line.
    check = lw.fn.append_basic_block("mbar.check")
    timed_out = lw.fn.append_basic_block("mbar.timeout")
    b.cbranch(ok, done, check)
    b.position_at_end(check)
    waited = b.sub(nvvm.call(b, "read.ptx.sreg.globaltimer"), start)
    b.cbranch(b.icmp_unsigned(">", waited, ir.Constant(I64, timeout_ms * 1_000_000)), timed_out, spin)
    b.position_at_end(timed_out)
    tid = nvvm.sreg(b, "tid.x", "wait.tid")
    with b.if_then(b.icmp_unsigned("==", b.and_(tid, const_i32(31)), const_i32(0))):  # a line per warp
        where = str(op.loc).replace("%", "%%") if op.loc is not None else "<unknown>"
        nvvm.printf(b, f"tkc: {where}: mbarrier wait timed out after {timeout_ms} ms (wait_timeout_ms): "
                       f"CTA (%d, %d, %d) thread %d waits for parity %d of the barrier at shared address %u\n",
                    nvvm.sreg(b, "ctaid.x", "wait.cx"), nvvm.sreg(b, "ctaid.y", "wait.cy"),
                    nvvm.sreg(b, "ctaid.z", "wait.cz"), tid, parity,
                    b.ptrtoint(bar, nvvm.I32))  # (the barrier's word is opaque to loads: not printed)
    nvvm.trap(b)
    b.branch(done)
    b.position_at_end(done)


def _barrier(lw: Lowerer, op: Operation) -> None:
    nvvm.call(lw.b, "barrier.cta.sync.aligned.all", op.id)


def _sync(lw: Lowerer, op: Operation) -> None:
    lw.sync()


def _turn(lw: Lowerer, op: Operation) -> None:
    """``hopper.turn``: warpgroup ``g`` of the role (uniform in each warp, as ``.aligned``
    needs) syncs on ``TURN_BARRIER + g`` and arrives on ``TURN_BARRIER + 1 - g``, 256 threads."""
    b = lw.b
    g = b.lshr(lw.tid, const_i32(7))
    kind = op.attributes["kind"]

    def wait(bar: ir.Value) -> None:
        nvvm.call(b, "barrier.cta.sync.aligned.count", bar, 256)

    def give(bar: ir.Value) -> None:
        nvvm.call(b, "barrier.cta.arrive.aligned.count", bar, 256)

    if kind == "wait":
        wait(b.add(g, const_i32(TURN_BARRIER)))
    elif kind == "pass":
        give(b.sub(const_i32(TURN_BARRIER + 1), g))
    elif kind == "start":
        lw.if_then(b.icmp_unsigned("==", g, const_i32(1)), lambda: give(const_i32(TURN_BARRIER)), "turn.start")
    else:
        lw.if_then(b.icmp_unsigned("==", g, const_i32(0)), lambda: wait(const_i32(TURN_BARRIER)), "turn.end")


# --------------------------------------------------------------------------- TMA


def _tma_rank(lw: Lowerer, op: Operation) -> int:
    """The rank of a TMA copy's tensor, checked, with the copy's tensor map."""
    rank = lw.get(op.tensor).type.rank
    if not 2 <= rank <= 5:
        raise TkcCodegenError(f"TMA copies tensors of rank 2 to 5, not {rank}", op.loc)
    if not 0 <= op.map < len(lw.tmaps):
        raise TkcCodegenError(f"tensor map {op.map} is not in the kernel's tma_maps", op.loc)
    return rank


def _tma_boxes(lw: Lowerer, op: Operation, tile: SmemTile) -> Iterator[tuple[ir.Value, list[ir.Value]]]:
    """For every TMA box of the shared ``tile`` a copy moves: the box's address in the tile
    and its coordinates in the tensor, innermost first (the box's column and row move along the
    last axis and the row axis, ``hopper.tma_row_axis``)."""
    b = lw.b
    offsets = [lw.get(v) for v in op.offsets]
    if is_vector_box(op.box, tile.layout):  # one box: the run along the last axis
        yield lw.ptr(tile, 0), offsets[::-1]
        return
    box = tile.layout.tma_box()
    r = tma_row_axis(op.box)
    for j in range(box.count[1]):
        for i in range(box.count[0]):
            coords = list(offsets)
            coords[-1] = b.add(offsets[-1], const_i32(i * box.dims[0]))
            coords[r] = b.add(offsets[r], const_i32(j * box.dims[1]))
            yield lw.ptr(tile, i * box.inner_stride + j * box.outer_stride), coords[::-1]


def _tma_load(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    rank = _tma_rank(lw, op)
    bar = _bar(lw, op)
    boxes = list(_tma_boxes(lw, op, lw.shared(op, op.dst)))
    n = op.attributes.get("multicast") or 1

    def issue(share: list, mask: int) -> None:
        for p, coords in share:
            nvvm.call(b, f"cp.async.bulk.tensor.g2s.tile.{rank}d", b.addrspacecast(p, nvvm.ptr(nvvm.SHARED_CLUSTER)),
                      bar, tensor_map(lw, op, lw.tmaps[op.map]), *coords, mask, 0, 1 if mask else 0, 0)

    if op.attributes.get("pair"):
        # A CTA pair's copy: into this CTA, its bytes completing on the even CTA's barrier.
        addr = b.ptrtoint(bar, nvvm.I32)
        tmap = tensor_map(lw, op, lw.tmaps[op.map])
        coord_regs = ", ".join(f"${3 + i}" for i in range(rank))
        fty = ir.FunctionType(ir.VoidType(), [nvvm.I32, nvvm.I32, tmap.type] + [nvvm.I32] * rank)
        for p, coords in boxes:
            b.asm(fty, f"{{\n.reg .b32 r;\n{_EVEN_CTA_BARRIER.replace('$0', '$1')}"
                       f"cp.async.bulk.tensor.{rank}d.cta_group::2.shared::cluster.global.mbarrier::complete_tx::bytes "
                       f"[$0], [$2, {{{coord_regs}}}], [r];\n}}",
                  ",".join(["r", "r", "l"] + ["r"] * rank) + ",~{memory}",
                  [b.ptrtoint(p, nvvm.I32), addr, tmap, *coords], side_effect=True)
        return
    if n == 1:
        issue(boxes, 0)
        return
    # Multicast: the CTA of rank r copies boxes r, r + n, ... to the same offsets in every CTA
    # of the cluster (mask: all n), completing their bytes on each one's barrier.
    me = nvvm.sreg(b, "cluster.ctarank", "tma.rank")
    for r in range(min(n, len(boxes))):
        lw.if_then(b.icmp_unsigned("==", me, const_i32(r)), lambda r=r: issue(boxes[r::n], (1 << n) - 1), "tma_mc")


def _tma_store(lw: Lowerer, op: Operation) -> None:
    """docs/hopper.md: every thread fences its shared writes for the async proxy, the
    threads synchronize, thread 0 copies the tile box by box and commits the bulk group."""
    b = lw.b
    rank = _tma_rank(lw, op)
    src = lw.shared(op, op.src)
    nvvm.call(b, "fence.proxy.async.shared_cta")
    lw.sync()

    copy = "reduce.add" if op.attributes.get("reduce") == "add" else "s2g"

    def issue() -> None:
        for p, coords in _tma_boxes(lw, op, src):
            nvvm.call(b, f"cp.async.bulk.tensor.{copy}.tile.{rank}d", p, tensor_map(lw, op, lw.tmaps[op.map]),
                      *coords, 0, 0)
        nvvm.call(b, "cp.async.bulk.commit.group")

    lw.if_then(b.icmp_unsigned("==", lw.tid, const_i32(0)), issue, "tma_store")


def _tma_store_wait(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    lw.if_then(b.icmp_unsigned("==", lw.tid, const_i32(0)),
               lambda: nvvm.call(b, "cp.async.bulk.wait.group.read", op.pending), "tma_store_wait")
    if op.attributes.get("sync", True):
        lw.sync()


# --------------------------------------------------------------------------- wgmma

_WGMMA_TYPE = {"bf16": "bf16", "f16": "f16", "f8e4m3": "e4m3", "f8e5m2": "e5m2"}


def _select_by(b: ir.IRBuilder, key: ir.Value | None, choices: list[ir.Value]) -> ir.Value:
    """``choices[key]`` for a run-time key in [0, len(choices))."""
    out = choices[0]
    for g in range(1, len(choices)):
        out = b.select(b.icmp_unsigned("==", key, const_i32(g)), choices[g], out)
    return out


def _reg_a(op: Operation) -> bool:
    return isinstance(op.a.type, TileType) and op.a.type.space == "reg"


def _accumulating(loop: Operation) -> bool:
    """Whether ``loop`` carries two or more wgmma accumulators that its products add into
    (attention backward's dK and dV, 128 registers a thread)."""
    if loop.name != "tile.for":
        return False
    args = set(loop.regions[0].block.args[1:])
    return len({op.acc for op in loop.walk() if op.name == "hopper.wgmma" and op.acc in args}) >= 2


def _in_a_loop_of_accumulators(op: Operation) -> bool:
    """Whether ``op`` is in an :func:`_accumulating` loop.  There the descriptors of a shared
    tile that stays put (no ring stage) are computed at each product rather than hoisted out of
    the loop by LLVM: a 64-bit register pair per K step and tile, 48 registers for the
    backward's K, K^T and V at D = 128."""
    return any(_accumulating(loop) for loop in op.ancestors())


def _under_pressure(op: Operation) -> bool:
    """Whether ``op``'s kernel has an :func:`_accumulating` loop: there a store's thread-derived
    shared addresses are computed at the store, not shared with code before the loop and held
    through it."""
    kernel = next(a for a in op.ancestors() if a.name == "tile.kernel")
    return any(_accumulating(loop) for loop in kernel.walk())


def _wgmma(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    # A product from zeros (attention's S, every K/V block) issues its first K step with
    # scale-d = 0 (D = A B) on undefined registers, as CUTLASS's ScaleOut::Zero does: zeroing
    # them would take a mov each, after the wgmma fence, where ptxas must then fence again
    # before the next slice's wgmma (C7517).
    acc_layout = op.acc.type.layout
    fresh = constant_value(op.acc) == 0
    acc = [ir.Constant(F32, ir.Undefined)] * acc_layout.regs if fresh else lw.tile(op, op.acc)
    groups, slices, per = acc_layout.warpgroups, acc_layout.slices, acc_layout.slice_regs
    sb = replace(lw.shared(op, op.b), layout=op.operand_layout("b"))
    a_dt, b_dt = element_dtype(op.a.type), element_dtype(op.b.type)
    if a_dt.name not in _WGMMA_TYPE or b_dt.name not in _WGMMA_TYPE:
        raise TkcCodegenError(f"wgmma takes f16/bf16/fp8 operands, not {a_dt.name} x {b_dt.name}", op.loc)
    steps = sb.layout.k_steps
    # Warpgroup g owns rows [64 S g, 64 S (g + 1)) of S slices; slice m is one m64 wgmma.
    # Descriptors are compile-time constants relative to the dynamic shared base (1024-B
    # aligned by declaration), plus the run-time address >> 4 in the start field (PTX-FACTS
    # §2): the base's, moved by a ring stage's offset, which is a multiple of the tile's
    # alignment, so LBO, SBO and the swizzle stay those of the constant part.
    starts: dict[int, ir.Value] = {}
    local = _in_a_loop_of_accumulators(op)

    def start4(tile: SmemTile) -> ir.Value:
        key = id(tile.at)
        if key not in starts:
            # The start field holds 14 bits: a CTA of a cluster has its rank in the high bits
            # of its shared addresses, which would otherwise carry into the LBO field.
            addr4 = b.lshr(lw.smem_addr(tile.at if tile.at is not None else 0), const_i32(4))
            start = b.zext(b.and_(addr4, const_i32(0x3FFF)), I64)
            starts[key] = nvvm.opaque(b, start) if local and tile.at is None else start
        return starts[key]

    def desc(tile: SmemTile, k: int, mn: int) -> ir.Value:
        return b.add(ir.Constant(I64, tile.layout.descriptor(tile.offset, k, mn)), start4(tile))

    b_descs = [desc(sb, k, 0) for k in range(steps)]
    a_val = lw.get(op.a) if _reg_a(op) else replace(lw.shared(op, op.a), layout=op.operand_layout("a"))
    if isinstance(a_val, SmemTile):
        if a_val.layout.k_steps != steps:
            raise TkcCodegenError("A and B have different K", op.loc)
        a_ops: list = _a_descriptors(b, lw.tid, a_val, start4(a_val), groups, slices,
                                     uniform=local and a_val.at is None)
        trans_a = int(a_val.layout.major == "mn")
    elif a_dt.bits == 8:
        lay = op.a.type.layout
        if not isinstance(lay, WgmmaOperandA8) or lay.k_steps != steps:
            raise TkcCodegenError("an 8-bit register A operand is #wgmma_a8 with B's K", op.loc)
        a_ops = [[[pack_fp8x4(b, [a_val[i] for i in reg], a_dt) for reg in lay.step_values(k, m)]
                  for m in range(slices)] for k in range(steps)]
        trans_a = 0
    else:
        lay = op.a.type.layout
        if a_dt.bits != 16 or lay.k_steps != steps:
            raise TkcCodegenError("a register A operand is f16/bf16 with B's K", op.loc)
        regs = [pack_pair(b, a_val[2 * j], a_val[2 * j + 1], a_dt) for j in range(len(a_val) // 2)]
        a_ops = [[[regs[r] for r in lay.step_registers(k, m)] for m in range(slices)] for k in range(steps)]
        trans_a = 0
    trans_b = int(sb.layout.major == "mn")
    nvvm.call(b, "wgmma.fence.sync.aligned")
    # The slices' accumulators are independent: alternating them per K step lets each
    # wgmma run while the other slice's previous one finishes.
    parts = [list(acc[m * per:(m + 1) * per]) for m in range(slices)]
    for k in range(steps):
        for m in range(slices):
            parts[m] = nvvm.wgmma(b, parts[m], a_ops[k][m], b_descs[k], a_type=_WGMMA_TYPE[a_dt.name],
                                  b_type=_WGMMA_TYPE[b_dt.name], scale_d=not (fresh and k == 0),
                                  trans_a=trans_a, trans_b=trans_b)
    nvvm.call(b, "wgmma.commit_group.sync.aligned")
    lw.set(op.result, [v for part in parts for v in part])


def _a_descriptors(b: ir.IRBuilder, tid: ir.Value, a: SmemTile, base: ir.Value, groups: int,
                   slices: int, uniform: bool = True) -> list[list[ir.Value]]:
    """The descriptors of a shared A operand, ``[k step][slice]``, for the calling thread's
    warpgroup ``g = tid >> 7``, which reads rows ``64 (slices g + m)`` on; ``base`` is the
    operand's run-time start field (its shared address >> 4).

    ``uniform``: those rows start a fixed number of bytes after warpgroup 0's, so each
    descriptor is a constant plus one value a warpgroup (``base`` and ``g`` times that distance
    in the start field), and ``g`` is read as a warp-uniform value (:func:`_warp_uniform`):
    ptxas then keeps the descriptors in uniform registers, one uniform add each, as it does
    B's.  Else (and where the rows are not evenly apart) each descriptor is picked among the
    warpgroups' constants by ``g``: about ten vector instructions a wgmma, and a register pair
    for each constant LLVM hoists out of a loop.  ``_wgmma`` asks for uniform where a tile that
    is no ring stage is read in a loop of two or more accumulators (attention backward's K, V
    and K read MN-major for dQ, and its varlen form's: 865 -> 687 SASS instructions an
    iteration at D = 128, 250 -> 229 registers, 1.02-1.07x on an H200).  For a
    ring stage in a consumer role's loop or a persistent walk, ptxas kept the stage's address in
    vector registers and the uniform form then computed each descriptor there instead of
    reading a hoisted one (gemm_swiglu's K loop 120 -> 144 instructions, persistent attention's
    up to 4% more): not taken there until measured."""
    table = [[[a.layout.descriptor(a.offset, k, 64 * (slices * g + m)) for g in range(groups)]
              for m in range(slices)] for k in range(a.layout.k_steps)]
    apart = {row[g] - row[g - 1] for per_k in table for row in per_k for g in range(1, groups)}
    if uniform and groups > 1 and len(apart) == 1 and min(apart) > 0:
        g = _warp_uniform(b, b.lshr(tid, const_i32(7)))
        # The start field in 32 bits, then widened: computed as a 64-bit product (g zero-extended
        # times the distance, plus base and the constant), ptxas 13.0 put it on the uniform
        # datapath as UIMAD.WIDE and dropped the constant's high word (SBO and the swizzle) from
        # the descriptor: attention backward's gradients came out wrong on an H200.
        base = b.zext(b.add(b.trunc(base, I32), b.mul(g, const_i32(apart.pop()))), I64)
    elif groups > 1:
        g = b.lshr(tid, const_i32(7))
        return [[_select_by(b, g, [b.add(ir.Constant(I64, c), base) for c in row]) for row in per_k]
                for per_k in table]
    return [[b.add(ir.Constant(I64, row[0]), base) for row in per_k] for per_k in table]


def _warp_uniform(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """``v`` as lane 0 of the warp holds it (``shfl.sync.idx``): the same value where it is
    uniform in the warp already, but one ptxas knows to be, so what is computed from it can
    live in uniform registers."""
    return nvvm.call(b, "shfl.sync.idx.i32", -1, v, 0, 31)


def _wgmma_wait(lw: Lowerer, op: Operation) -> None:
    nvvm.call(lw.b, "wgmma.wait_group.sync.aligned", op.pending)
    lw.set(op.result, nvvm.pin(lw.b, lw.tile(op, op.x)))


def _wgmma_wait_group(lw: Lowerer, op: Operation) -> None:
    # No accumulator is made readable: the in-flight ones stay unread (no pin) until a
    # hopper.wgmma_wait; this only lets the warpgroup release the stages older wgmmas read.
    nvvm.call(lw.b, "wgmma.wait_group.sync.aligned", op.pending)


# --------------------------------------------------------------------------- between threads


def _combine(b: ir.IRBuilder, kind: str, dt: DType) -> Callable[[ir.Value, ir.Value], ir.Value]:
    """The reduction's binary op in register form; float sums stay in f32 until the end."""
    if dt.is_float:
        return {"sum": b.fadd,
                "max": lambda x, y: llvm_call(b, "llvm.maximum.f32", F32, x, y),
                "min": lambda x, y: llvm_call(b, "llvm.minimum.f32", F32, x, y)}[kind]
    return {"sum": b.add,
            "max": lambda x, y: b.select(b.icmp_signed(">", x, y), x, y),
            "min": lambda x, y: b.select(b.icmp_signed("<", x, y), x, y)}[kind]


def _shfl(b: ir.IRBuilder, v: ir.Value, mask: int) -> ir.Value:
    if v.type == nvvm.I64:  # as its two halves: shfl moves 32 bits
        halves = [b.trunc(v, nvvm.I32), b.trunc(b.lshr(v, ir.Constant(nvvm.I64, 32)), nvvm.I32)]
        lo, hi = (b.zext(_shfl(b, h, mask), nvvm.I64) for h in halves)
        return b.or_(lo, b.shl(hi, ir.Constant(nvvm.I64, 32)))
    name = "shfl.sync.bfly.f32" if v.type == F32 else "shfl.sync.bfly.i32"
    return nvvm.call(b, name, -1, v, mask, 31)


class _Part(NamedTuple):
    """One reduction of ``hopper.reduce`` or a part of ``hopper.reduce_group``, its values
    combined within each warp (``vals``: one a kept coordinate the thread holds)."""
    vals: list
    plan: Any
    comb: Callable[[ir.Value, ir.Value], ir.Value]
    dt: DType


def _within_warps(lw: Lowerer, op: Operation, x: Value, kind: str, axis: int) -> _Part:
    """A thread's values combined along ``axis``, then across lanes by shuffles."""
    from tkc.ir.layouts import reduce_plan

    b = lw.b
    vals_in = lw.tile(op, x)
    dt = element_dtype(x.type)
    if dt.is_bool:
        raise TkcCodegenError("reductions of i1 tiles are not lowered", op.loc)
    plan = reduce_plan(x.type.layout, axis)
    comb = _combine(b, kind, dt)
    vals = []
    for group in plan.groups:
        acc = vals_in[int(group[0])]
        for j in group[1:]:
            acc = comb(acc, vals_in[int(j)])
        vals.append(acc)
    for m in plan.shuffle_xor:
        vals = [comb(v, _shfl(b, v, int(m))) for v in vals]
    return _Part(vals, plan, comb, dt)


def _across_warps(lw: Lowerer, op: Operation, parts: list[_Part], scratches: list[Value], threads: int) -> None:
    """Every part's partials through its scratch tile in one round trip: every warp writes its
    partials, bar.sync, each thread combines its group's partials (the warps that differ from
    its own only in the plan's warp bits) in increasing warp order, so every warp ends with the
    same bits, and a second bar.sync lets the next reduction overwrite the scratch.  (A
    butterfly, a round trip a warp bit, costs two barriers a bit: six for eight warps, not
    two; and reductions a row needs at once, merged by merge-reductions, share the two.)
    Partials travel in the scratch's dtype (f32 for floats, as they are combined): rounding
    them to a 16-bit dtype here would round every warp's partial.  Rewrites ``parts``' vals."""
    b = lw.b
    warp = Sym(b, lw.tid) // 32  # inside a role: the warp within the role
    warps = -(-threads // 32)
    placed = []
    for part, s in zip(parts, scratches):
        scratch = lw.shared(op, s)
        lay = scratch.layout
        # The scratch is [warp][kept coordinate]: lanes of one warp may hold different kept
        # coordinates in the same slot, and lanes holding the same one hold the same value.
        kept = [c[0] for c in lw.coords(op, part.plan.result)] if part.plan.result is not None else [0]
        if lay.rows < warps or any(isinstance(k, int) and k >= lay.cols for k in kept):
            raise TkcCodegenError(f"scratch {lay} is smaller than {warps} warps x the kept extent", op.loc)
        for v, k in zip(part.vals, kept):
            b.store(to_mem(b, v, lay.dtype), _smem_element_ptr(lw, scratch, smem_offset(lay, warp, k)))
        placed.append((scratch, kept))
    lw.sync()
    for part, (scratch, kept) in zip(parts, placed):
        lay = scratch.layout
        base = warp & part.plan.group_base
        out: list = [None] * len(part.vals)
        for other in part.plan.group_offsets:
            for i, k in enumerate(kept):
                p = _smem_element_ptr(lw, scratch, smem_offset(lay, base | other, k))
                g = from_mem(b, b.load(p, typ=mem_type(lay.dtype)), lay.dtype)
                out[i] = g if out[i] is None else part.comb(out[i], g)
        part.vals[:] = out
    lw.sync()


def _reduced(lw: Lowerer, part: _Part, result: Value) -> None:
    vals = [round_to(lw.b, v, part.dt) for v in part.vals] if part.dt.is_float else part.vals
    lw.set(result, vals if isinstance(result.type, TileType) else vals[0])


def _reduce(lw: Lowerer, op: Operation) -> None:
    part = _within_warps(lw, op, op.x, op.kind, op.axis)
    if part.plan.warp_xor:
        _across_warps(lw, op, [part], op.scratch, op.x.type.layout.threads)
    _reduced(lw, part, op.result)


def _reduce_group(lw: Lowerer, op: Operation) -> None:
    """``hopper.reduce_group``: each part within its warps, then all across warps at once."""
    parts = [_within_warps(lw, op, x, kind, axis) for x, _, _, kind, axis, _, _ in op.parts()]
    _across_warps(lw, op, parts, [s for _, s, *_ in op.parts()],
                  max(x.type.layout.threads for x, *_ in op.parts()))
    for part, (_, _, r, *_) in zip(parts, op.parts()):
        _reduced(lw, part, r)


def _scan(lw: Lowerer, op: Operation) -> None:
    """``scan_plan`` executed literally (``ScanPlan``): per value a prefix and its block's
    total, float scans in f32 until the end."""
    from tkc.ir.layouts import scan_plan

    b = lw.b
    dt = element_dtype(op.x.type)
    if dt.is_bool:
        raise TkcCodegenError("scans of i1 tiles are not lowered", op.loc)
    plan = scan_plan(op.x.type.layout, op.axis)
    comb = {"sum": b.fadd, "prod": b.fmul} if dt.is_float else {"sum": b.add, "prod": b.mul}
    comb = comb[op.kind]
    pre = list(lw.tile(op, op.x))
    tot = list(pre)
    for kind, how in plan.steps:
        if kind == "regs":
            for chain in how:
                run = tot[chain[0]]
                for i in chain[1:]:
                    pre[i] = comb(run, pre[i])
                    run = comb(run, tot[i])
                for i in chain:
                    tot[i] = run
            continue
        if kind == "lane":
            other = [_shfl(b, v, int(how)) for v in tot]
        else:
            # A round trip through shared memory: each thread writes its totals in its row,
            # bar.sync, reads the partner's row, bar.sync.
            scratch = lw.shared(op, op.scratch[0])
            lay = scratch.layout
            t = Sym(b, lw.tid)
            # The totals travel in the scratch's dtype, f32 for floats: the running values
            # are f32 registers until the end, and must not be rounded to a 16-bit dtype here.
            for i, v in enumerate(tot):
                p = _smem_element_ptr(lw, scratch, smem_offset(lay, t, i))
                b.store(to_mem(b, v, lay.dtype), p)
            lw.sync()
            other = []
            for i in range(len(tot)):
                p = _smem_element_ptr(lw, scratch, smem_offset(lay, t ^ int(how), i))
                other.append(from_mem(b, b.load(p, typ=mem_type(lay.dtype)), lay.dtype))
            lw.sync()
        upper = b.icmp_unsigned("!=", b.and_(lw.tid, const_i32(int(how))), const_i32(0))
        pre = [b.select(upper, comb(o, v), v) for o, v in zip(other, pre)]
        tot = [comb(v, o) for v, o in zip(tot, other)]
    if dt.is_float:
        pre = [round_to(b, v, dt) for v in pre]
    lw.set(op.result, pre)


def _cluster_reduce(lw: Lowerer, op: Operation) -> None:
    """docs/hopper.md: thread 0 arms this exchange's barrier for every rank's elements; the
    first holder of each element stores it into slot rank * elements + e of this exchange's
    buffer in every CTA (``mapa`` + ``st.async``, completing 4 bytes on that CTA's barrier);
    every thread waits for the barrier's parity, then combines its elements' slots over the
    ranks in rank order."""
    b = lw.b
    vals = lw.tile(op, op.x)
    scratch = lw.shared(op, op.scratch)
    lay = scratch.layout
    n = lw.kernel.attributes["cluster"]
    layout = op.x.type.layout
    elements = op.elements()
    rank = Sym(b, nvvm.sreg(b, "cluster.ctarank", "cr.rank"))
    phase = Sym(b, lw.get(op.phase))
    bars = lw.env[op.barrier]
    if op.copies == 1:
        first_row, bar = 0, lw.ptr(bars)
    else:  # buffer and barrier phase % 2: a ring of two
        which = phase % 2
        first_row = which * op.buffer_rows()
        bar = lw.ptr(bars.first, as_value(which * bars.stride))
    parity = as_value(phase // 2)
    flat = []  # each value's element, row-major
    for coords in lw.coords(op, layout):
        e: Sym | int = 0
        for c, extent in zip(coords, op.x.type.shape):
            e = e * extent + c
        flat.append(e)

    def slot(r: Sym | int, e: Sym | int) -> Sym | int:
        f = r * elements + e
        return smem_offset(lay, first_row + f // SLOT_ROW, f % SLOT_ROW)

    bar_addr = b.ptrtoint(bar, nvvm.I32)
    arm = ir.FunctionType(ir.VoidType(), [nvvm.I32])
    lw.if_then(b.icmp_unsigned("==", lw.tid, const_i32(0)),
               lambda: b.asm(arm, f"mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], {n * elements * 4};",
                             "r,~{memory}", [bar_addr], side_effect=True), "cluster.arm")
    put = ir.FunctionType(ir.VoidType(), [nvvm.I32, nvvm.I32, nvvm.I32, F32])

    def send(i: int) -> None:
        addr = b.ptrtoint(_smem_element_ptr(lw, scratch, slot(rank, flat[i])), nvvm.I32)
        for r in range(n):
            b.asm(put, "{\n.reg .b32 a, m;\nmapa.shared::cluster.u32 a, $0, $1;\nmapa.shared::cluster.u32 m, $2, $1;\n"
                       "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [a], $3, [m];\n}",
                  "r,r,r,f,~{memory}", [addr, const_i32(r), bar_addr, vals[i]], side_effect=True)

    holders: dict[tuple[int, int], list[int]] = {}
    for i, (mask, bits) in enumerate(first_holders(layout)):
        holders.setdefault((mask, bits), []).append(i)
    for (mask, bits), regs in holders.items():
        def send_all(regs: list[int] = regs) -> None:
            for i in regs:
                send(i)

        if mask == 0:  # every thread holds the first copy of these values
            send_all()
        else:
            mine = b.icmp_unsigned("==", b.and_(lw.tid, const_i32(mask)), const_i32(bits))
            lw.if_then(mine, send_all, "cluster.send")
    _wait_parity(lw, op, bar, parity)
    comb = _combine(b, op.kind, dtypes.f32)
    out = []
    for e in flat:
        acc = None
        for r in range(n):
            x = from_mem(b, b.load(_smem_element_ptr(lw, scratch, slot(r, e)), typ=mem_type(lay.dtype)), lay.dtype)
            acc = x if acc is None else comb(acc, x)
        out.append(acc)
    lw.set(op.result, out)


def _convert_layout(lw: Lowerer, op: Operation) -> None:
    src, dst = op.x.type.layout, op.result.type.layout
    if not op.scratch:
        m = register_map(src, dst)
        if m is None:
            raise TkcCodegenError(f"converting {src} to {dst} moves values between threads: "
                                  f"it needs a scratch tile", op.loc)
        x = lw.tile(op, op.x, deferred=True)
        lw.set(op.result, Picked(x, list(m)) if isinstance(x, Deferred) else [x[j] for j in m])
        return
    x = lw.tile(op, op.x)
    scratch = lw.shared(op, op.scratch[0])
    st = op.scratch[0].type
    dt = element_dtype(op.x.type)

    def coords(layout: object) -> list:
        return _held_coords(lw, op, layout, op.x.type.shape, scratch, st.shape)

    _smem_store_values(lw, op, scratch, st, x, coords(src), dt)
    lw.sync()
    lw.set(op.result, _smem_load_values(lw, scratch, st, coords(dst), dt))
    lw.sync()


# --------------------------------------------------------------------------- roles


def _role(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    first, warpgroups, regs = op.attributes["first"], op.attributes["warpgroups"], op.attributes["regs"]
    # tid - 128 * first < 128 * warpgroups (unsigned): the role's warpgroups, and the rebased
    # index the body sees.  The test is uniform per warpgroup, as setmaxnreg needs.
    wg = lw.target.warpgroup
    tid = b.sub(lw.tid, const_i32(wg * first), name=f"tid.{_label(op)}") if first else lw.tid
    inside = b.icmp_unsigned("<", tid, const_i32(wg * warpgroups))
    entry = entry_registers(lw.kernel.attributes["threads"], lw.options.programs_per_sm, lw.target)

    def run() -> None:
        with lw.in_role(op, tid):
            lw.block(op.body)

    def body() -> None:
        if regs and regs != entry:
            # The budget ptxas gives the role's code; .maxntid + .minnctapersm on the kernel
            # tell ptxas the entry count, without which it drops setmaxnreg (C7508).
            nvvm.setmaxnreg(b, regs, inc=regs > entry)
        warps = op.attributes.get("warps")
        if warps is not None and warps < 4 * warpgroups:
            # After setmaxnreg, which every warp of a warpgroup executes; uniform per warp.
            lw.if_then(b.icmp_unsigned("<", tid, const_i32(32 * warps)), run, f"role.{_label(op)}.warps")
        else:
            run()

    lw.if_then(inside, body, f"role.{_label(op)}")


def _label(op: Operation) -> str:
    return "".join(c if c.isalnum() else "_" for c in str(op.attributes["name"]))


def _fence_proxy_async(lw: Lowerer, op: Operation) -> None:
    nvvm.call(lw.b, "fence.proxy.async.shared_cta")


HANDLERS: dict[str, Handler] = {
    "hopper.smem_alloc": _smem_alloc,
    "hopper.mbarrier_alloc": _mbarrier_alloc,
    "hopper.stage": _stage,
    "hopper.mbarrier_init": _mbarrier_init,
    "hopper.mbarrier_arrive": _mbarrier_arrive,
    "hopper.role": _role,
    "hopper.fence_mbarrier_init": lambda lw, op: nvvm.call(lw.b, "fence.mbarrier_init.release.cluster"),
    "hopper.barrier": _barrier,
    "hopper.sync": _sync,
    "hopper.cluster_barrier": _cluster_barrier,
    "hopper.cluster_reduce": _cluster_reduce,
    "hopper.turn": _turn,
    "hopper.expect_tx": _expect_tx,
    "hopper.tma_load": _tma_load,
    "hopper.smem_load": _smem_load,
    "hopper.tma_store": _tma_store,
    "hopper.tma_store_wait": _tma_store_wait,
    "hopper.mbarrier_wait": _mbarrier_wait,
    "hopper.smem_store": _smem_store,
    "hopper.fence_proxy_async": _fence_proxy_async,
    "hopper.wgmma": _wgmma,
    "hopper.smem_copy": _smem_copy,
    "hopper.wgmma_wait": _wgmma_wait,
    "hopper.wgmma_wait_group": _wgmma_wait_group,
    **GLOBAL,
    "hopper.reduce": _reduce,
    "hopper.reduce_group": _reduce_group,
    "hopper.scan": _scan,
    "hopper.convert_layout": _convert_layout,
}

