"""E8M0 (``f8e8m0``, MX scales) in generated code: ``lower_values.e8m0_encode`` and
``e8m0_decode`` are plain LLVM integer code (sm_90a has no ue8m0 conversion), so they run
natively through LLVM's JIT on the CPU here, against ``tkc.dtypes``' rule (which
tests/test_dtypes.py holds to torch's conversion) on every exponent's rounding cases, random
bit patterns and every code."""

from __future__ import annotations

import ctypes

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
