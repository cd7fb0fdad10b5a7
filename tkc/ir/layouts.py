"""Hopper layouts: the only place that knows where an element of a tile lives.

Each layout is a frozen dataclass that a pass puts on a ``TileType`` (``tile<64x64xbf16,
smem, #smem<64x64xbf16, k, sw128>>``).  Codegen asks it for addresses and wgmma descriptors;
the emulator asks it where to put bytes and registers.  Both ask the same object, so there is
no second copy of any formula here (DESIGN.md principle 5).

- ``SharedLayout`` (``#smem<RxCxdtype, k|mn, swS>``): a shared-memory tile as TMA writes it
  (PTX-FACTS §2, §3): byte offsets, TMA box and swizzle enum, wgmma matrix descriptors, and
  ``descriptor_address`` which reads a descriptor back the way the hardware does.
- ``ScaleLayout`` (``#scales<RxC, k|mn>``): a block-scaled product's scale factors in the
  512-byte blocks ``tcgen05.cp`` moves into tensor memory (docs/block_scaled.md §5).
- Register layouts answer the distributed-layout protocol (``DistributedLayout``, docs/hopper.md
  §2): value i of thread t is element ``thread_coords(t) + reg_coords(i)`` per axis, the
  thread part written with plain integer arithmetic so that codegen can evaluate it on
  ``%tid`` symbols and the emulator on numpy arrays.
  - ``WgmmaAccumulator`` (``#wgmma_acc<N>``) and ``WgmmaOperandA`` (``#wgmma_a<K>``): register
    fragments of 64 rows (one wgmma's) per warpgroup, or two to four such slices (PTX-FACTS
    §1), plus the stmatrix epilogue (§6).
  - ``Blocked`` (``#blocked<...>``): runs of contiguous columns per thread, for tiles no
    wgmma produces; ``choose_blocked`` states the rule select-layouts applies.
  - ``Slice`` (``#slice<parent, axis=A>``): ``parent`` reduced along an axis.
- ``reduce_plan``: how a reduction runs on a register layout (in-thread groups, lane
  shuffles, cross-warp exchanges), derived from the coordinates, for the lowering, the
  emulator and codegen alike; ``scan_plan`` the same for a scan (``cumsum``).

Index-mapping methods are vectorized: they take ints or numpy integer arrays (broadcast
together) and return int64 arrays.  This module never *chooses* a layout: that is the
select-layouts pass.  ``choose_swizzle`` and ``choose_blocked`` only state the rules that
pass applies.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import Any, NamedTuple, Protocol

import numpy as np

from tkc import dtypes
from tkc.dtypes import DType
from tkc.ir.types import LAYOUT_PARSERS


#: Bytes of K one tensor-core instruction takes (wgmma's k16 for 16-bit operands, k32 for
#: 8-bit ones, k8 for tf32; tcgen05's the same): a product's K is a whole number of them.
MMA_K_BYTES = 32


def mma_k_step(bits: int) -> int:
    """K elements of one tensor-core instruction for operands of ``bits`` bits."""
    return MMA_K_BYTES * 8 // bits


SWIZZLES = (0, 32, 64, 128)
# CU_TENSOR_MAP_SWIZZLE_{NONE,32B,64B,128B} (PTX-FACTS §3).
_TMA_SWIZZLE_ENUM = {0: 0, 32: 1, 64: 2, 128: 3}
# wgmma descriptor bits 62-63: 0 none, 1 = 128B, 2 = 64B, 3 = 32B (PTX-FACTS §2).
_DESC_SWIZZLE_MODE = {0: 0, 128: 1, 64: 2, 32: 3}
_DESC_MODE_SWIZZLE = {v: k for k, v in _DESC_SWIZZLE_MODE.items()}


def _ints(x: object) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def _check_range(name: str, x: np.ndarray, hi: int) -> None:
    if x.size and (x.min() < 0 or x.max() >= hi):
        raise ValueError(f"{name} out of range [0, {hi})")


def swizzle(addr: object, swizzle_bytes: int) -> np.ndarray:
    """The swizzle of TMA and wgmma (PTX-FACTS §2): address bits [4:6] ^= bits [7:9] for 128B,
    [4:5] ^= [7:8] for 64B, 4 ^= 7 for 32B; identity for 0.  It permutes 16-byte chunks
    within each 8-row repeat (1024/512/256 B), so it is its own inverse."""
    a = _ints(addr)
    if swizzle_bytes == 0:
        return a
    mask = swizzle_bytes // 16 - 1
    return a ^ (((a >> 7) & mask) << 4)


def core_matrix_misfit(rows: int, cols: int, dtype: DType) -> str | None:
    """Why a ``rows x cols`` tile of ``dtype`` is not a whole number of the 8-row x 16-byte
    core matrices that TMA boxes and wgmma descriptors are made of; None when it is."""
    if rows % 8 or cols * dtype.bits % 128:
        return f"a {rows}x{cols} tile is not a whole number of 8-row x 16-byte core matrices"
    return None


def choose_swizzle(inner_extent: int, dtype: DType) -> int:
    """The swizzle the select-layouts pass gives a shared tile whose contiguous dim holds
    ``inner_extent`` elements: the widest of 128, 64, 32 B that divides the inner bytes, else
    0.  Every box of the tile is then exactly one swizzle span wide (see ``SharedLayout``)."""
    inner = inner_extent * dtype.bits // 8
    return next((s for s in (128, 64, 32) if inner % s == 0), 0)


class TmaBox(NamedTuple):
    """How TMA moves a ``SharedLayout`` tile: ``dims`` is the tensor map's boxDim and ``count``
    the number of boxes per tile, both innermost first; box ``(i, j)`` lands at shared
    offset ``i * inner_stride + j * outer_stride``."""

    dims: tuple[int, int]
    count: tuple[int, int]
    inner_stride: int
    outer_stride: int


@dataclass(frozen=True)
class SharedLayout:
    """A ``rows x cols`` shared tile stored as TMA boxes with ``cols`` contiguous.

    The inner dim is cut into boxes one *atom* wide (the swizzle width, or 16 B with no
    swizzle: the no-swizzle wgmma layout is built of 8-row x 16-B core matrices).  Box ``b``
    holds cols ``[b*box_cols, (b+1)*box_cols)`` of every row as a row-major ``rows x atom``
    array; the boxes sit back to back (PTX-FACTS §2, "two 64x64 boxes").  The swizzle XOR is
    applied to the offset from the tile base, which must be aligned to the swizzle repeat.

    ``major`` says what wgmma sees: "k" when ``cols`` is K (A as MxK, B as NxK), "mn" when
    ``cols`` is M or N (B as KxN row-major, A as KxM).  It changes descriptors, not offsets.

    ``kperm`` (8-bit, K-major B only): each 32 columns of K are stored in the order in which an
    8-bit A operand in registers (``WgmmaOperandA8``) reads them, ``a8_stored_col``: column
    c lies at ``a8_stored_col(c)``.  The product is then P V with P's columns and V's rows
    permuted alike, and an accumulator becomes an A operand without moving a value.
    """

    rows: int
    cols: int
    dtype: DType
    major: str = "k"
    swizzle: int = 128
    kperm: bool = False

    def __post_init__(self) -> None:
        if self.dtype.bits not in (8, 16, 32, 64):
            raise ValueError(f"shared tiles hold 8-, 16-, 32- or 64-bit elements, not {self.dtype}")
        if self.major not in ("k", "mn"):
            raise ValueError(f"major is 'k' or 'mn', not {self.major!r}")
        if self.swizzle not in SWIZZLES:
            raise ValueError(f"swizzle is one of {SWIZZLES}, not {self.swizzle}")
        if self.rows <= 0 or self.rows % 8:
            raise ValueError(f"rows must be a positive multiple of 8 (the swizzle repeat), got {self.rows}")
        if self.cols <= 0 or self.cols * self.elem_bytes % self.atom_bytes:
            raise ValueError(f"{self.cols} x {self.dtype} is not a multiple of the {self.atom_bytes}-B atom")
        if self.kperm and (self.major != "k" or self.dtype.bits != 8 or self.cols % 32):
            raise ValueError("a K permutation is for 8-bit K-major tiles of whole k32 steps")

    @property
    def elem_bytes(self) -> int:
        return self.dtype.bits // 8

    @property
    def atom_bytes(self) -> int:
        """Bytes of one box row: the swizzle width, or 16 B (one core-matrix row) unswizzled."""
        return self.swizzle or 16

    @property
    def box_cols(self) -> int:
        return self.atom_bytes // self.elem_bytes

    @property
    def box_bytes(self) -> int:
        return self.rows * self.atom_bytes

    @property
    def size_bytes(self) -> int:
        return self.rows * self.cols * self.elem_bytes

    @property
    def alignment(self) -> int:
        """Base alignment: the 8-row swizzle repeat (1024/512/256 B), 128 B unswizzled (§3)."""
        return 8 * self.swizzle if self.swizzle else 128

    def _linear(self, row: np.ndarray, col: np.ndarray) -> np.ndarray:
        box, c = np.divmod(col, self.box_cols)
        return box * self.box_bytes + row * self.atom_bytes + c * self.elem_bytes

    def offset(self, row: object, col: object) -> np.ndarray:
        """Byte offset of element (row, col) from the tile base."""
        r, c = _ints(row), _ints(col)
        _check_range("row", r, self.rows)
        _check_range("col", c, self.cols)
        return swizzle(self._linear(r, a8_stored_col(c) if self.kperm else c), self.swizzle)

    def tma_box(self) -> TmaBox:
        """Box dims for cuTensorMapEncodeTiled: one atom wide, at most 256 rows (§3)."""
        box_rows = min(self.rows, 256)
        if self.rows % box_rows:
            raise ValueError(f"{self.rows} rows do not split into boxes of at most 256 rows")
        return TmaBox((self.box_cols, box_rows), (self.cols // self.box_cols, self.rows // box_rows),
                      self.box_bytes, box_rows * self.atom_bytes)

    def tma_swizzle_enum(self) -> int:
        return _TMA_SWIZZLE_ENUM[self.swizzle]

    # ------------------------------------------------------------ wgmma descriptors
    @property
    def k_per_step(self) -> int:
        """K elements of one wgmma: 32 B of K (k16 for 16-bit, k32 for 8-bit, k8 for tf32)."""
        return mma_k_step(8 * self.elem_bytes)

    @property
    def k_steps(self) -> int:
        return (self.cols if self.major == "k" else self.rows) // self.k_per_step

    @lru_cache(maxsize=4096)  # noqa: B019 - layouts are values; the emulator asks per wgmma
    def descriptor(self, base_addr: int, k_step: int = 0, mn_start: int = 0, mn_8bit: bool = False) -> int:
        """The 64-bit wgmma matrix descriptor (PTX-FACTS §2) for K-step ``k_step`` of the rows
        (K-major) or cols (MN-major) starting at ``mn_start``.  Canonical layouts per
        CUTLASS ``make_gmma_desc``, in bytes:

        - K-major swizzled: LBO 16 (ignored), SBO = 8 rows x atom; a step adds 32 B.
        - K-major unswizzled: LBO = box (K-adjacent core matrices), SBO = 128 (8-row groups).
        - MN-major swizzled: LBO = box (next atom of M/N), SBO = 8 K-rows x atom; a step
          adds 16 rows.  MN-major unswizzled swaps the roles: LBO = 128 (8 K-rows),
          SBO = box (next 8 of M/N).

        The start is the unswizzled address and the base-offset field is 0, so ``base_addr``
        must be aligned to the swizzle repeat: the hardware XORs absolute address bits.
        ``mn_8bit``: the reader takes 8-bit MN-major operands (tcgen05's ``kind::f8f6f4``; the
        canonical forms are in bytes, the same for every element width); wgmma does not.
        """
        if base_addr % self.alignment:
            raise ValueError(f"base address {base_addr:#x} is not {self.alignment}-B aligned")
        if not 0 <= k_step < self.k_steps:
            raise ValueError(f"k_step {k_step} out of range [0, {self.k_steps})")
        k0 = k_step * self.k_per_step
        if self.major == "k":
            if mn_start % 8 or not 0 <= mn_start < self.rows:
                raise ValueError(f"mn_start {mn_start} is not a row group of {self.rows} rows")
            start = self._linear(_ints(mn_start), _ints(k0))
            lbo, sbo = (16, 8 * self.atom_bytes) if self.swizzle else (self.box_bytes, 128)
        else:
            if self.elem_bytes != 2 and not (mn_8bit and self.elem_bytes == 1):
                raise ValueError("MN-major wgmma operands are f16/bf16 only (PTX-FACTS §1, tA/tB)")
            if mn_start % self.box_cols or not 0 <= mn_start < self.cols:
                raise ValueError(f"mn_start {mn_start} is not a box of {self.cols} cols")
            start = self._linear(_ints(k0), _ints(mn_start))
            lbo, sbo = (self.box_bytes, 8 * self.atom_bytes) if self.swizzle else (128, self.box_bytes)
        return encode_descriptor(base_addr + int(start), lbo, sbo, self.swizzle)

    def __str__(self) -> str:
        perm = ", kperm" if self.kperm else ""
        return f"#smem<{self.rows}x{self.cols}x{self.dtype.name}, {self.major}, sw{self.swizzle}{perm}>"


#: Rows (of A's M or B's N) and K blocks one 512-byte block of scale factors holds: what one
#: ``tcgen05.cp .32x128b.warpx4`` moves into four tensor-memory columns (docs/block_scaled.md §5).
SCALE_ATOM_ROWS = 128
SCALE_ATOM_BLOCKS = 4
SCALE_ATOM_BYTES = 512


def scale_byte(m: Any, j: Any, mn_atoms: int) -> Any:
    """Byte offset of the scale of row ``m`` (of M or N) and K block ``j`` in a tile of
    ``tcgen05.mma ... block_scale`` scale factors: 512-byte blocks of 128 rows x 4 K blocks, K's
    blocks outer ([k block][mn block]), and inside one, row ``m`` at ``16 (m % 32) + 4 (m / 32
    % 4)`` and its K block after that (CUTLASS's and ThunderKittens' layout).  ``m`` and ``j``
    are ints, numpy arrays or codegen symbols (only ``//``, ``%``, ``*`` and ``+`` by constants)."""
    atom = (j // SCALE_ATOM_BLOCKS) * mn_atoms + m // SCALE_ATOM_ROWS
    return atom * SCALE_ATOM_BYTES + (m % 32) * 16 + (m // 32 % 4) * 4 + j % SCALE_ATOM_BLOCKS


@dataclass(frozen=True)
class ScaleLayout(SharedLayout):
    """A block-scaled product's scale factors in shared memory (``#scales<RxC, k|mn>``, NVFP4's
    ``#scales<RxCxf8e4m3, k|mn>``), as ``tcgen05.cp`` copies them into tensor memory for
    ``tcgen05.mma ... block_scale``: A's [M, K/B] (``major`` "k": rows are M) or B's [K/B, N]
    (``major`` "mn": columns are N), one f8e8m0 a 32-run of K (or an f8e4m3 a 16-run), at
    :func:`scale_byte`.  Written by the threads, never by TMA (a
    row's few bytes are below TMA's 16-byte box), and read only by ``tcgen05.cp``."""

    dtype: DType = dtypes.f8e8m0
    swizzle: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in (dtypes.f8e8m0, dtypes.f8e4m3) or self.swizzle or self.kperm:
            raise ValueError("scale factors are f8e8m0 (or NVFP4's f8e4m3), unswizzled")
        if self.major not in ("k", "mn"):
            raise ValueError(f"major is 'k' or 'mn', not {self.major!r}")
        if self.rows <= 0 or self.cols <= 0 or self.mn % 16:
            raise ValueError(f"scale factors of a multiple of 16 rows (M or N), got {self.rows}x{self.cols}")

    @property
    def mn(self) -> int:
        """Rows of the product's operand these scale (A's M or B's N)."""
        return self.rows if self.major == "k" else self.cols

    @property
    def blocks(self) -> int:
        """K blocks (of 32 values, or NVFP4's 16) the scales cover."""
        return self.cols if self.major == "k" else self.rows

    @property
    def mn_atoms(self) -> int:
        return -(-self.mn // SCALE_ATOM_ROWS)

    @property
    def k_atoms(self) -> int:
        return -(-self.blocks // SCALE_ATOM_BLOCKS)

    @property
    def atoms(self) -> int:
        """512-byte blocks, each one ``tcgen05.cp`` into four columns, in shared-memory order."""
        return self.mn_atoms * self.k_atoms

    @property
    def size_bytes(self) -> int:
        return self.atoms * SCALE_ATOM_BYTES

    @property
    def alignment(self) -> int:
        return 128

    def byte(self, row: Any, col: Any) -> Any:
        """:meth:`offset` for run-time coordinates too (codegen's symbols)."""
        m, j = (row, col) if self.major == "k" else (col, row)
        return scale_byte(m, j, self.mn_atoms)

    def offset(self, row: object, col: object) -> np.ndarray:
        r, c = _ints(row), _ints(col)
        _check_range("row", r, self.rows)
        _check_range("col", c, self.cols)
        return np.asarray(self.byte(r, c), np.int64)

    def tma_box(self) -> TmaBox:
        raise ValueError("scale factors are written by the threads, not copied by TMA")

    def descriptor(self, base_addr: int, k_step: int = 0, mn_start: int = 0, mn_8bit: bool = False) -> int:
        raise ValueError("scale factors are read by tcgen05.cp (blackwell.scale_descriptor), not by an MMA")

    def __str__(self) -> str:
        dt = "" if self.dtype == dtypes.f8e8m0 else f"x{self.dtype.name}"  # (E8M0 is the default)
        return f"#scales<{self.rows}x{self.cols}{dt}, {self.major}>"


def read_as(layout: SharedLayout, major: str | None) -> SharedLayout:
    """``layout`` as a wgmma reading it with ``major`` sees it (None: its own): the same bytes,
    since the major changes descriptors, not offsets."""
    return layout if major is None or major == layout.major else replace(layout, major=major)


def encode_descriptor(start: int, lbo: int, sbo: int, swizzle_bytes: int) -> int:
    """Pack a wgmma matrix descriptor (PTX-FACTS §2 table, sm_90 column)."""
    for name, v in (("start", start), ("LBO", lbo), ("SBO", sbo)):
        if v % 16 or not 0 <= v < 1 << 18:
            raise ValueError(f"{name} {v:#x} must be 16-B aligned and below 256 KiB")
    return ((start & 0x3FFFF) >> 4) | (lbo >> 4) << 16 | (sbo >> 4) << 32 | _DESC_SWIZZLE_MODE[swizzle_bytes] << 62


def descriptor_address(desc: int, major: str, mn: object, k: object, dtype: DType) -> np.ndarray:
    """Shared address of operand element (mn, k) of one wgmma K-step read through ``desc``:
    the hardware's view, decoded from the fields (CUTLASS ``make_gmma_desc`` canonical forms,
    see ``SharedLayout.descriptor``).  ``k`` is in [0, 32 B of K); base offset must be 0."""
    if (desc >> 49) & 7:
        raise ValueError("descriptors with a nonzero base offset are not supported")
    start = (desc & 0x3FFF) << 4
    lbo, sbo = ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4
    sw = _DESC_MODE_SWIZZLE[(desc >> 62) & 3]
    eb, m, kk = dtype.bits // 8, _ints(mn), _ints(k)
    atom, per16 = sw or 16, 16 // eb
    if major == "k":
        if sw:
            lin = (m % 8) * atom + (m // 8) * sbo + kk * eb
        else:
            lin = (m % 8) * 16 + (m // 8) * sbo + (kk % per16) * eb + (kk // per16) * lbo
    elif sw:
        lin = (m % (atom // eb)) * eb + (m // (atom // eb)) * lbo + (kk % 8) * atom + (kk // 8) * sbo
    else:
        lin = (m % per16) * eb + (m // per16) * sbo + (kk % 8) * 16 + (kk // 8) * lbo
    return swizzle(start + lin, sw)


# --------------------------------------------------------------------------- registers
class DistributedLayout(Protocol):
    """What every register layout answers (docs/hopper.md §2).  Value ``i`` of thread ``t`` is
    element ``thread_coords(t)[a] + reg_coords(i)[a]`` along each axis ``a``.  The split is
    what lets codegen compute the thread part once from ``%tid`` and add constants per value."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def threads(self) -> int: ...

    @property
    def regs(self) -> int: ...

    def thread_coords(self, t: Any) -> tuple[Any, ...]: ...

    def reg_coords(self, i: int) -> tuple[int, ...]: ...

    def coords(self, thread: object, reg: object) -> tuple[np.ndarray, ...]: ...


class _Distributed:
    """``coords`` for any layout that defines ``thread_coords`` and ``reg_coords``, so the
    vectorized form cannot drift from the parts codegen uses."""

    # Supplied by each layout, as fields or properties; declared here for readers and checkers.
    shape: tuple[int, ...]
    threads: int
    regs: int
    thread_coords: Callable[[Any], tuple[Any, ...]]
    reg_coords: Callable[[int], tuple[int, ...]]

    @cached_property
    def _reg_table(self) -> np.ndarray:
        """``reg_coords`` of every value, shape (rank, regs)."""
        return np.array([self.reg_coords(i) for i in range(self.regs)], dtype=np.int64).reshape(
            self.regs, len(self.shape)).T

    def coords(self, thread: object, reg: object) -> tuple[np.ndarray, ...]:
        """The element held as value ``reg`` by ``thread`` (broadcast together), per axis."""
        t, i = _ints(thread), _ints(reg)
        _check_range("thread", t, self.threads)
        _check_range("reg", i, self.regs)
        zero = np.zeros(np.broadcast_shapes(t.shape, i.shape), dtype=np.int64)
        return tuple(zero + tc + part[i] for tc, part in zip(self.thread_coords(t), self._reg_table))


# Arithmetic for ``thread_coords`` that drops operations a constant factor makes trivial, so
# codegen emits no ``x * 1`` or ``x % 1``.  Symbols support only operators with an int right
# operand (and ``int + sym``): these never compare ``x`` or put it on the right.
def _is_zero(x: Any) -> bool:
    return isinstance(x, int) and x == 0


def _add(a: Any, b: Any) -> Any:
    return b if _is_zero(a) else a if _is_zero(b) else a + b


def _mul(x: Any, k: int) -> Any:
    return 0 if k == 0 or _is_zero(x) else x if k == 1 else x * k


def _div(x: Any, k: int) -> Any:
    return x if k == 1 else x // k


def _mod(x: Any, k: int) -> Any:
    return 0 if k == 1 else x % k


#: 64-row wgmma slices a warpgroup may hold (its rows: at most 256, one TMA box of A).
MAX_SLICES = 4


def _acc_owner(row: np.ndarray, col: np.ndarray, n: int, slices: int) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of the §1 formula (see ``_Fragment``)."""
    g, s, w, r16 = row // (64 * slices), row // 64 % slices, row // 16 % 4, row % 16
    thread = 128 * g + 32 * w + 4 * (r16 % 8) + col % 8 // 2
    reg = s * (n // 2) + 4 * (col // 8) + 2 * (r16 // 8) + col % 2
    return thread, reg


def _frag_text(cls_name: str, n: int, warpgroups: int, slices: int) -> str:
    return (f"#{cls_name}<{n}" + (f", wg={warpgroups}" if warpgroups != 1 else "")
            + (f", slices={slices}" if slices != 1 else "") + ">")


class StmatrixX4(NamedTuple):
    """The accumulator-to-shared epilogue with ``stmatrix.x4`` (PTX-FACTS §6), one instruction
    per 16 columns of each 64-row slice.  Instruction (m, s), slice m and columns 16s on:
    thread t's lane address is element (``rows[t] + 64 m``, ``cols[s, t]``), the first of 8
    contiguous 16-bit values; its b32 register j packs accumulator registers
    ``regs[m, s, j, 0]`` (low half) and ``regs[m, s, j, 1]`` (high half)."""

    rows: np.ndarray  # (threads,): the row in slice 0
    cols: np.ndarray  # (n // 16, threads)
    regs: np.ndarray  # (slices, n // 16, 4, 2)


@dataclass(frozen=True)
class _Fragment(_Distributed):
    """``slices`` 64 x n register fragments per warpgroup, each laid out by PTX-FACTS §1
    (CUTLASS CLayout_64xN), warpgroup g = t // 128 owning rows [64 S g, 64 S (g + 1)) for S
    slices: w = t/32 % 4, l = t%32, value i in slice m = i // (n/2), j = i % (n/2):
    row = 64 S g + 64 m + 16w + l/4 + 8((j>>1)&1), col = 8(j>>2) + 2(l%4) + (j&1).
    Value i of a thread is its register i for f32; packed 16-bit values share b32 register
    i // 2 (i even = low half).  Each slice is what one m64 wgmma reads or writes, so a
    warpgroup of S slices issues S wgmmas a K step into independent accumulators (at most
    ``MAX_SLICES``: 256 rows, the most one TMA box of A holds)."""

    n: int
    warpgroups: int = 1
    slices: int = 1

    _granule = 8  # columns come in multiples of this (not a field: no annotation)

    def __post_init__(self) -> None:
        if self.n <= 0 or self.n % self._granule:
            raise ValueError(f"columns must be a positive multiple of {self._granule}, got {self.n}")
        if self.warpgroups < 1:
            raise ValueError(f"warpgroups must be at least 1, got {self.warpgroups}")
        if not 1 <= self.slices <= MAX_SLICES:
            raise ValueError(f"a warpgroup holds 1 to {MAX_SLICES} slices of 64 rows, got {self.slices}")

    @property
    def shape(self) -> tuple[int, int]:
        return 64 * self.slices * self.warpgroups, self.n

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    @property
    def slice_regs(self) -> int:
        """Values (f32 registers) per thread of one 64-row slice."""
        return self.n // 2

    @property
    def regs(self) -> int:
        """Values (f32 registers) per thread."""
        return self.slices * self.slice_regs

    def warp_rows(self, t: Any) -> Any:
        """The first of the 16 rows of slice 0 that thread ``t``'s warp holds."""
        if self.slices == 1:
            # 64g + 16(w%4) = 16 * (t // 32): the warpgroup is the high bits of the warp index.
            return t // 32 * 16
        return t // 128 * (64 * self.slices) + t // 32 % 4 * 16

    def thread_coords(self, t: Any) -> tuple[Any, Any]:
        return self.warp_rows(t) + t % 32 // 4, t % 4 * 2

    def reg_coords(self, i: int) -> tuple[int, int]:
        m, j = divmod(i, self.slice_regs)
        return 64 * m + 8 * ((j >> 1) & 1), 8 * (j >> 2) + (j & 1)

    def owner(self, row: object, col: object) -> tuple[np.ndarray, np.ndarray]:
        r, c = _ints(row), _ints(col)
        _check_range("row", r, self.shape[0])
        _check_range("col", c, self.n)
        return _acc_owner(r, c, self.n, self.slices)


@dataclass(frozen=True)
class WgmmaAccumulator(_Fragment):
    """A wgmma m64nN accumulator (``#wgmma_acc<N>``; ``#wgmma_acc<N, wg=2>`` for 128 x N over
    two warpgroups; ``#wgmma_acc<N, wg=2, slices=2>`` for 256 x N, 128 rows a warpgroup)."""

    def stmatrix_x4(self) -> StmatrixX4:
        """PTX-FACTS §6: pack P[2q+h] = (d[4q+2h], d[4q+2h+1]); instruction s of a slice stores
        P[4s..4s+3], cols 16s..16s+15 of each warp's 16 rows of the slice; lane t addresses
        row 8((t/8)&1) + t%8 of those rows, col block 2s + t/16."""
        if self.n % 16:
            raise ValueError(f"stmatrix.x4 stores 16 columns at a time; N = {self.n}")
        t = np.arange(self.threads)
        rows, col0 = self.stmatrix_lane(t)
        s = np.arange(self.n // 16)
        cols = 16 * s[:, None] + col0[None, :]
        m = np.arange(self.slices)
        regs = (self.slice_regs * m[:, None, None, None] + 8 * s[None, :, None, None]
                + 2 * np.arange(4)[None, None, :, None] + np.arange(2)[None, None, None, :])
        return StmatrixX4(rows, cols, regs)

    def stmatrix_lane(self, t: Any) -> tuple[Any, Any]:
        """Row (in slice 0) and first column of the 8 values thread ``t`` addresses in
        instruction (0, 0) of :meth:`stmatrix_x4` (instruction (m, s): 64 m rows and 16 s
        columns on).  Written with operators that numpy arrays and codegen's symbols share,
        so both compute the same addresses."""
        lane = t % 32
        return self.warp_rows(t) + lane // 8 % 2 * 8 + lane % 8, lane // 16 * 8

    def __str__(self) -> str:
        return _frag_text("wgmma_acc", self.n, self.warpgroups, self.slices)


@dataclass(frozen=True)
class WgmmaOperandA(_Fragment):
    """The A operand of an RS wgmma from registers, f16/bf16, 64 x K per warpgroup
    (``#wgmma_a<K>``).  One k16 step is 64 x 16: b32 registers 4s..4s+3 (values 8s..8s+7)
    hold K-step s, so 64 x K is the §1 formula with col in [0, K) - the accumulator layout of
    a 64 x K tile, which is why an accumulator converts to an A operand without shuffles."""

    _granule = 16

    @property
    def k_steps(self) -> int:
        return self.n // 16

    def step_registers(self, k_step: int, slice_: int = 0) -> range:
        """The four b32 registers {a0, a1, a2, a3} of K-step ``k_step`` of 64-row slice ``slice_``."""
        if not 0 <= k_step < self.k_steps:
            raise ValueError(f"k_step {k_step} out of range [0, {self.k_steps})")
        if not 0 <= slice_ < self.slices:
            raise ValueError(f"slice {slice_} out of range [0, {self.slices})")
        first = self.slice_regs // 2 * slice_ + 4 * k_step
        return range(first, first + 4)

    def __str__(self) -> str:
        return _frag_text("wgmma_a", self.n, self.warpgroups, self.slices)


def a8_logical_col(c: Any) -> Any:
    """The column of a 32-wide block of an accumulator that ``WgmmaOperandA8`` hands wgmma as
    K position ``c``: the thread holding k = 4q + 2g + e (q = lane % 4) holds accumulator
    columns 8g + 2q + e, and 16 on for k >= 16.  Operators only (ints, arrays, codegen symbols)."""
    return c - c % 16 + c // 2 % 2 * 8 + c // 4 % 4 * 2 + c % 2


def a8_stored_col(c: Any) -> Any:
    """The inverse of :func:`a8_logical_col`: where logical column ``c`` goes."""
    return c - c % 16 + c // 8 % 2 * 2 + c // 2 % 4 * 4 + c % 2


@dataclass(frozen=True)
class WgmmaOperandA8(_Fragment):
    """An 8-bit A operand of an RS wgmma from registers, 64 x K per warpgroup (``#wgmma_a8<K>``),
    holding each element where the accumulator of a 64 x K tile holds it: an accumulator (P in
    attention) becomes one without moving a value.  wgmma reads K-step s from b32 registers
    packed by ``step_values``, which in the hardware's order (the emulator's ``_a8_register``, which
    no compiler code may derive from) is the tile's
    columns permuted by ``a8_logical_col``; the B operand is stored permuted alike
    (``SharedLayout.kperm``), so the product is the same."""

    _granule = 32

    @property
    def k_steps(self) -> int:
        return self.n // 32

    def step_values(self, k_step: int, slice_: int = 0) -> list[list[int]]:
        """The thread's values packed into the four b32 registers of K-step ``k_step`` of 64-row
        slice ``slice_``, bytes 0..3 each: register r byte b is accumulator value
        j = 16 s + 4 (2 (r>>1) + (b>>1)) + 2 (r&1) + (b&1) of the slice, at the element
        (row + 8 (r&1), 32 s + a8_logical_col(k)) that wgmma reads as (row, k)."""
        if not 0 <= k_step < self.k_steps:
            raise ValueError(f"k_step {k_step} out of range [0, {self.k_steps})")
        if not 0 <= slice_ < self.slices:
            raise ValueError(f"slice {slice_} out of range [0, {self.slices})")
        first = self.slice_regs * slice_ + 16 * k_step
        return [[first + 4 * (2 * (r >> 1) + (b >> 1)) + 2 * (r & 1) + (b & 1) for b in range(4)]
                for r in range(4)]

    def __str__(self) -> str:
        return _frag_text("wgmma_a8", self.n, self.warpgroups, self.slices)


@dataclass(frozen=True)
class TmemAccumulator(_Distributed):
    """A tcgen05 M=128 f32 accumulator read out of tensor memory (``#tmem_acc<N, wg=G>``,
    PTX-FACTS §7): row i is TMEM lane i, column j is column j, and ``tcgen05.ld.32x32b`` gives
    thread t of warp w the row 32(w % 4) + t % 32, so a warpgroup's thread t holds row t % 128.
    Warpgroup g holds columns [g N/G, (g + 1) N/G) of every row (its registers, in order)."""

    n: int
    warpgroups: int = 1

    def __post_init__(self) -> None:
        if self.warpgroups < 1 or self.n <= 0 or self.n % (8 * self.warpgroups):
            raise ValueError(f"#tmem_acc<{self.n}, wg={self.warpgroups}>: each warpgroup holds a positive "
                             f"multiple of 8 columns")

    @property
    def shape(self) -> tuple[int, int]:
        return 128, self.n

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    @property
    def regs(self) -> int:
        return self.n // self.warpgroups

    def thread_coords(self, t: Any) -> tuple[Any, Any]:
        if self.warpgroups == 1:
            return t % 128, 0
        return t % 128, t // 128 * self.regs

    def reg_coords(self, i: int) -> tuple[int, int]:
        return 0, i

    def __str__(self) -> str:
        return f"#tmem_acc<{self.n}" + (f", wg={self.warpgroups}" if self.warpgroups != 1 else "") + ">"


def is_accumulator(layout: object) -> bool:
    """Whether ``layout`` is an MMA accumulator's: wgmma's registers or tcgen05's tensor memory."""
    return isinstance(layout, (WgmmaAccumulator, TmemAccumulator))


def _fit(what: str, extent: int, grid: int) -> None:
    """A thread grid either tiles the extent (repeating) or is a multiple of it (replicas)."""
    if extent % grid and grid % extent:
        raise ValueError(f"the thread grid spans {grid} {what}, which neither divides nor is a multiple of {extent}")


def _dims_text(dims: tuple[int, ...]) -> str:
    return "x".join(map(str, dims))


@dataclass(frozen=True)
class Blocked(_Distributed):
    """``#blocked<RxC, vec=V, lanes=TRxTC, warps=WRxWC>`` (rank 1: ``#blocked<C, vec=V,
    lanes=32, warps=W>``): each thread holds runs of ``vec`` contiguous columns, so a run is
    one vector load or store.  Thread t is lane l = t%32 of warp w = t//32; lane l sits at
    (l // TC, l % TC) of the warp's TR x TC runs, warp w at (w // WC, w % WC) of the CTA's
    WR x WC warp tiles.  The thread grid spans TR*WR rows and V*TC*WC columns:

    - a tile larger than the grid repeats it; value i enumerates (rep_r, rep_c, v) row-major,
      row = rep_r*TR*WR + wr*TR + lr, col = rep_c*V*TC*WC + (wc*TC + lc)*V + v;
    - a grid larger than the tile (a multiple of it) wraps modulo the extent: several
      threads hold the same elements (replicas), which is how a small tile uses all threads.

    A rank-1 layout is the rank-2 formula with one row (TR = WR = 1) and no row coordinate.
    """

    shape: tuple[int, ...]
    vec: int
    lanes: tuple[int, ...]
    warps: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("shape", "lanes", "warps"):  # accept lists; compare and hash as tuples
            object.__setattr__(self, name, tuple(int(x) for x in getattr(self, name)))
        rank = len(self.shape)
        if rank not in (1, 2):
            raise ValueError(f"blocked layouts are rank 1 or 2, got shape {self.shape}")
        if len(self.lanes) != rank or len(self.warps) != rank:
            raise ValueError(f"lanes {self.lanes} and warps {self.warps} need one entry per axis of {self.shape}")
        if min(self.shape + self.lanes + self.warps + (self.vec,)) < 1:
            raise ValueError("shape, vec, lanes and warps must be positive")
        if math.prod(self.lanes) != 32:
            raise ValueError(f"lanes {_dims_text(self.lanes)} must cover the 32 lanes of a warp")
        if self.threads % 128:
            raise ValueError(f"warps {_dims_text(self.warps)} make {self.threads} threads, not whole warpgroups")
        r, c, tr, tc, wr, wc = self._dims
        if c % self.vec:
            raise ValueError(f"runs of vec={self.vec} do not divide the {c} columns")
        _fit("rows", r, tr * wr)
        _fit("columns", c, self.vec * tc * wc)

    @property
    def _dims(self) -> tuple[int, int, int, int, int, int]:
        """(R, C, TR, TC, WR, WC), a rank-1 layout being one row."""
        if len(self.shape) == 1:
            return 1, self.shape[0], 1, self.lanes[0], 1, self.warps[0]
        return (self.shape[0], self.shape[1], self.lanes[0], self.lanes[1], self.warps[0], self.warps[1])

    @property
    def threads(self) -> int:
        return 32 * math.prod(self.warps)

    @property
    def _reps(self) -> tuple[int, int]:
        r, c, tr, tc, wr, wc = self._dims
        return max(r // (tr * wr), 1), max(c // (self.vec * tc * wc), 1)

    @property
    def regs(self) -> int:
        reps_r, reps_c = self._reps
        return reps_r * reps_c * self.vec

    def thread_coords(self, t: Any) -> tuple[Any, ...]:
        r, c, tr, tc, wr, wc = self._dims
        lane, warp = t % 32, t // 32
        # t < threads, so warp // WC < WR and lane // TC < TR need no modulo, and with a
        # single row of lanes (warps) the lane (warp) index is the column index as it is.
        lane_r = 0 if tr == 1 else _div(lane, tc)
        lane_c = lane if tr == 1 else _mod(lane, tc)
        warp_r = 0 if wr == 1 else _div(warp, wc)
        warp_c = warp if wr == 1 else _mod(warp, wc)
        col = _mul(_add(_mul(warp_c, tc), lane_c), self.vec)
        if self.vec * tc * wc > c:  # replicas: the grid wraps around the tile
            col = _mod(col, c)
        if len(self.shape) == 1:
            return (col,)
        row = _add(_mul(warp_r, tr), lane_r)
        if tr * wr > r:
            row = _mod(row, r)
        return row, col

    def reg_coords(self, i: int) -> tuple[int, ...]:
        _, _, tr, tc, wr, wc = self._dims
        reps_c = self._reps[1]
        rep_r, rest = divmod(i, reps_c * self.vec)
        rep_c, v = divmod(rest, self.vec)
        col = rep_c * self.vec * tc * wc + v
        return (col,) if len(self.shape) == 1 else (rep_r * tr * wr, col)

    def __str__(self) -> str:
        return (f"#blocked<{_dims_text(self.shape)}, vec={self.vec}, lanes={_dims_text(self.lanes)}, "
                f"warps={_dims_text(self.warps)}>")


def _pow2_at_most(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _largest_pow2_dividing(n: int, limit: int) -> int:
    """The largest power of two <= ``limit`` that divides ``n``."""
    p = _pow2_at_most(limit)
    while n % p:
        p //= 2
    return p


def choose_blocked(shape: tuple[int, ...], elem_bytes: int, threads: int) -> Blocked:
    """The ``Blocked`` layout select-layouts gives a tile that no wgmma produces.

    - ``vec``: the widest run of at most 16 B (one vector access) that divides the columns,
      narrowed while the tile has fewer runs than threads (wide runs would leave threads idle);
    - lanes: as many along columns as there are runs in a row (up to 32), so a warp reads
      contiguous memory; the rest along rows;
    - warps: along rows as far as the rows go without repeating (a row reduction then stays
      inside one warp's shuffles), the rest along columns.

    When the columns do not fit that grid (extents that are not powers of two), or it would
    hold replicas although the tile has an element for every thread, fewer warps on rows and
    then narrower runs are tried.  A tile smaller than the CTA wraps (replicas).  Raises
    ValueError when no ``Blocked`` layout exists (e.g. 12 x 12: 32 lanes neither tile nor
    repeat 12).
    """
    shape = tuple(int(x) for x in shape)
    if len(shape) not in (1, 2) or min(shape, default=0) < 1:
        raise ValueError(f"choose_blocked takes a rank-1 or rank-2 shape of positive extents, got {shape}")
    if elem_bytes < 1 or elem_bytes > 16:
        raise ValueError(f"element size {elem_bytes} B is not between 1 and 16")
    if threads < 128 or threads % 128:
        raise ValueError(f"threads must be a positive multiple of 128, got {threads}")
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    vec = _largest_pow2_dividing(cols, 16 // elem_bytes)
    while vec > 1 and rows * cols // vec < threads:
        vec //= 2
    warps = threads // 32
    error, replicated = "", None
    for v in (vec >> k for k in range(vec.bit_length())):
        if len(shape) == 1:
            candidates = [((32,), (warps,))]
        else:
            lanes_c = _largest_pow2_dividing(cols // v, 32)
            lanes_r = 32 // lanes_c
            warps_r = 1
            while warps % (warps_r * 2) == 0 and rows % (lanes_r * warps_r * 2) == 0:
                warps_r *= 2
            candidates = [((lanes_r, lanes_c), (wr, warps // wr))
                          for wr in (warps_r >> k for k in range(warps_r.bit_length()))]
        for lanes, warp_grid in candidates:
            try:
                lay = Blocked(shape, v, lanes, warp_grid)
            except ValueError as e:
                error = error or str(e)
                continue
            if lay.threads * lay.regs == rows * cols:
                return lay
            replicated = replicated or lay  # only if every choice has replicas
    if replicated is None:
        pow2 = _dims_text(tuple(1 << (x - 1).bit_length() for x in shape))
        raise ValueError(f"a {_dims_text(shape)} tile does not spread over the program's {threads} threads "
                         f"({error}): give it power-of-two extents, e.g. {pow2}")
    return replicated


@dataclass(frozen=True)
class Slice(_Distributed):
    """``#slice<parent, axis=A>``: the tile ``parent`` becomes when reduced along ``axis``
    (``keep``: the axis stays, with extent 1).  Each thread keeps one *slot* per distinct
    value part of the kept coordinate among its parent values, in the order of first
    appearance; ``slot_of(i)`` is the slot parent value ``i`` folds into, and a slot's
    element is the kept coordinate those values share.  Threads that differ only in the
    reduced coordinate hold the same slots (replicas), so broadcasting back is free."""

    parent: DistributedLayout
    axis: int
    keep: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.parent, _Distributed):
            raise ValueError(f"{self.parent} is not a register layout")
        rank = len(self.parent.shape)
        if rank < 2:
            raise ValueError(f"a slice of rank-1 {self.parent} would be a scalar, not a layout")
        if not 0 <= self.axis < rank:
            raise ValueError(f"axis {self.axis} out of range for the rank-{rank} {self.parent}")

    def _drop(self, coords: tuple[Any, ...]) -> tuple[Any, ...]:
        a = self.axis
        return coords[:a] + ((0,) if self.keep else ()) + coords[a + 1:]

    @property
    def shape(self) -> tuple[int, ...]:
        a, shape = self.axis, self.parent.shape
        return shape[:a] + ((1,) if self.keep else ()) + shape[a + 1:]

    @property
    def threads(self) -> int:
        return self.parent.threads

    @cached_property
    def _slots(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(slot of each parent value, first parent value of each slot)."""
        index: dict[tuple[int, ...], int] = {}
        slot_of, first = [], []
        for i in range(self.parent.regs):
            kept = self._drop(self.parent.reg_coords(i))
            if kept not in index:
                index[kept] = len(first)
                first.append(i)
            slot_of.append(index[kept])
        return tuple(slot_of), tuple(first)

    @property
    def regs(self) -> int:
        return len(self._slots[1])

    def slot_of(self, i: int) -> int:
        """The slot parent value ``i`` reduces into."""
        return self._slots[0][i]

    def thread_coords(self, t: Any) -> tuple[Any, ...]:
        return self._drop(self.parent.thread_coords(t))

    def reg_coords(self, i: int) -> tuple[int, ...]:
        return self._drop(self.parent.reg_coords(self._slots[1][i]))

    def __str__(self) -> str:
        return f"#slice<{self.parent}, axis={self.axis}" + (", keep>" if self.keep else ">")


def _ravel(coords: tuple[Any, ...], shape: tuple[int, ...]) -> Any:
    """The row-major position of ``coords`` in ``shape`` (ints, arrays or codegen symbols)."""
    out: Any = 0
    for c, n in zip(coords, shape):
        out = _add(_mul(out, n), c)
    return out


def _unravel(pos: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """The coordinates of row-major position ``pos`` in ``shape``."""
    out = []
    for k, n in enumerate(shape):
        c = _div(pos, math.prod(shape[k + 1:]))
        out.append(_mod(c, n) if k else c)
    return tuple(out)


class _SameRegisters(_Distributed):
    """A layout that sees ``parent``'s values in the same registers: its threads, and as many
    values a thread."""

    parent: DistributedLayout

    @property
    def threads(self) -> int:
        return self.parent.threads

    @property
    def regs(self) -> int:
        return self.parent.regs


@dataclass(frozen=True)
class Reshaped(_SameRegisters):
    """``#reshape<parent, RxC>``: the values of ``parent`` in the same registers, seen as a tile
    of ``shape`` with the same row-major element order (``x.reshape(...)``).  A thread's part
    and a value's part of the row-major position must add without carrying across the new
    axes (:func:`reshape_layout` checks), so the split of the distributed-layout protocol
    survives: ``thread_coords`` unravels the thread's position, ``reg_coords`` the value's."""

    parent: DistributedLayout
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(x) for x in self.shape))
        if math.prod(self.shape) != math.prod(self.parent.shape):
            raise ValueError(f"cannot reshape {self.parent} to {_dims_text(self.shape)}: the element counts differ")

    def thread_coords(self, t: Any) -> tuple[Any, ...]:
        return _unravel(_ravel(self.parent.thread_coords(t), self.parent.shape), self.shape)

    def reg_coords(self, i: int) -> tuple[int, ...]:
        return tuple(int(c) for c in _unravel(_ravel(self.parent.reg_coords(i), self.parent.shape), self.shape))

    def __str__(self) -> str:
        return f"#reshape<{self.parent}, {_dims_text(self.shape)}>"


@dataclass(frozen=True)
class Transposed(_SameRegisters):
    """``#transpose<parent>``: the values of a 2-D ``parent`` in the same registers, seen as the
    transposed tile (``x.T`` of a register tile moves nothing): value ``i`` of thread ``t`` is
    element ``(c, r)`` where ``parent`` has ``(r, c)``."""

    parent: DistributedLayout

    def __post_init__(self) -> None:
        if len(self.parent.shape) != 2:
            raise ValueError(f"only a 2-D layout transposes, not {self.parent}")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.parent.shape[::-1])

    def thread_coords(self, t: Any) -> tuple[Any, ...]:
        return tuple(self.parent.thread_coords(t)[::-1])

    def reg_coords(self, i: int) -> tuple[int, ...]:
        return tuple(self.parent.reg_coords(i)[::-1])

    def __str__(self) -> str:
        return f"#transpose<{self.parent}>"


def transpose_layout(layout: DistributedLayout) -> DistributedLayout:
    """The layout of ``x.T`` for ``x`` in ``layout``: the same registers."""
    return layout.parent if isinstance(layout, Transposed) else Transposed(layout)


def transposes(src: DistributedLayout, dst: DistributedLayout) -> bool:
    """Whether every thread holds, as value ``i`` of ``dst``, the transpose of its value ``i`` of
    ``src`` (a ``.T`` that moves nothing)."""
    if src.threads != dst.threads or src.regs != dst.regs or tuple(src.shape[::-1]) != tuple(dst.shape):
        return False
    cs, cd = all_coords(src), all_coords(dst)
    return bool(np.array_equal(cs[0], cd[1]) and np.array_equal(cs[1], cd[0]))


def same_registers(src: DistributedLayout, dst: DistributedLayout) -> bool:
    """Whether every thread holds, as value ``i`` of ``dst``, the element at the same row-major
    position as its value ``i`` of ``src`` (a reshape that moves nothing)."""
    if src.threads != dst.threads or src.regs != dst.regs or math.prod(src.shape) != math.prod(dst.shape):
        return False
    t, i = np.arange(src.threads)[:, None], np.arange(src.regs)[None, :]
    cs, cd = src.coords(t, i), dst.coords(t, i)
    # Row-major positions are a bijection only inside the shapes: a carry shows as a coordinate past its extent.
    if any(np.any((c < 0) | (c >= n)) for coords, shape in ((cs, src.shape), (cd, dst.shape))
           for c, n in zip(coords, shape)):
        return False
    return bool(np.array_equal(_ravel(cs, tuple(src.shape)), _ravel(cd, tuple(dst.shape))))


def reshape_layout(parent: DistributedLayout, shape: tuple[int, ...]) -> DistributedLayout:
    """``parent`` as a tile of ``shape`` in the same registers (row-major element order), or a
    ValueError saying why the thread and value parts of some element's position carry into
    each other's axes (then the reshape must move values between threads).  A reshape back to
    the shape a ``#reshape`` came from is that layout itself."""
    if isinstance(parent, Reshaped) and tuple(parent.parent.shape) == tuple(shape):
        return parent.parent
    lay = Reshaped(parent, tuple(shape))
    if not same_registers(parent, lay):
        raise ValueError(f"the values of {parent} do not stay in their threads' registers as a "
                         f"{_dims_text(lay.shape)} tile")
    return lay


@dataclass(frozen=True)
class Stacked(_Distributed):
    """``#stack<parent, axis=A, n=N>``: ``n`` tiles in ``parent`` as the elements of a new axis
    ``A`` (``tile.stack``): each thread holds the new axis whole, element ``p`` of it as its
    values ``p * parent.regs`` to ``(p + 1) * parent.regs - 1``."""

    parent: DistributedLayout
    axis: int
    n: int

    def __post_init__(self) -> None:
        if not 0 <= self.axis <= len(self.parent.shape) or self.n < 1:
            raise ValueError(f"cannot stack {self.n} of {self.parent} along axis {self.axis}")

    @property
    def shape(self) -> tuple[int, ...]:
        s = tuple(self.parent.shape)
        return s[:self.axis] + (self.n,) + s[self.axis:]

    @property
    def threads(self) -> int:
        return self.parent.threads

    @property
    def regs(self) -> int:
        return self.n * self.parent.regs

    def thread_coords(self, t: Any) -> tuple[Any, ...]:
        c = tuple(self.parent.thread_coords(t))
        return c[:self.axis] + (0,) + c[self.axis:]

    def reg_coords(self, i: int) -> tuple[int, ...]:
        p, j = divmod(i, self.parent.regs)
        c = tuple(self.parent.reg_coords(j))
        return c[:self.axis] + (p,) + c[self.axis:]

    def __str__(self) -> str:
        return f"#stack<{self.parent}, axis={self.axis}, n={self.n}>"


def picked_registers(whole: DistributedLayout, part: DistributedLayout, axis: int,
                     index: int) -> tuple[int, ...] | None:
    """The values of ``whole`` that element ``index`` along ``axis`` is, as a tile in
    ``part`` (``tile.take``'s result, one of ``tile.stack``'s operands); None unless ``part`` is
    ``take_layout(whole, axis)`` and each thread holds the axis whole (``take_registers``)."""
    if part != take_layout(whole, axis):
        return None
    return take_registers(whole, axis, index)


def take_layout(whole: DistributedLayout, axis: int) -> DistributedLayout:
    """The layout of ``whole.take(p, axis)``: the slice along ``axis`` (a stack's parts'
    layout when ``whole`` is one)."""
    if isinstance(whole, Stacked) and whole.axis == axis:
        return whole.parent
    return Slice(whole, axis)


def stack_layout(part: DistributedLayout, axis: int, n: int) -> DistributedLayout:
    """The layout of ``n`` tiles in ``part`` stacked along a new ``axis``: the layout ``part``
    is the slice of, where that holds the axis whole in each thread, else ``#stack``."""
    if isinstance(part, Slice) and not part.keep and part.axis == axis and part.parent.shape[axis] == n \
            and take_registers(part.parent, axis, 0) is not None:
        return part.parent
    return Stacked(part, axis, n)


@lru_cache(maxsize=256)
def take_registers(layout: DistributedLayout, axis: int, index: int) -> tuple[int, ...] | None:
    """For ``x.take(index, axis)`` of a tile in ``layout`` (the element ``index`` along
    ``axis``, which is dropped), whose result is in ``#slice<layout, axis=axis>``: the value of
    ``layout`` each slot of that slice takes; or None where some thread does not hold the whole
    axis in its own registers (so the pick, and ``tile.stack``'s inverse, would move values
    between threads)."""
    shape = tuple(layout.shape)
    if len(shape) < 2 or not 0 <= axis < len(shape) or not 0 <= index < shape[axis]:
        return None
    reg_part = np.array([layout.reg_coords(i)[axis] for i in range(layout.regs)], dtype=np.int64)
    if np.any(all_coords(layout)[axis] != reg_part[None, :]):
        return None  # some thread's own part of the axis is not 0
    held = {tuple(int(c) for c in layout.reg_coords(j)): j for j in range(layout.regs)}
    kept = Slice(layout, axis)
    out = []
    for i in range(kept.regs):
        coords = list(kept.reg_coords(i))
        coords.insert(axis, index)
        j = held.get(tuple(coords))
        if j is None:
            return None
        out.append(j)
    return tuple(out)


# --------------------------------------------------------------------------- conversions
@lru_cache(maxsize=256)
def all_coords(layout: DistributedLayout) -> tuple[np.ndarray, ...]:
    """Coordinates of every value of every thread: one ``[threads, regs]`` array per axis."""
    t = np.arange(layout.threads)[:, None]
    c = layout.coords(t, np.arange(layout.regs)[None, :])
    return tuple(np.broadcast_to(np.asarray(a, np.int64), (layout.threads, layout.regs)) for a in c)


def expand_is_free(src: DistributedLayout, dst: DistributedLayout, axis: int) -> bool:
    """Whether ``expand_dims`` at ``axis`` from ``src`` to ``dst`` moves no value: every thread
    holds, value for value, the same coordinates (0 on the new axis)."""
    if src.threads != dst.threads or src.regs != dst.regs:
        return False
    cs, cd = list(all_coords(src)), all_coords(dst)
    cs.insert(axis, np.zeros_like(cd[axis]))
    return len(cs) == len(cd) and all(np.array_equal(x, y) for x, y in zip(cs, cd))


def broadcast_slots(src: DistributedLayout, dst: DistributedLayout, axes: Sequence[int]) -> tuple[int, ...] | None:
    """For a broadcast along ``axes`` from the keep slice ``src`` to its parent ``dst``: the slot
    of ``src`` each value of ``dst`` copies (a register copy); None when ``src`` is not a keep
    slice of ``dst`` or its slots do not hold the coordinates ``dst``'s values need.  A tile of
    one element that every thread holds (``one_everywhere``) broadcasts to any layout of the
    same threads: every value copies it (a rank-1 tile has no keep slice)."""
    if one_everywhere(src) and src.threads == dst.threads:
        return (0,) * int(dst.regs)
    slot_of = getattr(src, "slot_of", None)
    if slot_of is None or getattr(src, "parent", None) != dst:
        return None
    slots = tuple(slot_of(i) for i in range(dst.regs))
    cs, cd = all_coords(src), all_coords(dst)
    for a in range(len(cd)):
        want = np.zeros_like(cd[a]) if a in axes else cd[a]
        if not np.array_equal(cs[a][:, list(slots)], want):
            return None
    return slots


def one_everywhere(layout: DistributedLayout) -> bool:
    """Whether ``layout`` is of a one-element tile that every thread holds, in one register."""
    return math.prod(layout.shape) == 1 and int(layout.regs) == 1


@lru_cache(maxsize=256)
def register_map(src: DistributedLayout, dst: DistributedLayout) -> tuple[int, ...] | None:
    """How a tile in layout ``src`` becomes layout ``dst`` without leaving its threads: for each
    value index of ``dst``, the value index of ``src`` that every thread holds at the same
    coordinates; None when some thread would need another thread's value (the conversion then
    goes through shared memory).  The select-layouts/lower-to-hopper passes, the emulator and
    codegen all ask this one function."""
    if src.threads != dst.threads or tuple(src.shape) != tuple(dst.shape):
        return None
    t = np.arange(src.threads)[:, None]
    s = np.stack([np.broadcast_to(c, (src.threads, src.regs)) for c in src.coords(t, np.arange(src.regs)[None, :])])
    d = np.stack([np.broadcast_to(c, (dst.threads, dst.regs)) for c in dst.coords(t, np.arange(dst.regs)[None, :])])
    out = []
    for i in range(dst.regs):
        match = np.all(s == d[:, :, i:i + 1], axis=0).all(axis=0)  # src values matching everywhere
        js = np.nonzero(match)[0]
        if len(js) == 0:
            return None
        out.append(int(js[0]))
    return tuple(out)


# ------------------------------------------------------------- 1-D tiles in shared memory
def vector_scratch(n: int, dtype: DType) -> SharedLayout:
    """The shared tile a register tile of ``n`` values that no 2-D shared tile fits (1-D, or a
    row or column of 2-D) passes through to change layout: its values row-major in rows of one
    16-byte atom (rows padded to the 8-row repeat)."""
    if dtype.bits < 8:
        raise ValueError(f"shared tiles hold 8-, 16- or 32-bit elements, not {dtype.name}")
    cols = 16 // (dtype.bits // 8)
    rows = -(-n // cols)
    return SharedLayout(rows + (-rows) % 8, cols, dtype, "k", 0)


def vector_coords(coords: tuple, shape: tuple[int, ...], layout: SharedLayout) -> tuple:
    """(row, col) in :func:`vector_scratch`'s tile of tile coordinate ``coords`` of a tile of
    ``shape`` (ints, arrays or codegen symbols)."""
    flat = coords[0]
    for c, n in zip(coords[1:], shape[1:]):
        flat = flat * n + c
    return flat // layout.cols, flat % layout.cols


# --------------------------------------------------------------------------- shared copies
#: A transposing shared-to-shared copy moves 4 x 4 blocks of 8-bit elements: a thread reads
#: four 4-byte words along the source's rows and writes four along the destination's.
TRANSPOSE_BLOCK = 4


#: A warp's share of the swizzle-aware order: 32 rows x 64 columns of the destination.
_WARP_ROWS, _WARP_COLS = 32, 64


def transpose_copy_blocks(rows: int, cols: int, threads: int) -> int:
    """Rounds of ``hopper.smem_copy``'s transposing copy, for a destination stored ``rows x
    cols``: in each a thread moves one 4 x 4 block, and in the last only the threads below
    :func:`transpose_copy_last` where the threads do not share the blocks evenly (384 consumer
    threads and 512 blocks: two rounds, the second of 128 threads).  ValueError where the tile
    is no whole number of blocks."""
    b = TRANSPOSE_BLOCK
    if rows % b or cols % b:
        raise ValueError(f"a {rows} x {cols} tile is not a whole number of {b} x {b} blocks")
    return -(-(rows // b) * (cols // b) // threads)


def transpose_copy_last(rows: int, cols: int, threads: int) -> int:
    """The threads that move a block in the transposing copy's last round (all of them where
    they share the blocks evenly)."""
    blocks = (rows // TRANSPOSE_BLOCK) * (cols // TRANSPOSE_BLOCK)
    return blocks - threads * (transpose_copy_blocks(rows, cols, threads) - 1)


def _warp_order(rows: int, cols: int, threads: int) -> bool:
    return transpose_copy_last(rows, cols, threads) == threads and \
        rows % _WARP_ROWS == 0 and cols % _WARP_COLS == 0 and threads % 32 == 0 and \
        (rows // _WARP_ROWS) * (cols // _WARP_COLS) * 4 % (threads // 32) == 0


def transpose_copy_block(rows: int, cols: int, threads: int, t: Any, r: int) -> tuple[Any, Any]:
    """(row, col) of the first element of block ``r`` that thread ``t`` moves, in the
    destination's stored coordinates (rows x cols).  ``t``: an int, array or codegen symbol.

    Where the tile allows, a warp's 32 blocks of one instruction sit so that 128-B-swizzled
    source and destination rows are read and written without bank conflicts: lane = (w, c, q)
    (w = lane / 8, c = lane / 4 % 2, q = lane % 4) takes destination rows 16 c + 4 w on and
    columns 16 ((2 c + w / 2 + x) % 4) + 4 q on of its warp's 32 x 64 region, where the
    rotation x (0..3) and the region come from the warp and ``r``: the words a warp reads share
    a source row's 16-B chunk only across different rows (the swizzle puts them in other
    banks), and the rows it writes lie in other chunks (tests/examples/test_attn_fp8.py counts
    the conflicts).  Elsewhere consecutive threads take consecutive blocks of a row."""
    if not _warp_order(rows, cols, threads):
        per_row = cols // TRANSPOSE_BLOCK
        block = t + threads * r
        return block // per_row * TRANSPOSE_BLOCK, block % per_row * TRANSPOSE_BLOCK
    lane, slot = t % 32, t // 32 + threads // 32 * r
    q, c, w = lane % 4, lane // 4 % 2, lane // 8
    x, region = slot % 4, slot // 4
    per_row = cols // _WARP_COLS
    row = region // per_row * _WARP_ROWS + c * 16 + w * 4
    col = region % per_row * _WARP_COLS + (c * 2 + w // 2 + x) % 4 * 16 + q * 4
    return row, col



@lru_cache(maxsize=64)
def transpose_word_steps(src: SharedLayout, dst: SharedLayout, threads: int
                         ) -> tuple[tuple[tuple[int, int] | None, ...], ...]:
    """For each round of the transposing copy from ``src`` into ``dst`` and each word of a
    block (four read from ``src``, then four written to ``dst``), ``(xor, add)``: the word's
    byte offset is ``(first ^ xor) + add`` for every thread that moves a block in the round,
    ``first`` its side's first word of round 0.  The swizzle is an XOR of address bits, so a
    block further on along a row or in another 8-row repeat is the first block with bits
    flipped or a constant added; codegen then derives every address from two per thread.
    ``add`` takes the bits ``first`` never sets (an XOR of those is an addition), so a word
    that differs only there costs no instruction.  None for a word not of this form (blocks
    taken in the plain order, ``transpose_copy_block``, by a count of threads that does not
    divide a row's): codegen computes that one from the thread index."""
    stored = replace(dst, kperm=False)
    per = transpose_copy_blocks(dst.rows, dst.cols, threads)
    last = transpose_copy_last(dst.rows, dst.cols, threads)

    def offsets(t: np.ndarray, r: int) -> list[np.ndarray]:
        row0, col0 = transpose_copy_block(dst.rows, dst.cols, threads, t, r)
        ks = [a8_logical_col(col0 + u) if dst.kperm else col0 + u for u in range(TRANSPOSE_BLOCK)]
        return [src.offset(k, row0) for k in ks] + [stored.offset(row0 + v, col0) for v in range(TRANSPOSE_BLOCK)]

    rounds = []
    for r in range(per):
        t = np.arange(last if r == per - 1 else threads)
        here, first = offsets(t, r), offsets(t, 0)
        rounds.append(tuple(offset_step(off, first[w // TRANSPOSE_BLOCK * TRANSPOSE_BLOCK])
                            for w, off in enumerate(here)))
    return tuple(rounds)


def offset_step(off: np.ndarray, base: np.ndarray) -> tuple[int, int] | None:
    """``(xor, add)`` with ``off == (base ^ xor) + add`` in every thread (element), preferring
    ``xor == 0`` (the address is the base's and an immediate offset), else None.  ``add``
    takes the bits of the XOR that ``base`` never sets: flipping those is adding them."""
    add = np.unique(off - base)
    if len(add) == 1:
        return 0, int(add[0])
    xor = np.unique(off ^ base)
    if len(xor) != 1:
        return None
    x, ones = int(xor[0]), int(np.bitwise_or.reduce(base))
    return x & ones, x & ~ones


# --------------------------------------------------------------------------- reductions
@lru_cache(maxsize=256)
def first_holders(layout: DistributedLayout) -> tuple[tuple[int, int], ...] | None:
    """For each value index ``i`` of ``layout``, ``(mask, bits)``: thread ``t`` holds the first
    copy of its value ``i``'s element (no lower thread, and no lower value of ``t``, holds that
    element) exactly when ``t & mask == bits``.  A layout without replicas gives ``(0, 0)``
    everywhere; a row statistic replicated over the 128 threads that reduced it gives
    ``(127, 0)``: thread 0 alone.  None when some value's first holders are not such a set.
    What an exchange that sends each element once (``hopper.cluster_reduce``) is built on."""
    threads, regs = layout.threads, layout.regs
    t = np.arange(threads)[:, None]
    coords = layout.coords(t, np.arange(regs)[None, :])
    flat = np.zeros((threads, regs), dtype=np.int64)
    for c, n in zip(coords, layout.shape):
        flat = flat * n + np.broadcast_to(c, (threads, regs))
    order = flat.reshape(-1)  # (thread, value) pairs in thread-major order
    _, first = np.unique(order, return_index=True)
    is_first = np.zeros(threads * regs, dtype=bool)
    is_first[first] = True
    is_first = is_first.reshape(threads, regs)
    every_bit = (1 << (threads - 1).bit_length()) - 1  # 384 threads: bits 0-8
    out = []
    for i in range(regs):
        holders = np.flatnonzero(is_first[:, i])
        if holders.size == 0:
            out.append((every_bit, every_bit + 1))  # never: every element comes first elsewhere
            continue
        mask = every_bit & ~int(np.bitwise_or.reduce(holders ^ holders[0]))
        bits = int(holders[0]) & mask
        if holders.size != np.count_nonzero((np.arange(threads) & mask) == bits):
            return None
        out.append((int(mask), bits))
    return tuple(out)


class ReducePlan(NamedTuple):
    """How to reduce a register tile along one axis (docs/hopper.md §2): combine each of
    ``groups`` in thread, in order, into result slot g; then for each lane mask m,
    ``v = op(v, shfl.bfly(v, m))``; then, if ``warp_xor`` (the warp bits the tile's axis
    crosses) is not empty, one round trip through shared scratch: every warp writes its
    partials, bar.sync, every warp combines those of its group (the warps that differ from it
    only in those bits) in increasing warp order, bar.sync.  ``result`` is the
    layout of the reduced tile, None when the reduction yields a scalar."""

    result: Slice | None
    groups: tuple[tuple[int, ...], ...]
    shuffle_xor: tuple[int, ...]
    warp_xor: tuple[int, ...]

    @property
    def group_base(self) -> int:
        """The mask that clears the ``warp_xor`` bits: ``warp & group_base`` is the first
        warp of ``warp``'s group."""
        return ~sum(self.warp_xor) & 0x7FFFFFFF

    @property
    def group_offsets(self) -> tuple[int, ...]:
        """The warps of a warp's group (those it combines with, itself included) as offsets
        from the group's first warp (``warp & group_base``), ascending."""
        offsets = [0]
        for m in self.warp_xor:
            offsets += [o | m for o in offsets]
        return tuple(sorted(offsets))


@lru_cache(maxsize=256)  # the verifier, the emulator and codegen all ask, per op
def reduce_plan(layout: DistributedLayout, axis: int) -> ReducePlan:
    """The plan for reducing ``layout`` along ``axis``, derived from its coordinates.

    A xor mask is applied when every thread's partner holds the same kept coordinates and a
    different part of the reduced one; skipped when every partner is a replica (same
    coordinates: combining would count elements twice) or holds other kept coordinates;
    anything else cannot be done with a butterfly and is a ValueError."""
    rank = len(layout.shape)
    if not 0 <= axis < rank:
        raise ValueError(f"axis {axis} out of range for the rank-{rank} {layout}")
    if rank == 1:
        result, groups = None, (tuple(range(layout.regs)),)
    else:
        result = Slice(layout, axis)
        members: list[list[int]] = [[] for _ in range(result.regs)]
        for i in range(layout.regs):
            members[result.slot_of(i)].append(i)
        groups = tuple(tuple(g) for g in members)

    t = np.arange(layout.threads)
    here = [np.broadcast_to(c, t.shape) for c in layout.thread_coords(t)]

    def applies(stride: int) -> bool:
        """Whether the exchange of thread t with t ^ stride is part of the reduction."""
        partner = t ^ stride
        inside = partner < layout.threads  # false only for warp counts that are not powers of two
        other = partner[inside]
        there = [np.broadcast_to(c, other.shape) for c in layout.thread_coords(other)]
        kept = np.ones(other.shape, dtype=bool)
        for a in range(rank):
            if a != axis:
                kept &= here[a][inside] == there[a]
        differs = here[axis][inside] != there[axis]
        if inside.all() and np.all(kept & differs):
            return True
        if np.all(kept & ~differs) or not np.any(kept):
            return False
        raise ValueError(f"the {layout.threads // 32} warps holding this tile cannot combine it along axis {axis} "
                         f"by shuffles: that needs a power-of-two number of warps (pin warps = 4, 8 or 16)")

    shuffle = tuple(m for m in (1, 2, 4, 8, 16) if applies(m))
    warps = layout.threads // 32
    warp_xor = tuple(1 << b for b in range(warps.bit_length()) if (1 << b) < warps and applies(32 << b))
    return ReducePlan(result, groups, shuffle, warp_xor)


class ScanPlan(NamedTuple):
    """How to scan a register tile along one axis (an inclusive prefix sum or product,
    docs/hopper.md §2).  The axis's positions are numbered by *digits* of increasing stride,
    each either in thread or a bit of the thread index; ``steps`` are the digits in that order:

    - ``("regs", chains)``: a digit inside each thread; a chain lists the values that differ
      only in that digit, in its order;
    - ``("lane", m)``: the digit is thread bit ``m`` below 32, exchanged with ``shfl.bfly``;
    - ``("warp", m)``: the digit is thread bit ``m`` of 32 or more, exchanged through a shared
      scratch tile (``[threads, regs]``: each thread writes its values' totals in its row).

    Each value carries its prefix within the block of digits done so far and that block's
    total; a step combines the blocks that differ in its digit: the upper ones add the totals
    of the lower ones to their prefixes, and every value's total becomes the blocks' total
    (both partners of an exchange compute it as ``own op other``, equal since ``+`` and ``*``
    commute)."""

    steps: tuple[tuple[str, Any], ...]

    @property
    def warp_xor(self) -> tuple[int, ...]:
        return tuple(m for kind, m in self.steps if kind == "warp")


def _reg_digits(positions: list[int]) -> list[tuple[int, int]]:
    """``positions`` (distinct offsets along the axis) as mixed-radix digits ``(stride, radix)``
    of increasing stride, or a ValueError."""
    base, have = min(positions), set(positions)
    span, digits = {0}, []
    while len(span) < len(have):
        s = min(p - base for p in have if p - base not in span)
        r = 1
        while all(base + x + r * s in have for x in span):
            r += 1
        digits.append((s, r))
        span = {x + k * s for x in span for k in range(r)}
    if {base + x for x in span} != have:
        raise ValueError("the values of a thread are not a regular grid along the axis")
    return digits


@lru_cache(maxsize=256)  # the verifier, the emulator and codegen all ask, per op
def scan_plan(layout: DistributedLayout, axis: int) -> ScanPlan:
    """The plan for scanning ``layout`` along ``axis``, derived from its coordinates: the
    in-thread digits of every line (values sharing the other coordinates) must be the same,
    every thread bit must move along the axis by one stride (lower half first) keeping the
    other coordinates, or move nothing along it (replicas, other lines), and the digits must
    tile the axis exactly; anything else is a ValueError."""
    rank = len(layout.shape)
    if not 0 <= axis < rank:
        raise ValueError(f"axis {axis} out of range for the rank-{rank} {layout}")
    cant = f"{layout} cannot be scanned along axis {axis}"
    regs = [tuple(int(c) for c in layout.reg_coords(i)) for i in range(layout.regs)]
    lines: dict[tuple[int, ...], dict[int, int]] = {}
    for i, c in enumerate(regs):
        line = lines.setdefault(c[:axis] + c[axis + 1:], {})
        if c[axis] in line:
            raise ValueError(f"{cant}: a thread holds one element twice")
        line[c[axis]] = i
    digits = None
    for line in lines.values():
        d = _reg_digits(list(line))
        if digits is not None and d != digits:
            raise ValueError(f"{cant}: its lines hold different in-thread runs")
        digits = d
    items: list[tuple[int, int, tuple[str, Any]]] = []
    for k, (s, r) in enumerate(digits or []):
        others = [[j * s2 for j in range(r2)] for kk, (s2, r2) in enumerate(digits) if kk != k]
        chains = []
        for line in lines.values():
            base = min(line)
            for combo in itertools.product(*others):
                x = base + sum(combo)
                chains.append(tuple(line[x + j * s] for j in range(r)))
        items.append((s, r, ("regs", tuple(chains))))
    t = np.arange(layout.threads)
    here = [np.broadcast_to(c, t.shape) for c in layout.thread_coords(t)]
    for b in range((layout.threads - 1).bit_length()):
        m = 1 << b
        partner = t ^ m
        inside = partner < layout.threads
        there = [np.broadcast_to(c, partner[inside].shape) for c in layout.thread_coords(partner[inside])]
        delta = there[axis] - here[axis][inside]
        if not delta.any():
            continue  # replicas, or other lines
        kept = all(np.array_equal(here[a][inside], there[a]) for a in range(rank) if a != axis)
        up = (t[inside] & m) == 0
        s = int(abs(delta[0]))
        if not inside.all() or not kept or not np.array_equal(delta, np.where(up, s, -s)):
            raise ValueError(f"{cant} with xor exchanges")
        items.append((s, 2, ("lane" if m < 32 else "warp", m)))
    items.sort(key=lambda x: x[0])
    cover = 1
    for s, r, _ in items:
        if s != cover:
            raise ValueError(f"{cant}: its digits do not tile the axis")
        cover *= r
    if cover != layout.shape[axis]:
        raise ValueError(f"{cant}: its digits span {cover} of {layout.shape[axis]} positions")
    return ScanPlan(tuple(step for _, _, step in items))


# --------------------------------------------------------------------------- parsers
def _parse_smem(text: str) -> SharedLayout:
    m = re.fullmatch(r"\s*(\d+)x(\d+)x(\w+)\s*,\s*(k|mn)\s*,\s*sw(\d+)\s*(,\s*kperm\s*)?", text)
    dt = dtypes.from_name(m.group(3)) if m else None
    if m is None or dt is None:
        raise ValueError("expected '<rows>x<cols>x<dtype>, k|mn, sw<0|32|64|128>[, kperm]'")
    return SharedLayout(int(m.group(1)), int(m.group(2)), dt, m.group(4), int(m.group(5)), bool(m.group(6)))


def _parse_scales(text: str) -> ScaleLayout:
    m = re.fullmatch(r"\s*(\d+)x(\d+)(?:x(f8e4m3))?\s*,\s*(k|mn)\s*", text)
    if m is None:
        raise ValueError("expected '<rows>x<cols>[xf8e4m3], k|mn'")
    dt = dtypes.f8e4m3 if m.group(3) else dtypes.f8e8m0
    return ScaleLayout(int(m.group(1)), int(m.group(2)), dt, major=m.group(4))


def _frag_args(text: str) -> tuple[int, int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*(?:,\s*wg\s*=\s*(\d+)\s*)?(?:,\s*slices\s*=\s*(\d+)\s*)?", text)
    if m is None:
        raise ValueError("expected '<n>', optionally followed by ', wg=<warpgroups>' and ', slices=<1 to 4>'")
    return int(m.group(1)), int(m.group(2) or 1), int(m.group(3) or 1)


def _parse_blocked(text: str) -> Blocked:
    dims = r"\s*(\d+(?:x\d+)?)\s*"
    m = re.fullmatch(rf"{dims},\s*vec\s*=\s*(\d+)\s*,\s*lanes\s*={dims},\s*warps\s*={dims}", text)
    if m is None:
        raise ValueError("expected '<R>x<C>, vec=<V>, lanes=<TR>x<TC>, warps=<WR>x<WC>' or the rank-1 form")
    shape, lanes, warps = (tuple(int(x) for x in m.group(g).split("x")) for g in (1, 3, 4))
    return Blocked(shape, int(m.group(2)), lanes, warps)


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside ``<...>`` (a nested layout has its own)."""
    parts, depth, start = [], 0, 0
    for j, ch in enumerate(text):
        depth += (ch == "<") - (ch == ">")
        if ch == "," and depth == 0:
            parts.append(text[start:j].strip())
            start = j + 1
    parts.append(text[start:].strip())
    return parts


def _parse_slice(text: str) -> Slice:
    parts = _split_top(text)
    m = re.fullmatch(r"#(\w+)<(.*)>", parts[0], re.S)
    axis = re.fullmatch(r"axis\s*=\s*(\d+)", parts[1]) if len(parts) > 1 else None
    if m is None or axis is None or len(parts) > 3 or parts[2:] not in ([], ["keep"]):
        raise ValueError("expected '#<parent layout>, axis=<A>' optionally followed by ', keep'")
    parse = LAYOUT_PARSERS.get(m.group(1))
    if parse is None:
        raise ValueError(f"unknown parent layout '#{m.group(1)}'")
    return Slice(parse(m.group(2)), int(axis.group(1)), len(parts) == 3)


def _parse_transpose(text: str) -> Transposed:
    m = re.fullmatch(r"\s*#(\w+)<(.*)>\s*", text, re.S)
    parse = LAYOUT_PARSERS.get(m.group(1)) if m else None
    if parse is None:
        raise ValueError("expected '#<parent layout>'")
    return Transposed(parse(m.group(2)))


def _parse_reshape(text: str) -> Reshaped:
    parts = _split_top(text)
    m = re.fullmatch(r"#(\w+)<(.*)>", parts[0], re.S) if len(parts) == 2 else None
    shape = re.fullmatch(r"\d+(?:x\d+)*", parts[1]) if m else None
    if m is None or shape is None:
        raise ValueError("expected '#<parent layout>, <R>x<C>'")
    parse = LAYOUT_PARSERS.get(m.group(1))
    if parse is None:
        raise ValueError(f"unknown parent layout '#{m.group(1)}'")
    return Reshaped(parse(m.group(2)), tuple(int(x) for x in parts[1].split("x")))


def _parse_stack(text: str) -> Stacked:
    parts = _split_top(text)
    m = re.fullmatch(r"#(\w+)<(.*)>", parts[0], re.S) if len(parts) == 3 else None
    axis = re.fullmatch(r"axis\s*=\s*(\d+)", parts[1]) if m else None
    n = re.fullmatch(r"n\s*=\s*(\d+)", parts[2]) if m else None
    parse = LAYOUT_PARSERS.get(m.group(1)) if m else None
    if parse is None or axis is None or n is None:
        raise ValueError("expected '#<parent layout>, axis=<A>, n=<N>'")
    return Stacked(parse(m.group(2)), int(axis.group(1)), int(n.group(1)))


LAYOUT_PARSERS.update({
    "stack": _parse_stack,
    "reshape": _parse_reshape,
    "transpose": _parse_transpose,
    "smem": _parse_smem,
    "scales": _parse_scales,
    "wgmma_acc": lambda text: WgmmaAccumulator(*_frag_args(text)),
    "wgmma_a": lambda text: WgmmaOperandA(*_frag_args(text)),
    "wgmma_a8": lambda text: WgmmaOperandA8(*_frag_args(text)),
    "tmem_acc": lambda text: TmemAccumulator(*_frag_args(text)[:2]),
    "blocked": _parse_blocked,
    "slice": _parse_slice,
})
