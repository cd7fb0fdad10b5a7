"""Hopper-level IR to PTX: the kernel ABI of docs/hopper.md §4, and every op lowered to PTX
that ptxas -arch=sm_90a accepts without spilling."""

from __future__ import annotations

import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest
from device_checks import CONTRACT_CONSTS, kernel_names, lowered_examples

from tkc.codegen.lower import kernel_to_llvm, kernel_to_ptx
from tkc.codegen.lower_hopper import smem_offset
from tkc.codegen.lower_values import Sym
from tkc.codegen.ptxas import Assembled, assemble
from tkc.dtypes import bf16, f32
from tkc.errors import TkcCodegenError
from tkc.ir.core import Module, Operation
from tkc.ir.layouts import SharedLayout
from tkc.ir.parser import parse_module

ROOT = Path(__file__).resolve().parents[2]
GEMM = ROOT / "tests" / "data" / "hopper" / "gemm.tkir"
KERNELS = Path(__file__).parent / "kernels"


def _kernel(path: Path) -> Operation:
    return parse_module(path.read_text(), str(path)).kernel()


@cache
def _ptx(path: Path) -> str:
    return kernel_to_ptx(_kernel(path))


def _assembled(path: Path) -> Assembled:
    return assemble(_ptx(path), "sm_90a")


_DEPOT = re.compile(r"__local_depot\d+\[(\d+)\]")


def local_bytes(ptx: str) -> int:
    """The local memory a kernel's PTX declares (LLVM's stack objects)."""
    return sum(map(int, _DEPOT.findall(ptx)))


def edge_buffer_bytes(kernel: Operation) -> int:
    """The most local memory a kernel's edge paths take: each global tile access keeps a
    thread's values of its tile in local arrays (one per run length, each at most 4-byte
    aligned), nothing else does."""
    from tkc.codegen.lower_values import bits_type
    from tkc.ir.types import TileType

    total = 0
    for op in kernel.walk():
        t = op.result.type if op.name == "hopper.load" else op.value.type if op.name == "hopper.store" \
            else op.tile_type if op.name == "hopper.async_load" else None
        if isinstance(t, TileType):
            size = int(t.layout.regs) * bits_type(op.tensor.type.dtype).width // 8
            total += size + 6  # padding: before a 4-byte array, and a second run length
    return total


def _no_spills(a: Assembled, name: str, ptx: str, kernel: Operation) -> None:
    usage = a.kernels[name]
    assert usage.spill_stores == 0 and usage.spill_loads == 0, usage
    # The only stack is the edge paths' buffers (LLVM may drop dead ones, ptxas may keep
    # some in registers): ptxas adds none of its own.
    assert usage.stack_frame <= local_bytes(ptx) <= edge_buffer_bytes(kernel), (usage, local_bytes(ptx))
    assert not [w for w in a.warnings if "C75" in w], a.warnings  # e.g. C7517: wgmma serialised


# --------------------------------------------------------------------------- gemm


def test_gemm_ptx_has_the_hopper_pipeline() -> None:
    ptx = _ptx(GEMM)
    # 4 k16 steps of one 64-wide K tile, per warpgroup (each issues its own).
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 4
    # A is one 128x64 box, B two 64x64 boxes (SharedLayout.tma_box).
    assert ptx.count("cp.async.bulk.tensor.2d") == 3
    assert "mbarrier.try_wait.parity" in ptx
    assert re.search(r"wgmma.wait_group.sync.aligned\s+0;", ptx)
    assert ".extern .shared .align 1024 .b8 smem[]" in ptx
    assert local_bytes(ptx) == 128  # the edge path's buffer: 64 bf16 values, 32 b32 words


def test_warpgroups_of_two_slices_alternate_their_accumulators() -> None:
    """BM = 256 on two warpgroups: each issues two m64n128k16 a K step (eight a 64-wide K
    tile), slice 0 and slice 1 in turn, on A descriptors 64 rows (8 KB of a 128-byte
    swizzled tile) apart, and stores its two slices with eight stmatrix each per 32-column
    slice of the epilogue."""
    kernel = _example("gemm.tk", {"BM": 256, "BN": 128, "consumers": 2, "persistent": False}).kernel()
    ptx = kernel_to_ptx(kernel)
    wgmmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16 \{%r(\d+),[^}]*\}, %rd(\d+)",
                        ptx)
    assert len(wgmmas) == 8
    first_regs = [int(r) for r, _ in wgmmas]
    assert len(set(first_regs[0::2])) == 1 and len(set(first_regs[1::2])) == 1 and first_regs[0] != first_regs[1]
    assert ptx.count("stmatrix.sync.aligned.m8n8.x4") == 4 * 2 * 2  # 4 column slices x 2 row slices x 2 instr.


@pytest.mark.parametrize("consts", [{"D": 64}, {"D": 64, "BM": 256, "BN": 64, "consumers": 2}], ids=str)
def test_a_product_from_zeros_starts_with_scale_d_zero(consts: dict) -> None:
    """Attention's S = Q K^T starts from zeros every K/V block: its first K step of each slice
    is issued with scale-d = 0 (D = A B) and no register is zeroed for it; P V, which adds to
    O, keeps scale-d = 1 throughout."""
    ptx = kernel_to_ptx(_example("attn.tk", consts).kernel())
    slices = 2 if consts.get("consumers") else 1
    ss = re.findall(r"wgmma\.mma_async[^{]*\{[^}]*\}, %rd\d+, %rd\d+, ([01]), 1, 1, 0, 0;", ptx)
    assert ss.count("0") == slices and ss.count("1") == (64 // 16 - 1) * slices
    fenced = re.findall(r"wgmma\.fence\.sync\.aligned;(.*?)wgmma\.commit_group", ptx, re.S)
    assert len(fenced) >= 2  # S and P V
    for body in fenced:
        assert "mov.b32" not in body  # no register written among the wgmmas (zeroing S took 64 a block)
    pv = re.findall(r"wgmma\.mma_async[^{]*\{[^}]*\}, \{[^}]*\}, %rd\d+, ([01]), 1, 1, 1;", ptx)
    assert pv and set(pv) == {"1"}


def test_gemm_abi() -> None:
    mod = kernel_to_llvm(_kernel(GEMM))
    text = str(mod)
    fn = mod.get_global("gemm")
    # a, b, c: pointer + 2 sizes + 2 strides each; then the two tensor maps.
    assert [str(t) for t in fn.ftype.args] == ["ptr addrspace(1)", "i32", "i32", "i64", "i64"] * 3 + ["ptr"] * 2
    assert '"nvvm.maxntid"="256"' in text and '"nvvm.minctasm"="1"' in text
    assert text.count('"nvvm.grid_constant"') == 2
    ptx = _ptx(GEMM)
    assert ".maxntid 256" in ptx
    assert len(re.findall(r"\.param \.align 64 \.b8 gemm_param_\d+\[128\]", ptx)) == 2


def test_gemm_assembles_without_spills(ptxas: Path) -> None:
    a = _assembled(GEMM)
    _no_spills(a, "gemm", _ptx(GEMM), _kernel(GEMM))
    # 64 accumulator registers per thread plus addressing.
    assert 64 < a.kernels["gemm"].registers <= 168


# --------------------------------------------------------------------------- errors


def test_kernel_before_allocate_smem_is_rejected() -> None:
    k = _kernel(GEMM)
    del k.attributes["smem_bytes"]
    with pytest.raises(TkcCodegenError, match="smem_bytes"):
        kernel_to_llvm(k)


def test_unplaced_shared_tile_is_an_error_with_its_location() -> None:
    text = GEMM.read_text().replace("hopper.smem_alloc {offset = 0}", "hopper.smem_alloc {offset = -1}")
    with pytest.raises(TkcCodegenError, match="allocate-smem") as e:
        kernel_to_llvm(parse_module(text, "g.tkir").kernel())
    assert e.value.loc is not None and e.value.loc.line == 16


def test_tcgen05_ops_only_on_a_tcgen05_target() -> None:
    from tkc.compiler import compile_kernel

    blackwell = compile_kernel(ROOT / "examples" / "gemm.tk", target="sm_100a", stop="hopper", cache=False)
    with pytest.raises(TkcCodegenError, match="'blackwell.tmem_alloc' is a tcgen05 .* sm_90a has no tensor memory"):
        kernel_to_llvm(blackwell.kernel_op, "sm_90a")


# --------------------------------------------------------------------------- hand-written fixtures

# name -> what its PTX must contain (instruction text -> count), beyond assembling cleanly.
FIXTURES = {
    "attn_fp8": {
        "prmt.b32": 16,  # two 4 x 4 blocks a thread of the 64 x 64 V tile, 8 byte selections each
        "ld.shared.b32": 8,  # four source words a block
        "st.shared.b32": 8,  # four destination words a block
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3": 4,  # S: 2 K steps (SS), P V: 2 (RS)
        "cvt.rn.satfinite.e4m3x2.f32": 16,  # P packed: 2 K steps x 4 registers x 2, no rounding beside
    },
    "masked_store": {
        "st.global.cs.b32": 16,  # a thread's 16 values of the 32x64 tile, one predicated store each
    },
    "gather": {
        "ld.global.v4.b32": 1,  # a thread's 8 bf16 of one picked row at once, on the whole side
    },
    "blocked_reduce": {
        # 16 row slots x 4 lane masks + 4 column slots x 1 + the total x 1.
        "shfl.sync.bfly.b32": 69,
        # warp_xor round trips: 2 bar.sync each (row, column, total).
        "bar.sync": 6,
        # The edge path of its 16 runs of 4 f32: one rolled loop holding a run's 4 element loads.
        "ld.global.b32": 4,
        '.pragma "nounroll"': 1,
    },
    "reduce_group": {
        "shfl.sync.bfly.b32": 69,  # as blocked_reduce's: the group changes only the barriers
    },
    "tma_vectors": {
        "cp.async.bulk.tensor.2d": 5,  # w; x and s in the prologue and the refill (3 boxes a stage)
        "ld.shared": 8,  # each consumer thread's 16 values of s, a load each or two
        "mbarrier.arrive.release.cta.shared::cta.b64": 2,  # x's stage and s's, every thread the latter
    },
    "wgmma_rs": {
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16": 12,
        "cp.async.bulk.tensor.2d": 3,
        "fence.proxy.async.shared::cta": 1,
        "mbarrier.try_wait.parity": 2,
    },
    "tma_store": {
        "stmatrix.sync.aligned.m8n8.x4.shared.b16": 8,  # 128 columns, 16 an instruction
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group": 2,  # two 64-column boxes
        "cp.async.bulk.commit_group": 1,
        "cp.async.bulk.wait_group.read": 2,
        "fence.proxy.async.shared::cta": 1,
    },
    "tma_store_slices": {
        "stmatrix.sync.aligned.m8n8.x4.shared.b16": 16,  # 4 slices of 64 columns, 16 an instruction
        "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group": 4,  # one box a slice
        "cp.async.bulk.commit_group": 4,
        "cp.async.bulk.wait_group.read \t1;": 3,
        "cp.async.bulk.wait_group.read \t0;": 2,
    },
    "gemm_cluster": {  # examples/gemm.tk with BN=128 and cluster=2, after HOPPER_PIPELINE
        ".reqnctapercluster 2, 1, 1": 1,
        "barrier.cluster.arrive.aligned": 2,  # after the barriers' init, before the end
        "barrier.cluster.wait.aligned": 2,
        # B's two boxes a stage, one per rank, in the prologue and the steady loop
        "tile.mbarrier::complete_tx::bytes.multicast::cluster": 4,
        "mapa.shared::cluster.u32": 4,  # two releases (in the loop and after it) to two CTAs
        "mbarrier.arrive.shared::cluster.b64": 4,
    },
    "cluster_reduce": {  # examples/softmax_split.tk with BN=256 (4 CTAs a cluster), after HOPPER_PIPELINE
        ".reqnctapercluster 4, 1, 1": 1,
        # 4 reductions x 4 ranks, one value a thread, each completing its bytes on the rank's barrier
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32": 16,
        "mapa.shared::cluster.u32": 32,  # the slot's and the barrier's address in the rank
        "mbarrier.arrive.expect_tx.shared::cta.b64": 4,  # thread 0 arms each reduction's barrier
        "mbarrier.try_wait.parity": 4,
        "barrier.cluster.wait.aligned": 1,  # only at the start, after the barriers' init
    },
    "prefetch": {
        "cp.async.bulk.prefetch.L2.global": 1,  # thread 0, the box's one row
    },
    "staged_rows": {
        "cp.async.cg.shared.global": 2,  # x's one 16-byte run a thread: before the loop and in it
        "cp.async.ca.shared.global": 2,  # m's 4-byte value, each thread its own copy
        "cp.async.commit_group;": 2,
        "cp.async.wait_group 1;": 2,  # before each read
        "ld.shared.v4.b32": 1,  # x's run read back at once
    },
    "role_sync": {
        "bar.sync \t0;": 1,  # hopper.sync outside the roles: the CTA
        "bar.sync \t2, 256;": 2,  # inside the consumers (first 1, two warpgroups): theirs alone
        "setmaxnreg": 2,
    },
    "turns": {
        "bar.sync": 2,  # the wait (a register id) and the end (3)
        "bar.arrive": 2,  # the pass (a register id) and the start (3)
        "setmaxnreg": 2,
    },
    "scan": {
        # 8 values a thread: lane 16 for the cumsum; lanes 1, 2, 4, 8 for the cumprod.
        "shfl.sync.bfly.b32": 8 + 32,
        "bar.sync": 4,  # two warp steps, a round trip each
        "mul.rn.f32": 1,
    },
    "elementwise": {
        "ex2.approx.ftz.f32": 2,
        "lg2.approx.f32": 2,
        "rsqrt.approx.f32": 1,
        "tanh.approx.f32": 1,
        "cvt.rn.satfinite.e4m3x2.f32": 2,
        "cvt.rzi.s32.f32": 2,
        "max.NaN.f32": 1,
        "min.NaN.f32": 1,
        "st.global.cs.u8": 4,
    },
}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_ptx(name: str) -> None:
    ptx = _ptx(KERNELS / f"{name}.tkir")
    for text, n in FIXTURES[name].items():
        assert ptx.count(text) >= n, f"{text}: {ptx.count(text)} < {n}"
    assert local_bytes(ptx) <= edge_buffer_bytes(_kernel(KERNELS / f"{name}.tkir"))


def test_a_group_of_reductions_meets_twice() -> None:
    """A hopper.reduce_group of two parts meets twice, as one reduction does; the total after
    it, which crosses warps on its own, twice more (blocked_reduce.tkir's three reductions meet
    six times)."""
    assert _ptx(KERNELS / "reduce_group.tkir").count("bar.sync") == 4


def test_rs_wgmma_takes_a_from_registers() -> None:
    ptx = _ptx(KERNELS / "wgmma_rs.tkir")
    rs = re.findall(r"wgmma.mma_async\S+ \{[^}]*\}, \{(%r\d+, ){3}%r\d+\}, %rd\d+", ptx)
    # The P @ V steps (4 k16 steps); the others are SS.  LLVM may unroll the fixture's inner
    # loop (2 trips, constant bounds), which doubles them.
    assert len(rs) in (4, 8)


def test_fixtures_cover_every_hopper_op() -> None:
    from tkc.codegen.lower_hopper import HANDLERS

    used = {op.name for p in KERNELS.glob("*.tkir") for op in _kernel(p).walk()}
    used |= {op.name for op in _kernel(GEMM).walk()}
    assert set(HANDLERS) <= used, set(HANDLERS) - used


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_assembles_without_spills(name: str, ptxas: Path) -> None:
    path = KERNELS / f"{name}.tkir"
    _no_spills(_assembled(path), name, _ptx(path), _kernel(path))


# --------------------------------------------------------------------------- run-time smem offsets


_INT_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
            "shl": lambda a, b: a << b, "lshr": lambda a, b: a >> b, "and": lambda a, b: a & b,
            "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b, "udiv": lambda a, b: a // b,
            "urem": lambda a, b: a % b}


def _evaluate(v, env: dict) -> int:
    """The value of an i32 expression built by Sym, with ``env`` giving its arguments."""
    import llvmlite.ir as ir

    if isinstance(v, int):
        return v
    if isinstance(v, ir.Constant):
        return int(v.constant)
    if v in env:
        return env[v]
    a, b = (_evaluate(o, env) for o in v.operands)
    return _INT_OPS[v.opname](a, b) & 0xFFFFFFFF


@pytest.mark.parametrize("layout", [SharedLayout(8, 64, f32, "k", 0), SharedLayout(64, 64, bf16, "k", 128),
                                    SharedLayout(64, 128, bf16, "mn", 64), SharedLayout(16, 32, f32, "k", 32)],
                         ids=str)
def test_runtime_smem_offset_matches_the_layout(layout: SharedLayout) -> None:
    """smem_offset with a run-time row and/or column computes SharedLayout.offset."""
    import llvmlite.ir as ir

    from tkc.codegen.nvvm import I32

    fn = ir.Function(ir.Module(), ir.FunctionType(I32, [I32, I32]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    r, c = Sym(b, fn.args[0]), Sym(b, fn.args[1])
    both = smem_offset(layout, r, c)
    by_row = {col: smem_offset(layout, r, col) for col in range(layout.cols)}
    for row in range(layout.rows):
        for col in range(layout.cols):
            env = {fn.args[0]: row, fn.args[1]: col}
            want = int(layout.offset(row, col))
            assert _evaluate(both.v, env) == want, (row, col)
            got = by_row[col]
            assert (_evaluate(got.v, env) if isinstance(got, Sym) else got) == want, (row, col)


# --------------------------------------------------------------------------- the examples


EXAMPLES = ROOT / "examples"
EXAMPLE_CASES = [
    ("gemm.tk", {}),
    ("gemm_fp8.tk", {}),
    ("attn.tk", {"D": 64}),
    ("attn.tk", {"D": 128}),
    ("attn.tk", {"D": 64, "causal": True}),
    ("attn.tk", {"D": 128, "causal": True}),
    # Persistent: the epilogue's store addresses stay in the epilogue (not hoisted out of the
    # tile loop, through the K/V loop), and the producer's 24 registers leave the consumers 240.
    ("attn.tk", {"D": 256, "BN": 64, "persistent": True}),
    ("attn.tk", {"D": 128, "persistent": True, "issue_ahead": True, "tma_store": False}),
    # P V of block j - 1 in flight through block j's softmax: P and the rescaled O carried.
    ("attn.tk", {"D": 128, "defer_last": True, "tma_store": False}),
    ("attn.tk", {"D": 128, "defer_last": True, "pingpong": True, "tma_store": False}),
    ("attn.tk", {"D": 64, "BM": 192, "defer_last": True}),
    # Warpgroups of 128 rows: two accumulators a warpgroup (S starts each K/V block from
    # scale-d = 0, so no register is written between the two slices' wgmmas).
    ("gemm.tk", {"BM": 256, "BN": 128, "consumers": 2}),
    ("gemm.tk", {"BM": 192, "BN": 128, "consumers": 1}),
    ("attn.tk", {"D": 64, "BM": 256, "BN": 64, "consumers": 2}),
    ("attn.tk", {"D": 64, "BN": 64, "consumers": 1, "defer_last": True}),
    ("softmax.tk", {}),
    ("layernorm.tk", {}),
    ("rmsnorm.py", {}),
]


#: The hopper passes with the loops pipelined into rings and the warps specialized into a
#: producer and consumer roles (pipeline-loops, specialize-warps).
RINGS_AND_ROLES = "select-layouts,lower-to-hopper,pipeline-loops,specialize-warps,allocate-smem"


def _example(name: str, consts: dict, passes: str | None = None) -> Module:
    from tkc.frontend import compile_file
    from tkc.passes.manager import PassManager
    from tkc.passes.pipeline import DEFAULT_PIPELINE, HOPPER_PIPELINE

    if name.endswith(".py"):
        spec = importlib.util.spec_from_file_location("codegen_" + name[:-3], EXAMPLES / name)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        m = parse_module(getattr(mod, name[:-3]).ir(**consts))
    else:
        m = compile_file(str(EXAMPLES / name), consts)
        PassManager(DEFAULT_PIPELINE).run(m)
    PassManager(HOPPER_PIPELINE if passes is None else passes).run(m)
    return m


@pytest.mark.parametrize("name,consts", EXAMPLE_CASES,
                         ids=[n + "".join(f"-{k}{v}" for k, v in c.items()) for n, c in EXAMPLE_CASES])
def test_example_assembles_without_spills(name: str, consts: dict, ptxas: Path) -> None:
    kernel = _example(name, consts).kernel()
    ptx = kernel_to_ptx(kernel)
    a = assemble(ptx, "sm_90a")
    _no_spills(a, kernel.attributes["sym_name"], ptx, kernel)


@pytest.mark.parametrize("name,consts", EXAMPLE_CASES,
                         ids=[n + "".join(f"-{k}{v}" for k, v in c.items()) for n, c in EXAMPLE_CASES])
def test_example_with_rings_and_roles_assembles_clean(name: str, consts: dict, ptxas: Path) -> None:
    """Every example through pipeline-loops and specialize-warps: no spills and no ptxas
    remark (setmaxnreg honoured, no C7508/C7507; no wgmma serialized)."""
    kernel = _example(name, consts, RINGS_AND_ROLES).kernel()
    ptx = kernel_to_ptx(kernel)
    a = assemble(ptx, "sm_90a")
    _no_spills(a, kernel.attributes["sym_name"], ptx, kernel)
    assert a.warnings == (), a.warnings
    for role in (op for op in kernel.walk() if op.name == "hopper.role"):
        regs = role.attributes["regs"]
        assert re.search(rf"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+{regs};", ptx), regs


@pytest.mark.parametrize("causal", [False, True])
def test_attention_scores_cost_one_fma_and_one_exp2_each(causal: bool) -> None:
    """A consumer thread holds 64 scores of a 128 x 128 block: ``s * scale - m`` contracts to
    one fma each, and P goes to the P @ V operand as 32 ``cvt.rn.bf16x2.f32`` (no per-half
    shifts and ors)."""
    ptx = kernel_to_ptx(_example("attn.tk", {"causal": causal}).kernel())
    assert ptx.count("fma.rn.f32") >= 64
    assert ptx.count("ex2.approx.ftz.f32") <= 66  # 64 scores and the row's alpha
    assert ptx.count("cvt.rn.bf16x2.f32") >= 32 and "cvt.u32.u16" not in ptx


def test_a_loop_carried_bf16_tile_crosses_the_back_edge_packed() -> None:
    """defer_last carries P (64 bf16 values a thread at D=64) from one iteration to the next:
    it crosses the back edge as 32 packed b32s (one ``cvt.rn.bf16x2.f32`` a pair, from the
    unrounded scores) and reaches the P @ V operand without converting again, where its f32
    register form would cost a rounding and a widening per value."""
    ptx = kernel_to_ptx(_example("attn.tk", {"D": 64, "defer_last": True}).kernel())
    assert "cvt.rn.bf16.f32" not in ptx and "cvt.f32.bf16" not in ptx
    # P of the first block and of each later one (32 pairs each), O's 32 values stored (16).
    assert ptx.count("cvt.rn.bf16x2.f32") == 32 + 32 + 16


def test_turns_are_named_barriers_three_and_four() -> None:
    """hopper.turn: bar.sync on 3 + g, bar.arrive on 4 - g (256 threads), g the consumer
    warpgroup; the first pass and the last wait only in one warpgroup.  (A TMA-store
    epilogue would add the consumers' own barrier, 2: stored thread by thread here.)"""
    ptx = kernel_to_ptx(_example("attn.tk", {"pingpong": True, "tma_store": False}).kernel())
    syncs = re.findall(r"bar\.sync\s+(%r\d+|\d+), 256;", ptx)
    arrives = re.findall(r"bar\.arrive\s+(%r\d+|\d+), 256;", ptx)
    assert sorted(s for s in syncs if not s.startswith("%")) == ["3"]  # the end, warpgroup 0
    assert sorted(a for a in arrives if not a.startswith("%")) == ["3"]  # the start, warpgroup 1
    assert sum(s.startswith("%") for s in syncs) == 2 and sum(a.startswith("%") for a in arrives) == 2


def test_wait_timeout_pin_makes_every_wait_name_itself_and_trap() -> None:
    """``wait_timeout_ms``: each mbarrier wait reads the global timer, and past the limit prints
    (lane 0 of each warp) a line naming the wait's source position, then traps; without the
    pin the waits are the bare spin."""
    module = _example("attn.tk", {"D": 64, "wait_timeout_ms": 250})
    ptx = kernel_to_ptx(module.kernel())
    waits = ptx.count("mbarrier.try_wait.parity")
    assert waits and ptx.count("call.uni (retval0), vprintf") == waits and ptx.count("trap;") == waits
    assert "%globaltimer" in ptx
    text = bytes(int(x) for x in re.findall(r"\.b8 printf_\$_format\[\d+\] = \{([\d, ]+)\}", ptx)[0].split(", "))
    assert re.match(rb"tkc: .*attn\.tk:\d+:\d+: mbarrier wait timed out after 250 ms \(wait_timeout_ms\): CTA "
                    rb"\(%d, %d, %d\) thread %d waits for parity %d of the barrier at shared address %u\n\0?$",
                    text), text
    plain = kernel_to_ptx(_example("attn.tk", {"D": 64}).kernel())
    assert "vprintf" not in plain and "trap;" not in plain and "%globaltimer" not in plain


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example_kernels(path: Path) -> list[str | None]:
    names = kernel_names(path)
    return names if len(names) > 1 else [None]


#: Examples assembled at their defaults by tests/examples/test_tk_kernels.py (its norm cases' full size).
ASSEMBLED_BY_TK_KERNELS = ("layernorm_residual.tk", "layernorm_residual_bwd.tk")


@pytest.mark.parametrize("example, kernel", [
    pytest.param(p.name, k, marks=() if p.name in CONTRACT_CONSTS and p.name not in ASSEMBLED_BY_TK_KERNELS
                 else pytest.mark.slow)
    for p in lowered_examples(EXAMPLES, (".tk",)) for k in _example_kernels(p)])
def test_every_example_assembles_without_spills(example: str, kernel: str | None, ptxas: Path) -> None:
    """What the README promises of the examples as written (their default constants), every
    kernel of a file.  An example that tests/test_contract.py compiles at its defaults (one not
    in CONTRACT_CONSTS), or test_tk_kernels.py, is checked there by default, here with --slow."""
    from tkc.compiler import compile_kernel

    usage = compile_kernel(EXAMPLES / example, {}, cache=False, kernel=kernel).resources
    assert usage.spill_stores == 0 and usage.spill_loads == 0, usage


@pytest.mark.parametrize("example, kernel", [("attn_train.tk", "attn_bwd"), ("fftconv.tk", "fft_rows"),
                                             ("based.tk", "based")])
def test_stored_values_sharing_an_address_step_agree_with_smem_offset(example: str, kernel: str | None) -> None:
    """``_offset_steps``: a value stored at another's address with bits flipped and a constant
    added must land where the per-value addressing (``smem_offset``, what the store computed
    before) puts it, in every thread, for every register store of a real kernel (swizzled f32
    and bf16 tiles, transposed accumulators); attention backward's staged dQ^T from one address."""
    import numpy as np

    from tkc.codegen.lower_hopper import _offset_steps, _tile_coords, smem_offset
    from tkc.compiler import compile_kernel

    c = compile_kernel(EXAMPLES / example, {}, kernel=kernel, stop="hopper", cache=False)
    stores = [op for op in c.kernel_op.walk() if op.name == "hopper.smem_store" and "col" not in op.attributes]
    assert stores
    for op in stores:
        lay, dst = op.value.type.layout, op.dst.type
        steps = _offset_steps(lay, dst.layout, dst, list(range(lay.regs)), 0)
        assert steps is not None
        threads = np.arange(lay.threads)
        tc = [np.asarray(x) for x in lay.thread_coords(threads)]

        def where(k: int, lay=lay, dst=dst, tc=tc) -> np.ndarray:
            rc = lay.reg_coords(k)
            r, c_ = _tile_coords(dst, dst.layout, (tc[0] + int(rc[0]), tc[1] + int(rc[1])))
            return np.array([smem_offset(dst.layout, int(a), int(b)) for a, b in zip(r, c_)])

        for k, (base, xor, delta) in enumerate(steps):
            assert np.array_equal(where(k), (where(base) ^ xor) + delta), (op.value.type, dst, k, base, xor, delta)
        if kernel == "attn_bwd" and dst.dtype.bits == 32:
            assert len({base for base, _, _ in steps}) == 1
