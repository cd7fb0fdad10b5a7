"""CTA pairs on sm_100a (the pin cta_pairs, the pass pair-ctas): one tcgen05.mma.cta_group::2
of 256 rows for the two CTAs of a cluster, each holding its own rows of A and half of B.  The
emulator against the interpreter on shapes with tails and several tiles a program, the pair's
protocol broken one piece at a time as emulator errors, the PTX through ptxas, and the
refusals in the pin's words."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from device_checks import needs_ptxas
from tkc.compiler import compile_kernel
from tkc.errors import TkcEmulatorError, TkcUnsupportedError, TkcUsageError, TkcVerifyError
from tkc.interpreter import random_args
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify
from tkc.runner import run

from test_blackwell import SM100, broken_ir, emulate_text, emulator_errors, lowered, tile_kernel

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PAIRS = {"cta_pairs": True}
#: Four pair tiles a cluster on the emulator's 4 SMs (two clusters), K and N with tails.
DIMS = {"M": 1000, "N": 1000, "K": 136}


@pytest.mark.parametrize(("name", "dims", "seed"), [
    ("gemm", DIMS, 0),
    ("gemm", {"M": 200, "N": 256, "K": 64}, 1),   # the odd CTA's rows partly past M, one K step
    ("gemm_fp8", {"M": 520, "N": 400, "K": 272}, 2),
    ("gemm_fp8_scaled", {"M": 300, "N": 512, "K": 128, "SA": 1, "SB": 1}, 3),
    ("gemm_swiglu", {"M": 600, "N": 264, "K": 200}, 4),
])
def test_a_pair_agrees_with_the_interpreter(name: str, dims: dict, seed: int) -> None:
    kernel = tile_kernel(PAIRS, EXAMPLES / f"{name}.tk")
    result = run(kernel, random_args(kernel, dims, seed), "emulate", check=True, seed=seed, target=SM100)
    assert result.ok, result.checked


DUAL = """@kernel
def dual(a: bf16[M, K], b: bf16[K, N], d: bf16[M, K2], e: bf16[K2, N], c: bf16[M, N],
         BM: const = 128, BN: const = 128, BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
    acc2 = zeros([BM, BN], f32)
    for k in range(cdiv(K2, BK)):
        acc2 += d[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ e[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = (acc + acc2).to(bf16)
"""
GRAM = """@kernel
def gram(a: bf16[M, K], c: bf16[M, M], BM: const = 128, BN: const = 128, BK: const = 64):
    grid(cdiv(M, BM), cdiv(M, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ a[pn*BN:(pn+1)*BN, k*BK:(k+1)*BK].T
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc.to(bf16)
"""


@pytest.mark.parametrize(("src", "dims"), [
    # two K loops a tile: one wait for the pair's columns before the first, one arrival after both
    # sums are read (a wait before each deadlocked)
    (DUAL, {"M": 600, "N": 600, "K": 136, "K2": 200}),
    # A and B from one tensor with one box: B's halved copies take a tensor map of their own
    (GRAM, {"M": 600, "K": 136}),
])
def test_a_pair_of_kernels_of_other_shapes_agrees(src: str, dims: dict) -> None:
    kernel = compile_kernel(src, PAIRS, stop="tkir", cache=False).kernel_op
    result = run(kernel, random_args(kernel, dims, 0), "emulate", check=True, target=SM100)
    assert result.ok, result.checked


def test_each_cta_holds_half_of_b_and_the_even_ctas_barrier_counts_both() -> None:
    text = lowered(PAIRS)
    plain = lowered({"cluster": 2})
    # gemm.tk's B stage is 64 x 256 under cluster = 2; a pair's CTA holds 128 of the columns
    assert "tile<64x256xbf16, smem" in plain and "tile<64x256xbf16, smem" not in text
    assert "tile<64x128xbf16, smem" in text and "multicast" not in text
    assert re.search(r"hopper.tma_load %b, %\w+, %\w+, %\w+, %\w+ \{map = 1, box = \[64, 128\], pair = true\}", text)
    assert re.search(r"hopper.expect_tx %\w+ \{bytes = 32768, pair = true\}", text)  # A 16 KiB + half of B 16 KiB
    assert "hopper.mbarrier_init %a_b_full {count = 2}" in text and "hopper.mbarrier_init %empty {count = 1}" in text
    assert re.search(r"blackwell.mma .*\{m = 128, n = 256, pair = true\}", text)
    assert "blackwell.commit %acc_full {pair = true}" in text
    assert "blackwell.tmem_alloc {cols = 256, pair = true}" in text
    # the next tile's MMAs wait until both CTAs have read the sums
    assert "hopper.mbarrier_init %acc_empty {count = 4}" in text
    assert re.search(r"hopper.mbarrier_wait %acc_empty, %\w+", text)
    assert text.count("hopper.mbarrier_arrive %acc_empty {cluster = true}") == 2  # on entry, and after each tile
    # and both CTAs' epilogues have read the last tile's sums before the columns are freed
    consumers = text[text.index('name = "consumers"'):]
    assert re.search(r"hopper.mbarrier_wait %acc_empty, %\w+[^\n]*\n *blackwell.tmem_dealloc", consumers)
    smem = [int(x) for x in re.findall(r"smem_bytes = (\d+)", text + plain)]
    assert smem[0] < smem[1]


@needs_ptxas
@pytest.mark.parametrize("name", ["gemm", "gemm_fp8", "gemm_swiglu"])
def test_a_pairs_ptx_is_cta_group_2_throughout_and_assembles_without_spills(name: str) -> None:
    c = compile_kernel(EXAMPLES / f"{name}.tk", PAIRS, target=SM100, stop="cubin", cache=False, ptxas=True)
    ptx = c.asm["ptx"]
    assert "cta_group::1" not in ptx  # ptxas refuses a function that mixes the two
    for form in ("tcgen05.alloc.cta_group::2", "tcgen05.mma.cta_group::2",
                 "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64",
                 "tcgen05.dealloc.cta_group::2", "cp.async.bulk.tensor.2d.cta_group::2.shared::cluster.global",
                 "mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64", ".reqnctapercluster 2"):
        assert form in ptx, form
    assert c.resources.spill_stores == 0


@needs_ptxas
def test_a_pairs_instruction_descriptor_says_256_rows() -> None:
    ptx = compile_kernel(EXAMPLES / "gemm.tk", PAIRS, target=SM100, stop="ptx", cache=False).asm["ptx"]
    # bf16, M = 256 (16 << 24), N = 256 (32 << 17), B MN-major (bit 16): 0x10410490
    assert f"{0x10410490};" in ptx


# ---------------------------------------------------------------- the protocol, broken
def test_without_acc_empty_the_even_cta_overwrites_sums_the_odd_one_has_not_read() -> None:
    broken = broken_ir(PAIRS, lambda t: re.sub(r"\n *hopper.mbarrier_wait %acc_empty, %\w+[^\n]*", "", t, count=1))
    errors = emulator_errors(broken, DIMS)
    # the odd CTA reads sums the even CTA's next MMA writes, or the last wait (before the columns
    # are freed) finds the barrier's phases gone by unobserved
    assert errors and all("reads tensor memory before waiting for a commit" in e
                          or "completed without this waiter seeing" in e for e in errors), errors


def test_a_full_barrier_counting_one_ctas_copies_is_an_error() -> None:
    broken = broken_ir(PAIRS, lambda t: t.replace("hopper.mbarrier_init %a_b_full {count = 2}",
                                         "hopper.mbarrier_init %a_b_full {count = 1}"))
    with pytest.raises(TkcEmulatorError, match="a_b_full|nothing|wrong phase"):
        emulate_text(broken, DIMS)


@pytest.mark.parametrize("edit", [
    lambda t: t.replace("blackwell.commit %acc_full {pair = true}", "blackwell.commit %acc_full"),
    lambda t: re.sub(r"(blackwell.commit %\d+) \{pair = true\}", r"\1 {cluster = true}", t, count=1),
    lambda t: t.replace("blackwell.tmem_alloc {cols = 256, pair = true}", "blackwell.tmem_alloc {cols = 256}"),
])
def test_a_kernel_mixing_pair_and_single_cta_tcgen05_ops_is_refused(edit) -> None:
    # ptxas refuses such a function; the verifier says so first
    with pytest.raises(TkcVerifyError, match="a kernel's tcgen05 ops are all a CTA pair's"):
        verify(parse_module(broken_ir(PAIRS, edit), "gemm.sm100.tkir"))


def test_a_pair_op_outside_a_cluster_of_two_is_refused() -> None:
    broken = broken_ir(PAIRS, lambda t: t.replace(", cluster = 2, smem_bytes", ", cluster = 4, smem_bytes"))
    with pytest.raises(TkcVerifyError, match="works across a CTA pair .* cluster has 4 CTAs, not 2"):
        verify(parse_module(broken, "gemm.sm100.tkir"))


# ---------------------------------------------------------------- refusals, in the pin's words
def test_cta_pairs_on_a_wgmma_target_names_the_pin() -> None:
    with pytest.raises(TkcUsageError, match=r"pin cta_pairs = true: CTA pairs are tcgen05's \(sm_100a\); sm_90a has "
                                            r"none, drop the pin"):
        compile_kernel(EXAMPLES / "gemm.tk", PAIRS, target="sm_90a", stop="hopper", cache=False)


def test_cta_pairs_with_another_cluster_is_refused() -> None:
    with pytest.raises(TkcUsageError, match="a pair is a cluster of 2 programs, not cluster = 4"):
        compile_kernel(EXAMPLES / "gemm.tk", {"cta_pairs": True, "cluster": 4}, target=SM100, stop="hopper",
                       cache=False)


@pytest.mark.parametrize(("name", "message"), [
    ("attn", r"cta_pairs = true \(a cluster of 2\): a cluster's programs walk a persistent GEMM-shaped kernel's "
             r"tiles together"),
    ("gemm_bias_gelu", r"cta_pairs = true \(a cluster of 2\)"),
])
def test_kernels_a_pair_cannot_take_are_refused_at_their_source(name: str, message: str) -> None:
    with pytest.raises(TkcUnsupportedError, match=message) as e:
        compile_kernel(EXAMPLES / f"{name}.tk", PAIRS, target=SM100, stop="hopper", cache=False)
    assert e.value.loc is not None and e.value.loc.line > 1
