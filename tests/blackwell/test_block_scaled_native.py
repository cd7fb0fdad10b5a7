"""``dot_scaled`` on sm_100a as one ``tcgen05.mma ... kind::mxf8f6f4.block_scale`` (no
dequantization): decompose's choice of the native product, the ``#scales`` layout and the
block-scaled descriptors against docs/block_scaled.md, examples/gemm_mx.tk emulated against the
interpreter on MX-quantized operands with tails in M, N and K under several pins, ptxas without
spills, and the broken scale protocols as emulator errors.  No Blackwell GPU runs here: the
placement of scale factors in tensor memory is the model docs/block_scaled.md §4-5 states."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from device_checks import HAVE_PTXAS, interpret_and_emulate, lowered, needs_ptxas
from mx_reference import quantize, rows
from tkc import dtypes
from tkc.compiler import compile_kernel
from tkc.emulator import emulate
from tkc.emulator.tmem import decode_scaled_idesc
from tkc.errors import TkcEmulatorError, TkcVerifyError
from tkc.frontend import compile_source
from tkc.interpreter import run_kernel
from tkc.ir.dialects import blackwell
from tkc.ir.layouts import SCALE_ATOM_BYTES, ScaleLayout, SharedLayout, descriptor_address
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify

GEMM_MX = Path(__file__).resolve().parents[2] / "examples" / "gemm_mx.tk"
SM100 = "sm_100a"
#: The pins an sm_100a MXFP8 GEMM is compiled with here: K tiles of 128 (four scale blocks, one
#: 512-byte block of scales a 128 rows), one program an SM, no copies ahead into the threads' own
#: shared memory (gemm_mx.tk's defaults are chosen on sm_90a).
NATIVE = {"BK": 128, "ctas_per_sm": 1, "stage_loads": 0}


def _compile(stop: str, consts: dict, target: str = SM100, kernel: str = "gemm_mx"):
    return compile_kernel(GEMM_MX, consts, kernel=kernel, stop=stop, target=target, cache=False)


def _operands(M: int, N: int, K: int, seed: int) -> list:
    a, sa = quantize(rows(M, K, seed))
    b, sb = quantize(rows(N, K, seed + 1))
    return [a, sa, b, sb, torch.empty(M, N, dtype=torch.bfloat16)]


# ------------------------------------------------------------------ the facts
def test_the_scaled_instruction_descriptor_is_the_documented_one() -> None:
    """docs/block_scaled.md §3: MXFP8 e4m3 x e4m3, M = N = 128, scale ids 0 is 0x08A00000; the
    ids sit at bits 29-30 (A) and 4-5 (B), e5m2 is code 1, and the emulator decodes it back."""
    e4 = SharedLayout(128, 128, dtypes.f8e4m3, "k", 128)
    e5 = SharedLayout(256, 128, dtypes.f8e5m2, "k", 128)
    assert blackwell.scaled_instr_descriptor(e4, e4, 128, 128, 0, 0) == 0x08A00000
    d = blackwell.scaled_instr_descriptor(e4, e5, 128, 256, 3, 2)
    assert d == 0x08A00000 + (16 << 17) + (1 << 10) + (3 << 29) + (2 << 4)
    assert decode_scaled_idesc(d) == {"a": dtypes.f8e4m3, "b": dtypes.f8e5m2, "a_mn": False, "b_mn": False,
                                      "n": 256, "m": 128, "a_id": 3, "b_id": 2, "ue8m0": True}
    with pytest.raises(TkcEmulatorError, match="scales are UE8M0"):
        decode_scaled_idesc(d & ~(1 << 23))
    with pytest.raises(TkcEmulatorError, match="reserved bits"):
        decode_scaled_idesc(d | 1 << 31)
    with pytest.raises(ValueError, match="takes e4m3 and e5m2"):
        blackwell.scaled_instr_descriptor(SharedLayout(128, 64, dtypes.bf16, "k", 128), e4, 128, 128, 0, 0)


def test_the_fp4_instruction_descriptors_are_the_documented_ones() -> None:
    """docs/block_scaled.md §3: kind::mxf4nvf4, M = N = 128, ids 0: MXFP4 (UE8M0, 2X)
    0x08A00480, NVFP4 (UE4M3, 4X) 0x08200480; 2X reads ids 0 and 2, 4X only 0; operands
    K-major only; the emulator decodes them back and refuses the invalid ones."""
    f4 = SharedLayout(128, 32, dtypes.f4e2m1x2, "k", 32)
    assert blackwell.scaled_instr_descriptor(f4, f4, 128, 128, 0, 0, 2) == 0x08A00480
    assert blackwell.scaled_instr_descriptor(f4, f4, 128, 128, 0, 0, 4) == 0x08200480
    d = blackwell.scaled_instr_descriptor(f4, f4, 128, 64, 2, 2, 2)
    assert decode_scaled_idesc(d, 2) == {"a": dtypes.f4e2m1x2, "b": dtypes.f4e2m1x2, "a_mn": False, "b_mn": False,
                                         "n": 64, "m": 128, "a_id": 2, "b_id": 2, "ue8m0": True}
    for bad in ((1, 0, 2), (0, 2, 4), (0, 0, 3)):
        with pytest.raises(ValueError):
            blackwell.scaled_instr_descriptor(f4, f4, 128, 128, *bad)
    with pytest.raises(ValueError, match="K-major operands only"):
        blackwell.scaled_instr_descriptor(f4, SharedLayout(64, 128, dtypes.f4e2m1x2, "mn", 128), 128, 128, 0, 0, 2)
    with pytest.raises(TkcEmulatorError, match="multiples of 4"):
        decode_scaled_idesc(0x08200480 | (2 << 29), 4)
    with pytest.raises(TkcEmulatorError, match="UE4M3"):
        decode_scaled_idesc(0x08A00480, 4)
    with pytest.raises(TkcEmulatorError, match="E2M1"):
        decode_scaled_idesc(0x08A00000, 2)


def test_the_scales_layout_is_cutlass_512_byte_blocks() -> None:
    """Row m, K block j of one block at 16 (m % 32) + 4 (m / 32) + j; blocks of 128 rows, K's
    groups of four outer; B's [K/32, N] tile the same with its axes swapped."""
    a = ScaleLayout(128, 4)
    m, j = np.meshgrid(np.arange(128), np.arange(4), indexing="ij")
    np.testing.assert_array_equal(a.offset(m, j), 16 * (m % 32) + 4 * (m // 32) + j)
    assert sorted(a.offset(m, j).ravel()) == list(range(SCALE_ATOM_BYTES))
    b = ScaleLayout(8, 256, major="mn")  # K/32 = 8, N = 256: 2 x 2 blocks
    assert (b.atoms, b.size_bytes, blackwell.scale_columns(b)) == (4, 2048, 16)
    assert int(b.offset(5, 200)) == 512 * (1 * 2 + 1) + 16 * (200 % 32) + 4 * (200 // 32 % 4) + 1
    with pytest.raises(ValueError, match="written by the threads, not copied by TMA"):
        a.tma_box()


def test_a_scale_block_is_copied_as_32_rows_of_16_bytes() -> None:
    desc = blackwell.scale_descriptor(4096)
    assert desc >> 46 & 1 and not desc >> 61  # tcgen05's version bit, no swizzle
    rows = descriptor_address(desc, "k", np.arange(32)[:, None], np.arange(16)[None, :], dtypes.f8e8m0)
    np.testing.assert_array_equal(rows, 4096 + np.arange(512).reshape(32, 16))
    # NVFP4's e4m3 scales: the same bytes; the layout says its dtype (E8M0's is the default)
    from tkc.ir.layouts import LAYOUT_PARSERS

    nv = ScaleLayout(128, 8, dtypes.f8e4m3)
    assert str(nv) == "#scales<128x8xf8e4m3, k>" and str(ScaleLayout(128, 8)) == "#scales<128x8, k>"
    assert LAYOUT_PARSERS["scales"]("128x8xf8e4m3, k") == nv and nv.offset(5, 6) == ScaleLayout(128, 8).offset(5, 6)


# ------------------------------------------------------------------ the choice
def _ptx(consts: dict, target: str = SM100, source: GEMM_MX = GEMM_MX, kernel: str = "gemm_mx") -> str:
    return compile_kernel(source, consts, kernel=kernel, stop="ptx", target=target, cache=False).asm["ptx"]


def test_sm_100a_multiplies_mxfp8_without_dequantizing() -> None:
    """One block-scaled MMA a K block (4 for K = 128) behind a copy of each operand's scales;
    no e4m3 conversion and no bf16 product."""
    ptx = _ptx(NATIVE)
    assert len(re.findall(r"tcgen05\.mma\.cta_group::1\.kind::mxf8f6f4\.block_scale\.scale_vec::1X", ptx)) == 4
    assert len(re.findall(r"tcgen05\.cp\.cta_group::1\.32x128b\.warpx4", ptx)) == 2
    assert "e4m3x2" not in ptx and "kind::f16" not in ptx
    # the scale ids walk K's four blocks: bits 29-30 and 4-5 of the four descriptors
    ids = sorted({(int(v) >> 29 & 3, int(v) >> 4 & 3) for v in re.findall(r"mov\.b32\s+%r\d+, (\d+);", ptx)
                  if int(v) & 0x00FFFF80 == 0x00A00000})
    assert ids == [(0, 0), (1, 1), (2, 2), (3, 3)]


@pytest.mark.parametrize("kernel, consts", [("gemm_mx", {"BM": 64, **NATIVE}), ("gemm_mx_weights", {})], ids=str)
def test_products_the_block_scaled_mma_does_not_take_are_dequantized(kernel: str, consts: dict) -> None:
    """64 rows (the block-scaled MMA has 128 on one CTA), and bf16 activations (kind::mxf8f6f4
    takes 8-bit operands): the decomposition's bf16 product."""
    ptx = _ptx(consts, kernel=kernel)
    assert "block_scale" not in ptx and "tcgen05.mma" in ptx and "kind::f16" in ptx


def test_sm_90a_still_dequantizes() -> None:
    assert "block_scale" not in _ptx({}, target="sm_90a") and "wgmma" in _ptx({}, target="sm_90a")


E5M2 = """
@kernel
def mixed(a: f8e5m2[M, K], sa: f8e8m0[M, KS], b: f8e4m3[K, N], sb: f8e8m0[KS, N], c: f32[M, N]):
    grid(cdiv(M, 128), cdiv(N, 64))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([128, 64], f32)
    for k in range(cdiv(K, 64)):
        acc += dot_scaled(a[pm*128:(pm+1)*128, k*64:(k+1)*64], sa[pm*128:(pm+1)*128, k*2:(k+1)*2],
                          b[k*64:(k+1)*64, pn*64:(pn+1)*64], sb[k*2:(k+1)*2, pn*64:(pn+1)*64])
    c[pm*128:(pm+1)*128, pn*64:(pn+1)*64] = acc
"""


def test_e5m2_by_an_untransposed_e4m3_b_emulated_as_interpreted() -> None:
    """B [K, N] as it lies (MN-major, which kind::mxf8f6f4 reads for 8-bit operands) and its scales
    [K/32, N] as they lie; f32 out, so the sums are compared before any rounding."""
    M, N, K = 130, 80, 160
    g = torch.Generator().manual_seed(4)
    a = (torch.randn(M, K, generator=g) * 4).to(torch.float8_e5m2)
    b = (torch.randn(K, N, generator=g) * 4).to(torch.float8_e4m3fn)
    sa = torch.exp2(torch.randint(-20, 20, (M, K // 32), generator=g).float()).to(torch.float8_e8m0fnu)
    sb = torch.exp2(torch.randint(-20, 20, (K // 32, N), generator=g).float()).to(torch.float8_e8m0fnu)
    args = [x.float().numpy() for x in (a, sa, b, sb, torch.empty(M, N))]
    module = compile_source(E5M2)
    tile_ir = compile_kernel(module, {}, stop="tkir", cache=False).kernel_op
    c = compile_kernel(compile_source(E5M2), {}, stop="cubin" if HAVE_PTXAS else "hopper", target=SM100, cache=False)
    assert "blackwell.copy_scales" in print_module(c.kernel_op.parent)
    want, got = interpret_and_emulate(tile_ir, c.kernel_op, args, seed=2)
    np.testing.assert_allclose(got[4], want[4], rtol=1e-6, atol=0)


# ------------------------------------------------------------------ emulator = interpreter
_PIN_SETS = [NATIVE, {**NATIVE, "BN": 256}, {**NATIVE, "BK": 256}, {**NATIVE, "BK": 64}, {"ctas_per_sm": 1},
             {**NATIVE, "warp_specialize": False}, {**NATIVE, "cluster": 2}]


@pytest.mark.parametrize("consts, M, N, K", [
    pytest.param(consts, *shape, marks=[pytest.mark.slow] if consts is not NATIVE and j else [],
                 id=f"{consts}-{'x'.join(map(str, shape))}")
    for consts in _PIN_SETS for j, shape in enumerate([(200, 136, 352), (130, 272, 96)])])
def test_gemm_mx_emulated_as_interpreted(consts: dict, M: int, N: int, K: int) -> None:
    """Every pin set on one shape (tails in M, N and K), NATIVE on a second (N past 256: two
    blocks of B's scales; K 96: one partial block); the others' second shape with --slow."""
    args = [x.float().numpy() for x in _operands(M, N, K, M + K)]
    c = lowered(lambda stop: _compile(stop, consts))
    assert "blackwell.copy_scales" in print_module(c.kernel_op.parent)
    want, got = interpret_and_emulate(_compile("tkir", consts).kernel_op, c.kernel_op, args, seed=3)
    # exact products of the scaled operands, summed in float64 by the interpreter and in the
    # emulator's own order, one bf16 rounding each
    np.testing.assert_allclose(got[4], want[4], rtol=2**-7, atol=0)


def test_the_lowered_ir_round_trips() -> None:
    text = _compile("hopper", NATIVE).asm["hopper"]
    assert "#scales<128x4, k>" in text and "#scales<4x128, mn>" in text and "scales = [" in text
    assert print_module(parse_module(text, "gemm_mx.sm100.tkir")) == text


@needs_ptxas
@pytest.mark.parametrize("consts", [NATIVE, {**NATIVE, "BN": 256}, {**NATIVE, "BK": 256}, {}], ids=str)
def test_ptxas_accepts_without_spills(consts: dict) -> None:
    lowered(lambda stop: _compile(stop, consts))


# ------------------------------------------------------------------ protocol errors
DIMS = {"M": 130, "N": 136, "K": 288, "KS": 9}


def _emulate(text: str, seed: int = 0) -> None:
    module = parse_module(text, "gemm_mx.sm100.tkir")
    verify(module)
    kernel = module.kernel()
    args = [x.float().numpy() for x in _operands(DIMS["M"], DIMS["N"], DIMS["K"], seed)]
    emulate(kernel, args, seed=seed)


def _lowered_text() -> str:
    return _compile("hopper", NATIVE).asm["hopper"]


def test_the_lowered_text_emulates() -> None:
    _emulate(_lowered_text())  # the edits below break a kernel that runs


def test_an_mma_reading_scales_no_copy_wrote() -> None:
    text = _lowered_text()
    broken = re.sub(r"\n *blackwell\.copy_scales [^\n]*", "", text)
    assert broken != text
    with pytest.raises(TkcEmulatorError, match="reads A's scale factors for K step 0 from tensor memory .* that no "
                                               "tcgen05.cp wrote"):
        _emulate(broken)


def test_scales_copied_over_the_accumulator() -> None:
    text = _lowered_text()
    broken = re.sub(r"blackwell\.copy_scales %\w+, ", "blackwell.copy_scales %tmem, ", text, count=1)
    assert broken != text
    with pytest.raises(TkcEmulatorError, match="copies scale factors over tensor-memory columns 0-3 that hold an "
                                               "MMA's accumulator|reads A's scale factors"):
        _emulate(broken)


def test_scales_stored_without_the_proxy_fence() -> None:
    """The threads' stores of the scales reach tcgen05.cp (the async proxy) only through
    fence.proxy.async."""
    text = _lowered_text()
    # both: one thread's fence orders all its earlier stores, so B's would cover A's
    broken = re.sub(r"(hopper\.smem_store %\w+, %\w+[^\n]*\n) *hopper\.fence_proxy_async[^\n]*\n", r"\1", text,
                    count=2)
    assert broken != text
    with pytest.raises(TkcEmulatorError, match="async proxy.*no fence.proxy.async since"):
        _emulate(broken)


def test_a_copy_of_what_is_not_a_scales_tile_is_refused_by_the_verifier() -> None:
    text = _lowered_text()
    assert "%c_out = hopper.smem_alloc" in text
    broken = re.sub(r"blackwell\.copy_scales (%\w+), %\w+", r"blackwell.copy_scales \1, %c_out", text, count=1)
    assert broken != text
    with pytest.raises(TkcVerifyError, match="copies a shared #scales tile, got tile<128x128xbf16"):
        verify(parse_module(broken, "gemm_mx.sm100.tkir"))


def test_scale_columns_the_verifier_refuses() -> None:
    text = _lowered_text()
    broken = re.sub(r"scales = \[(\d+), \d+\]", r"scales = [\1]", text, count=1)
    assert broken != text
    with pytest.raises(TkcVerifyError, match="scales are the columns of A's and B's scale factors"):
        verify(parse_module(broken, "gemm_mx.sm100.tkir"))


def test_the_interpreter_runs_the_block_scaled_tile_mma() -> None:
    """decompose's output is tile IR the interpreter runs: the same as dot_scaled before it."""
    M, N, K = 130, 72, 160
    args = [x.float().numpy() for x in _operands(M, N, K, 9)]
    before = _compile("tkir", NATIVE).kernel_op
    after = compile_kernel(GEMM_MX, NATIVE, kernel="gemm_mx", stop="hopper", target=SM100, cache=False,
                           hopper_pipeline="decompose").kernel_op
    assert any(op.name == "tile.mma" and op.scales for op in after.walk())
    want = [a.copy() for a in args]
    got = [a.copy() for a in args]
    run_kernel(before, want)
    run_kernel(after, got)
    np.testing.assert_array_equal(got[4], want[4])


def test_beyond_bf16s_range_sm_100a_keeps_the_exact_product() -> None:
    """Where an operand times its scale leaves bf16's range (2^-9 * 2^-127 underflows it, 448 *
    2^127 overflows it) the interpreter (and sm_90a's decomposition) says 0 or inf; the
    block-scaled MMA multiplies the 8-bit values and the two scales as the PTX ISA defines it,
    D = (A SA)(B SB), so the emulator of sm_100a's code gives the exact sums (docs/language.md
    says so): row 0's K block 0 is 2^-9 * 2^-127 times B's 2^127, row 1's K block 1 448 * 2^127
    times B's 2^-127."""
    M, N, K = 128, 128, 128
    a = torch.zeros(M, K)
    a[0, :32], a[1, 32:64] = 2.0**-9, 448.0
    b = torch.ones(N, K).to(torch.float8_e4m3fn)
    sa = torch.ones(M, K // 32)
    sa[0, 0], sa[1, 1] = 2.0**-127, 2.0**127
    sb = torch.ones(N, K // 32)
    sb[:, 0], sb[:, 1] = 2.0**127, 2.0**-127
    args = [x.to(dt).float().numpy() for x, dt in ((a, torch.float8_e4m3fn), (sa, torch.float8_e8m0fnu),
                                                 (b, torch.float8_e4m3fn), (sb, torch.float8_e8m0fnu))]
    args.append(np.zeros((M, N), np.float32))
    want, got = interpret_and_emulate(_compile("tkir", NATIVE).kernel_op, _compile("hopper", NATIVE).kernel_op,
                                      args, seed=1)
    assert np.all(want[4][0] == 0) and np.all(np.isinf(want[4][1]))
    np.testing.assert_array_equal(got[4][0], np.float32(32 * 2.0**-9))
    np.testing.assert_array_equal(got[4][1], np.float32(32 * 448.0))
    np.testing.assert_array_equal(got[4][2:], want[4][2:])


SWIGLU_MX = """
@kernel
def swiglu_mx(x: f8e4m3[M, K], sx: f8e8m0[M, KS], wg: f8e4m3[N, K], sg: f8e8m0[N, KS], wu: f8e4m3[N, K],
              su: f8e8m0[N, KS], c: bf16[M, N]):
    grid(cdiv(M, 128), cdiv(N, 64))
    pm = program_id(0)
    pn = program_id(1)
    g = zeros([128, 64], f32)
    u = zeros([128, 64], f32)
    for k in range(cdiv(K, 128)):
        xt = x[pm*128:(pm+1)*128, k*128:(k+1)*128]
        st = sx[pm*128:(pm+1)*128, k*4:(k+1)*4]
        g += dot_scaled(xt, st, wg[pn*64:(pn+1)*64, k*128:(k+1)*128].T, sg[pn*64:(pn+1)*64, k*4:(k+1)*4].T)
        u += dot_scaled(xt, st, wu[pn*64:(pn+1)*64, k*128:(k+1)*128].T, su[pn*64:(pn+1)*64, k*4:(k+1)*4].T)
    c[pm*128:(pm+1)*128, pn*64:(pn+1)*64] = (g * sigmoid(g) * u).to(bf16)


@kernel
def once(a: f8e4m3[M, 64], sa: f8e8m0[M, 2], b: f8e4m3[64, N], sb: f8e8m0[2, N], c: f32[M, N]):
    grid(cdiv(M, 128), cdiv(N, 128))
    pm = program_id(0)
    pn = program_id(1)
    c[pm*128:(pm+1)*128, pn*128:(pn+1)*128] = dot_scaled(a[pm*128:(pm+1)*128, :], sa[pm*128:(pm+1)*128, :],
                                                         b[:, pn*128:(pn+1)*128], sb[:, pn*128:(pn+1)*128])
"""


@pytest.mark.parametrize("kernel, dims", [("swiglu_mx", {"M": 200, "N": 144, "K": 384, "KS": 12}),
                                          ("once", {"M": 200, "N": 144})])
def test_two_products_of_a_loop_and_a_product_outside_one(kernel: str, dims: dict) -> None:
    """SwiGLU's two block-scaled products of one K loop (each waited for before the next
    iteration stores its scales again: a race on the TMA ring when they were not) and one
    product read at once, emulated as interpreted on shapes with tails."""
    from tkc.interpreter import random_args

    c = lowered(lambda stop: compile_kernel(compile_source(SWIGLU_MX), {}, kernel=kernel, stop=stop, target=SM100,
                                            cache=False))
    text = print_module(c.kernel_op.parent)
    assert text.count("blackwell.copy_scales") == (4 if kernel == "swiglu_mx" else 2)
    tile_ir = compile_kernel(compile_source(SWIGLU_MX), {}, kernel=kernel, stop="tkir", cache=False).kernel_op
    for seed in range(2):
        args = random_args(tile_ir, dims, seed)
        want, got = interpret_and_emulate(tile_ir, c.kernel_op, args, seed=seed)
        np.testing.assert_allclose(np.asarray(got[-1], np.float64), np.asarray(want[-1], np.float64), rtol=2**-7,
                                   atol=1e-30)


def test_scales_rewritten_before_the_wait_for_the_copys_commit() -> None:
    """Each iteration the threads store the next scales over the tile the last copy read: only
    after waiting for the commit that tracks the copy.  Without the role's wait in the loop the
    stores race with the copy (the commit alone says nothing about when it completes)."""
    text = _lowered_text()
    broken = re.sub(r"\n *hopper\.mbarrier_wait %acc_full, %phase_\d+[^\n]*", "", text, count=1)
    assert broken != text
    with pytest.raises(TkcEmulatorError, match=r"race on .*writes it while .*blackwell.copy_scales.* is still "
                                               r"reading it"):
        _emulate(broken)
