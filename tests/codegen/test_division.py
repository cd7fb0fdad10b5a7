"""The i32 divisions by a loop-invariant divisor (``lower_elementwise._floordiv_invariant``:
the divisor's reciprocal and a 64-bit high multiply) run natively through LLVM's JIT on the
CPU against Python's integers, with the ``div.s32`` lowering beside them, and a kernel dividing
by a divisor from outside its loop keeps the 64-bit division out of the loop in its PTX."""

from __future__ import annotations

import ctypes
import random
import re

import llvmlite.binding as llvm
import llvmlite.ir as ir
import pytest

from tkc.codegen import lower_elementwise as le
from tkc.ir.dialects import tile as T
from tkc.compiler import compile_kernel

I32 = ir.IntType(32)
LO, HI = -2**31, 2**31 - 1


def _wrap(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


def _python(name: str, x: int, y: int) -> int | None:
    """tkc's meaning (tkc/ir/dialects/elementwise.py, in int32): floor semantics, 0 for a zero
    divisor, cdiv(x, y) = -(-x // y) with -x wrapped; None where it is the target's choice
    (INT32_MIN // -1)."""
    if y == 0:
        return 0
    if name == "cdiv":
        x = _wrap(-x)
    if (x, y) == (LO, -1) and name != "rem":
        return None
    q = {"floordiv": x // y, "rem": x % y, "cdiv": -(x // y)}[name]
    return _wrap(q)


@pytest.fixture(scope="module")
def jitted():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = ir.Module(name="division")
    forms = {"floordiv": (le.INVARIANT[T.FloorDivOp], le._floordiv), "rem": (le.INVARIANT[T.RemOp], le._rem),
             "cdiv": (le.INVARIANT[T.CdivOp], le._cdiv)}
    for name, (invariant, plain) in forms.items():
        for tag, fn in (("inv", invariant), ("plain", plain)):
            f = ir.Function(module, ir.FunctionType(I32, [I32, I32]), f"{name}_{tag}")
            b = ir.IRBuilder(f.append_basic_block())
            b.ret(fn(b, *f.args))
    target = llvm.Target.from_default_triple().create_target_machine()
    mod = llvm.parse_assembly(str(module))
    engine = llvm.create_mcjit_compiler(mod, target)
    engine.finalize_object()
    proto = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_int32)
    yield {key: proto(engine.get_function_address(key)) for key in
           (f"{n}_{t}" for n in forms for t in ("inv", "plain"))}, engine


EDGES = [0, 1, -1, 2, -2, 3, -3, 7, -7, 8, -8, 1000, -1000, 2**16 + 1, 2**30, -2**30, HI, LO, HI - 1, LO + 1]


@pytest.mark.parametrize("name", ["floordiv", "rem", "cdiv"])
def test_reciprocal_division_matches_python(jitted, name: str) -> None:
    fns, _ = jitted
    rnd = random.Random(7)
    pairs = [(x, y) for x in EDGES for y in EDGES]
    pairs += [(rnd.randint(LO, HI), rnd.randint(LO, HI)) for _ in range(20000)]
    pairs += [(rnd.randint(LO, HI), rnd.randint(-70, 70)) for _ in range(20000)]
    pairs += [(rnd.randint(-5000, 5000), rnd.choice([1 << k for k in range(31)])) for _ in range(5000)]
    for tag in ("inv", "plain"):
        fn = fns[f"{name}_{tag}"]
        # The plain form's sdiv of INT32_MIN by -1 traps on the CPU (the GPU's div.s32 does not).
        run = [(x, y) for x, y in pairs if _python(name, x, y) is not None
               and (tag == "inv" or (x, y) != (LO, -1) and (_wrap(-x), y) != (LO, -1))]
        bad = [(x, y, fn(x, y), _python(name, x, y)) for x, y in run if fn(x, y) != _python(name, x, y)]
        assert not bad, f"{name} ({tag}): {len(bad)} wrong, e.g. {bad[:3]}"


def test_a_loop_invariant_divisor_divides_by_its_reciprocal(tmp_path) -> None:
    src = tmp_path / "div.tk"
    src.write_text("@kernel\ndef k(x: i32[T], y: i32[T], n: i32):\n    grid(1)\n"
                   "    for t in range(T):\n        y[t] = x[t] // n + t % n\n")
    ptx = compile_kernel(src, {}, stop="ptx", cache=False).asm["ptx"]
    assert not re.search(r"\b(div|rem)\.s32", ptx), "no signed 32-bit division: the reciprocal's instead"
    assert "div.u32" in ptx and "mul.hi.u32" in ptx
    # the quotient is mul.hi.u32, never a 64-bit product's high half: from that form ptxas 13.0
    # widened a kernel parameter by reading the next parameter's word (lower_elementwise._mulhi)
    assert not re.search(r"mul\.(lo|wide)\.[us]64", ptx)
