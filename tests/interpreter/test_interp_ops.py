"""The interpreter's op semantics, on small hand-written tile IR kernels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tkc.dtypes import bf16, f16, f32, f8e4m3, i32, round_to
from tkc.errors import TkcInterpretError
from tkc.interpreter import random_args, run_kernel
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify

KERNELS = Path(__file__).parent / "kernels"


def compile_ir(text: str):
    m = parse_module(text, "test.tkir")
    verify(m)
    return m.kernel()


def gemm_kernel(out_dtype: str = "bf16"):
    text = (KERNELS / "gemm.tkir").read_text()
    if out_dtype != "bf16":
        text = text.replace("%c: tensor<bf16[M, N]>", f"%c: tensor<{out_dtype}[M, N]>")
        text = text.replace("tile.cast %acc : tile<64x64xbf16>", f"tile.cast %acc : tile<64x64x{out_dtype}>")
    return compile_ir(text)


# ------------------------------------------------------------------- GEMM
@pytest.mark.parametrize("M,N,K", [(100, 72, 80), (64, 64, 32), (17, 130, 5)])
def test_gemm_with_tails_matches_numpy(M, N, K):
    kernel = gemm_kernel("f32")
    a, b, c = random_args(kernel, {"M": M, "N": N, "K": K}, seed=M + N + K)
    a, b = round_to(a, bf16), round_to(b, bf16)
    c[...] = np.nan  # every element must be written by exactly the grid's tiles
    run_kernel(kernel, [a, b, c])
    ref = a.astype(np.float64) @ b.astype(np.float64)  # bf16 products are exact; only f32 sums round
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * np.sqrt(K))


def test_gemm_bf16_output_is_rounded():
    kernel = gemm_kernel("bf16")
    a, b, c = random_args(kernel, {"M": 100, "N": 72, "K": 80}, seed=1)
    run_kernel(kernel, [a, b, c])
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.array_equal(round_to(c, bf16), c)  # the stored values are bf16 values
    np.testing.assert_allclose(c, ref, rtol=1e-2, atol=1e-2)


# ------------------------------------------------------------ elementwise
def unary_ir(op: str, dt: str, odt: str | None = None) -> str:
    odt = odt or dt
    return f"""
tile.kernel @k {{
^(%x: tensor<{dt}[16, 32]>, %o: tensor<{odt}[16, 32]>):
  %c1 = tile.constant {{value = 1}} : i32
  tile.grid %c1
  %c0 = tile.constant {{value = 0}} : i32
  %a = tile.load %x, %c0, %c0 {{box = [16, 32]}} : tile<16x32x{dt}>
  %r = {op} %a : tile<16x32x{odt}>
  tile.store %o, %r, %c0, %c0 {{box = [16, 32]}}
  tile.return
}}"""


def binary_ir(op: str, dt: str, odt: str | None = None, attrs: str = "") -> str:
    odt = odt or dt
    return f"""
tile.kernel @k {{
^(%x: tensor<{dt}[16, 32]>, %y: tensor<{dt}[16, 32]>, %o: tensor<{odt}[16, 32]>):
  %c1 = tile.constant {{value = 1}} : i32
  tile.grid %c1
  %c0 = tile.constant {{value = 0}} : i32
  %a = tile.load %x, %c0, %c0 {{box = [16, 32]}} : tile<16x32x{dt}>
  %b = tile.load %y, %c0, %c0 {{box = [16, 32]}} : tile<16x32x{dt}>
  %r = {op} %a, %b {attrs}: tile<16x32x{odt}>
  tile.store %o, %r, %c0, %c0 {{box = [16, 32]}}
  tile.return
}}"""


FLOAT_BINARY = {"tile.add": np.add, "tile.sub": np.subtract, "tile.mul": np.multiply,
                "tile.div": np.divide, "tile.maximum": np.maximum, "tile.minimum": np.minimum}
FLOAT_UNARY = {"tile.neg": np.negative, "tile.abs": np.abs, "tile.exp": np.exp, "tile.exp2": np.exp2,
               "tile.log": np.log, "tile.log2": np.log2, "tile.sqrt": np.sqrt,
               "tile.rsqrt": lambda x: 1 / np.sqrt(x), "tile.tanh": np.tanh}


@pytest.mark.parametrize("dt", [f32, bf16, f16, f8e4m3])
@pytest.mark.parametrize("op", sorted(FLOAT_BINARY))
def test_float_binary_rounds_result_once(op, dt):
    kernel = compile_ir(binary_ir(op, dt.name))
    x, y, o = random_args(kernel, {}, seed=3)
    run_kernel(kernel, [x, y, o])
    # Computed in f32 from the (exact) storage values, then rounded to the dtype.
    expect = round_to(FLOAT_BINARY[op](x, y), dt)
    assert np.array_equal(o, expect, equal_nan=True)
    assert np.array_equal(round_to(o, dt), o, equal_nan=True)


@pytest.mark.parametrize("dt", [f32, bf16])
@pytest.mark.parametrize("op", sorted(FLOAT_UNARY))
def test_float_unary_rounds_result_once(op, dt):
    kernel = compile_ir(unary_ir(op, dt.name))
    x, o = random_args(kernel, {}, seed=4)
    x[0, :4] = [0.0, -0.0, np.inf, -np.inf]  # log(0) = -inf and exp(-inf) = 0 are ordinary results
    with np.errstate(all="ignore"):
        expect = round_to(FLOAT_UNARY[op](x), dt)
    run_kernel(kernel, [x, o])
    assert np.array_equal(o, expect, equal_nan=True)


def test_bf16_add_rounds_ties_to_even():
    kernel = compile_ir(binary_ir("tile.add", "bf16"))
    x = np.full((16, 32), 1.0, np.float32)
    y = np.full((16, 32), 2.0**-8, np.float32)  # 1 + 2**-8: halfway between 1 and 1 + 2**-7
    y[0, 0] = 3 * 2.0**-8  # 1 + 3 * 2**-8: halfway between 1 + 2**-7 and 1 + 2**-6
    o = np.zeros((16, 32), np.float32)
    run_kernel(kernel, [x, y, o])
    assert o[1, 1] == 1.0 and o[0, 0] == 1 + 2.0**-6  # both ties go to the even mantissa


@pytest.mark.parametrize("op", ["tile.maximum", "tile.minimum"])
def test_maximum_propagates_nan(op):
    kernel = compile_ir(binary_ir(op, "f32"))
    x = np.ones((16, 32), np.float32)
    y = np.ones((16, 32), np.float32)
    x[0, 0] = y[1, 1] = np.nan
    o = np.zeros((16, 32), np.float32)
    run_kernel(kernel, [x, y, o])
    assert np.isnan(o[0, 0]) and np.isnan(o[1, 1]) and np.isnan(o).sum() == 2  # like numpy and torch


@pytest.mark.parametrize("pred,fn", [("lt", np.less), ("le", np.less_equal), ("gt", np.greater),
                                     ("ge", np.greater_equal), ("eq", np.equal), ("ne", np.not_equal)])
def test_cmp(pred, fn):
    kernel = compile_ir(binary_ir("tile.cmp", "i32", "i1", f'{{pred = "{pred}"}} '))
    x, y, o = random_args(kernel, {}, seed=5)
    run_kernel(kernel, [x, y, o])
    assert np.array_equal(o, fn(x, y))


SCALAR_INT_IR = """
tile.kernel @k {
^(%x: tensor<i32[6]>, %y: tensor<i32[6]>, %o: tensor<i32[6]>):
  %c6 = tile.constant {value = 6} : i32
  tile.grid %c6
  %p = tile.program_id {axis = 0} : i32
  %a = tile.load %x, %p {box = [1], squeeze = [0]} : i32
  %b = tile.load %y, %p {box = [1], squeeze = [0]} : i32
  %r = OP %a, %b : i32
  tile.store %o, %r, %p {box = [1], squeeze = [0]}
  tile.return
}"""

TILE_INT_IR = """
tile.kernel @k {
^(%x: tensor<i32[6]>, %y: tensor<i32[6]>, %o: tensor<i32[6]>):
  %c1 = tile.constant {value = 1} : i32
  tile.grid %c1
  %c0 = tile.constant {value = 0} : i32
  %a = tile.load %x, %c0 {box = [16]} : tile<16xi32>
  %b = tile.load %y, %c0 {box = [16]} : tile<16xi32>
  %r = OP %a, %b : tile<16xi32>
  tile.store %o, %r, %c0 {box = [16]}
  tile.return
}"""


@pytest.mark.parametrize("template", [SCALAR_INT_IR, TILE_INT_IR], ids=["scalar", "tile"])
@pytest.mark.parametrize("op,expect", [
    ("tile.floordiv", [-4, 3, 3, -4, 0, -1]),
    ("tile.rem", [1, 1, -1, -1, 0, 2]),
    ("tile.cdiv", [-3, 4, 4, -3, 0, 0]),
    ("tile.add", [-5, 9, -9, 5, 3, -2147483648]),
])
def test_integer_ops_on_negatives(template, op, expect):
    # Floor semantics like Python; the tile variant also divides the zero padding by zero (-> 0).
    kernel = compile_ir(template.replace("OP", op))
    x = np.array([-7, 7, -7, 7, 0, 2**31 - 1], np.int32)
    y = np.array([2, 2, -2, -2, 3, 1], np.int32)
    if op != "tile.add":
        x[5], y[5] = -1, 3
    o = np.zeros(6, np.int32)
    run_kernel(kernel, [x, y, o])
    assert o.tolist() == expect


def test_select_cast_and_constants():
    kernel = compile_ir("""
tile.kernel @k {
^(%x: tensor<f32[16]>, %o: tensor<bf16[16]>, %n: tensor<i32[16]>):
  %c1 = tile.constant {value = 1} : i32
  tile.grid %c1
  %c0 = tile.constant {value = 0} : i32
  %a = tile.load %x, %c0 {box = [16]} : tile<16xf32>
  %z = tile.constant {value = 0.0} : tile<16xf32>
  %t = tile.constant {value = 0.1} : tile<16xf32>
  %pos = tile.cmp %a, %z {pred = "gt"} : tile<16xi1>
  %s = tile.select %pos, %a, %t : tile<16xf32>
  %b = tile.cast %s : tile<16xbf16>
  tile.store %o, %b, %c0 {box = [16]}
  %i = tile.cast %a : tile<16xi32>
  tile.store %n, %i, %c0 {box = [16]}
  tile.return
}""")
    x = np.linspace(-3.7, 3.7, 16).astype(np.float32)
    x[0] = np.nan
    o, n = np.zeros(16, np.float32), np.zeros(16, np.int32)
    run_kernel(kernel, [x, o, n])
    expect = round_to(np.where(x > 0, x, np.float32(0.1)), bf16)
    assert np.array_equal(o, expect)
    assert n.tolist() == [0] + np.trunc(x[1:]).astype(int).tolist()  # truncation; NaN -> 0


def test_shape_ops():
    kernel = compile_ir("""
tile.kernel @k {
^(%o: tensor<i32[16, 32]>):
  %c1 = tile.constant {value = 1} : i32
  tile.grid %c1
  %c0 = tile.constant {value = 0} : i32
  %r = tile.arange {start = 0} : tile<32xi32>
  %c = tile.arange {start = 5} : tile<16xi32>
  %r2 = tile.expand_dims %c {axis = 0} : tile<1x16xi32>
  %c2 = tile.expand_dims %r {axis = 1} : tile<32x1xi32>
  %rb = tile.broadcast %r2 : tile<32x16xi32>
  %cb = tile.broadcast %c2 : tile<32x16xi32>
  %k = tile.constant {value = 100} : i32
  %ks = tile.splat %k : tile<32x16xi32>
  %m = tile.mul %cb, %ks : tile<32x16xi32>
  %s = tile.add %m, %rb : tile<32x16xi32>
  %t = tile.transpose %s : tile<16x32xi32>
  tile.store %o, %t, %c0, %c0 {box = [16, 32]}
  tile.return
}""")
    o = np.zeros((16, 32), np.int32)
    run_kernel(kernel, [o])
    i, j = np.meshgrid(np.arange(16), np.arange(32), indexing="ij")
    assert np.array_equal(o, 100 * j + i + 5)


# -------------------------------------------------------------- reductions
def reduce_ir(kind: str, axis: int, dt: str) -> str:
    n = 32 if axis == 0 else 16  # the length left after reducing a 16x32 tile
    return f"""
tile.kernel @k {{
^(%x: tensor<{dt}[16, 32]>, %o: tensor<{dt}[{n}]>, %s: tensor<{dt}[1]>):
  %c1 = tile.constant {{value = 1}} : i32
  tile.grid %c1
  %c0 = tile.constant {{value = 0}} : i32
  %a = tile.load %x, %c0, %c0 {{box = [16, 32]}} : tile<16x32x{dt}>
  %r = tile.reduce %a {{kind = "{kind}", axis = {axis}}} : tile<{n}x{dt}>
  tile.store %o, %r, %c0 {{box = [{n}]}}
  %v = tile.reduce %r {{kind = "{kind}", axis = 0}} : {dt}
  tile.store %s, %v, %c0 {{box = [1], squeeze = [0]}}
  tile.return
}}"""


@pytest.mark.parametrize("dt", [f32, bf16, i32])
@pytest.mark.parametrize("kind", ["sum", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_reduce(kind, axis, dt):
    kernel = compile_ir(reduce_ir(kind, axis, dt.name))
    x, o, s = random_args(kernel, {}, seed=6)
    run_kernel(kernel, [x, o, s])
    # Float sums accumulate in float64 and round once; i32 sums wrap; max/min are exact.
    acc = np.int64 if dt == i32 else np.float64
    fn = {"sum": lambda a, ax: np.sum(a, ax, dtype=acc), "max": np.max, "min": np.min}[kind]
    r = round_to(fn(x, axis), dt)
    assert np.array_equal(o, r)
    assert s[0] == round_to(fn(r, 0), dt)


# ------------------------------------------------------------------ memory
LOAD_1D_IR = """
tile.kernel @k {
^(%x: tensor<f32[N]>, %o: tensor<f32[16]>, %off: i32):
  %c1 = tile.constant {value = 1} : i32
  tile.grid %c1
  %c0 = tile.constant {value = 0} : i32
  %a = tile.load %x, %off {box = [16], other = -inf} : tile<16xf32>
  tile.store %o, %a, %c0 {box = [16]}
  tile.return
}"""


@pytest.mark.parametrize("off", [-4, 0, 3, 9, 10, 100, -16, -100])
def test_load_out_of_bounds_reads_other(off):
    kernel = compile_ir(LOAD_1D_IR)
    x = np.arange(10, dtype=np.float32)
    o = np.zeros(16, np.float32)
    run_kernel(kernel, [x, o, off])
    expect = [x[i] if 0 <= i < 10 else -np.inf for i in range(off, off + 16)]
    assert o.tolist() == expect


def test_load_2d_partial_box_default_other_is_zero():
    kernel = compile_ir("""
tile.kernel @k {
^(%x: tensor<bf16[M, N]>, %o: tensor<bf16[16, 16]>, %r: i32, %c: i32):
  %c1 = tile.constant {value = 1} : i32
  tile.grid %c1
  %c0 = tile.constant {value = 0} : i32
  %a = tile.load %x, %r, %c {box = [16, 16]} : tile<16x16xbf16>
  tile.store %o, %a, %c0, %c0 {box = [16, 16]}
  tile.return
}""")
    x = round_to(np.random.default_rng(0).standard_normal((20, 10)), bf16)
    o = np.full((16, 16), np.nan, np.float32)
    run_kernel(kernel, [x, o, 12, -3])
    expect = np.zeros((16, 16), np.float32)
    expect[:8, 3:13] = x[12:20, 0:10]
    assert np.array_equal(o, expect)


def test_store_writes_only_in_bounds():
    kernel = compile_ir("""
tile.kernel @k {
^(%o: tensor<f32[M, N]>, %r: i32, %c: i32):
  %c1 = tile.constant {value = 1} : i32
  tile.grid %c1
  %t = tile.constant {value = 1.0} : tile<16x16xf32>
  tile.store %o, %t, %r, %c {box = [16, 16]}
  tile.return
}""")
    for r, c in [(12, -4), (-20, 0), (30, 30), (0, 0), (-15, 19)]:
        o = np.full((20, 20), np.nan, np.float32)
        run_kernel(kernel, [o, r, c])
        expect = np.full((20, 20), np.nan, np.float32)
        expect[max(r, 0):max(r + 16, 0), max(c, 0):max(c + 16, 0)] = 1.0
        assert np.array_equal(o, expect, equal_nan=True), (r, c)


def test_store_of_scalar_and_loaded_tiles_are_copies():
    # Load, then overwrite the source, then store the loaded tile: it must hold the old values.
    kernel = compile_ir("""
tile.kernel @k {
^(%x: tensor<i32[16]>, %o: tensor<i32[16]>):
  %c1 = tile.constant {value = 1} : i32
  tile.grid %c1
  %c0 = tile.constant {value = 0} : i32
  %a = tile.load %x, %c0 {box = [16]} : tile<16xi32>
  %z = tile.constant {value = 0} : tile<16xi32>
  tile.store %x, %z, %c0 {box = [16]}
  tile.store %o, %a, %c0 {box = [16]}
  tile.return
}""")
    x, o = np.arange(16, dtype=np.int32), np.zeros(16, np.int32)
    run_kernel(kernel, [x, o])
    assert o.tolist() == list(range(16)) and not x.any()


# ------------------------------------------------------------ control flow
FOR_IR = """
tile.kernel @k {
^(%o: tensor<i32[3]>, %lb: i32, %ub: i32, %st: i32):
  %c1 = tile.constant {value = 1} : i32
  tile.grid %c1
  %c0 = tile.constant {value = 0} : i32
  %c2 = tile.constant {value = 2} : i32
  %init = tile.constant {value = -1} : i32
  %s, %n, %last = tile.for %lb, %ub, %st, %c0, %c0, %init : i32, i32, i32 {
  ^(%i: i32, %s_in: i32, %n_in: i32, %l_in: i32):
    %s2 = tile.add %s_in, %i : i32
    %n2 = tile.add %n_in, %c1 : i32
    tile.yield %s2, %n2, %i
  }
  tile.store %o, %s, %c0 {box = [1], squeeze = [0]}
  tile.store %o, %n, %c1 {box = [1], squeeze = [0]}
  tile.store %o, %last, %c2 {box = [1], squeeze = [0]}
  tile.return
}"""


@pytest.mark.parametrize("lb,ub,st", [(0, 10, 1), (-3, 8, 3), (5, 5, 1), (7, 2, 1), (0, 1, 100)])
def test_for_with_iter_args(lb, ub, st):
    kernel = compile_ir(FOR_IR)
    o = np.zeros(3, np.int32)
    run_kernel(kernel, [o, lb, ub, st])
    r = range(lb, ub, st)
    assert o.tolist() == [sum(r), len(r), r[-1] if r else -1]  # zero trips return the inits


@pytest.mark.parametrize("st", [0, -1])
def test_for_nonpositive_step_is_located_error(st):
    kernel = compile_ir(FOR_IR)
    with pytest.raises(TkcInterpretError, match=f"loop step must be positive, got {st}") as e:
        run_kernel(kernel, [np.zeros(3, np.int32), 0, 4, st])
    assert (e.value.loc.file, e.value.loc.line) == ("test.tkir", 9)


def test_if_takes_one_branch():
    kernel = compile_ir("""
tile.kernel @k {
^(%o: tensor<f32[16]>, %x: i32):
  %c1 = tile.constant {value = 1} : i32
  tile.grid %c1
  %c0 = tile.constant {value = 0} : i32
  %neg = tile.cmp %x, %c0 {pred = "lt"} : i1
  %r = tile.if %neg : tile<16xf32> {
    %a = tile.constant {value = -1.5} : tile<16xf32>
    tile.yield %a
  } {
    %b = tile.constant {value = 2.5} : tile<16xf32>
    tile.store %o, %b, %c0 {box = [16]}
    tile.yield %b
  }
  %t = tile.add %r, %r : tile<16xf32>
  tile.store %o, %t, %c1 {box = [16]}
  tile.return
}""")
    for x, first, rest in [(-3, 0.0, -3.0), (3, 2.5, 5.0)]:
        o = np.zeros(16, np.float32)
        run_kernel(kernel, [o, x])
        assert o[0] == first and (o[1:] == rest).all()


def test_program_ids_and_grid_override():
    kernel = compile_ir("""
tile.kernel @k {
^(%o: tensor<i32[4, 3]>, %g: tensor<i32[4, 3]>):
  %c3 = tile.constant {value = 3} : i32
  %c2 = tile.constant {value = 2} : i32
  tile.grid %c3, %c2
  %p0 = tile.program_id {axis = 0} : i32
  %p1 = tile.program_id {axis = 1} : i32
  %p2 = tile.program_id {axis = 2} : i32
  %n0 = tile.num_programs {axis = 0} : i32
  %n2 = tile.num_programs {axis = 2} : i32
  %c10 = tile.constant {value = 10} : i32
  %a = tile.mul %p0, %c10 : i32
  %b = tile.add %a, %p1 : i32
  %v = tile.add %b, %p2 : i32
  tile.store %o, %v, %p0, %p1 {box = [1, 1], squeeze = [0, 1]}
  %w = tile.mul %n0, %n2 : i32
  tile.store %g, %w, %p0, %p1 {box = [1, 1], squeeze = [0, 1]}
  tile.return
}""")
    o, g = np.full((4, 3), -1, np.int32), np.zeros((4, 3), np.int32)
    run_kernel(kernel, [o, g])
    assert o.tolist() == [[0, 1, -1], [10, 11, -1], [20, 21, -1], [-1, -1, -1]]
    assert (g[:3, :2] == 3).all()
    o[...] = -1
    run_kernel(kernel, [o, g], grid=(4, 3, 1))
    assert o.tolist() == [[0, 1, 2], [10, 11, 12], [20, 21, 22], [30, 31, 32]]
    o[...] = -1
    run_kernel(kernel, [o, g], grid=(0, 3))  # an empty grid runs nothing
    assert (o == -1).all()


COPY_2D_IR = """
tile.kernel @k {
^(%x: tensor<f32[M, N]>, %o: tensor<f32[P, Q]>, %r: i32, %c: i32, %r2: i32, %c2: i32):
  %c1 = tile.constant {value = 1} : i32
  tile.grid %c1
  %a = tile.load %x, %r, %c {box = [16, 8], other = 0.5} : tile<16x8xf32>
  tile.store %o, %a, %r2, %c2 {box = [16, 8]}
  tile.return
}"""


@settings(max_examples=60, deadline=None)
@given(shape=st.tuples(st.integers(1, 20), st.integers(1, 20)),
       oshape=st.tuples(st.integers(1, 20), st.integers(1, 20)),
       offs=st.tuples(*[st.integers(-25, 25)] * 4))
def test_load_store_boxes_match_elementwise_reference(shape, oshape, offs):
    kernel = compile_ir(COPY_2D_IR)
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    o = np.full(oshape, -1.0, np.float32)
    r, c, r2, c2 = offs
    run_kernel(kernel, [x, o, r, c, r2, c2])
    expect = np.full(oshape, -1.0, np.float32)
    for i in range(16):
        for j in range(8):
            src = (r + i, c + j)
            v = x[src] if 0 <= src[0] < shape[0] and 0 <= src[1] < shape[1] else 0.5
            if 0 <= r2 + i < oshape[0] and 0 <= c2 + j < oshape[1]:
                expect[r2 + i, c2 + j] = v
    assert np.array_equal(o, expect)
