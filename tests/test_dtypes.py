"""tkc.dtypes: names and metadata, and round_to checked bit-for-bit against torch's conversions
and against an independent nearest-value oracle built from each format's full value table."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tkc import dtypes
from tkc.dtypes import BY_NAME, DType, bf16, f8e4m3, f8e5m2, f8e8m0, f16, f32, i1, i32, i64, round_to

SMALL_FLOATS = [bf16, f16, f8e4m3, f8e5m2]
FLOATS = [f32, *SMALL_FLOATS]
RNG = np.random.default_rng(1234)

# Random float32 bit patterns include signalling NaNs, whose casts raise numpy's "invalid" flag.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")


# --------------------------------------------------------------------------- helpers


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal as float32 bit patterns (so -0.0 != 0.0), except that any NaN matches any NaN."""
    got = np.asarray(got, dtype=np.float32)
    want = np.asarray(want, dtype=np.float32)
    assert got.shape == want.shape
    gn, wn = np.isnan(got), np.isnan(want)
    bad = (gn != wn) | (~gn & (got.view(np.uint32) != want.view(np.uint32)))
    if bad.any():
        idx = np.flatnonzero(bad)[:10]
        raise AssertionError(
            f"{bad.sum()} mismatches, e.g. "
            + ", ".join(f"{got.ravel()[i]!r} != {want.ravel()[i]!r}" for i in idx)
        )


def torch_round(x: np.ndarray, dt: DType) -> np.ndarray:
    """torch's own float32 -> dt -> float32 round trip (RNE, but non-saturating for fp8)."""
    return torch.from_numpy(np.asarray(x, dtype=np.float32)).to(dt.torch_dtype()).float().numpy()


def all_values(dt: DType) -> np.ndarray:
    """Every value the format encodes (torch decodes the bit patterns), as float32."""
    if dt == bf16:
        return (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    if dt == f16:
        return np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    return bits.view(dt.torch_dtype()).float().numpy()


def finite_table(dt: DType) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct finite values (with -0.0 dropped) and whether each has an even encoding."""
    vals = all_values(dt)
    codes = np.arange(vals.size)
    keep = np.isfinite(vals) & ~((vals == 0) & np.signbit(vals))
    vals, codes = vals[keep].astype(np.float64), codes[keep]
    order = np.argsort(vals)
    return vals[order], (codes[order] % 2) == 0


def oracle_round(x: np.ndarray, dt: DType) -> np.ndarray:
    """Nearest finite value, ties to the even encoding, for in-range float64 inputs: an oracle
    independent of both round_to and float32.  Differences are exact (Sterbenz) since neighbours
    lie within a factor of two of x or are zero."""
    vals, even = finite_table(dt)
    x = np.asarray(x, dtype=np.float64)
    assert np.all(np.abs(x) <= dt.max)
    hi = np.clip(np.searchsorted(vals, x, side="left"), 1, vals.size - 1)
    lo = hi - 1
    dlo, dhi = x - vals[lo], vals[hi] - x
    pick_hi = (dhi < dlo) | ((dhi == dlo) & even[hi])
    r = np.where(pick_hi, vals[hi], vals[lo])
    return np.where(r == 0, np.copysign(0.0, x), r).astype(np.float32)


def midpoints(dt: DType) -> np.ndarray:
    """Exact ties between neighbouring finite values (and their negatives), as float64."""
    vals, _ = finite_table(dt)
    pos = vals[vals >= 0]
    mids = (pos[:-1] + pos[1:]) / 2  # exact: one more bit than the format, well within float64
    return np.concatenate([mids, -mids])


def random_f32(n: int) -> np.ndarray:
    """Uniform random float32 bit patterns: every exponent equally likely, incl. subnormals."""
    return RNG.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)


# --------------------------------------------------------------------------- metadata


def test_names_and_aliases() -> None:
    assert [d.name for d in dtypes.ALL] == ["f32", "f16", "bf16", "f8e4m3", "f8e5m2", "f8e8m0", "f4e2m1x2", "i32",
                                            "i64", "i1"]
    assert BY_NAME["bool"] is i1
    assert dtypes.from_name("bool") == i1
    assert dtypes.from_name("bf16") is bf16
    assert dtypes.from_name("f64") is None
    for d in dtypes.ALL:
        assert BY_NAME[d.name] is d
        assert str(d) == d.name


def test_equality_and_hash_by_name() -> None:
    other = DType("bf16", 16, "float", np.dtype(np.float32), 0.0, 0.0, "bfloat16")
    assert other == bf16 and hash(other) == hash(bf16)
    assert bf16 != f16 and bf16 != "bf16"
    assert {bf16: 1}[other] == 1
    with pytest.raises(AttributeError):
        bf16.name = "x"  # type: ignore[misc]


def test_kinds_bits_storage() -> None:
    for d in FLOATS:
        assert d.is_float and not d.is_int and not d.is_bool
        assert d.np_storage == np.float32
    assert i32.is_int and i32.np_storage == np.int32 and i32.bits == 32
    assert i64.is_int and i64.np_storage == np.int64 and i64.bits == 64
    assert i1.is_bool and i1.np_storage == np.bool_ and i1.bits == 1
    assert [d.bits for d in FLOATS] == [32, 16, 16, 8, 8]


@pytest.mark.parametrize("d", FLOATS, ids=str)
def test_float_limits_match_torch(d: DType) -> None:
    fi = torch.finfo(d.torch_dtype())
    assert d.max == float(fi.max) and d.min == float(fi.min)
    # The limits themselves are fixed points of rounding.
    assert_same(round_to(np.array([d.min, d.max]), d), np.array([d.min, d.max]))


def test_int_limits() -> None:
    ii = torch.iinfo(torch.int32)
    assert (i32.min, i32.max) == (ii.min, ii.max)
    ll = torch.iinfo(torch.int64)
    assert (i64.min, i64.max) == (ll.min, ll.max)
    assert (i1.min, i1.max) == (0, 1)
    assert (f8e4m3.max, f8e5m2.max) == (448.0, 57344.0)


def test_torch_dtype_mapping() -> None:
    want = {
        f32: torch.float32, f16: torch.float16, bf16: torch.bfloat16, f8e4m3: torch.float8_e4m3fn,
        f8e5m2: torch.float8_e5m2, f8e8m0: torch.float8_e8m0fnu, i32: torch.int32, i64: torch.int64,
        i1: torch.bool,
    }
    for d, td in want.items():
        assert d.torch_dtype() is td
        assert dtypes.from_torch(td) is d
    assert dtypes.from_torch(torch.float64) is None
    assert dtypes.from_torch(torch.int16) is None
    assert dtypes.from_torch("not a dtype") is None


def test_numpy_mapping() -> None:
    assert dtypes.from_numpy(np.float32) is f32
    assert dtypes.from_numpy(np.dtype("float16")) is f16
    assert dtypes.from_numpy(np.int32) is i32
    assert dtypes.from_numpy(bool) is i1
    assert dtypes.from_numpy(np.float64) is None
    assert dtypes.from_numpy(np.int64) is i64
    assert dtypes.from_numpy(np.int16) is None
    assert dtypes.from_numpy("not a dtype") is None


# --------------------------------------------------------------------------- float rounding vs torch


def in_range(x: np.ndarray, dt: DType) -> np.ndarray:
    """Values torch converts the same way as satfinite: fp8 torch overflow differs, so stay within max."""
    x = x[np.isfinite(x)]
    return x[np.abs(x) <= dt.max] if dt in (f8e4m3, f8e5m2) else x


@pytest.mark.parametrize("dt", SMALL_FLOATS, ids=str)
def test_random_bit_patterns_match_torch(dt: DType) -> None:
    x = in_range(random_f32(1 << 20), dt)
    assert_same(round_to(x, dt), torch_round(x, dt))


@pytest.mark.parametrize("dt", SMALL_FLOATS, ids=str)
def test_dense_values_in_range_match_torch(dt: DType) -> None:
    # Dense uniform values across the whole range, plus a log-uniform sweep over the subnormals.
    top = min(float(dt.max), 1e30)
    x = RNG.uniform(-top, top, 1 << 18).astype(np.float32)
    tiny = 2.0 ** dt._fmt.min_normal_exp  # type: ignore[union-attr]
    sub = (np.exp2(RNG.uniform(np.log2(tiny) - dt._fmt.mantissa_bits - 2, np.log2(tiny) + 1, 1 << 16))  # type: ignore[union-attr]
           * RNG.choice([-1.0, 1.0], 1 << 16)).astype(np.float32)
    for v in (x, sub):
        assert_same(round_to(v, dt), torch_round(v, dt))


@pytest.mark.parametrize("dt", SMALL_FLOATS, ids=str)
def test_ties_and_neighbours_match_torch(dt: DType) -> None:
    # Every exact tie between neighbouring values (normal and subnormal), and the float32 values
    # one ulp either side of it, where rounding must go the other way.
    m = midpoints(dt).astype(np.float32)
    assert np.all(m.astype(np.float64) == midpoints(dt))  # all ties are float32-exact
    x = np.concatenate([m, np.nextafter(m, np.float32(np.inf)), np.nextafter(m, np.float32(-np.inf))])
    x = in_range(x, dt)
    got = round_to(x, dt)
    assert_same(got, torch_round(x, dt))
    assert_same(got, oracle_round(x, dt))


@pytest.mark.parametrize("dt", SMALL_FLOATS, ids=str)
def test_exactly_representable_values_are_fixed(dt: DType) -> None:
    v = all_values(dt)
    fin = np.isfinite(v)
    assert_same(round_to(v[fin], dt), v[fin])
    # e5m2 encodes ±inf but satfinite never produces it; bf16/f16 keep it; e4m3fn has none.
    inf_to = dt.max if dt == f8e5m2 else np.inf
    assert_same(round_to(v[np.isinf(v)], dt), np.copysign(inf_to, v[np.isinf(v)]))


@settings(max_examples=400, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_hypothesis_bf16_f16(v: float) -> None:
    x = np.array([v, -v], dtype=np.float32)
    for dt in (bf16, f16):
        assert_same(round_to(x, dt), torch_round(x, dt))


@settings(max_examples=400, deadline=None)
@given(st.floats(min_value=-448.0, max_value=448.0, width=32), st.floats(min_value=-57344.0,
       max_value=57344.0, width=32))
def test_hypothesis_fp8(a: float, b: float) -> None:
    assert_same(round_to(np.float32(a), f8e4m3), torch_round(np.float32(a), f8e4m3))
    assert_same(round_to(np.float32(b), f8e5m2), torch_round(np.float32(b), f8e5m2))


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(max_dims=3, max_side=8),
                  elements=st.floats(width=32, allow_nan=False, allow_infinity=False)))
def test_hypothesis_arrays_keep_shape(x: np.ndarray) -> None:
    for dt in (bf16, f16):
        r = round_to(x, dt)
        assert r.shape == x.shape and r.dtype == np.float32
        assert_same(r, torch_round(x, dt))


# --------------------------------------------------------------------------- special values


def test_bf16_ties_from_bit_patterns() -> None:
    # Low half exactly 0x8000 is a tie: an even kept part stays, an odd one rounds up.
    u = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0xBF818000, 0x7F7F8000, 0x00008000,
                  0x00018000], dtype=np.uint32)
    want = np.array([0x3F800000, 0x3F820000, 0x3F810000, 0x3F800000, 0xBF820000, 0x7F800000, 0x00000000,
                     0x00020000], dtype=np.uint32)
    assert_same(round_to(u.view(np.float32), bf16), want.view(np.float32))


def test_f16_f8_tie_examples() -> None:
    # f16: 1 + 2**-11 is halfway between 1 and 1 + 2**-10 -> even (1); 1 + 3*2**-11 -> 1 + 2**-9.
    assert_same(round_to(np.array([1 + 2**-11, 1 + 3 * 2**-11]), f16), np.array([1.0, 1 + 2**-9]))
    # e4m3: 1.0625 halfway between 1 and 1.125 -> 1; 1.1875 -> 1.25.  Smallest subnormal 2**-9:
    # half of it ties to 0, a bit more rounds up.
    assert_same(round_to(np.array([1.0625, 1.1875, 2**-10, 2**-10 * 1.01, -(2**-10)]), f8e4m3),
                np.array([1.0, 1.25, 0.0, 2**-9, -0.0]))
    # e5m2: 1.125 halfway between 1 and 1.25 -> 1; smallest subnormal 2**-16.
    assert_same(round_to(np.array([1.125, 1.375, 2**-17, 3 * 2**-17]), f8e5m2),
                np.array([1.0, 1.5, 0.0, 2**-15]))


def test_fp8_saturation() -> None:
    inf, nan = np.inf, np.nan
    x = np.array([449, 463.9, 464, 465, 480, 1e6, 3e38, inf, -449, -1e6, -inf, nan], dtype=np.float32)
    assert_same(round_to(x, f8e4m3), np.array([448] * 8 + [-448] * 3 + [nan]))
    y = np.array([57345, 61439, 61440, 65536, 1e9, inf, -61440, -inf, nan], dtype=np.float32)
    assert_same(round_to(y, f8e5m2), np.array([57344] * 6 + [-57344] * 2 + [nan]))
    # Same from float64 input, including values beyond float32 range.
    z = np.array([1e300, -1e300, inf, -inf, nan, 448.0 + 1e-9])
    assert_same(round_to(z, f8e4m3), np.array([448, -448, 448, -448, nan, 448]))
    assert_same(round_to(z, f8e5m2), np.array([57344, -57344, 57344, -57344, nan, 448]))


def test_ieee_overflow_goes_to_inf() -> None:
    x = np.array([65519.99, 65520.0, 1e6, -1e6, np.inf], dtype=np.float32)
    assert_same(round_to(x, f16), np.array([65504, np.inf, np.inf, -np.inf, np.inf]))
    bmax = float(bf16.max)
    x = np.array([bmax, np.finfo(np.float32).max, -np.inf], dtype=np.float32)
    assert_same(round_to(x, bf16), np.array([bmax, np.inf, -np.inf]))
    assert_same(round_to(np.array([1e300, -1e300]), bf16), np.array([np.inf, -np.inf]))
    assert_same(round_to(np.array([1e300, -1e300]), f32), np.array([np.inf, -np.inf]))


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_nan_and_signed_zero(dt: DType) -> None:
    nan_bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFF800001], dtype=np.uint32)
    assert np.isnan(round_to(nan_bits.view(np.float32), dt)).all()
    assert np.isnan(round_to(np.array([np.nan]), dt)).all()
    tiny = np.array([0.0, -0.0, 1e-45, -1e-45], dtype=np.float32)
    want = np.array([0.0, -0.0, 1e-45, -1e-45] if dt == f32 else [0.0, -0.0, 0.0, -0.0], dtype=np.float32)
    assert_same(round_to(tiny, dt), want)
    assert_same(round_to(tiny.astype(np.float64), dt), want)
    assert_same(round_to(np.array([1e-300, -1e-300]), dt), np.array([0.0, -0.0]))


# --------------------------------------------------------------------------- float64 and other inputs


@pytest.mark.parametrize("dt", SMALL_FLOATS, ids=str)
def test_float64_input_rounds_once(dt: DType) -> None:
    # Values just off each tie by far less than a float32 ulp: via float32 they would land on the
    # tie and round to even (double rounding); rounding once must go to the nearer neighbour.
    m = midpoints(dt)
    m = m[(m != 0) & (np.abs(m) < dt.max)]
    x = np.concatenate([m * (1 + 2.0**-40), m * (1 - 2.0**-40), m])
    got = round_to(x, dt)
    assert_same(got, oracle_round(x, dt))
    # Sanity: the float32 detour really would have been wrong for some of these.
    assert not np.array_equal(round_to(x.astype(np.float32), dt), got)


def test_float64_double_rounding_example() -> None:
    x = np.array([1 + 2.0**-8 + 2.0**-30])
    assert np.float32(x[0]) == np.float32(1 + 2.0**-8)  # float32 lands exactly on the bf16 tie
    assert_same(round_to(x, bf16), np.array([1 + 2.0**-7]))


@pytest.mark.parametrize("dt", SMALL_FLOATS, ids=str)
def test_random_float64_matches_oracle(dt: DType) -> None:
    top = min(float(dt.max), 1e30)
    x = np.concatenate([RNG.uniform(-top, top, 1 << 16),
                        np.exp2(RNG.uniform(-30, np.log2(top), 1 << 16)) * RNG.choice([-1.0, 1.0], 1 << 16)])
    x = x[np.abs(x) <= dt.max]
    assert_same(round_to(x, dt), oracle_round(x, dt))


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("src", [np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_],
                         ids=lambda t: np.dtype(t).name)
def test_input_dtypes_and_idempotence(dt: DType, src: type) -> None:
    if np.dtype(src).kind == "f":
        with np.errstate(over="ignore"):
            x = (random_f32(4096).astype(np.float64) if src == np.float64 else random_f32(4096)).astype(src)
        x = np.concatenate([x, np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], dtype=src)])
    elif src == np.bool_:
        x = np.array([True, False])
    else:
        x = RNG.integers(np.iinfo(src).min, np.iinfo(src).max, 4096, dtype=src, endpoint=True)
    r = round_to(x, dt)
    assert r.dtype == np.float32 and r.shape == x.shape
    assert_same(round_to(r, dt), r)
    assert_same(round_to(r.astype(np.float64), dt), r)
    if src in (np.float16, np.float32) and dt != f32:
        assert_same(r, round_to(x.astype(np.float64), dt))  # fast paths agree with the float64 path
    if np.dtype(src).kind in "iub" and dt != f32:
        assert_same(r, round_to(x.astype(np.float64), dt))


@pytest.mark.parametrize("dt", dtypes.ALL, ids=str)
@pytest.mark.parametrize("v", [1.0 + 2**-9, np.float32(np.nan), np.float64(-3.5), np.int64(7), True, 0],
                         ids=repr)
def test_scalars_give_0d_arrays(dt: DType, v: object) -> None:
    r = round_to(v, dt)
    assert isinstance(r, np.ndarray) and r.shape == () and r.dtype == dt.np_storage
    want = round_to(np.array([v]), dt)[0]
    if dt.is_float:
        assert_same(r, want)
    else:
        assert r == want


def test_scalars_and_lists() -> None:
    assert round_to(1.0 + 2**-9, bf16).shape == ()
    assert float(round_to(1.0 + 2**-9, bf16)) == 1.0
    assert_same(round_to([0.1, 3], f8e4m3), np.array([0.1015625, 3.0]))
    with pytest.raises(TypeError):
        round_to(np.array([1j]), f32)


def test_output_is_a_new_array() -> None:
    x = np.array([1.5], dtype=np.float32)
    r = round_to(x, f32)
    r[0] = 7
    assert x[0] == 1.5


# --------------------------------------------------------------------------- ints and bools


def test_float_to_i32_truncates_and_saturates() -> None:
    x = np.array([-2.7, 2.7, -0.5, 0.5, -0.0, np.nan, np.inf, -np.inf, 3e9, -3e9, 2147483647.0,
                  2147483648.0, -2147483648.0, -2147483649.0])
    want = [-2, 2, 0, 0, 0, 0, 2**31 - 1, -(2**31), 2**31 - 1, -(2**31), 2**31 - 1, 2**31 - 1,
            -(2**31), -(2**31)]
    # In float32, 2147483647.0 becomes 2**31 and -2147483649.0 becomes -2**31: same results.
    for src in (np.float64, np.float32):
        with np.errstate(over="ignore"):
            r = round_to(x.astype(src), i32)
        assert r.dtype == np.int32 and r.tolist() == want
    assert round_to(np.array([1.5, -1.5], dtype=np.float16), i32).tolist() == [1, -1]


def test_int_to_i32_wraps() -> None:
    x = np.array([2**31, -(2**31) - 1, 2**32 + 5, -1, 7], dtype=np.int64)
    assert round_to(x, i32).tolist() == [-(2**31), 2**31 - 1, 5, -1, 7]
    assert round_to(np.array([2**32 - 1], dtype=np.uint64), i32).tolist() == [-1]
    assert round_to(np.array([True, False]), i32).tolist() == [1, 0]
    assert round_to(np.array([200], dtype=np.uint8), i32).tolist() == [200]
    r = round_to(np.arange(-5, 5, dtype=np.int32), i32)
    assert r.dtype == np.int32 and r.tolist() == list(range(-5, 5))


def test_float_to_i64_truncates_and_saturates() -> None:
    # cvt.rzi.s64.f32: float64 cannot hold 2**63 - 1, so the top clamps after the cast.
    x = np.array([-2.7, 2.7, np.nan, np.inf, -np.inf, 1e19, -1e19, 2.0**63, -(2.0**63), 2.0**62, 3e9])
    want = [-2, 2, 0, 2**63 - 1, -(2**63), 2**63 - 1, -(2**63), 2**63 - 1, -(2**63), 2**62, 3_000_000_000]
    for src in (np.float64, np.float32):
        r = round_to(x.astype(src), i64)
        assert r.dtype == np.int64 and r.tolist() == want


def test_int_to_i64_is_exact_and_i64_to_i32_keeps_the_low_bits() -> None:
    x = np.array([2**40 + 3, -(2**63), 2**63 - 1, -5], dtype=np.int64)
    assert round_to(x, i64).tolist() == x.tolist()
    assert round_to(np.array([-7, 2**31 - 1], dtype=np.int32), i64).tolist() == [-7, 2**31 - 1]
    assert round_to(x, i32).tolist() == [3, 0, -1, -5]
    assert round_to(np.array([True, False]), i64).tolist() == [1, 0]


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_i64_to_float_rounds_once_like_torch(dt: DType) -> None:
    # Past 2**53 a float64 detour would round twice (2**62 + 2**38 + 1 is just above a tie of f32).
    rng = np.random.default_rng(7)
    x = rng.integers(-(2**63), 2**63 - 1, 20000, dtype=np.int64, endpoint=True) >> rng.integers(0, 63, 20000)
    x = np.concatenate([x, [2**62 + 2**38 + 1, 2**53 + 1, -(2**63), 2**63 - 1, 2**24 + 1, 0, -1]])
    got = round_to(x, dt)
    if dt.bits == 8:  # torch's fp8 conversion does not saturate: compare where it is in range
        x = x[np.abs(x.astype(np.float64)) <= dt.max]
        got = round_to(x, dt)
    want = torch.from_numpy(x).to(dt.torch_dtype()).float().numpy()
    assert_same(got, want)


def test_to_i1_is_nonzero() -> None:
    x = np.array([0.0, -0.0, np.nan, 2.0, 0.1, -np.inf, 1e-45])
    assert round_to(x, i1).tolist() == [False, False, True, True, True, True, True]
    assert round_to(np.array([0, 1, -3], dtype=np.int32), i1).tolist() == [False, True, True]
    r = round_to(np.array([True, False]), i1)
    assert r.dtype == np.bool_ and r.tolist() == [True, False]


def test_bool_to_float() -> None:
    for dt in FLOATS:
        assert_same(round_to(np.array([True, False]), dt), np.array([1.0, 0.0]))


# --------------------------------------------------------------------------- torch interop


@pytest.mark.parametrize("dt", dtypes.ALL, ids=str)
def test_torch_round_trip(dt: DType) -> None:
    if dt.is_float:
        x = round_to(RNG.standard_normal((3, 5)) * 100, dt)
    elif dt.is_int:
        x = RNG.integers(-1000, 1000, (3, 5)).astype(np.int32)
    else:
        x = RNG.random((3, 5)) < 0.5
    t = dtypes.to_torch(x, dt)
    assert t.dtype is dt.torch_dtype() and t.device.type == "cpu" and tuple(t.shape) == (3, 5)
    back, bdt = dtypes.from_torch_tensor(t)
    assert bdt is dt and back.dtype == dt.np_storage
    if dt.is_float:
        assert_same(back, x)
    else:
        assert np.array_equal(back, x)


def test_to_torch_saturates_before_converting() -> None:
    t = dtypes.to_torch(np.array([1000.0, -np.inf, 0.3]), f8e4m3)
    assert t.float().tolist() == [448.0, -448.0, 0.3125]
    t = dtypes.to_torch(np.array([1e6, np.inf]), f8e5m2)
    assert t.float().tolist() == [57344.0, 57344.0]


def test_from_torch_tensor_of_native_tensors() -> None:
    for td in (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2):
        t = (torch.randn(64) * 10).to(td)
        x, dt = dtypes.from_torch_tensor(t)
        assert dt == dtypes.from_torch(td) and x.dtype == np.float32
        assert_same(x, t.float().numpy())
        assert_same(round_to(x, dt), x)  # torch's values are already representable
    g = torch.ones(3, requires_grad=True)
    x, dt = dtypes.from_torch_tensor(g)
    assert dt is f32 and x.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(TypeError, match="float64"):
        dtypes.from_torch_tensor(torch.zeros(2, dtype=torch.float64))


# --------------------------------------------------------------------------- e8m0 (MX scales)


def e8m0_cases() -> np.ndarray:
    """f32 values where E8M0's rounding decides: every exponent with the mantissas at, just
    below and just above the middle of its binade (normal and subnormal), zeros, infinities,
    NaNs of both signs, and random bit patterns."""
    exps = np.arange(256, dtype=np.uint32) << np.uint32(23)
    mants = np.array([0, 1, 0x200000, 0x3FFFFF, 0x400000, 0x400001, 0x600000, 0x7FFFFF], dtype=np.uint32)
    bits = (exps[:, None] | mants[None, :]).ravel()
    bits = np.concatenate([bits, bits | np.uint32(0x80000000), RNG.integers(0, 2**32, 1 << 18, dtype=np.uint32)])
    return bits.view(np.float32)


def test_e8m0_rounds_as_torch_converts() -> None:
    x = e8m0_cases()
    want = torch.from_numpy(x.copy()).to(torch.float8_e8m0fnu)
    np.testing.assert_array_equal(dtypes.e8m0_code(x), want.view(torch.uint8).numpy())
    assert_same(round_to(x, f8e8m0), want.float().numpy())


def test_e8m0_values() -> None:
    """2**(code - 127) from 2**-127 to 2**127, 255 NaN; each finite value converts to itself,
    a negative one as its magnitude, 0 to 2**-127 and what rounds past 2**127 to NaN."""
    codes = np.arange(256)
    v = dtypes.e8m0_value(codes)
    assert np.isnan(v[255]) and v[0] == np.float32(2.0**-127) and v[254] == np.float32(2.0**127)
    np.testing.assert_array_equal(dtypes.e8m0_code(v[:255]), codes[:255])
    assert (f8e8m0.min, f8e8m0.max) == (2.0**-127, 2.0**127)
    assert_same(round_to(np.array([-8.0, 0.0, 3.0, 2.9, 1.5 * 2.0**127, np.inf]), f8e8m0),
                np.array([8.0, 2.0**-127, 4.0, 2.0, np.nan, np.nan], dtype=np.float32))
    assert_same(round_to(np.float64(2.0**-130), f8e8m0), np.float32(2.0**-127))
