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
    r = _run("run", str(EXAMPLES / "gemm_reducescatter.tk"), "--ranks", "2", *GEMM)
    assert r.exit_code == 0, r.output
    assert "flags (start at zero): flags" in r.output


def test_the_gpu_backend_is_refused() -> None:
    r = _run("run", str(EXAMPLES / "allgather_gemm.tk"), "--ranks", "2", "--backend", "gpu")
    assert r.exit_code == 1 and "multi-GPU kernels run in the interpreter or the emulator for now" in r.output, \
        r.output


def test_compile_stops_with_a_located_error(tmp_path: Path) -> None:
    r = _run("compile", str(EXAMPLES / "gemm_reducescatter.tk"), "-o", str(tmp_path / "k.ptx"))
    assert r.exit_code == 1, r.output
    assert "gemm_reducescatter.tk:" in r.output and "multi-GPU kernels run in the interpreter for now" in r.output
    assert "^" in r.output
    r = _run("compile", str(EXAMPLES / "gemm_reducescatter.tk"), "--emit", "tkir")
    assert r.exit_code == 0 and "tile.wait" in r.output, r.output
