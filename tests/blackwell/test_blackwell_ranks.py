"""sm_100a: the multi-GPU examples on simulated ranks (their K loops inside rank and expert
loops: the waits for tensor memory's commits counted through them, tkc/passes/phases.py), and
ptxas on each.  Products under other loops and ``if``s: test_blackwell_control_flow.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from device_checks import needs_ptxas
from tkc.cli import cli
from tkc.compiler import compile_kernel

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SM100 = "sm_100a"
MULTI_GPU = ["allgather.tk", "reducescatter.tk", "allgather_gemm.tk", "gemm_reducescatter.tk", "gemm_allreduce.tk",
             "ring_attn.tk", "moe_dispatch.tk"]
SMALL = {"ring_attn.tk": ["-D", "BM=128", "-D", "BN=64", "-D", "D=64",
                          "--dim", "B=1", "--dim", "H=2", "--dim", "N=200"],
         "moe_dispatch.tk": ["--dim", "F=96"]}


def _run(example: str, ranks: int, *more: str) -> str:
    r = CliRunner().invoke(cli, ["run", str(EXAMPLES / example), "--ranks", str(ranks), "--target", SM100,
                                 "--backend", "emulate", "--check", *SMALL.get(example, []), *more],
                           env={"TKC_INTERPRET": None})
    assert r.exit_code == 0, r.output
    checks = [line for line in r.output.splitlines() if "check " in line]
    assert checks and all("emulator against interpreter" in line and line.endswith(": ok") for line in checks), r.output
    assert f"(rank {ranks - 1})" in r.output, r.output
    return r.output


@pytest.mark.parametrize("example", MULTI_GPU)
def test_multi_gpu_examples_emulated_for_sm_100a_agree_with_the_interpreter(example: str) -> None:
    _run(example, 2)


@pytest.mark.slow
@pytest.mark.parametrize("example", ["allgather_gemm.tk", "moe_dispatch.tk", "ring_attn.tk"])
def test_multi_gpu_examples_at_four_ranks_for_sm_100a(example: str) -> None:
    _run(example, 4, "--seed", "1")


#: Spills ptxas leaves, in bytes (docs/blackwell.md's table): MoE's masked store of an expert
#: block's last rows (none without that store; 36 B before masked stores took 16-byte runs).
SPILLS = {"moe_dispatch.tk": 4}


@needs_ptxas
@pytest.mark.parametrize("example", MULTI_GPU)
def test_multi_gpu_examples_compile_for_sm_100a_without_spills(example: str) -> None:
    c = compile_kernel(EXAMPLES / example, target=SM100, stop="cubin", cache=False, ptxas=True)
    assert ".target sm_100a" in c.asm["ptx"] and c.resources.spill_stores <= SPILLS.get(example, 0), c.resources
    if example in ("allgather_gemm.tk", "gemm_reducescatter.tk", "gemm_allreduce.tk", "moe_dispatch.tk"):
        assert "tcgen05.mma" in c.asm["ptx"]
