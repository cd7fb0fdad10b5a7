"""The ``blackwell`` dialect: what sm_100a adds to the hopper dialect, one op per thing a
tcgen05 kernel does differently.

Shared tiles, mbarriers and TMA copies stay ``hopper.*`` ops; the accumulator of a product
lives in *tensor memory* (TMEM: 128 lanes x 512 columns of 32 bits per CTA) instead of a
warpgroup's registers.  One thread issues the MMA, a ``tcgen05.commit`` arrives on an mbarrier
once the MMAs it issued have completed, and the epilogue warps read the accumulator into
registers with ``tcgen05.ld``, each warp only its own quarter of the lanes.  A block-scaled
product's scale factors are copied into tensor memory by the MMA's thread
(``blackwell.copy_scales``, ``tcgen05.cp``) and named by its MMA (docs/block_scaled.md §7).  Semantics (who
executes, what is read and written) are in docs/blackwell.md; the emulator
(``tkc.emulator.tmem``) and codegen (``tkc.codegen.lower_blackwell``) implement exactly that.

The instruction descriptor and the tensor-memory shared-memory descriptors are computed here,
from the layout objects, so the emulator and codegen cannot disagree on a bit.

Must not: choose a layout, a column budget or a barrier (``lower-to-blackwell`` does).
"""

from __future__ import annotations

import numpy as np

from tkc import dtypes
from tkc.ir.core import Operation, register
from tkc.ir.dialects.hopper import _check_barrier, _check_view, _smem, check_pair
from tkc.ir.dialects.tile import SCALE_BLOCK_OF
from tkc.ir.layouts import (ScaleLayout, SharedLayout, TmemAccumulator, WgmmaAccumulator, encode_descriptor,
                            read_as)
from tkc.ir.types import ScalarType, TileType

I32 = ScalarType(dtypes.i32)
I1 = ScalarType(dtypes.i1)

#: Tensor memory of one CTA: lanes (rows) and 32-bit columns (PTX-FACTS §7).
TMEM_LANES = 128
TMEM_COLUMNS = 512
#: The M of a ``tcgen05.mma.cta_group::1`` that uses half the data path (the PTX ISA's
#: layout F): row r of the accumulator is lane 32 (r // 16) + r % 16.
HALF_ROWS = 64
#: Bit 46 of a shared-memory matrix descriptor: the tcgen05 (sm_100) descriptor version.  The
#: other fields are Hopper's (start, LBO, SBO; the 3-bit layout type at 61-63 holds Hopper's
#: 2-bit swizzle mode shifted one up), so ``SharedLayout.descriptor`` builds both.
DESC_VERSION = 1 << 46

#: Operand type codes of the instruction descriptor (bits 7-9 for A, 10-12 for B) per kind.
_KIND_CODES = {"f16": {"f16": 0, "bf16": 1}, "f8f6f4": {"f8e4m3": 0, "f8e5m2": 1}}


def accumulator_lanes(m: int) -> np.ndarray:
    """The tensor-memory lane of each row of an M x N ``tcgen05.mma.cta_group::1`` accumulator
    (the PTX ISA's data-path layouts): M = 128 (layout D) row i is lane i; M = 64 (layout F,
    half the data path, lane alignment 0) warp quarter w holds rows 16 w to 16 w + 15 in its
    lanes 32 w to 32 w + 15."""
    r = np.arange(m)
    return r if m == TMEM_LANES else 32 * (r // 16) + r % 16


def tmem_columns(n: int) -> int:
    """Columns ``tcgen05.alloc`` takes for an N-wide f32 accumulator: a power of two, at least 32."""
    cols = 32
    while cols < n:
        cols *= 2
    return cols


def mma_kind(a: dtypes.DType, b: dtypes.DType) -> str | None:
    """The ``tcgen05.mma`` kind of an A x B product (None: no kind takes this pair)."""
    for kind, codes in _KIND_CODES.items():
        if a.name in codes and b.name in codes and (kind != "f16" or a == b):
            return kind
    return None


def smem_descriptor(layout: SharedLayout, base_addr: int, k_step: int = 0) -> int:
    """The tcgen05 shared-memory descriptor of K-step ``k_step`` of a whole operand tile:
    Hopper's (``SharedLayout.descriptor``) with the sm_100 version bit.  8-bit operands may be
    MN-major (PTX ISA: ``kind::f8f6f4`` transposes A and B, not with 128-B swizzling of 32-B
    atomicity, which tkc never uses)."""
    return layout.descriptor(base_addr, k_step, 0, mn_8bit=True) | DESC_VERSION


def instr_descriptor(a: SharedLayout, b: SharedLayout, m: int, n: int) -> int:
    """The 32-bit instruction descriptor of ``tcgen05.mma`` (PTX-FACTS §7 table): f32 D, A
    and B types and majors from their shared layouts, N >> 3 and M >> 4.  ``a`` is the
    layout of the M x K operand, ``b`` that of the N x K one (K-major: ``major == "k"``)."""
    kind = mma_kind(a.dtype, b.dtype)
    if kind is None:
        raise ValueError(f"tcgen05.mma has no kind for {a.dtype.name} x {b.dtype.name}")
    codes = _KIND_CODES[kind]
    return (1 << 4 | codes[a.dtype.name] << 7 | codes[b.dtype.name] << 10 | (a.major == "mn") << 15
            | (b.major == "mn") << 16 | (n >> 3) << 17 | (m >> 4) << 24)


#: The block-scaled descriptor's scale type UE8M0 (bit 23; UE4M3 is 0) (docs/block_scaled.md §3);
#: kind::mxf8f6f4's operand codes (bits 7-9 and 10-12) are kind::f8f6f4's for e4m3 and e5m2.
UE8M0 = 1
#: kind::mxf4nvf4's operand code of E2M1 (bits 7-9 and 10-11).
E2M1 = 1
#: The block-scaled kinds tkc issues, by their scale vector (the scales one MMA of K 32 bytes
#: reads a row): 1X 8-bit operands with one UE8M0 a 32-run (MXFP8), 2X FP4 pairs with one UE8M0
#: a 32-run (MXFP4), 4X FP4 pairs with one UE4M3 a 16-run (NVFP4).
SCALED_KINDS = {1: "mxf8f6f4", 2: "mxf4nvf4", 4: "mxf4nvf4"}


def scale_vec(operand: dtypes.DType, scale: dtypes.DType) -> int:
    """The scale vector of a block-scaled product of ``operand``s scaled by ``scale``s: the
    values of K one MMA step takes (32 bytes: 32 8-bit values, 64 FP4 ones) over the values one
    scale covers."""
    return 32 * (2 if operand.is_packed else 1) // SCALE_BLOCK_OF[scale.name]


def scaled_instr_descriptor(a: SharedLayout, b: SharedLayout, m: int, n: int, a_id: int, b_id: int,
                            vec: int = 1) -> int:
    """The instruction descriptor of ``tcgen05.mma ... kind::mxf8f6f4.block_scale`` (``vec``
    1) or ``kind::mxf4nvf4.block_scale`` (``vec`` 2 or 4) (docs/block_scaled.md §3; not the
    unscaled layout: bits 4-5 hold B's scale id, not D's type, and M is ``M >> 7`` at bits
    27-28): A's and B's types and majors (FP4 pairs K-major only), N >> 3, the scale type
    (UE8M0, or UE4M3 for 4X), and which byte of a scale column (``a_id``, ``b_id``: the first
    K block of this K step within its group of four) it reads."""
    if not (0 <= a_id < 4 and 0 <= b_id < 4) or a_id % vec or b_id % vec:
        raise ValueError(f"scale ids are 0-3 and multiples of the scale vector {vec}, got {a_id} and {b_id}")
    if vec == 1:
        codes = _KIND_CODES["f8f6f4"]
        if a.dtype.name not in codes or b.dtype.name not in codes:
            raise ValueError(f"kind::mxf8f6f4 takes e4m3 and e5m2 here, not {a.dtype.name} x {b.dtype.name}")
        ca, cb, scale = codes[a.dtype.name], codes[b.dtype.name], UE8M0
    else:
        if vec not in (2, 4) or not (a.dtype.is_packed and b.dtype.is_packed):
            raise ValueError(f"kind::mxf4nvf4 takes FP4 pairs with 2 or 4 scales a K step, not {a.dtype.name} x "
                             f"{b.dtype.name} with {vec}")
        if a.major != "k" or b.major != "k":
            raise ValueError("kind::mxf4nvf4 reads K-major operands only")
        ca, cb, scale = E2M1, E2M1, UE8M0 if vec == 2 else 0
    return (b_id << 4 | ca << 7 | cb << 10 | (a.major == "mn") << 15 | (b.major == "mn") << 16 | (n >> 3) << 17
            | scale << 23 | (m >> 7) << 27 | a_id << 29)


def scale_descriptor(addr: int) -> int:
    """The shared-memory descriptor ``tcgen05.cp .32x128b.warpx4`` reads one 512-byte block of
    scale factors at ``addr`` through: unswizzled, 32 rows of 16 bytes, 8-row groups 128 bytes
    apart (SBO; one 16-byte column, so LBO is not used: 0, as CUTLASS), the version bit."""
    return encode_descriptor(addr, 0, 128, 0) | DESC_VERSION


def scale_columns(layout: ScaleLayout) -> int:
    """Tensor-memory columns a ``#scales`` tile takes: four for each 512-byte block."""
    return 4 * layout.atoms


def _check_in_role_or_kernel(op: Operation) -> None:
    parent = op.parent.parent_op if op.parent else None
    if parent is None or parent.name not in ("hopper.role", "tile.kernel"):
        raise op.error("tensor memory is allocated and freed at the top of a role (or the kernel body)")


@register
class TmemAllocOp(Operation):
    """``tcgen05.alloc`` of ``cols`` columns (a power of two in [32, 512]) by the first warp of
    the role, ``relinquish_alloc_permit``, then every thread of the role reads the address
    (lane << 16 | column) the allocation wrote to shared memory, after a role barrier.  With
    ``pair``, ``.cta_group::2``: each CTA of the pair allocates the same columns, which its
    pair's MMAs write (a kernel uses one ``cta_group`` throughout)."""

    name = "blackwell.tmem_alloc"
    RESULTS = ("result",)
    ATTRS = {"cols": int, "pair?": bool}

    def verify(self) -> None:
        pair = bool(self.attributes.get("pair"))
        if pair:
            check_pair(self)
        kernel = next((p for p in self.ancestors() if p.name == "tile.kernel"), None)
        for op in kernel.walk() if kernel is not None else ():
            paired = bool(op.attributes.get("pair"))
            if op.name.startswith("blackwell.") and op.name != TmemLoadOp.name and paired != pair:
                raise op.error(f"a kernel's tcgen05 ops are all a CTA pair's (pair, cta_group::2) or none is: this "
                               f"one {'is not' if pair else 'is'}, its tensor memory's allocation "
                               f"{'is' if pair else 'is not'}")
        c = self.cols
        if c < 32 or c > TMEM_COLUMNS or c & (c - 1):
            raise self.error(f"tcgen05.alloc takes a power of two in [32, {TMEM_COLUMNS}] columns, got {c}")
        if self.result.type != I32:
            raise self.error("the tensor-memory address is an i32")
        _check_in_role_or_kernel(self)


@register
class TmemDeallocOp(Operation):
    """Every thread of the role meets (its reads of tensor memory done), then the first warp
    frees the ``cols`` columns at ``tmem`` (``tcgen05.dealloc``)."""

    name = "blackwell.tmem_dealloc"
    OPERANDS = ("tmem",)
    ATTRS = {"cols": int, "pair?": bool}

    def verify(self) -> None:
        owner = getattr(self.tmem, "owner", None)
        if owner is None or owner.name != TmemAllocOp.name:
            raise self.error("frees what a blackwell.tmem_alloc allocated")
        if bool(self.attributes.get("pair")) != bool(owner.attributes.get("pair")):
            raise self.error("frees with the cta_group (pair) its allocation used")
        if self.cols != owner.cols:
            raise self.error(f"frees {self.cols} columns of an allocation of {owner.cols}")
        _check_in_role_or_kernel(self)


@register
class MmaOp(Operation):
    """The MMA-issuing warp: the first warp of the role waits for each (mbarrier, parity) pair
    of ``ready`` (its operands' copies landed; none when its program order already saw them),
    then its thread 0 issues ``tcgen05.mma.cta_group::1``: the ``m`` x ``n`` f32 accumulator
    at ``tmem`` becomes ``A @ B`` (``accumulate`` false) or ``acc + A @ B``, one instruction
    per K step of 32 bytes.  ``m`` is 128 (row i in lane i) or 64 (``accumulator_lanes``).
    A shared operand may be read with the other major (``a_major``/``b_major``, as wgmma's).
    The role's other warps do nothing here (nor spin on ``ready``).  Asynchronous: the result
    is in tensor memory once a later ``blackwell.commit`` of that thread has arrived on its
    mbarrier.

    With ``pair`` (CTA pairs): ``tcgen05.mma.cta_group::2``, issued in the pair's even CTA only
    (the odd one skips the op): one MMA of ``2 m`` rows whose A is each CTA's ``m`` x K tile and
    whose B is each CTA's half of the ``n`` columns (``b`` is ``n / 2`` wide), both at the same
    shared offsets in the two CTAs; rows ``[0, m)`` of the result land in the even CTA's tensor
    memory at ``tmem``, rows ``[m, 2 m)`` in the odd one's at the same address."""

    name = "blackwell.mma"
    OPERANDS = ("tmem", "a", "b", "accumulate", "*ready")
    ATTRS = {"m": int, "n": int, "a_major?": str, "b_major?": str, "pair?": bool, "scales?": list,
             "scale_vec?": int}

    def operand_layout(self, which: str) -> SharedLayout:
        """The shared layout this MMA reads operand ``which`` ('a' or 'b') through."""
        return read_as(getattr(self, which).type.layout, self.attributes.get(f"{which}_major"))

    @property
    def pair(self) -> bool:
        return bool(self.attributes.get("pair"))

    @property
    def instruction_m(self) -> int:
        """The M of the instruction: ``m``, or both CTAs' rows for a pair."""
        return 2 * self.m if self.pair else self.m

    def waits(self) -> list[tuple[object, object]]:
        """The (mbarrier, parity) pairs the MMA warp waits for before it issues."""
        return list(zip(self.ready[::2], self.ready[1::2]))

    def verify(self) -> None:
        if self.tmem.type != I32 or self.accumulate.type != I1 or len(self.ready) % 2 \
                or any(p.type != I32 for _, p in self.waits()):
            raise self.error("takes the tensor-memory address (i32), the accumulate flag (i1), and pairs of the "
                             "operands' mbarrier and its parity (i32)")
        for bar, _ in self.waits():
            _check_barrier(self, bar)
        a, b = self.a.type, self.b.type
        if not (_smem(a) and _smem(b)):
            raise self.error(f"A and B are shared tiles, got {a} and {b}")
        _check_view(self, a, "A")
        _check_view(self, b, "B")
        la, lb = self.operand_layout("a"), self.operand_layout("b")
        am, ak = (la.rows, la.cols) if la.major == "k" else (la.cols, la.rows)
        bn, bk = (lb.rows, lb.cols) if lb.major == "k" else (lb.cols, lb.rows)
        if self.pair:
            check_pair(self)
            if self.m != TMEM_LANES or self.n % 32 or not 32 <= self.n <= 256:
                raise self.error(f"tcgen05.mma.cta_group::2 here is 128 rows a CTA with N in 32..256 in steps of 32 "
                                 f"(each CTA's half of B a multiple of 16), got {self.m}x{self.n}")
            if am != self.m or bn != self.n // 2 or ak != bk:
                raise self.error(f"shapes do not agree: A {am}x{ak} and B {bk}x{bn} in each CTA of the pair, "
                                 f"accumulator {self.m}x{self.n} in each (B is half of its {self.n} columns)")
        elif am != self.m or bn != self.n or ak != bk:
            raise self.error(f"shapes do not agree: A {am}x{ak}, B {bk}x{bn}, accumulator {self.m}x{self.n}")
        # 8-bit MN-major B (transposed) takes N in steps of 16 (PTX ISA, "8bit transpose B").
        step = 8 if self.m == HALF_ROWS and not (lb.major == "mn" and lb.elem_bytes == 1) else 16
        if not self.pair and (self.m not in (HALF_ROWS, TMEM_LANES)
                              or not (self.n % step == 0 and step <= self.n <= 256)):
            raise self.error(f"tcgen05.mma.cta_group::1 here is M = 128 with N in 16..256 in steps of 16, or M = 64 "
                             f"with N in 8..256 in steps of 8, got {self.m}x{self.n}")
        scales = self.attributes.get("scales")
        fp4 = a.dtype.is_packed and b.dtype.is_packed and scales is not None
        if mma_kind(a.dtype, b.dtype) is None and not fp4:
            raise self.error(f"tcgen05.mma takes bf16 x bf16, f16 x f16 or 8-bit float pairs (FP4 pairs block-scaled), "
                             f"not {a.dtype.name} x {b.dtype.name}")
        if scales is not None:
            if not (isinstance(scales, list) and len(scales) == 2 and all(type(c) is int for c in scales)):
                raise self.error("scales are the columns of A's and B's scale factors from the accumulator's address")
            vec = self.scale_vec
            if self.pair or self.m != TMEM_LANES or (vec == 1) != (mma_kind(a.dtype, b.dtype) == "f8f6f4") \
                    or vec not in SCALED_KINDS or (vec > 1 and not fp4):
                raise self.error(f"a block-scaled tcgen05.mma here is one CTA's, M = 128, of 8-bit operands (scale "
                                 f"vector 1) or FP4 pairs (2 or 4), got {a.dtype.name} x {b.dtype.name}, M = {self.m}, "
                                 f"scale vector {vec}{', a pair' if self.pair else ''}")

    @property
    def scale_vec(self) -> int:
        """Scales one K step (32 bytes of K) reads a row: 1 (MXFP8), 2 (MXFP4) or 4 (NVFP4)."""
        return self.attributes.get("scale_vec", 1)

    @property
    def scale_columns(self) -> tuple[int, int] | None:
        """Where A's and B's scale factors are, in columns from ``tmem`` (None: not block-scaled)."""
        scales = self.attributes.get("scales")
        return None if scales is None else (scales[0], scales[1])

    def scale_step(self, k_step: int) -> tuple[int, int, int]:
        """What the block-scaled MMA of K step ``k_step`` (32 bytes of K: one K block of 32
        8-bit values, or two of 32 or four of 16 FP4 values) is issued with: its instruction
        descriptor, whose scale ids pick the byte of a scale column its first K block is (its
        place in a group of four), and the columns from ``tmem`` of A's and B's scales for that
        group (``[sfa]``, ``[sfb]``; a group takes four columns a 128 rows of M or N)."""
        a, b = self.scale_columns
        block = k_step * self.scale_vec
        group = 4 * (block // 4)
        idesc = scaled_instr_descriptor(self.operand_layout("a"), self.operand_layout("b"), self.m, self.n,
                                        block % 4, block % 4, self.scale_vec)
        return idesc, a + group * -(-self.m // 128), b + group * -(-self.n // 128)


@register
class CopyScalesOp(Operation):
    """The MMA-issuing thread (thread 0 of the role's first warp) copies a block-scaled
    product's scale factors, a shared ``#scales`` tile the threads wrote, into tensor memory
    from column ``tmem`` on: one ``tcgen05.cp.cta_group::1.32x128b.warpx4`` a 512-byte block,
    into four columns, row r of the block into lanes r, 32 + r, 64 + r and 96 + r (each warp
    quarter a copy).  Asynchronous, in issue order with that thread's MMAs (the MMA behind it
    reads what it copied); a later ``blackwell.commit`` of that thread tracks it, and the
    shared tile is read until then (docs/block_scaled.md §4-5)."""

    name = "blackwell.copy_scales"
    OPERANDS = ("tmem", "scales")

    def verify(self) -> None:
        t = self.scales.type
        if self.tmem.type != I32:
            raise self.error("takes the tensor-memory address (i32) the scale factors go to")
        if not (_smem(t) and isinstance(t.layout, ScaleLayout) and t.shape == (t.layout.rows, t.layout.cols)):
            raise self.error(f"copies a shared #scales tile, got {t}")


@register
class CommitOp(Operation):
    """``tcgen05.commit.mbarrier::arrive::one``, by the thread that issued the MMAs: one
    arrival on ``barrier`` once every MMA it issued before has completed (the accumulator
    written, the shared tiles read).  With ``cluster``, one arrival on the barrier at that
    offset in every CTA of the kernel's cluster (``.multicast::cluster``: a ring stage the
    ``multicast`` pass fills in every CTA is free once each CTA's MMAs have read it).  With
    ``pair`` (the MMAs are a CTA pair's, ``.cta_group::2``): by the pair's even CTA, which
    issued them, one arrival on the barrier at this offset in both CTAs of the pair."""

    name = "blackwell.commit"
    OPERANDS = ("barrier",)
    ATTRS = {"cluster?": bool, "pair?": bool}

    def verify(self) -> None:
        _check_barrier(self, self.barrier)
        if self.attributes.get("pair"):
            check_pair(self)
            if self.attributes.get("cluster"):
                raise self.error("a pair's commit arrives in both CTAs of the pair (pair), not with cluster")
        if self.attributes.get("cluster"):
            kernel = next((p for p in self.ancestors() if p.name == "tile.kernel"), None)
            if kernel is None or kernel.attributes.get("cluster", 1) < 2:
                raise self.error("a commit on every CTA of the cluster needs a kernel in clusters (cluster >= 2)")


@register
class TmemLoadOp(Operation):
    """``tcgen05.ld`` + ``tcgen05.wait::ld`` by every thread of the role: the accumulator at
    ``tmem`` as a register tile, each warp reading its quarter of the lanes.  A 128-row
    accumulator is a ``#tmem_acc`` tile (``.32x32b``, each warpgroup its share of the
    columns); a 64-row one, one warpgroup's ``#wgmma_acc`` (``.16x256b`` reads warp w's 16
    lanes as wgmma's accumulator fragment).  Where ``written`` is false (the
    K loop ran no iteration, so no MMA wrote it) the result is zeros, as a register
    accumulator that started at zero would be.  With an ``addend`` (a register tile of the
    result's type: attention's O alpha) the result is ``addend`` plus the accumulator, each
    chunk of a thread's columns added as it arrives, so that the whole accumulator is never
    in registers beside the addend."""

    name = "blackwell.tmem_load"
    OPERANDS = ("tmem", "written", "*addend")
    RESULTS = ("result",)

    def verify(self) -> None:
        r = self.result.type
        if self.tmem.type != I32 or self.written.type != I1:
            raise self.error("takes the tensor-memory address (i32) and whether an MMA wrote it (i1)")
        if len(self.addend) > 1 or any(a.type != r for a in self.addend):
            raise self.error(f"takes at most one addend, of the result's type {r}")
        half = isinstance(r, TileType) and isinstance(r.layout, WgmmaAccumulator) \
            and (r.layout.warpgroups, r.layout.slices) == (1, 1)
        if not (isinstance(r, TileType) and r.space == "reg" and (isinstance(r.layout, TmemAccumulator) or half)
                and r.dtype == dtypes.f32 and r.shape == r.layout.shape):
            raise self.error(f"the result is an f32 #tmem_acc (128 rows) or #wgmma_acc (64 rows, one warpgroup) "
                             f"register tile, got {r}")


