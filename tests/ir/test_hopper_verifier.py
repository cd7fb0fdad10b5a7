"""The hopper dialect's verifier refuses, before anything runs, what the emulator would refuse on
every run: hand edits of real hopper IR (``examples/gemm.tk`` through the whole pipeline, its
``loc(...)`` annotations stripped so that messages point into the ``.tkir`` text), each refused
at the edited line with a message that names the allocation, its bytes and what to change.
``tests/emulator/test_machine*.py`` check that the emulator still refuses the same edits when it
runs unverified IR.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tkc.cli import cli
from tkc.compiler import compile_kernel
from tkc.emulator import emulate_module
from tkc.errors import TkcEmulatorError, TkcVerifyError
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HAND_GEMM = (ROOT / "tests" / "data" / "hopper" / "gemm.tkir").read_text()
LOC = re.compile(r' loc\("[^"]*":\d+:\d+\)')


def hopper_ir(example: str, **consts: object) -> str:
    """An example's hopper IR as the pipeline leaves it, without ``loc(...)`` annotations."""
    return LOC.sub("", compile_kernel(EXAMPLES / example, consts, stop="hopper").asm["hopper"])


@pytest.fixture(scope="module")
def gemm() -> str:
    return hopper_ir("gemm.tk")


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} is not in the IR exactly once"
    return text.replace(old, new)


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def refused(text: str, message: str, at: str) -> TkcVerifyError:
    """``text`` is refused with ``message`` (a regex) at the line holding ``at``."""
    with pytest.raises(TkcVerifyError) as e:
        verify(parse_module(text, "k.hopper.tkir"))
    assert re.search(message, e.value.message), e.value.message
    assert e.value.loc is not None and e.value.loc.line == line_of(text, at), str(e.value)
    return e.value


@pytest.mark.parametrize("example, consts", [
    ("gemm.tk", {}), ("gemm.tk", {"BN": 128, "stages": 2}), ("gemm_fp8.tk", {}), ("attn.tk", {}),
    ("attn.tk", {"causal": True}), ("layernorm.tk", {}), ("softmax.tk", {}), ("softmax_split.tk", {}),
    ("layernorm_split.tk", {}),
])
def test_what_the_pipeline_makes_verifies(example: str, consts: dict) -> None:
    """The baseline of every edit below: the pipeline's own output passes (it is verified after
    every pass, so a compilation that reaches hopper IR already says so; this says it of the
    text a user edits, read back)."""
    verify(parse_module(hopper_ir(example, **consts), "k.hopper.tkir"))


# ---------------------------------------------------------------- shared memory
RING = "%empty = hopper.mbarrier_alloc {offset = 229376, stages = 4}"


def test_a_ring_past_smem_bytes_names_its_bytes_and_the_fixes(gemm: str) -> None:
    bad = edit(gemm, RING, RING.replace("stages = 4", "stages = 5000"))
    e = refused(bad, r"%empty \(a ring of 5000 mbarriers of 8 B\) takes bytes \[229376, 269376\), past the "
                     r"kernel's smem_bytes = 229440: move it to an offset of at most 189440 or lower stages to at "
                     r"most 8$", at="%empty = ")
    assert e.message.startswith("'hopper.mbarrier_alloc': ")


def test_a_ring_of_10_to_the_20_stages_is_refused_at_once(gemm: str) -> None:
    bad = edit(gemm, RING, RING.replace("stages = 4", "stages = 100000000000000000000"))
    t = time.perf_counter()
    refused(bad, r"a ring of 100000000000000000000 mbarriers.* past the kernel's smem_bytes = 229440: "
                     r"lower stages to at most 8$", at="%empty = ")
    assert time.perf_counter() - t < 5


def test_the_emulator_refuses_the_same_ring(gemm: str) -> None:
    bad = edit(gemm, RING, RING.replace("stages = 4", "stages = 5000"))
    with pytest.raises(TkcEmulatorError, match=r"is outside the kernel's smem_bytes = 229440"):
        emulate_module(parse_module(bad, "k.hopper.tkir"), dims={"M": 64, "N": 64, "K": 64})


def test_a_tile_past_smem_bytes(gemm: str) -> None:
    bad = edit(gemm, "%c_out1 = hopper.smem_alloc {offset = 212992}", "%c_out1 = hopper.smem_alloc {offset = 221184}")
    refused(bad, r"%c_out1 \(a #smem<128x64xbf16, k, sw128> tile of 16384 B\) takes bytes \[221184, 237568\), past "
                 r"the kernel's smem_bytes = 229440: move it to an offset of at most 213056$", at="%c_out1 = ")
    bad = edit(gemm, "smem_bytes = 229440", "smem_bytes = 229400")
    refused(bad, r"%empty \(a ring of 4 mbarriers of 8 B\) takes bytes \[229376, 229408\), past the kernel's "
                 r"smem_bytes = 229400: move it to an offset of at most 229368, lower stages to at most 3 or raise "
                 r"smem_bytes to 229408$",
            at="%empty = ")


def test_a_ring_that_cannot_fit_anywhere(gemm: str) -> None:
    bad = edit(gemm, "%b_smem = hopper.smem_alloc {offset = 0, stages = 4}",
               "%b_smem = hopper.smem_alloc {offset = 0, stages = 8}")
    refused(bad, r"%b_smem \(a ring of 8 #smem<64x256xbf16, mn, sw128> tiles, 32768 B apart\) takes bytes \[0, "
                 r"262144\), past the kernel's smem_bytes = 229440: lower stages to at most 7$", at="%b_smem = ")


INIT = "hopper.mbarrier_init %empty {count = 2}"
FULL_INIT = "  hopper.mbarrier_init %a_b_full {count = 1}\n"
WAIT = "hopper.mbarrier_wait %36, %35"

#: (what the edit shows, old text, new text, message regex, text on the line refused).  In the
#: dump, %0 is the constant 4, %36 stage %32 of the 4-stage ring %empty.
EDITS = [
    ("smem_bytes beyond what a CTA may have", "smem_bytes = 229440", "smem_bytes = 300000",
     r"'tile.kernel': smem_bytes = 300000: a CTA has 0 to 232448 B of dynamic shared memory on sm_90a",
     "tile.kernel @gemm"),
    ("no offset once smem_bytes is set", "%c_out0 = hopper.smem_alloc {offset = 196608}",
     "%c_out0 = hopper.smem_alloc {offset = -1}", r"%c_out0 .* has no offset, but the kernel's smem_bytes is set",
     "%c_out0 = "),
    ("an mbarrier on a tile", RING, RING.replace("offset = 229376", "offset = 196608"),
     r"%c_out0 \(a #smem<128x64xbf16, k, sw128> tile of 16384 B\) at bytes \[196608, 212992\) overlaps %empty "
     r"\(a ring of 4 mbarriers of 8 B\) at \[196608, 196640\): an mbarrier shares its bytes with nothing; give "
     r"one of them another offset", "%c_out0 = "),
    ("two mbarriers on the same bytes", "%a_b_full = hopper.mbarrier_alloc {offset = 229408",
     "%a_b_full = hopper.mbarrier_alloc {offset = 229400",
     r"%a_b_full .* at bytes \[229400, 229432\) overlaps %empty .* at \[229376, 229408\)", "%a_b_full = "),
    ("a tile's alignment", "%c_out0 = hopper.smem_alloc {offset = 196608}",
     "%c_out0 = hopper.smem_alloc {offset = 196672}", r"offset 196672 is not 1024-B aligned", "%c_out0 = "),
    ("an mbarrier's alignment", RING, RING.replace("229376", "229380"), r"offset 229380 is not 8-B aligned",
     "%empty = "),
    ("no arrivals", INIT, INIT.replace("2", "0"), r"count = 0: an mbarrier counts 1 to 1048575 arrivals a phase",
     INIT[:-12]),
    ("too many arrivals", INIT, INIT.replace("2", str(1 << 20)),
     r"count = 1048576: an mbarrier counts 1 to 1048575 arrivals a phase", INIT[:-12]),
    ("more bytes than a tx-count holds", "hopper.expect_tx %37 {bytes = 49152}",
     "hopper.expect_tx %37 {bytes = 1048576}",
     r"bytes = 1048576: an mbarrier's tx-count holds less than 1048576 bytes", "hopper.expect_tx %37"),
    ("a constant stage index past the ring", "%36 = hopper.stage %empty, %32", "%36 = hopper.stage %empty, %0",
     r"'hopper.stage': stage 4 of the 4-stage ring %empty is outside \[0, 4\): index it with 0 to 3", "%36 = "),
    ("a constant parity of 4", WAIT, WAIT.replace("%35", "%0"), r"parity is an i32 \(0 or 1\)", WAIT[:-5]),
    ("a ring used without hopper.stage", WAIT, WAIT.replace("%36", "%empty"),
     r"'hopper.mbarrier_wait': takes the ring %empty \(a ring of 4 mbarriers of 8 B\) itself; use one stage of it "
     r"through hopper.stage", "hopper.mbarrier_wait %empty"),
    ("an mbarrier nobody initializes", "  " + INIT + "\n", "",
     r"'hopper.mbarrier_wait': uses %empty .*, which no hopper.mbarrier_init initializes: add "
     r"'hopper.mbarrier_init %empty \{count = N\}'", WAIT),
    ("an mbarrier initialized twice", FULL_INIT,
     FULL_INIT + FULL_INIT.replace("%a_b_full {count = 1}", "%a_b_full {count = 2} // again"),
     r"initializes %a_b_full .* again \(it was at k.hopper.tkir:\d+:\d+\)", "// again"),
    ("a tensor map that does not fit its tile", "[1, [64, 64], 128]", "[1, [64, 64], 64]",
     r"tensor map 1 has box \[64, 64\] and swizzle 64, but #smem<64x256xbf16, mn, sw128> needs box \[64, 64\] and "
     r"swizzle 128: make tma_maps\[1\] \[1, \[64, 64\], 128\]", "{map = 1,"),
    ("a tensor map the kernel does not have", "%40, %37, %38, %26 {map = 1,", "%40, %37, %38, %26 {map = 7,",
     r"names tensor map 7, but the kernel's tma_maps has 3", "{map = 7,"),
    ("threads that are not a CTA's", "threads = 384", "threads = 1280",
     r"threads = 1280: a CTA has a positive multiple of 128 threads, at most 1024", "tile.kernel @gemm"),
    ("role budgets over the CTA's registers", "regs = 24, warps = 1", "regs = 40, warps = 1",
     r"'hopper.role': kernel @gemm: roles need 66560 registers, the CTA holds 64512 .* setmaxnreg.inc would wait "
     r"forever", 'name = "producer"'),
    ("a layout over more threads than its role", "first = 1, warpgroups = 2, regs = 240",
     "first = 1, warpgroups = 1, regs = 240",
     r"tile<128x256xf32, reg, #wgmma_acc<256, wg=2>> spans 256 threads, but role 'consumers' runs it on 128",
     "#wgmma_acc<256, wg=2>"),
]


@pytest.mark.parametrize("what, old, new, message, at", EDITS, ids=[e[0] for e in EDITS])
def test_an_edit_is_refused_at_its_line(gemm: str, what: str, old: str, new: str, message: str, at: str) -> None:
    refused(edit(gemm, old, new), message, at)


def test_a_wgmma_result_is_read_after_its_wait() -> None:
    bad = edit(HAND_GEMM, "    %acc_3 = hopper.wgmma_wait",
               "    %early = tile.cast %d : tile<128x128xbf16, reg, #wgmma_acc<128, wg=2>>\n"
               "    %acc_3 = hopper.wgmma_wait")
    refused(bad, r"'tile.cast': reads %d, the result of the hopper.wgmma at k.hopper.tkir:\d+:\d+, before a "
                 r"hopper.wgmma_wait", at="%early = ")
    # Carried out of the loop unwaited, it is still pending there.
    unwaited = edit(edit(HAND_GEMM, "tile.yield %acc_3, %phase_2", "tile.yield %d, %phase_2"),
                    "    %acc_3 = hopper.wgmma_wait %d {pending = 0} : tile<128x128xf32, reg, #wgmma_acc<128, wg=2>>\n",
                    "")
    refused(unwaited, r"'tile.cast': reads %acc_1, the result of the hopper.wgmma", at="%out = tile.cast")


# ---------------------------------------------------------------- the command line
def test_compile_refuses_the_file_with_its_line_and_a_caret(gemm: str, tmp_path: Path) -> None:
    bad = tmp_path / "k.hopper.tkir"
    bad.write_text(edit(gemm, RING, RING.replace("stages = 4", "stages = 5000")))
    r = CliRunner().invoke(cli, ["compile", str(bad), "--pipeline", "", "--hopper-pipeline", "",
                                 "-o", str(tmp_path / "k.cubin")])
    assert r.exit_code == 1
    line = line_of(bad.read_text(), "%empty = ")
    assert r.stderr.startswith(f"{bad}:{line}:3: error: 'hopper.mbarrier_alloc': %empty (a ring of 5000 mbarriers")
    assert f"  {RING.replace('stages = 4', 'stages = 5000')} : mbarrier\n  ^" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "k.cubin").exists()


# ---------------------------------------------------------------- register moves
VEC8 = "#blocked<1x4096, vec=8, lanes=1x32, warps=1x4>"
VEC4 = "#blocked<1x4096, vec=4, lanes=1x32, warps=1x4>"


@pytest.fixture(scope="module")
def softmax() -> str:
    return hopper_ir("softmax.tk")


def test_a_broadcast_is_a_register_copy() -> None:
    # 16 rows a program: each row's statistic, a [16, 1] keep slice, broadcast along its row.
    rows8, rows4 = (f"#blocked<16x256, vec={v}, lanes=1x32, warps=4x1>" for v in (8, 4))
    text = hopper_ir("softmax.tk", BM=16, BN=256)
    line = next(s for s in text.splitlines() if "= tile.expand_dims" in s)
    bad = edit(text, line, line.replace(rows8, rows4))
    refused(bad, rf"'tile.broadcast': broadcasts #slice<{rows4}, axis=1, keep> to {rows8}: the source must be a "
                 rf"keep slice of the result's layout", at="= tile.broadcast")


def test_one_element_every_thread_holds_broadcasts_to_any_layout(softmax: str) -> None:
    # One row a program: its statistic is one element, held by every thread in one register, so
    # it broadcasts to any layout of the same threads (what a 1-D row's broadcast relies on).
    line = next(s for s in softmax.splitlines() if "= tile.expand_dims" in s)
    verify(parse_module(edit(softmax, line, line.replace(VEC8, VEC4)), "k.hopper.tkir"))


def test_a_conversion_without_scratch_stays_in_its_threads() -> None:
    rows = "#blocked<64x64, vec=4, lanes=2x16, warps=4x1>"
    cols = "#blocked<64x64, vec=4, lanes=4x8, warps=4x1>"
    # After lower-to-hopper (tma_maps set); select-layouts leaves conversions for it to give scratch.
    text = f"""tile.kernel @k {{threads = 128, tma_maps = []}} {{
^(%x: tensor<f32[M, N]>, %y: tensor<f32[M, N]>):
  %c0 = tile.constant {{value = 0}} : i32
  %t = hopper.load %x, %c0, %c0 {{box = [64, 64]}} : tile<64x64xf32, reg, {rows}>
  %u = hopper.convert_layout %t : tile<64x64xf32, reg, {cols}>
  hopper.store %y, %u, %c0, %c0 {{box = [64, 64]}}
  tile.return
}}
"""
    refused(text, rf"{re.escape(rows)} -> {re.escape(cols)} needs values from other threads: give it a shared "
                  r"scratch tile", at="%u = ")
    verify(parse_module(text.replace(cols, rows)))
    verify(parse_module(text.replace(", tma_maps = []", "")))  # before lower-to-hopper
