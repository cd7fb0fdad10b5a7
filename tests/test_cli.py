"""The ``tkc`` command line: subcommands, flags and the error policy."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from device_checks import RUN_FAST, RUN_KERNELS, lowered_examples

import tkc
import tkc.cli
from tkc.cli import cli
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
GEMM_TKIR = ROOT / "tests" / "passes" / "pipeline" / "gemm_tiled.tkir"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("TKC_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def tkc_cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def test_version() -> None:
    r = tkc_cli("--version")
    assert r.exit_code == 0
    assert tkc.__version__ in r.stdout


def test_compile_prints_the_passes_remarks_to_stderr(tmp_path: Path) -> None:
    out = tmp_path / "g.ptx"
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-D", "BM=128", "-D", "BN=256", "-D", "BK=256", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert r.stdout == "" and out.exists()
    assert re.match(r".*gemm.tk:\d+:\d+: note: this loop's tile loads stay one at a time", r.stderr), r.stderr
    assert "for k in range" in r.stderr  # the line, with a caret under it


def test_run_prints_the_remarks_on_the_kernel_it_ran() -> None:
    path = ROOT / "tests" / "data" / "gemm_under_if.tk"
    r = tkc_cli("run", str(path), "--backend", "emulate", "--check", "--dim", "M=130", "--dim", "N=128",
                "--dim", "K=64")
    assert r.exit_code == 0, r.output
    assert f"{path}:10:9: note: this loop's tile loads stay one at a time" in r.stderr, r.stderr
    assert "note:" not in tkc_cli("run", str(path), "--backend", "interpret", "--dim", "M=130", "--dim", "N=128",
                                  "--dim", "K=64").stderr  # the interpreter runs no compiled kernel


def test_console_script_runs() -> None:
    # The installed entry point, through a real process: exit codes and streams included.
    code = "from tkc.cli import main; main()"
    r = subprocess.run([sys.executable, "-c", code, "compile", str(EXAMPLES / "gemm.tk"), "-D", "BM=32",
                        "--target", "sm_100a", "--emit", "ptx"], capture_output=True, text=True)  # refused
    assert r.returncode == 1
    assert r.stdout == ""
    assert "Traceback" not in r.stderr


# ---------------------------------------------------------------------- opt
def test_opt_runs_passes_and_prints_ir() -> None:
    r = tkc_cli("opt", str(GEMM_TKIR), "-p", "canonicalize,cse,dce", "--no-locs")
    assert r.exit_code == 0, r.stderr
    assert "loc(" not in r.stdout
    verify(parse_module(r.stdout))


def test_opt_takes_a_tk_source_through_the_frontend() -> None:
    r = tkc_cli("opt", str(EXAMPLES / "gemm.tk"), "-p", "canonicalize", "--no-locs")
    assert r.exit_code == 0, r.stderr
    assert "tile.kernel @gemm" in r.stdout
    verify(parse_module(r.stdout))


def test_opt_reads_stdin_and_writes_a_file(tmp_path: Path) -> None:
    out = tmp_path / "out.tkir"
    r = CliRunner().invoke(cli, ["opt", "-", "-p", "cse", "-o", str(out)], input=GEMM_TKIR.read_text())
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""
    verify(parse_module(out.read_text()))


def test_opt_on_bad_ir_points_at_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tkir"
    bad.write_text("tile.kernel @k {\n^():\n  %x = tile.frobnicate : i32\n  tile.return\n}\n")
    r = tkc_cli("opt", str(bad), "-p", "cse")
    assert r.exit_code == 1
    assert r.stderr.startswith(f"{bad}:3:8: error: unknown op 'tile.frobnicate'")
    assert "  %x = tile.frobnicate : i32\n" in r.stderr and "^" in r.stderr
    assert "Traceback" not in r.stderr


def test_opt_unknown_pass() -> None:
    r = tkc_cli("opt", str(GEMM_TKIR), "-p", "cse,fold")
    assert r.exit_code == 1
    assert ("unknown pass 'fold'; known passes: allocate-smem, buffer-operands, canonicalize, count-divisions, cse, "
            "dce, decompose, defer-last, issue-ahead, licm") in r.stderr


def test_opt_dump_flags_and_timing(tmp_path: Path) -> None:
    r = tkc_cli("opt", str(GEMM_TKIR), "-p", "canonicalize,cse", "--dump-ir-after", "all",
                "--dump-ir-before", "cse", "--pass-timing")
    assert r.exit_code == 0, r.stderr
    assert "// -----// IR Dump After canonicalize (1) //----- //" in r.stderr
    assert "// -----// IR Dump Before cse (2) //----- //" in r.stderr
    assert "// -----// IR Dump After cse (2) //----- //" in r.stderr
    assert "total" in r.stderr
    r = tkc_cli("opt", str(GEMM_TKIR), "-p", "canonicalize,cse", "--dump-dir", str(tmp_path / "d"))
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [
        "00-input.tkir", "01-canonicalize.tkir", "02-cse.tkir"]


def test_env_dump_ir() -> None:
    r = tkc_cli("opt", str(GEMM_TKIR), "-p", "canonicalize,cse", env={"TKC_DUMP_IR": "cse"})
    assert r.exit_code == 0, r.stderr
    assert "IR Dump After cse (2)" in r.stderr
    assert "IR Dump After canonicalize" not in r.stderr


# ------------------------------------------------------------------ compile
@pytest.mark.parametrize("output, emit, marker", [
    ("gemm.tkir", None, "tile.mma"),
    ("gemm.hopper.tkir", None, "hopper.wgmma"),
    ("gemm.ll", None, 'target triple = "nvptx64-nvidia-cuda"'),
    ("gemm.ptx", None, ".entry gemm("),
    ("gemm.txt", None, "tile.mma"),           # other suffixes: tile IR, as before
    ("gemm.txt", "ptx", ".entry gemm("),      # --emit wins over the suffix
    ("gemm.ptx", "hopper", "hopper.wgmma"),
])
def test_compile_emits_every_text_stage(output: str, emit: str | None, marker: str) -> None:
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-o", output, *(["--emit", emit] if emit else []))
    assert r.exit_code == 0, r.stderr
    text = Path(output).read_text()
    assert marker in text
    if output.endswith("tkir") or (emit or "").endswith("hopper"):
        verify(parse_module(text))


def test_compile_to_stdout_and_no_cubin_there() -> None:
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "--emit", "ptx")
    assert r.exit_code == 0, r.stderr
    assert ".version 8.1" in r.stdout and ".target sm_90a" in r.stdout
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "--emit", "cubin")
    assert r.exit_code == 1
    assert r.stderr == "error: --emit cubin writes a binary file; name it with -o FILE.cubin\n"


def test_compile_sm_100a_emits_tcgen05() -> None:
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "--target", "sm_100a", "--emit", "ptx")
    assert r.exit_code == 0, r.stderr
    assert ".target sm_100a" in r.stdout and "tcgen05.mma.cta_group::1.kind::f16" in r.stdout
    assert "wgmma" not in r.stdout
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "--target", "sm_100a")  # tile IR has no target
    assert r.exit_code == 0, r.stderr


def test_compile_hopper_level_input() -> None:
    hopper = ROOT / "tests" / "data" / "hopper" / "gemm.tkir"
    r = tkc_cli("compile", str(hopper), "--pipeline", "", "--hopper-pipeline", "", "--emit", "ptx")
    assert r.exit_code == 0, r.stderr
    assert ".entry gemm(" in r.stdout


def test_compile_dumps_cover_both_pipelines(tmp_path: Path) -> None:
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-o", "g.ptx", "--dump-dir", "d")
    assert r.exit_code == 0, r.stderr
    names = sorted(p.name for p in Path("d").iterdir())
    assert names[0] == "00-input.tkir" and names[-1] == "26-allocate-smem.tkir"


def test_compile_cubin_and_resource_usage() -> None:
    from tkc.codegen.ptxas import find_ptxas

    if find_ptxas() is None:
        pytest.skip("no ptxas found")
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-o", "gemm.cubin", "--resource-usage")
    assert r.exit_code == 0, r.stderr
    assert Path("gemm.cubin").read_bytes()[:4] == b"\x7fELF"
    line = r.stderr.splitlines()[0]
    assert line.startswith("gemm: ") and " registers, 0 B spill stores, 0 B spill loads, " in line
    assert "B dynamic shared memory + 0 B static" in line and "(sm_90a, 384 threads, 1 program an SM)" in line


def test_resource_usage_names_the_loads_stores_emit_and_the_packed_rows() -> None:
    from tkc.codegen.ptxas import find_ptxas

    if find_ptxas() is None:
        pytest.skip("no ptxas found")
    r = tkc_cli("compile", str(EXAMPLES / "layernorm.tk"), "-o", "ln.cubin", "--resource-usage")
    assert r.exit_code == 0, r.stderr
    assert "layernorm: loaded by their stores, run by run: w, bias; kept packed until their stores: x" \
        in r.stderr.splitlines()
    # GEMM's epilogue is a TMA store of its accumulator: nothing deferred, nothing packed.
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-o", "gemm.cubin", "--resource-usage")
    assert len(r.stderr.splitlines()) == 1, r.stderr
    # Rows read back from their stage (stage_loads) are named by their tensor.
    r = tkc_cli("compile", str(EXAMPLES / "layernorm_residual_bwd.tk"), "-o", "bwd.cubin", "--resource-usage")
    assert r.exit_code == 0, r.stderr
    assert "layernorm_residual_bwd: kept packed until their stores: dh (staged)" in r.stderr


def test_compile_cubin_without_ptxas_says_where_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    import tkc.codegen.ptxas as ptxas_mod

    monkeypatch.setattr(ptxas_mod, "find_ptxas", lambda env=None: None)
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-o", "gemm.cubin")
    assert r.exit_code == 1
    assert r.stderr.startswith("error: no ptxas found; searched:\n  TKC_PTXAS\n  PATH\n")
    assert "pip install nvidia-cuda-nvcc" in r.stderr
    assert not Path("gemm.cubin").exists()


def test_compile_ptx_without_ptxas_keeps_one_program_an_sm(monkeypatch: pytest.MonkeyPatch) -> None:
    # With a ptxas, a kernel without products gets its programs an SM from ptxas's answer
    # (tests/codegen/test_occupancy.py); without one, its PTX is still written, as LLVM made it.
    import tkc.codegen.ptxas as ptxas_mod

    monkeypatch.setattr(ptxas_mod, "find_ptxas", lambda env=None: None)
    r = tkc_cli("compile", str(EXAMPLES / "layernorm.tk"), "-o", "layernorm.ptx")
    assert r.exit_code == 0, r.stderr
    assert ".minnctapersm 1\n" in Path("layernorm.ptx").read_text()


def test_compile_tk_with_defines() -> None:
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-D", "BM=64", "-D", "BK=32", "--no-locs")
    assert r.exit_code == 0, r.stderr
    assert "consts = {BM = 64, BN = 256, BK = 32}" in r.stdout
    assert "tile.add" not in r.stdout  # the default pipeline ran: acc += a @ b accumulates
    verify(parse_module(r.stdout))


def test_compile_custom_pipeline_and_kernel() -> None:
    r = tkc_cli("compile", str(GEMM_TKIR), "--pipeline", "", "--kernel", "gemm")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == parse_and_print(GEMM_TKIR)
    r = tkc_cli("compile", str(GEMM_TKIR), "--kernel", "nope")
    assert r.exit_code == 1
    assert "has no kernel 'nope'; its kernels: gemm" in r.stderr


def parse_and_print(path: Path) -> str:
    from tkc.ir.printer import print_module

    return print_module(parse_module(path.read_text(), str(path)))


def test_compile_defines_are_checked() -> None:
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-D", "BM")
    assert r.exit_code == 2
    assert "is not NAME=VALUE" in r.stderr
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-D", "BM=big")
    assert r.exit_code == 2
    r = tkc_cli("compile", str(GEMM_TKIR), "-D", "BM=64")
    assert r.exit_code == 1
    assert "is IR, whose constants and pins were fixed" in r.stderr


def test_define_values() -> None:
    parse = tkc.cli.parse_value
    assert [parse(t) for t in ("64", "-3", "0.5", "1e-3", "true", "False")] == [64, -3, 0.5, 1e-3, True, False]
    assert isinstance(parse("64"), int)


def test_compile_rejects_other_files(tmp_path: Path) -> None:
    f = tmp_path / "k.cu"
    f.write_text("")
    r = tkc_cli("compile", str(f))
    assert r.exit_code == 1
    assert "expected a .tk or .py source, or a .tkir file" in r.stderr


def test_compile_missing_file_is_a_usage_error() -> None:
    r = tkc_cli("compile", "no/such.tk")
    assert r.exit_code == 2


# ---------------------------------------------------------------------- run
def test_run_without_a_gpu_falls_back_to_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    from tkc import runner

    monkeypatch.setattr(runner, "gpu_unavailable", lambda: "torch sees no CUDA GPU")
    r = tkc_cli("run", str(EXAMPLES / "gemm.tk"), "--dim", "M=10", "--dim", "N=10", "--dim", "K=10")
    assert r.exit_code == 0, r.stderr
    assert "interpret (torch sees no CUDA GPU): interpreted in" in r.stdout


def test_run_gpu_without_a_gpu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = tkc_cli("run", str(EXAMPLES / "gemm.tk"), "--backend", "gpu", "--dim", "M=10", "--dim", "N=10",
                "--dim", "K=10")
    assert r.exit_code == 1
    assert "torch sees no CUDA GPU; run with --backend interpret or emulate" in r.stderr


def test_run_interpret_flag_contradicting_backend() -> None:
    r = tkc_cli("run", str(EXAMPLES / "gemm.tk"), "--interpret", "--backend", "emulate", "--dim", "M=1")
    assert r.exit_code == 1
    assert "--interpret contradicts --backend emulate" in r.stderr


def test_run_emulates_and_checks_against_the_interpreter() -> None:
    r = tkc_cli("run", str(EXAMPLES / "attn.tk"), "--backend", "emulate", "--check", "-D", "D=64",
                "-D", "BM=64", "-D", "BN=64", "-D", "causal=true", "--dim", "B=1", "--dim", "H=2",
                "--dim", "N=100", "--seed", "5")
    assert r.exit_code == 0, r.stderr
    # the schedule a Python call of these shapes gets: 2 x 2 tiles walked by persistent programs
    assert r.stdout.splitlines()[0].startswith("schedule for these shapes: defer_last, persistent (tkc.schedule")
    assert r.stdout.splitlines()[1].startswith("kernel attn: grid (4,), seed 5, emulate: emulated in ")
    checks = [line for line in r.stdout.splitlines() if "check" in line]
    assert len(checks) == 4 and all(line.endswith("outside tolerance: ok") for line in checks)


def test_run_check_catches_unwritten_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """An executor that writes nothing must fail the check: outputs start poisoned."""
    import tkc.emulator

    monkeypatch.setattr(tkc.emulator, "emulate", lambda *a, **k: None)
    r = tkc_cli("run", str(EXAMPLES / "gemm.tk"), "--backend", "emulate", "--check", "-D", "BM=64",
                "-D", "BN=64", "--dim", "M=70", "--dim", "N=64", "--dim", "K=16")
    assert r.exit_code == 1
    assert "check c, emulator against interpreter: max abs error inf, 4480 of 4480 outside tolerance: MISMATCH" \
        in r.stdout


def test_run_checks_a_smaller_grid_on_the_tiles_it_covers(monkeypatch: pytest.MonkeyPatch) -> None:
    """--grid smaller than the kernel's: both sides leave the same elements unwritten (poisoned
    alike), so the check passes; an executor that writes nothing still fails it."""
    args = ("run", str(EXAMPLES / "attn.tk"), "--backend", "emulate", "--check", "-D", "D=64", "--dim", "B=1",
            "--dim", "H=2", "--dim", "N=300", "--grid", "1,1")
    r = tkc_cli(*args)
    assert r.exit_code == 0, r.stdout + r.stderr
    assert re.search(r"check o, emulator against interpreter: max abs error \S+, 0 of 38400 outside tolerance: ok",
                     r.stdout), r.stdout
    assert "schedule for these shapes: defer_last (" in r.stdout  # --grid: one program a tile, not persistent
    import tkc.emulator

    monkeypatch.setattr(tkc.emulator, "emulate", lambda *a, **k: None)
    r = tkc_cli(*args)
    assert r.exit_code == 1 and "check o, emulator against interpreter: max abs error inf, 8192 of 38400" in r.stdout


@pytest.mark.parametrize("programs", ["1", "3"])
def test_run_grid_of_a_persistent_kernel_counts_programs(programs: str) -> None:
    """A persistent kernel's programs walk every tile whatever their number: checked against
    the interpreter's whole grid."""
    r = tkc_cli("run", str(EXAMPLES / "attn.tk"), "--backend", "emulate", "--check", "-D", "D=64", "-D", "BM=64",
                "-D", "BN=64", "-D", "causal=true", "-D", "persistent=true", "--dim", "B=2", "--dim", "H=2",
                "--dim", "N=200", "--grid", programs)
    assert r.exit_code == 0, r.stdout + r.stderr
    assert f"grid ({programs},)" in r.stdout
    checks = [line for line in r.stdout.splitlines() if line.startswith("  check o, ")]
    assert checks and checks[0].endswith("outside tolerance: ok"), r.stdout


def test_run_interprets_and_prints_stats() -> None:
    pytest.importorskip("tkc.interpreter")
    r = tkc_cli("run", str(EXAMPLES / "gemm.tk"), "--interpret", "-D", "BM=64", "-D", "BN=64",
                "--dim", "M=100", "--dim", "N=72", "--dim", "K=40", "--seed", "3")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("kernel gemm: grid (2, 2), seed 3, interpret: interpreted in ")
    assert lines[1] == "  dims: M=100 (--dim), K=40 (--dim), N=72 (--dim)"
    assert lines[2].startswith("  a: bf16[100x40] mean ")
    assert lines[4].startswith("  c: bf16[100x72] mean ") and lines[4].endswith("NaN 0")


def test_run_with_env_interpret_and_grid() -> None:
    pytest.importorskip("tkc.interpreter")
    r = tkc_cli("run", str(EXAMPLES / "gemm.tk"), "--dim", "M=10", "--dim", "N=10", "--dim", "K=10",
                "--grid", "1,1", env={"TKC_INTERPRET": "1"})
    assert r.exit_code == 0, r.stderr
    assert "grid (1, 1)" in r.stdout


def test_run_sizes_the_dims_not_given_and_refuses_unknown_ones() -> None:
    r = tkc_cli("run", str(EXAMPLES / "gemm.tk"), "--interpret", "--dim", "M=64")
    assert r.exit_code == 0, r.stderr
    assert "  dims: M=64 (--dim), K=96 (default), N=384 (default)" in r.stdout.splitlines()
    r = tkc_cli("run", str(EXAMPLES / "gemm.tk"), "--interpret", "--dim", "M=1", "--dim", "N=1",
                "--dim", "K=1", "--dim", "Q=3")
    assert r.exit_code == 1
    assert "the kernel has no dim Q; its dims: M, K, N" in r.stderr


EXAMPLE_FILES = [p.name for p in lowered_examples(EXAMPLES)]
RUN_CASES = [pytest.param(e, k, marks=() if e in RUN_FAST else pytest.mark.slow)
             for e in EXAMPLE_FILES for k in RUN_KERNELS.get(e, [None])]


@pytest.mark.parametrize("example, kernel", RUN_CASES)
def test_run_check_with_no_flags_compares_the_emulator_with_the_interpreter(
        example: str, kernel: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tkc run EXAMPLE --check`` on a machine without a GPU: every dim gets a default size,
    and the emulator runs and is checked against the interpreter, tensor by tensor."""
    from tkc import runner

    monkeypatch.setattr(runner, "gpu_unavailable", lambda: "torch sees no CUDA GPU")
    r = tkc_cli("run", str(EXAMPLES / example), "--check", *(["--kernel", kernel] if kernel else []))
    assert r.exit_code == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "emulate (torch sees no CUDA GPU; --check compares it with the interpreter): emulated in" in lines[0]
    assert lines[1].startswith("  dims: ") and lines[1].endswith("(default)")
    checks = [line for line in lines if line.startswith("  check ")]
    tensors = [line for line in lines if line.startswith("  ") and " mean " in line and line not in checks]
    assert len(checks) == len(tensors) >= 2
    assert all(", emulator against interpreter: " in c and c.endswith("outside tolerance: ok") for c in checks)


@pytest.mark.parametrize("example, kernel", RUN_CASES)
def test_run_check_for_sm_100a_compares_the_emulator_with_the_interpreter(example: str, kernel: str | None) -> None:
    """``tkc run EXAMPLE --target sm_100a --backend emulate --check``: every example's
    tcgen05 lowering (tensor memory, 128- and 64-row products) agrees with the interpreter on
    the default sizes, tails included."""
    r = tkc_cli("run", str(EXAMPLES / example), "--target", "sm_100a", "--backend", "emulate", "--check",
                *(["--kernel", kernel] if kernel else []))
    assert r.exit_code == 0, r.stdout + r.stderr
    checks = [line for line in r.stdout.splitlines() if line.startswith("  check ")]
    assert len(checks) >= 2 and all(c.endswith("outside tolerance: ok") for c in checks)


def test_run_check_fails_when_the_emulator_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    import tkc.emulator

    real = tkc.emulator.emulate

    def off(kernel: object, args: list, **kw: object) -> None:
        real(kernel, args, **kw)
        args[1] += 0.25

    monkeypatch.setattr(tkc.emulator, "emulate", off)
    r = tkc_cli("run", str(EXAMPLES / "softmax.tk"), "--interpret", "--check", "--dim", "M=2")
    assert r.exit_code == 1
    assert "  check x, emulator against interpreter: max abs error 0, 0 of 12288 outside tolerance: ok" in r.stdout
    assert "  check y, emulator against interpreter: max abs error 0.25, 12288 of 12288 outside tolerance: " \
           "MISMATCH" in r.stdout


def test_run_too_large_a_dim_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    r = tkc_cli("run", str(EXAMPLES / "gemm.tk"), "--interpret", "--dim", "M=3000000000")
    assert r.exit_code == 1
    assert r.stderr.startswith("error: --dim M=3000000000: the kernel's tensors would take 5.2 TiB "
                               "(5,760,000,147,456 bytes) with M=3000000000, K=96, N=384; tkc run allocates at most ")
    assert len(r.stderr.splitlines()) == 1
    from tkc import runner

    monkeypatch.setattr(runner, "input_budget", lambda: 1 << 62)
    r = tkc_cli("run", str(EXAMPLES / "gemm.tk"), "--interpret", "--dim", "M=3000000000", "--dim", "K=1",
                "--dim", "N=1")
    assert r.exit_code == 1
    assert r.stderr == "error: --dim M=3000000000: a kernel reads its dims as i32, at most 2147483647\n"


@pytest.mark.parametrize("example, define, message", [
    ("attn.tk", "causal=2", "causal=2: constant 'causal' of kernel 'attn' takes true or false (its default is "
                            "false)"),
    ("attn.tk", "causal=1", "causal=1: constant 'causal' of kernel 'attn' takes true or false"),
    ("attn.tk", "BM=true", "BM=true: constant 'BM' of kernel 'attn' takes a number (its default is 128)"),
    ("rmsnorm.py", "BN=false", "BN=false: constant 'BN' of kernel 'rmsnorm' takes a number (its default is "
                               "256)"),
])
@pytest.mark.parametrize("command", ["run", "compile"])
def test_a_constant_takes_values_of_its_default_kind(command: str, example: str, define: str, message: str) -> None:
    r = tkc_cli(command, str(EXAMPLES / example), "-D", define)
    assert r.exit_code == 1
    first = r.stderr.splitlines()[0]
    assert first.startswith(f"{EXAMPLES / example}:") and f"error: {message}" in first, r.stderr  # at the parameter
    assert "Traceback" not in r.stderr


def test_run_scalars_are_printed_and_can_be_set() -> None:
    r = tkc_cli("run", str(EXAMPLES / "rmsnorm.py"), "--interpret", "--dim", "M=5", "--dim", "N=64")
    assert r.exit_code == 0, r.stderr
    assert re.fullmatch(r"  scalars: eps=[01]\.\d+ \(random\)", r.stdout.splitlines()[2])
    r = tkc_cli("run", str(EXAMPLES / "rmsnorm.py"), "--interpret", "--dim", "M=5", "--dim", "N=64",
                "--scalar", "eps=1e-5")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines()[2] == "  scalars: eps=1e-05 (--scalar)"


@pytest.mark.parametrize("scalar, code, message", [
    ("eps", 2, "Invalid value for '--scalar': 'eps' is not NAME=VALUE with an int, a float, true or false"),
    ("eps=abc", 2, "Invalid value for '--scalar': 'eps=abc' is not NAME=VALUE"),
    ("epz=1", 1, "error: --scalar epz: the kernel has no scalar 'epz'; its scalars: eps"),
    ("eps=true", 1, "error: --scalar eps=true: 'eps' is an f32 scalar; give a number"),
    ("eps=1e39", 1, "error: --scalar eps=1e+39: out of f32's range (at most 3.403e+38 in magnitude)"),
])
def test_run_bad_scalars(scalar: str, code: int, message: str) -> None:
    r = tkc_cli("run", str(EXAMPLES / "rmsnorm.py"), "--interpret", "--scalar", scalar)
    assert r.exit_code == code
    assert message in r.stderr and "Traceback" not in r.stderr


INT_KERNEL = """
@kernel
def shift(x: i32[N], y: i32[N], n: i32, B: const = 32):
    grid(cdiv(N, B))
    i = program_id(0)
    y[i*B:(i+1)*B] = x[i*B:(i+1)*B] + n
"""


def test_run_int_range_and_int_scalars(tmp_path: Path) -> None:
    (tmp_path / "shift.tk").write_text(INT_KERNEL)
    r = tkc_cli("run", "shift.tk", "--check", "--int-range", "100,101", "--scalar", "n=-100")
    assert r.exit_code == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[1:4] == ["  dims: N=48 (default)", "  scalars: n=-100 (--scalar)",
                          "  integer tensors: uniform in [100, 101] (--int-range)"]
    assert lines[5].startswith("  y: i32[48] mean 0.") and "abs-max 1," in lines[5]
    assert lines[-1].startswith("  check y, emulator against interpreter: max abs error 0, 0 of 48 ")
    r = tkc_cli("run", "shift.tk", "--interpret")
    assert "  integer tensors: uniform in [-8, 8] (default)" in r.stdout.splitlines()
    r = tkc_cli("run", "shift.tk", "--interpret", "--scalar", "n=3000000000")
    assert r.exit_code == 1
    assert "--scalar n=3000000000: 'n' is an i32 scalar; give an integer in [-2147483648, 2147483647]" in r.stderr
    r = tkc_cli("run", str(EXAMPLES / "softmax.tk"), "--interpret", "--int-range", "0,1")
    assert "  integer tensors: none (--int-range 0,1 unused)" in r.stdout.splitlines()


def test_run_i64_tensors_and_scalars_take_wide_values(tmp_path: Path) -> None:
    (tmp_path / "shift.tk").write_text(INT_KERNEL.replace("i32", "i64"))
    r = tkc_cli("run", "shift.tk", "--check", "--int-range", f"{2**40},{2**40 + 1}", "--scalar", f"n={2**35}")
    assert r.exit_code == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[2:4] == [f"  scalars: n={2**35} (--scalar)",
                          f"  integer tensors: uniform in [{2**40}, {2**40 + 1}] (--int-range)"]
    assert lines[-1].startswith("  check y, emulator against interpreter: max abs error 0, 0 of 48 ")
    (tmp_path / "shift32.tk").write_text(INT_KERNEL)
    r = tkc_cli("run", "shift32.tk", "--interpret", "--int-range", "0,3000000000")
    assert r.exit_code == 1
    assert ("--int-range 0,3000000000: 'x' is an i32 tensor; give a range within [-2147483648, 2147483647]"
            in r.stderr)


@pytest.mark.parametrize("text, message", [
    ("x", "'x' is not LO,HI (two integers, e.g. -8,8)"),
    ("1,2,3", "'1,2,3' is not LO,HI"),
    ("5,2", "'5,2': need LO <= HI, both in i64 [-9223372036854775808, 9223372036854775807]"),
    ("0,9223372036854775808", "'0,9223372036854775808': need LO <= HI, both in i64"),
])
def test_run_bad_int_range_is_a_usage_error(text: str, message: str) -> None:
    r = tkc_cli("run", str(EXAMPLES / "softmax.tk"), "--interpret", f"--int-range={text}")
    assert r.exit_code == 2
    assert f"Invalid value for '--int-range': {message}" in r.stderr and "Traceback" not in r.stderr


def test_run_bad_grid_is_a_usage_error() -> None:
    r = tkc_cli("run", str(EXAMPLES / "gemm.tk"), "--interpret", "--grid", "0,x")
    assert r.exit_code == 2


# ------------------------------------------------------------- error policy
def _crash(*args: object, **kwargs: object) -> None:
    raise RuntimeError("the frobnicator is empty")


def test_internal_error_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tkc.cli, "parse_module", _crash)
    r = tkc_cli("opt", str(GEMM_TKIR))
    assert r.exit_code == 70
    assert r.stderr == ("tkc: internal compiler error: RuntimeError: the frobnicator is empty "
                        "(set TKC_DEBUG=1 for the traceback)\n")


def test_internal_error_with_debug_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tkc.cli, "parse_module", _crash)
    r = tkc_cli("opt", str(GEMM_TKIR), env={"TKC_DEBUG": "1"})
    assert isinstance(r.exception, RuntimeError)


# ------------------------------------------------------- @tkc.kernel in a .py file
def test_compile_and_run_a_python_kernel() -> None:
    r = tkc_cli("compile", str(EXAMPLES / "rmsnorm.py"), "-D", "BN=128", "--emit", "hopper")
    assert r.exit_code == 0, r.stderr
    assert "tile.kernel @rmsnorm" in r.stdout and "BN = 128" in r.stdout and "hopper.reduce" in r.stdout
    r = tkc_cli("run", str(EXAMPLES / "rmsnorm.py"), "--backend", "emulate", "--check", "--dim", "M=20",
                "--dim", "N=300")
    assert r.exit_code == 0, r.stderr
    checks = [line for line in r.stdout.splitlines() if line.startswith("  check ")]
    assert len(checks) == 3 and all(line.endswith(": ok") for line in checks)


def test_python_file_errors(tmp_path: Path) -> None:
    r = tkc_cli("compile", str(EXAMPLES / "rmsnorm.py"), "-D", "Q=1")
    assert r.exit_code == 1 and "unknown constant 'Q' for the kernels of" in r.stderr
    plain = tmp_path / "plain.py"
    plain.write_text("x = 1\n")
    r = tkc_cli("compile", str(plain))
    assert r.exit_code == 1 and "defines no @tkc.kernel function" in r.stderr


def test_a_closed_pipe_is_not_a_compiler_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """`tkc run ... | head -1`: the reader goes away; tkc stops quietly (exit 141)."""
    import tkc.cli

    def closed(*args: object, **kwargs: object) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(tkc.cli, "_tensor_stats", closed)
    r = tkc_cli("run", str(EXAMPLES / "gemm.tk"), "--interpret", "--dim", "M=8", "--dim", "N=8", "--dim", "K=8")
    assert r.exit_code == 141
    assert "internal compiler error" not in r.stderr


def test_a_pass_error_shows_the_source_line_and_a_caret() -> None:
    """Errors raised by passes and codegen point into the .tk file through the IR's locations,
    which carry no text: the line is read from the file."""
    r = tkc_cli("compile", str(EXAMPLES / "attn.tk"), "-D", "defer_last=true", "-D", "issue_ahead=true",
                "-o", "a.ptx")
    assert r.exit_code == 1
    lines = r.stderr.splitlines()
    at = next(i for i, line in enumerate((EXAMPLES / "attn.tk").read_text().splitlines(), 1)
              if line.startswith("def attn("))
    assert lines[0].endswith(f"attn.tk:{at}:1: error: defer_last = true and issue_ahead = true move the same "
                             "loop's products in opposite directions; pin one of them")
    assert lines[1].startswith("def attn(q: bf16[B, H, N, D]") and lines[2] == "^"


def test_a_location_in_a_missing_file_prints_no_snippet(tmp_path: Path) -> None:
    from tkc.errors import Loc, TkcError

    assert str(TkcError("bad", Loc(str(tmp_path / "gone.tk"), 2, 3))) == f"{tmp_path / 'gone.tk'}:2:3: error: bad"


def test_pins_lists_every_pin_with_its_values_and_readers() -> None:
    from tkc.pins import PINS

    r = tkc_cli("pins")
    assert r.exit_code == 0, r.output
    heads = [line for line in r.stdout.splitlines() if line.startswith("-D ")]
    assert [h.split("=")[0][3:] for h in heads] == list(PINS)
    for head, (kind, _what, readers) in zip(heads, PINS.values()):
        assert head.endswith(f"(read by {readers})")
        assert ("=true|false " in head) == (kind is bool)
    assert "rows / (64 S)" in " ".join(r.stdout.split())  # the descriptions come along, wrapped to the terminal


def test_ops_lists_every_op_with_how_it_is_written() -> None:
    from tkc.ir.core import OPS
    from tkc.ir.dialects import elementwise as E

    r = tkc_cli("ops")
    assert r.exit_code == 0, r.stderr
    for cls in E.ELEMENTWISE_OPS:
        line = next(x for x in r.stdout.splitlines() if x.split()[:1] == [cls.name])
        assert cls.SUMMARY in line and cls.SURFACE[0] in line
    assert "e.g. y = fma(x, w, b)" in r.stdout and "tile.reduce    mean" in r.stdout

    def listed(out: str) -> set[str]:
        return {line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.split()}

    assert {n for n in OPS if n.startswith("tile.")} <= listed(r.stdout)
    # every builtin the language has is written somewhere in the listing, with no description cut short
    from tkc.frontend.lower import BUILTIN_FUNCS

    words = set(re.findall(r"[a-z_0-9]+", r.stdout))
    assert set(BUILTIN_FUNCS) <= words, set(BUILTIN_FUNCS) - words
    assert not any(line.rstrip().endswith("...") for line in r.stdout.splitlines())
    assert "  tile.atomic_cas        atomic_cas" in r.stdout and "e.g. old = atomic_cas(flag[0], 0, 1)" in r.stdout
    r = tkc_cli("ops", "--dialect", "hopper")
    assert r.exit_code == 0 and {n for n in OPS if n.startswith("hopper.")} <= listed(r.stdout)
    r = tkc_cli("ops", "--dialect", "blackwell")
    assert r.exit_code == 0 and "Ops of the blackwell dialect:" in r.stdout
    assert {n for n in OPS if n.startswith("blackwell.")} <= listed(r.stdout)


@pytest.mark.parametrize("example, kernels", [("attn_train.tk", ["attn_fwd", "attn_bwd_pre", "attn_bwd"]),
                                              ("fftconv.tk", ["fftconv", "fft_cols", "fft_rows", "ifft_cols",
                                                              "row_norms"])])
def test_run_check_of_a_file_of_several_kernels_runs_each(example: str, kernels: list[str]) -> None:
    """``tkc run FILE --check`` with no other flags on a file of several kernels runs and checks
    each in turn (it refused: "pick one with --kernel"), and passes at their default constants."""
    r = tkc_cli("run", str(EXAMPLES / example), "--check", "--backend", "emulate")
    assert r.exit_code == 0, r.output
    assert re.findall(r"^== (\w+)$", r.output, re.M) == kernels
    assert "MISMATCH" not in r.output and r.output.count(": ok") > len(kernels)


def test_run_of_a_file_of_several_kernels_fails_when_one_check_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel still runs, and the exit status says one failed, naming it."""
    import numpy as np

    import tkc.emulator

    real = tkc.emulator.emulate

    def off(kernel, args, **kw):
        real(kernel, args, **kw)
        if kernel.attributes.get("sym_name") == "attn_bwd_pre":
            args[2] += np.float32(0.5)  # delta

    monkeypatch.setattr(tkc.emulator, "emulate", off)
    r = tkc_cli("run", str(EXAMPLES / "attn_train.tk"), "--check", "--backend", "emulate", "-D", "D=64")
    assert r.exit_code == 1
    assert r.output.count("== ") == 3 and "checks failed for attn_bwd_pre" in r.output


def test_run_of_a_file_of_several_kernels_gives_each_the_dims_and_scalars_it_has() -> None:
    """attn_train.tk's attn_bwd_pre has neither KVH nor sm_scale: the flags apply to the kernels
    that have them (it stopped there, "the kernel has no dim KVH", and attn_bwd never ran)."""
    r = tkc_cli("run", str(EXAMPLES / "attn_train.tk"), "--interpret", "--dim", "KVH=1", "--dim", "H=2",
                "--dim", "N=64", "--scalar", "sm_scale=0.1")
    assert r.exit_code == 0, r.output
    assert re.findall(r"^== (\w+)$", r.output, re.M) == ["attn_fwd", "attn_bwd_pre", "attn_bwd"]
    lines = r.output.splitlines()
    assert lines.count("  dims: B=3 (default), H=2 (--dim), N=64 (--dim), KVH=1 (--dim)") == 2
    assert "  dims: B=3 (default), H=2 (--dim), N=64 (--dim)" in lines
    assert lines.count("  scalars: sm_scale=0.1 (--scalar)") == 2


@pytest.mark.parametrize("flag, message", [
    ("--dim=KVX=1", "error: --dim KVX: no kernel of {file} has a dim KVX; the dims of its kernels: attn_fwd: B, H, "
                    "N, KVH; attn_bwd_pre: B, H, N; attn_bwd: B, H, N, KVH"),
    ("--scalar=scale=1", "error: --scalar scale: no kernel of {file} has a scalar scale; the scalars of its kernels: "
                         "attn_fwd: sm_scale; attn_bwd_pre: none; attn_bwd: sm_scale"),
])
def test_run_of_a_file_of_several_kernels_refuses_a_flag_none_of_them_has(flag: str, message: str) -> None:
    file = str(EXAMPLES / "attn_train.tk")
    r = tkc_cli("run", file, "--interpret", flag)
    assert r.exit_code == 1 and "== " not in r.output
    assert message.format(file=file) in r.stderr


def test_run_of_one_kernel_picked_refuses_a_dim_it_lacks() -> None:
    r = tkc_cli("run", str(EXAMPLES / "attn_train.tk"), "--interpret", "--kernel", "attn_bwd_pre", "--dim", "KVH=1")
    assert r.exit_code == 1
    assert "the kernel has no dim KVH; its dims: B, H, N" in r.stderr


def test_a_hopper_ir_dump_compiles_and_runs_without_pipeline_flags(tmp_path: Path) -> None:
    # IR the backend passes made skips the pipelines by itself: the same PTX as from the source
    dump = tmp_path / "gemm.hopper.tkir"
    assert tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-o", str(dump)).exit_code == 0
    r = tkc_cli("compile", str(dump), "--emit", "ptx", "-o", str(tmp_path / "from_dump.ptx"))
    assert r.exit_code == 0, r.output
    assert tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-o", str(tmp_path / "direct.ptx")).exit_code == 0
    assert (tmp_path / "from_dump.ptx").read_text() == (tmp_path / "direct.ptx").read_text()
    assert not (tmp_path / "tkc-reproducers").exists()
    dims = ["--dim", "M=100", "--dim", "N=128", "--dim", "K=64"]
    r = tkc_cli("run", str(dump), *dims)
    assert r.exit_code == 0 and "emulate (lowered IR: the emulator runs it on the CPU)" in r.output, r.output
    r = tkc_cli("run", str(dump), *dims, "--check")
    assert r.exit_code == 1 and "the backend passes lowered (hopper ops); the interpreter runs tile IR" in r.output
    # without --dim: the sizes its TMA boxes and loads span, one tile and a tail (3 was the
    # default of every dim, whose rows TMA cannot copy)
    r = tkc_cli("run", str(dump))
    assert r.exit_code == 0 and "a: bf16[192x96]" in r.output and "c: bf16[192x288]" in r.output, r.output
    r = tkc_cli("run", str(dump), "-D", "tma=false")
    assert r.exit_code != 0 and "is IR, whose constants and pins were fixed when it was made" in r.output


def test_tile_ir_of_a_kernel_with_a_schedule_runs_as_printed(tmp_path: Path) -> None:
    # attn.tk's schedule picks pins for the shapes it runs on; IR's pins were fixed when it was
    # printed, so none is chosen for it (they were reported as a -D the user never gave)
    ir = tmp_path / "attn.tkir"
    assert tkc_cli("compile", str(EXAMPLES / "attn.tk"), "-o", str(ir)).exit_code == 0
    r = tkc_cli("run", str(ir), "--backend", "emulate", "--dim", "N=80", "--dim", "B=1", "--dim", "H=1")
    assert r.exit_code == 0 and "emulated in" in r.output and "-D" not in r.output, r.output


def test_ir_passes_refuse_ir_of_another_level(tmp_path: Path) -> None:
    # tkc opt runs any pass on any dump: one that takes another level says which, at the kernel
    tile, hopper = tmp_path / "gemm.tkir", tmp_path / "gemm.hopper.tkir"
    for out in (tile, hopper):
        assert tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-o", str(out)).exit_code == 0
    for ir, p, says in [(tile, "allocate-smem", "allocate-smem runs after lower-to-hopper, on hopper IR: this kernel "
                                                "is tile IR (the tiles have no layouts yet)"),
                        (tile, "lower-to-blackwell", "lower-to-blackwell runs after lower-to-hopper"),
                        (hopper, "select-layouts", "select-layouts runs on tile IR whose tiles have no layouts yet: "
                                                   "this kernel is hopper IR already"),
                        (hopper, "decompose", "decompose runs on tile IR"),
                        (hopper, "lower-to-hopper", "lower-to-hopper runs once: this kernel is hopper IR already")]:
        r = tkc_cli("opt", str(ir), "-p", p)
        assert r.exit_code == 1 and says in r.stderr and "gemm.tk:3:1" in r.stderr, (p, r.stderr)
        assert "reproducer" not in r.stderr and "failed" not in r.stderr
    assert not (tmp_path / "tkc-reproducers").exists()
    # a select-layouts dump is laid out, not lowered: the passes after lower-to-hopper refuse it,
    # and hand-written hopper IR (hopper ops, no TMA maps, no threads) is hopper IR
    assert tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "--emit", "hopper", "--dump-dir", "d", "-o",
                   str(tmp_path / "x.hopper.tkir")).exit_code == 0
    laid_out = next((tmp_path / "d").glob("*-select-layouts.tkir"))
    for p in ("pipeline-loops", "allocate-smem", "lower-to-blackwell"):
        r = tkc_cli("opt", str(laid_out), "-p", p)
        assert r.exit_code == 1 and f"{p} runs after lower-to-hopper, on hopper IR: this kernel is tile IR with its " \
            "layouts selected" in r.stderr, (p, r.stderr)
    hand = tmp_path / "hand.tkir"
    hand.write_text((ROOT / "tests/passes/allocate_smem/loops.tkir").read_text().replace("{threads = 128}", ""))
    r = tkc_cli("opt", str(hand), "-p", "lower-to-hopper")
    assert r.exit_code == 1 and "lower-to-hopper runs once: this kernel is hopper IR already" in r.stderr, r.stderr
    r = tkc_cli("opt", str(hand), "-p", "select-layouts")
    assert r.exit_code == 1 and "this kernel is hopper IR already" in r.stderr, r.stderr


def test_a_select_layouts_dump_compiles_on_from_there(tmp_path: Path) -> None:
    # the backend passes after select-layouts, not the whole pipeline again (decompose refused it)
    for example in ("gemm.tk", "layernorm.tk"):  # (layernorm's dump holds select-layouts' conversions)
        d = tmp_path / example
        assert tkc_cli("compile", str(EXAMPLES / example), "--emit", "hopper", "--dump-dir", str(d), "-o",
                       str(tmp_path / "x.hopper.tkir")).exit_code == 0
        dump = next(d.glob("*-select-layouts.tkir"))
        r = tkc_cli("compile", str(dump), "-o", str(tmp_path / "from_dump.ptx"))
        assert r.exit_code == 0, r.stderr
        assert tkc_cli("compile", str(EXAMPLES / example), "-o", str(tmp_path / "direct.ptx")).exit_code == 0
        assert (tmp_path / "from_dump.ptx").read_text() == (tmp_path / "direct.ptx").read_text()


def test_lowered_ir_knows_its_target(tmp_path: Path) -> None:
    hopper, blackwell = tmp_path / "gemm.hopper.tkir", tmp_path / "gemm100.hopper.tkir"
    assert tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-o", str(hopper)).exit_code == 0
    assert tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "--target", "sm_100a", "-D", "cta_pairs=true",
                   "-o", str(blackwell)).exit_code == 0
    assert 'target = "sm_90a"' in hopper.read_text() and 'target = "sm_100a"' in blackwell.read_text()
    # sm_90a's products and layouts compiled for sm_100a: refused at the kernel, before LLVM
    for extra in ([], ["--hopper-pipeline", "lower-to-blackwell"]):
        r = tkc_cli("compile", str(hopper), "--target", "sm_100a", *extra, "-o", str(tmp_path / "x.ptx"))
        assert r.exit_code == 1 and "gemm.tk:3:1" in r.stderr, r.stderr
        assert "this kernel was lowered for sm_90a (its layouts and products are that GPU's), not sm_100a: compile " \
               "its source or tile IR with --target sm_100a" in r.stderr and "llvm" not in r.stderr
    r = tkc_cli("opt", str(blackwell), "-p", "cse", "--target", "sm_90a")
    assert r.exit_code == 1 and "this kernel was lowered for sm_100a" in r.stderr
    # tkc run and tkc opt take the dump's own target (its pin cta_pairs is refused on sm_90a)
    r = tkc_cli("run", str(blackwell), "--backend", "emulate")
    assert r.exit_code == 0 and "emulated in" in r.output, r.output
    r = tkc_cli("opt", str(blackwell), "-p", "cse,dce")
    assert r.exit_code == 0 and 'target = "sm_100a"' in r.output, r.stderr
    r = tkc_cli("compile", str(blackwell), "-o", str(tmp_path / "b.ptx"))  # and tkc compile
    assert r.exit_code == 0 and ".target sm_100a" in (tmp_path / "b.ptx").read_text(), r.stderr
    bogus = tmp_path / "bogus.hopper.tkir"
    bogus.write_text(hopper.read_text().replace('target = "sm_90a"', 'target = "sm_80"'))
    r = tkc_cli("opt", str(bogus), "-p", "cse")
    assert r.exit_code == 1 and "gemm.tk:3:1" in r.stderr and "target = 'sm_80': the kernel was laid out for a " \
        "GPU tkc does not compile for (sm_90a, sm_100a)" in r.stderr, r.stderr


def test_run_takes_no_negative_seed() -> None:
    r = tkc_cli("run", str(EXAMPLES / "softmax.tk"), "--seed", "-1")
    assert r.exit_code == 2 and "Invalid value for '--seed'" in r.output and "internal" not in r.output


def test_a_python_file_that_fails_to_import_is_the_users_error(tmp_path: Path) -> None:
    (tmp_path / "raises.py").write_text("import tkc\nx = 1\nraise ValueError('boom')\n")
    (tmp_path / "syntax.py").write_text("import tkc\ndef f(:\n")
    (tmp_path / "imports.py").write_text("from tkc.ops.kernels.rmsnorm import rmsnorm  # noqa: F401\n")
    (tmp_path / "noann.py").write_text("import tkc\n\n\n@tkc.kernel\ndef k(x: f32[N]):\n    grid(1)\n")
    for name, said in (("raises", r"raises.py:3:1: error: importing .*raises.py raised ValueError: boom\n"
                                  r"raise ValueError\('boom'\)\n\^"),
                       ("syntax", r"syntax.py:2:7: error: invalid syntax \(importing .*syntax.py as Python\)\n"
                                  r"def f\(:\n      \^"),
                       ("noann", r"noann.py:5:\d+: error: importing .*noann.py raised NameError: name 'f32' is not "
                                 r"defined; a kernel's annotations \(f32\[M, N\]\) are not Python: put `from "
                                 r"__future__ import annotations` at the top of the file"),
                       ("imports", "imports.py defines no @tkc.kernel function")):
        r = tkc_cli("compile", str(tmp_path / f"{name}.py"), "-o", str(tmp_path / "x.ptx"))
        assert r.exit_code == 1 and re.search(said, r.output) and "internal" not in r.output, r.output


def test_a_runtime_argument_is_not_a_constant() -> None:
    r = tkc_cli("compile", str(EXAMPLES / "attn.tk"), "-D", "sm_scale=0.5", "-o", "a.ptx")
    assert r.exit_code == 1 and "'sm_scale' is an argument given at each call, not a constant: pass it there " \
                                "(tkc run: --scalar sm_scale=0.5)" in r.output, r.output
    r = tkc_cli("run", str(EXAMPLES / "softmax.tk"), "-D", "x=3", "--dim", "M=4", "--dim", "N=64")
    assert r.exit_code == 1 and "'x' is an argument given at each call, not a constant" in r.output, r.output


def test_a_name_given_twice_with_two_values_is_refused() -> None:
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-D", "BN=64", "-D", "BN=128", "-o", "x.tkir")
    assert r.exit_code == 2 and "BN is given twice (64 and 128): give it once" in r.output, r.output
    r = tkc_cli("run", str(EXAMPLES / "softmax.tk"), "--dim", "M=4", "--dim", "M=8", "--dim", "N=64")
    assert r.exit_code == 2 and "M is given twice (4 and 8): give it once" in r.output, r.output


def test_a_misspelt_constant_gets_a_suggestion_among_the_constants() -> None:
    r = tkc_cli("compile", str(EXAMPLES / "gemm.tk"), "-D", "BNN=64", "-o", "x.tkir")
    assert r.exit_code == 1 and "unknown constant 'BNN'; did you mean 'BN'? (the kernel's constants: BK, BM, BN;" \
        in r.output, r.output


def test_an_empty_ir_file_and_a_file_of_several_kernels_say_what_to_do(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tkir"
    empty.write_text("")
    for cmd in ("compile", "opt"):
        r = tkc_cli(cmd, str(empty))
        assert r.exit_code == 1 and "holds no kernel" in r.stderr, r.output
    r = tkc_cli("compile", str(EXAMPLES / "attn_train.tk"), "--emit", "ptx", "-o", str(tmp_path / "x.ptx"))
    assert r.exit_code == 1 and "has several kernels (attn_fwd, attn_bwd_pre, attn_bwd): name one with --kernel NAME" \
        in r.stderr, r.output
