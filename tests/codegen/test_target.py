"""Targets and LLVM IR → PTX: names are checked before LLVM sees them, LLVM errors become tkc errors."""

from __future__ import annotations

import llvmlite.ir as ir
import pytest

from tkc.codegen import target as target_mod
from tkc.codegen.target import emit_ptx
from tkc.errors import TkcCodegenError, TkcUsageError
from tkc.target import DATA_LAYOUT, TARGETS, Target, target

EMPTY_KERNEL = """
define ptx_kernel void @k() "nvvm.maxntid"="128" {
  ret void
}
"""


def test_known_targets() -> None:
    t = target("sm_90a")
    assert (t.cpu, t.ptx_feature, t.ptx_version, t.arch) == ("sm_90a", "+ptx81", "8.1", "sm_90a")
    assert t.triple == "nvptx64-nvidia-cuda" and t.data_layout == DATA_LAYOUT
    assert target("sm_100a").ptx_feature == "+ptx86"  # PTX-FACTS §0: sm_100a needs 8.6
    assert target(t) is t


@pytest.mark.parametrize("name", ["sm_90", "sm_80", "SM_90A", "", "sm_90a ", 90, None])
def test_unknown_target_is_a_usage_error(name: object) -> None:
    with pytest.raises(TkcUsageError, match="valid targets: sm_90a, sm_100a"):
        target(name)  # type: ignore[arg-type]


def test_unknown_target_refused_before_llvm(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: object) -> None:
        raise AssertionError("LLVM target machine created for an unknown target")

    monkeypatch.setattr(target_mod, "_machine", boom)
    with pytest.raises(TkcUsageError, match="unknown target 'sm_89'"):
        emit_ptx(EMPTY_KERNEL, "sm_89")


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_data_layout_matches_llvm(name: str) -> None:
    assert str(target_mod._machine(TARGETS[name], 3).target_data) == DATA_LAYOUT


@pytest.mark.parametrize(("name", "version"), [("sm_90a", "8.1"), ("sm_100a", "8.6")])
def test_emit_ptx_header(name: str, version: str) -> None:
    ptx = emit_ptx(EMPTY_KERNEL, name)
    assert f".version {version}" in ptx and f".target {name}" in ptx
    assert ".address_size 64" in ptx and ".entry k" in ptx and ".maxntid 128" in ptx


def test_emit_ptx_takes_an_llvmlite_module() -> None:
    m = ir.Module("m")
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), []), "k")
    fn.calling_convention = "ptx_kernel"
    ir.IRBuilder(fn.append_basic_block()).ret_void()
    for opt in (0, 2, 3):
        assert ".entry k" in emit_ptx(m, "sm_90a", opt=opt)
    assert m.triple != TARGETS["sm_90a"].triple  # the caller's module is not modified


def test_bad_opt_level() -> None:
    with pytest.raises(TkcUsageError, match="opt level 4"):
        emit_ptx(EMPTY_KERNEL, opt=4)


def test_parse_error_quotes_the_ir_line() -> None:
    bad = "define ptx_kernel void @k() {\n  ret i32 0\n}\n"
    with pytest.raises(TkcCodegenError) as e:
        emit_ptx(bad)
    msg = str(e.value)
    assert "line 2:" in msg and "value doesn't match function result type" in msg
    assert "  ret i32 0\n" in msg and msg.endswith("^")


def test_verify_error() -> None:
    bad = """
define ptx_kernel void @k() {
entry:
  br label %x
x:
  %a = add i32 %b, 1
  %b = add i32 %a, 1
  ret void
}
"""
    with pytest.raises(TkcCodegenError, match="does not verify: Instruction does not dominate all uses"):
        emit_ptx(bad)


@pytest.mark.parametrize(("name", "intrinsic"), [
    ("sm_90a", "llvm.nvvm.tcgen05.fence.before.thread.sync"),
    ("sm_100a", "llvm.nvvm.wgmma.fence.sync.aligned"),
])
def test_intrinsic_for_the_wrong_target_is_refused_not_fatal(name: str, intrinsic: str) -> None:
    # LLVM aborts the process on these (PTX-FACTS §8); tkc must refuse them first.
    text = f"""
declare void @{intrinsic}()
define ptx_kernel void @k() {{
  call void @{intrinsic}()
  ret void
}}
"""
    with pytest.raises(TkcCodegenError, match=f"{intrinsic} cannot be lowered for {name}"):
        emit_ptx(text, name)


def test_target_is_frozen() -> None:
    with pytest.raises(AttributeError):
        TARGETS["sm_90a"].cpu = "sm_80"  # type: ignore[misc]
    assert isinstance(TARGETS["sm_90a"], Target)


def test_wrong_target_intrinsic_in_an_llvmlite_module() -> None:
    m = ir.Module("m")
    fence = ir.Function(m, ir.FunctionType(ir.VoidType(), []), "llvm.nvvm.wgmma.fence.sync.aligned")
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), []), "k")
    fn.calling_convention = "ptx_kernel"
    b = ir.IRBuilder(fn.append_basic_block())
    b.call(fence, [])
    b.ret_void()
    assert '@"llvm.nvvm.wgmma.fence.sync.aligned"' in str(m)
    with pytest.raises(TkcCodegenError, match="llvm.nvvm.wgmma.fence.sync.aligned cannot be lowered for sm_100a"):
        emit_ptx(m, "sm_100a")
    assert "wgmma.fence.sync.aligned;" in emit_ptx(m, "sm_90a")


def test_inline_ptx_of_a_later_isa_raises_the_version_of_its_module_only() -> None:
    """fence.proxy.tensormap needs PTX ISA 8.3 (sm_90a's PTX is 8.1): only a module that uses
    it is emitted at 8.3, and the target machine of 8.1 stays as it was."""
    import llvmlite.ir as ir

    from tkc.codegen.target import emit_ptx

    def module(asm: str | None) -> ir.Module:
        m = ir.Module()
        fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [ir.IntType(64)]), "k")
        b = ir.IRBuilder(fn.append_basic_block())
        if asm is not None:
            b.asm(ir.FunctionType(ir.VoidType(), [ir.IntType(64)]), asm, "l,~{memory}", [fn.args[0]], True)
        b.ret_void()
        return m

    assert ".version 8.3" in emit_ptx(module("fence.proxy.tensormap::generic.acquire.sys [$0], 128;"), "sm_90a")
    assert ".version 8.1" in emit_ptx(module(None), "sm_90a")
    assert ".version 8.6" in emit_ptx(module("fence.proxy.tensormap::generic.acquire.sys [$0], 128;"), "sm_100a")
