"""The multi-GPU examples on 2 and 4 GPUs (each count where the machine has that many), one
process a rank under torchrun, as users run them:
``tkc run FILE --backend gpu --check`` (every rank's outputs against the interpreter on all
ranks' gathered inputs, three timed launches after the checked one: flags zeroed between
launches, barrier pads counting on), and the kernels called from Python on tensors from
``tkc.symmetric_empty`` (tests/ranks/torchrun_worker.py, against torch).  moe_dispatch runs only
from Python: it needs routing sorted by expert, which tkc run's random inputs are not (their
segments overlap, and the interpreter reports the race)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("installed_tkc")]


@pytest.fixture(params=[2, 4], ids=lambda r: f"{r}ranks")
def ranks(request: pytest.FixtureRequest) -> int:
    if torch.cuda.device_count() < request.param:
        pytest.skip(f"needs {request.param} GPUs")
    return request.param


def _torchrun(ranks: int, *args: str) -> subprocess.CompletedProcess:
    from tkc.runtime.ranks import NO_MULTICAST

    env = {**os.environ, **NO_MULTICAST}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TKC_INTERPRET"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *args]
    # Not from the checkout, whose bare tkc/ (no tkc.runtime) python -m would import first.
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tempfile.gettempdir())


@pytest.mark.parametrize("example, flags", [
    ("allgather_gemm.tk", ["--dim", "M=200", "--dim", "K=136", "--dim", "N=320", "--dim", "P={P}", "--dim", "GM=2"]),
    ("gemm_reducescatter.tk", ["--dim", "M={M}", "--dim", "MS=200", "--dim", "K=136", "--dim", "N=320"]),
    ("gemm_allreduce.tk", ["--dim", "M={M}", "--dim", "MS=200", "--dim", "K=136", "--dim", "N=320",
                           "--dim", "P={P}", "--dim", "GM=2", "--dim", "GN=2"]),
    ("ring_attn.tk", ["--dim", "B=1", "--dim", "H=2", "--dim", "N=200", "--dim", "P={P}"]),
    ("allgather.tk", ["--dim", "M=200", "--dim", "N=320", "--dim", "P={P}"]),
    ("reducescatter.tk", ["--dim", "M={M}", "--dim", "MS=200", "--dim", "N=320", "--dim", "P={P}", "--dim", "GM=4",
                           "--dim", "GN=2"]),
])
def test_tkc_run_checks_every_rank(example: str, flags: list[str], ranks: int) -> None:
    flags = [f.format(P=ranks, M=200 * ranks) for f in flags]  # M = MS rows a rank x ranks
    r = _torchrun(ranks, "-m", "tkc", "run", str(EXAMPLES / example), "--backend", "gpu", "--check", "--repeat", "3",
                  *flags)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert f"{ranks} ranks (torchrun)" in out, out
    checks = [line for line in out.splitlines() if "check " in line]
    assert len(checks) >= ranks and all(line.endswith(": ok") for line in checks), out
    assert f"(rank {ranks - 1})" in out


@pytest.mark.parametrize("example", ["moe_dispatch", "allgather_gemm", "different_grids"])
def test_python_calls_on_symmetric_tensors(example: str, ranks: int) -> None:
    r = _torchrun(ranks, str(ROOT / "tests" / "ranks" / "torchrun_worker.py"), example)
    assert r.returncode == 0 and f"{example}: ok on {ranks} ranks" in r.stdout, r.stdout + r.stderr
