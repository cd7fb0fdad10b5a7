"""The ``select-layouts`` pass: where every tile lives, and in which layout.

Input: target-independent tile IR.  Output: the same ops, with every tile type carrying a
space and a layout (docs/hopper.md section 2), ``hopper.convert_layout`` wherever a value
is needed in a layout other than the one it was made in, and the kernel's ``threads``.
The output is still tile IR: the interpreter runs it unchanged (a conversion moves no
element), which is how this pass is tested differentially.

Decisions, in order:

1. **Warpgroups.**  Every ``@`` runs as wgmma, 64 rows per instruction, so a kernel whose
   products have M rows runs ``M / 64`` warpgroups (all products of a kernel must agree), or
   fewer under the pin ``consumers``, ``M / (64 S)`` for S = 2 to 4: each warpgroup then
   holds S 64-row slices and issues S wgmmas a K step into independent accumulators (one
   warpgroup's wgmmas into one accumulator wait for each other, so one warpgroup alone keeps
   the tensor cores busier with more slices: on an H100 a 192 x 128 GEMM tile on one
   warpgroup ran at 0.91-1.07x the 128 x 256 tile on two, 128 x 128 on one at 0.87-1.00x).  A
   kernel without products runs one warpgroup, or ``warps / 4`` under the ``warps`` pin.
2. **Shared tiles.**  A ``@`` operand loaded from a tensor is copied by TMA into shared
   memory and read by wgmma from there: its load gets ``space = smem`` and a
   ``SharedLayout`` whose contiguous axis is the tensor's innermost one, swizzled as wide as
   that axis allows (``choose_swizzle``), ``k``- or ``mn``-major by what wgmma sees
   (``kt.T`` as B is K-major; ``b`` as B is MN-major).  A ``.T`` of such a load becomes a
   transposed view of the same bytes.  A load that two products read with opposite majors is
   one shared tile, placed for the first; the others read it with their own major
   (``a_major``/``b_major`` on the ``tile.mma``).  A load that something else also reads gets
   a second, register copy for those readers.  The A operand may instead be computed in registers
   (``p.to(bf16) @ v``): it is converted to ``#wgmma_a``, which costs nothing when it comes
   from an accumulator.
3. **Register layouts** by propagation to a fixpoint, first proposal wins: ``@`` results
   are ``#wgmma_acc``; elementwise ops pass their operands' layout on (and ask their
   operands for their own); reductions give ``#slice`` of their operand, ``x.T`` of a register
   tile ``#transpose`` of its operand's (the same registers), ``expand_dims`` the
   ``keep`` form of a slice, ``broadcast`` the slice's parent, and each of these asks its
   operand for what it needs; loops and branches carry layouts through their block arguments
   and results; ``tile.take`` gives the slice of its operand's layout along its axis and
   ``tile.stack`` the layout its operands are that slice of (or ``#stack``).  Next, a range
   that stepped slices read or write as one (merge-steps) gets the ``#blocked`` layout of
   its flat shape, so each thread holds whole groups of the step.  What is still free
   afterwards (a softmax's loads) gets the ``#blocked`` layout of ``choose_blocked``, 2-D
   values first, then propagation runs again.
4. **Conversions** where an operand's layout is not the one its user needs.

Must not: move memory or create hopper memory ops (``lower-to-hopper`` does), or place
shared memory (``allocate-smem``).
"""

from __future__ import annotations

import math

from tkc import dtypes
from tkc.errors import TkcUnsupportedError
from tkc.ir.builder import Builder
from tkc.ir.core import Module, Operation, Value, replace_all_uses, uses
from tkc.ir.dialects import hopper, tile
from tkc.ir.dialects.blackwell import HALF_ROWS
from tkc.ir.layouts import (
    MAX_SLICES,
    ScaleLayout,
    SharedLayout,
    Slice,
    TmemAccumulator,
    WgmmaAccumulator,
    WgmmaOperandA,
    WgmmaOperandA8,
    choose_blocked,
    choose_swizzle,
    core_matrix_misfit,
    one_everywhere,
    read_as,
    register_map,
    reshape_layout,
    scan_plan,
    stack_layout,
    take_layout,
    take_registers,
    transpose_copy_blocks,
    transpose_layout,
)
from tkc.ir.types import TileType
from tkc.passes.divisors import column_aligned
from tkc.pins import Options, check_kernel_pins
from tkc.target import Target

#: Ops besides the elementwise ones whose result has their operand's layout.
_LAYOUT_KEEPING = ("tile.cluster_reduce", "tile.scan")

# Ops whose values are computed again, rather than converted, when a user needs another layout.
_REMATERIALIZED = ("tile.constant", "tile.splat", "tile.arange")

#: Dtypes whose takes may be masked sums (``_take_by_sum``): a sum of one element and zeros is
#: that element exactly in them, and every level reduces them.
_SUM_PICKED = (dtypes.f32, dtypes.f16, dtypes.bf16, dtypes.i32)
#: Up to this many picks of one 2-D tile along one axis are masked sums; more share one move of
#: the tile (``_picks_by_sum``).
_MAX_SUM_PICKS = 4


#: The most values a thread's register tile may hold, in units of the target's registers a
#: thread (the largest the harness uses is one: 256 values, a 64k softmax row on 8 warps).
REGISTER_TILE_LIMIT = 4


def select_layouts(module: Module, options: Options, target: Target) -> None:
    for kernel in module.ops:
        if kernel.name == "tile.kernel":
            _Selector(kernel, options, target).run()


def _reshaped(layout: object, shape: tuple[int, ...]) -> object | None:
    """``layout`` as a tile of ``shape`` in the same registers, or None when it cannot be."""
    try:
        return reshape_layout(layout, shape)
    except (ValueError, AttributeError, TypeError):
        return None


def _redirect(user: Operation, old: Value, new: Value, slot: int | None) -> None:
    """``user`` reads ``new`` where it read ``old``: in its operand ``slot`` only, when given."""
    if slot is not None:
        user.operands[slot] = new
    else:
        user.operands = [new if x is old else x for x in user.operands]


def _def(v: Value) -> Operation | None:
    return getattr(v, "owner", None)


def tma_loadable(op: Operation, target: Target, written: frozenset = frozenset()) -> str | None:
    """Why ``op`` (a ``tile.load``) cannot be a TMA copy into a shared tile, or None if it can:
    its tile must be the tensor's last axis and one other (the others squeezed: ``x[b, h, rows, :]``,
    ``k[rows, h, :]``), of a tensor of at most 5 axes, 8- or 16-bit, rows a multiple of 8, rows
    at least 16 bytes wide, starting at a column known to be a multiple of 16 bytes
    (``tkc.passes.divisors``), and out-of-range elements must read as 0 (TMA's fill); and not of a
    tensor the kernel also writes (``written``: ``tile.read_and_written``), whose reads must
    follow its writes in program order."""
    t, tile = op.tensor.type, op.result.type
    if op.tensor in written:
        return "the kernel also writes this tensor"
    if t.rank < 2 or t.rank - 1 in (op.squeeze or []) or tile.rank != 2:
        return "its tile is not along the tensor's last axis and one other"
    if t.rank > 5:
        return f"TMA copies tensors of at most 5 axes, this one has {t.rank}"
    if t.dtype.bits not in target.mma_operand_bits:
        return f"@ takes 16- and 8-bit operands, not {t.dtype.name} (cast the tile first, e.g. .to(bf16))"
    misfit = core_matrix_misfit(*tile.shape, t.dtype)
    if misfit:
        return misfit
    if op.other not in (None, 0, 0.0, False):
        return f"TMA fills out-of-range elements with 0, not {op.other}"
    if op.steps:
        return "a slice with a step is read thread by thread"
    if not column_aligned(op.offsets[-1], t.dtype.bits // 8):
        return "its first column is not known to be a multiple of 16 bytes, where TMA copies start"
    return None


def _summed_by_loop(mma: Operation) -> bool:
    """Whether ``mma`` is ``acc += a @ b`` on an accumulator its loop carries from zero and only
    yields (a K loop's, or attention backward's dV and dK)."""
    loop = mma.parent.parent_op if mma.parent else None
    if loop is None or loop.name != "tile.for":
        return False
    body = loop.regions[0].block
    if mma.acc not in body.args[1:]:
        return False
    j = body.args.index(mma.acc) - 1
    init = _def(loop.operands[3 + j])
    kernel = loop
    while kernel.name != "tile.kernel":
        kernel = kernel.parent.parent_op
    users = uses(kernel)
    return (init is not None and init.name == "tile.constant" and init.attributes.get("value") == 0
            and users.get(mma.acc, []) == [mma] and body.terminator.operands[j] is mma.result
            and users.get(mma.result, []) == [body.terminator])


class _Selector:
    def __init__(self, kernel: Operation, options: Options, target: Target):
        self.kernel = kernel
        self.options, self.target = options, target
        self.warpgroups, self.slices = self._warpgroups()
        # tcgen05 products of 64 rows: accumulators in wgmma's register layout (tcgen05.ld.16x256b).
        self.half_rows = target.mma == "tcgen05" and any(
            op.name == "tile.mma" and op.acc.type.shape[0] == HALF_ROWS for op in kernel.walk())
        self.threads = target.warpgroup * self.warpgroups
        self.lay: dict[Value, object] = {}
        self.smem: set[Value] = set()
        self._take_conversions: dict[tuple, Value] = {}
        self._picks: dict[tuple[Value, int], int] | None = None  # takes of a 2-D tile on an axis
        self.written = tile.read_and_written(kernel)  # tensors whose loads TMA must not copy

    def _unsupported(self, op: Operation, message: str) -> TkcUnsupportedError:
        return TkcUnsupportedError(f"{self.target.name}: {message}", op.loc)

    # ------------------------------------------------------------ 1. warpgroups
    def _warpgroups(self) -> tuple[int, int]:
        """Warpgroups, and the 64-row slices of a product each holds."""
        rows = self.target.mma_rows
        check_kernel_pins(self.kernel)  # tile IR read from a file has not met the frontend's check
        ms = [(op, op.acc.type.shape[0]) for op in self.kernel.walk() if op.name == "tile.mma"]
        if self.target.mma == "tcgen05" and ms:
            return self._tcgen05_warpgroups(ms)
        for op, m in ms:
            if m % rows:
                raise self._unsupported(op, f"wgmma computes {rows} rows per warpgroup; this product has {m} rows")
            if op.acc.type.shape[1] not in hopper.WGMMA_N:
                raise self._unsupported(op, f"wgmma computes 8 to 256 columns in steps of 8; this product has "
                                       f"{op.acc.type.shape[1]} columns")
            if m != ms[0][1]:
                raise self._unsupported(op, f"all products of a kernel must have one row count ({ms[0][1]}), "
                                       f"this one has {m}")
        # (the pin's value and its products rule: tkc.pins, checked with the kernel's constants)
        warps = self.options.warps
        most = self.target.max_threads // self.target.warp_size
        if warps is not None and warps > most:
            raise self._unsupported(self.kernel, f"warps = {warps}: a program has at most {most} warps "
                                                 f"({self.target.max_threads} threads)")
        if not ms:
            return (warps if warps is not None else 4) // 4, 1
        m, consumers = ms[0][1], self.options.consumers
        if consumers is None:
            return m // rows, 1
        for slices in range(1, MAX_SLICES + 1):
            if m == rows * slices * consumers:
                return consumers, slices
        choices = " or ".join(str(m // (rows * s)) for s in range(1, MAX_SLICES + 1) if m % (rows * s) == 0)
        raise self._unsupported(ms[0][0], f"consumers = {consumers}: this kernel's products have {m} rows, {rows} "
                                          f"to {rows * MAX_SLICES} a warpgroup in steps of {rows}, so it runs "
                                          f"{choices} (change the tile rows instead)")

    def _tcgen05_warpgroups(self, ms: list) -> tuple[int, int]:
        """A tcgen05 product is one ``mma_rows`` x N accumulator in tensor memory; the epilogue
        warpgroups that read it share its columns (``#tmem_acc``), at most 128 a thread: the
        pin ``consumers``, else the products' N summed / 128 rounded up, and two for several
        products."""
        rows = self.target.mma_rows
        for op, m in ms:
            n = op.acc.type.shape[1]
            if m not in (HALF_ROWS, rows):
                raise self._unsupported(op, f"tcgen05.mma here computes {rows} or {HALF_ROWS} rows (cta_group::1); "
                                           f"this product has {m} rows")
            if m != ms[0][1]:
                raise self._unsupported(op, f"all products of a kernel must have one row count ({ms[0][1]}), "
                                            f"this one has {m}")
            step = 8 if m == HALF_ROWS else 16
            if n % step or not step <= n <= 256:
                raise self._unsupported(op, f"tcgen05.mma of {m} rows computes {step} to 256 columns in steps of "
                                            f"{step}; this product has {n} columns")
        if ms[0][1] == HALF_ROWS:
            # M = 64 (the PTX ISA's data-path layout F): warp w's 16 rows lie in lanes 32 w to
            # 32 w + 15, and tcgen05.ld.16x256b gives them to its threads as wgmma's
            # accumulator fragment: one warpgroup holds the product in #wgmma_acc.
            if self.options.consumers not in (None, 1):
                raise self._unsupported(ms[0][0], f"consumers = {self.options.consumers}: products of "
                                                  f"{HALF_ROWS} rows are read by one warpgroup")
            return 1, 1
        # Products of several widths (attention's S and O) share the warpgroups, each reading
        # its share of every accumulator's columns: at most 128 columns a thread in all.
        # Several products' accumulators meet in one epilogue (RoPE's halves with cos and sin,
        # SwiGLU's gate and up), each beside tiles of its own: two warpgroups at least, or a
        # thread holds every row's columns of all of them at once.
        # Beside products read at once in a loop, a sum the loop carries from zero (attention
        # backward's dV and dK) stays in tensor memory through the loop (lower-to-blackwell) and
        # is read behind it on its own: it needs no registers next to the others.
        widths = [op.acc.type.shape[1] for op, _ in ms]
        summed = [_summed_by_loop(op) for op, _ in ms]
        need = sum(widths)
        if any(summed) and not all(summed):
            need = max(sum(n for n, kept in zip(widths, summed) if not kept),
                       max(n for n, kept in zip(widths, summed) if kept))
        consumers = self.options.consumers
        if consumers is None:
            # Each warpgroup reads whole 8-column groups of every accumulator (S 64 wide beside O
            # 256: 4).  From the count the columns ask for up to 4, else fewer (more columns a
            # thread: a 256- and a 16-wide sum take 2).
            least = max(-(-need // 128), 2 if len(ms) > 1 else 1)
            fits = [c for c in (*range(least, 5), *range(least - 1, 0, -1))
                    if not any(op.acc.type.shape[1] % (8 * c) for op, _ in ms)]
            if not fits:
                shown = ", ".join(str(op.acc.type.shape[1]) for op, _ in ms)
                raise self._unsupported(ms[0][0], f"the products' widths ({shown}) split over no count of epilogue "
                                                  f"warpgroups (1 to 4) reading 8 columns each of every one: make "
                                                  f"each width a multiple of 32")
            consumers = fits[0]
        for op, _ in ms:
            n = op.acc.type.shape[1]
            if n % (8 * consumers):
                raise self._unsupported(op, f"consumers = {consumers}: each epilogue warpgroup reads a multiple of "
                                            f"8 of the {n} accumulator columns")
        return consumers, 1

    def _accumulator(self, n: int) -> object:
        """The layout of an N-wide product's accumulator on this target."""
        if self.target.mma == "tcgen05" and not self.half_rows:
            return TmemAccumulator(n, self.warpgroups)
        return WgmmaAccumulator(n, self.warpgroups, self.slices)

    def run(self) -> None:
        self._place_mma_operands()
        self._propagate()
        self._convert()
        for v, layout in self.lay.items():
            self._check_fits(v, layout)
            v.type = TileType(v.type.shape, v.type.dtype, "reg", layout)
        self.kernel.attributes["threads"] = self.threads
        self.kernel.attributes["target"] = self.target.name  # the layouts are this target's

    def _check_fits(self, v: Value, layout: object) -> None:
        """A register tile of more values a thread than ``REGISTER_TILE_LIMIT`` times the
        target's registers could only run from local memory, and generating its code would take
        minutes: it is refused here, where the tile is written."""
        regs = getattr(layout, "regs", 0)
        limit = REGISTER_TILE_LIMIT * self.target.max_registers
        words = regs * max(1, v.type.dtype.bits // 32)  # an i64 value takes two registers
        if words > limit:
            owner = _def(v)
            loc = owner.loc if owner is not None else self.kernel.loc
            held = f"{regs} values" if words == regs else f"{regs} values ({words} registers)"
            raise TkcUnsupportedError(f"this {'x'.join(map(str, v.type.shape))} {v.type.dtype.name} tile would hold "
                                      f"{held} in each of the program's {self.threads} threads' registers (at "
                                      f"most about {limit}): use smaller tiles, e.g. loop over blocks of it", loc)

    # ----------------------------------------------------------- 2. shared tiles
    def _place_mma_operands(self) -> None:
        placed: dict[Value, SharedLayout] = {}
        staged_copies: dict[tuple[Value, SharedLayout], Value] = {}
        tma = self.options.tma and self.target.tma
        for mma in [op for op in self.kernel.walk() if op.name == "tile.mma"]:
            b_copied = self._b_transposed_in_smem(mma, tma)
            for which in ("a", "b"):
                v = getattr(mma, which)
                view = _def(v)
                src = view.x if view is not None and view.name == "tile.transpose" else v
                load = _def(src)
                transposed = src is not v
                loaded = load is not None and load.name == "tile.load"
                why = ((tma_loadable(load, self.target, self.written)
                        or ("" if tma else "the kernel pins tma = False"))
                       if loaded else "")
                staged = not loaded or bool(why)
                if transposed and load is not None and load.name == "hopper.to_smem":
                    continue  # a view an earlier product staged (it read the same tile): done
                in_regs = v.type.dtype.bits == 16 or v.type.dtype.bits == 8 and b_copied
                if staged and which == "a" and not transposed and in_regs and not loaded \
                        and self.target.mma != "tcgen05":
                    continue  # computed in registers: converted to #wgmma_a(8) later, no shared memory
                # (tcgen05.mma reads A from shared or tensor memory: a register A is staged below.)
                if staged and src.type.dtype.bits not in self.target.mma_operand_bits:
                    raise self._unsupported(mma, f"the {which.upper()} operand of @ is {src.type.dtype.name}: "
                                            + (why or "@ takes 16- and 8-bit operands (cast the tile first, e.g. "
                                                      ".to(bf16))"))
                # A is MxK, B is KxN; the stored tile's contiguous axis decides the major.
                k_contiguous = (which == "a") != transposed
                major = "k" if k_contiguous else "mn"
                rows, cols = src.type.shape
                # tcgen05.mma reads 8-bit operands MN-major too (kind::f8f6f4 transposes A and B:
                # attention's V as TMA copies it); wgmma reads them K-major only.
                if major == "mn" and src.type.dtype.bits != 16 and not (
                        self.target.mma == "tcgen05" and src.type.dtype.bits == 8):
                    if which == "b" and b_copied:
                        self._transpose_b(mma, load, kperm=mma.a not in self.smem)
                        continue
                    if which == "a":
                        hint = ""
                    else:
                        hint = (f" (a B tile that TMA copies as it lies is transposed in shared memory; this one "
                                f"is {'not: ' + why if why else 'computed'})")
                    raise self._unsupported(mma, f"{src.type.dtype.name} operands must be K-major: store "
                                            f"{'A as MxK' if which == 'a' else 'B transposed (N x K) and use .T'}"
                                            + hint)
                try:
                    layout = SharedLayout(rows, cols, src.type.dtype, major, choose_swizzle(cols, src.type.dtype))
                    layout.tma_box()
                except ValueError as e:
                    raise self._unsupported(load or mma, f"cannot place this tile in shared memory for wgmma: {e}") \
                        from None
                if staged:
                    # Every thread stores its part of the register tile (hopper.to_smem, expanded by
                    # lower-to-hopper), and wgmma reads the shared copy: one copy for every
                    # product reading it in this layout (FFT conv's B operands, two products each).
                    user = view if transposed else mma
                    # only this operand: ``p @ p`` reads one register tile as A and as B, each
                    # staged in its own layout
                    slot = None if transposed else ("a", "b").index(which)
                    copy = staged_copies.get((src, layout))
                    if copy is None:
                        copy = staged_copies[(src, layout)] = self._stage(src, layout, user, slot)
                    else:
                        _redirect(user, src, copy, slot)
                    src = copy
                    if transposed:
                        view.result.type = TileType(view.result.type.shape, src.type.dtype, "smem", layout)
                        self.smem.add(view.result)
                    continue
                if src in placed and placed[src] != layout and read_as(placed[src], major) == layout:
                    # The same bytes, read with the other major: one copy in shared memory.
                    mma.attributes[f"{which}_major"] = major
                    layout = placed[src]
                elif src in placed and placed[src] != layout:
                    src = self._clone_load(load, only_user=view if transposed else mma)
                placed[src] = layout
                src.type = TileType(src.type.shape, src.type.dtype, "smem", layout)
                self.smem.add(src)
                if transposed:
                    if view.x is not src:
                        view.operands[0] = src
                    view.result.type = TileType(view.result.type.shape, src.type.dtype, "smem", layout)
                    self.smem.add(view.result)
            # A block-scaled product's scales: the threads store them in the blocks tcgen05.cp
            # copies into tensor memory (A's [M, K/32] rows are M, B's [K/32, N] columns are N).
            # Right before the product where they are loaded for it (one meeting for both).
            for slot, (v, major) in enumerate(zip(mma.scales, ("k", "mn")), start=3):
                layout = ScaleLayout(*v.type.shape, v.type.dtype, major=major)
                d = _def(v)
                if d is not None and d.parent is mma.parent:
                    staged = Builder.before(mma).value(hopper.ToSmemOp, [v], TileType(v.type.shape, v.type.dtype,
                                                                                      "smem", layout))
                    _redirect(mma, v, staged, slot)
                    self.smem.add(staged)
                else:
                    self._stage(v, layout, mma, slot)
        # Readers of a shared tile other than wgmma get their own register copy.
        users = uses(self.kernel)
        for v in list(self.smem):
            others = [u for u in users.get(v, []) if u.name not in ("tile.mma", "hopper.transpose_smem")
                      and not (u.name == "tile.transpose" and u.result in self.smem)]
            if others and _def(v).name == "tile.load":
                copy = self._clone_load(_def(v), None)
                for u in others:
                    u.operands = [copy if x is v else x for x in u.operands]
            elif others:
                raise self._unsupported(others[0], "a transposed shared tile can only feed @")

    def _b_transposed_in_smem(self, mma: Operation, tma: bool) -> bool:
        """Whether ``mma``'s B is an 8-bit [K, N] tile (MN-major) that TMA copies as it lies and
        the consumers transpose in shared memory (:meth:`_transpose_b`)."""
        load = _def(mma.b)
        return (self.target.mma != "tcgen05" and tma and mma.b.type.dtype.bits == 8 and load is not None
                and load.name == "tile.load" and not tma_loadable(load, self.target, self.written))

    def _transpose_b(self, mma: Operation, load: Operation, kperm: bool) -> None:
        """An 8-bit B operand [K, N] copied by TMA as it lies (N contiguous, MN-major) and
        rewritten in shared memory as [N, K], K contiguous (``hopper.transpose_smem``): wgmma
        reads 8-bit operands K-major only.  Attention's V needs no transposed copy in memory.
        With A in registers (``kperm``: P converted from S's accumulator), K is stored in the
        order ``WgmmaOperandA8`` reads it, so P needs no shuffle."""
        src = load.result
        k, n = src.type.shape
        dt = src.type.dtype
        try:
            placed = SharedLayout(k, n, dt, "mn", choose_swizzle(n, dt))
            placed.tma_box()
            kmajor = SharedLayout(n, k, dt, "k", choose_swizzle(k, dt), kperm)
            kmajor.tma_box()
            transpose_copy_blocks(n, k, self.threads)
        except ValueError as e:
            raise self._unsupported(mma, f"cannot transpose this {dt.name} B operand in shared memory for "
                                         f"wgmma: {e}") from None
        if src in self.smem and src.type.layout != placed:
            src = self._clone_load(load, only_user=mma)
        src.type = TileType(src.type.shape, dt, "smem", placed)
        self.smem.add(src)
        # Right after the last product before this one (attention's S = Q K^T), where lower-to-hopper
        # lets the copy run while that product is in flight; else right before this one.
        ops = mma.parent.ops
        first = ops.index(_def(src)) + 1 if _def(src) in ops else 0
        earlier = [op for op in ops[first:ops.index(mma)] if op.name == "tile.mma"]
        b = Builder(mma.parent, ops.index(earlier[-1]) + 1, mma.loc) if earlier else Builder.before(mma)
        t = b.value(hopper.TransposeSmemOp, [src], TileType(src.type.shape, dt, "smem", kmajor), loc=mma.loc)
        mma.operands = [t if (x is src or x is load.result) and i == 1 else x for i, x in enumerate(mma.operands)]
        self.smem.add(t)

    def _stage(self, src: Value, layout: SharedLayout, user: Operation, slot: int | None = None) -> Value:
        """A ``hopper.to_smem`` of ``src`` right after it is defined (so a tile loaded before a
        loop is stored once), which ``user`` reads instead (its operand ``slot`` only, when
        given)."""
        d = _def(src)
        if d is not None:
            b = Builder(d.parent, d.parent.ops.index(d) + 1, d.loc)
        else:
            b = Builder.before(user)
        staged = b.value(hopper.ToSmemOp, [src], TileType(src.type.shape, src.type.dtype, "smem", layout))
        _redirect(user, src, staged, slot)
        self.smem.add(staged)
        return staged

    def _clone_load(self, load: Operation, only_user: Operation | None) -> Value:
        """A second copy of ``load`` right after it, typed as the original tile; ``only_user``
        (if given) is redirected to it."""
        clone = Builder(load.parent, load.parent.ops.index(load) + 1, load.loc).value(
            type(load), list(load.operands), TileType(load.result.type.shape, load.result.type.dtype),
            dict(load.attributes))
        if only_user is not None:
            only_user.operands = [clone if x is load.result else x for x in only_user.operands]
        return clone

    # ------------------------------------------------------ 3. register layouts
    def _register_values(self) -> list[Value]:
        out: list[Value] = []
        for op in self.kernel.walk():
            for r in op.regions:
                for b in r.blocks:
                    out.extend(a for a in b.args if isinstance(a.type, TileType))
            out.extend(r for r in op.results if isinstance(r.type, TileType))
        return [v for v in out if v not in self.smem]

    def _propose(self, v: Value, layout: object) -> bool:
        if layout is None or v in self.lay or v in self.smem or not isinstance(v.type, TileType):
            return False
        if tuple(layout.shape) != v.type.shape or layout.threads != self.threads:
            return False
        self.lay[v] = layout
        return True

    def _propagate(self) -> None:
        values = self._register_values()
        for op in self.kernel.walk():
            if op.name == "tile.mma":
                n = op.acc.type.shape[1]
                self._propose(op.result, self._accumulator(n))
        self._fixpoint()
        # Tiles read or written as one range for stepped slices (merge-steps) are next: the
        # range in the #blocked layout of its flat shape, so each thread holds the steps' pairs
        # and reads and writes them as vectors; the slices follow as its slices.
        for op in self.kernel.walk():
            if op.name in ("tile.take", "tile.stack") and op.axis == op.result.type.rank - (op.name == "tile.stack"):
                self._seed_whole(op.x if op.name == "tile.take" else op.result)
                self._fixpoint()
        for op in self.kernel.walk():
            if op.name == "tile.gather":  # the gathered tile's own dtype sets the vector width,
                self._default(op.result)  # not its i32 index's
                self._fixpoint()
        for rank in (2, 1):
            for v in values:
                if v not in self.lay and v.type.rank == rank:
                    self._default(v)
                    self._fixpoint()

    def _stacked(self, t: TileType, elem_bytes: int | None = None) -> object | None:
        """A layout of ``t`` ([..., W, s]) that holds its last axis whole in each thread: the
        #blocked layout of the flat [..., W * s] tile (its runs as wide as ``elem_bytes``
        elements make 16 bytes), or None where that splits the axis."""
        flat = (*t.shape[:-2], t.shape[-2] * t.shape[-1])
        try:
            lay = _reshaped(choose_blocked(flat, elem_bytes or max(1, t.dtype.bits // 8), self.threads), t.shape)
        except ValueError:
            return None
        return lay if lay is not None and take_registers(lay, t.rank - 1, 0) is not None else None

    def _seed_whole(self, v: Value) -> None:
        if v in self.lay or v in self.smem:
            return
        d = _def(v)
        if d is not None and d.name == "tile.reshape" and d.x not in self.lay and d.x.type.rank == v.type.rank - 1:
            lay = self._stacked(v.type)  # the flat range itself: its reshape follows
            self._propose(d.x, lay.parent if lay is not None else None)
        elif d is not None and d.name == "tile.stack" and all(_def(x) is not None and _def(x).name == "tile.unpack_fp4"
                                                             for x in d.operands):
            # FP4 pairs unpacked: the runs as long as 16 bytes of values make, so that each
            # thread loads its pairs 8 bytes at a time (16 values), not 2
            self._propose(v, self._stacked(v.type, 1))
        else:
            self._propose(v, self._stacked(v.type))

    def _default(self, v: Value) -> None:
        elem = v.type.dtype.bits
        d = _def(v)
        if d is not None and d.name == "tile.cast" and d.x.type.dtype.bits:
            elem = min(elem, d.x.type.dtype.bits)  # a loaded-then-widened tile moves as the narrow type
        try:
            self._propose(v, choose_blocked(v.type.shape, max(1, elem // 8), self.threads))
        except ValueError as e:
            raise self._unsupported(d or self.kernel, str(e)) from None

    def _fixpoint(self) -> None:
        changed = True
        while changed:
            changed = False
            for op in self.kernel.walk():
                changed |= self._forward(op)
                changed |= self._backward(op)

    def _forward(self, op: Operation) -> bool:
        lay, name = self.lay, op.name
        if (op.has_trait("elementwise") or name in _LAYOUT_KEEPING) and op.results and \
                isinstance(op.result.type, TileType):
            src = next((lay[v] for v in op.operands if v in lay), None)
            return self._propose(op.result, src)
        if name == "tile.gather" and op.index in lay:  # the index comes in the result's layout
            return self._propose(op.result, lay[op.index])
        if name == "tile.reduce" and op.x in lay and isinstance(op.result.type, TileType):
            return self._propose(op.result, Slice(lay[op.x], op.axis))
        if name == "tile.reshape" and op.x in lay:
            return self._propose(op.result, _reshaped(lay[op.x], op.result.type.shape))
        if name == "tile.transpose" and op.x in lay:
            return self._propose(op.result, transpose_layout(lay[op.x]))
        if name == "tile.take" and op.x in lay and take_registers(lay[op.x], op.axis, 0) is not None:
            return self._propose(op.result, take_layout(lay[op.x], op.axis))
        if name == "tile.stack":
            part = next((lay[v] for v in op.operands if v in lay), None)
            return part is not None and self._propose(op.result, stack_layout(part, op.axis, len(op.operands)))
        if name == "tile.expand_dims" and op.x in lay:
            s = lay[op.x]
            if isinstance(s, Slice) and not s.keep and s.axis == op.axis:
                return self._propose(op.result, Slice(s.parent, s.axis, True))
            return False
        if name == "tile.broadcast" and op.x in lay:
            s = lay[op.x]
            if isinstance(s, Slice) and s.keep:
                return self._propose(op.result, s.parent)
            return False
        if name == "tile.for":
            body = op.regions[0].block
            changed = False
            for init, arg, res, y in zip(op.init, body.args[1:], op.results, body.terminator.operands):
                changed |= self._propose(arg, lay.get(init) or lay.get(y))
                changed |= self._propose(res, lay.get(arg))
            return changed
        if name == "tile.if":
            changed = False
            ys = [r.blocks[0].terminator.operands for r in op.regions]
            for i, res in enumerate(op.results):
                changed |= self._propose(res, lay.get(ys[0][i]) or lay.get(ys[1][i]))
            return changed
        return False

    def _backward(self, op: Operation) -> bool:
        lay, name = self.lay, op.name
        changed = False
        if (op.has_trait("elementwise") or name in _LAYOUT_KEEPING) and op.results and op.result in lay:
            for v in op.operands:
                changed |= self._propose(v, lay[op.result])
        elif name == "tile.gather" and op.result in lay:
            changed |= self._propose(op.index, lay[op.result])
        elif name == "tile.masked_store" and op.value in lay:  # the mask comes in the value's layout
            changed |= self._propose(op.mask, lay[op.value])
        elif name == "tile.reshape" and op.result in lay:
            changed |= self._propose(op.x, _reshaped(lay[op.result], op.x.type.shape))
        elif name == "tile.transpose" and op.result in lay:
            changed |= self._propose(op.x, transpose_layout(lay[op.result]))
        elif name == "tile.take" and op.result in lay:
            stacked = stack_layout(lay[op.result], op.axis, op.x.type.shape[op.axis])
            # Not where that repeats the tile in many threads (a pick broadcast back against a
            # tile, b[:, -1][:, None] * a: its slice of a's layout is repeated across the
            # threads that split a's columns): _take_layout then picks from the tile's own.
            if getattr(stacked, "regs", 0) * self.threads <= 2 * math.prod(op.x.type.shape):
                changed |= self._propose(op.x, stacked)
        elif name == "tile.stack" and op.result in lay and take_registers(lay[op.result], op.axis, 0) is not None:
            for v in op.operands:
                changed |= self._propose(v, take_layout(lay[op.result], op.axis))
        elif name == "tile.reduce" and op.result in lay:
            s = lay[op.result]
            if isinstance(s, Slice) and not s.keep and s.axis == op.axis:
                changed |= self._propose(op.x, s.parent)
        elif name == "tile.expand_dims" and op.result in lay:
            s = lay[op.result]
            if isinstance(s, Slice) and s.keep and s.axis == op.axis:
                changed |= self._propose(op.x, Slice(s.parent, s.axis))
            else:  # the new axis has extent 1 in the result's own layout: the operand is its slice
                changed |= self._propose(op.x, Slice(s, op.axis))
        elif name == "tile.broadcast" and op.result in lay:
            axes = [i for i, (a, b) in enumerate(zip(op.x.type.shape, op.result.type.shape)) if a != b]
            if len(axes) == 1 and op.result.type.rank > 1:  # a rank-1 tile has no keep slice
                changed |= self._propose(op.x, Slice(lay[op.result], axes[0], True))
        elif name == "tile.mma":
            changed |= self._propose(op.acc, lay.get(op.result))
        elif name == "tile.for":
            body = op.regions[0].block
            for init, arg, y in zip(op.init, body.args[1:], body.terminator.operands):
                if arg in lay:
                    changed |= self._propose(init, lay[arg])
                    changed |= self._propose(y, lay[arg])
        elif name == "tile.if":
            for r in op.regions:
                for y, res in zip(r.blocks[0].terminator.operands, op.results):
                    if res in lay:
                        changed |= self._propose(y, lay[res])
        return changed

    # ------------------------------------------------------------ 4. conversions
    def _convert(self) -> None:
        for op in list(self.kernel.walk()):
            self._refuse_unplaced(op)
            self._convert_op(op)

    def _refuse_unplaced(self, op: Operation) -> None:
        """Register layouts span one or two axes (and the reshapes around a take or a
        reduction): a tile of more axes that none reached runs in the interpreter only, and is
        refused where it is made."""
        for v in op.results:
            t = v.type
            if isinstance(t, TileType) and t.rank > 2 and v not in self.lay and v not in self.smem:
                shape = "x".join(map(str, t.shape))
                raise self._unsupported(op, f"this {shape} tile has {t.rank} axes; a kernel's tiles have at most "
                                            f"two (the interpreter runs more): work on 2-D slices of it, e.g. "
                                            f"loop over its first axis")

    def _need(self, op: Operation, index: int, layout: object) -> None:
        """Make operand ``index`` of ``op`` arrive in ``layout``."""
        v = op.operands[index]
        if v in self.smem or self.lay.get(v) == layout:
            return
        if v not in self.lay:
            raise self._unsupported(op, f"no register layout for operand {index} ({v.type})")
        d = _def(v)
        if d is not None and d.name in _REMATERIALIZED:
            # Cheaper to compute again in the wanted layout than to move between threads.
            again = Builder.before(op).value(type(d), list(d.operands), v.type, dict(d.attributes), loc=d.loc)
            self.lay[again] = layout
            op.operands[index] = again
            return
        conv = Builder.before(op).value(hopper.ConvertLayoutOp, [v], v.type, loc=op.loc)
        self.lay[conv] = layout
        op.operands[index] = conv

    def _convert_op(self, op: Operation) -> None:
        lay, name = self.lay, op.name
        if name == "tile.scan":
            self._scan_layout(op)
        elif name == "tile.reshape":
            self._reshape_layout(op)
        elif name in ("tile.take", "tile.stack"):
            self._take_layout(op)
        elif (op.has_trait("elementwise") or name in _LAYOUT_KEEPING) and op.results and op.result in lay:
            for i, v in enumerate(op.operands):
                if isinstance(v.type, TileType):
                    self._need(op, i, lay[op.result])
        elif name == "tile.gather":
            self._need(op, 1, lay[op.result])
        elif name == "tile.masked_store":
            self._need(op, 2, lay[op.value])
        elif name == "tile.reduce" and isinstance(op.result.type, TileType):
            want = Slice(lay[op.x], op.axis)
            if lay[op.result] != want:
                self._retype_result(op, want)
        elif name == "tile.expand_dims":
            s = lay[op.x]
            if isinstance(s, Slice) and not s.keep and s.axis == op.axis:
                if lay[op.result] != Slice(s.parent, s.axis, True):
                    self._retype_result(op, Slice(s.parent, s.axis, True))
            elif isinstance(lay[op.result], Slice) and lay[op.result].keep and lay[op.result].axis == op.axis:
                self._need(op, 0, Slice(lay[op.result].parent, op.axis))
            else:
                # The result's layout is not a kept slice (e.g. a [1, N] row block): take the
                # operand as that layout's slice and the result as its kept form, which holds
                # the same elements in the same registers, so the conversion back costs nothing.
                want = lay[op.result]
                self._need(op, 0, Slice(want, op.axis))
                self._retype_result(op, Slice(want, op.axis, True))
        elif name == "tile.broadcast":
            axes = [i for i, (a, b) in enumerate(zip(op.x.type.shape, op.result.type.shape)) if a != b]
            if len(axes) != 1:
                raise self._unsupported(op, "broadcasts one axis at a time")
            if op.result.type.rank == 1:
                # One element to a row: every thread holds it (a rank-1 tile has no keep slice).
                if not one_everywhere(lay[op.x]):
                    self._need(op, 0, choose_blocked((1,), max(1, op.x.type.dtype.bits // 8), self.threads))
            else:
                self._need(op, 0, Slice(lay[op.result], axes[0], True))
        elif name == "tile.mma":
            self._need(op, 2, lay[op.result])
            if op.a not in self.smem:
                k = op.a.type.shape[1]
                a8 = op.a.type.dtype.bits == 8
                want = (WgmmaOperandA8 if a8 else WgmmaOperandA)(k, self.warpgroups, self.slices)
                if not self._a_in_smem(op, want):
                    self._need(op, 0, want)
        elif name == "tile.for":
            body = op.regions[0].block
            for i, (arg, res) in enumerate(zip(body.args[1:], op.results)):
                if arg in lay:
                    self._need(op, 3 + i, lay[arg])
                    self._need(body.terminator, i, lay[arg])
                    if lay.get(res) != lay[arg]:
                        self._retype_result(op, lay[arg], i)
        elif name == "tile.if":
            for i, res in enumerate(op.results):
                if res in lay:
                    for r in op.regions:
                        self._need(r.blocks[0].terminator, i, lay[res])
        elif name == "tile.transpose" and op.result not in self.smem:
            # Every value stays in its register: the result is #transpose of the operand's layout.
            want = transpose_layout(lay[op.x])
            if lay[op.result] != want:
                self._retype_result(op, want)

    def _a_in_smem(self, mma: Operation, want: object) -> bool:
        """A 16-bit A operand of products only, whose values would trade threads through a
        scratch tile to reach wgmma's registers (a tile dequantized in its load's layout,
        ``dot_scaled`` on sm_90a), is staged in a swizzled shared tile that the products read
        (wgmma with both operands in shared memory): the same stores and meeting as the trade,
        without every thread reading its values back.  False where it stays in registers."""
        v = mma.a
        t, have = v.type, self.lay.get(v)
        users = uses(self.kernel).get(v, [])
        if have is None or t.dtype.bits != 16 or register_map(have, want) is not None \
                or any(u.name != "tile.mma" or u.a is not v or u.b is v for u in users):
            return False
        rows, cols = t.shape
        try:
            layout = SharedLayout(rows, cols, t.dtype, "k", choose_swizzle(cols, t.dtype))
            layout.tma_box()
        except ValueError:
            return False
        d = _def(v)
        if d is not None and d.parent is mma.parent:
            # Right before the product, beside B's stores (one meeting for both), where the
            # tile is computed for it; else once, where it is computed (before a loop).
            staged = Builder.before(mma).value(hopper.ToSmemOp, [v], TileType(t.shape, t.dtype, "smem", layout))
            self.smem.add(staged)
        else:
            staged = self._stage(v, layout, mma, 0)
        for u in users:
            _redirect(u, v, staged, 0)
        return True

    def _scan_layout(self, op: Operation) -> None:
        """A scan runs in its result's layout when ``scan_plan`` can walk it, else in the
        ``#blocked`` layout ``choose_blocked`` gives the tile (converted to and from)."""
        want = self.lay[op.result]
        try:
            scan_plan(want, op.axis)
        except ValueError:
            t = op.result.type
            try:
                want = choose_blocked(t.shape, max(1, t.dtype.bits // 8), self.threads)
                scan_plan(want, op.axis)
            except ValueError:
                name = "cumsum" if op.kind == "sum" else "cumprod"
                raise self._unsupported(op, f"{name}() along axis {op.axis} of this {'x'.join(map(str, t.shape))} "
                                        f"{t.dtype.name} tile cannot be computed by this program's {self.threads} "
                                        f"threads: a scan trades values between threads in power-of-two groups; "
                                        f"run it on a power-of-two number of warps (products of 64, 128 or 256 "
                                        f"rows)") from None
            self._retype_result(op, want)
        self._need(op, 0, want)

    def _reshape_layout(self, op: Operation) -> None:
        """A reshape keeps every value in its thread's registers: the result is ``#reshape`` of
        the operand's layout, or of ``choose_blocked``'s (converted to) when the operand's
        would carry between the new axes; refused when neither can."""
        src, shape = self.lay[op.x], op.result.type.shape
        want = _reshaped(src, shape)
        if want is None:
            t = op.x.type
            try:
                blocked = choose_blocked(t.shape, max(1, t.dtype.bits // 8), self.threads)
            except ValueError:
                blocked = None
            want = _reshaped(blocked, shape) if blocked is not None else None
            if want is None:
                old, new = "x".join(map(str, t.shape)), "x".join(map(str, shape))
                raise self._unsupported(op, f"cannot reshape this {old} {t.dtype.name} tile to {new} in registers "
                                        f"(threads would need elements other threads hold); flattening to one "
                                        f"axis always works, and so do reshapes between power-of-two extents, "
                                        f"e.g. [64, 32] -> [2048] or [32, 64] -> [64, 32]")
            self._need(op, 0, blocked)
        if self.lay[op.result] != want:
            self._retype_result(op, want)

    def _take_layout(self, op: Operation) -> None:
        """A take (a stack) picks registers: the whole tile in a layout holding the axis whole
        in each thread (its own, else the parts' stacked, converted to), the parts in its slice
        along that axis."""
        take = op.name == "tile.take"
        whole = op.x if take else op.result
        want = self.lay[whole]
        if take_registers(want, op.axis, 0) is None:
            part = self.lay[op.result] if take else self.lay[op.operands[0]]
            want = stack_layout(part, op.axis, whole.type.shape[op.axis])
            # a part's layout repeated across threads (a slice of a 2-D layout) stacks into a
            # tile repeated as often: a masked sum picks from the tile's own layout instead
            repeated = getattr(want, "regs", 0) * self.threads > 2 * math.prod(whole.type.shape)
            split = _def(whole) if take else None
            movable = split is not None and split.name == "tile.reshape" and split.x.type.rank <= 2 \
                and split.x not in self.smem and self._only_takes_along(whole, op.axis)
            flat = _reshaped(want, split.x.type.shape) if movable and not repeated else None
            if flat is None and movable and take and whole.type.rank > 2 and not self._picks_by_sum(op):
                # A tile narrower than the threads (a 64-column block of a row over 8 warps) has
                # no layout holding the axis whole without repeating it: move it repeated rather
                # than refuse it.
                flat = _reshaped(want, split.x.type.shape)
            if flat is not None:
                # A block of a register tile (t[:, 0:64]): the tile itself moves (shared memory
                # trades 1-D and 2-D tiles) to where its reshape holds the axis whole.
                self._need(split, 0, flat)
                self.lay[whole] = want
            elif take and self._picks_by_sum(op):
                self._take_by_sum(op)
                return
            elif take and whole.type.rank > 2 and split is not None and split.name == "tile.reshape" \
                    and split.x.type.rank <= 2:
                # A block or stepped slice of a register tile (v[32:64, :]) whose threads hold it in
                # an order the block cannot be picked from, and too small a tile to move whole
                # (only 1-D and 2-D tiles trade values through shared memory).
                shape = "x".join(map(str, split.x.type.shape))
                raise TkcUnsupportedError(f"this slice of a {shape} register tile cannot be taken from the "
                                          f"threads that hold it: slice the tensor instead (load the rows or "
                                          f"columns you need), or take the slice of a wider tile", op.loc)
            elif take:
                self._need_once(op, want)
            else:
                self._retype_result(op, want)
        part = take_layout(want, op.axis)
        if take:
            if self.lay[op.result] != part:
                self._retype_result(op, part)
        else:
            for i in range(len(op.operands)):
                self._need(op, i, part)

    def _only_takes_along(self, v: Value, axis: int) -> bool:
        """Whether every use of ``v`` is a take along ``axis`` (so ``v`` itself may move to the
        layout those takes want: another use is already typed with ``v``'s layout)."""
        users = uses(self.kernel).get(v, [])
        return bool(users) and all(u.name == "tile.take" and u.axis == axis for u in users)

    def _picks_by_sum(self, op: Operation) -> bool:
        """Whether ``t[23, :]`` (a take of one index from a 2-D tile whose threads split the
        axis) is better made as a masked sum over the axis than by moving the whole tile to a
        layout that holds the axis whole in each thread.  The move costs shared memory of the
        tile's size (several times it where that layout repeats the other axis's elements) and
        its registers stay live; the sum costs a select and an add per held element and the
        reduction's shuffles.  A few picks of one tile are sums; more share one move."""
        x = op.x
        if x.type.rank != 2 or x.type.dtype not in _SUM_PICKED or x not in self.lay:
            return False
        if self._picks is None:
            self._picks = {}
            for t in self.kernel.walk():
                if t.name == "tile.take" and t.x.type.rank == 2:
                    self._picks[t.x, t.axis] = self._picks.get((t.x, t.axis), 0) + 1
        return self._picks.get((x, op.axis), 0) <= _MAX_SUM_PICKS

    def _take_by_sum(self, op: Operation) -> None:
        """``t.take(i, axis)`` as ``where(arange == i, t, zero).sum(axis)``, every value in
        ``t``'s layout or its slices (no element moves but through the reduction).  The zero is
        -0.0 for floats, so the sum is the picked element exactly, -0.0 and infinities too."""
        x, axis = op.x, op.axis
        lay, other = self.lay[x], 1 - axis
        t = x.type
        b = Builder.before(op)
        n = t.shape[axis]
        col = Slice(lay, other, True)
        col_shape = (n, 1) if axis == 0 else (1, n)
        iota = b.value(tile.ArangeOp, [], TileType((n,), dtypes.i32), {"start": 0})
        self.lay[iota] = Slice(lay, other)
        iota2 = b.value(tile.ExpandDimsOp, [iota], TileType(col_shape, dtypes.i32), {"axis": other})
        index = b.value(tile.ConstantOp, [], TileType(col_shape, dtypes.i32), {"value": op.index})
        hit = b.value(tile.CmpOp, [iota2, index], TileType(col_shape, dtypes.i1), {"pred": "eq"})
        hits = b.value(tile.BroadcastOp, [hit], TileType(t.shape, dtypes.i1))
        zero = b.value(tile.ConstantOp, [], TileType(t.shape, t.dtype), {"value": -0.0 if t.dtype.is_float else 0})
        picked = b.value(tile.SelectOp, [hits, x, zero], TileType(t.shape, t.dtype))
        total = b.value(tile.ReduceOp, [picked], op.result.type, {"kind": "sum", "axis": axis})
        for v in (iota2, index, hit):
            self.lay[v] = col
        for v in (hits, zero, picked):
            self.lay[v] = lay
        want = self.lay.get(op.result)
        self.lay[total] = Slice(lay, axis)
        result = total
        if want is not None and want != self.lay[total]:
            result = Builder.before(op).value(hopper.ConvertLayoutOp, [total], total.type, loc=op.loc)
            self.lay[result] = want
        replace_all_uses(self.kernel, op.result, result)
        self.lay.pop(op.result, None)
        op.erase()

    def _need_once(self, op: Operation, layout: object) -> None:
        """``_need`` for a take's operand, reusing a conversion of the same value to the same
        layout made for an earlier take of its block (``t[:, 5]`` and ``t[:, -1]``: one move)."""
        key = (op.operands[0], layout, op.parent)
        conv = self._take_conversions.get(key)
        if conv is not None:  # converted before an earlier take of this block
            op.operands[0] = conv
            return
        self._need(op, 0, layout)
        if op.operands[0] is not key[0]:
            self._take_conversions[key] = op.operands[0]

    def _retype_result(self, op: Operation, layout: object, index: int = 0) -> None:
        """Give result ``index`` of ``op`` ``layout`` and convert it back for its users."""
        res = op.results[index]
        old = self.lay[res]
        users = uses(self.kernel).get(res, [])
        self.lay[res] = layout
        b = Builder(op.parent, op.parent.ops.index(op) + 1, op.loc)
        conv = b.value(hopper.ConvertLayoutOp, [res], res.type, loc=op.loc)
        self.lay[conv] = old
        for u in users:
            u.operands = [conv if x is res else x for x in u.operands]
