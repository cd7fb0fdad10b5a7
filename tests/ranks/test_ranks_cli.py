"""``tkc run FILE --ranks R --check`` on the multi-GPU examples, and what tkc compile and the
other backends say about them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tkc.cli import cli

EXAMPLES = Path(__file__).parents[2] / "examples"
SMALL = {"ring_attn.tk": ["-D", "BM=32", "-D", "BN=32", "-D", "D=32", "--dim", "B=1", "--dim", "H=2"]}
GEMM = ["-D", "BM=32", "-D", "BN=32", "-D", "BK=32"]


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), env={"TKC_INTERPRET": None})


@pytest.mark.parametrize("example", ["allgather_gemm.tk", "gemm_reducescatter.tk", "gemm_allreduce.tk", "ring_attn.tk"])
@pytest.mark.parametrize("ranks", ["2", "4"])
def test_run_on_simulated_ranks_with_check(example: str, ranks: str) -> None:
    r = _run("run", str(EXAMPLES / example), "--ranks", ranks, "--check", *SMALL.get(example, GEMM))
    assert r.exit_code == 0, r.output
    assert f"{ranks} ranks of grid" in r.output
    checks = [line for line in r.output.splitlines() if "check " in line]
    assert checks and all(line.endswith(": ok") for line in checks), r.output
    assert f"(rank {int(ranks) - 1})" in r.output


def test_flags_start_at_zero() -> None:
    r = _run("run", str(EXAMPLES / "gemm_allreduce.tk"), "--ranks", "2", *GEMM)
    assert r.exit_code == 0, r.output
    assert "flags (start at zero): flags" in r.output


def test_compile_writes_ptx_of_a_multi_gpu_kernel(tmp_path: Path) -> None:
    r = _run("compile", str(EXAMPLES / "gemm_allreduce.tk"), "-o", str(tmp_path / "k.ptx"))
    assert r.exit_code == 0, r.output
    ptx = (tmp_path / "k.ptx").read_text()
    assert "ld.acquire.sys.global" in ptx and "atom.release.sys.global.exch" in ptx, ptx[-2000:]
    r = _run("compile", str(EXAMPLES / "gemm_allreduce.tk"), "--emit", "tkir")
    assert r.exit_code == 0 and "tile.wait" in r.output, r.output


def test_gpu_backend_outside_torchrun_says_how_to_start() -> None:
    r = CliRunner().invoke(cli, ["run", str(EXAMPLES / "allgather_gemm.tk"), "--backend", "gpu"],
                           env={"TKC_INTERPRET": None, "WORLD_SIZE": None})
    assert r.exit_code == 1, r.output
    assert "torchrun --nproc-per-node R -m tkc run" in r.output and "--backend gpu" in r.output


def test_ranks_must_match_torchruns_processes() -> None:
    r = CliRunner().invoke(cli, ["run", str(EXAMPLES / "allgather_gemm.tk"), "--ranks", "4", "--backend", "gpu"],
                           env={"TKC_INTERPRET": None, "WORLD_SIZE": "2"})
    assert r.exit_code == 1 and "--ranks 4, but torchrun started 2 processes" in r.output, r.output


def test_without_torchrun_the_interpreter_runs_them() -> None:
    r = CliRunner().invoke(cli, ["run", str(EXAMPLES / "allgather_gemm.tk"), "--ranks", "2", *GEMM],
                           env={"TKC_INTERPRET": None, "WORLD_SIZE": None})
    assert r.exit_code == 0 and "2 ranks of grid" in r.output, r.output


def test_a_callers_grid_is_the_checks_grid_for_a_kernel_whose_flags_count_programs() -> None:
    # moe_dispatch counts its programs in arrived: the interpreter's reference must run the same
    # 3 programs as the emulator, not num_sms()'s (a MISMATCH of arrived before)
    r = _run("run", str(EXAMPLES / "moe_dispatch.tk"), "--ranks", "2", "--grid", "3", "--backend", "emulate",
             "--check", "--dim", "F=96")
    assert r.exit_code == 0, r.output
    checks = [line for line in r.output.splitlines() if "check " in line]
    assert any("check arrived (rank 1)" in line for line in checks), r.output
    assert all(line.endswith(": ok") for line in checks), r.output


def test_emulate_check_says_a_kernels_own_mistake_in_the_languages_words(tmp_path: Path) -> None:
    # the interpreter's reference runs first: a rank out of range is its error at the line, not
    # the emulator's about 'tile.peer' in a role of a CTA
    src = tmp_path / "off_by_one.tk"
    src.write_text("@kernel\ndef k(x: f32[M, N], buf: f32[M, N] @ ranks, BM: const = 64, BN: const = 64):\n"
                   "    grid(cdiv(M, BM))\n    r = program_id(0) * BM\n    barrier_all()\n"
                   "    buf.on(rank() + 1)[r:r+BM, 0:BN] = x[r:r+BM, 0:BN]\n    barrier_all()\n")
    r = CliRunner().invoke(cli, ["run", str(src), "--ranks", "2", "--backend", "emulate", "--check"],
                           env={"TKC_INTERPRET": None})
    assert r.exit_code == 1
    assert "off_by_one.tk:6:5: error: rank 2 is out of range: the launch has 2 ranks (0..1)" in r.output, r.output
    assert "tile.peer" not in r.output and "role" not in r.output
