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
    return compile_kernel(FILE, {"ctas_per_sm": 1, **consts}, stop=stop, target=target, cache=False)


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
    kernel = compile_kernel(FILE, {}, stop="hopper", cache=False).kernel_op
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
    assert "cvt.f32.f16 $1, hi" not in ptx and "cvt.rn.f16x2.e4m3x2" in ptx
    assert all("hi;" in line for line in ptx.splitlines() if "cvt.rn.f16x2.e4m3x2" in line)
