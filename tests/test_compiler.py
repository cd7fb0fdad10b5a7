"""The compiler driver: stages, targets, the disk cache and dumps replayed on cache hits."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest

import tkc.compiler
from tkc.compiler import STAGES, Compiled, compile_kernel
from tkc.codegen.ptxas import find_ptxas, searched
from tkc.errors import TkcUsageError
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.passes.manager import PassOptions
from tkc.target import TARGETS

ROOT = Path(__file__).resolve().parents[1]
GEMM = ROOT / "examples" / "gemm.tk"
HOPPER_GEMM = ROOT / "tests" / "data" / "hopper" / "gemm.tkir"


@pytest.fixture
def ptxas() -> Path:
    found = find_ptxas()
    if found is None:
        pytest.skip(f"no ptxas found (searched {', '.join(searched())})")
    return found


def _ptx(source=GEMM, **kw) -> Compiled:
    return compile_kernel(source, stop="ptx", cache=False, **kw)


def test_every_stage_to_ptx() -> None:
    c = _ptx(consts={"BK": 32})
    assert list(c.asm) == ["tkir", "hopper", "llvm", "ptx"]
    assert c.name == "gemm" and c.target == "sm_90a" and not c.cache_hit
    assert "consts = {BM = 128, BN = 256, BK = 32}" in c.asm["tkir"] and "hopper." not in c.asm["tkir"]
    assert "hopper.wgmma" in c.asm["hopper"]
    assert ".entry gemm(" in c.asm["ptx"] and ".target sm_90a" in c.asm["ptx"]
    assert c.threads == 384 and c.smem_bytes is not None and c.smem_bytes > 0  # producer + 2 consumers
    assert [m[0] for m in c.tma_maps] == [0, 1, 2]  # a, b, and c for the epilogue's TMA store
    assert [name for name, _ in c.params] == ["a", "b", "c"]


def test_stop_at_tile_ir_needs_no_backend() -> None:
    c = compile_kernel(GEMM, stop="tkir", target="sm_100a", cache=False)
    assert list(c.asm) == ["tkir"] and c.threads is None and c.tma_maps == []


def test_each_stop_runs_the_stages_up_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver runs its declared stages in order, as far as asked, and names each text after
    its stage."""
    ran = []
    stages = [(name, lambda b, name=name, run=run: ran.append(name) or run(b)) for name, run in tkc.compiler._STAGES]
    monkeypatch.setattr(tkc.compiler, "_STAGES", tuple(stages))
    assert STAGES == ("tkir", "hopper", "llvm", "ptx", "cubin")
    for stop in STAGES[:-1]:
        ran.clear()
        c = compile_kernel(GEMM, stop=stop, ptxas=False, cache=False)
        assert ran == list(STAGES[: STAGES.index(stop) + 1]) == list(c.asm)
    ran.clear()
    c = compile_kernel(GEMM, stop="cubin", ptxas=False, cache=False)
    assert ran == list(STAGES) and "cubin" not in c.asm  # the cubin stage adds nothing without ptxas


def test_a_kernel_functions_tile_ir_comes_from_the_one_compile_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``@tkc.kernel``'s ``compile`` (the interpreter's tile IR) is compile_kernel's tile stage,
    once per (pipeline, constants), with the source locations of the function's file."""
    import sys

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from rmsnorm import rmsnorm
    finally:
        sys.path.pop(0)
    calls = []
    real = tkc.compiler.compile_kernel
    monkeypatch.setattr(tkc.compiler, "compile_kernel", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    module = rmsnorm.compile(BN=64)
    assert rmsnorm.compile(BN=64) is module and len(calls) == 1 and calls[0]["stop"] == "tkir"
    want = real(rmsnorm._text, {"BN": 64}, stop="tkir", cache=False, file=rmsnorm.file,
                first_line=rmsnorm.first_line, python_function=True).asm["tkir"]
    assert print_module(module) == want
    assert module.kernel("rmsnorm").loc.file.endswith("rmsnorm.py")
    rmsnorm.compile("canonicalize", BN=64)
    assert len(calls) == 2 and calls[1]["pipeline"] == "canonicalize"


def test_targets_without_a_backend_and_unknown_stages() -> None:
    future = dataclasses.replace(TARGETS["sm_100a"], name="sm_future", dialect="future")
    with pytest.raises(TkcUsageError, match="target sm_future: tkc has no Future lowering yet"):
        compile_kernel(GEMM, target=future, stop="ptx", cache=False)
    with pytest.raises(TkcUsageError, match="unknown target 'sm_80'"):
        compile_kernel(GEMM, target="sm_80", cache=False)
    with pytest.raises(TkcUsageError, match="unknown stage 'sass'"):
        compile_kernel(GEMM, stop="sass", cache=False)
    assert STAGES == ("tkir", "hopper", "llvm", "ptx", "cubin")


def test_tile_ir_input_is_copied_not_edited() -> None:
    module = parse_module(HOPPER_GEMM.read_text(), str(HOPPER_GEMM))
    before = print_module(module)
    c = compile_kernel(module, pipeline="", hopper_pipeline="", stop="hopper", cache=False)
    assert print_module(module) == before
    assert c.smem_bytes == 32776
    with pytest.raises(TkcUsageError, match="constants are fixed"):
        compile_kernel(module, {"BM": 64}, cache=False)


def test_from_asm_reads_the_launch_facts_from_hopper_ir() -> None:
    c = Compiled.from_asm({"hopper": HOPPER_GEMM.read_text()})
    assert (c.name, c.threads, c.smem_bytes) == ("gemm", 256, 32776)
    assert c.tma_maps == [[0, [128, 64], 128], [1, [64, 64], 128]]
    with pytest.raises(TkcUsageError, match="needs its hopper IR"):
        Compiled.from_asm({"ptx": ""})


# ------------------------------------------------------------------ the cache
def _cached(tmp_path: Path, stream: io.StringIO | None = None, dump_dir: Path | None = None,
            **kw) -> Compiled:
    opts = PassOptions(dump_after=("allocate-smem",) if dump_dir is None else (), stream=stream,
                       dump_dir=dump_dir, reproducer_dir=None)
    return compile_kernel(GEMM, stop="ptx", cache_dir=tmp_path / "cache", pass_options=opts, **kw)


def test_second_compile_is_a_hit_and_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _cached(tmp_path)
    assert not first.cache_hit and first.cache_key

    def no_passes(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cache hit ran passes")

    monkeypatch.setattr(tkc.compiler, "_run_passes", no_passes)
    monkeypatch.setattr(tkc.compiler, "_frontend", no_passes)
    second = _cached(tmp_path)
    assert second.cache_hit and second.cache_key == first.cache_key
    assert second.asm == first.asm
    assert (second.threads, second.smem_bytes, second.tma_maps) == (first.threads, first.smem_bytes,
                                                                    first.tma_maps)
    with pytest.raises(AssertionError, match="ran passes"):
        _cached(tmp_path, consts={"BK": 32})  # other constants: another entry


def test_dumps_replay_on_a_hit(tmp_path: Path) -> None:
    out1, out2 = io.StringIO(), io.StringIO()
    _cached(tmp_path, stream=out1)
    hit = _cached(tmp_path, stream=out2)
    assert hit.cache_hit
    assert "IR Dump After allocate-smem (22)" in out1.getvalue()
    assert out2.getvalue() == out1.getvalue()


def test_dump_files_replay_on_a_hit_numbered_across_both_pipelines(tmp_path: Path) -> None:
    _cached(tmp_path, dump_dir=tmp_path / "d1")
    hit = _cached(tmp_path, dump_dir=tmp_path / "d2")
    assert hit.cache_hit
    names = sorted(p.name for p in (tmp_path / "d1").iterdir())
    assert names == ["00-input.tkir", "01-canonicalize.tkir", "02-licm.tkir", "03-cse.tkir", "04-dce.tkir",
                     "05-decompose.tkir", "06-merge-steps.tkir", "07-persistent.tkir", "08-order-memory.tkir",
                     "09-select-layouts.tkir", "10-lower-to-hopper.tkir", "11-pipeline-loops.tkir",
                     "12-specialize-warps.tkir", "13-transpose-in-producer.tkir", "14-issue-ahead.tkir",
                     "15-defer-last.tkir", "16-overlap-products.tkir", "17-multicast.tkir", "18-prefetch-loads.tkir",
                     "19-stage-loads.tkir", "20-merge-reductions.tkir", "21-merge-barriers.tkir",
                     "22-buffer-operands.tkir", "23-count-divisions.tkir", "24-cse.tkir", "25-dce.tkir",
                     "26-allocate-smem.tkir"]
    for name in names:
        assert (tmp_path / "d2" / name).read_text() == (tmp_path / "d1" / name).read_text()
    parse_module((tmp_path / "d1" / "26-allocate-smem.tkir").read_text())  # dumps read back


def test_a_different_dump_request_compiles_again(tmp_path: Path) -> None:
    _cached(tmp_path, stream=io.StringIO())
    out = io.StringIO()
    c = compile_kernel(GEMM, stop="ptx", cache_dir=tmp_path / "cache",
                       pass_options=PassOptions(dump_after=("lower-to-hopper",), stream=out))
    assert not c.cache_hit and "IR Dump After lower-to-hopper (6)" in out.getvalue()


def test_pass_timing_bypasses_the_cache(tmp_path: Path) -> None:
    _cached(tmp_path)
    out = io.StringIO()
    c = compile_kernel(GEMM, stop="ptx", cache_dir=tmp_path / "cache",
                       pass_options=PassOptions(dump_after=("allocate-smem",), timing=True, stream=out))
    assert not c.cache_hit and c.cache_key is None
    assert "tkc pass timing" in out.getvalue()


def test_dumps_of_a_failing_pass_are_shown(tmp_path: Path) -> None:
    out = io.StringIO()
    opts = PassOptions(dump_after=("all",), stream=out, reproducer_dir=None)
    with pytest.raises(TkcUsageError, match="lower-to-hopper runs after select-layouts"):
        # lower-to-hopper before select-layouts: the layouts it needs are missing
        compile_kernel(GEMM, stop="hopper", hopper_pipeline="lower-to-hopper", pass_options=opts, cache=False)
    assert "IR Dump After dce (4)" in out.getvalue()


def test_lower_to_hopper_runs_once(tmp_path: Path) -> None:
    with pytest.raises(TkcUsageError, match="lower-to-hopper runs once: this kernel is hopper IR already"):
        compile_kernel(GEMM, stop="hopper", hopper_pipeline="select-layouts,lower-to-hopper,lower-to-hopper",
                       cache=False)


def test_loading_a_file_without_a_kernel_says_so(tmp_path: Path) -> None:
    import tkc
    from tkc.errors import TkcSyntaxError

    path = tmp_path / "none.tk"
    path.write_text("def f(x):\n    return x\n")
    with pytest.raises(TkcSyntaxError, match="no kernel found: mark a function with @kernel") as e:
        tkc.load(path)
    assert e.value.loc.line == 1


def test_a_string_naming_a_tk_file_compiles_the_file(tmp_path: Path) -> None:
    """A one-line string ending in .tk is a file's name (source text has lines): it compiled as
    source and failed at its first character ("unexpected '/'")."""
    c = compile_kernel(str(GEMM), {}, stop="tkir", cache=False)
    assert c.asm["tkir"] == compile_kernel(GEMM, {}, stop="tkir", cache=False).asm["tkir"]
    with pytest.raises(TkcUsageError, match="cannot read .*missing.tk: No such file"):
        compile_kernel(str(tmp_path / "missing.tk"), {}, stop="tkir", cache=False)


def test_version_changes_with_the_compiler() -> None:
    import tkc

    v = tkc.compiler.compiler_version()
    assert v.startswith(tkc.__version__ + "+") and "llvmlite-" in v


def test_remarks_survive_the_cache(tmp_path: Path) -> None:
    consts = {"BM": 128, "BN": 256, "BK": 256}  # no room for a second stage: a remark at the K loop
    first = compile_kernel(GEMM, consts, stop="hopper", cache_dir=tmp_path)
    assert len(first.remarks) == 1 and ": note: " in first.remarks[0]
    hit = compile_kernel(GEMM, consts, stop="hopper", cache_dir=tmp_path)
    assert hit.cache_hit and hit.remarks == first.remarks


# ------------------------------------------------------------------ ptxas
def test_cubin_and_resources_survive_the_cache(tmp_path: Path, ptxas: Path) -> None:
    first = compile_kernel(GEMM, cache_dir=tmp_path, ptxas=True)
    assert first.asm["cubin"][:4] == b"\x7fELF"
    assert first.resources is not None and first.resources.kernel == "gemm" and first.resources.registers > 0
    hit = compile_kernel(GEMM, cache_dir=tmp_path, ptxas=True)
    assert hit.cache_hit and hit.asm["cubin"] == first.asm["cubin"] and hit.resources == first.resources


def test_a_lost_cubin_is_a_miss(tmp_path: Path, ptxas: Path) -> None:
    first = compile_kernel(GEMM, cache_dir=tmp_path, ptxas=True)
    for p in tmp_path.rglob("kernel.cubin"):
        p.unlink()
    again = compile_kernel(GEMM, cache_dir=tmp_path, ptxas=True)
    assert not again.cache_hit and again.asm["cubin"] == first.asm["cubin"]


def test_ptxas_required_but_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import tkc.codegen.ptxas as ptxas_mod

    monkeypatch.setattr(ptxas_mod, "find_ptxas", lambda env=None: None)
    with pytest.raises(TkcUsageError, match="no ptxas found; searched:\n  TKC_PTXAS\n  PATH"):
        compile_kernel(GEMM, ptxas=True, cache=False)
    assert "cubin" not in compile_kernel(GEMM, cache=False).asm  # ptxas=None: PTX only


def test_importing_tkc_loads_neither_torch_nor_the_driver_layer() -> None:
    """``import tkc`` (and so ``tkc compile``) needs neither torch nor the CUDA driver layer;
    a checkout run without an install maps ``tkc.runtime`` only after ``import tkc``."""
    import subprocess
    import sys

    code = ("import sys, tkc; "
            "print(sorted(m for m in ('torch', 'tkc.runtime.launch', 'tkc.runtime.driver') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_constant_takes_values_of_its_default_kind_from_python() -> None:
    from pathlib import Path

    from tkc.errors import TkcUsageError

    attn = Path(__file__).resolve().parents[1] / "examples" / "attn.tk"
    with pytest.raises(TkcUsageError, match=r"causal=2: constant 'causal' of kernel 'attn' takes true or false"):
        compile_kernel(attn, {"causal": 2}, stop="tkir", cache=False)


DEFAULTS = """@kernel
def k(x: f32[M, N], y: f32[M, N], D: const = 64, BM: const = 32 if D == 64 else 16, BN: const = BM * 2):
    grid(cdiv(M, BM))
    r = program_id(0) * BM
    y[r:r+BM, 0:BN] = x[r:r+BM, 0:BN]
"""


@pytest.mark.parametrize("given, want", [({}, {"BM": 32, "BN": 64}), ({"D": 128}, {"BM": 16, "BN": 32}),
                                         ({"BM": 48}, {"BM": 48, "BN": 96}), ({"BN": 16}, {"BM": 32, "BN": 16})])
def test_a_constant_default_may_use_the_constants_before_it(given: dict, want: dict) -> None:
    consts = compile_kernel(DEFAULTS, given, stop="tkir", cache=False).kernel_op.attributes["consts"]
    assert {k: consts[k] for k in want} == want


def test_a_constant_default_cannot_use_a_later_constant() -> None:
    from device_checks import assert_refused

    from tkc.errors import TkcNameError

    src = DEFAULTS.replace("D: const = 64, BM: const = 32 if D == 64 else 16", "BM: const = 32 if D == 64 else 16, "
                           "D: const = 64")
    assert_refused(src, TkcNameError, "'D'", 2, stop="tkir")


def _straight_line(n: int) -> str:
    lines = ["@kernel", "def k(x: f32[M, N], y: f32[M, N]):", "    grid(cdiv(M, 64))", "    r = program_id(0) * 64",
             "    t = x[r:r+64, 0:64]"]
    lines += [f"    t = t * 1.0001 + {i % 7}.0" for i in range(n)]
    return "\n".join([*lines, "    y[r:r+64, 0:64] = t", ""])


def test_compile_time_grows_linearly_with_kernel_length() -> None:
    """Straight-line tile code to tile IR: four times the lines may take about four times as
    long, not sixteen (replacing a value's uses, erasing an op and naming values once took a
    pass over the whole kernel each; 2,000 lines took 53 s, 10,000 lines now take about 8)."""
    import time

    def seconds(n: int) -> float:
        src = _straight_line(n)
        best = float("inf")
        for _ in range(2):
            t = time.perf_counter()
            compile_kernel(src, stop="tkir", cache=False)
            best = min(best, time.perf_counter() - t)
        return best

    small, large = seconds(500), seconds(2000)
    assert large < 8 * small, f"500 lines: {small:.2f} s, 2000 lines: {large:.2f} s (quadratic would be 16x)"


def test_a_register_tile_far_too_large_is_refused_at_once() -> None:
    from tkc.errors import TkcUnsupportedError

    src = """@kernel
def big(x: f32[M, N], y: f32[M, N]):
    grid(1)
    y[0:4096, 0:4096] = x[0:4096, 0:4096] * 2.0
"""
    with pytest.raises(TkcUnsupportedError, match=r"4096x4096 f32 tile would hold 131072 values in each of the "
                                                  r"program's 128 threads' registers") as e:
        compile_kernel(src, stop="hopper", cache=False)  # refused by select-layouts, before any code generation
    assert e.value.loc.line == 4


# ------------------------------------------------------------------ warps of kernels without products
_WIDE = """
@kernel
def scale(x: f32[M, N], y: f32[M, N], BM: const = 128, BN: const = 256):
    grid(cdiv(M, BM), cdiv(N, BN))
    r = program_id(0) * BM
    c = program_id(1) * BN
    y[r:r+BM, c:c+BN] = x[r:r+BM, c:c+BN] * 2.0
"""


def test_a_kernel_without_products_that_spills_on_four_warps_gets_more(tmp_path: Path, ptxas: Path) -> None:
    # 128 x 256 f32 values over one warpgroup are 256 a thread: ptxas spills them on 4 warps
    pinned = compile_kernel(_WIDE, {"warps": 4}, cache=False, ptxas=True)
    assert pinned.resources.spills and pinned.kernel_op.attributes["threads"] == 128 and not pinned.remarks
    wide = compile_kernel(_WIDE, cache_dir=tmp_path, ptxas=True)
    assert not wide.resources.spills and wide.kernel_op.attributes["threads"] == 256
    assert len(wide.remarks) == 1 and "spills" in wide.remarks[0] and "compiled on 8 warps instead" in wide.remarks[0]
    assert "<string>:3:1: note: kernel 'scale'" in wide.remarks[0]
    hit = compile_kernel(_WIDE, cache_dir=tmp_path, ptxas=True)  # the wider kernel is what the cache keeps
    assert hit.cache_hit and hit.asm["cubin"] == wide.asm["cubin"] and hit.remarks == wide.remarks
    # the PTX stage makes the same choice; stages before ptxas cannot, and keep the default
    assert compile_kernel(_WIDE, stop="ptx", cache=False).asm["ptx"] == wide.asm["ptx"]
    assert compile_kernel(_WIDE, stop="hopper", cache=False).kernel_op.attributes["threads"] == 128


def test_a_kernel_that_fits_four_warps_keeps_them(ptxas: Path) -> None:
    narrow = compile_kernel(_WIDE, {"BN": 64}, cache=False, ptxas=True)
    assert not narrow.resources.spills and narrow.kernel_op.attributes["threads"] == 128 and not narrow.remarks


def test_the_cli_says_when_a_kernel_gets_more_warps(tmp_path: Path, ptxas: Path) -> None:
    from click.testing import CliRunner

    from tkc.cli import cli

    src = tmp_path / "scale.tk"
    src.write_text(_WIDE)
    r = CliRunner().invoke(cli, ["compile", str(src), "-o", str(tmp_path / "scale.ptx"), "--resource-usage"])
    assert r.exit_code == 0, r.output
    assert f"{src}:3:1: note: kernel 'scale' spills" in r.output and "256 threads" in r.output
    assert "0 B spill stores" in r.output


def test_numpy_constants_key_the_cache_as_the_values_they_are(tmp_path: Path) -> None:
    import numpy as np

    first = compile_kernel(GEMM, {"BM": np.int64(64)}, stop="ptx", cache_dir=tmp_path)
    again = compile_kernel(GEMM, {"BM": 64}, stop="ptx", cache_dir=tmp_path)
    assert again.cache_hit and again.asm["ptx"] == first.asm["ptx"]


TWO_KERNELS = """@kernel
def good(x: f32[N], y: f32[N]):
    grid(cdiv(N, 128))
    i = program_id(0)
    y[i*128:(i+1)*128] = x[i*128:(i+1)*128] * 2.0

@kernel
def bad(x: f32[N], y: f32[N]):
    grid(cdiv(N, 128))
    i = program_id(0)
    y[i*128:(i+1)*128] = x[i*128:(i+1)*128] @ x[i*128:(i+1)*128]
"""


def test_one_kernel_of_a_file_is_lowered_alone(tmp_path: Path) -> None:
    """Compiling (or loading) one kernel of a file lowers that kernel only: another kernel's
    error is that kernel's; a name the file lacks still lists the ones it has."""
    assert "tile.kernel @good" in compile_kernel(TWO_KERNELS, kernel="good", stop="tkir", cache=False).asm["tkir"]
    with pytest.raises(tkc.errors.TkcError, match=r"<string>:11:"):
        compile_kernel(TWO_KERNELS, kernel="bad", stop="tkir", cache=False)
    with pytest.raises(tkc.errors.TkcUsageError, match=r"has no kernel 'neither' \(its kernels: good, bad\)"):
        compile_kernel(TWO_KERNELS, kernel="neither", stop="tkir", cache=False)
    path = tmp_path / "two.tk"
    path.write_text(TWO_KERNELS)
    assert [op.attributes["sym_name"] for op in tkc.load(path, "good").lower().ops] == ["good"]
