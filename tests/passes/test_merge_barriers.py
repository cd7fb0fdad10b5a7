"""merge-barriers on attention backward's loop: which meetings it drops and which it keeps,
where both warpgroups compute and issue the copies (``warp_specialize=false``) and where a
producer warpgroup issues them (the D=128 default: the consumers meet by their role's own
barrier, ``hopper.sync``).  What the kernel computes after it is checked against the
interpreter in the emulator (tests/examples/test_attn_train.py) and on the GPU."""

from __future__ import annotations

import pathlib

import pytest

from tkc.compiler import compile_kernel
from tkc.ir.core import Operation

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "attn_train.tk"


def _loop_body(consts: dict, pipeline: str | None = None, target: str = "sm_90a") -> list[Operation]:
    kw = {"hopper_pipeline": pipeline} if pipeline else {}
    consts = {"warp_specialize": False, **consts}
    k = compile_kernel(EXAMPLE, consts, stop="hopper", cache=False, kernel="attn_bwd", target=target, **kw).kernel_op
    loop = next(op for op in k.walk() if op.name == "tile.for"
                and any(x.name == "hopper.wgmma" for x in op.regions[0].block.ops))
    return loop.regions[0].block.ops


def _meetings(ops: list[Operation]) -> list[str]:
    return [op.name for op in ops if op.name in ("hopper.barrier", "hopper.sync", "hopper.tma_store")
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


@pytest.mark.parametrize("causal", [False, True])
def test_with_a_producer_the_consumers_meet_twice_an_iteration(causal: bool) -> None:
    """The same two rewrites on the consumers' loop, with their role's barrier as the meeting:
    dQ's staging wait rides the barrier that publishes dS^T, and dS^T's leading barrier goes
    (four meetings an iteration without the pass)."""
    from tkc.passes.pipeline import HOPPER_PIPELINE

    consts = {"D": 128, "causal": causal, "warp_specialize": True}
    ops = _loop_body(consts)
    assert _meetings(ops) == ["hopper.sync", "hopper.tma_store"]
    store = next(i for i, op in enumerate(ops) if op.name == "hopper.smem_store")
    assert ops[store - 1].name != "hopper.sync"
    i = next(i for i, op in enumerate(ops) if op.name == "hopper.sync")
    assert [op.attributes["sync"] for op in ops[:i] if op.name == "hopper.tma_store_wait"] == [False]
    without = _loop_body(consts, HOPPER_PIPELINE.replace("merge-barriers,", ""))
    assert _meetings(without) == ["hopper.sync", "hopper.sync", "hopper.tma_store_wait", "hopper.tma_store"]


def _emulate_backward(consts: dict, H: int, KVH: int, N: int, data_seed: int, seeds: range,
                      drop: str | None = None) -> None:
    """attn_bwd (one batch, D from ``consts``) in the emulator under each interleaving seed;
    ``drop`` names the barrier op right before dS^T's store to erase first (what the pass must
    not do)."""
    import torch

    from tkc.emulator.machine import emulate

    D = consts["D"]
    g = torch.Generator().manual_seed(data_seed)
    q, k, v, do = (torch.randn(1, h, N, D, generator=g).bfloat16() for h in (H, KVH, KVH, H))
    lse, delta = torch.randn(1, H, N, generator=g) + 4, torch.randn(1, H, N, generator=g)
    k_op = compile_kernel(EXAMPLE, consts, stop="hopper", cache=False, kernel="attn_bwd").kernel_op
    assert k_op.attributes["threads"] == (384 if consts.get("warp_specialize") else 256)
    if drop is not None:
        body = next(op for op in k_op.walk() if op.name == "tile.for"
                    and any(x.name == "hopper.wgmma" for x in op.regions[0].block.ops)).regions[0].block
        i = next(i for i, op in enumerate(body.ops) if op.name == drop and body.ops[i + 1].name == "hopper.smem_store")
        body.ops[i].erase()
    for seed in seeds:
        zeros = torch.zeros(1, KVH, N, D).bfloat16()
        emulate(k_op, [q, k, v, do, lse, delta, torch.zeros(1, H, N, D), zeros, zeros.clone(), D ** -0.5], seed=seed)


@pytest.mark.parametrize("consts, H, KVH, N, data_seed, seeds", [
    ({"D": 64}, 2, 1, 160, 0, range(6)),
    ({"D": 128, "warp_specialize": True}, 2, 1, 200, 1, range(3)),
])
def test_merged_backward_has_no_race_under_many_interleavings(consts: dict, H: int, KVH: int, N: int,
                                                               data_seed: int, seeds: range) -> None:
    """The merged loop's warpgroups (both computing at D=64; a producer and two consumers at
    D=128) under several seeded interleavings: no race on dS^T's tile or dQ's staging (the test
    below shows the emulator sees that race where the barrier is needed)."""
    _emulate_backward(consts, H, KVH, N, data_seed, seeds)


@pytest.mark.parametrize("consts, drop, H, KVH, N, data_seed, seeds", [
    ({"D": 64, "tma_store": False}, "hopper.barrier", 4, 2, 200, 3, range(12, 20)),
    ({"D": 128, "warp_specialize": True, "tma_store": False}, "hopper.sync", 2, 1, 200, 1, range(4)),
])
def test_the_emulator_sees_the_race_a_needed_barrier_prevents(consts: dict, drop: str, H: int, KVH: int, N: int,
                                                               data_seed: int, seeds: range) -> None:
    """What the pass must not do, done by hand: with dQ's adds from the threads nothing meets
    after dQ's product, so the pass keeps dS^T's leading barrier (the CTA's, or the consumers'
    with a producer); dropped, one warpgroup writes the next dS^T while the other's product
    still reads it (seed 16 interleaves them so at D=64)."""
    from tkc.emulator.smem import RaceError

    with pytest.raises(RaceError, match="dst_smem"):
        _emulate_backward(consts, H, KVH, N, data_seed, seeds, drop)
