"""E8M0 (``f8e8m0``, MX scales) in generated code: ``lower_values.e8m0_encode`` and
``e8m0_decode`` are plain LLVM integer code (sm_90a has no ue8m0 conversion), so they run
natively through LLVM's JIT on the CPU here, against ``tkc.dtypes``' rule (which
tests/test_dtypes.py holds to torch's conversion) on every exponent's rounding cases, random
bit patterns and every code."""

from __future__ import annotations

import ctypes
import pathlib

import llvmlite.binding as llvm
import llvmlite.ir as ir
import numpy as np
import pytest

from tkc import dtypes
from tkc.codegen.lower_values import e8m0_decode, e8m0_encode

F32, I8 = ir.FloatType(), ir.IntType(8)


@pytest.fixture(scope="module")
def jitted():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = ir.Module(name="e8m0")
    for name, ret, arg, fn in (("encode", I8, F32, e8m0_encode), ("decode", F32, I8, e8m0_decode)):
        f = ir.Function(module, ir.FunctionType(ret, [arg]), name)
        b = ir.IRBuilder(f.append_basic_block())
        b.ret(fn(b, f.args[0]))
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(module)),
                                        llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    yield (ctypes.CFUNCTYPE(ctypes.c_uint8, ctypes.c_float)(engine.get_function_address("encode")),
           ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_uint8)(engine.get_function_address("decode"))), engine


def test_encode_rounds_as_the_dtype_does(jitted) -> None:
    (encode, _), _ = jitted
    exps = np.arange(256, dtype=np.uint32) << np.uint32(23)
    mants = np.array([0, 1, 0x200000, 0x3FFFFF, 0x400000, 0x400001, 0x600000, 0x7FFFFF], dtype=np.uint32)
    bits = (exps[:, None] | mants[None, :]).ravel()
    rng = np.random.default_rng(3)
    bits = np.concatenate([bits, bits | np.uint32(0x80000000), rng.integers(0, 2**32, 20000, dtype=np.uint32)])
    x = bits.view(np.float32)
    got = np.array([encode(float(v)) for v in x], dtype=np.uint8)
    np.testing.assert_array_equal(got, dtypes.e8m0_code(x))


def test_decode_gives_every_code_its_value(jitted) -> None:
    (_, decode), _ = jitted
    got = np.array([decode(c) for c in range(256)], dtype=np.float32)
    np.testing.assert_array_equal(got.view(np.uint32)[:255], dtypes.e8m0_value(np.arange(255)).view(np.uint32))
    assert np.isnan(got[255])


def test_an_e8m0_output_is_compared_exactly() -> None:
    """``tkc run --check``: one E8M0 code off is a factor of 2, so its outputs compare exactly."""
    from tkc.runner import tolerance

    assert tolerance(dtypes.f8e8m0, 8, 100.0) == (0.0, 0.0)


@pytest.mark.parametrize("value, ok", [(0.0, True), (-3.0, True), (1e-40, True), (2.0**127, True), (3.5e38, False)])
def test_e8m0_constants_convert_as_casts_do(value: float, ok: bool) -> None:
    """A literal of f8e8m0 converts as ``x.to(f8e8m0)`` does (0 to 2^-127, a negative one as
    its magnitude); only one that would be NaN is refused, at its line."""
    from tkc.compiler import compile_kernel
    from tkc.errors import TkcTypeError

    src = f"""
@kernel
def f(s: f8e8m0[N], BN: const = 64):
    s[0:BN] = full([BN], {value!r}, f8e8m0)
"""
    if ok:
        compile_kernel(src, stop="tkir", cache=False)
    else:
        with pytest.raises(TkcTypeError, match="out of the range of f8e8m0") as e:
            compile_kernel(src, stop="tkir", cache=False)
        assert e.value.loc is not None and e.value.loc.line == 4


def test_a_rounded_fp8_value_is_stored_as_its_byte() -> None:
    """``to_mem`` stores the byte that ``round_to`` made: MXFP8 quantization converts each value
    to e4m3 once (64 a thread) and decodes none; a value rounded to e4m3 and then stored as
    e5m2 is converted again, to e5m2."""
    from tkc.compiler import compile_kernel

    ptx = compile_kernel(pathlib.Path(__file__).resolve().parents[2] / "examples" / "mx_fp8.tk", {},
                         kernel="mx_quantize", stop="ptx", cache=False).asm["ptx"]
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == 64 and "cvt.rn.f16x2.e4m3x2" not in ptx
    chain = compile_kernel("""
@kernel
def g(x: f32[N], y: f8e5m2[N], BN: const = 128):
    y[0:BN] = x[0:BN].to(f8e4m3).to(f8e5m2)
""", stop="ptx", cache=False).asm["ptx"]
    assert "cvt.rn.satfinite.e4m3x2.f32" in chain and "cvt.rn.satfinite.e5m2x2.f32" in chain
