"""``tkc run --backend gpu --check`` under torchrun, everything but the GPU: two processes on
gloo with the launch faked by torch (tests/ranks/fake_gpu_worker.py says what is real)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("installed_tkc")

ROOT = Path(__file__).resolve().parents[2]


def _torchrun(**env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TKC_INTERPRET")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(ROOT / "tests" / "ranks" / "fake_gpu_worker.py"), "run", str(ROOT / "examples" / "allgather_gemm.tk"),
           "--backend", "gpu", "--check", "--repeat", "2", "-D", "BM=32", "-D", "BN=32", "-D", "BK=32"]
    # Not from the checkout, whose bare tkc/ (no tkc.runtime) a script's directory could shadow.
    return subprocess.run(cmd, env={**environ, **env}, capture_output=True, text=True, timeout=300,
                          cwd=tempfile.gettempdir())


def test_rank_zero_checks_every_rank_against_the_interpreter() -> None:
    r = _torchrun()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kernel allgather_gemm: 2 ranks (torchrun) of grid (2, 2), seed 0, gpu: median kernel time of 2 " \
           "launches 1000.0 us" in r.stdout, r.stdout
    checks = [line for line in r.stdout.splitlines() if "check " in line]
    assert [c.split(",")[0] for c in checks] == [f"  check {x} (rank {r})" for r in (0, 1)
                                                 for x in ("b", "c", "ag", "ready")]
    assert all(c.endswith(": ok") for c in checks), r.stdout


def test_a_wrong_rank_fails_every_process() -> None:
    r = _torchrun(FAKE_WRONG="1")
    assert r.returncode != 0
    assert "check c (rank 0), GPU against interpreter on 2 simulated ranks (seed 0): max abs error" in r.stdout
    assert "check c (rank 1)" in r.stdout and "MISMATCH" in r.stdout, r.stdout
