"""Rings and warpgroup roles in codegen (docs/hopper.md "Rings and roles"): ring stages
addressed at run time in every op that takes a shared tile or an mbarrier, mbarrier_arrive,
roles with setmaxnreg, the rebased thread index and named barriers over a role's threads;
the hand-written ring and warp-specialized GEMMs assemble without spills and with
setmaxnreg honoured."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import llvmlite.ir as ir
import pytest

from tkc.codegen.lower import kernel_to_llvm, kernel_to_ptx
from tkc.registers import entry_registers
from tkc.target import DEFAULT_TARGET as SM90
from tkc.codegen.ptxas import Assembled, assemble
from tkc.dtypes import bf16
from tkc.errors import TkcCodegenError
from tkc.ir.core import Operation
from tkc.ir.layouts import SharedLayout
from tkc.ir.parser import parse_module

from test_lower import _no_spills, local_bytes

ROOT = Path(__file__).resolve().parents[2]
HOPPER = ROOT / "tests" / "data" / "hopper"
KERNELS = Path(__file__).parent / "kernels"
RING, WS = HOPPER / "gemm_ring.tkir", HOPPER / "gemm_ws.tkir"


def _kernel(path: Path) -> Operation:
    return parse_module(path.read_text(), str(path)).kernel()


@cache
def _ptx(path: Path) -> str:
    return kernel_to_ptx(_kernel(path))


@cache
def _assembled(path: Path) -> Assembled:
    return assemble(_ptx(path), "sm_90a")


def _clean(path: Path, name: str) -> None:
    """No spills, no stack beyond the edge paths' buffers, and no ptxas remark at all: C7508
    (setmaxnreg dropped) and the C75xx wgmma serializations are the ones this guards against."""
    a = _assembled(path)
    _no_spills(a, name, _ptx(path), _kernel(path))
    assert a.warnings == (), a.warnings


def _syncs(ptx: str) -> list[str]:
    """Every bar.sync / barrier.sync, as 'id' or 'id, count'."""
    return [m.group(2).strip() for m in re.finditer(r"\b(bar|barrier)\.sync(?:\.aligned)?\s+([^;]+);", ptx)]


# --------------------------------------------------------------------------- the reference kernels


def test_entry_registers() -> None:
    assert entry_registers(384, 1, SM90) == 168  # PTX-FACTS §5
    assert entry_registers(256, 1, SM90) == 248 and entry_registers(128, 1, SM90) == 248
    assert entry_registers(1024, 1, SM90) == 64
    assert entry_registers(256, 2, SM90) == 128 and entry_registers(384, 2, SM90) == 80  # .minnctapersm 2


def test_two_programs_per_sm() -> None:
    """ctas_per_sm = 2: .minnctapersm 2, the consumer budget from half the register file
    ((32768 - 128 * 24) / 128 = 232), the ring sized for half the SM's shared memory, and
    ptxas keeping to it without spills."""
    from tkc.target import target
    from tkc.compiler import compile_kernel

    c = compile_kernel(ROOT / "examples" / "attn.tk", {"D": 128, "BM": 64, "BN": 64, "ctas_per_sm": 2},
                       cache=False)
    ptx = c.asm["ptx"]
    assert ".minnctapersm 2" in ptx
    assert "setmaxnreg.dec.sync.aligned.u32 \t24;" in ptx and "setmaxnreg.inc.sync.aligned.u32 \t232;" in ptx
    assert c.smem_bytes <= target("sm_90a").smem_per_program(2) == 115712
    assert c.resources.spill_stores == 0 and c.resources.registers <= 128


def test_two_programs_per_sm_refuses_a_wide_accumulator() -> None:
    from tkc.compiler import compile_kernel

    # Half the shared memory leaves the GEMM one stage (no ring, no producer), and 128
    # registers a thread at entry: as many as its 128 x 256 accumulator takes alone.
    with pytest.raises(TkcCodegenError, match=r"ctas_per_sm = 2 leaves 128 registers a thread, and this "
                                              r"product's accumulator alone takes 128") as e:
        compile_kernel(ROOT / "examples" / "gemm.tk", {"ctas_per_sm": 2}, stop="llvm", cache=False)
    assert e.value.loc is not None and e.value.loc.line > 1


@pytest.mark.parametrize("example, consts, need", [("attn.tk", {"D": 64}, 64), ("gemm.tk", {"BN": 112}, 56)])
def test_two_programs_per_sm_refuse_a_product_ptxas_cannot_fit_in_the_entry_budget(example, consts, need) -> None:
    """Two 384-thread programs an SM start with 80 registers a thread; the consumers' setmaxnreg
    budget (104) holds a 64- or 56-register accumulator, but ptxas compiles each wgmma within
    the 80 (C7602: it asked for 90 and 82): refused at the product, before ptxas."""
    from tkc.compiler import compile_kernel

    with pytest.raises(TkcCodegenError, match=rf"ctas_per_sm = 2 leaves 80 registers a thread at kernel entry, "
                                              rf"and ptxas compiles this product within them: its {need}-register "
                                              rf"accumulator needs {need + 26}") as e:
        compile_kernel(ROOT / "examples" / example, {**consts, "ctas_per_sm": 2}, stop="llvm", cache=False)
    assert e.value.loc is not None and e.value.loc.line > 1


def test_two_programs_per_sm_take_the_widest_product_ptxas_fits(ptxas: Path) -> None:
    """A 48-register accumulator (128 x 96) fits ptxas's 80 at entry: it assembles."""
    from tkc.compiler import compile_kernel

    c = compile_kernel(ROOT / "examples" / "gemm.tk", {"BN": 96, "ctas_per_sm": 2}, cache=False)
    assert c.asm["cubin"][:4] == b"\x7fELF" and c.resources.spill_stores == 0


@pytest.mark.parametrize("path", [RING, WS], ids=lambda p: p.stem)
def test_ring_ptx(path: Path) -> None:
    ptx = _ptx(path)
    # mbarrier_init of a ring initializes every stage: 4 full (count 1) + 4 empty (count 2).
    inits = re.findall(r"mbarrier\.init\.shared\.b64\s+\[smem\+(\d+)\]", ptx)
    assert sorted(map(int, inits)) == [131072 + 8 * i for i in range(8)]
    # One arrival per consumer warpgroup on its stage's "empty" barrier.
    assert len(re.findall(r"mbarrier\.arrive\.release\.cta\.shared::cta\.b64 _, \[%rd\d+\];", ptx)) == 1
    # The stage's offset is computed at run time: k * 16384 (A stages) and k * 8 (barriers).
    assert re.search(r"(mul\.wide\.u32\s+%rd\d+, %r\d+, 16384|shl\.b32\s+%r\d+, %r\d+, 14);", ptx)
    assert re.search(r"(mul\.wide\.u32\s+%rd\d+, %r\d+, 8|shl\.b32\s+%r\d+, %r\d+, 3);", ptx)
    # wgmma descriptors are built from that run-time address (>> 4), not from constants.
    # (the start field: the address >> 4, or its 14 bits by bfe)
    assert re.search(r"(shr\.u64\s+%rd\d+, %rd\d+, 4|shr\.u32\s+%r\d+, %r\d+, 4|bfe\.u32\s+%r\d+, %r\d+, 4, 14);", ptx)
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 4
    assert ptx.count("cp.async.bulk.tensor.2d") == 6  # prologue and refill, 3 boxes each
    assert ".maxntid" in ptx and ".minnctapersm 1" in ptx  # ptxas knows the entry budget
    assert local_bytes(ptx) == 128  # the epilogue's edge buffer: 64 bf16 values, 32 b32 words


def test_ws_roles_ptx() -> None:
    ptx = _ptx(WS)
    assert ptx.count("setmaxnreg.dec.sync.aligned.u32 \t40;") == 1
    assert ptx.count("setmaxnreg.inc.sync.aligned.u32 \t232;") == 1
    assert ".maxntid 384" in ptx
    # Only the CTA-wide barrier after the barrier init; roles synchronize through mbarriers.
    assert _syncs(ptx) == ["0"]
    # The single-role ring kernel has no setmaxnreg.
    assert "setmaxnreg" not in _ptx(RING)


def test_ws_role_tests_and_rebased_tid() -> None:
    text = str(kernel_to_llvm(_kernel(WS)))
    # Producer: tid < 128; consumers: tid - 128 < 256, and their ids count from 128.
    assert re.search(r'icmp ult i32 %"tid", 128', text)
    assert re.search(r'%"tid\.consumers" = sub i32 %"tid", 128', text)
    assert re.search(r'icmp ult i32 %"tid\.consumers", 256', text)
    # The consumers' arrival is by their first thread of each warpgroup: (tid - 128) % 128 == 0.
    assert re.search(r'and i32 %"tid\.consumers", 127', text)


@pytest.mark.parametrize("path", [RING, WS], ids=lambda p: p.stem)
def test_ring_assembles_clean(path: Path, ptxas: Path) -> None:
    a = _assembled(path)
    _clean(path, "gemm")
    # 64 f32 accumulator registers per thread, within the entry budget of 256/384 threads.
    assert 64 < a.kernels["gemm"].registers <= entry_registers(_kernel(path).attributes["threads"], 1, SM90)


# --------------------------------------------------------------------------- fixtures


def test_role_reduce_named_barriers() -> None:
    ptx = _ptx(KERNELS / "role_reduce.tkir")
    syncs = _syncs(ptx)
    # Producer (warpgroup 0): one cross-warp round trip = 2 syncs over its 128 threads.
    # Consumers (warpgroups 1-2): row sums (1 warp bit) + conversion + column sums (3 warp
    # bits, still one round trip) = 2 + 2 + 2 syncs over their 256 threads.  Never barrier 0:
    # the other role skips it.
    assert syncs.count("1, 128") == 2 and syncs.count("2, 256") == 6 and len(syncs) == 8
    assert "setmaxnreg.dec.sync.aligned.u32 \t40;" in ptx and "setmaxnreg.inc.sync.aligned.u32 \t232;" in ptx


def test_role_reduce_rebases_warps() -> None:
    text = str(kernel_to_llvm(_kernel(KERNELS / "role_reduce.tkir")))
    # The consumers' layouts and scratch rows see warp (tid - 128) / 32, in [0, 8).
    assert re.search(r'lshr i32 %"tid\.consumers", 5', text)
    assert not re.search(r'lshr i32 %"tid", 5', text.split("role.consumers")[1])


@pytest.mark.parametrize("name", ["role_reduce", "ring_operands", "stage_index", "wgmma_in_flight"])
def test_fixture_assembles_clean(name: str, ptxas: Path) -> None:
    _clean(KERNELS / f"{name}.tkir", name)


def test_ring_operands_ptx() -> None:
    ptx = _ptx(KERNELS / "ring_operands.tkir")
    # smem_store into stage k % 2 (8192-B stride) of A, TMA into the same stage of B.
    assert re.search(r"(shl\.b32\s+%r\d+, %r\d+, 13|mul\.wide\.u32\s+%rd\d+, %r\d+, 8192);", ptx)
    # each thread's 32 bf16 values, 8 consecutive ones a run, as four 16-byte vector stores
    assert ptx.count("st.shared.v4.b32") == 4 and ptx.count("st.shared.b16") == 0
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") == 4


def test_in_flight_accumulator_is_waited_on_the_loop_exit() -> None:
    """A loop yielding a wgmma still in flight: wait_group 1 inside, and wait_group 0 on the
    exit edge before the zero-trip path joins (then the IR's own wait behind the loop)."""
    path = KERNELS / "wgmma_in_flight.tkir"
    ptx = _ptx(path)
    assert ptx.count("wgmma.wait_group.sync.aligned \t1;") == 1
    assert ptx.count("wgmma.wait_group.sync.aligned \t0;") == 2
    fn = kernel_to_llvm(_kernel(path)).get_global("wgmma_in_flight")
    drain = next(blk for blk in fn.blocks if blk.name.startswith("for.drain"))
    calls = [ins.callee.name for ins in drain.instructions
             if isinstance(ins, ir.CallInstr) and isinstance(ins.callee, ir.Function)]
    assert calls == ["llvm.nvvm.wgmma.wait_group.sync.aligned"]
    phis = [ins for blk in fn.blocks for ins in blk.instructions
            if isinstance(ins, ir.PhiInstr) and any(b is drain for _, b in ins.incomings)]
    assert len(phis) == 64 and all({blk.name.split(".")[1] for _, blk in p.incomings} == {"drain", "skip"}
                                   for p in phis)


# --------------------------------------------------------------------------- stage addresses, evaluated

_BASE = 0x400  # where the test places the dynamic shared array (1024-B aligned, not 0)
_BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "shl": lambda a, b: a << b, "lshr": lambda a, b: a >> b, "and": lambda a, b: a & b,
           "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b}


def _eval(v: ir.Value, env: dict) -> int:
    """The integer value of an address/descriptor expression of the lowered kernel, with
    ``env`` giving the kernel arguments and the shared array at ``_BASE``."""
    if v in env:
        return env[v]
    if isinstance(v, ir.Constant):
        return int(v.constant)
    if isinstance(v, ir.GlobalVariable):
        return _BASE
    width = v.type.width if isinstance(v.type, ir.IntType) else 64
    if isinstance(v, ir.GEPInstr):
        return _eval(v.pointer, env) + sum(_eval(i, env) for i in v.indices)
    ops = [_eval(o, env) for o in v.operands]
    if v.opname in ("zext", "trunc", "ptrtoint", "addrspacecast", "sext"):
        return ops[0] & ((1 << width) - 1)
    return _BINARY[v.opname](*ops) & ((1 << width) - 1)


def _calls(fn: ir.Function) -> list[tuple[str, list[ir.Value]]]:
    """(callee name or asm text, arguments) of every call, in order."""
    out = []
    for block in fn.blocks:
        for ins in block.instructions:
            if isinstance(ins, ir.CallInstr):
                callee = ins.callee
                out.append((callee.asm if isinstance(callee, ir.InlineAsm) else callee.name, list(ins.args)))
    return out


@pytest.mark.parametrize("k", [0, 1, 2])
def test_stage_addresses(k: int) -> None:
    """Every op on stage %k of a ring addresses offset + k * stride; wgmma's descriptors are
    SharedLayout.descriptor of that address (docs/hopper.md "Rings and roles")."""
    fn = kernel_to_llvm(_kernel(KERNELS / "stage_index.tkir")).get_global("stage_index")
    env = {fn.args[5]: k}  # b: ptr + 2 sizes + 2 strides, then %k
    a_lay, b_lay = SharedLayout(64, 64, bf16, "k", 128), SharedLayout(64, 64, bf16, "mn", 128)
    a_at, b_at, bar_at = _BASE + 8192 * k, _BASE + 24576 + 8192 * k, _BASE + 49152 + 8 * k
    calls = _calls(fn)
    by = {name: args for name, args in calls}
    assert [_eval(args[0], env) for name, args in calls if name == "llvm.nvvm.mbarrier.init.shared"] == \
        [_BASE + 49152 + 8 * s for s in range(3)]
    assert _eval(by["llvm.nvvm.mbarrier.arrive.expect.tx.scope.cta.space.cta"][0], env) == bar_at
    tma = by["llvm.nvvm.cp.async.bulk.tensor.g2s.tile.2d"]
    assert (_eval(tma[0], env), _eval(tma[1], env)) == (b_at, bar_at)
    assert _eval(by["llvm.nvvm.mbarrier.try.wait.parity.scope.cta.space.cta"][0], env) == bar_at
    arrive = [args for name, args in calls if isinstance(name, str) and "mbarrier.arrive.release" in name]
    assert [_eval(a[0], env) for a in arrive] == [bar_at]
    descs = [(_eval(args[0], env), _eval(args[1], env)) for name, args in calls if "wgmma.mma_async" in name]
    assert descs == [(a_lay.descriptor(a_at, s), b_lay.descriptor(b_at, s)) for s in range(4)]


def test_ring_without_stage_is_an_error() -> None:
    text = (KERNELS / "stage_index.tkir").read_text().replace("%d = hopper.wgmma %a_s,", "%d = hopper.wgmma %sa,")
    with pytest.raises(TkcCodegenError, match="ring of 3 stages"):
        kernel_to_llvm(parse_module(text, "s.tkir").kernel())
