"""NVVM helpers: a Hopper kernel built from them lowers to the expected PTX, and ptxas accepts it."""

from __future__ import annotations

import re
from pathlib import Path

import llvmlite.ir as ir
import pytest

from tkc.codegen import nvvm
from tkc.codegen.nvvm import F32, I8, I32, I64, TMAP
from tkc.codegen.ptxas import assemble
from tkc.codegen.target import emit_ptx
from tkc.errors import TkcCodegenError


def _c(v: int) -> ir.Constant:
    return ir.Constant(I32, v)


def hopper_kernel(maxnreg: int | None = 168, n: int = 64) -> ir.Module:
    """384 threads: warpgroup 0 loads a 64×64 bf16 tile by TMA, warpgroups 1-2 run one wgmma on it.

    Exercises special registers, mbarrier init + expect_tx + try_wait loop, a grid-constant
    tensor map, elect.sync, setmaxnreg dec/inc (PTX-FACTS §5: producer 40, consumers 232 under
    .maxnreg 168), wgmma fence/mma/commit/wait with descriptors from kernel arguments, pinned
    accumulators and global stores.
    """
    m = ir.Module("hopper")
    smem = nvvm.shared(m, "smem", ir.ArrayType(I8, 8192), align=1024)
    bar = nvvm.shared(m, "bar", I64, align=8)
    fn = nvvm.kernel(m, "k", [TMAP, nvvm.ptr(nvvm.GLOBAL), I64, I64], maxntid=384, maxnreg=maxnreg)
    tmap, out, da, db = fn.args
    blocks = {name: fn.append_basic_block(name) for name in
              ("entry", "init", "sync", "producer", "issue", "consumer", "wait", "mma", "exit")}
    b = ir.IRBuilder(blocks["entry"])
    tid = nvvm.sreg(b, "tid.x")
    cta = nvvm.sreg(b, "ctaid.x")
    b.cbranch(b.icmp_unsigned("==", tid, _c(0)), blocks["init"], blocks["sync"])

    b.position_at_end(blocks["init"])
    nvvm.call(b, "mbarrier.init.shared", bar, 1)
    nvvm.call(b, "fence.mbarrier_init.release.cluster")
    b.branch(blocks["sync"])

    b.position_at_end(blocks["sync"])
    nvvm.call(b, "barrier.cta.sync.aligned.all", 0)
    wg = b.lshr(tid, _c(7))
    b.cbranch(b.icmp_unsigned("==", wg, _c(0)), blocks["producer"], blocks["consumer"])

    b.position_at_end(blocks["producer"])
    nvvm.setmaxnreg(b, 40, inc=False)
    elected = b.extract_value(nvvm.call(b, "elect.sync", 0xFFFFFFFF), 1)
    warp0 = b.icmp_unsigned("==", b.lshr(tid, _c(5)), _c(0))
    b.cbranch(b.and_(warp0, elected), blocks["issue"], blocks["exit"])

    b.position_at_end(blocks["issue"])
    nvvm.call(b, "mbarrier.arrive.expect.tx.scope.cta.space.cta", bar, 8192)
    dst = b.addrspacecast(smem, nvvm.ptr(nvvm.SHARED_CLUSTER))
    nvvm.call(b, "cp.async.bulk.tensor.g2s.tile.2d", dst, bar, tmap, b.mul(cta, _c(64)), 0, 0, 0, 0, 0)
    b.branch(blocks["exit"])

    b.position_at_end(blocks["consumer"])
    nvvm.setmaxnreg(b, 232, inc=True)
    b.branch(blocks["wait"])

    b.position_at_end(blocks["wait"])
    done = nvvm.call(b, "mbarrier.try.wait.parity.scope.cta.space.cta", bar, 0)
    b.cbranch(done, blocks["mma"], blocks["wait"])

    b.position_at_end(blocks["mma"])
    nvvm.call(b, "wgmma.fence.sync.aligned")
    acc = nvvm.wgmma(b, [ir.Constant(F32, 0.0)] * (n // 2), da, db, scale_d=False)
    nvvm.call(b, "wgmma.commit_group.sync.aligned")
    nvvm.call(b, "wgmma.wait_group.sync.aligned", 0)
    acc = nvvm.pin(b, acc)
    row = b.add(b.mul(cta, _c(256)), b.sub(tid, _c(128)))
    base = b.mul(row, _c(n // 2))
    for i, v in enumerate(acc):
        b.store(v, b.gep(out, [b.add(base, _c(i))], source_etype=F32))
    b.branch(blocks["exit"])

    b.position_at_end(blocks["exit"])
    b.ret_void()
    return m


# --------------------------------------------------------------------------- LLVM IR and PTX (no ptxas)


def test_kernel_header() -> None:
    m = ir.Module("m")
    fn = nvvm.kernel(m, "k", [TMAP, nvvm.ptr(nvvm.GLOBAL), I32], maxntid=384, minctasm=1, maxnreg=168,
                     cluster_dim=(2, 1, 1))
    ir.IRBuilder(fn.append_basic_block()).ret_void()
    head = str(fn).splitlines()[0]
    assert head.startswith('define ptx_kernel void @"k"(ptr byval(%"struct.CUtensorMap") align 64 '
                           '"nvvm.grid_constant" %".1", ptr addrspace(1) %".2", i32 %".3")')
    assert head.endswith('"nvvm.maxntid"="384" "nvvm.minctasm"="1" "nvvm.maxnreg"="168" "nvvm.cluster_dim"="2,1,1"')
    assert '%"struct.CUtensorMap" = type {[16 x i64]}' in str(m)
    ptx = emit_ptx(m)
    for directive in (".entry k(", ".param .align 64 .b8 k_param_0[128]", ".maxntid 384", ".minnctapersm 1",
                      ".maxnreg 168", ".explicitcluster", ".reqnctapercluster 2, 1, 1"):
        assert directive in ptx, directive


def test_maxntid_dims() -> None:
    m = ir.Module("m")
    fn = nvvm.kernel(m, "k", [], maxntid=(128, 2))
    ir.IRBuilder(fn.append_basic_block()).ret_void()
    assert ".maxntid 128, 2\n" in emit_ptx(m)


@pytest.mark.parametrize("kw", [dict(maxntid=2048), dict(maxntid=(64, 64)), dict(maxntid=0),
                                dict(maxntid=(1, 1, 1, 1)), dict(maxntid=128, maxnreg=300),
                                dict(maxntid=128, cluster_dim=(2, 1)), dict(maxntid=128, minctasm=True)])
def test_kernel_attribute_checks(kw: dict) -> None:
    with pytest.raises(TkcCodegenError, match="maxntid|maxnreg|cluster_dim|minctasm"):
        nvvm.kernel(ir.Module("m"), "k", [], **kw)


def test_every_intrinsic_declaration_is_accepted_by_llvm() -> None:
    # LLVM's verifier checks the signature of every llvm.* declaration.
    m = ir.Module("m")
    for name in nvvm.INTRINSICS:
        nvvm.intrinsic(m, name)
    assert nvvm.intrinsic(m, "elect.sync") is m.globals["llvm.nvvm.elect.sync"]  # declared once
    emit_ptx(m)


def test_unknown_intrinsic_and_wrong_arity() -> None:
    m = ir.Module("m")
    with pytest.raises(TkcCodegenError, match="unknown NVVM intrinsic 'llvm.nvvm.mbarrier.init.bogus'"):
        nvvm.intrinsic(m, "mbarrier.init.bogus")
    fn = nvvm.kernel(m, "k", [], maxntid=32)
    b = ir.IRBuilder(fn.append_basic_block())
    with pytest.raises(TkcCodegenError, match="takes 2 arguments, got 1"):
        nvvm.call(b, "barrier.cta.sync.aligned.count", 1)


@pytest.mark.parametrize("regs", [16, 100, 264, 23.0])
def test_setmaxnreg_checks(regs: object) -> None:
    b = ir.IRBuilder(nvvm.kernel(ir.Module("m"), "k", [], maxntid=128).append_basic_block())
    with pytest.raises(TkcCodegenError, match="multiple of 8 in \\[24, 256\\]"):
        nvvm.setmaxnreg(b, regs, inc=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [8, 64, 128, 256])
def test_wgmma_asm_text(n: int) -> None:
    asm, cons = nvvm.wgmma_asm(n)
    nd = n // 2
    d = ", ".join(f"${i}" for i in range(nd))
    assert asm == f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{d}}}, ${nd}, ${nd + 1}, 1, 1, 1, 0, 0;"
    assert cons == ",".join(["=f"] * nd + ["l", "l"] + [str(i) for i in range(nd)] + ["~{memory}"])


def test_wgmma_asm_forms() -> None:
    asm, cons = nvvm.wgmma_asm(16, a_regs=True, scale_d=False, trans_b=1)
    assert asm == "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {$0, $1, $2, $3, $4, $5, $6, $7}, " \
                  "{$8, $9, $10, $11}, $12, 0, 1, 1, 1;"
    assert cons == "=f,=f,=f,=f,=f,=f,=f,=f,r,r,r,r,l,0,1,2,3,4,5,6,7,~{memory}"
    asm, _ = nvvm.wgmma_asm(32, "e4m3", "e5m2", neg_a=True)
    assert asm.startswith("wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e5m2 ") and asm.endswith(", 1, -1, 1;")
    asm, cons = nvvm.wgmma_asm(8, scale_d=None)
    assert "setp.ne.b32 p, $6, 0;" in asm and ", p, 1, 1, 0, 0;" in asm
    assert cons == "=f,=f,=f,=f,l,l,r,0,1,2,3,~{memory}"


@pytest.mark.parametrize(("args", "kw", "match"), [
    ((12,), {}, "N=12"), ((264,), {}, "N=264"), ((0,), {}, "N=0"),
    ((64, "e4m3"), {"trans_b": 1}, "K-major only"),
    ((64, "bf16", "f16"), {}, "same type"), ((64, "bf16", "e4m3"), {}, "bf16×e4m3"),
    ((64, "tf32"), {}, "tf32"), ((64,), {"a_regs": True, "trans_a": 1}, "transpose"),
])
def test_wgmma_asm_refuses(args: tuple, kw: dict, match: str) -> None:
    with pytest.raises(TkcCodegenError, match=match):
        nvvm.wgmma_asm(*args, **kw)


def test_hopper_kernel_ptx() -> None:
    ptx = emit_ptx(hopper_kernel())
    for text in ("wgmma.fence.sync.aligned", "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
                 "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned",
                 "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
                 "mbarrier.init.shared", "mbarrier.arrive.expect_tx", "mbarrier.try_wait.parity",
                 "fence.mbarrier_init.release.cluster", "bar.sync", "elect.sync",
                 "setmaxnreg.dec.sync.aligned.u32 \t40", "setmaxnreg.inc.sync.aligned.u32 \t232",
                 ".param .align 64 .b8 k_param_0[128]", "cvta.param.u64", ".maxntid 384", ".maxnreg 168",
                 "%tid.x", "%ctaid.x",
                 "st.global"):
        assert text in ptx, text
    assert ".local" not in ptx and "__local_depot" not in ptx  # the tensor map stays a param (§8)


# --------------------------------------------------------------------------- ptxas


def test_hopper_kernel_assembles(ptxas: Path) -> None:
    a = assemble(emit_ptx(hopper_kernel()), "sm_90a")
    k = a.kernels["k"]
    assert k.spill_stores == 0 and k.spill_loads == 0 and k.stack_frame == 0
    assert k.smem >= 8192 + 8 and k.registers <= 168
    assert not any("C7508" in w for w in a.warnings), a.warnings  # setmaxnreg kept (§5)
    assert not any(re.search(r"\(C75\d\d\)", w) for w in a.warnings), a.warnings


def test_setmaxnreg_without_maxnreg_is_reported(ptxas: Path) -> None:
    # PTX-FACTS §5: with only .maxntid, ptxas drops setmaxnreg with C7508; the report must show it.
    a = assemble(emit_ptx(hopper_kernel(maxnreg=None)), "sm_90a")
    assert any("(C7508)" in w and "setmaxnreg" in w for w in a.warnings), a.log


def _wgmma_kernel(m: ir.Module, name: str, n: int, *, a_regs: bool = False, dynamic: bool = False,
                  **kw: object) -> None:
    params = [nvvm.ptr(nvvm.GLOBAL), I64, I64, *([I32] * 4 if a_regs else []), I32]
    fn = nvvm.kernel(m, name, params, maxntid=128)
    out, da, db, *rest = fn.args
    b = ir.IRBuilder(fn.append_basic_block())
    a = list(rest[:4]) if a_regs else da
    nvvm.call(b, "wgmma.fence.sync.aligned")
    acc = nvvm.wgmma(b, [ir.Constant(F32, 0.0)] * (n // 2), a, db, scale_d=rest[-1] if dynamic else False, **kw)
    acc = nvvm.wgmma(b, acc, a, db, scale_d=True, **kw)
    nvvm.call(b, "wgmma.commit_group.sync.aligned")
    nvvm.call(b, "wgmma.wait_group.sync.aligned", 0)
    base = b.mul(nvvm.sreg(b, "tid.x"), _c(n // 2))
    for i, v in enumerate(nvvm.pin(b, acc)):
        b.store(v, b.gep(out, [b.add(base, _c(i))], source_etype=F32))
    b.ret_void()


def test_wgmma_forms_assemble(ptxas: Path) -> None:
    m = ir.Module("wgmma")
    for n in (8, 64, 128, 256):
        _wgmma_kernel(m, f"ss_n{n}", n)
    _wgmma_kernel(m, "rs_bf16", 64, a_regs=True, trans_b=1)
    _wgmma_kernel(m, "ss_dynamic_scale_d", 64, dynamic=True, trans_a=1, trans_b=1)
    _wgmma_kernel(m, "ss_f16", 32, a_type="f16")
    _wgmma_kernel(m, "ss_fp8", 128, a_type="e4m3", b_type="e5m2")
    _wgmma_kernel(m, "rs_fp8_dynamic", 64, a_type="e4m3", a_regs=True, dynamic=True)
    ptx = emit_ptx(m)
    for n in (8, 64, 128, 256):
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16" in ptx
    assert "m64n128k32.f32.e4m3.e5m2" in ptx and "m64n64k32.f32.e4m3.e4m3" in ptx
    a = assemble(ptx, "sm_90a")
    assert len(a.kernels) == 9
    for usage in a.kernels.values():
        assert usage.spill_stores == 0 and usage.spill_loads == 0, usage
    assert a.warnings == (), a.warnings
