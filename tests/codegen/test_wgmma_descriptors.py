"""A shared wgmma A operand's descriptors for the calling warpgroup
(``lower_hopper._a_descriptors``): built in LLVM IR as the kernel builds them, run natively
through LLVM's JIT on the CPU for threads of every warpgroup and several run-time bases, and
compared with ``SharedLayout.descriptor`` at the real address.  The warp-uniform read of the
warpgroup index (``shfl.sync.idx`` on the GPU) is the thread's own value here, which is what
lane 0 of its warp holds."""

from __future__ import annotations

import ctypes
import pathlib
import re
from dataclasses import dataclass

import llvmlite.binding as llvm
import llvmlite.ir as ir
import pytest

from tkc import dtypes
from tkc.codegen import lower_hopper
from tkc.codegen.lowerer import SmemTile
from tkc.compiler import compile_kernel
from tkc.ir.layouts import SharedLayout

I32, I64 = ir.IntType(32), ir.IntType(64)


def _jit(tile: SmemTile, groups: int, slices: int, monkeypatch: pytest.MonkeyPatch, uniform: bool = True):
    """``f(tid, base4, out)``: every descriptor ``[k][m]`` for thread ``tid`` into ``out``;
    and the IR's text."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    monkeypatch.setattr(lower_hopper, "_warp_uniform", lambda b, v: v)
    module = ir.Module(name="descriptors")
    f = ir.Function(module, ir.FunctionType(ir.VoidType(), [I32, I64, I64.as_pointer()]), "descriptors")
    b = ir.IRBuilder(f.append_basic_block())
    tid, base, out = f.args
    table = lower_hopper._a_descriptors(b, tid, tile, base, groups, slices, uniform=uniform)
    for i, d in enumerate(d for per_k in table for d in per_k):
        b.store(d, b.gep(out, [ir.Constant(I32, i)]))
    b.ret_void()
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(module)),
                                        llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    proto = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(ctypes.c_uint64))
    return proto(engine.get_function_address("descriptors")), engine, str(module)


LAYOUTS = [
    ("gemm A, k-major sw128", SharedLayout(128, 64, dtypes.bf16, "k", 128), 0, 2, 1),
    ("two slices a warpgroup", SharedLayout(256, 64, dtypes.bf16, "k", 128), 32768, 2, 2),
    ("attention backward's K", SharedLayout(128, 128, dtypes.bf16, "k", 128), 65536, 2, 1),
    ("A read MN-major", SharedLayout(64, 128, dtypes.bf16, "mn", 128), 16384, 2, 1),
    ("unswizzled", SharedLayout(128, 64, dtypes.bf16, "k", 0), 4096, 2, 1),
    ("fp8", SharedLayout(128, 128, dtypes.f8e4m3, "k", 128), 0, 2, 1),
    ("three warpgroups", SharedLayout(192, 64, dtypes.bf16, "k", 128), 0, 3, 1),
    ("one warpgroup", SharedLayout(64, 64, dtypes.bf16, "k", 128), 8192, 1, 1),
]


@pytest.mark.parametrize("uniform", [True, False], ids=["uniform", "picked"])
@pytest.mark.parametrize("what, layout, offset, groups, slices", LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_each_warpgroup_reads_its_rows(what: str, layout: SharedLayout, offset: int, groups: int, slices: int,
                                       uniform: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    fn, _engine, text = _jit(SmemTile(offset, layout), groups, slices, monkeypatch, uniform)
    # uniform: rows evenly apart, a constant plus one value a warpgroup; else picked by g
    assert (" select " in text) == (not uniform and groups > 1)
    steps = layout.k_steps
    out = (ctypes.c_uint64 * (steps * slices))()
    for base in (0, 1024, 2048 * 3, 65536):
        for tid in sorted({0, 31, 127, 128, 200, 255, 128 * groups - 1}):
            g = tid >> 7
            if g >= groups:
                continue
            fn(tid, base >> 4, out)
            want = [layout.descriptor(offset + base, k, 64 * (slices * g + m)) for k in range(steps)
                    for m in range(slices)]
            assert list(out) == want, (what, base, tid)


@dataclass(frozen=True)
class _Uneven:
    """A stand-in layout whose rows are not evenly apart between warpgroups."""

    k_steps: int = 2

    def descriptor(self, base: int, k: int, mn: int) -> int:
        return (1 << 62) + (base >> 4) + 2 * k + 100 * (mn // 64) ** 2


def test_rows_not_evenly_apart_pick_by_warpgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    fn, _engine, text = _jit(SmemTile(0, _Uneven()), 3, 1, monkeypatch)
    assert " select " in text
    out = (ctypes.c_uint64 * 2)()
    for tid in (0, 130, 300):
        fn(tid, 64, out)
        assert list(out) == [_Uneven().descriptor(1024, k, 64 * (tid >> 7)) for k in range(2)]


EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("example, kernel, consts, uniform", [
    ("attn_train.tk", "attn_bwd", {"D": 128}, True), ("attn_train.tk", "attn_bwd", {"D": 64, "causal": True}, True),
    ("varlen_attn_train.tk", "varlen_attn_bwd", {}, True),
    ("gemm_swiglu.tk", "gemm_swiglu", {}, False), ("attn.tk", "attn", {"D": 128, "persistent": True}, False),
    ("gemm.tk", "gemm", {}, False),
], ids=lambda v: v if isinstance(v, str) else None)
def test_which_products_take_the_uniform_form(example: str, kernel: str, consts: dict, uniform: bool) -> None:
    """Attention backward's K and V (no ring stage, a loop of two accumulators) take it; a ring
    stage's A (GEMMs, gemm_swiglu's two products, persistent attention's Q) keeps the picked
    form.  And the start field is summed in 32 bits: the warpgroup index times the distance as
    one 64-bit product (``mul.wide``) was what ptxas 13.0 miscompiled."""
    ptx = compile_kernel(EXAMPLES / example, consts, kernel=kernel, stop="ptx", cache=False, ptxas=False).asm["ptx"]
    lines = ptx.splitlines()
    reads = [(i, m.group(1)) for i, line in enumerate(lines)
             if (m := re.search(r"shfl\.sync\.idx\.b32\s+(%r\d+),", line))]
    assert bool(reads) == uniform
    for i, reg in reads:
        use = next(line.split()[0] for line in lines[i + 1:] if re.search(rf"{reg}\b", line))
        assert "wide" not in use and use.endswith(("b32", "s32", "u32")), (reg, use)
