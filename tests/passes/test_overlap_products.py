"""The ``overlap-products`` pass (pin ``overlap_products``): two products that do not depend on
each other are both issued before either is waited for, the first wait keeping the second in
flight (pending 1); an accumulation's wait sinks to the end of its loop body; nothing moves
past an op that needs the result or touches shared memory; the emulator agrees with the
interpreter; without the pin nothing changes."""

from __future__ import annotations

import numpy as np
from device_checks import interpret_and_emulate, lowered

from tkc.compiler import compile_kernel
from tkc.interpreter import random_args, run_kernel

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
