"""Atomics into global memory and write-write races.

Each kernel runs in the interpreter against a numpy/torch reference, in the emulator against
the interpreter (floats to the tolerance of another order of additions), through ptxas
without spills, and on a GPU against the interpreter.  Plain stores of two programs onto one
element are refused by both executors, naming both programs and the line."""

from __future__ import annotations

import numpy as np
import pytest

from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.errors import TkcEmulatorError, TkcError, TkcInterpretError
from tkc.interpreter import random_args, run_kernel
from tkc.semantics import atomic_update
from device_checks import require_gpu, assert_no_spills, assert_refused, needs_ptxas, run_on_gpu
from tkc import dtypes

# Split-K: SPLIT programs per output tile add their partial products into c (f32), tails on
# every axis.
SPLITK = """@kernel
def splitk(a: bf16[M, K], b: bf16[K, N], c: f32[M, N], BM: const = 64, BN: const = 64, BK: const = 64,
           SPLIT: const = 3):
    grid(cdiv(M, BM), cdiv(N, BN), SPLIT)
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(program_id(2), cdiv(K, BK), SPLIT):
        acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
    atomic_add(c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN], acc)
"""
# Every program takes a ticket: the old counter value comes back to all its threads.
TICKET = """@kernel
def ticket(order: i32[N], counter: i32[1]):
    grid(N)
    t = atomic_add(counter[0], 1)
    order[program_id(0)] = t + 0 * t
"""
# Row maxima and minima of x over column blocks, one program a block (f32 max through the
# bits, i32 min); and column sums in bf16 (one red per element).
EXTREMA = """@kernel
def extrema(x: f32[M, N], xi: i32[M, N], xb: bf16[M, N], mx: f32[M], mn: i32[M], s: bf16[N],
            BM: const = 32, BN: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    t = load(x[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN], other=-inf)
    atomic_max(mx[pm*BM:(pm+1)*BM], t.max(1))
    ti = load(xi[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN], other=1000)
    atomic_min(mn[pm*BM:(pm+1)*BM], ti.min(1))
    tb = xb[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN].to(f32)
    atomic_add(s[pn*BN:(pn+1)*BN], tb.sum(0).to(bf16))
"""
# A histogram through indices read from a tensor: one element per program and bin.
HISTOGRAM = """@kernel
def histogram(ids: i32[N], w: f32[N], hist: f32[B], count: i32[B]):
    grid(N)
    i = program_id(0)
    k = ids[i]
    atomic_add(hist[k], w[i])
    atomic_add(count[k], 1)
"""
# The first program to swap its id into owner wins; everyone learns the winner.
CLAIM = """@kernel
def claim(owner: i32[1], seen: i32[N], last: f32[1]):
    grid(N)
    p = program_id(0)
    old = atomic_cas(owner[0], -1, p, sem="acq_rel")
    seen[p] = old
    atomic_exch(last[0], 1.5)
"""

CASES = {
    "splitk": (SPLITK, {"M": 100, "N": 72, "K": 296}),
    "ticket": (TICKET, {"N": 70}),
    "extrema": (EXTREMA, {"M": 70, "N": 150}),
    "histogram": (HISTOGRAM, {"N": 90, "B": 7}),
    "claim": (CLAIM, {"N": 9}),
}


def _args(name: str, seed: int) -> list:
    src, dims = CASES[name]
    k = compile_kernel(src, stop="tkir", cache=False).kernel_op
    args = random_args(k, dims, seed, (-9, 9))
    if name == "histogram":
        args[0] = np.random.default_rng(seed).integers(-1, 8, dims["N"]).astype(np.int32)  # -1 and 7: outside
    if name == "claim":
        args[0][...] = -1
    if name == "extrema":
        args[3][...] = -np.inf
        args[4][...] = 1000
    return args


def _interpret(name: str, args: list) -> list:
    return _interpret_text(CASES[name][0], args)


def _interpret_text(text: str, args: list) -> list:
    out = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_kernel(compile_kernel(text, stop="tkir", cache=False).kernel_op, out)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_interpreter_matches_numpy(seed: int) -> None:
    a, b, c = _args("splitk", seed)
    got = _interpret("splitk", [a, b, c])[2]
    np.testing.assert_allclose(got, c + a @ b, rtol=1e-4, atol=1e-3)

    order, counter = _args("ticket", seed)
    got_order, got_counter = _interpret("ticket", [order, counter])
    assert sorted(got_order - counter[0]) == list(range(70)) and got_counter[0] == counter[0] + 70

    x, xi, xb, mx, mn, s = _args("extrema", seed)
    out = _interpret("extrema", [x, xi, xb, mx, mn, s])
    np.testing.assert_array_equal(out[3], x.max(1))
    np.testing.assert_array_equal(out[4], np.minimum(xi.min(1), 1000))
    want_s = dtypes.round_to(s.astype(np.float64) + xb.astype(np.float64).sum(0), dtypes.bf16)
    np.testing.assert_allclose(out[5], want_s, rtol=2e-2, atol=5e-2)

    ids, w, hist, count = _args("histogram", seed)
    out = _interpret("histogram", [ids, w, hist, count])
    inside = (ids >= 0) & (ids < 7)
    np.testing.assert_allclose(out[2], hist + np.bincount(ids[inside], w[inside], 7), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[3], count + np.bincount(ids[inside], minlength=7))

    owner, seen, last = _args("claim", seed)
    out = _interpret("claim", [owner, seen, last])
    assert out[0][0] == 0 and out[1][0] == -1 and (out[1][1:] == 0).all() and out[2][0] == 1.5


def test_float_max_and_min_order_the_bits_as_the_gpu_does() -> None:
    v = np.array([-np.inf, -2.0, -0.0, 0.0, 1e-40, 3.0, np.inf], np.float32)
    old, new = np.meshgrid(v, v)
    got_max = atomic_update("max", dtypes.f32, old.copy(), new)
    got_min = atomic_update("min", dtypes.f32, old.copy(), new)
    np.testing.assert_array_equal(got_max, np.maximum(old, new))  # -0.0 < +0.0: equal as numbers
    np.testing.assert_array_equal(got_min, np.minimum(old, new))
    assert np.signbit(atomic_update("max", dtypes.f32, np.float32(-0.0), np.float32(0.0))) == False  # noqa: E712
    assert np.signbit(atomic_update("min", dtypes.f32, np.float32(0.0), np.float32(-0.0)))


def test_a_nan_value_wins_every_max_and_loses_every_min_whatever_its_sign() -> None:
    old = np.array([-np.inf, -1.0, 0.0, 2.0, np.inf], np.float32)
    for nan in (np.float32(np.nan), -np.float32(np.nan)):  # numpy's sqrt(-1) is the negative one
        got_max = atomic_update("max", dtypes.f32, old.copy(), np.full_like(old, nan))
        assert (got_max.view(np.uint32) == 0x7FFFFFFF).all()
        np.testing.assert_array_equal(atomic_update("min", dtypes.f32, old.copy(), np.full_like(old, nan)), old)


# NaNs of both signs in one column (numpy's sqrt of a negative is -NaN): the reduction's NaN
# differs between executors (which one wins a tree), the atomic's result must not.
NAN_MAX = """@kernel
def nan_max(x: f32[M, N], y: f32[N], z: f32[N]):
    grid(1)
    t = x[0:16, 0:64]
    v = sqrt(-abs(t))
    w = where(t > 1.0, v, where(t < -1.0, -v, t))
    atomic_max(y[0:64], w.max(0))
    atomic_min(z[0:64], w.min(0))
"""


def _nan_args(seed: int) -> list:
    x = np.random.default_rng(seed).standard_normal((16, 64)).astype(np.float32) * 2
    return [x, np.full(64, -5.0, np.float32), np.full(64, 5.0, np.float32)]


@pytest.mark.parametrize("seed", [0, 1])
def test_nan_values_agree_between_executors(seed: int) -> None:
    want = _interpret_text(NAN_MAX, _nan_args(seed))
    got = _nan_args(seed)
    emulate(compile_kernel(NAN_MAX, stop="hopper", cache=False).kernel_op, got, seed=seed)
    assert np.isnan(want[1]).any() and not np.isnan(want[2]).any()
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])


@pytest.mark.gpu
def test_nan_values_on_gpu_as_in_the_interpreter() -> None:
    require_gpu()
    args = _nan_args(0)
    want = _interpret_text(NAN_MAX, [a.copy() for a in args])
    got = run_on_gpu(compile_kernel(NAN_MAX, cache=False), args)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_emulator_matches_interpreter(name: str, seed: int) -> None:
    hopper = compile_kernel(CASES[name][0], stop="hopper", cache=False).kernel_op
    args = _args(name, seed)
    want = _interpret(name, args)
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    emulate(hopper, got, seed=seed)
    for w, g in zip(want, got):
        if name in ("ticket", "claim") and g.dtype == np.int32 and g.size > 1:
            # which program takes which ticket is up to the order the programs run in
            assert sorted(g.tolist()) == sorted(w.tolist())
        elif g.dtype == np.int32 or name == "extrema" and g.ndim == 1 and g.size == 70:
            np.testing.assert_array_equal(g, w)  # integers, and extrema's f32 max: exact in any order
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4 if name != "extrema" else 5e-2)


@needs_ptxas
@pytest.mark.parametrize("name", list(CASES))
def test_assembles_without_spills(name: str) -> None:
    assert_no_spills(compile_kernel(CASES[name][0], stop="cubin", cache=False))


def test_a_tile_adds_with_vector_reductions_and_a_fetch_reads_through_shared_memory() -> None:
    ptx = compile_kernel(SPLITK, stop="ptx", cache=False).asm["ptx"]
    # A product's accumulator goes through shared memory and a TMA reduction ...
    assert "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group" in ptx and "red.relaxed" not in ptx
    # ... or, with the pin tma_store off, is added by its threads, pairs of columns at a time.
    ptx = compile_kernel(SPLITK, {"tma_store": False}, stop="ptx", cache=False).asm["ptx"]
    assert "red.relaxed.gpu.global.add.v2.f32" in ptx and "cp.reduce" not in ptx
    loaded = SPLITK.replace("acc += a[pm*BM", "acc += 0.0 * a[pm*BM").replace(
        "atomic_add(c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN], acc)",
        "atomic_add(c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN], c2[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN])").replace(
        "c: f32[M, N],", "c: f32[M, N], c2: f32[M, N],")
    assert "red.relaxed.gpu.global.add.v4.f32" in compile_kernel(loaded, stop="ptx", cache=False).asm["ptx"]
    ticket = compile_kernel(TICKET, stop="ptx", cache=False).asm["ptx"]
    assert "atom.acq_rel.gpu.global.add.s32" in ticket and ticket.count("bar.sync") == 2
    claim = compile_kernel(CLAIM, stop="ptx", cache=False).asm["ptx"]
    assert "atom.acq_rel.gpu.global.cas.b32" in claim and "atom.acq_rel.gpu.global.exch.b32" in claim


# ------------------------------------------------------------------------------ races
RACY = """@kernel
def racy(x: f32[M, N], y: f32[M, N], BN: const = 64):
    grid(cdiv(N, BN), 2)
    pn = program_id(0)
    y[0:16, pn*BN:(pn+1)*BN] = x[0:16, pn*BN:(pn+1)*BN]
"""
MIXED = """@kernel
def mixed(x: f32[N], y: f32[N]):
    grid(2)
    if program_id(0) == 0:
        y[0] = x[0]
    else:
        atomic_add(y[0], x[1])
"""


# Both programs add into y[0:16], then program 1 stores there: a race with program 0's atomics
# although program 1's own were the last.
AFTER_ATOMICS = """@kernel
def after_atomics(x: f32[N], y: f32[N]):
    grid(2)
    atomic_add(y[0:16], x[0:16])
    if program_id(0) == 1:
        y[0:16] = x[0:16]
"""


def test_a_store_after_several_programs_atomics_is_a_race() -> None:
    tile_ir = compile_kernel(AFTER_ATOMICS, stop="tkir", cache=False).kernel_op
    args = random_args(tile_ir, {"N": 40})
    race = r"element \[0\] of 'y': several programs update it atomically \(line 4\) and program \(1,\) stores"
    with pytest.raises(TkcInterpretError, match=race):
        run_kernel(tile_ir, [a.copy() for a in args])
    with pytest.raises(TkcEmulatorError, match=race):
        emulate(compile_kernel(AFTER_ATOMICS, stop="hopper", cache=False).kernel_op, [a.copy() for a in args])


@pytest.mark.parametrize("src, line, how", [(RACY, 5, "stores to it"), (MIXED, 7, "updates it atomically")])
def test_two_programs_writing_one_element_is_a_race(src: str, line: int, how: str) -> None:
    tile_ir = compile_kernel(src, stop="tkir", cache=False).kernel_op
    args = random_args(tile_ir, {"M": 20, "N": 100})
    race = (r"write-write race on element \[0(, 0)?\] of 'y': program \(0(, 0)?,?\) stores to it \(line \d\) "
            r"and program \(\d(, \d)?,?\) " + how)
    with pytest.raises(TkcInterpretError, match=race) as e:
        run_kernel(tile_ir, [a.copy() for a in args])
    assert e.value.loc.line == line
    hopper = compile_kernel(src, stop="hopper", cache=False).kernel_op
    with pytest.raises(TkcEmulatorError, match="write-write race on element"):
        emulate(hopper, [a.copy() for a in args])


@pytest.mark.parametrize("body, message", [
    ("atomic_max(h[0:16], x[0:16])", r"atomic_max\(\) takes a tensor of f32, i32, and 'h' is bf16"),
    ('atomic_add(y[0:16], x[0:16], sem="seq")', r"sem is one of 'relaxed', 'acquire', 'release', 'acq_rel'"),
    ('atomic_add(y[0:16], x[0:16], sem="acquire")', r"into a tile reads nothing back, so sem='acquire'"),
    ("atomic_cas(y[0:16], x[0:16], x[0:16])", r"atomic_cas\(\) swaps one element"),
    ("z = atomic_add(y[0:16], x[0:16])\n    y[0:16] = z", r"expected a value to store into 'y', got no value"),
    ("atomic_add(x, 1.0)", r"takes a tensor slice or element like x\[i\]"),
    ("atomic_add(y[0:16], x[0:16].to(bf16))", r"adding tile<16xbf16> into f32 tensor 'y'"),
])
def test_misuse_is_a_located_error(body: str, message: str) -> None:
    src = f"@kernel\ndef k(x: f32[N], y: f32[N], h: bf16[N]):\n    grid(1)\n    {body}\n"
    assert_refused(src, TkcError, message, 4 + body.count("\n"), stop="tkir")  # the body's last line


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_on_gpu_as_in_the_interpreter(name: str) -> None:
    require_gpu()
    c = compile_kernel(CASES[name][0], cache=False)
    args = _args(name, 5)
    want = _interpret(name, args)
    params = c.kernel_op.regions[0].block.args
    got = run_on_gpu(c, args)
    if name == "ticket":
        assert sorted(got[0].tolist()) == sorted(want[0].tolist()) and got[1][0] == want[1][0]
    elif name == "claim":
        winner = int(got[0][0])
        assert 0 <= winner < 9 and got[1][winner] == -1 and (np.delete(got[1], winner) == winner).all()
        assert got[2][0] == 1.5
    else:
        for w, g, p in zip(want, got, params):
            # bf16 sums round at every atomic add, in the GPU's order: a few ulps apart
            bf16 = p.type.dtype.name == "bf16"
            np.testing.assert_allclose(g, np.asarray(w, np.float32), rtol=3e-2 if bf16 else 1e-4,
                                       atol=0.2 if bf16 else 1e-3, err_msg=p.name_hint)
