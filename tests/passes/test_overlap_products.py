"""The ``overlap-products`` pass (pin ``overlap_products``): two products that do not depend on
each other are both issued before either is waited for, the first wait keeping the second in
flight (pending 1); an accumulation's wait sinks to the end of its loop body; nothing moves
past an op that needs the result or touches shared memory; a branch of register work alone (an
edge mask) runs while a product is in flight, and a stage's release goes down with its wait;
a product that reads only tiles TMA writes stays in flight across other tiles' stores and a
barrier; the emulator agrees with the interpreter; without the pin nothing changes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from device_checks import interpret_and_emulate, lowered

from tkc.compiler import compile_kernel
from tkc.interpreter import random_args, run_kernel
from tkc.ir.core import clone
from tkc.passes.overlap_products import _copied_only, _sink_waits

ROOT = Path(__file__).resolve().parents[2]

SRC = """@kernel
def two(a: bf16[M, 256], b: bf16[64, 64], c: bf16[64, 64], y: f32[M, 64]):
    grid(cdiv(M, 64))
    i = program_id(0)
    bt = b[0:64, :]
    ct = c[0:64, :]
    acc = zeros([64, 64], f32)
    for j in range(4):
        at = a[i*64:(i+1)*64, j*64:(j+1)*64]
        s = at @ bt
        t = at @ ct
        u = s * t
        acc += u.to(bf16) @ ct
    y[i*64:(i+1)*64, :] = acc
"""
DIMS = {"M": 150}


def _compile(stop: str, pinned: bool = True):
    return compile_kernel(SRC, {"overlap_products": pinned}, stop=stop, cache=False)


def _product_loop(pinned: bool = True):
    """The consumers' loop (the producer role has one of its own, without products)."""
    return next(op for op in _compile("hopper", pinned).kernel_op.walk() if op.name == "tile.for"
                and any(x.name == "hopper.wgmma" for x in op.regions[0].block.ops))


def _waits_and_issues(pinned: bool) -> list[str]:
    loop = _product_loop(pinned)
    return [f"wait {op.pending}" if op.name == "hopper.wgmma_wait" else "issue"
            for op in loop.regions[0].block.ops if op.name in ("hopper.wgmma", "hopper.wgmma_wait")]


def test_independent_products_are_issued_together() -> None:
    assert _waits_and_issues(False) == ["issue", "wait 0", "issue", "wait 0", "issue", "wait 0"]
    got = _waits_and_issues(True)
    assert got[:4] == ["issue", "issue", "wait 1", "wait 0"], got
    assert got[-2:] == ["issue", "wait 0"], got  # the accumulation: waited for at the end of the body


def test_the_loop_body_ends_with_the_accumulation_wait() -> None:
    loop = _product_loop()
    ops = [op.name for op in loop.regions[0].block.ops]
    last_issue = max(i for i, n in enumerate(ops) if n == "hopper.wgmma")
    last_wait = max(i for i, n in enumerate(ops) if n == "hopper.wgmma_wait")
    assert last_wait > last_issue
    # Everything between the accumulation's issue and its wait runs while it is in flight,
    # none of it a shared-memory op.
    between = ops[last_issue + 1:last_wait]
    assert not any(n in ("hopper.smem_store", "hopper.barrier", "hopper.mbarrier_arrive") for n in between), between


def test_emulator_matches_interpreter_without_spills() -> None:
    tile_ir = _compile("tkir").kernel_op
    want, got = interpret_and_emulate(tile_ir, lowered(_compile).kernel_op, random_args(tile_ir, DIMS, 3), 3)
    np.testing.assert_allclose(got[3], want[3], rtol=1e-3, atol=1e-2)


def test_the_interpreter_ignores_the_pin() -> None:
    args = random_args(_compile("tkir").kernel_op, DIMS, 4)
    plain = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_kernel(_compile("tkir").kernel_op, args)
    run_kernel(_compile("tkir", False).kernel_op, plain)
    np.testing.assert_array_equal(args[3], plain[3])


# Two products of one stage of ``a``, the first masked at the grid's edge by a branch of
# register work before the second is needed.
MASKED = """@kernel
def masked(a: bf16[M, 256], b: bf16[64, 64], c: bf16[64, 64], y: f32[M, 64]):
    grid(cdiv(M, 64))
    i = program_id(0)
    bt = b[0:64, :]
    ct = c[0:64, :]
    rows = i*64 + arange(64)
    acc = zeros([64, 64], f32)
    for j in range(4):
        at = a[i*64:(i+1)*64, j*64:(j+1)*64]
        s = at @ bt
        t = at @ ct
        if (i + 1) * 64 > M:
            s = where(rows[:, None] < M, s, 0.0)
        u = exp2(s * 0.125) * t
        acc += u.to(bf16) @ ct
    y[i*64:(i+1)*64, :] = acc
"""


def _masked(stop: str, pinned: bool = True):
    return compile_kernel(MASKED, {"overlap_products": pinned}, stop=stop, cache=False)


def _loop_ops(module) -> list:
    loop = next(op for op in module.kernel_op.walk() if op.name == "tile.for"
                and any(x.name == "hopper.wgmma" for x in op.regions[0].block.ops))
    return loop.regions[0].block.ops


def test_a_register_branch_runs_while_a_product_is_in_flight() -> None:
    ops = _loop_ops(_masked("hopper"))
    names = [op.name for op in ops]
    branch = names.index("tile.if")
    second = [i for i, op in enumerate(ops) if op.name == "hopper.wgmma_wait"][1]
    assert second > branch + 1, names  # the mask and the exponentials ran before t was waited for
    assert names[branch + 1:second].count("tile.exp2") == 1, names[branch:second]


def test_a_stage_release_goes_down_with_its_wait() -> None:
    ops = _loop_ops(_masked("hopper"))
    names = [op.name for op in ops]
    second = [i for i, op in enumerate(ops) if op.name == "hopper.wgmma_wait"][1]
    # a's stage is released right behind the wait of the last product reading it (it was right
    # behind it before the wait moved): never before it, and not left where the wait used to be.
    assert names.count("hopper.mbarrier_arrive") == 1
    assert names[second + 1] == "hopper.mbarrier_arrive", names
    assert second > names.index("tile.if")
    assert ops[second].pending == 0


def test_a_carried_release_passes_no_other_barriers_wait() -> None:
    """A release is what may complete a later barrier wait: once the wait carries one, it stops
    before any barrier's wait (here a copy of the loop's own full wait planted after it)."""
    ops = _loop_ops(_masked("hopper", False))
    waits = [i for i, op in enumerate(ops) if op.name == "hopper.wgmma_wait"]
    release = next(i for i in range(waits[1], len(ops)) if ops[i].name == "hopper.mbarrier_arrive")
    full_wait = next(op for op in ops if op.name == "hopper.mbarrier_wait")
    planted = clone(full_wait, {})
    block = ops[0].parent
    block.insert(release + 1, planted)
    _sink_waits(block)
    names = [op.name for op in block.ops]
    at = block.ops.index(planted)
    assert names[at - 2:at] == ["hopper.wgmma_wait", "hopper.mbarrier_arrive"], names


def test_masked_emulator_matches_interpreter() -> None:
    tile_ir = _masked("tkir").kernel_op
    args = random_args(tile_ir, {"M": 150}, 5)
    want, got = interpret_and_emulate(tile_ir, lowered(_masked).kernel_op, args, 5)
    np.testing.assert_allclose(got[3], want[3], rtol=1e-3, atol=1e-2)


def _attn_bwd_loop() -> list:
    module = compile_kernel(ROOT / "examples" / "attn_train.tk", {}, kernel="attn_bwd", stop="hopper", cache=False)
    return module, _loop_ops(module)


def test_the_tiles_only_copies_write() -> None:
    module, _ = _attn_bwd_loop()
    names = {v.name_hint for v in _copied_only(module.kernel_op)}
    # K's tile is stored into behind the loop (dV goes out through it); dS^T and dQ's staging
    # tile are stored by the threads every iteration.
    assert names == {"q_smem", "do_smem", "v_smem"}, names


def test_a_product_of_copied_tiles_stays_in_flight_across_a_store() -> None:
    """Attention backward's dV += P^T dO (P^T from registers, dO from its ring), issued behind
    dQ's product, runs under the staging of dQ's result in shared memory, its TMA reduction
    and dK's issue; dQ's product, which reads dS^T (a tile the threads store), is waited for
    before that staging store, with dV still in flight (its A fragments converted in registers
    on the way)."""
    _, ops = _attn_bwd_loop()
    names = [op.name for op in ops]
    dq, dv, dk = [op for op in ops if op.name == "hopper.wgmma"][2:]
    dv_wait = next(i for i, op in enumerate(ops) if op.name == "hopper.wgmma_wait" and op.x is dv.result)
    dq_wait = next(i for i, op in enumerate(ops) if op.name == "hopper.wgmma_wait" and op.x is dq.result)
    staging = names.index("hopper.smem_store", dq_wait)
    reduce = names.index("hopper.tma_store", dq_wait)
    assert ops.index(dq) < ops.index(dv) < dq_wait < staging < reduce < ops.index(dk) < dv_wait, names
    assert ops[dq_wait].pending == 1 and ops[dv_wait].pending == 1  # dV, then dK in flight
    assert names[dv_wait + 1] == "hopper.mbarrier_arrive"  # dO's stage released behind dV
