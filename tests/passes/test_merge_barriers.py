"""merge-barriers on attention backward's loop: which meetings it drops and which it keeps.
What the kernel computes after it is checked against the interpreter in the emulator
(tests/examples/test_attn_train.py) and on the GPU."""

from __future__ import annotations

import pathlib

import pytest

from tkc.compiler import compile_kernel
from tkc.ir.core import Operation

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "attn_train.tk"


def _loop_body(consts: dict, pipeline: str | None = None, target: str = "sm_90a") -> list[Operation]:
    kw = {"hopper_pipeline": pipeline} if pipeline else {}
    k = compile_kernel(EXAMPLE, consts, stop="hopper", cache=False, kernel="attn_bwd", target=target, **kw).kernel_op
    loop = next(op for op in k.walk() if op.name == "tile.for"
                and any(x.name == "hopper.wgmma" for x in op.regions[0].block.ops))
    return loop.regions[0].block.ops


def _meetings(ops: list[Operation]) -> list[str]:
    return [op.name for op in ops if op.name in ("hopper.barrier", "hopper.tma_store")
            or (op.name == "hopper.tma_store_wait" and op.attributes.get("sync", True))]


@pytest.mark.parametrize("D, causal", [(128, False), (128, True), (64, False)])
def test_backward_meets_twice_an_iteration(D: int, causal: bool) -> None:
    """dQ's staging wait rides the barrier that publishes dS^T, and dS^T's leading barrier
    goes: dQ's product, its only reader, is waited for before dQ's TMA reduction meets."""
    ops = _loop_body({"D": D, "causal": causal})
    assert _meetings(ops) == ["hopper.barrier", "hopper.tma_store"]
    i = next(i for i, op in enumerate(ops) if op.name == "hopper.barrier")
    waits = [op for op in ops[:i] if op.name == "hopper.tma_store_wait"]
    assert len(waits) == 1 and waits[0].attributes["sync"] is False
    store = next(i for i, op in enumerate(ops) if op.name == "hopper.smem_store")
    assert ops[store - 1].name != "hopper.barrier"


def test_without_the_pass_the_backward_meets_four_times() -> None:
    from tkc.passes.pipeline import HOPPER_PIPELINE

    ops = _loop_body({"D": 128}, HOPPER_PIPELINE.replace("merge-barriers,", ""))
    assert _meetings(ops) == ["hopper.barrier", "hopper.barrier", "hopper.tma_store_wait", "hopper.tma_store"]


def test_a_write_barrier_stays_when_nothing_meets_after_its_readers() -> None:
    """With dQ's adds from the threads (no TMA reduction, no meeting after dQ's product), the
    barrier before dS^T's store is what keeps the next iteration's store off the tile the
    other warpgroup's product still reads."""
    ops = _loop_body({"D": 64, "tma_store": False})
    store = next(i for i, op in enumerate(ops) if op.name == "hopper.smem_store")
    assert ops[store - 1].name == "hopper.barrier"
    assert _meetings(ops) == ["hopper.barrier", "hopper.barrier"]


def test_kernels_with_roles_keep_their_barriers() -> None:
    from tkc.passes.pipeline import HOPPER_PIPELINE

    consts = {"D": 128, "warp_specialize": True}
    with_pass = [op.name for op in _loop_body(consts)]
    without = [op.name for op in _loop_body(consts, HOPPER_PIPELINE.replace("merge-barriers,", ""))]
    assert with_pass == without
