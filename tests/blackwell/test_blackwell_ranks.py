"""sm_100a: the multi-GPU examples on simulated ranks, and the waits for tensor memory's commits
counted through any loops and ``if``s around them.

The accumulators' waits take their parity from a count threaded through the loops
(tkc/passes/phases.py), so a K loop or a product read at once may sit as deep as the kernel puts
it: MoE's expert GEMM inside its rank and expert loops, ring attention's blocks inside its rank
loop, a product under an ``if``.  A K loop that a loop around it runs again (a persistent tile
loop) meets the role before each run unless its epilogue already does, so the next tile's first
MMA never overwrites sums a slower warp has still to load."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from device_checks import needs_ptxas
from tkc.cli import cli
from tkc.compiler import compile_kernel
from tkc.interpreter import random_args
from tkc.runner import run

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


def _agrees(text: str, dims: dict[str, int], consts: dict | None = None, seeds=(0, 1, 2)) -> str:
    """The kernel's sm_100a build emulated against the interpreter; its hopper IR."""
    kernel = compile_kernel(text, consts or {}, stop="tkir", cache=False).kernel_op
    for seed in seeds:
        result = run(kernel, random_args(kernel, dims, seed), "emulate", check=True, seed=seed, target=SM100)
        assert result.ok, (seed, result.checked)
    return compile_kernel(text, consts or {}, target=SM100, stop="hopper", cache=False).asm["hopper"]


# A persistent K loop whose epilogue stores from registers (no TMA store, whose barrier the role
# meets at): one thread issued the next tile's first MMA into the columns while another warp (or
# the second epilogue warpgroup) still had this tile's sums to load.
ROW_SUMS = """@kernel
def row_sums(a: bf16[M, K], b: bf16[K, N], rs: f32[M, NB], BM: const = 128, BN: const = 64, BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
    rs[pm*BM:(pm+1)*BM, pn] = acc.sum(1)
"""


def test_a_persistent_k_loop_meets_before_the_next_tiles_products() -> None:
    hopper = _agrees(ROW_SUMS, {"M": 1024, "N": 512, "K": 64, "NB": 8})
    consumers = hopper[hopper.index('name = "consumers"'):]
    assert consumers.index("hopper.sync") < consumers.index("blackwell.mma")


def test_a_persistent_gemm_storing_from_registers_agrees() -> None:
    _agrees((EXAMPLES / "gemm.tk").read_text(), {"M": 1024, "N": 512, "K": 64}, {"tma_store": False}, seeds=(0, 1))


def test_a_tma_store_epilogue_needs_no_second_meeting() -> None:
    hopper = compile_kernel(EXAMPLES / "gemm.tk", target=SM100, stop="hopper", cache=False).asm["hopper"]
    consumers = hopper[hopper.index('name = "consumers"'):]
    assert "hopper.sync" not in consumers


def test_a_register_a_operand_in_a_persistent_k_loop() -> None:
    # read at once in a K loop inside the persistent tile loop (A cast in registers, staged):
    # refused before, as if its tiles had no TMA ring
    _agrees("""@kernel
def cast_a(a: f32[M, K], b: bf16[K, N], c: f32[M, N], BM: const = 128, BN: const = 64, BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK].to(bf16) @ b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc
""", {"M": 1000, "N": 520, "K": 200}, seeds=(0,))


def test_a_product_under_an_if() -> None:
    # no loop around it: refused before as "a loop inside another loop"
    _agrees("""@kernel
def lower(q: bf16[M, 64], k: bf16[N, 64], o: f32[M, N], BM: const = 128, BN: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    s = zeros([BM, BN], f32)
    if pn <= pm:
        s = q[pm*BM:(pm+1)*BM, :] @ k[pn*BN:(pn+1)*BN, :].T
    o[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = s
""", {"M": 200, "N": 264}, {"persistent": False}, seeds=(0,))


def test_a_product_read_at_once_in_a_loop_of_a_loop() -> None:
    # acc = acc * 0.5 + a @ b in a K loop the persistent tile loop runs again
    _agrees("""@kernel
def halves(a: bf16[M, K], b: bf16[K, N], c: f32[M, N], BM: const = 128, BN: const = 64, BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        acc = acc * 0.5 + a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc
""", {"M": 1000, "N": 264, "K": 200}, seeds=(0,))
