"""The ``buffer-operands`` pass (two buffers for a product's shared operands that the threads
write every iteration, the product kept in flight) on examples/gemm_mx.tk, whose dequantized
operands are such tiles on sm_90a (one program an SM: at two, its default, the second buffers
do not fit, and the pass leaves the loop): the loop it leaves, the emulator agreeing with the
interpreter on it, and the emulator refusing the same loop with one buffer (so the second
buffer is what makes it right, and the emulator would see a pass that dropped it)."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from device_checks import interpret_and_emulate
from mx_reference import quantize
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.errors import TkcEmulatorError
from tkc.ir.builder import Builder
from tkc.ir.dialects import tile
from tkc.runner import run

FILE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "gemm_mx.tk"


def _compile(stop: str, target: str = "sm_90a", **consts):
    return compile_kernel(FILE, {"ctas_per_sm": 1, **consts}, kernel="gemm_mx", stop=stop, target=target, cache=False)


def _args(M: int = 200, N: int = 136, K: int = 320) -> list:
    a, sa = quantize(torch.randn(M, K, dtype=torch.bfloat16))
    b, sb = quantize(torch.randn(N, K, dtype=torch.bfloat16))
    return [x.float().numpy() for x in (a, sa, b, sb, torch.empty(M, N))]


def _loop(kernel):
    return next(op for op in kernel.walk() if op.name == "tile.for"
                and any(x.name == "hopper.wgmma" for x in op.regions[0].block.ops))


@pytest.mark.parametrize("pins", [{}, {"stage_loads": 0}, {"BN": 256}])
def test_operands_get_two_buffers_and_the_product_stays_in_flight(pins: dict) -> None:
    kernel = _compile("hopper", **pins).kernel_op
    body = _loop(kernel).regions[0].block
    names = [op.name for op in body.ops]
    assert "hopper.wgmma_wait" not in names and names.count("hopper.wgmma_wait_group") == 1
    assert next(op for op in body.ops if op.name == "hopper.wgmma_wait_group").pending == 1
    mma = next(op for op in body.ops if op.name == "hopper.wgmma")
    for v in (mma.a, mma.b):  # both operands: a stage of a two-buffer allocation
        assert v.owner.name == "hopper.stage" and v.owner.ring.owner.attributes["stages"] == 2
    assert names.count("hopper.barrier") == 2  # one before the stores, one before the product
    waits = [op for op in kernel.walk() if op.name == "hopper.wgmma_wait"]
    assert len(waits) == 1 and waits[0].pending == 0  # the accumulator, behind the loop


@pytest.mark.parametrize("pins", [{}, {"stage_loads": 0}, {"BN": 256}])
def test_emulator_as_interpreter(pins: dict) -> None:
    args = _args(N=272)
    want, got = interpret_and_emulate(_compile("tkir", **pins).kernel_op, _compile("hopper", **pins).kernel_op,
                                      args, seed=4)
    np.testing.assert_allclose(got[4], want[4], rtol=2**-7, atol=0)


def _one_buffer():
    kernel = _compile("hopper", stage_loads=1).kernel_op
    body = _loop(kernel).regions[0].block
    for stage in [op for op in body.ops if op.name == "hopper.stage" and op.ring.owner.attributes.get("stages") == 2
                  and op.ring.type.dtype.name == "bf16"]:
        zero = Builder.before(stage).value(tile.ConstantOp, [], stage.index.type, {"value": 0})
        stage.operands[1] = zero  # every iteration writes buffer 0
    return kernel


def test_one_buffer_is_a_race_the_emulator_refuses() -> None:
    with pytest.raises(TkcEmulatorError, match="still reading it"):
        emulate(_one_buffer(), _args(), seed=1)


def test_tkc_run_of_lowered_ir_reports_the_emulators_error() -> None:
    """``tkc run`` of a hopper IR dump without ``--check``: the emulator's error stands (the
    interpreter, which explains a tile kernel's own mistakes, cannot run hopper ops)."""
    with pytest.raises(TkcEmulatorError, match="still reading it"):
        run(_one_buffer(), _args(), backend="emulate")


def test_not_where_the_second_buffers_do_not_fit() -> None:
    """Two programs an SM (the example's default) leave each 113 KB: the loop stays as it is."""
    kernel = compile_kernel(FILE, {}, kernel="gemm_mx", stop="hopper", cache=False).kernel_op
    names = [op.name for op in _loop(kernel).regions[0].block.ops]
    assert "hopper.wgmma_wait_group" not in names and "hopper.wgmma_wait" in names


def test_not_on_tcgen05() -> None:
    """sm_100a's products complete through their commits: the pass leaves them."""
    kernel = _compile("hopper", "sm_100a").kernel_op
    assert not any(op.name == "hopper.wgmma_wait_group" for op in kernel.walk())


def test_codegen_stores_runs_and_decodes_fp8_in_pairs() -> None:
    """The dequantized operands go to shared memory 16 bytes a store, and the fp8 bytes are
    decoded two a conversion."""
    ptx = _compile("ptx", stage_loads=1).asm["ptx"]
    assert "st.shared.b16" not in ptx and ptx.count("st.shared.v4.b32") >= 16
    pairs = [line for line in ptx.splitlines() if "cvt.rn.f16x2.e4m3x2" in line]
    assert pairs and all("hi;" in line for line in pairs)  # both halves of each conversion used


# A GEMM whose operands the threads compute (scaled copies of loaded tiles) in a loop, as written
# by a user: what buffer-operands applies to, and three ways it must not.
_COMPUTED_B = """@kernel
def g(a: bf16[M, K], b: bf16[N, K], c: f32[M, N], r: f32[P, M], BM: const = 128, BN: const = 128, BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    s = zeros([BM], f32)
    for k in range(cdiv(K, BK)):
{body}
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc
    r[pn, pm*BM:(pm+1)*BM] = s
"""
_B = "(b[pn*BN:(pn+1)*BN, k*BK:(k+1)*BK].to(f32) * 0.5).to(bf16).T"
_A = "(a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK].to(f32) * 2.0).to(bf16)"
_BODIES = {
    "applies": f"        acc += {_A} @ {_B}",
    "reads the accumulator": f"        s += acc.max(1)\n        acc += {_A} @ {_B}",
    "two products": f"        acc += {_A} @ {_B}\n        acc += {_A} @ {_B}",
    "product under an if": f"        if k % 2 == 0:\n            acc += {_A} @ {_B}",
}


@pytest.mark.parametrize("case", list(_BODIES))
def test_which_loops_it_takes(case: str) -> None:
    """Only a loop with one product, whose accumulator nothing else reads, keeps it in flight;
    each kernel agrees with the interpreter in the emulator either way."""
    src = _COMPUTED_B.format(body=_BODIES[case])
    hop = compile_kernel(src, {}, stop="hopper", cache=False).kernel_op
    taken = any(op.name == "hopper.wgmma_wait_group" for op in hop.walk())
    assert taken == (case == "applies")
    M, N, K = 200, 136, 192
    g = np.random.default_rng(3)
    args = [g.standard_normal((M, K)).astype(np.float32), g.standard_normal((N, K)).astype(np.float32),
            np.zeros((M, N), np.float32), np.zeros((2, M), np.float32)]
    args[0], args[1] = (np.asarray(torch.from_numpy(x).to(torch.bfloat16).float()) for x in args[:2])
    want, got = interpret_and_emulate(compile_kernel(src, {}, stop="tkir", cache=False).kernel_op, hop, args, seed=2)
    np.testing.assert_allclose(got[2], want[2], rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got[3], want[3], rtol=1e-4, atol=1e-3)
