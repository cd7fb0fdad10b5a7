"""sm_100a (tcgen05) end to end: the blackwell dialect's descriptors and checks, GEMM through
the same passes with lower-to-blackwell, the emulator against the interpreter on shapes with
tails, the broken tensor-memory protocols as emulator errors, ptxas -arch=sm_100a acceptance
without spills, and the runtime refusing an sm_100a kernel on a Hopper GPU."""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np
import pytest

from tkc import dtypes
from device_checks import needs_blackwell, needs_ptxas
from tkc.compiler import compile_kernel
from tkc.emulator import emulate
from tkc.frontend import compile_file, compile_source
from tkc.errors import TkcEmulatorError, TkcError, TkcLaunchError, TkcUnsupportedError, TkcVerifyError
from tkc.interpreter import random_args
from tkc.ir.dialects import blackwell
from tkc.ir.layouts import SharedLayout, TmemAccumulator
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify
from tkc.runner import run

ROOT = Path(__file__).resolve().parents[2]
GEMM = ROOT / "examples" / "gemm.tk"
SM100 = "sm_100a"
#: The one-accumulator structure (the epilogue's warpgroups issue the MMAs): what the tests of
#: the tensor-memory protocol edit; the overlap-epilogue structure has its own tests.
ONE_ACC = {"overlap_epilogue": False}


def lowered(consts: dict | None = None, path: Path = GEMM) -> str:
    """The gemm's sm_100a IR after every pass (allocate-smem included), as text."""
    c = compile_kernel(path, consts or {}, target=SM100, stop="hopper", cache=False)
    return c.asm["hopper"]


def tile_kernel(consts: dict | None = None, path: Path = GEMM):
    return compile_kernel(path, consts or {}, stop="tkir", cache=False).kernel_op


def edit(text: str, old: str, new: str, count: int = 1) -> str:
    assert text.count(old) >= count, f"{old!r} not in the IR"
    return text.replace(old, new, count)


def emulate_text(text: str, dims: dict[str, int], seed: int = 0) -> list:
    module = parse_module(text, "gemm.sm100.tkir")
    verify(module)
    kernel = module.kernel()
    args = random_args(kernel, dims, seed)
    emulate(kernel, args, seed=seed)
    return args


def broken_ir(consts: dict, change) -> str:
    """The gemm's sm_100a IR with ``consts``, changed by ``change`` (which must change it)."""
    text = lowered(consts)
    broken = change(text)
    assert broken != text
    return broken


def emulator_errors(text: str, dims: dict[str, int], seeds=range(4)) -> list[str]:
    """The emulator's errors on ``text`` over several schedules (seeds); a race shows on some."""
    errors = []
    for seed in seeds:
        try:
            emulate_text(text, dims, seed)
        except TkcEmulatorError as e:
            errors.append(str(e))
    return errors


# ---------------------------------------------------------------- the dialect
def test_descriptors_are_ptx_facts_section_7() -> None:
    """bf16 x bf16 -> f32, M = N = 128, both K-major: 0x08200490; the 128B-swizzled K-major
    shared descriptor is Hopper's with bit 46 set (tcgen05_min.ptx's 0x4000404000010000)."""
    k_major = SharedLayout(128, 64, dtypes.bf16, "k", 128)
    assert blackwell.instr_descriptor(k_major, k_major, 128, 128) == 0x08200490
    assert blackwell.smem_descriptor(k_major, 0) == 0x4000404000010000
    assert blackwell.smem_descriptor(k_major, 0, 1) == 0x4000404000010002  # a K step: 32 B further
    mn = SharedLayout(64, 256, dtypes.bf16, "mn", 128)  # gemm.tk's B: K x N, N contiguous
    assert blackwell.instr_descriptor(k_major, mn, 128, 256) == 0x08200490 - (16 << 17) + (32 << 17) + (1 << 16)
    fp8 = SharedLayout(128, 128, dtypes.f8e4m3, "k", 128)
    assert blackwell.mma_kind(fp8.dtype, fp8.dtype) == "f8f6f4"
    assert blackwell.instr_descriptor(fp8, fp8, 128, 128) == 0x08200010
    assert blackwell.tmem_columns(8) == 32 and blackwell.tmem_columns(256) == 256 and blackwell.tmem_columns(96) == 128


def test_tmem_accumulator_layout() -> None:
    lay = TmemAccumulator(256, 2)
    rows, cols = lay.coords(np.arange(256)[:, None], np.arange(128)[None, :])
    assert (rows[:, 0] == np.arange(256) % 128).all()  # thread t of a warpgroup: lane t
    assert (cols[:128] == np.arange(128)).all() and (cols[128:] == 128 + np.arange(128)).all()
    assert str(lay) == "#tmem_acc<256, wg=2>"


def test_ir_round_trips_and_is_verified() -> None:
    text = lowered(ONE_ACC)
    assert print_module(parse_module(text, "g.tkir")) == text
    for op in ("blackwell.tmem_alloc {cols = 256}", "blackwell.mma", "blackwell.commit", "blackwell.tmem_load",
               "blackwell.tmem_dealloc", "#tmem_acc<256, wg=2>"):
        assert op in text
    assert "hopper.wgmma" not in text
    # The empty ring completes on one tcgen05.commit a stage, the accumulator on one a tile.
    assert re.search(r"hopper.mbarrier_init %empty \{count = 1\}", text)
    assert re.search(r"hopper.mbarrier_init %acc_full \{count = 1\}", text)
    with pytest.raises(TkcVerifyError, match="power of two in \\[32, 512\\]"):
        verify(parse_module(edit(text, "tmem_alloc {cols = 256}", "tmem_alloc {cols = 96}"), "g.tkir"))
    with pytest.raises(TkcVerifyError, match="frees 128 columns of an allocation of 256"):
        verify(parse_module(edit(text, "tmem_dealloc %tmem {cols = 256}", "tmem_dealloc %tmem {cols = 128}"),
                            "g.tkir"))


def test_products_the_lowering_does_not_take_are_located_errors() -> None:
    with pytest.raises(TkcUnsupportedError, match="tcgen05.mma here computes 128 or 64 rows") as e:
        compile_kernel(GEMM, {"BM": 32}, target=SM100, stop="hopper", cache=False)
    assert e.value.loc is not None and e.value.loc.line == 10


def test_a_k_loop_without_a_ring_sums_in_tensor_memory() -> None:
    # stages = 1: each product is waited for at once, its sum kept in tensor memory as
    # attention backward's dV (refused before, when the persistent tile loop was around it)
    kernel = tile_kernel({"stages": 1})
    args = random_args(kernel, {"M": 700, "N": 520, "K": 200}, 0)
    result = run(kernel, args, "emulate", check=True, target=SM100)
    assert result.ok, result.checked


@pytest.mark.parametrize("operands", [
    "load(a[pm*BM:(pm+1)*BM, :], other=1.0) @ load(b[:, pn*BN:(pn+1)*BN], other=1.0)",  # no TMA: other=
    "(a[pm*BM:(pm+1)*BM, :] * 2.0) @ maximum(b[:, pn*BN:(pn+1)*BN], 0.0)",             # both computed
])
def test_a_product_of_operands_no_copy_brings(tmp_path: Path, operands: str) -> None:
    # No TMA ring, so no mbarrier the commit's could join: it gets its own (refused before with
    # "no mbarriers are initialized before the roles")
    src = tmp_path / "k.tk"
    src.write_text("@kernel\n"
                   "def k(a: bf16[M, 64], b: bf16[64, N], c: f32[M, N], BM: const = 128, BN: const = 64):\n"
                   "    grid(cdiv(M, BM), cdiv(N, BN))\n"
                   "    pm = program_id(0)\n"
                   "    pn = program_id(1)\n"
                   f"    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = {operands}\n")
    kernel = compile_file(src).kernel("k")
    result = run(kernel, random_args(kernel, {"M": 200, "N": 100}, 1), "emulate", check=True, target=SM100)
    assert result.ok, result.checked


@needs_ptxas
def test_an_epilogue_that_spills_is_read_on_more_warpgroups(tmp_path: Path) -> None:
    # One 128-column product is read by one warpgroup (128 columns a thread); a column softmax
    # beside it spilled 348 B on sm_100a (none on sm_90a).  Where ptxas spills, tkc compiles it
    # again on more epilogue warpgroups and says so.
    src = tmp_path / "colsoftmax.tk"
    src.write_text("@kernel\n"
                   "def k(a: bf16[128, 64], b: bf16[64, N], o: bf16[128, N], BN: const = 128):\n"
                   "    grid(cdiv(N, BN))\n"
                   "    pn = program_id(0)\n"
                   "    s = a[:, :] @ b[:, pn*BN:(pn+1)*BN]\n"
                   "    p = exp(s - s.max(0)[None, :])\n"
                   "    o[:, pn*BN:(pn+1)*BN] = (p / p.sum(0)[None, :]).to(bf16)\n")
    c = compile_kernel(src, target=SM100, stop="cubin", cache=False, ptxas=True)
    assert c.resources.spill_stores == 0, c.resources
    assert any("read on 2 epilogue warpgroups instead, where it does not (-D consumers=N chooses)" in r
               for r in c.remarks), c.remarks
    pinned = compile_kernel(src, {"consumers": 1}, target=SM100, stop="cubin", cache=False, ptxas=True)
    assert pinned.resources.spill_stores > 0  # what the default was (a pin is kept as it is)
    kernel = compile_file(src).kernel("k")
    result = run(kernel, random_args(kernel, {"N": 200}, 2), "emulate", check=True, target=SM100)
    assert result.ok, result.checked


@pytest.mark.parametrize("name", ["acc_from_bias", "nested_k_loop", "two_k_loops_one_acc"])
@pytest.mark.parametrize("consts", [{}, {"persistent": True}], ids=["", "persistent"])
def test_a_sum_that_does_not_start_at_zero_before_its_loop(name: str, consts: dict) -> None:
    # The sum starts at zero in tensor memory and its start (a bias row, the sum of a loop
    # before, an outer K loop's) is added where it is read behind the loop; refused before
    kernel = compile_file(Path(__file__).parent / "kernels" / f"{name}.tk", consts).kernel("k")
    args = random_args(kernel, {"M": 200, "N": 136, "K": 200}, 1)
    result = run(kernel, args, "emulate", check=True, target=SM100)
    assert result.ok, result.checked


# ---------------------------------------------------------------- the emulator
@pytest.mark.parametrize(("consts", "dims", "seed"), [
    ({}, {"M": 192, "N": 384, "K": 96}, 0),            # two tiles, N tail, K tail
    ({}, {"M": 300, "N": 200, "K": 136}, 3),           # tails everywhere
    ({"BN": 128}, {"M": 130, "N": 136, "K": 264}, 1),  # one epilogue warpgroup, five K steps
    ({"BN": 64, "BK": 32}, {"M": 257, "N": 72, "K": 520}, 2),
])
def test_gemm_emulated_agrees_with_the_interpreter(consts: dict, dims: dict, seed: int) -> None:
    kernel = tile_kernel(consts)
    args = random_args(kernel, dims, seed)
    result = run(kernel, args, "emulate", check=True, seed=seed, target=SM100)
    assert result.backend == "emulate" and result.ok, result.checked


@pytest.mark.parametrize(("example", "dims", "seed"), [
    ("gemm_fp8.tk", {"M": 200, "N": 136, "K": 272}, 0),  # kind::f8f6f4, B read K-major through .T
    ("splitk_gemm.tk", {"M": 130, "N": 136, "K": 96}, 1),  # splits whose K range is empty: zeros
])
def test_other_gemms_emulated_agree_with_the_interpreter(example: str, dims: dict, seed: int) -> None:
    kernel = tile_kernel(path=ROOT / "examples" / example)
    args = random_args(kernel, dims, seed)
    result = run(kernel, args, "emulate", check=True, seed=seed, target=SM100)
    assert result.ok, result.checked


# Several products accumulated in one K loop: SwiGLU's gate and up (one A tile, two B rings),
# RoPE's two halves of a head.  Tails in M, N and K; the persistent tile loop of SwiGLU too.
@pytest.mark.parametrize(("example", "consts", "dims", "seed"), [
    ("gemm_swiglu.tk", {}, {"M": 300, "N": 200, "K": 136}, 0),
    ("gemm_swiglu.tk", {"BN": 64, "BK": 32}, {"M": 130, "N": 72, "K": 200}, 1),
    ("gemm_rope.tk", {}, {"M": 200, "N": 256, "K": 136, "D2": 64}, 2),
    ("gemm_rope.tk", {"D": 64}, {"M": 130, "N": 128, "K": 72, "D2": 32}, 3),
], ids=str)
def test_several_products_of_a_loop_emulated_agree_with_the_interpreter(example, consts, dims, seed) -> None:
    kernel = tile_kernel(consts, ROOT / "examples" / example)
    args = random_args(kernel, dims, seed)
    result = run(kernel, args, "emulate", check=True, seed=seed, target=SM100)
    assert result.ok, result.checked


def test_several_products_issue_in_order_and_commit_each_ring() -> None:
    """SwiGLU's loop: two MMAs into their own columns from one thread, each after its B's
    copy, then a commit onto each ring's empty stage (no thread arrives there any more), one
    commit behind the loop, and each accumulator read where the epilogue first needs it."""
    text = lowered(ONE_ACC, path=ROOT / "examples" / "gemm_swiglu.tk")
    loop = text[text.index("blackwell.mma"):text.index("blackwell.commit %acc_full")]
    assert loop.count("blackwell.mma") == 2 and loop.count("blackwell.commit") == 2
    assert "hopper.mbarrier_arrive" not in loop and "wgmma" not in text
    assert "blackwell.tmem_alloc {cols = 256}" in text
    epilogue = text[text.index("blackwell.commit %acc_full"):]
    gate, up = epilogue.index("%gate = blackwell.tmem_load"), epilogue.index("%up = blackwell.tmem_load")
    assert gate < epilogue.index("tile.exp") < up  # up is loaded after the gate's sigmoid


def test_a_ring_stage_left_uncommitted_deadlocks() -> None:
    """Without the commit that releases the up ring's stage, the producer waits forever."""
    text = lowered(ONE_ACC, path=ROOT / "examples" / "gemm_swiglu.tk")
    broken = re.sub(r"(= hopper.stage %empty_1, [^\n]*)\n *blackwell.commit %\w+[^\n]*", r"\1", text, count=1)
    assert broken != text
    with pytest.raises(TkcEmulatorError, match="deadlock|never"):
        emulate_text(broken, {"M": 130, "N": 136, "K": 520})


def test_emulated_gemm_matches_numpy() -> None:
    """Not only the interpreter: the product itself, with its bf16 output rounding."""
    args = emulate_text(lowered(ONE_ACC), {"M": 130, "N": 264, "K": 72}, seed=5)
    a, b, c = (np.asarray(x, np.float64) for x in args)  # bf16 values in float32 storage
    want = dtypes.round_to(a.astype(np.float64) @ b.astype(np.float64), dtypes.bf16)
    np.testing.assert_allclose(c, want, rtol=2 ** -7, atol=1e-2)


def _epilogue_wait(text: str) -> str:
    """The role's wait for the accumulator's commit behind the K loop."""
    m = re.search(r"\n *hopper.mbarrier_wait %acc_full, %\w+[^\n]*", text)
    assert m, "the epilogue's wait"
    return m.group(0)


DIMS = {"M": 130, "N": 264, "K": 72}


def test_reading_tensor_memory_before_the_commits_barrier() -> None:
    text = lowered(ONE_ACC)
    broken = edit(text, _epilogue_wait(text), "")
    with pytest.raises(TkcEmulatorError, match="reads tensor memory before waiting for a commit of the MMAs"):
        emulate_text(broken, DIMS)


ALLOC = "%tmem = blackwell.tmem_alloc {cols = 256} : i32"


def test_a_second_allocation() -> None:
    broken = edit(lowered(ONE_ACC), ALLOC, ALLOC + "\n    %tmem2 = blackwell.tmem_alloc {cols = 32} : i32")
    with pytest.raises(TkcEmulatorError, match="double alloc"):
        emulate_text(broken, DIMS)


def test_a_column_budget_overrun() -> None:
    broken = edit(lowered(ONE_ACC), ALLOC, ALLOC + "\n    %tmem2 = blackwell.tmem_alloc {cols = 512} : i32")
    with pytest.raises(TkcEmulatorError, match="column budget overrun"):
        emulate_text(broken, DIMS)


def test_a_missing_dealloc() -> None:
    text = lowered(ONE_ACC)
    broken = re.sub(r"\n *blackwell.tmem_dealloc %tmem \{cols = 256\}[^\n]*", "", text)
    with pytest.raises(TkcEmulatorError, match="still allocated when the CTA exits"):
        emulate_text(broken, DIMS)


def test_a_warp_reading_outside_its_lane_quarter(monkeypatch: pytest.MonkeyPatch) -> None:
    text = lowered(ONE_ACC)
    # A layout whose warps are one quarter off: warp w would read lanes 32 (w + 1) on.
    from tkc.emulator import machine

    monkeypatch.setattr(TmemAccumulator, "thread_coords",
                        lambda self, t: ((t + 32) % 128, t // 128 * self.regs))
    machine._coords.cache_clear()  # coordinates of layouts seen before the patch
    try:
        with pytest.raises(TkcEmulatorError, match="a warp reaches only lanes 0 to 31"):
            emulate_text(text, DIMS)
    finally:
        machine._coords.cache_clear()


def test_accumulating_onto_unwritten_tensor_memory() -> None:
    """The first MMA of a tile must overwrite: accumulating from the start reads garbage."""
    text = lowered(ONE_ACC)
    broken = re.sub(r"(%\d+) = tile.cmp (%k_1), (%\d+) \{pred = \"ne\"\} : i1",
                    r'\1 = tile.cmp \2, \3 {pred = "ge"} : i1', text, count=1)
    assert broken != text
    with pytest.raises(TkcEmulatorError, match="accumulates onto tensor memory no MMA has written"):
        emulate_text(broken, DIMS)


# ---------------------------------------------------------------- ptxas
@needs_ptxas
@pytest.mark.parametrize(("example", "consts", "kind"), [
    ("gemm.tk", {}, "f16"), ("gemm.tk", {"BN": 128}, "f16"), ("gemm.tk", {"BN": 64, "BK": 32}, "f16"),
    ("gemm_fp8.tk", {}, "f8f6f4"), ("splitk_gemm.tk", {}, "f16"), ("gemm_swiglu.tk", {}, "f16"),
    ("gemm_rope.tk", {}, "f16"), ("gemm_rope.tk", {"D": 64}, "f16")], ids=str)
def test_ptxas_sm_100a_accepts_without_spills(example: str, consts: dict, kind: str) -> None:
    c = compile_kernel(ROOT / "examples" / example, consts, target=SM100, stop="cubin", cache=False, ptxas=True)
    ptx = c.asm["ptx"]
    assert ".target sm_100a" in ptx and "wgmma" not in ptx
    for instr in ("tcgen05.alloc.cta_group::1", f"tcgen05.mma.cta_group::1.kind::{kind}", "tcgen05.commit.cta_group::1",
                  "tcgen05.ld.sync.aligned.32x32b", "tcgen05.wait::ld", "tcgen05.dealloc.cta_group::1"):
        assert instr in ptx, instr
    r = c.resources
    assert r is not None and r.spill_stores == 0 and r.spill_loads == 0
    # RoPE's cos and sin rows go through a local array on Hopper as well (a stack frame, no spill).
    assert r.stack_frame == 0 or example == "gemm_rope.tk"


# ---------------------------------------------------------------- the runtime
def test_an_sm_100a_kernel_is_refused_on_a_hopper_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from tkc.runtime import driver, launch

    c = compile_kernel(GEMM, target=SM100, stop="ptx", cache=False, ptxas=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")

    def no_driver(*_: object, **__: object) -> None:
        raise AssertionError("the driver was reached")

    monkeypatch.setattr(driver, "_lib", types.SimpleNamespace(__getattr__=no_driver))
    monkeypatch.setattr(launch, "_function", no_driver)
    a = torch.zeros(256, 64, dtype=torch.bfloat16)
    b = torch.zeros(64, 256, dtype=torch.bfloat16)
    out = torch.zeros(256, 256, dtype=torch.bfloat16)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)))
    with pytest.raises(TkcLaunchError, match=r"compiled for sm_100a \(compute capability 10.0\) but .* is 9.0"):
        launch.launch(c, [a, b, out])


def test_the_lowering_never_runs_for_sm_90a() -> None:
    text = compile_kernel(GEMM, stop="hopper", cache=False).asm["hopper"]
    assert "blackwell." not in text and "hopper.wgmma" in text


# ---------------------------------------------------------------- a Blackwell GPU (none here yet)
@pytest.mark.gpu
@needs_blackwell
@pytest.mark.parametrize(("example", "dims"), [
    ("gemm.tk", {"M": 1000, "N": 776, "K": 520}), ("gemm_fp8.tk", {"M": 1000, "N": 776, "K": 528}),
    ("splitk_gemm.tk", {"M": 300, "N": 264, "K": 1032}), ("gemm_swiglu.tk", {"M": 1000, "N": 776, "K": 520}),
    ("gemm_rope.tk", {"M": 1000, "N": 512, "K": 520, "D2": 64})])
def test_gemm_on_a_blackwell_gpu(example: str, dims: dict) -> None:
    kernel = tile_kernel(path=ROOT / "examples" / example)
    args = random_args(kernel, dims, 0)
    result = run(kernel, args, "gpu", check=True, target=SM100)
    assert result.ok, result.checked


@needs_ptxas
@pytest.mark.parametrize("example", ["softmax.tk", "layernorm.tk", "cross_entropy.tk"])
def test_examples_without_products_compile_for_sm_100a(example: str) -> None:
    c = compile_kernel(ROOT / "examples" / example, target=SM100, stop="cubin", cache=False, ptxas=True)
    assert ".target sm_100a" in c.asm["ptx"] and c.resources.spill_stores == 0


# Products outside any loop, in the kernel's own block (one warpgroup, no roles): the columns'
# allocation and the barrier are inserted at the top of that block, which left the MMA behind
# its commit, wait and load.
AT_TOP = """@kernel
def mm(a: bf16[M, K], b: bf16[K, N], c: f32[M, N], d: bf16[M, N]):
    grid(cdiv(M, 128))
    r = program_id(0) * 128
    c[r:r+128, 0:128] = a[r:r+128, 0:64] @ b[0:64, 0:128]
    acc = zeros([128, 64], f32)
    acc += a[r:r+128, 0:32] @ b[0:32, 0:64]
    d[r:r+128, 0:64] = acc.to(bf16)
"""


@pytest.mark.parametrize("seed", [0, 1])
def test_products_outside_a_loop_issue_before_their_load(seed: int) -> None:
    kernel = compile_kernel(AT_TOP, {}, stop="tkir", cache=False).kernel_op
    ops = [op.name for op in compile_kernel(AT_TOP, {}, stop="hopper", cache=False, target=SM100).kernel_op.walk()]
    assert ops.index("blackwell.mma") < ops.index("blackwell.commit") < ops.index("blackwell.tmem_load")
    args = random_args(kernel, {"M": 200, "N": 128, "K": 64}, seed)
    result = run(kernel, args, "emulate", check=True, seed=seed, target=SM100)
    assert result.ok, result.checked


# Sums 256 and 16 wide: 3 or 4 epilogue warpgroups cannot each read whole 8-column groups of
# the 16-wide one; 2 can (the count went up to 4 and stopped there, refused).
WIDE_AND_NARROW = """@kernel
def k(xb: bf16[M, N], wb: bf16[N, N], o: f32[G, 128, 256], o1: f32[G, 128, 16]):
    grid(cdiv(M, 128))
    p = program_id(0)
    r = p * 128
    acc0 = zeros([128, 256], f32)
    for kk in range(cdiv(N, 32)):
        acc0 += xb[r:r+128, kk*32:(kk+1)*32] @ wb[kk*32:(kk+1)*32, 0:256]
    acc1 = zeros([128, 16], f32)
    for kk in range(cdiv(N, 32)):
        acc1 += xb[r:r+128, kk*32:(kk+1)*32] @ wb[kk*32:(kk+1)*32, 0:16]
    o[p, :, :] = acc0
    o1[p, :, :] = acc1
"""


def test_epilogue_warpgroups_that_split_every_width_are_found_below_the_columns_count() -> None:
    kernel = compile_kernel(WIDE_AND_NARROW, {}, stop="tkir", cache=False).kernel_op
    hopper = compile_kernel(WIDE_AND_NARROW, {}, stop="hopper", cache=False, target=SM100).kernel_op
    assert any(isinstance(op.result.type.layout, TmemAccumulator) and op.result.type.layout.warpgroups == 2
               for op in hopper.walk() if op.results and getattr(op.result.type, "layout", None) is not None
               and isinstance(op.result.type.layout, TmemAccumulator))
    args = random_args(kernel, {"M": 256, "N": 256, "G": 2}, 0)
    result = run(kernel, args, "emulate", check=True, target=SM100)
    assert result.ok, result.checked


@pytest.mark.parametrize("n", [0, 1, 3])
def test_an_accumulator_carried_into_its_k_loop_adds_its_start(n: int) -> None:
    src = """@kernel
def s(a: bf16[M, K], b: bf16[K, N], c: f32[M, N], n: i32):
    grid(cdiv(M, 128))
    r = program_id(0) * 128
    acc = zeros([128, 64], f32)
    for i in range(n):
        for k in range(cdiv(K, 64)):
            acc += a[r:r+128, k*64:(k+1)*64] @ b[k*64:(k+1)*64, 0:64]
    c[r:r+128, 0:64] = acc
"""
    # (refused before: only a sum zero right before its loop stayed in tensor memory; now each
    # run of the K loop sums from zero there and adds the outer loop's sum as it is read)
    kernel = compile_source(src, "s.tk", {}).kernel("s")
    args = random_args(kernel, {"M": 200, "N": 64, "K": 136}, n)
    args[-1] = np.int32(n)
    result = run(kernel, args, "emulate", check=True, target=SM100)
    assert result.ok, result.checked


# ---------------------------------------------------------------- clusters: B copied once a cluster
@pytest.mark.parametrize(("cluster", "dims", "seed"), [
    (2, {"M": 700, "N": 600, "K": 200}, 0),
    (4, {"M": 1100, "N": 600, "K": 200}, 1),
])
def test_a_cluster_shares_b_and_each_commit_frees_the_stage_in_every_cta(cluster: int, dims: dict, seed: int) -> None:
    kernel = tile_kernel({"cluster": cluster})
    result = run(kernel, random_args(kernel, dims, seed), "emulate", check=True, seed=seed, target=SM100)
    assert result.ok, result.checked
    text = lowered({"cluster": cluster})
    assert "multicast = " in text and re.search(r"blackwell.commit %\w+ \{cluster = true\}", text)
    # the empty ring's stages complete on one commit from each CTA of the cluster
    assert re.search(rf"hopper.mbarrier_init %empty \{{count = {cluster}\}}", text), text


@needs_ptxas
def test_a_clusters_commit_is_multicast_in_ptx() -> None:
    c = compile_kernel(GEMM, {"cluster": 2}, target=SM100, stop="cubin", cache=False, ptxas=True)
    assert "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64" in c.asm["ptx"]
    assert c.resources.spill_stores == 0


def test_a_commit_that_frees_only_its_own_ctas_stage_deadlocks() -> None:
    text = lowered({"cluster": 2})
    broken = re.sub(r"(blackwell.commit %\w+) \{cluster = true\}", r"\1", text)
    assert broken != text
    with pytest.raises(TkcEmulatorError, match="deadlock"):
        emulate_text(broken, {"M": 700, "N": 600, "K": 200})


@pytest.mark.parametrize(("path", "consts", "pin"), [
    (GEMM, {"pingpong": True}, "pingpong = true"),
    (ROOT / "examples" / "attn.tk", {"issue_ahead": True}, "issue_ahead = true"),
    (GEMM, {"tma": False}, "tma = false"),
])
def test_wgmma_only_pins_are_refused_naming_the_pin(path: Path, consts: dict, pin: str) -> None:
    with pytest.raises(TkcUnsupportedError, match=f"the pin {pin} is for wgmma targets: .*; drop it for sm_100a") as e:
        compile_kernel(path, consts, target=SM100, stop="hopper", cache=False)
    assert e.value.loc is not None and e.value.loc.line > 1


def test_a_half_ringed_loop_of_two_products_is_refused_for_shared_memory_not_a_crash() -> None:
    # BK = 128, stages = 3: wu's tiles fall out of the ring; the stage check met a barrier
    # that is no ring stage (an IndexError)
    with pytest.raises(TkcError, match="needs 26\\d+ B of shared memory, sm_100a has"):
        compile_kernel(ROOT / "examples" / "gemm_swiglu.tk", {"BK": 128, "stages": 3}, target=SM100, stop="hopper",
                       cache=False)


def test_an_epilogue_slice_lies_in_one_warpgroups_columns() -> None:
    # BN = 192 over two warpgroups (96 columns each): the TMA store's 64-column slices straddled
    # them ("pass 'lower-to-hopper' failed"); now 32-column slices
    kernel = tile_kernel({"BN": 192})
    result = run(kernel, random_args(kernel, {"M": 300, "N": 400, "K": 72}, 0), "emulate", check=True, target=SM100)
    assert result.ok, result.checked
    assert "box = [128, 32]" in lowered({"BN": 192})
