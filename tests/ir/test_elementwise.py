"""The elementwise ops as declared (tkc/ir/dialects/elementwise.py), end to end: each one
written in tile code runs in the interpreter as torch computes it, decomposes (where the target
has no instruction for it) into ops the emulator runs to the same values, and assembles with
ptxas into the instructions its lowering names, without spills."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch

from tkc import dtypes
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.errors import TkcTypeError
from tkc.interpreter import run_kernel
from tkc.ir.dialects import elementwise as E
from tkc.ir.dialects import tile as T

M, N = 100, 72  # tails: the kernels' 64 x 64 tiles cover it with ragged edges
HAS_PTXAS = shutil.which("ptxas") is not None or shutil.which("/usr/local/cuda/bin/ptxas") is not None


def _source(expr: str, n_in: int, dtype: str = "f32", out: str | None = None) -> str:
    names = "abc"[:n_in]
    params = ", ".join(f"{n}_in: {dtype}[M, N]" for n in names)
    loads = "\n".join(f"    {n} = {n}_in[r:r+BM, q:q+BN]" for n in names)
    return f"""@kernel
def op({params}, y: {out or dtype}[M, N], BM: const = 64, BN: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    r = program_id(0) * BM
    q = program_id(1) * BN
{loads}
    y[r:r+BM, q:q+BN] = {expr}
"""


def _inputs(ranges: list[tuple[float, float]], dt: dtypes.DType, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for lo, hi in ranges:
        x = rng.uniform(lo, hi, size=(M, N))
        x[::7, ::5] *= 1e-4  # values near zero, where log1p / expm1 / erf must stay precise
        out.append(dtypes.round_to(x, dt))
    return out


def _run(src: str, args: list[np.ndarray], out_dtype: dtypes.DType) -> tuple[np.ndarray, np.ndarray]:
    """(interpreter, emulator) outputs of the kernel on ``args``."""
    tile_ir = compile_kernel(src, stop="tkir", cache=False).kernel_op
    hopper = compile_kernel(src, stop="hopper", cache=False).kernel_op
    outs = []
    for k in (tile_ir, hopper):
        y = np.full((M, N), np.nan if out_dtype.is_float else -(2**31), out_dtype.np_storage)  # poisoned
        full = [a.copy() for a in args] + [y]
        (run_kernel if k is tile_ir else emulate)(k, full)
        outs.append(full[-1])
    return outs[0], outs[1]


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x, np.float64))


# name, expression, input ranges, torch reference on float64, emulator tolerance (relative, absolute),
# instruction the PTX must hold
FLOAT_CASES = [
    ("sigmoid", "sigmoid(a)", [(-30, 30)], lambda a: torch.sigmoid(a), (2e-6, 1e-7), "ex2.approx"),
    ("sigmoid_far", "sigmoid(a)", [(-100, -60)], lambda a: torch.sigmoid(a), (2e-6, 1e-7), "ex2.approx"),
    ("erf", "erf(a)", [(-4, 4)], lambda a: torch.erf(a), (1e-6, 3e-7), "ex2.approx"),
    ("erf_near_zero", "erf(a)", [(-1e-3, 1e-3)], lambda a: torch.erf(a), (1e-6, 1e-30), "ex2.approx"),
    ("erf_far", "erf(a)", [(-60, 60)], lambda a: torch.erf(a), (1e-6, 3e-7), "ex2.approx"),
    ("sin", "sin(a)", [(-math.pi, math.pi)], lambda a: torch.sin(a), (0, 0), "sin.approx"),
    ("cos", "cos(a)", [(-math.pi, math.pi)], lambda a: torch.cos(a), (0, 0), "cos.approx"),
    ("log1p", "log1p(a)", [(-0.95, 5)], lambda a: torch.log1p(a), (1e-6, 1e-7), "lg2.approx"),
    ("expm1", "expm1(a)", [(-3, 3)], lambda a: torch.expm1(a), (1e-6, 1e-7), "ex2.approx"),
    ("expm1_edges", "expm1(a)", [(-0.6, 0.6)], lambda a: torch.expm1(a), (1e-6, 1e-7), "ex2.approx"),
    ("log1p_edges", "log1p(a)", [(-0.6, 1.2)], lambda a: torch.log1p(a), (1e-6, 1e-7), "lg2.approx"),
    ("fma", "fma(a, b, c)", [(-2, 2)] * 3, lambda a, b, c: a * b + c, (0, 0), "fma.rn.f32"),
    ("floor", "floor(a)", [(-50, 50)], lambda a: torch.floor(a), (0, 0), "cvt.rmi.f32.f32"),
    ("ceil", "a.ceil()", [(-50, 50)], lambda a: torch.ceil(a), (0, 0), "cvt.rpi.f32.f32"),
    ("pow", "abs(a) ** b", [(-4, 4), (-3, 3)], lambda a, b: torch.pow(a.abs(), b), (4e-6, 1e-30), "lg2.approx"),
    ("pow_negative_base", "a ** floor(b)", [(-4, 4), (-3, 4)], lambda a, b: torch.pow(a, torch.floor(b)),
     (4e-6, 1e-30), "ex2.approx"),
    ("pow_fraction_of_negative", "a ** 0.75", [(-2, 2)], lambda a: torch.pow(a, 0.75), (4e-6, 1e-30),
     "lg2.approx"),
    ("pow_half", "abs(a) ** 0.5", [(-9, 9)], lambda a: torch.sqrt(a.abs()), (0, 0), "sqrt.rn.f32"),
    ("pow_square", "a ** 2.0", [(-9, 9)], lambda a: a * a, (0, 0), "mul.f32"),
    ("pow_large", "a ** b", [(2, 8), (20, 40)], lambda a, b: torch.pow(a, b), (1e-5, 1e-30), "lg2.approx"),
    ("pow_scalar_base", "2.0 ** a", [(-9, 9)], lambda a: torch.pow(2.0, a), (4e-6, 1e-30), "ex2.approx"),
]


@pytest.mark.parametrize("name,expr,ranges,ref,tol,ptx", FLOAT_CASES, ids=[c[0] for c in FLOAT_CASES])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_float_op(name, expr, ranges, ref, tol, ptx, dtype):
    dt = dtypes.from_name(dtype)
    src = _source(expr, len(ranges), dtype)
    args = _inputs(ranges, dt)
    got, emulated = _run(src, args, dt)
    want = dtypes.round_to(ref(*map(_t, args)).numpy(), dt)
    # The interpreter computes in f32 and rounds once: as torch in float64 rounded, within an
    # f32 rounding before the last one (which may tip a bf16 tie).
    ulp = 2.0 ** -23 if dtype == "f32" else 2.0 ** -7
    np.testing.assert_allclose(got, want, rtol=2 * ulp, atol=1e-30, equal_nan=True)
    # The emulator runs the decomposed ops: the decomposition's own error, then the rounding
    # (exact for f32 where the op's tolerance is 0; a bf16 result may round a tie the other way).
    rtol, atol = tol
    np.testing.assert_allclose(emulated, got, rtol=max(rtol, 2 * ulp if rtol or dtype != "f32" else 0),
                               atol=atol, equal_nan=True)


def test_fma_rounds_once():
    # 1 + 2**-23 squared is 1 + 2**-22 + 2**-46: rounding the product first loses the 2**-46.
    x = np.float32(1 + 2.0 ** -23)
    a, b, c = (np.full((M, N), v, np.float32) for v in (x, x, -(1 + 2.0 ** -22)))
    got, _ = _run(_source("fma(a, b, c)", 3), [a, b, c], dtypes.f32)
    assert np.all(got == np.float32(2.0 ** -46))


def test_pow_special_values():
    a = np.array([0.0, 0.0, 0.0, -2.0, -2.0, 1.0, np.nan, 4.0, -8.0, np.inf, -0.0, -0.0, -0.0, -0.0, -np.inf,
                  -np.inf, -np.inf, -np.inf, -1.0, -1.0], np.float32)
    b = np.array([2.5, -1.5, 0.0, 3.0, 0.5, np.nan, 0.0, -0.5, 1.0 / 3.0, -1.0, -1.0, 3.0, 2.0, 0.5, 0.5, 3.0,
                  -3.0, -0.5, np.inf, -np.inf], np.float32)
    x, y = (np.resize(v, (M, N)).astype(np.float32) for v in (a, b))
    want = np.power(x.astype(np.float64), y.astype(np.float64))
    for expr in ("a ** b", "a ** 0.5"):  # the general decomposition, and sqrt for a constant 1/2
        w = want if expr == "a ** b" else np.power(x.astype(np.float64), np.full((M, N), 0.5))
        got, emulated = _run(_source(expr, 2), [x, y], dtypes.f32)
        for out in (got, emulated):  # signed zeros and infinities exactly, as numpy
            np.testing.assert_allclose(out, w, rtol=1e-6, equal_nan=True)
            real = ~np.isnan(w)
            assert np.array_equal(np.signbit(out[real]), np.signbit(w[real])), expr


def test_erf_special_values():
    # Signed zeros, infinities and NaN as math.erf (and torch) give them.
    a = np.resize(np.array([-0.0, 0.0, np.inf, -np.inf, np.nan, -1e-30, 1e-30, -1.0, 1.0, -3.92, 5.0], np.float32),
                  (M, N))
    want = np.vectorize(math.erf, otypes=[np.float64])(a.astype(np.float64))
    got, emulated = _run(_source("erf(a)", 1), [a], dtypes.f32)
    for out in (got, emulated):
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=3e-7, equal_nan=True)
        assert np.array_equal(np.signbit(out[~np.isnan(want)]), np.signbit(want[~np.isnan(want)]))


@pytest.mark.parametrize("expr,ref", [
    ("a << b", lambda a, n: np.where((n >= 0) & (n < 32), a.astype(np.int64) << np.clip(n, 0, 31), 0)),
    ("a >> b", lambda a, n: np.where((n >= 0) & (n < 32), a >> np.clip(n, 0, 31), np.where(a < 0, -1, 0))),
    ("(a << 3) ^ (a >> 1) | (~a & 7)", lambda a, n: ((a.astype(np.int64) << 3) ^ (a >> 1)) | (~a & 7)),
])
def test_shifts_and_bitwise(expr, ref):
    rng = np.random.default_rng(1)
    a = rng.integers(-(2**31), 2**31, size=(M, N)).astype(np.int32)
    n = rng.integers(-3, 40, size=(M, N)).astype(np.int32)  # counts of 32 or more, and negative ones
    src = _source(expr, 2, "i32")
    got, emulated = _run(src, [a, n], dtypes.i32)
    want = ref(a, n).astype(np.int64).astype(np.uint32).view(np.int32)  # wraps modulo 2**32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(emulated, got)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("axis,keep", [(1, False), (0, False), (1, True)])
def test_mean(dtype, axis, keep):
    dt = dtypes.from_name(dtype)
    # axis 1: a program a block of 64 rows, the mean over their first 64 columns; axis 0: a
    # program a block of 64 columns, the mean over the first 64 rows (past N = 72 reads zeros).
    if axis == 1:
        out, grid, tile, store = ("[M, 1]" if keep else "[M]"), "cdiv(M, 64)", "x[p:p+64, 0:64]", (
            "y[p:p+64, 0:1]" if keep else "y[p:p+64]")
    else:
        out, grid, tile, store = "[N]", "cdiv(N, 64)", "x[0:64, p:p+64]", "y[p:p+64]"
    src = f"""@kernel
def op(x: {dtype}[M, N], y: {dtype}{out}):
    grid({grid})
    p = program_id(0) * 64
    {store} = mean({tile}, axis={axis}{', keepdim=True' if keep else ''})
"""
    (x,) = _inputs([(-3, 5)], dt)
    tile_ir = compile_kernel(src, stop="tkir", cache=False).kernel_op
    hopper = compile_kernel(src, stop="hopper", cache=False).kernel_op
    assert not any(op.name == "tile.reduce" and op.kind == "mean" for op in hopper.walk())
    outs = []
    for k, run in ((tile_ir, run_kernel), (hopper, emulate)):
        y = np.full((M, 1) if keep else (M,) if axis == 1 else (N,), np.nan, dt.np_storage)
        run(k, [x.copy(), y])
        outs.append(y.reshape(-1))
    padded = np.zeros((M, 128))
    padded[:, :N] = x
    want = _t(padded[:, :64]).mean(dim=1) if axis == 1 else _t(padded[:64, :N]).mean(dim=0)
    want = dtypes.round_to(want.numpy(), dt)
    np.testing.assert_allclose(outs[0], want, rtol=2.0 ** -23 if dtype == "f32" else 2.0 ** -8, atol=1e-6)
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6 if dtype == "f32" else 2.0 ** -7, atol=1e-6)


@pytest.mark.skipif(not HAS_PTXAS, reason="needs ptxas")
@pytest.mark.parametrize("name,expr,ranges,ref,tol,ptx", FLOAT_CASES, ids=[c[0] for c in FLOAT_CASES])
def test_float_op_assembles(name, expr, ranges, ref, tol, ptx):
    c = compile_kernel(_source(expr, len(ranges)), stop="cubin", cache=False)
    assert ptx in c.asm["ptx"], f"{name}: no {ptx} in the PTX"
    assert c.resources.spill_stores == 0 and c.resources.spill_loads == 0


@pytest.mark.skipif(not HAS_PTXAS, reason="needs ptxas")
def test_narrow_float_powers_of_constants_stay_exact():
    # bf16 operands are widened to f32 around the decomposition; a constant exponent stays a
    # constant, so x ** 2.0 is one product and x ** 0.5 a square root, as in f32.
    ptx = compile_kernel(_source("a ** 2.0 + abs(a) ** 0.5", 1, "bf16"), stop="ptx", cache=False).asm["ptx"]
    assert "lg2.approx" not in ptx and "ex2.approx" not in ptx and "sqrt.rn.f32" in ptx


@pytest.mark.skipif(not HAS_PTXAS, reason="needs ptxas")
def test_shifts_assemble():
    c = compile_kernel(_source("(a << b) + (a >> b)", 2, "i32"), stop="cubin", cache=False)
    assert "shl.b32" in c.asm["ptx"] and "shr.s32" in c.asm["ptx"]


# ------------------------------------------------------------------ declarations
def test_every_op_declares_its_surface_and_summary():
    for cls in E.ELEMENTWISE_OPS:
        assert cls.SURFACE and cls.SUMMARY and cls.EXAMPLE, cls.name
        assert cls.KINDS <= {"float", "int", "bool"}, cls.name


def test_surface_names_reach_the_frontend():
    from tkc.frontend.builtins import BUILTIN_IMPLS
    from tkc.frontend.emit import BINARY_OPS, UNARY_OPS

    for cls in E.ELEMENTWISE_OPS:
        for s in cls.SURFACE:
            if s.isidentifier() and s != "not":
                assert s in BUILTIN_IMPLS, s
            else:
                assert (BINARY_OPS if len(cls.OPERANDS) == 2 else UNARY_OPS)[s] is cls


@pytest.mark.parametrize("expr,want", [
    ("sigmoid(0.0)", 0.5), ("erf(0.0)", 0.0), ("log1p(0.0)", 0.0), ("floor(-2.5)", -3.0),
    ("ceil(2.25)", 3.0), ("fma(2.0, 3.0, 1.0)", 7.0), ("2.0 ** 0.5", math.sqrt(2.0)), ("1 << 4", 16),
    ("-9 >> 1", -5), ("2 ** 3", 8), ("expm1(1e-10)", 1e-10),
])
def test_constants_fold_in_the_frontend(expr, want):
    src = f"""@kernel
def k(y: f32[N]):
    grid(1)
    y[0:16] = full([16], {expr}, f32)
"""
    text = compile_kernel(src, stop="tkir", cache=False).asm["tkir"]
    computed = {line.split("= ")[1].split()[0] for line in text.splitlines() if "= tile." in line}
    assert not computed & {cls.name for cls in E.ELEMENTWISE_OPS}, text
    y = np.zeros(16, np.float32)
    run_kernel(compile_kernel(src, stop="tkir", cache=False).kernel_op, [y])
    assert np.allclose(y, want)


@pytest.mark.parametrize("expr,message", [
    ("sigmoid(i)", "sigmoid takes a float operand, got tile<64xi32>; cast with .to(f32)"),
    ("i.floor()", "floor takes a float operand"),
    ("x << 2", "'<<' needs integer operands, got f32"),
    ("x >> i", "dtype mismatch in '>>'"),
    ("fma(i, i, i)", "fma() takes float operands, got i32"),
    ("fma(x, x, i)", "dtype mismatch in fma()"),
    ("i ** 0.5", "'**' needs a constant integer exponent from 1 to 16, or float operands"),
    ("mean(i, axis=0)", "mean() takes a float tile, got tile<64xi32>"),
    ("sigmoid(True) + x", "sigmoid of a bool value"),
    ("fma(True, x, x)", "fma() on bool values"),
    ("log1p(-1.0) + x", "log1p(-1.0) fails: no finite value"),
    ("log1p(-2.0) + x", "log1p(-2.0) fails: math domain error"),
    ("(1 << (1 << 40)) + i", "constant expression '<<' is too large"),
])
def test_type_errors_name_the_fix(expr, message):
    src = f"""@kernel
def k(xs: f32[N], ids: i32[N], y: f32[N]):
    x = xs[0:64]
    i = ids[0:64]
    y[0:64] = ({expr}).to(f32)
"""
    with pytest.raises(TkcTypeError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        compile_kernel(src, stop="tkir", cache=False)


def test_ops_decomposed_before_codegen_keep_their_location():
    src = _source("sigmoid(a)", 1)
    hopper = compile_kernel(src, stop="hopper", cache=False).kernel_op
    assert not any(isinstance(op, T.SigmoidOp) for op in hopper.walk())
    exps = [op for op in hopper.walk() if op.name == "tile.exp"]
    assert exps and all(op.loc.line == 7 for op in exps)


# ------------------------------------------------------------------ on the GPU
# The GPU's approximate instructions (ex2/lg2/sin/cos.approx) against torch's float64 answer.
GPU_TOL = {"sin": (0, 2e-6), "cos": (0, 2e-6), "pow": (4e-5, 1e-30), "pow_negative_base": (4e-5, 1e-30),
           "pow_large": (1e-4, 1e-30),
           "pow_fraction_of_negative": (4e-5, 1e-30), "pow_scalar_base": (4e-5, 1e-30)}


def _gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    from tkc.runtime.launch import launch

    return launch


@pytest.mark.gpu
@pytest.mark.parametrize("name,expr,ranges,ref,tol,ptx", FLOAT_CASES, ids=[c[0] for c in FLOAT_CASES])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_float_op_on_gpu(name, expr, ranges, ref, tol, ptx, dtype):
    launch = _gpu()
    dt = dtypes.from_name(dtype)
    args = _inputs(ranges, dt, seed=3)
    c = compile_kernel(_source(expr, len(ranges), dtype), cache=False)
    tdt = torch.float32 if dtype == "f32" else torch.bfloat16
    xs = [torch.from_numpy(a).to("cuda", tdt) for a in args]
    y = torch.full((M, N), float("nan"), device="cuda", dtype=tdt)
    launch(c, [*xs, y])
    torch.cuda.synchronize()
    want = ref(*map(_t, args)).numpy()
    rtol, atol = GPU_TOL.get(name, (2e-6, 1e-6))
    if dtype == "bf16":
        rtol, atol = max(rtol, 2.0 ** -7), max(atol, 2.0 ** -7 * 1e-3)
    np.testing.assert_allclose(y.float().cpu().numpy(), want, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.gpu
def test_fma_rounds_once_on_gpu():
    launch = _gpu()
    x = 1 + 2.0 ** -23
    a, b, c = (torch.full((M, N), v, device="cuda", dtype=torch.float32) for v in (x, x, -(1 + 2.0 ** -22)))
    y = torch.full((M, N), float("nan"), device="cuda")
    launch(compile_kernel(_source("fma(a, b, c)", 3), cache=False), [a, b, c, y])
    assert bool((y == 2.0 ** -46).all())  # a product rounded first would give 0


@pytest.mark.gpu
def test_shifts_and_mean_on_gpu():
    launch = _gpu()
    rng = np.random.default_rng(4)
    a = rng.integers(-(2**31), 2**31, size=(M, N)).astype(np.int32)
    n = rng.integers(-3, 40, size=(M, N)).astype(np.int32)
    c = compile_kernel(_source("(a << b) ^ (a >> b)", 2, "i32"), cache=False)
    y = torch.zeros((M, N), dtype=torch.int32, device="cuda")
    launch(c, [torch.from_numpy(a).cuda(), torch.from_numpy(n).cuda(), y])
    want, _ = _run(_source("(a << b) ^ (a >> b)", 2, "i32"), [a, n], dtypes.i32)
    np.testing.assert_array_equal(y.cpu().numpy(), want)

    src = """@kernel
def op(x: bf16[M, N], y: bf16[M]):
    grid(cdiv(M, 64))
    p = program_id(0) * 64
    y[p:p+64] = x[p:p+64, 0:64].mean(1)
"""
    x = torch.randn(M, N, device="cuda").to(torch.bfloat16)
    out = torch.full((M,), float("nan"), device="cuda", dtype=torch.bfloat16)
    launch(compile_kernel(src, cache=False), [x, out])
    ref = x[:, :64].double().mean(1)
    torch.testing.assert_close(out.double(), ref, rtol=2.0 ** -7, atol=1e-3)
