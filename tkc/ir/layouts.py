"""Hopper layouts: the only place that knows where an element of a tile lives.

Each layout is a frozen dataclass that a pass puts on a ``TileType`` (``tile<64x64xbf16,
smem, #smem<64x64xbf16, k, sw128>>``).  Codegen asks it for addresses and wgmma descriptors;
the emulator asks it where to put bytes and registers.  Both ask the same object, so there is
no second copy of any formula here (DESIGN.md principle 5).

- ``SharedLayout`` (``#smem<RxCxdtype, k|mn, swS>``): a shared-memory tile as TMA writes it
  (PTX-FACTS §2, §3): byte offsets, TMA box and swizzle enum, wgmma matrix descriptors, and
  ``descriptor_address`` which reads a descriptor back the way the hardware does.
- ``WgmmaAccumulator`` (``#wgmma_acc<N>``) and ``WgmmaOperandA`` (``#wgmma_a<K>``): register
  fragments of 64 rows per warpgroup (PTX-FACTS §1), plus the stmatrix epilogue (§6).
- ``RowVector`` (``#acc_rows<R>``) and ``ColVector`` (``#acc_cols<N>``): per-row and
  per-column reductions of an accumulator, derived from the same §1 formula.

Index-mapping methods are vectorized: they take ints or numpy integer arrays (broadcast
together) and return int64 arrays.  This module never *chooses* a layout: that is the
select-layouts pass.  ``choose_swizzle`` only states the rule that pass applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tkc import dtypes
from tkc.dtypes import DType
from tkc.ir.types import LAYOUT_PARSERS

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
    """

    rows: int
    cols: int
    dtype: DType
    major: str = "k"
    swizzle: int = 128

    def __post_init__(self) -> None:
        if self.dtype.bits not in (8, 16, 32):
            raise ValueError(f"shared tiles hold 8-, 16- or 32-bit elements, not {self.dtype}")
        if self.major not in ("k", "mn"):
            raise ValueError(f"major is 'k' or 'mn', not {self.major!r}")
        if self.swizzle not in SWIZZLES:
            raise ValueError(f"swizzle is one of {SWIZZLES}, not {self.swizzle}")
        if self.rows <= 0 or self.rows % 8:
            raise ValueError(f"rows must be a positive multiple of 8 (the swizzle repeat), got {self.rows}")
        if self.cols <= 0 or self.cols * self.elem_bytes % self.atom_bytes:
            raise ValueError(f"{self.cols} x {self.dtype} is not a multiple of the {self.atom_bytes}-B atom")

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
        return swizzle(self._linear(r, c), self.swizzle)

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
        return 32 // self.elem_bytes

    @property
    def k_steps(self) -> int:
        return (self.cols if self.major == "k" else self.rows) // self.k_per_step

    def descriptor(self, base_addr: int, k_step: int = 0, mn_start: int = 0) -> int:
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
            if self.elem_bytes != 2:
                raise ValueError("MN-major wgmma operands are f16/bf16 only (PTX-FACTS §1, tA/tB)")
            if mn_start % self.box_cols or not 0 <= mn_start < self.cols:
                raise ValueError(f"mn_start {mn_start} is not a box of {self.cols} cols")
            start = self._linear(_ints(k0), _ints(mn_start))
            lbo, sbo = (self.box_bytes, 8 * self.atom_bytes) if self.swizzle else (128, self.box_bytes)
        return encode_descriptor(base_addr + int(start), lbo, sbo, self.swizzle)

    def __str__(self) -> str:
        return f"#smem<{self.rows}x{self.cols}x{self.dtype.name}, {self.major}, sw{self.swizzle}>"


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
def _acc_coords(thread: np.ndarray, reg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PTX-FACTS §1 (CUTLASS CLayout_64xN), extended to warpgroup g = t // 128 owning rows
    [64g, 64g + 64): w = t/32 % 4, l = t%32, row = 16w + l/4 + 8((i>>1)&1),
    col = 8(i>>2) + 2(l%4) + (i&1)."""
    g, w, lane = thread // 128, thread // 32 % 4, thread % 32
    row = 64 * g + 16 * w + lane // 4 + 8 * ((reg >> 1) & 1)
    col = 8 * (reg >> 2) + 2 * (lane % 4) + (reg & 1)
    return row, col


def _acc_owner(row: np.ndarray, col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of ``_acc_coords``."""
    g, w, r16 = row // 64, row // 16 % 4, row % 16
    thread = 128 * g + 32 * w + 4 * (r16 % 8) + col % 8 // 2
    reg = 4 * (col // 8) + 2 * (r16 // 8) + col % 2
    return thread, reg


def _frag_text(cls_name: str, n: int, warpgroups: int) -> str:
    return f"#{cls_name}<{n}" + (f", wg={warpgroups}>" if warpgroups != 1 else ">")


class StmatrixX4(NamedTuple):
    """The accumulator-to-shared epilogue with ``stmatrix.x4`` (PTX-FACTS §6), one instruction
    per 16 columns.  Instruction s: thread t's lane address is element (``rows[t]``,
    ``cols[s, t]``), the first of 8 contiguous 16-bit values; its b32 register j packs
    accumulator registers ``regs[s, j, 0]`` (low half) and ``regs[s, j, 1]`` (high half)."""

    rows: np.ndarray  # (threads,)
    cols: np.ndarray  # (n // 16, threads)
    regs: np.ndarray  # (n // 16, 4, 2)


@dataclass(frozen=True)
class _Fragment:
    """A 64 x n register fragment per warpgroup, laid out by the §1 formula; ``warpgroups``
    stack vertically (warpgroup g owns rows [64g, 64g + 64)).  Value i of a thread is its
    register i for f32; packed 16-bit values share b32 register i // 2 (i even = low half)."""

    n: int
    warpgroups: int = 1

    _granule = 8  # columns come in multiples of this (not a field: no annotation)

    def __post_init__(self) -> None:
        if self.n <= 0 or self.n % self._granule:
            raise ValueError(f"columns must be a positive multiple of {self._granule}, got {self.n}")
        if self.warpgroups < 1:
            raise ValueError(f"warpgroups must be at least 1, got {self.warpgroups}")

    @property
    def shape(self) -> tuple[int, int]:
        return 64 * self.warpgroups, self.n

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    @property
    def regs_per_thread(self) -> int:
        """Values (f32 registers) per thread."""
        return self.n // 2

    def coords(self, thread: object, reg: object) -> tuple[np.ndarray, np.ndarray]:
        t, i = _ints(thread), _ints(reg)
        _check_range("thread", t, self.threads)
        _check_range("reg", i, self.regs_per_thread)
        return _acc_coords(t, i)

    def owner(self, row: object, col: object) -> tuple[np.ndarray, np.ndarray]:
        r, c = _ints(row), _ints(col)
        _check_range("row", r, self.shape[0])
        _check_range("col", c, self.n)
        return _acc_owner(r, c)


@dataclass(frozen=True)
class WgmmaAccumulator(_Fragment):
    """A wgmma m64nN accumulator (``#wgmma_acc<N>``, ``#wgmma_acc<N, wg=2>`` for 128 x N)."""

    def stmatrix_x4(self) -> StmatrixX4:
        """PTX-FACTS §6: pack P[2q+h] = (d[4q+2h], d[4q+2h+1]); instruction s stores P[4s..4s+3],
        cols 16s..16s+15 of each warp's 16 rows; lane t addresses row 8((t/8)&1) + t%8 of the
        warp's rows, col block 2s + t/16."""
        if self.n % 16:
            raise ValueError(f"stmatrix.x4 stores 16 columns at a time; N = {self.n}")
        t = np.arange(self.threads)
        lane = t % 32
        rows = 64 * (t // 128) + 16 * (t // 32 % 4) + 8 * (lane // 8 % 2) + lane % 8
        s = np.arange(self.n // 16)
        cols = 16 * s[:, None] + 8 * (lane // 16)[None, :]
        regs = 8 * s[:, None, None] + 2 * np.arange(4)[None, :, None] + np.arange(2)[None, None, :]
        return StmatrixX4(rows, cols, regs)

    def __str__(self) -> str:
        return _frag_text("wgmma_acc", self.n, self.warpgroups)


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

    def step_registers(self, k_step: int) -> range:
        """The four b32 registers {a0, a1, a2, a3} of K-step ``k_step``."""
        if not 0 <= k_step < self.k_steps:
            raise ValueError(f"k_step {k_step} out of range [0, {self.k_steps})")
        return range(4 * k_step, 4 * k_step + 4)

    def __str__(self) -> str:
        return _frag_text("wgmma_a", self.n, self.warpgroups)


@dataclass(frozen=True)
class RowVector:
    """One value per row of a ``64*warpgroups x N`` accumulator, for any N (``#acc_rows<R>``).
    Each thread keeps the two rows its accumulator registers cover: slot h is row
    l/4 + 8h of its warp's 16, i.e. accumulator registers i with (i>>1)&1 == h.  The 4 threads
    of a quad hold the same rows, so a row reduction shuffles with xor masks 1 and 2."""

    warpgroups: int = 1

    values_per_thread = 2
    shuffle_xor_masks = (1, 2)
    cross_warp = False

    def __post_init__(self) -> None:
        if self.warpgroups < 1:
            raise ValueError(f"warpgroups must be at least 1, got {self.warpgroups}")

    @property
    def length(self) -> int:
        return 64 * self.warpgroups

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    @staticmethod
    def slot_of_acc_reg(reg: object) -> np.ndarray:
        return (_ints(reg) >> 1) & 1

    def coords(self, thread: object, slot: object) -> np.ndarray:
        t, h = _ints(thread), _ints(slot)
        _check_range("thread", t, self.threads)
        _check_range("slot", h, 2)
        return _acc_coords(t, 2 * h)[0]

    def owners(self, row: object) -> tuple[np.ndarray, np.ndarray]:
        """(threads, shape (..., 4): the quad holding ``row``; slot, shape (...))."""
        r = _ints(row)
        _check_range("row", r, self.length)
        threads, reg = _acc_owner(r[..., None], 2 * np.arange(4))
        return threads, self.slot_of_acc_reg(reg[..., 0])

    def __str__(self) -> str:
        return f"#acc_rows<{self.length}>"


@dataclass(frozen=True)
class ColVector:
    """One value per column of a ``64*warpgroups x n`` accumulator (``#acc_cols<N>``),
    replicated in every thread that holds that column: slot s is column
    8(s/2) + 2(l%4) + s%2, i.e. accumulator registers 4(s/2) + s%2 and + 2.  A column
    reduction shuffles with xor masks 4, 8, 16, then combines the warps (and warpgroups)
    through shared memory."""

    n: int
    warpgroups: int = 1

    shuffle_xor_masks = (4, 8, 16)
    cross_warp = True

    def __post_init__(self) -> None:
        if self.n <= 0 or self.n % 8:
            raise ValueError(f"columns must be a positive multiple of 8, got {self.n}")
        if self.warpgroups < 1:
            raise ValueError(f"warpgroups must be at least 1, got {self.warpgroups}")

    @property
    def length(self) -> int:
        return self.n

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    @property
    def values_per_thread(self) -> int:
        return self.n // 4

    @staticmethod
    def slot_of_acc_reg(reg: object) -> np.ndarray:
        i = _ints(reg)
        return 2 * (i >> 2) + (i & 1)

    def coords(self, thread: object, slot: object) -> np.ndarray:
        t, s = _ints(thread), _ints(slot)
        _check_range("thread", t, self.threads)
        _check_range("slot", s, self.values_per_thread)
        return _acc_coords(t, 4 * (s >> 1) + (s & 1))[1]

    def owners(self, col: object) -> tuple[np.ndarray, np.ndarray]:
        """(threads, shape (..., 32 * warpgroups): every thread holding ``col``; slot)."""
        c = _ints(col)
        _check_range("col", c, self.n)
        rows = np.arange(64 * self.warpgroups)
        rows = rows[rows % 16 < 8]  # one row per thread: the other 8 repeat the same threads
        threads, reg = _acc_owner(rows, c[..., None])
        return threads, self.slot_of_acc_reg(reg[..., 0])

    def __str__(self) -> str:
        return _frag_text("acc_cols", self.n, self.warpgroups)


# --------------------------------------------------------------------------- parsers
def _parse_smem(text: str) -> SharedLayout:
    m = re.fullmatch(r"\s*(\d+)x(\d+)x(\w+)\s*,\s*(k|mn)\s*,\s*sw(\d+)\s*", text)
    dt = dtypes.from_name(m.group(3)) if m else None
    if m is None or dt is None:
        raise ValueError("expected '<rows>x<cols>x<dtype>, k|mn, sw<0|32|64|128>'")
    return SharedLayout(int(m.group(1)), int(m.group(2)), dt, m.group(4), int(m.group(5)))


def _frag_args(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*(?:,\s*wg\s*=\s*(\d+)\s*)?", text)
    if m is None:
        raise ValueError("expected '<n>' or '<n>, wg=<warpgroups>'")
    return int(m.group(1)), int(m.group(2) or 1)


def _parse_rows(text: str) -> RowVector:
    m = re.fullmatch(r"\s*(\d+)\s*", text)
    if m is None or int(m.group(1)) % 64 or int(m.group(1)) == 0:
        raise ValueError("expected the row count, a positive multiple of 64")
    return RowVector(int(m.group(1)) // 64)


LAYOUT_PARSERS.update({
    "smem": _parse_smem,
    "wgmma_acc": lambda text: WgmmaAccumulator(*_frag_args(text)),
    "wgmma_a": lambda text: WgmmaOperandA(*_frag_args(text)),
    "acc_rows": _parse_rows,
    "acc_cols": lambda text: ColVector(*_frag_args(text)),
})
