"""select-layouts and lower-to-hopper on the examples: what they decide, that the output
verifies and round-trips through the text form, that select-layouts output computes
exactly what its input computes (the interpreter runs both), and located errors for what
sm_90a cannot do."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

from tkc.errors import TkcUnsupportedError, TkcUsageError, TkcVerifyError
from tkc.frontend import compile_file, compile_source
from tkc.interpreter import random_args, run_kernel
from tkc.ir.layouts import Slice, register_map
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify
from tkc.passes.manager import PassManager
from tkc.passes.lower_to_hopper import lower_to_hopper
from tkc.passes.pipeline import DEFAULT_PIPELINE
from tkc.passes.select_layouts import select_layouts
from tkc.pins import Options
from tkc.target import DEFAULT_TARGET

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"

CASES = [
    ("gemm.tk", {}, {"M": 200, "N": 136, "K": 96}),
    ("gemm.tk", {"BM": 64, "BN": 64, "BK": 32}, {"M": 100, "N": 72, "K": 40}),
    ("attn.tk", {"D": 64, "BM": 64, "BN": 64, "causal": True}, {"B": 1, "H": 2, "N": 100}),
    ("attn.tk", {"D": 128, "BM": 128, "BN": 64}, {"B": 1, "H": 1, "N": 72}),
    ("softmax.tk", {}, {"M": 20, "N": 700}),
    ("layernorm.tk", {}, {"M": 20, "N": 600}),
    ("layernorm.tk", {"BM": 64, "BN": 64}, {"M": 70, "N": 100}),
    ("softmax_split.tk", {"BN": 256, "cluster": 4}, {"M": 3, "N": 900}),
    ("gemm.tk", {"BM": 256, "BN": 128, "consumers": 2}, {"M": 300, "N": 136, "K": 96}),
    ("attn.tk", {"D": 64, "BM": 128, "BN": 64, "consumers": 1}, {"B": 1, "H": 1, "N": 100}),
]


def tile_module(name: str, consts: dict):
    m = compile_file(str(EXAMPLES / name), consts)
    PassManager(DEFAULT_PIPELINE).run(m)
    return m


def after(name: str, consts: dict, pipeline: str):
    m = tile_module(name, consts)
    PassManager(pipeline).run(m)
    verify(m)
    return m


def ids(case) -> str:
    return case[0] + "".join(f"-{k}{v}" for k, v in case[1].items())


@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize("pipeline", ["select-layouts", "select-layouts,lower-to-hopper"])
def test_output_round_trips(case, pipeline):
    text = print_module(after(case[0], case[1], pipeline))
    again = parse_module(text)
    verify(again)
    assert print_module(again) == text


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_select_layouts_computes_the_same(case):
    name, consts, dims = case
    before = tile_module(name, consts).kernel()
    selected = after(name, consts, "select-layouts").kernel()
    for seed in (0, 1):
        a = random_args(before, dims, seed)
        b = random_args(selected, dims, seed)
        run_kernel(before, a)
        run_kernel(selected, b)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_gemm_layouts_and_lowering():
    text = print_module(after("gemm.tk", {"BN": 128}, "select-layouts,lower-to-hopper"))
    assert "threads = 256" in text
    # A, B, and C's map for the epilogue's TMA store.
    assert "tma_maps = [[0, [128, 64], 128], [1, [64, 64], 128], [2, [128, 64], 128]]" in text
    assert re.search(r"hopper.smem_alloc \{offset = -1\} : tile<128x64xbf16, smem, #smem<128x64xbf16, k, sw128>>",
                     text)
    assert "#smem<64x128xbf16, mn, sw128>" in text
    assert "hopper.expect_tx %" in text and "bytes = 32768" in text
    # One barrier, waited on in the loop with a carried, flipped parity.
    assert text.count("hopper.mbarrier_alloc") == 1
    wait = re.search(r"hopper.mbarrier_wait %(\w+), %(\w+)", text)
    assert wait and re.search(rf"%\w+ = tile.xor %{wait.group(2)}, %\w+ : i32", text)
    assert text.index("hopper.barrier {id = 0}", text.index("tile.for")) < text.index("hopper.expect_tx")
    assert "hopper.wgmma %" in text and "hopper.wgmma_wait %" in text and "pending = 0" in text
    assert "#wgmma_acc<128, wg=2>" in text
    # The epilogue: registers to a shared tile, TMA to c, and a wait before the kernel ends.
    assert re.search(r"hopper.smem_store %\w+, %c_out[^\n]*\n\s*hopper.tma_store %c, %c_out, %\w+, %\w+ "
                     r"\{map = 2, box = \[128, 128\]\}", text)
    assert re.search(r"hopper.tma_store_wait \{pending = 0\}[^\n]*\n\s*tile.return", text)
    assert "hopper.store" not in text
    assert "tile.load" not in text and "tile.mma" not in text and "tile.store" not in text


def test_a_wide_epilogue_goes_out_in_column_slices():
    """128 x 256: four 64-column slices through two 16 KB shared tiles used in turn (32 KB
    instead of 64 KB); a slice waits until the copy that last read its tile is done."""
    text = print_module(after("gemm.tk", {"persistent": False}, "select-layouts,lower-to-hopper"))
    assert text.count("#smem<128x64xbf16, k, sw128>>") == 3  # the A stage and the two slices
    epilogue = text[text.index("hopper.smem_store"):]
    ops = re.findall(r"hopper\.(tma_store_wait \{pending = \d\}|smem_store|tma_store) ", epilogue)
    # Outside a loop the first two slices have fresh tiles; the third and fourth wait for the
    # first and second copies; the kernel waits for all before it ends.
    assert ops == ["smem_store", "tma_store"] * 2 + ["tma_store_wait {pending = 1}", "smem_store", "tma_store"] * 2 + [
        "tma_store_wait {pending = 0}"]
    assert re.findall(r"smem_store %\w+, %(c_out\d) \{col = (\d+)\}", epilogue) == [
        ("c_out0", "0"), ("c_out1", "64"), ("c_out0", "128"), ("c_out1", "192")]
    assert re.findall(r"tma_store %c, %(c_out\d), [^{]*\{map = \d+, box = \[128, 64\]\}", epilogue) == [
        "c_out0", "c_out1", "c_out0", "c_out1"]


def test_a_tall_epilogue_goes_out_in_narrower_slices():
    """256 x 128 (two 128-row warpgroups): four 32-column slices with the 64-byte swizzle,
    through two 16 KB tiles: 32 KB like 128 x 256's, so the ring keeps four stages."""
    text = print_module(after("gemm.tk", {"BM": 256, "BN": 128, "consumers": 2, "persistent": False},
                              "select-layouts,lower-to-hopper"))
    assert "#wgmma_acc<128, wg=2, slices=2>" in text and "threads = 256" in text
    epilogue = text[text.index("hopper.smem_store"):]
    assert re.findall(r"smem_store %\w+, %(c_out\d) \{col = (\d+)\}", epilogue) == [
        ("c_out0", "0"), ("c_out1", "32"), ("c_out0", "64"), ("c_out1", "96")]
    assert text.count("#smem<256x32xbf16, k, sw64>>") == 2
    assert re.findall(r"box = \[256, 32\]", epilogue) == ["box = [256, 32]"] * 4


@pytest.mark.parametrize("consts,message", [
    ({"BM": 256, "BN": 128, "consumers": 3}, "consumers = 3: this kernel's products have 256 rows, 64 to 256 a "
                                             "warpgroup in steps of 64, so it runs 4 or 2 or 1"),
    ({"BM": 192, "BN": 128, "consumers": 2}, "products have 192 rows, 64 to 256 a warpgroup in steps of 64, so it "
                                             "runs 3 or 1 "),
])
def test_consumers_must_give_each_warpgroup_64_to_256_rows(consts, message):
    with pytest.raises(TkcUnsupportedError, match=re.escape(message)) as info:
        after("gemm.tk", consts, "select-layouts")
    assert info.value.loc is not None and info.value.loc.line == 10


def test_smem_store_column_slice_must_fit():
    text = """tile.kernel @k {threads = 128, smem_bytes = 8192, tma_maps = []} {
^(%x: tensor<bf16[M, N]>):
  %s = hopper.smem_alloc {offset = 0} : tile<64x64xbf16, smem, #smem<64x64xbf16, k, sw128>>
  %c0 = tile.constant {value = 0} : i32
  %t = hopper.load %x, %c0, %c0 {box = [64, 128]} : tile<64x128xbf16, reg, #wgmma_acc<128>>
  hopper.smem_store %t, %s {col = 96}
  tile.return
}
"""
    with pytest.raises(TkcVerifyError, match=r"does not fit tile<64x64xbf16.* at column 96"):
        verify(parse_module(text))
    # A slice that splits an 8-column group: which registers a thread stores would depend on
    # the thread.
    with pytest.raises(TkcVerifyError, match=r"whole 8-column groups, not columns 4..68"):
        verify(parse_module(text.replace("col = 96", "col = 4")))
    # A blocked tile: its columns are not known per register at compile time.
    blocked = text.replace("#wgmma_acc<128>", "#blocked<64x128, vec=2, lanes=1x32, warps=2x2>").replace(
        "col = 96", "col = 64")
    with pytest.raises(TkcVerifyError, match=r"from a wgmma accumulator"):
        verify(parse_module(blocked))


def test_tma_store_pin_off_stores_thread_by_thread():
    text = print_module(after("gemm.tk", {"BN": 128, "tma_store": False}, "select-layouts,lower-to-hopper"))
    assert "tma_maps = [[0, [128, 64], 128], [1, [64, 64], 128]]" in text
    assert "hopper.store %c" in text and "tma_store" not in text.replace("tma_store = false", "")


def test_tma_store_in_a_loop_waits_before_reusing_its_tile():
    """A persistent GEMM stores once a tile: before writing the shared tile again, the
    previous tile's copy must have read it."""
    text = print_module(after("gemm.tk", {"BN": 128}, "persistent,select-layouts,lower-to-hopper"))
    loop = text[text.index("tile.for"):]
    assert re.search(r"hopper.tma_store_wait \{pending = 0\}[^\n]*\n\s*hopper.smem_store", loop)
    assert text.count("hopper.tma_store_wait") == 2  # in the loop, and before the kernel ends

def test_attention_keeps_p_in_registers():
    text = print_module(after("attn.tk", {}, "select-layouts,lower-to-hopper"))
    # q @ k.T reads k K-major; p @ v reads v MN-major; p goes to the A fragment for free.
    assert "#smem<128x128xbf16, k, sw128>" in text and "#smem<128x128xbf16, mn, sw128>" in text
    conv = re.findall(r"hopper.convert_layout [^\n]*", text)
    assert any("#wgmma_a<128, wg=2>" in c for c in conv)
    assert all("smem" not in c for c in conv), "no conversion should need shared memory"
    assert re.search(r"hopper.reduce %\w+ \{kind = \"max\", axis = 1, shuffle_xor = \[1, 2\], warp_xor = \[\]\}",
                     text)
    # k and v share a barrier; q has its own, waited once with parity 0 outside the loop.
    assert text.count("hopper.mbarrier_alloc") == 2
    assert "bytes = 65536" in text and "bytes = 32768" in text
    # Arm, copy, wait: in this order for the q tile (top level) and the k/v tiles (loop).
    for tensor in ("q", "k"):
        copy = text.index(f"hopper.tma_load %{tensor}")
        arm = text.rindex("hopper.expect_tx", 0, copy)
        wait = text.index("hopper.mbarrier_wait", copy)
        assert "hopper.tma_load" not in text[arm:copy].replace(f"hopper.tma_load %{tensor}", "")
        assert arm < copy < wait


def test_softmax_is_blocked():
    text = print_module(after("softmax.tk", {}, "select-layouts,lower-to-hopper"))
    assert "threads = 128" in text
    assert "#blocked<1x4096, vec=8, lanes=1x32, warps=1x4>" in text  # a row of 16-byte runs
    assert "hopper.load %x" in text and "other = -inf" in text
    assert "tma_maps = []" in text


def test_warps_pin_spreads_a_row_over_more_threads():
    text = print_module(after("softmax.tk", {"BN": 16384, "warps": 16}, "select-layouts,lower-to-hopper"))
    assert "threads = 512" in text
    assert "#blocked<1x16384, vec=8, lanes=1x32, warps=1x16>" in text


@pytest.mark.parametrize("name,consts,message", [
    ("softmax.tk", {"warps": 6}, "pin warps = 6: a program runs whole warpgroups: give a multiple of 4"),
    ("gemm.tk", {"warps": 8}, "pin warps = 8: the pin sets the warps of kernels without products; this kernel's "
                              "products of 128 rows set its own, so leave the pin out"),
    ("softmax.tk", {"warps": 64}, "pin warps = 64: at most 32 (a program has at most 1024 threads)"),
])
def test_warps_pin_refused(name, consts, message):
    # refused where the kernel is written (tkc.pins), before any pass: the interpreter too
    with pytest.raises(TkcUsageError) as e:
        after(name, consts, "select-layouts")
    assert message in str(e.value)
    assert e.value.loc is not None


def _src(body: str, params: str = "a: bf16[M, K], b: bf16[K, N], c: f32[M, N]") -> str:
    return f"@kernel\ndef k({params}):\n" + "".join(f"    {line}\n" for line in body.splitlines())


def test_a_vector_widened_to_a_row_block_takes_its_slice():
    """``w[None, :]`` against a 1 x N row block: the vector is loaded as the block's slice, and
    its expansion gets back to the block's own layout without moving a value."""
    m = compile_source(_src("grid(1)\ny[0:1, 0:256] = x[0:1, 0:256] * w[0:256][None, :]",
                            "x: f32[M, N], w: f32[N], y: f32[M, N]"), "row.tk")
    want = random_args(m.kernel(), {"M": 3, "N": 300}, seed=1)
    got = [a.copy() for a in want]
    run_kernel(m.kernel(), want)
    select_layouts(m, Options(), DEFAULT_TARGET)
    verify(m)
    loads = [op for op in m.kernel().walk() if op.name == "tile.load"]
    block = loads[0].result.type.layout
    assert str(block) == "#blocked<1x256, vec=2, lanes=1x32, warps=1x4>"
    assert loads[1].result.type.layout == Slice(block, 0)
    (conv,) = [op for op in m.kernel().walk() if op.name == "hopper.convert_layout"]
    assert conv.result.type.layout == block
    assert register_map(conv.x.type.layout, block) == tuple(range(block.regs))
    run_kernel(m.kernel(), got)
    np.testing.assert_array_equal(got[2], want[2])


@pytest.mark.parametrize("body,message", [
    ("c[0:32, 0:64] = a[0:32, 0:64] @ b[0:64, 0:64]", "64 rows per warpgroup"),
    ("c[0:64, 0:512] = a[0:64, 0:64] @ b[0:64, 0:512]", "8 to 256 columns in steps of 8; this product has 512"),
    ("c[0:64, 0:64] = (x[0:64, 0:64] * 2.0) @ y[0:64, 0:64]", "the A operand of @ is f32: @ takes 16- and "
                                                             "8-bit operands (cast the tile first, e.g. .to(bf16))"),
    ("c[0:64, 0:64] = x[0:64, 0:64] @ y[0:64, 0:64]", "the A operand of @ is f32: @ takes 16- and 8-bit operands"),
])
def test_unsupported_is_located(body, message):
    m = compile_source(_src(body, "a: bf16[M, K], b: bf16[K, N], c: f32[M, N], x: f32[M, K], y: f32[K, N]"), "bad.tk")
    with pytest.raises(TkcUnsupportedError) as e:
        select_layouts(m, Options(), DEFAULT_TARGET)
        lower_to_hopper(m, Options(), DEFAULT_TARGET)
    assert message in str(e.value)
    assert e.value.loc is not None and e.value.loc.line >= 3


@pytest.mark.parametrize("body,params,where", [
    ("y[0:16, 0:32] = x[0:16, 0:16, 0:32].sum(1)", "x: f32[A, B, C], y: f32[A, C]", "x[0:16"),
    ("t = w[0:16, 0:32]\ny[0:16, 0:32] = (t[:, :, None] * t[:, None, :]).sum(2)", "w: f32[M, N], y: f32[M, N]",
     "None] * t"),  # the index that adds the third axis
])
def test_tiles_of_three_axes_are_refused_where_made(body, params, where):
    # The interpreter runs them; the register layouts span two axes, so compiling must refuse,
    # at the op that makes the tile, not fail inside the pass.
    src = _src(body, params)
    m = compile_source(src, "three.tk")
    with pytest.raises(TkcUnsupportedError, match="tile has 3 axes; a kernel's tiles have at most two") as e:
        select_layouts(m, Options(), DEFAULT_TARGET)
    line = src.splitlines()[e.value.loc.line - 1]
    assert line[e.value.loc.col - 1:].startswith(where)


def test_integer_column_sum_crosses_warps_exactly():
    """Partials of an integer reduction travel between warps as i32: as f32, 2^24 + 1 rounds."""
    from tkc.emulator import emulate

    src = _src("o[0:128] = x[0:64, 0:128].sum(0)", "x: i32[64, 128], o: i32[128]")
    m = compile_source(src, "colsum.tk")
    PassManager(DEFAULT_PIPELINE + ",select-layouts,lower-to-hopper,allocate-smem").run(m)
    text = print_module(m)
    assert re.search(r"hopper.reduce %\w+, %\w+ \{kind = \"sum\", axis = 0, shuffle_xor = \[[^]]*\], "
                     r"warp_xor = \[1, 2\]\}", text)
    assert "#smem<8x128xi32, k, sw0>" in text
    x = np.full((64, 128), 2**24 + 1, np.int32)
    x[::2] = -(2**24)
    o = np.zeros(128, np.int32)
    emulate(m.kernel(), [x, o], grid=(1,))
    np.testing.assert_array_equal(o, x.sum(0))


def test_a_condition_moves_between_layouts_as_i32():
    """A bool tile that threads must trade (a row sum's sign masking a vector loaded in its own
    layout) travels through shared memory as 0 or 1 in i32 and is compared with 0 where it
    arrives: shared tiles hold no 1-bit elements."""
    from tkc.emulator import emulate

    src = _src("grid(1)\nm = x[0:64, 0:64].sum(1) > 0.0\nstore(z[0:64], w[0:64] * 2.0, mask=m)",
               "x: f32[M, N], w: f32[M], z: f32[M]")
    m = compile_source(src, "cond.tk")
    PassManager(DEFAULT_PIPELINE + ",select-layouts,lower-to-hopper,allocate-smem").run(m)
    text = print_module(m)
    assert re.search(r"hopper.convert_layout %\w+, %\w+ : tile<64xi32", text), text
    assert re.search(r"tile.cmp %\w+, %\w+ \{pred = \"ne\"\} : tile<64xi1", text), text
    want = random_args(m.kernel(), {"M": 50, "N": 64}, seed=3)
    got = [a.copy() for a in want]
    run_kernel(compile_source(src, "cond.tk").kernel(), want)
    emulate(m.kernel(), got, grid=(1,))
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("body,dims", [
    # B computed in registers: stored to shared memory by every thread, then read by wgmma.
    ("t = b[0:64, 0:64]\nc[0:64, 0:64] = a[0:64, 0:64] @ (t * t)", {"M": 64, "K": 64, "N": 64}),
    # tma = False: every operand goes through registers, so strides TMA cannot take work (K = 70).
    ("c[0:64, 0:64] = a[0:64, 0:64] @ b[0:64, 0:64]", {"M": 64, "K": 70, "N": 64}),
])
def test_operands_staged_through_registers(body, dims):
    from tkc.emulator import emulate
    from tkc.interpreter import interpret_module

    pins = "tma = False" in body or dims["K"] % 8
    src = _src(body, "a: bf16[M, K], b: bf16[K, N], c: f32[M, N]" + (", tma: const = False" if pins else ""))
    ref = compile_source(src, "k.tk")
    PassManager(DEFAULT_PIPELINE).run(ref)
    m = compile_source(src, "k.tk")
    PassManager(DEFAULT_PIPELINE + ",select-layouts,lower-to-hopper,pipeline-loops,specialize-warps,cse,dce,"
                "allocate-smem").run(m)
    text = print_module(m)
    assert "hopper.smem_store" in text and "hopper.fence_proxy_async" in text
    if pins:
        assert "hopper.tma_load" not in text
    want = interpret_module(ref, dims=dims, seed=4, grid=(1,))
    got = random_args(m.kernel(), dims, 4)
    emulate(m.kernel(), got, grid=(1,))
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("body,copies", [
    # One register tile, B of two products (a complex product's real part, FFT conv's F2 @ B):
    # one shared copy.
    ("t = (b[0:64, 0:64] * b[0:64, 0:64]).to(bf16)\n"
     "c[0:64, 0:64] = a[0:64, 0:64] @ t + a[0:64, 64:128] @ t", 1),
    # A tile loaded without TMA (tma = False), transposed, the A of two products: one copy.
    ("t = a[0:64, 0:64].T\nc[0:64, 0:64] = t @ b[0:64, 0:64] + t @ b[64:128, 0:64]", 2),
])
def test_a_staged_operand_is_stored_once_for_all_its_products(body, copies):
    """(the second case stages b's two tiles and a's one)"""
    from tkc.emulator import emulate
    from tkc.interpreter import interpret_module

    pins = "tma = False" in body or ".T" in body
    src = _src(body, "a: bf16[M, K], b: bf16[K, N], c: f32[M, N]" + (", tma: const = False" if pins else ""))
    dims = {"M": 64, "K": 128, "N": 64}
    ref = compile_source(src, "k.tk")
    PassManager(DEFAULT_PIPELINE).run(ref)
    m = compile_source(src, "k.tk")
    PassManager(DEFAULT_PIPELINE + ",select-layouts").run(m)
    assert print_module(m).count("hopper.to_smem") == copies + pins
    PassManager("lower-to-hopper,pipeline-loops,specialize-warps,cse,dce,allocate-smem").run(m)
    want = interpret_module(ref, dims=dims, seed=4, grid=(1,))
    got = random_args(m.kernel(), dims, 4)
    emulate(m.kernel(), got, grid=(1,))
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-4)


def test_cluster_slots_never_share_bytes():
    """The cluster's other CTAs write a hopper.cluster_reduce's slots, and a CTA's own barriers
    do not order those writes: two slot tiles whose uses a top-level bar.sync separates (which
    lets any other two tiles share bytes) still get bytes of their own."""
    from tkc.ir.parser import parse_module
    from tkc.passes.allocate_smem import allocate_smem

    lay = "#slice<#blocked<1x256, vec=2, lanes=1x32, warps=1x4>, axis=1>"
    slot = "tile<8x128xf32, smem, #smem<8x128xf32, k, sw0>>"
    text = f"""tile.kernel @k {{consts = {{cluster = 2}}, threads = 128, cluster = 2}} {{
^(%x: tensor<f32[M]>):
  %s0 = hopper.smem_alloc {{offset = -1}} : {slot}
  %s1 = hopper.smem_alloc {{offset = -1}} : {slot}
  %f0 = hopper.mbarrier_alloc {{offset = -1}} : mbarrier
  %f1 = hopper.mbarrier_alloc {{offset = -1}} : mbarrier
  %p = tile.constant {{value = 0}} : i32
  %v = tile.constant {{value = 1.0}} : tile<1xf32, reg, {lay}>
  %a = hopper.cluster_reduce %v, %s0, %f0, %p {{kind = "sum"}} : tile<1xf32, reg, {lay}>
  hopper.barrier {{id = 0}}
  %b = hopper.cluster_reduce %a, %s1, %f1, %p {{kind = "sum"}} : tile<1xf32, reg, {lay}>
  tile.return
}}
"""
    m = parse_module(text, "k.tkir")
    allocate_smem(m, Options(), DEFAULT_TARGET)
    offsets = sorted(op.attributes["offset"] for op in m.kernel().walk() if op.name == "hopper.smem_alloc")
    assert offsets == [0, 4096]


@pytest.mark.parametrize("cols, meets", [(64, True), (128, False)])
def test_a_loop_reduction_meets_after_its_reads_when_some_threads_send_nothing(cols, meets):
    """Inside a loop, an exchange whose elements go out from a few threads (64 columns over 128
    threads: threads 64-127 hold copies) is followed by a bar.sync, so that those threads' next
    stores come after every thread's reads; one where every thread sends its own needs none."""
    from tkc.compiler import compile_kernel

    src = (pathlib.Path(__file__).resolve().parents[1] / "data" / "loopred.tk").read_text().replace("64", str(cols))
    kernel = compile_kernel(src, {}, stop="hopper", cache=False, file="loopred.tk").kernel_op
    loop = next(op for op in kernel.walk() if op.name == "tile.for")
    names = [op.name for op in loop.regions[0].block.ops]
    after = names[names.index("hopper.cluster_reduce") + 1:]
    assert ("hopper.barrier" in after) == meets
