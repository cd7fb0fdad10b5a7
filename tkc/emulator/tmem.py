"""Tensor memory and tcgen05 in the emulator: the ``blackwell`` dialect's ops (docs/blackwell.md).

A CTA's tensor memory is 128 lanes x 512 columns of f32 (``TensorMemory``), with a written
flag per lane and column: an M = 64 product writes lanes 32 w to 32 w + 15 of each warp
quarter w only (``blackwell.accumulator_lanes``, the PTX ISA's layout F).  One thread
issues ``tcgen05.mma``: the product is read from shared memory through the same descriptors
the hardware gets (``blackwell.smem_descriptor`` decoded by ``layouts.descriptor_address``,
the instruction descriptor by :func:`decode_idesc`) and written at once, but the columns stay
*in flight* until a ``tcgen05.commit`` of that thread arrives on its mbarrier, and readable
only by a warpgroup that has waited for that barrier phase.  Protocol errors, each a
``TkcEmulatorError`` naming the op: reading tensor memory in flight or before waiting for the
commit's phase, reading lanes and columns no MMA wrote, a warp reading lanes outside its
quarter, a second allocation in a CTA (its permit was relinquished), a column budget overrun,
a free of what was not allocated, and columns still allocated when the CTA exits.

Must not: define what an op computes beyond the machine model (layouts and descriptors are
``tkc.ir``'s) or know about passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tkc import dtypes
from tkc.emulator.smem import _FP8
from tkc.emulator.mbarrier import MBarrier
from tkc.emulator.scheduler import Wait
from tkc.errors import TkcEmulatorError
from tkc.ir.core import Operation
from tkc.ir.dialects import blackwell
from tkc.ir.layouts import SCALE_ATOM_BYTES, descriptor_address

__all__ = ["TensorMemory", "decode_idesc", "HANDLERS", "CO_HANDLERS", "at_exit"]

_CODES = {"f16": {0: dtypes.f16, 1: dtypes.bf16}, "f8f6f4": {0: dtypes.f8e4m3, 1: dtypes.f8e5m2}}


def decode_idesc(idesc: int, kind: str) -> dict[str, Any]:
    """The fields of a ``tcgen05.mma`` instruction descriptor (PTX-FACTS §7 table)."""
    if (idesc >> 4) & 3 != 1:
        raise TkcEmulatorError(f"instruction descriptor {idesc:#010x}: D must be f32 (1 at bits 4-5)")
    codes = _CODES[kind]
    a, b = (idesc >> 7) & 7, (idesc >> 10) & 7
    if a not in codes or b not in codes:
        raise TkcEmulatorError(f"instruction descriptor {idesc:#010x}: operand codes {a}, {b} are not kind::{kind}")
    return {"a": codes[a], "b": codes[b], "a_mn": bool(idesc >> 15 & 1), "b_mn": bool(idesc >> 16 & 1),
            "n": ((idesc >> 17) & 63) << 3, "m": ((idesc >> 24) & 31) << 4}


def decode_scaled_idesc(idesc: int, vec: int = 1) -> dict[str, Any]:
    """The fields of a ``kind::mxf8f6f4.block_scale`` (``vec`` 1) or ``kind::mxf4nvf4.block_scale``
    (``vec`` 2, 4) instruction descriptor (docs/block_scaled.md §3), refusing what the PTX ISA
    calls invalid (ptxas checks none)."""
    a, b = (idesc >> 7) & 7, (idesc >> 10) & 7
    ue8m0 = (idesc >> 23) & 1
    if vec == 1:
        codes = _CODES["f8f6f4"]
        if a not in codes or b not in codes:
            raise TkcEmulatorError(f"instruction descriptor {idesc:#010x}: operand codes {a}, {b} are not the e4m3 "
                                   f"(0) or e5m2 (1) of kind::mxf8f6f4")
        if ue8m0 != blackwell.UE8M0:
            raise TkcEmulatorError(f"instruction descriptor {idesc:#010x}: kind::mxf8f6f4 scales are UE8M0 (1 at bit "
                                   f"23)")
        da, db = codes[a], codes[b]
    else:
        if a != blackwell.E2M1 or b != blackwell.E2M1:
            raise TkcEmulatorError(f"instruction descriptor {idesc:#010x}: operand codes {a}, {b} are not the E2M1 "
                                   f"(1) of kind::mxf4nvf4")
        if idesc >> 15 & 3:
            raise TkcEmulatorError(f"instruction descriptor {idesc:#010x}: kind::mxf4nvf4 transposes no operand "
                                   f"(bits 15-16)")
        if ue8m0 != (vec == 2):  # tkc's MXFP4 is 2X with UE8M0, its NVFP4 4X with UE4M3
            raise TkcEmulatorError(f"instruction descriptor {idesc:#010x}: scale_vec::{vec}X scales here are "
                                   f"{'UE8M0 (1' if vec == 2 else 'UE4M3 (0'} at bit 23)")
        da = db = dtypes.f4e2m1x2
    if idesc & 0b1001111 or (idesc >> 24) & 7 or idesc >> 31:
        raise TkcEmulatorError(f"instruction descriptor {idesc:#010x}: reserved bits set (sparsity and bit 31 are "
                               f"not used here)")
    ids = ((idesc >> 29) & 3, (idesc >> 4) & 3)
    if any(i % vec for i in ids):
        raise TkcEmulatorError(f"instruction descriptor {idesc:#010x}: scale_vec::{vec}X reads scale ids that are "
                               f"multiples of {vec}, got {ids}")
    return {"a": da, "b": db, "a_mn": bool(idesc >> 15 & 1), "b_mn": bool(idesc >> 16 & 1),
            "n": ((idesc >> 17) & 63) << 3, "m": ((idesc >> 27) & 3) << 7, "a_id": ids[0], "b_id": ids[1],
            "ue8m0": bool(ue8m0)}


#: E8M0 scale codes as factors: 2^(code - 127); 255 is NaN.
_E8M0 = np.where(np.arange(256) == 255, np.nan, np.exp2(np.arange(256, dtype=np.float64) - 127))
#: UE4M3 scale codes (NVFP4's) as factors: e4m3's magnitudes (unsigned: the threads store the
#: e4m3 of a block's amax / 6 / g, never negative; what the hardware makes of bit 7 is not modelled).
_UE4M3 = np.abs(_FP8["f8e4m3"])


@dataclass(eq=False)
class _Write:
    """The newest MMA writing a range of columns: the shared tiles it reads until its commit,
    and the commits (barrier, phase) made since it was issued.  Each commit completes when
    every MMA before it has, so a reader that has waited for any of them reads a finished
    product in these columns."""

    op: Operation
    cols: slice
    leases: list
    committed: bool = False
    commits: list[tuple[MBarrier, int]] = field(default_factory=list)


@dataclass
class TensorMemory:
    """One CTA's tensor memory and its allocation state."""

    data: np.ndarray = field(default_factory=lambda: np.zeros((blackwell.TMEM_LANES, blackwell.TMEM_COLUMNS),
                                                              np.float32))
    written: np.ndarray = field(default_factory=lambda: np.zeros((blackwell.TMEM_LANES, blackwell.TMEM_COLUMNS),
                                                                 bool))  # per lane: an M = 64 MMA writes half
    allocs: dict[int, tuple[int, Operation]] = field(default_factory=dict)  # first column -> (columns, op)
    relinquished: Operation | None = None
    addresses: dict[Operation, int] = field(default_factory=dict)  # what each alloc op returned
    # The newest MMA of each range of columns (several accumulators: attention's S and O).
    writes: list[_Write] = field(default_factory=list)
    # Scale factors tcgen05.cp put in a column (four bytes a lane), which bytes it wrote, and
    # the shared tiles the copies read until the issuing thread's next commit.
    scales: np.ndarray = field(default_factory=lambda: np.zeros((blackwell.TMEM_LANES, blackwell.TMEM_COLUMNS, 4),
                                                                np.uint8))
    scales_written: np.ndarray = field(default_factory=lambda: np.zeros(
        (blackwell.TMEM_LANES, blackwell.TMEM_COLUMNS, 4), bool))
    copy_leases: list = field(default_factory=list)

    def in_flight(self) -> list[_Write]:
        return [w for w in self.writes if not w.committed]

    def written_by(self, cols: slice) -> list[_Write]:
        return [w for w in self.writes if w.cols.start < cols.stop and cols.start < w.cols.stop]

    def allocate(self, op: Operation, cols: int) -> int:
        used = sum(c for c, _ in self.allocs.values())
        if used + cols > blackwell.TMEM_COLUMNS:
            raise TkcEmulatorError(f"allocates {cols} tensor-memory columns with {used} of "
                                   f"{blackwell.TMEM_COLUMNS} taken (column budget overrun)")
        if self.relinquished is not None:
            raise TkcEmulatorError(f"allocates tensor memory a second time in this CTA: the allocation at "
                                   f"{self.relinquished.loc} relinquished the CTA's permit (double alloc)")
        start = used
        self.allocs[start] = (cols, op)
        self.relinquished = op
        return start  # lane 0 << 16 | column

    def columns(self, op: Operation, addr: int, n: int) -> slice:
        lane, col = addr >> 16, addr & 0xFFFF
        for start, (cols, _) in self.allocs.items():
            if lane == 0 and start <= col and col + n <= start + cols:
                return slice(col, col + n)
        raise TkcEmulatorError(f"tensor memory at lane {lane}, columns [{col}, {col + n}) is not allocated")


def tmem_of(cta: Any) -> TensorMemory:
    if not hasattr(cta, "tmem"):
        cta.tmem = TensorMemory()
    return cta.tmem


# ------------------------------------------------------------------ handlers
def _tmem_alloc(wg: Any, op: Operation) -> Any:
    tm = tmem_of(wg.cta)
    if wg.leader:
        tm.addresses[op] = tm.allocate(op, op.cols)
    yield from wg.bar_sync(op)  # the role meets; the address is in shared memory for everyone
    return np.asarray(tm.addresses[op], np.int32)


def _tmem_dealloc(wg: Any, op: Operation, addr: Any) -> Any:
    yield from wg.bar_sync(op)  # every warp of the role is done reading
    if not wg.leader:
        return None
    tm = tmem_of(wg.cta)
    start = int(addr) & 0xFFFF
    held = tm.allocs.get(start)
    if held is None or held[0] != op.cols:
        raise TkcEmulatorError(f"frees {op.cols} columns at column {start}, which is not an allocation")
    if tm.in_flight():
        raise TkcEmulatorError(f"frees tensor memory that {_describe(tm.in_flight()[0].op)} still writes (no "
                               f"tcgen05.commit after it)")
    del tm.allocs[start]
    return None


def _describe(op: Operation) -> str:
    """An op in messages, as the machine names it: its name and where it is."""
    where = f" at {op.loc}" if op.loc is not None and op.loc.line else ""
    return f"'{op.name}'{where}"


def _mma(wg: Any, op: Operation, addr: Any, a: Any, b: Any, accumulate: Any, *ready: Any) -> Any:
    # The first warp waits for the operands and issues; the role's other warps skip the op.
    # (Not a wait of the warpgroup's four warps: only the issuing warp spins on it.)  A pair's
    # MMA is issued by the even CTA alone, for both.
    pair = bool(op.attributes.get("pair"))
    if not wg.leader or (pair and wg.cta.rank % 2):
        return None
    for bar, parity in zip(ready[::2], ready[1::2]):
        yield Wait(bar, int(parity), f"{_describe(op)} (the MMA warp's wait for its operands)")
    ctas = wg.cta.pair() if pair else [wg.cta]
    if len(ctas) != (2 if pair else 1):
        raise TkcEmulatorError("a CTA pair's MMA needs the odd CTA of the pair, and this cluster has none")
    la, lb = op.operand_layout("a"), op.operand_layout("b")
    m, n = op.m, op.n
    n_here = n // len(ctas)  # a pair: each CTA holds half of B's columns
    kind = blackwell.mma_kind(la.dtype, lb.dtype)
    scaled = op.scale_columns is not None

    def idesc_of(step: int) -> dict[str, Any]:
        if scaled:  # the K block's byte of each scale column (its place in a group of four)
            return decode_scaled_idesc(op.scale_step(step)[0], op.scale_vec)
        return decode_idesc(blackwell.instr_descriptor(la, lb, op.instruction_m, n), kind)

    f = idesc_of(0)
    if (f["m"], f["n"]) != (op.instruction_m, n):
        raise TkcEmulatorError(f"the instruction descriptor says {f['m']}x{f['n']}, the op {op.instruction_m}x{n}")
    who = f"{_describe(op)} ({wg.role})"  # the reader in shared-memory race messages
    tms, cols, leases, a_rows, b_rows = [], [], [], [], []
    for cta in ctas:
        tm = tmem_of(cta)
        try:
            cols.append(tm.columns(op, int(addr), n))
        except TkcEmulatorError as e:
            if not pair:
                raise
            raise TkcEmulatorError(f"in CTA rank {cta.rank} of the pair: {e}") from None
        tms.append(tm)
        smem = cta.smem
        leases.append([smem.begin_read(a.base, la.size_bytes, reader=who),
                       smem.begin_read(b.base, lb.size_bytes, reader=who)])
        a_rows.append(np.zeros((m, 0)))
        b_rows.append(np.zeros((n_here, 0)))
    k = la.k_per_step
    kk = np.arange(k)[None, :]
    for s in range(la.k_steps):
        f = idesc_of(s)
        da, db = blackwell.smem_descriptor(la, a.base, s), blackwell.smem_descriptor(lb, b.base, s)
        if not (da & db & blackwell.DESC_VERSION):
            raise TkcEmulatorError("a shared-memory descriptor lacks the tcgen05 version bit (46)")
        a_addr = descriptor_address(da, "mn" if f["a_mn"] else "k", np.arange(m)[:, None], kk, f["a"])
        b_addr = descriptor_address(db, "mn" if f["b_mn"] else "k", np.arange(n_here)[:, None], kk, f["b"])
        # A pair's descriptors hold the even CTA's offsets; the odd CTA's tiles are read at the same ones.
        for v, cta in enumerate(ctas):
            at = cta.smem.read_elements(a_addr, f["a"], reader=f"{who} (A)", proxy="async")
            bt = cta.smem.read_elements(b_addr, f["b"], reader=f"{who} (B)", proxy="async")
            if f["a"].is_packed:  # FP4 pairs, K-major: each byte two values of K, the low nibble first
                at, bt = dtypes.unpack_fp4(at), dtypes.unpack_fp4(bt)
            at, bt = at.astype(np.float64), bt.astype(np.float64)
            if scaled:
                _, sfa, sfb = op.scale_step(s)
                at = _scaled(at, tms[v], op, int(addr) + sfa, "A", s, f["a_id"], f["ue8m0"])
                bt = _scaled(bt, tms[v], op, int(addr) + sfb, "B", s, f["b_id"], f["ue8m0"])
            a_rows[v] = np.concatenate([a_rows[v], at], axis=1)
            b_rows[v] = np.concatenate([b_rows[v], bt], axis=1)
    d = np.concatenate(a_rows) @ np.concatenate(b_rows).T  # (m * CTAs) x n
    lanes = blackwell.accumulator_lanes(m)  # the data-path layout of an M-row product
    for v, (tm, c) in enumerate(zip(tms, cols)):
        rows = d[v * m:(v + 1) * m]
        if bool(accumulate):
            if not tm.written[lanes, c].all():
                raise TkcEmulatorError("accumulates onto tensor memory no MMA has written (the first MMA of an "
                                       "accumulator must not accumulate)")
            rows = rows + tm.data[lanes, c].astype(np.float64)
        tm.data[lanes, c] = rows.astype(np.float32)
        tm.written[lanes, c] = True
        tm.scales_written[:, c] = False  # an accumulator over scale factors
        replaced = tm.written_by(c)  # the committed ones are superseded; the others await a commit
        tm.writes = [w for w in tm.writes if not (w.committed and w in replaced)]  # (identity: eq=False)
        tm.writes.append(_Write(op, c, leases[v]))
    return None


def _scaled(x: np.ndarray, tm: TensorMemory, op: Operation, addr: int, name: str, step: int, first: int,
            ue8m0: bool) -> np.ndarray:
    """Rows ``x`` (one K step of A or B) times their scales: the step's ``op.scale_vec`` K
    blocks are bytes ``first ..`` of the scale columns at ``addr``, each scaling its run of K."""
    vec = op.scale_vec
    factors = np.stack([_step_scales(tm, op, addr, name, step, first + i, len(x), ue8m0) for i in range(vec)],
                       axis=1)
    return x * np.repeat(factors, x.shape[1] // vec, axis=1)


def _step_scales(tm: TensorMemory, op: Operation, addr: int, name: str, step: int, byte: int,
                 rows: int, ue8m0: bool = True) -> np.ndarray:
    """The factor of each of ``rows`` rows of A or B (``name``) for a K block of K step
    ``step``, as a block-scaled MMA reads them: ``addr`` is its ``[sfa]``/``[sfb]``
    (``MmaOp.scale_step``), and row r's factor is byte ``byte`` (the descriptor's scale id, plus
    the block's place in the step) of column r / 32 from it, in lane r % 128 (every warp quarter
    holds a copy); an E8M0 code, or NVFP4's UE4M3 (``ue8m0`` False)."""
    r = np.arange(rows)
    lanes, cols = r % 128, (addr & 0xFFFF) + r // 32
    if cols.max() >= blackwell.TMEM_COLUMNS or not tm.scales_written[lanes, cols, byte].all():
        raise TkcEmulatorError(f"{_describe(op)} reads {name}'s scale factors for K step {step} from tensor memory "
                               f"(columns {int(cols.min())}-{int(cols.max())}, byte {byte}) that no tcgen05.cp "
                               f"wrote (a blackwell.copy_scales before it, by the same thread)")
    return (_E8M0 if ue8m0 else _UE4M3)[tm.scales[lanes, cols, byte]]


def _copy_scales(wg: Any, op: Operation, addr: Any, tile: Any) -> None:
    # Thread 0 of the role's first warp issues (the MMA's thread); the others skip the op.
    if not wg.leader:
        return None
    tm = tmem_of(wg.cta)
    layout = op.scales.type.layout
    span = tm.columns(op, int(addr), blackwell.scale_columns(layout))
    if tm.written[:, span].any():
        raise TkcEmulatorError(f"{_describe(op)} copies scale factors over tensor-memory columns "
                               f"{span.start}-{span.stop - 1} that hold an MMA's accumulator")
    smem, who = wg.cta.smem, f"{_describe(op)} ({wg.role})"
    # The bytes of the tile's scales (the rest of a block, past its rows or K blocks, is
    # copied as it lies and never read by an MMA).
    r, c = np.meshgrid(np.arange(layout.rows), np.arange(layout.cols), indexing="ij")
    held = tile.base + layout.offset(r, c).ravel()
    smem.read_elements(held, layout.dtype, reader=who, proxy="async")
    for i in range(layout.atoms):
        # 32 rows x 16 bytes, read through the descriptor as the hardware does
        desc = blackwell.scale_descriptor(tile.base + i * SCALE_ATOM_BYTES)
        raw = descriptor_address(desc, "k", np.arange(32)[:, None], np.arange(16)[None, :], dtypes.f8e8m0)
        meant = np.isin(raw, held)
        for q in range(4):  # column 4 i + q: bytes 4 q to 4 q + 3 of each row, in every warp quarter
            col = span.start + 4 * i + q
            for quarter in range(4):
                lanes = 32 * quarter + np.arange(32)
                tm.scales[lanes, col] = smem.data[raw[:, 4 * q:4 * q + 4]]
                tm.scales_written[lanes, col] = meant[:, 4 * q:4 * q + 4]
    tm.copy_leases.append(smem.begin_read(tile.base, layout.size_bytes, reader=who))
    return None


def _commit(wg: Any, op: Operation, bar: MBarrier) -> None:
    pair = bool(op.attributes.get("pair"))
    if not wg.leader or (pair and wg.cta.rank % 2):
        return None
    # ``.multicast::cluster`` (a pair's commit too): the same arrival on the barrier at this
    # offset in every CTA of the cluster (the pair, whose tensor memory the MMAs wrote).
    bars = wg.cta.in_peers(bar) if op.attributes.get("cluster") or pair else [bar]
    # The MMAs this commit tracks wrote this CTA's tensor memory, and the odd CTA's for a pair
    # (whose cluster is the pair: ``bars`` is its barrier in each, in rank order).
    for cta, b in zip(wg.cta.pair(), bars) if pair else [(wg.cta, bar)]:
        tm = tmem_of(cta)
        # The copies of scale factors issued before it are done once this arrival's phase
        # completes; their shared tiles are free to rewrite once every thread that waits on the
        # barrier has seen that phase (a store before its wait races with the copy).
        for lease in tm.copy_leases:
            b.when_seen(lease.release)
        tm.copy_leases.clear()
        for w in tm.writes:
            if not w.committed:
                for lease in w.leases:
                    lease.release()
                w.committed = True
            w.commits.append((b, b.phase))  # the phase this arrival completes (count 1)
    for b in bars:
        b.arrive()
    return None


def _tmem_load(wg: Any, op: Operation, addr: Any, written: Any, *addend: np.ndarray) -> np.ndarray:
    loaded = _tmem_read(wg, op, addr, written)
    return loaded + addend[0] if addend else loaded


def _tmem_read(wg: Any, op: Operation, addr: Any, written: Any) -> np.ndarray:
    tm = tmem_of(wg.cta)
    layout = op.result.type.layout  # a #tmem_acc, or one warpgroup's #wgmma_acc (the op's verifier)
    rows, cols = wg.coords(op, layout)
    lanes = blackwell.accumulator_lanes(layout.shape[0])[rows]
    if not bool(written):
        return np.zeros(rows.shape, np.float32)
    span = tm.columns(op, int(addr), layout.shape[1])
    writes = tm.written_by(span)
    if not writes:
        raise TkcEmulatorError("reads tensor memory before waiting for a commit of the MMAs that write it (none "
                               "has been issued yet)")
    waiter = wg.waiter
    for w in writes:
        if not w.committed:
            raise TkcEmulatorError(f"reads tensor memory that {_describe(w.op)} is still writing (no "
                                   f"tcgen05.commit after it)")
        if not any(bar._observed.get(waiter, -2) >= phase for bar, phase in w.commits):
            bar, phase = w.commits[-1]
            raise TkcEmulatorError(f"reads tensor memory before waiting for a commit of the MMAs that write it, "
                                   f"after {_describe(w.op)} (phase {phase} of mbarrier {bar.name!r})")
    warp = np.arange(128)[:, None] // 32 % 4
    if np.any(lanes // 32 != warp):
        t = int(np.argwhere(lanes // 32 != warp)[0][0])
        raise TkcEmulatorError(f"warp {t // 32} of the warpgroup reads lane {int(lanes[t].flat[0])}: a warp reaches "
                               f"only lanes {32 * (t // 32 % 4)} to {32 * (t // 32 % 4) + 31} of tensor memory")
    base = int(addr) & 0xFFFF
    if not tm.written[lanes, base + cols].all():
        raise TkcEmulatorError("reads tensor-memory lanes and columns no MMA has written")
    return tm.data[lanes, base + cols].astype(np.float32)


def at_exit(cta: Any) -> None:
    """The CTA has run to its end: every tensor-memory column must have been freed."""
    tm = getattr(cta, "tmem", None)
    if tm is not None and tm.allocs:
        cols, op = next(iter(tm.allocs.values()))
        raise TkcEmulatorError(f"{_describe(op)}: {cols} tensor-memory columns are still allocated when the CTA "
                               f"exits (no blackwell.tmem_dealloc)", op.loc)


HANDLERS = {
    blackwell.CommitOp.name: _commit,
    blackwell.TmemLoadOp.name: _tmem_load,
    blackwell.CopyScalesOp.name: _copy_scales,
}
CO_HANDLERS = {
    blackwell.MmaOp.name: _mma,
    blackwell.TmemAllocOp.name: _tmem_alloc,
    blackwell.TmemDeallocOp.name: _tmem_dealloc,
}
