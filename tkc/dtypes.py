"""tkc's scalar element types and their exact numerics.

This module owns the element types a kernel can name (``f32``, ``f16``,
``bf16``, ``f8e4m3``, ``f8e5m2``, ``f8e8m0``, ``f4e2m1x2``, ``i32``, ``i64``, ``i1``/``bool``) and is the only place
that knows how a dtype rounds.  The interpreter, constant folding and the test
oracles all call :func:`round_to`, so "what value does a ``bf16`` hold" has a
single answer, and that answer is the one the GPU produces:

* Float targets round to nearest, ties to even, from the *exact* input value
  (a float64 input is rounded once, never via float32, which could double-round).
* ``f8e4m3`` is OCP E4M3FN: no infinities, largest finite 448, NaN is
  ``S.1111.111``.  ``f8e5m2`` is IEEE-like (it has inf, largest finite 57344).
  Both follow PTX ``cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32``, the instructions GPU
  code uses: a finite value that rounds past the largest finite value
  *saturates* to it, and so does ±inf; NaN stays NaN.  (So an ``f8e5m2`` value
  held by tkc is never infinite, although the format could encode it.)
* ``f16`` and ``bf16`` are IEEE-style: overflow rounds to ±inf.
* ``f8e8m0`` is OCP MX's E8M0 scale (torch's ``float8_e8m0fnu``): eight exponent bits, no
  sign or mantissa, code ``e`` is ``2**(e - 127)`` (``2**-127`` to ``2**127``), 255 is NaN.  A
  value converts as torch converts it: from its f32 (a float64 is rounded to f32 first), the
  magnitude (the sign is dropped), rounded to nearest with the implicit bit as the last kept
  one (so a normal f32 at or past the middle of its binade rounds up, an f32 subnormal at its
  middle down); 0 and anything below ``2**-127`` give ``2**-127``; inf, NaN and what rounds
  past ``2**127`` give NaN.
* ``f4e2m1x2`` is a *pair* of OCP MX's FP4 (E2M1) values in one byte, as torch's
  ``float4_e2m1fn_x2`` holds them: the first value of the pair in the low nibble.  E2M1 is
  sign, two exponent bits and one mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
  A pair is not a number, so it has no arithmetic: tiles of it are loaded, stored, unpacked
  into twice as many values (:func:`e2m1_value`) and packed from them (:func:`e2m1_code`:
  round to nearest, ties to even, saturating at ±6; NaN gives +0, E2M1 having no NaN).  Its
  storage is the byte itself (uint8).
* float → ``i32``/``i64`` truncates toward zero and saturates, NaN → 0 (PTX
  ``cvt.rzi.s32.f32``, ``cvt.rzi.s64.f32``); integer → ``i32`` wraps modulo 2**32 (keeps the
  low 32 bits of an ``i64``), integer → ``i64`` is exact; bool → 0/1.
* ``i64`` → float rounds once from the exact integer (like ``cvt.rn.f32.s64``): values
  beyond 2**53 do not pass through a float64 rounding first.
  Anything → ``i1`` is ``x != 0`` (so NaN is true, as in C).

Values are *stored* in numpy arrays of ``DType.np_storage``: float32 for every
float type (holding values already rounded to the type, which float32 represents
exactly), int32 for ``i32``, int64 for ``i64`` and bool for ``i1``.  numpy has no bf16 or fp8, and
float32 storage keeps every interpreter op a plain numpy op followed by
:func:`round_to`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:  # torch is optional: imported lazily where it is needed
    import torch

__all__ = [
    "DType",
    "f32",
    "f16",
    "bf16",
    "f8e4m3",
    "f8e5m2",
    "f8e8m0",
    "f4e2m1x2",
    "i32",
    "i64",
    "i1",
    "ALL",
    "BY_NAME",
    "from_name",
    "from_torch",
    "from_numpy",
    "round_to",
    "to_torch",
    "from_torch_tensor",
]


class _FloatFormat(NamedTuple):
    """What rounding needs to know about a binary float format."""

    mantissa_bits: int  # stored fraction bits (precision is one more)
    min_normal_exp: int  # exponent of the smallest normal binade; subnormals share its quantum
    saturating: bool  # overflow (and inf) -> ±max (PTX satfinite) instead of ±inf


@dataclass(frozen=True, eq=False)
class DType:
    """A scalar element type.  Identity is the name: two DTypes are equal iff
    their names are, so a DType can key dicts and be compared to the constants
    below regardless of where it was constructed."""

    name: str
    bits: int
    kind: str  # "float", "int", "bool", or "packed" (f4e2m1x2: two values a byte, no arithmetic)
    np_storage: np.dtype = field(repr=False)
    min: float | int = field(repr=False)  # smallest finite value (the most negative, but f8e8m0's 2**-127)
    max: float | int = field(repr=False)  # largest finite value
    _torch_name: str = field(repr=False)
    _fmt: _FloatFormat | None = field(default=None, repr=False)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind == "int"

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def is_packed(self) -> bool:
        """Two values an element (``f4e2m1x2``): a tile of it is unpacked before arithmetic."""
        return self.kind == "packed"

    def torch_dtype(self) -> torch.dtype:
        """The matching torch dtype (torch is imported on first use)."""
        import torch

        return getattr(torch, self._torch_name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"DType({self.name!r})"


_F32 = np.dtype(np.float32)

f32 = DType("f32", 32, "float", _F32, -float(np.finfo(np.float32).max), float(np.finfo(np.float32).max),
            "float32", _FloatFormat(23, -126, False))
f16 = DType("f16", 16, "float", _F32, -65504.0, 65504.0, "float16", _FloatFormat(10, -14, False))
# bf16 max is 0x7F7F = (2 - 2**-7) * 2**127.
bf16 = DType("bf16", 16, "float", _F32, -(2 - 2**-7) * 2.0**127, (2 - 2**-7) * 2.0**127, "bfloat16",
             _FloatFormat(7, -126, False))
f8e4m3 = DType("f8e4m3", 8, "float", _F32, -448.0, 448.0, "float8_e4m3fn", _FloatFormat(3, -6, True))
f8e5m2 = DType("f8e5m2", 8, "float", _F32, -57344.0, 57344.0, "float8_e5m2", _FloatFormat(2, -14, True))
# E8M0: no _FloatFormat (no sign, no mantissa); round_to has its own rule (e8m0_code).  min is
# its smallest value, not a negative one: a value converts as its magnitude.
f8e8m0 = DType("f8e8m0", 8, "float", _F32, 2.0**-127, 2.0**127, "float8_e8m0fnu")
# Two E2M1 values a byte (torch.float4_e2m1fn_x2); min/max are one value's range.
f4e2m1x2 = DType("f4e2m1x2", 8, "packed", np.dtype(np.uint8), -6.0, 6.0, "float4_e2m1fn_x2")
i32 = DType("i32", 32, "int", np.dtype(np.int32), -(2**31), 2**31 - 1, "int32")
i64 = DType("i64", 64, "int", np.dtype(np.int64), -(2**63), 2**63 - 1, "int64")
i1 = DType("i1", 1, "bool", np.dtype(np.bool_), 0, 1, "bool")

ALL: tuple[DType, ...] = (f32, f16, bf16, f8e4m3, f8e5m2, f8e8m0, f4e2m1x2, i32, i64, i1)

#: Every spelling of a dtype: IR names plus the kernel language's ``bool``.
BY_NAME: dict[str, DType] = {dt.name: dt for dt in ALL} | {"bool": i1}

_BY_TORCH_NAME: dict[str, DType] = {dt._torch_name: dt for dt in ALL}
_BY_NUMPY: dict[np.dtype, DType] = {
    np.dtype(np.float32): f32,
    np.dtype(np.float16): f16,
    np.dtype(np.int32): i32,
    np.dtype(np.int64): i64,
    np.dtype(np.bool_): i1,
}


def from_name(name: str) -> DType | None:
    """The dtype spelled ``name`` (``bool`` is ``i1``), or None."""
    return BY_NAME.get(name)


def from_torch(torch_dtype: Any) -> DType | None:
    """The tkc dtype of a torch dtype, or None if tkc has no such type."""
    # str(torch.bfloat16) == "torch.bfloat16": matching on the name avoids importing torch.
    s = str(torch_dtype)
    return _BY_TORCH_NAME.get(s.removeprefix("torch.")) if s.startswith("torch.") else None


def from_numpy(np_dtype: Any) -> DType | None:
    """The tkc dtype of a numpy dtype (float32, float16, int32, int64, bool), or None.
    numpy has no bf16 or fp8, so those never come back from here."""
    try:
        return _BY_NUMPY.get(np.dtype(np_dtype))
    except TypeError:
        return None


# --------------------------------------------------------------------------- rounding


def round_to(x: Any, dt: DType) -> np.ndarray:
    """``x`` (any numeric array-like) converted to ``dt``'s storage representation,
    rounded exactly as the hardware rounds (see the module docstring).

    Returns float32 for float dtypes (holding values exactly representable in
    ``dt``), int32 for ``i32``, int64 for ``i64`` and bool for ``i1``.  Always a new array.
    Integer inputs beyond 2**53 round once to a float type (through a float64 rounded
    to odd, which a narrower rounding cannot double-round).
    """
    a = np.asarray(x)
    if a.dtype.kind == "c":
        raise TypeError(f"cannot convert complex values to {dt.name}")
    if dt.is_bool:
        return np.asarray(a != 0)  # asarray: ops on 0-d arrays give numpy scalars
    if dt.is_packed:  # a pair's storage is its byte: codes pass through
        return np.asarray(a).astype(np.uint8)
    # NaN, inf and overflow are ordinary inputs here with a defined result, and signalling NaNs
    # (e.g. random bit patterns) raise "invalid" on any float cast: none of it deserves a warning.
    with np.errstate(over="ignore", invalid="ignore"):
        if dt.is_int:
            return _to_int(a, dt)
        if dt == f8e8m0:
            return e8m0_value(e8m0_code(a))
        return _round_float(a, dt)


def e8m0_code(x: Any) -> np.ndarray:
    """The E8M0 code (uint8) of each value (module docstring: torch's conversion)."""
    a = np.asarray(x)
    if a.dtype.kind == "b":
        a = a.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        bits = np.asarray(a.astype(np.float32)).view(np.uint32)
    exp = (bits >> np.uint32(23)) & np.uint32(0xFF)
    guard = (bits >> np.uint32(22)) & np.uint32(1)
    # round up past the middle, or at it where the kept bit (the implicit one) is odd
    up = guard & (((bits & np.uint32(0x3FFFFF)) != 0) | (exp != 0)).astype(np.uint32)
    return np.minimum(exp + up, np.uint32(255)).astype(np.uint8)


def e8m0_value(code: Any) -> np.ndarray:
    """The float32 value of each E8M0 code: ``2**(code - 127)``, NaN for 255."""
    c = np.asarray(code).astype(np.int64)
    return np.where(c == 255, np.nan, np.ldexp(1.0, c - 127)).astype(np.float32)


#: The magnitudes of the E2M1 codes 0-7 (bit 3 is the sign).
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
#: Where the rounded magnitude steps to the next code: at a tie (0.25, 1.25, 2.5, 5) it stays on
#: the even code below, at 0.75, 1.75, 3.5 it steps up to the even one (:func:`e2m1_code`).
_E2M1_UP = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
_E2M1_AT_TIE = np.array([False, True, False, True, False, True, False])


def e2m1_code(x: Any) -> np.ndarray:
    """The E2M1 code (uint8, 0-15) of each value: rounded to nearest, ties to even, past ±6
    (and ±inf) saturating to ±6, NaN to +0; the sign bit (3) from the value's sign, so -0.0 is
    code 8.  What the GPU lowering computes (tkc/codegen/lower_values.py, ``e2m1_encode``)."""
    a = np.asarray(x, np.float64)
    mag = np.abs(a)
    passed = np.where(_E2M1_AT_TIE, mag[..., None] >= _E2M1_UP, mag[..., None] > _E2M1_UP)
    code = passed.sum(axis=-1).astype(np.uint8)
    nan = np.isnan(a)
    sign = (np.signbit(a) & ~nan).astype(np.uint8) << np.uint8(3)
    return np.where(nan, np.uint8(0), code | sign).astype(np.uint8)


def e2m1_value(code: Any) -> np.ndarray:
    """The float32 value of each E2M1 code (its low four bits)."""
    c = np.asarray(code).astype(np.uint8) & np.uint8(15)
    v = E2M1_VALUES[c & np.uint8(7)]
    return np.where(c & np.uint8(8), -v, v).astype(np.float32)


def unpack_fp4(pairs: Any) -> np.ndarray:
    """``f4e2m1x2`` codes [..., C] as float32 values [..., 2C]: each byte's low nibble first."""
    p = np.asarray(pairs).astype(np.uint8)
    v = np.stack([e2m1_value(p), e2m1_value(p >> np.uint8(4))], axis=-1)
    return v.reshape(*p.shape[:-1], 2 * p.shape[-1]) if p.ndim else v


def pack_fp4(x: Any) -> np.ndarray:
    """Values [..., 2C] rounded to E2M1 (:func:`e2m1_code`) and packed into ``f4e2m1x2`` codes
    [..., C], the even-indexed value of each pair in the low nibble."""
    a = np.asarray(x)
    if a.ndim == 0 or a.shape[-1] % 2:
        raise ValueError(f"packs pairs along the last axis, which must have an even extent: {a.shape}")
    c = e2m1_code(a.reshape(*a.shape[:-1], a.shape[-1] // 2, 2))
    return (c[..., 0] | (c[..., 1] << np.uint8(4))).astype(np.uint8)


def _round_float(a: np.ndarray, dt: DType) -> np.ndarray:
    fmt = dt._fmt
    assert fmt is not None
    if a.dtype.kind == "f" and a.dtype.itemsize <= 4:
        # float16/float32 input: float32 holds it exactly, so the float32 fast paths round once.
        a32 = a.astype(np.float32)
        if dt == f32:
            return a32
        if dt == f16:
            return a32.astype(np.float16).astype(np.float32)  # numpy's cast is RNE, overflow -> inf
        if dt == bf16:
            return _bf16_from_f32(a32)
        a64 = a32.astype(np.float64)
    else:
        # float64 (or wider, or integer/bool) input: round once from float64.  Going through float32
        # first would double-round (e.g. 1 + 2**-8 + 2**-30 must become bf16 1 + 2**-7, not 1).
        a64 = _f64_round_to_odd(a) if a.dtype.kind in "iu" and a.dtype.itemsize == 8 else a.astype(np.float64)
        if dt == f32:
            return a64.astype(np.float32)
    return _round_f64(a64, fmt, float(dt.max)).astype(np.float32)


def _bf16_from_f32(a32: np.ndarray) -> np.ndarray:
    """RNE float32 -> bf16 on the bit pattern: add 0x7FFF plus the lowest kept bit, then cut
    the low 16 bits.  A carry out of the mantissa bumps the exponent, which is exactly the
    "round up into the next binade / to inf" case."""
    u = a32.view(np.uint32)
    lsb = (u >> np.uint32(16)) & np.uint32(1)
    r = np.asarray((u + np.uint32(0x7FFF) + lsb) & np.uint32(0xFFFF0000))
    # NaN: the carry could turn a NaN into inf or flip the sign, so keep the sign and top payload
    # bits and force the quiet bit (cutting the payload alone could leave an all-zero mantissa = inf).
    nan = np.isnan(a32)
    if nan.any():  # rare: patch in place rather than paying for a full np.where
        r[nan] = (u[nan] & np.uint32(0xFFFF0000)) | np.uint32(0x00400000)
    return r.view(np.float32)


def _round_f64(a64: np.ndarray, fmt: _FloatFormat, max_finite: float) -> np.ndarray:
    """Round float64 values to a binary format, RNE, then apply the overflow rule.

    Scale each value so that the format's quantum in its binade becomes 1, ``rint`` (which rounds
    ties to even), and scale back.  Scaling by powers of two is exact in float64 for every format
    here, and clamping the exponent at the smallest normal binade makes subnormals share its
    quantum, which is what gradual underflow means.
    """
    _, e = np.frexp(a64)  # a64 = m * 2**e with 0.5 <= |m| < 1, so the binade is 2**(e-1)
    shift = fmt.mantissa_bits - np.maximum(e - 1, fmt.min_normal_exp)
    # rint(±0) and rint(±inf) keep their sign; NaN passes through.
    r = np.ldexp(np.rint(np.ldexp(a64, shift)), -shift)
    # The exponent was unbounded, so overflow shows up as |r| > max (or an inf input).
    over = np.abs(r) > max_finite
    return np.where(over, np.copysign(max_finite if fmt.saturating else np.inf, r), r)


def _f64_round_to_odd(a: np.ndarray) -> np.ndarray:
    """64-bit integers as float64 rounded to odd: exact where float64 holds the value, else the
    neighbour with an odd last mantissa bit.  Rounding that again to a format of at most 51
    fraction bits gives the correctly rounded value of the integer (no double rounding)."""
    hi = (a >> 32).astype(np.float64) * 2.0**32  # exact: 32 significant bits
    lo = (a & 0xFFFFFFFF).astype(np.float64)  # exact, in [0, 2**32)
    s = hi + lo  # rounded once, to nearest even
    bb = s - hi  # TwoSum: the exact error of the sum, a float64 of its own
    err = (hi - (s - bb)) + (lo - bb)
    odd = s.view(np.uint64) & np.uint64(1)
    inexact_even = (err != 0) & (odd == 0)
    return np.where(inexact_even, np.nextafter(s, np.copysign(np.inf, err)), s)


def _to_int(a: np.ndarray, dt: DType) -> np.ndarray:
    st = dt.np_storage
    if a.dtype.kind == "f":
        # cvt.rzi.s32.f32 / cvt.rzi.s64.f32: truncate, clamp to the range, NaN -> 0.  float64
        # holds the i32 bounds exactly; 2**63 - 1 it rounds up to 2**63, so the top is patched
        # after the cast (float32 would turn 2**31 - 1 into 2**31, which overflows the cast too).
        t = np.trunc(a.astype(np.float64))
        over = t >= 2.0 ** (dt.bits - 1)
        t = np.where(np.isnan(t) | over, 0.0, np.clip(t, float(dt.min), float(dt.max)))
        return np.where(over, st.type(dt.max), t.astype(st))
    if a.dtype.kind in "iub":
        # Integer narrowing keeps the low bits (two's complement wrap), like a truncating cvt.
        return a.astype(st)
    raise TypeError(f"cannot convert {a.dtype} values to {dt.name}")


# --------------------------------------------------------------------------- torch interop


def to_torch(x_storage: np.ndarray, dt: DType) -> torch.Tensor:
    """A CPU torch tensor of ``dt``'s torch dtype holding the values of ``x_storage``.

    The values are passed through :func:`round_to` first, so the final torch conversion is
    exact: torch's own fp8 conversion does not follow satfinite, and it never sees an
    out-of-range value here.
    """
    import torch

    st = np.ascontiguousarray(round_to(x_storage, dt))
    if dt.is_packed:  # torch converts to no fp4 type: its bytes are the pairs
        return torch.from_numpy(st).view(dt.torch_dtype())
    return torch.from_numpy(st).to(dt.torch_dtype())


def from_torch_tensor(t: torch.Tensor) -> tuple[np.ndarray, DType]:
    """``t``'s values as tkc storage (a new numpy array) and its dtype.

    Every supported float type widens exactly to float32, so bf16/fp8 tensors go through
    ``t.float()``.  Raises TypeError for torch dtypes tkc does not have.
    """
    dt = from_torch(t.dtype)
    if dt is None:
        raise TypeError(f"tkc has no element type for torch dtype {t.dtype}")
    t = t.detach().cpu()
    if dt.is_packed:
        import torch

        return t.view(torch.uint8).numpy().copy(), dt
    if dt.is_float:
        t = t.float()
    return t.numpy().copy(), dt
