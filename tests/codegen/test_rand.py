"""``rand``'s codegen (tkc/codegen/lower_rand.py) against its numpy meaning on the host: the
same LLVM integer arithmetic, compiled for this CPU by llvmlite's JIT, gives Random123's
known answers and the interpreter's bits for any seed and offset; and a kernel's PTX makes
one Philox call for each four values a thread holds in a row."""

from __future__ import annotations

import ctypes
import re

import llvmlite.binding as llvm
import llvmlite.ir as ir
import numpy as np
import pytest

from device_checks import needs_ptxas
from tkc.codegen import lower_rand
from tkc.codegen.nvvm import F32, I32, I64
from tkc.compiler import compile_kernel
from tkc.ir.dialects.philox import philox4x32, uniform

# Random123's kat_vectors for philox4x32 with 10 rounds: (key, counter, the four words).
KAT = [((0, 0), (0, 0, 0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((0xFFFFFFFF,) * 2, (0xFFFFFFFF,) * 4, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0xA4093822, 0x299F31D0), (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


@pytest.fixture(scope="module")
def host():
    """The codegen's Philox and one value's rand, compiled for this CPU: ``words(key0, key1,
    c0..c3, out[4])`` and ``value(seed, offset) -> f32``."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    m = ir.Module("rand_host")
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [I32] * 6 + [I32.as_pointer()]), "words")
    b = ir.IRBuilder(fn.append_basic_block())
    a = fn.args
    for j, w in enumerate(lower_rand.philox4x32(b, (a[0], a[1]), (a[2], a[3], a[4], a[5]))):
        b.store(w, b.gep(a[6], [ir.Constant(I32, j)]))
    b.ret_void()
    fn = ir.Function(m, ir.FunctionType(F32, [I64, I64]), "value")
    b = ir.IRBuilder(fn.append_basic_block())
    seed, off = fn.args
    b.ret(lower_rand.uniform(b, lower_rand._one(b, lower_rand._key(b, seed), off)))
    target = llvm.Target.from_default_triple().create_target_machine()
    mod = llvm.parse_assembly(str(m))
    engine = llvm.create_mcjit_compiler(mod, target)
    engine.finalize_object()
    words = ctypes.CFUNCTYPE(None, *[ctypes.c_uint32] * 6, ctypes.POINTER(ctypes.c_uint32))(
        engine.get_function_address("words"))
    value = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_int64)(engine.get_function_address("value"))
    yield words, value
    del engine


def test_the_codegens_philox_gives_random123s_known_answers(host) -> None:
    words, _ = host
    out = (ctypes.c_uint32 * 4)()
    for key, ctr, want in KAT:
        words(*key, *ctr, out)
        assert tuple(out) == want
        assert tuple(int(w) for w in philox4x32(key, ctr)) == want


def test_the_codegens_value_is_the_interpreters(host) -> None:
    _, value = host
    rng = np.random.default_rng(0)
    seeds = [0, 1, -1, 2 ** 63 - 1, -(2 ** 63), *rng.integers(-2 ** 63, 2 ** 63 - 1, 6)]
    offs = [0, 1, 2, 3, 4, -1, -4, -5, 2 ** 31 - 1, -(2 ** 31), 2 ** 62 + 3, *rng.integers(-2 ** 62, 2 ** 62, 20)]
    for s in seeds:
        got = np.array([value(int(s), int(o)) for o in offs], np.float32)
        np.testing.assert_array_equal(got, uniform(int(s), np.array(offs, np.int64)))


SRC = """
@kernel
def noise(u: f32[N], seed: i64, BN: const = 1024):
    grid(cdiv(N, BN))
    c = program_id(0) * BN
    u[c:c+BN] = rand(seed, c + arange(BN))
"""


@needs_ptxas
def test_four_values_in_a_row_are_one_call() -> None:
    c = compile_kernel(SRC, {}, cache=False)
    # 1024 values over 128 threads, four side by side: 8 values, two groups a thread.  Their
    # offsets are visibly c + 4k + (0, 1, 2, 3) with c a multiple of 4, so LLVM folds each
    # group's check and drops the call-per-value side: two calls of at most 19 wide products
    # each (the first round's second product is of a zero word), not eight.
    layout = next(op for op in c.kernel_op.walk() if op.name == "hopper.store").value.type.layout
    assert layout.regs == 8
    assert 19 < len(re.findall(r"\bmul\.hi\.u32\b", c.asm["ptx"])) <= 2 * 19
