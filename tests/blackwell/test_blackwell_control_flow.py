"""sm_100a: products under any loops and ``if``s, and the warps kept together around them.

The waits for the commits take their parity from a count threaded through the loops
(tkc/passes/phases.py), so a K loop or a product read at once may sit as deep as the kernel
puts it.  One thread issues the MMAs and each warp loads on its own, so a role barrier keeps
the warps within one run of the MMA warp wherever nothing else does: before a K loop a loop
around it runs again (unless its epilogue meets), before a product read at once in a loop (an
``if`` in it too), and before each MMA of a K loop whose role refills its own ring."""

from __future__ import annotations

from pathlib import Path

import pytest

from tkc.compiler import compile_kernel
from tkc.interpreter import random_args
from tkc.runner import run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SM100 = "sm_100a"


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
def k_loop(step: str, epilogue: str, a: str = "bf16", out: str = "M, N") -> str:
    """A 2-D grid of 128 x 64 tiles, each a K loop (``step``, over the tiles ``{A}`` and ``{B}``)
    into ``acc`` from zero, then ``epilogue``: the kernels below differ only there."""
    step = step.format(A="a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK]", B="b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]")
    return f"""@kernel
def k_loop(a: {a}[M, K], b: bf16[K, N], out: f32[{out}], BM: const = 128, BN: const = 64, BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        {step}
    {epilogue}
"""


ROW_SUMS = k_loop("acc += {A} @ {B}", "out[pm*BM:(pm+1)*BM, pn] = acc.sum(1)", out="M, NB")


def test_a_persistent_k_loop_meets_before_the_next_tiles_products() -> None:
    hopper = _agrees(ROW_SUMS, {"M": 1024, "N": 512, "K": 64, "NB": 8}, {"overlap_epilogue": False})
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
    _agrees(k_loop("acc += {A}.to(bf16) @ {B}", "out[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc", a="f32"),
            {"M": 1000, "N": 520, "K": 200}, seeds=(0,))


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
    _agrees(k_loop("acc = acc * 0.5 + {A} @ {B}", "out[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc"),
            {"M": 1000, "N": 264, "K": 200}, seeds=(0,))


# The consumers refill their own ring (no producer warpgroup): only the MMA warp waits for the
# tiles and the commit alone frees a stage, so the other warps fell rounds behind.
@pytest.mark.parametrize("consts", [{"warp_specialize": False, "persistent": False}, {"warp_specialize": False}])
def test_a_k_loop_whose_role_refills_its_ring(consts: dict) -> None:
    hopper = _agrees((EXAMPLES / "gemm.tk").read_text(), {"M": 130, "N": 264, "K": 520}, consts, seeds=(0, 1))
    loop = hopper[hopper.index("blackwell.mma") - 600:hopper.index("blackwell.mma")]
    assert "hopper.sync" in loop


THREE_K_LOOPS = """@kernel
def seq(a: bf16[M, K], b: bf16[K, N], b2: bf16[K, N], c: f32[M, N], BM: const = 128, BN: const = 64, BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
    acc2 = zeros([BM, BN], f32)
    for k in range(pm % 2, cdiv(K, BK), 2):
        acc2 += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b2[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
    acc3 = zeros([BM, BN], f32)
    for k in range(pn % 3):
        acc3 += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc * 0.5 + acc2 - acc3
"""


def test_three_k_loops_in_sequence_with_zero_trip_runs() -> None:
    # the first loop's two stages do not fit: the kernel has no producer, the others keep rings
    _agrees(THREE_K_LOOPS, {"M": 520, "N": 328, "K": 328}, seeds=(1,))
    _agrees(THREE_K_LOOPS, {"M": 130, "N": 72, "K": 136}, {"persistent": False}, seeds=(1,))


# Read at once under an if inside the loop (its operands from a ring outside the if): the MMA
# warp ran a round of %acc_full ahead of the other warpgroup.
UNDER_IF_IN_LOOP = """@kernel
def under_if(q: bf16[M, 64], k: bf16[N, 64], o: f32[M, 64], BM: const = 128, BN: const = 64):
    grid(cdiv(M, BM))
    pm = program_id(0)
    qt = q[pm*BM:(pm+1)*BM, :]
    acc = zeros([BM, BN], f32)
    for j in range(cdiv(N, BN)):
        kt = k[j*BN:(j+1)*BN, :]
        if (j + pm) % 3 != 1:
            s = qt @ kt.T
            acc = maximum(acc, s)
        else:
            acc = acc * 0.5 + qt @ kt.T
    o[pm*BM:(pm+1)*BM, :] = acc
"""


@pytest.mark.parametrize("consts", [{"persistent": False}, {"persistent": False, "BM": 64}])
def test_a_product_under_an_if_in_a_loop(consts: dict) -> None:
    _agrees(UNDER_IF_IN_LOOP, {"M": 1000, "N": 1000}, consts, seeds=(0,))


def test_two_sums_of_a_loop_without_a_ring() -> None:
    # stages = 1: no ring stage to commit onto; each is a sum read at once (refused before)
    _agrees((EXAMPLES / "gemm_swiglu.tk").read_text(), {"M": 300, "N": 136, "K": 200}, {"stages": 1}, seeds=(0,))
