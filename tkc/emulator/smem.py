"""Shared memory as the bytes the GPU holds, and who touched them.

This module owns three things:

- **Element bit patterns** (``encode`` / ``decode``): f32, i32, i64, f16, bf16, f8e4m3 (OCP E4M3FN),
  f8e5m2 and f8e8m0 (OCP MX's E8M0) as their real little-endian bytes, so a wrong swizzle or a wrong element size
  shows up as wrong values, not as a lucky round trip.  Rounding is ``tkc.dtypes.round_to``'s
  job; ``encode`` rounds through it and then only packs bits.
- **``SharedMemory``**: a ``np.uint8`` buffer with tile writes and reads *through a
  ``SharedLayout``* and element gathers/scatters at given addresses.  It never computes an
  address itself: ``tkc.ir.layouts`` does (``SharedLayout.offset``, ``descriptor_address``).
- **Access bookkeeping** for the checks the hardware does not make for you:
  - every byte remembers its last writer (an op name) and whether it was written through
    the generic proxy since the last ``fence.proxy.async``; an async-proxy read (wgmma, TMA
    store) of such bytes is an error (PTX-FACTS §1: "Smem written by ordinary stores needs
    fence.proxy.async.shared::cta before wgmma reads it");
  - reading bytes nobody wrote is an error (the GPU would read garbage);
  - *lost writes*: an async-proxy write (TMA) over bytes that an earlier async-proxy write
    put there and nothing has read since, nor waited for on the barrier that copy completed
    on (``seen``), is an error: in a pipeline the producer refilled a stage whose data the
    consumer never saw (a stage waited for and released unread, a tile read only under an
    ``if``, is not; ``check_lost_writes=False`` turns this off);
  - *read leases*: ``begin_read(base, nbytes, reader)`` marks a range (a pipeline stage) as
    being read until ``lease.release()``; any write landing on it meanwhile raises a race
    error naming the range (or its ``add_region`` name), the writer and the reader.

It does not know about barriers, TMA boxes or wgmma; those modules call it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tkc.emulator.clock import CLOCK
from tkc import dtypes
from tkc.dtypes import DType
from tkc.errors import TkcEmulatorError
from tkc.ir.layouts import SharedLayout

__all__ = ["SharedMemory", "Region", "ReadLease", "RaceError", "encode", "decode"]


class RaceError(TkcEmulatorError):
    """A write landed on shared memory that another op was still reading."""


# --------------------------------------------------------------------------- bit patterns
def _fp8_table(exp_bits: int, man_bits: int, bias: int, fn: bool) -> np.ndarray:
    """Value of every code 0..255 of a binary float8 format (``fn``: E4M3FN, no infinities,
    only S.1111.111 is NaN; otherwise IEEE-like: all-ones exponent is inf/NaN)."""
    code = np.arange(256)
    sign = np.where(code >> 7, -1.0, 1.0)
    e = (code >> man_bits) & ((1 << exp_bits) - 1)
    m = code & ((1 << man_bits) - 1)
    frac = m / (1 << man_bits)
    mag = np.where(e == 0, frac * 2.0 ** (1 - bias), (1 + frac) * 2.0 ** (e - bias))
    top = (1 << exp_bits) - 1
    if fn:
        mag = np.where((e == top) & (m == (1 << man_bits) - 1), np.nan, mag)
    else:
        mag = np.where(e == top, np.where(m == 0, np.inf, np.nan), mag)
    return sign * mag


_FP8 = {
    "f8e4m3": _fp8_table(4, 3, 7, True),
    "f8e5m2": _fp8_table(5, 2, 15, False),
}


def _fp8_encode(v: np.ndarray, table: np.ndarray) -> np.ndarray:
    pos = table[:128]
    ok = ~np.isnan(pos)  # codes 0..127 rise with their value (inf included for e5m2)
    codes, vals = np.arange(128)[ok], pos[ok]
    mag = np.abs(v.astype(np.float64))
    nan = np.isnan(mag)
    idx = np.clip(np.searchsorted(vals, np.where(nan, 0.0, mag)), 0, len(vals) - 1)
    out = codes[idx].astype(np.uint8)
    if not np.array_equal(vals[idx][~nan], mag[~nan]):
        raise ValueError("value not representable after rounding (internal error)")
    out |= np.where(np.signbit(v), 0x80, 0).astype(np.uint8)
    return np.where(nan, np.uint8(0x7F), out).astype(np.uint8)


def encode(values: object, dtype: DType) -> np.ndarray:
    """Bytes of ``values`` as ``dtype``: shape ``(*values.shape, dtype.bits // 8)``, uint8,
    little-endian.  Values are rounded with ``dtypes.round_to`` first."""
    v = dtypes.round_to(values, dtype)
    if dtype.name in ("f32", "i32"):
        words = v.astype("<f4" if dtype.name == "f32" else "<i4").view("<u4")
    elif dtype.name == "i64":
        words = v.astype("<i8").view("<u8")
    elif dtype.name == "bf16":
        words = (v.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype("<u2")
    elif dtype.name == "f16":
        words = v.astype("<f2").view("<u2")
    elif dtype.name in _FP8:
        words = _fp8_encode(v, _FP8[dtype.name])
    elif dtype == dtypes.f8e8m0:
        words = dtypes.e8m0_code(v)
    elif dtype.is_packed:  # a pair of FP4 values: its byte
        words = v.astype(np.uint8)
    else:
        raise ValueError(f"shared memory does not hold {dtype} elements")
    words = np.ascontiguousarray(words)
    return words.view(np.uint8).reshape(*v.shape, dtype.bits // 8)


def decode(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Inverse of ``encode``: ``raw`` has shape ``(..., dtype.bits // 8)``; returns the values
    in ``dtype.np_storage`` (float32 for every float type)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    shape = raw.shape[:-1]
    if dtype.name == "f32":
        return raw.view("<f4").reshape(shape).astype(np.float32)
    if dtype.name == "i32":
        return raw.view("<i4").reshape(shape).astype(np.int32)
    if dtype.name == "i64":
        return raw.view("<i8").reshape(shape).astype(np.int64)
    if dtype.name == "bf16":
        return (raw.view("<u2").reshape(shape).astype(np.uint32) << np.uint32(16)).view(np.float32)
    if dtype.name == "f16":
        return raw.view("<f2").reshape(shape).astype(np.float32)
    if dtype.name in _FP8:
        return _FP8[dtype.name][raw.reshape(shape)].astype(np.float32)
    if dtype == dtypes.f8e8m0:
        return dtypes.e8m0_value(raw.reshape(shape))
    if dtype.is_packed:
        return raw.reshape(shape).copy()
    raise ValueError(f"shared memory does not hold {dtype} elements")


# --------------------------------------------------------------------------- bookkeeping
@dataclass(frozen=True)
class Region:
    """A named byte range ``[base, base + nbytes)`` (an allocation or a pipeline stage); only
    used to name ranges in messages."""

    name: str
    base: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.base + self.nbytes


@dataclass(eq=False)
class ReadLease:
    """``[lo, hi)`` is being read by ``reader`` until ``release()``."""

    smem: SharedMemory
    lo: int
    hi: int
    reader: str
    active: bool = field(default=True)

    def release(self) -> None:
        if not self.active:
            raise TkcEmulatorError(f"read lease of {self.smem.describe(self.lo, self.hi)} by "
                                   f"{self.reader!r} released twice")
        self.active = False
        self.smem._leases.remove(self)


class SharedMemory:
    """``size_bytes`` of shared memory (``data``, uint8) plus who last wrote each byte."""

    def __init__(self, size_bytes: int, *, check_uninitialized: bool = True, check_lost_writes: bool = True):
        if size_bytes <= 0:
            raise ValueError(f"shared memory size must be positive, got {size_bytes}")
        self.size = size_bytes
        self.data = np.zeros(size_bytes, np.uint8)
        self.check_uninitialized = check_uninitialized
        self.check_lost_writes = check_lost_writes
        self._unread_async = np.zeros(size_bytes, bool)  # written by the async proxy, not read since
        # ... nor waited for by every waiter of the barrier the copy completed on (``seen``)
        self._unseen = np.zeros(size_bytes, bool)
        self._async_at = np.zeros(size_bytes, np.int64)  # when (CLOCK) the async proxy last wrote
        self._writer = np.zeros(size_bytes, np.int32)  # index into _writers; 0 = never written
        self._writers: list[str] = ["<never written>"]
        self._writer_ids: dict[str, int] = {}
        self._generic_unfenced = np.zeros(size_bytes, bool)
        self._regions: list[Region] = []
        self._leases: list[ReadLease] = []

    # ---------------------------------------------------------------- naming
    def add_region(self, name: str, base: int, nbytes: int) -> Region:
        """Name ``[base, base + nbytes)`` for messages; regions may not overlap."""
        self._check_range(base, nbytes, f"region {name!r}")
        for r in self._regions:
            if base < r.end and r.base < base + nbytes:
                raise TkcEmulatorError(f"region {name!r} [{base:#x}, {base + nbytes:#x}) overlaps "
                                       f"region {r.name!r} [{r.base:#x}, {r.end:#x})")
        region = Region(name, base, nbytes)
        self._regions.append(region)
        return region

    def describe(self, lo: int, hi: int) -> str:
        names = [r.name for r in self._regions if lo < r.end and r.base < hi]
        where = f"[{lo:#x}, {hi:#x})"
        return f"{' + '.join(repr(n) for n in names)} {where}" if names else f"smem {where}"

    def region(self, name: str) -> Region:
        for r in self._regions:
            if r.name == name:
                return r
        raise KeyError(name)

    def last_writer(self, addr: int) -> str | None:
        """The op that last wrote byte ``addr``, or None."""
        w = int(self._writer[addr])
        return self._writers[w] if w else None

    # ---------------------------------------------------------------- leases and fences
    def begin_read(self, base: int | str, nbytes: int | None = None, *, reader: str) -> ReadLease:
        """Mark ``[base, base + nbytes)`` (or the region named ``base``) as being read by
        ``reader`` until the returned lease is released: a write landing on it meanwhile is a
        race (a producer reusing a pipeline stage its consumer has not released)."""
        if isinstance(base, str):
            r = self.region(base)
            base, nbytes = r.base, r.nbytes
        if nbytes is None:
            raise ValueError("begin_read needs nbytes unless given a region name")
        self._check_range(base, nbytes, f"read by {reader!r}")
        lease = ReadLease(self, base, base + nbytes, reader)
        self._leases.append(lease)
        return lease

    def fence_proxy_async(self) -> None:
        """``fence.proxy.async.shared::cta``: generic-proxy writes so far become visible to
        async-proxy readers (wgmma, TMA store)."""
        self._generic_unfenced[:] = False

    # ---------------------------------------------------------------- tiles
    def write_tile(self, base: int, layout: SharedLayout, values: object, *, writer: str = "st.shared",
                   proxy: str = "generic", license: int | None = None) -> None:
        """Store a ``layout.rows x layout.cols`` tile at ``base`` through ``layout.offset``."""
        v = np.asarray(values)
        if v.shape != (layout.rows, layout.cols):
            raise ValueError(f"tile of shape {v.shape} does not match {layout}")
        self._check_tile(base, layout, writer)
        self.write_elements(base + self._tile_offsets(layout), v, layout.dtype, writer=writer, proxy=proxy,
                            license=license)

    def read_tile(self, base: int, layout: SharedLayout, *, reader: str = "ld.shared",
                  proxy: str = "generic") -> np.ndarray:
        """Load the ``layout.rows x layout.cols`` tile at ``base`` through ``layout.offset``."""
        self._check_tile(base, layout, reader)
        return self.read_elements(base + self._tile_offsets(layout), layout.dtype, reader=reader, proxy=proxy)

    @staticmethod
    def _tile_offsets(layout: SharedLayout) -> np.ndarray:
        r, c = np.meshgrid(np.arange(layout.rows), np.arange(layout.cols), indexing="ij")
        return layout.offset(r, c)

    def _check_tile(self, base: int, layout: SharedLayout, who: str) -> None:
        if base % layout.alignment:
            raise TkcEmulatorError(f"{who}: shared tile {layout} at {base:#x} is not {layout.alignment}-B "
                                   f"aligned (the swizzle XORs absolute address bits, PTX-FACTS §3)")
        self._check_range(base, layout.size_bytes, f"{who}: tile {layout}")

    def _check_range(self, base: int, nbytes: int, what: str) -> None:
        if base < 0 or nbytes < 0 or base + nbytes > self.size:
            raise TkcEmulatorError(f"{what} [{base:#x}, {base + nbytes:#x}) is outside the "
                                   f"{self.size}-B shared memory")

    # ---------------------------------------------------------------- elements
    def _byte_addrs(self, addrs: np.ndarray, dtype: DType, who: str) -> np.ndarray:
        eb = dtype.bits // 8
        a = np.asarray(addrs, dtype=np.int64)
        if a.size and (a.min() < 0 or a.max() + eb > self.size):
            raise TkcEmulatorError(f"{who}: address {int(a.max() if a.max() + eb > self.size else a.min()):#x} "
                                   f"outside the {self.size}-B shared memory")
        if a.size and np.any(a % eb):
            bad = int(a[a % eb != 0].flat[0])
            raise TkcEmulatorError(f"{who}: {dtype} element at {bad:#x} is not {eb}-B aligned")
        return a[..., None] + np.arange(eb)

    def write_elements(self, addrs: object, values: object, dtype: DType, *, writer: str,
                       proxy: str = "generic", license: int | None = None) -> None:
        """Scatter ``values`` (same shape as ``addrs``) as ``dtype`` bytes to ``addrs``.
        ``license``: for a copy, when (``CLOCK``) the barrier phase its issuer last waited for
        completed; unread bytes its consumers all waited for and released after they landed
        (a tile read only under an ``if``) are then free to overwrite."""
        if proxy not in ("generic", "async"):
            raise ValueError(f"proxy is 'generic' or 'async', not {proxy!r}")
        b = self._byte_addrs(np.asarray(addrs), dtype, writer)
        raw = encode(np.broadcast_to(np.asarray(values), b.shape[:-1]), dtype)
        for lease in self._leases:
            hit = (b >= lease.lo) & (b < lease.hi)
            if hit.any():
                raise RaceError(
                    f"race on {self.describe(lease.lo, lease.hi)}: {writer!r} writes it while {lease.reader!r} "
                    f"is still reading it (the reader has not released the stage)")
        if self.check_lost_writes and proxy == "async":
            lost = self._unread_async[b] if license is None else \
                self._unseen[b] | (self._unread_async[b] & (self._async_at[b] > license))
            if lost.any():
                a = int(b[lost].min())
                raise RaceError(f"lost data in {self.describe(a, a + 1)}: {writer!r} overwrites what "
                                f"{self.last_writer(a)!r} wrote there before anything read it")
        self.data[b] = raw
        wid = self._writer_ids.setdefault(writer, len(self._writers))
        if wid == len(self._writers):
            self._writers.append(writer)
        self._writer[b] = wid
        self._generic_unfenced[b] = proxy == "generic"
        self._unread_async[b] = self._unseen[b] = proxy == "async"
        if proxy == "async":
            self._async_at[b] = next(CLOCK)

    def seen(self, base: int, nbytes: int) -> None:
        """Every waiter of the barrier a TMA copy into ``[base, base + nbytes)`` completed on
        has passed that phase: those bytes arrived where the program looked for them, read or
        not (a copy over them still needs its issuer to have waited for their release)."""
        self._unseen[base:base + nbytes] = False

    def read_elements(self, addrs: object, dtype: DType, *, reader: str, proxy: str = "generic") -> np.ndarray:
        """Gather ``dtype`` values at ``addrs`` (any shape)."""
        return self.read_bytes(self.element_bytes(addrs, dtype, reader), dtype, reader=reader, proxy=proxy)

    def element_bytes(self, addrs: object, dtype: DType, who: str) -> np.ndarray:
        """The byte addresses of ``dtype`` elements at ``addrs`` (one more axis, the element's
        bytes), checked to lie in this shared memory and be aligned: what ``read_bytes``
        takes, computed once by a reader that reads the same addresses again (wgmma)."""
        return self._byte_addrs(np.asarray(addrs), dtype, who)

    def read_bytes(self, b: np.ndarray, dtype: DType, *, reader: str, proxy: str = "generic") -> np.ndarray:
        """Gather ``dtype`` values whose bytes are at ``b`` (from ``element_bytes``)."""
        if proxy not in ("generic", "async"):
            raise ValueError(f"proxy is 'generic' or 'async', not {proxy!r}")
        if self.check_uninitialized:
            never = self._writer[b] == 0
            if never.any():
                a = int(b[never].min())
                raise TkcEmulatorError(f"{reader!r} reads {self.describe(a, a + 1)}, which nothing has written "
                                       f"(on the GPU: garbage; was a wait passed too early?)")
        if proxy == "async":
            stale = self._generic_unfenced[b]
            if stale.any():
                a = int(b[stale].min())
                raise TkcEmulatorError(
                    f"{reader!r} (async proxy) reads {self.describe(a, a + 1)} written by "
                    f"{self.last_writer(a)!r} through the generic proxy with no fence.proxy.async since")
        self._unread_async[b] = self._unseen[b] = False
        return decode(self.data[b], dtype)
