"""wgmma on a real Hopper GPU: the layout formulas of ``tkc/ir/layouts.py`` through real codegen.

Each kernel is built with ``tkc.codegen.nvvm`` (LLVM IR), lowered with ``emit_ptx``, assembled
with ptxas and loaded as a cubin.  One warpgroup (128 threads) TMA-loads its operands with
SWIZZLE_128B into 1024-B aligned dynamic shared memory, one box per ``SharedLayout.tma_box()``
entry, waits on an mbarrier (expect_tx), runs the 4 k16 steps of ``wgmma m64nNk16`` with the
descriptors of ``SharedLayout.descriptor(base, k_step)``, and stores its N/2 f32 accumulators
through a host-built index table made from ``WgmmaAccumulator(N).coords``.  So a wrong swizzle,
box placement, LBO/SBO, k-step advance, transpose flag or accumulator formula shows up as a
wrong product.  The RS variant loads A into registers through ``WgmmaOperandA(64).coords``.

The GPU tests (``-m gpu``) skip without a CUDA GPU; ``test_kernels_assemble`` builds and
assembles every kernel on the CPU (it needs only ptxas).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import llvmlite.ir as ir
import numpy as np
import pytest

from tkc.codegen import nvvm
from tkc.codegen.nvvm import F32, I8, I16, I32, I64, TMAP
from tkc.codegen.ptxas import assemble, find_ptxas
from tkc.codegen.target import emit_ptx
from tkc.dtypes import bf16
from tkc.ir.layouts import SharedLayout, WgmmaAccumulator, WgmmaOperandA

try:
    import torch
except ImportError:  # pragma: no cover - torch is a test dependency
    torch = None

_HAS_GPU = torch is not None and torch.cuda.is_available()

K = 64  # one 128-B swizzle atom of bf16: 4 k16 steps
THREADS = 128
SLACK = 1024  # dynamic shared memory is aligned to 1024 B by hand in the kernel


@dataclass(frozen=True)
class Case:
    """``out[64, n] = A[64, K] @ B`` with B given as N x K (``b_major`` "k", A @ B^T) or K x N
    ("mn", A @ B); A from shared memory (SS) or from registers (RS, ``a_regs``)."""

    n: int
    b_major: str
    a_regs: bool = False

    @property
    def name(self) -> str:
        return f"wgmma_{'rs' if self.a_regs else 'ss'}_b{self.b_major}_n{self.n}"

    @property
    def a_layout(self) -> SharedLayout:
        return SharedLayout(64, K, bf16, "k", 128)

    @property
    def b_layout(self) -> SharedLayout:
        return (SharedLayout(self.n, K, bf16, "k", 128) if self.b_major == "k"
                else SharedLayout(K, self.n, bf16, "mn", 128))

    @property
    def b_offset(self) -> int:
        """Where B starts in shared memory (after A unless A is in registers)."""
        return 0 if self.a_regs else self.a_layout.size_bytes

    @property
    def smem_bytes(self) -> int:
        return self.b_offset + self.b_layout.size_bytes

    @property
    def tx_bytes(self) -> int:
        return self.smem_bytes


CASES = [Case(64, "k"), Case(64, "mn"), Case(128, "mn"), Case(128, "k"), Case(256, "k"), Case(256, "mn"),
         Case(64, "k", a_regs=True), Case(128, "mn", a_regs=True)]


def _c32(v: int) -> ir.Constant:
    return ir.Constant(I32, v)


def _boxes(layout: SharedLayout) -> list[tuple[int, int, int]]:
    """(c0, c1, shared offset) of every TMA box of ``layout``: coordinates innermost first."""
    box = layout.tma_box()
    return [(i * box.dims[0], j * box.dims[1], i * box.inner_stride + j * box.outer_stride)
            for j in range(box.count[1]) for i in range(box.count[0])]


def build(case: Case) -> ir.Module:
    """The kernel of ``case``.  Parameters, in order:

    - SS: ``tmap_a, tmap_b, out, out_idx, info``; RS: ``a (bf16 bits), a_idx, tmap_b, out, out_idx, info``.
    - ``out`` f32[64*N], ``out_idx`` i32[128*N/2]: thread t stores accumulator i at
      ``out[out_idx[t*N/2 + i]]``.  ``a_idx`` i32[128*32]: thread t's bf16 value v of A is
      ``a[a_idx[t*32 + v]]`` (values 2j, 2j+1 are the low and high halves of b32 register j).
    - ``info`` i64[9]: thread 0 writes the shared base and the 4 A and 4 B descriptors it used.

    A descriptor is ``SharedLayout.descriptor(0, k)`` plus the operand's shared address >> 4
    (the start field is the address >> 4); the host checks that this equals
    ``descriptor(address, k)``.
    """
    m = ir.Module(case.name)
    dsmem = ir.GlobalVariable(m, ir.ArrayType(I8, 0), "dsmem", addrspace=nvvm.SHARED)
    dsmem.linkage = "external"
    dsmem.align = 1024
    bar = nvvm.shared(m, "bar", I64, align=8)
    g = nvvm.ptr(nvvm.GLOBAL)
    params = ([g, g, TMAP] if case.a_regs else [TMAP, TMAP]) + [g, g, g]
    fn = nvvm.kernel(m, case.name, params, maxntid=THREADS)
    if case.a_regs:
        a_glob, a_idx, tmap_b, out, out_idx, info = fn.args
        tmap_a = None
    else:
        tmap_a, tmap_b, out, out_idx, info = fn.args
    blk = {n: fn.append_basic_block(n) for n in ("entry", "init", "sync", "issue", "wait", "mma", "info", "exit")}
    b = ir.IRBuilder(blk["entry"])
    tid = nvvm.sreg(b, "tid.x")
    raw = b.trunc(b.ptrtoint(dsmem, I64), I32)
    base = b.and_(b.add(raw, _c32(SLACK - 1)), _c32(-SLACK), name="smem_base")
    smem = b.gep(dsmem, [b.sub(base, raw)], source_etype=I8)  # keeps the pointer's provenance
    is0 = b.icmp_unsigned("==", tid, _c32(0))
    b.cbranch(is0, blk["init"], blk["sync"])

    b.position_at_end(blk["init"])
    nvvm.call(b, "mbarrier.init.shared", bar, 1)
    nvvm.call(b, "fence.mbarrier_init.release.cluster")
    nvvm.call(b, "fence.proxy.async.shared_cta")
    b.branch(blk["sync"])

    b.position_at_end(blk["sync"])
    nvvm.call(b, "barrier.cta.sync.aligned.all", 0)
    b.cbranch(is0, blk["issue"], blk["wait"])

    b.position_at_end(blk["issue"])
    nvvm.call(b, "mbarrier.arrive.expect.tx.scope.cta.space.cta", bar, case.tx_bytes)
    loads = [(tmap_b, case.b_layout, case.b_offset)]
    if tmap_a is not None:
        loads.insert(0, (tmap_a, case.a_layout, 0))
    for tmap, layout, start in loads:
        for c0, c1, off in _boxes(layout):
            dst = b.addrspacecast(b.gep(smem, [_c32(start + off)], source_etype=I8), nvvm.ptr(nvvm.SHARED_CLUSTER))
            nvvm.call(b, "cp.async.bulk.tensor.g2s.tile.2d", dst, bar, tmap, c0, c1, 0, 0, 0, 0)
    b.branch(blk["wait"])

    b.position_at_end(blk["wait"])
    done = nvvm.call(b, "mbarrier.try.wait.parity.scope.cta.space.cta", bar, 0)
    b.cbranch(done, blk["mma"], blk["wait"])

    b.position_at_end(blk["mma"])

    def descs(layout: SharedLayout, start: int) -> list[ir.Value]:
        addr4 = b.zext(b.lshr(b.add(base, _c32(start)), _c32(4)), I64)
        return [b.add(ir.Constant(I64, layout.descriptor(0, k)), addr4) for k in range(layout.k_steps)]

    b_descs = descs(case.b_layout, case.b_offset)
    if case.a_regs:
        frag = WgmmaOperandA(K)
        vals = frag.regs  # 32 bf16 values = 16 b32 registers
        row0 = b.mul(tid, _c32(vals))
        halves = []
        for v in range(vals):
            idx = b.load(b.gep(a_idx, [b.add(row0, _c32(v))], source_etype=I32), typ=I32)
            halves.append(b.zext(b.load(b.gep(a_glob, [idx], source_etype=I16), typ=I16), I32))
        a_ops: list = [b.or_(halves[2 * j], b.shl(halves[2 * j + 1], _c32(16))) for j in range(vals // 2)]
        a_steps = [[a_ops[r] for r in frag.step_registers(k)] for k in range(frag.k_steps)]
        a_descs = [ir.Constant(I64, 0)] * 4
    else:
        a_descs = descs(case.a_layout, 0)
        a_steps = a_descs
    nvvm.call(b, "wgmma.fence.sync.aligned")
    acc = [ir.Constant(F32, 0.0)] * (case.n // 2)
    for k, (a_op, b_desc) in enumerate(zip(a_steps, b_descs)):
        acc = nvvm.wgmma(b, acc, a_op, b_desc, scale_d=k > 0, trans_b=int(case.b_major == "mn"))
    nvvm.call(b, "wgmma.commit_group.sync.aligned")
    nvvm.call(b, "wgmma.wait_group.sync.aligned", 0)
    acc = nvvm.pin(b, acc)
    first = b.mul(tid, _c32(case.n // 2))
    for i, v in enumerate(acc):
        idx = b.load(b.gep(out_idx, [b.add(first, _c32(i))], source_etype=I32), typ=I32)
        b.store(v, b.gep(out, [idx], source_etype=F32))
    b.cbranch(is0, blk["info"], blk["exit"])

    b.position_at_end(blk["info"])
    for j, v in enumerate([b.zext(base, I64), *a_descs, *b_descs]):
        b.store(v, b.gep(info, [_c32(j)], source_etype=I64))
    b.branch(blk["exit"])

    b.position_at_end(blk["exit"])
    b.ret_void()
    return m


@cache
def _compiled(case: Case) -> tuple[str, bytes]:
    ptx = emit_ptx(build(case))
    return ptx, assemble(ptx, "sm_90a", verbose=False).cubin


def out_index(n: int) -> np.ndarray:
    """(thread, reg) -> row * n + col, from ``WgmmaAccumulator(n).coords``: int32[128 * n/2]."""
    acc = WgmmaAccumulator(n)
    t, i = np.meshgrid(np.arange(acc.threads), np.arange(acc.regs), indexing="ij")
    row, col = acc.coords(t, i)
    return (row * n + col).astype(np.int32).ravel()


def a_index() -> np.ndarray:
    """(thread, value) -> row * K + col of A, from ``WgmmaOperandA(K).coords``: int32[128 * K/2]."""
    frag = WgmmaOperandA(K)
    t, v = np.meshgrid(np.arange(frag.threads), np.arange(frag.regs), indexing="ij")
    row, col = frag.coords(t, v)
    return (row * K + col).astype(np.int32).ravel()


# --------------------------------------------------------------------------- CPU: codegen and tables


def test_index_tables_are_permutations() -> None:
    for n in (64, 128, 256):
        assert sorted(out_index(n).tolist()) == list(range(64 * n))
    assert sorted(a_index().tolist()) == list(range(64 * K))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernels_assemble(case: Case, ptxas: Path) -> None:
    ptx, cubin = _compiled(case)
    assert len(cubin) > 0
    steps = ptx.count(f"wgmma.mma_async.sync.aligned.m64n{case.n}k16.f32.bf16.bf16")
    assert steps == 4, ptx
    assert ptx.count("cp.async.bulk.tensor.2d") == len(_boxes(case.b_layout)) + (0 if case.a_regs else 1)
    assert ".extern .shared .align 1024 .b8 dsmem[]" in ptx
    assert ".local" not in ptx


def test_descriptor_start_is_the_address_field() -> None:
    # What the kernel relies on: descriptor(base) = descriptor(0) + base >> 4 for aligned bases.
    for case in CASES:
        for layout in (case.a_layout, case.b_layout):
            for base in (0, 1024, 0x9C00, 0x30000):
                for k in range(4):
                    assert layout.descriptor(base, k) == layout.descriptor(0, k) + (base >> 4)


# --------------------------------------------------------------------------- GPU


def _ptr(t) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _dump(case: Case, **arrays) -> str:
    d = os.environ.get("TKC_GPU_DUMP")
    if not d or len(os.listdir(d)) >= 6:  # the device run brings back at most 8 files
        return ""
    path = Path(d) / f"{case.name}.npz"
    np.savez(path, **{k: v.detach().cpu().float().numpy() if hasattr(v, "detach") else v for k, v in arrays.items()})
    return f" (dumped to {path})"


def _explain(case: Case, out, ref) -> str:
    bad = (out - ref).abs() > 1e-2 * ref.abs().clamp_min(1.0)
    rows, cols = torch.nonzero(bad, as_tuple=True)
    acc = WgmmaAccumulator(case.n)
    lines = [f"{int(bad.sum())} of {bad.numel()} elements differ"]
    for r, c in list(zip(rows.tolist(), cols.tolist()))[:8]:
        t, i = acc.owner(r, c)
        lines.append(f"  [{r}, {c}] (thread {int(t)}, reg {int(i)}): got {out[r, c].item():g}, "
                     f"want {ref[r, c].item():g}")
    return "\n".join(lines)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.gpu
@pytest.mark.skipif(not _HAS_GPU, reason="needs a CUDA GPU (torch with CUDA)")
def test_wgmma_on_gpu(case: Case) -> None:
    from tkc.runtime import tensormap
    from tkc.runtime.driver import Module

    if find_ptxas() is None:
        pytest.skip("no ptxas found: the kernels cannot be assembled")
    _, cubin = _compiled(case)
    fn = Module.load(cubin, "cubin").function(case.name)
    shared = case.smem_bytes + SLACK
    fn.set_max_dynamic_shared(shared)

    gen = torch.Generator(device="cuda").manual_seed(case.n + 7 * case.a_regs)
    a = torch.randn(64, K, device="cuda", generator=gen).to(torch.bfloat16)
    if case.b_major == "k":
        bmat = torch.randn(case.n, K, device="cuda", generator=gen).to(torch.bfloat16)
        ref = a.float() @ bmat.float().T
    else:
        bmat = torch.randn(K, case.n, device="cuda", generator=gen).to(torch.bfloat16)
        ref = a.float() @ bmat.float()
    out = torch.full((64, case.n), float("nan"), device="cuda")
    oidx = torch.from_numpy(out_index(case.n)).cuda()
    info = torch.zeros(9, dtype=torch.int64, device="cuda")

    def tmap(t, layout: SharedLayout, name: str):
        return tensormap.encode_tiled(t, layout.tma_box().dims, layout.tma_swizzle_enum(), name=name)

    tb = tmap(bmat, case.b_layout, "b")
    if case.a_regs:
        aidx = torch.from_numpy(a_index()).cuda()
        params = [_ptr(a), _ptr(aidx), tb]
    else:
        params = [tmap(a, case.a_layout, "a"), tb]
    fn.launch(grid=1, block=THREADS, shared_bytes=shared, params=[*params, _ptr(out), _ptr(oidx), _ptr(info)])
    torch.cuda.synchronize()

    base, *used = info.cpu().tolist()
    assert base % 1024 == 0
    want = [] if case.a_regs else [case.a_layout.descriptor(base, k) for k in range(4)]
    want += [case.b_layout.descriptor(base + case.b_offset, k) for k in range(4)]
    got = [d & (2**64 - 1) for d in used]
    if case.a_regs:
        got = got[4:]
    assert got == want, "the kernel's descriptors differ from SharedLayout.descriptor at the real base"

    if not torch.allclose(out, ref, rtol=1e-2, atol=1e-2):
        where = _dump(case, out=out, ref=ref, a=a.float(), b=bmat.float())
        pytest.fail(f"{case.name}: wgmma result differs from torch{where}\n{_explain(case, out, ref)}")
