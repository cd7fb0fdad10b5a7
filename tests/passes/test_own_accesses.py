"""A tensor a kernel both reads and writes (``tile.read_and_written``), or writes twice over the
same elements (``tile.ordered_tensors``): a program's own accesses to it happen in program order
for every thread.  Its loads are no TMA copies (a ring
would fetch ``hs[t - 1]`` before the iteration that writes it), its stores no TMA stores (the
copy lands after the program's next read), and a barrier of the running threads stands between
each write and the accesses around it.  ``tkc run --check`` keeps such a tensor's random input
(poisoning it would make both sides compute from NaN and agree)."""

from __future__ import annotations

import numpy as np
import pytest
from device_checks import interpret_and_emulate, interpret_and_run_on_gpu, lowered

from tkc.compiler import compile_kernel
from tkc.interpreter import random_args
from tkc.ir.dialects.tile import read_and_written

RECURRENCE = """@kernel
def rec(w: bf16[64, 64], hs: bf16[T, 64, 64]):
    grid(1)
    for t in range(1, T):
        acc = hs[t - 1, 0:64, 0:64] @ w[0:64, 0:64]
        hs[t, 0:64, 0:64] = (acc * 0.125).to(bf16)
"""

READ_BACK = """@kernel
def back(x: bf16[M, 64], w: bf16[64, 64], y: bf16[M, 64], z: f32[M, 64]):
    grid(cdiv(M, 64))
    p = program_id(0)
    acc = x[p*64:(p+1)*64, 0:64] @ w[0:64, 0:64]
    y[p*64:(p+1)*64, 0:64] = acc.to(bf16)
    z[p*64:(p+1)*64, 0:64] = y[p*64:(p+1)*64, 0:64].to(f32) * 2.0
"""

IN_PLACE = """@kernel
def twice(x: f32[N]):
    grid(cdiv(N, 16))
    p = program_id(0)
    x[p*16:(p+1)*16] = x[p*16:(p+1)*16] * 2.0
"""


def _compile(src, stop):
    return compile_kernel(src, {}, stop=stop, cache=False)


def test_the_tensors_read_and_written() -> None:
    names = lambda src: {v.name_hint for v in read_and_written(_compile(src, "tkir").kernel_op)}  # noqa: E731
    assert names(RECURRENCE) == {"hs"} and names(READ_BACK) == {"y"} and names(IN_PLACE) == {"x"}


@pytest.mark.parametrize("src, dims", [(RECURRENCE, {"T": 6}), (READ_BACK, {"M": 100})])
def test_emulator_matches_interpreter(src, dims) -> None:
    tile_ir = _compile(src, "tkir").kernel_op
    args = random_args(tile_ir, dims, 1)
    want, got = interpret_and_emulate(tile_ir, lowered(lambda stop: _compile(src, stop)).kernel_op, args, 1)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=2**-7, atol=1e-3)


def test_no_tma_for_a_tensor_read_and_written_and_a_barrier_after_its_store() -> None:
    kernel = _compile(READ_BACK, "hopper").kernel_op
    ops = list(kernel.walk())
    y = kernel.regions[0].block.args[2]
    names = [op.name for op in ops]
    assert not [op for op in ops if op.name in ("hopper.tma_store", "hopper.tma_load") and op.operands[0] is y]
    store = next(i for i, op in enumerate(ops) if op.name == "hopper.store" and op.operands[0] is y)
    load = next(i for i, op in enumerate(ops) if op.name == "hopper.load" and op.operands[0] is y)
    assert store < load and "hopper.sync" in names[store:load]
    # x and w, which nothing writes, still arrive by TMA
    assert names.count("hopper.tma_load") == 2


def test_a_recurrence_keeps_its_loads_in_program_order() -> None:
    kernel = _compile(RECURRENCE, "hopper").kernel_op
    hs = kernel.regions[0].block.args[1]
    assert not [op for op in kernel.walk() if op.name == "hopper.tma_load" and op.operands[0] is hs]


def test_run_check_keeps_the_input_of_a_tensor_updated_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    from tkc import runner

    kernel = _compile(IN_PLACE, "tkir").kernel_op
    args = random_args(kernel, {"N": 40}, 0)
    result = runner.run(kernel, args, "emulate", check=True)
    assert result.ok and not np.isnan(result.outputs[0][2]).any()
    import tkc.emulator

    real = tkc.emulator.emulate

    def off(k, a, **kw):  # an executor that doubles one element twice
        real(k, a, **kw)
        a[0][3] *= 2

    monkeypatch.setattr(tkc.emulator, "emulate", off)
    assert not runner.run(kernel, random_args(kernel, {"N": 40}, 0), "emulate", check=True).ok


TWICE = """@kernel
def twice_written(x: bf16[M, 64], w: bf16[64, 64], y: bf16[M, 64]):
    grid(cdiv(M, 64))
    p = program_id(0)
    acc = x[p*64:(p+1)*64, 0:64] @ w[0:64, 0:64]
    y[p*64:(p+1)*64, 0:64] = acc.to(bf16)
    y[p*64, 0:64] = zeros([64], bf16)
"""

HALVES = """@kernel
def halves(x: bf16[M, 128], w: bf16[128, 128], y: bf16[M, 128]):
    grid(cdiv(M, 64))
    p = program_id(0)
    acc = x[p*64:(p+1)*64, :] @ w[:, :]
    y[p*64:(p+1)*64, 0:64] = acc[:, 0:64].to(bf16)
    y[p*64:(p+1)*64, 64:128] = acc[:, 64:128].to(bf16)
"""


def test_two_writes_of_one_element_keep_their_order() -> None:
    """y's tile then its first row again: no TMA store (it would land after the row), a barrier
    between; the later write wins, as in the interpreter."""
    kernel = _compile(TWICE, "hopper").kernel_op
    names = [op.name for op in kernel.walk()]
    assert "hopper.tma_store" not in names and "hopper.sync" in names
    tile_ir = _compile(TWICE, "tkir").kernel_op
    args = random_args(tile_ir, {"M": 128}, 0)
    want, got = interpret_and_emulate(tile_ir, lowered(lambda stop: _compile(TWICE, stop)).kernel_op, args, 0)
    np.testing.assert_array_equal(got[2][0], 0)
    np.testing.assert_array_equal(got[2], want[2])


def test_writes_of_disjoint_blocks_are_left_alone() -> None:
    y = _compile(HALVES, "tkir").kernel_op.regions[0].block.args[2]
    from tkc.ir.dialects.tile import ordered_tensors

    assert y not in ordered_tensors(_compile(HALVES, "tkir").kernel_op)
    assert "hopper.sync" not in [op.name for op in _compile(HALVES, "hopper").kernel_op.walk()]


def test_the_emulator_refuses_a_write_over_a_tma_store_in_flight() -> None:
    """Hopper IR in which a program TMA-stores y and then stores into it again (the compiler no
    longer makes it; written by hand, as a later pass could): on the GPU the copy may land after
    the second store, and the emulator says so there."""
    from tkc.emulator.machine import emulate
    from tkc.errors import TkcEmulatorError

    src = READ_BACK.replace("y[p*64:(p+1)*64, 0:64].to(f32) * 2.0", "acc * 2.0")  # y no longer read back
    kernel = _compile(src, "hopper").kernel_op
    tma = [op for op in kernel.walk() if op.name == "hopper.tma_store"]
    z_store = next(op for op in kernel.walk() if op.name == "hopper.store")
    assert len(tma) == 1 and z_store.loc.line == 7
    z_store.operands[0] = tma[0].operands[0]  # z's store, sent to y
    args = random_args(_compile(src, "tkir").kernel_op, {"M": 128}, 0)
    with pytest.raises(TkcEmulatorError, match=r"writes element \[\d+, \d+\] of 'y' while this program's TMA "
                                               r"store at line 6 still writes it") as e:
        emulate(kernel, args)
    assert e.value.loc is not None and e.value.loc.line == 7


@pytest.mark.gpu
@pytest.mark.parametrize("src, dims", [(RECURRENCE, {"T": 9}), (READ_BACK, {"M": 1000}), (IN_PLACE, {"N": 1000}),
                                       (TWICE, {"M": 1000})])
def test_on_the_gpu(src, dims) -> None:
    _, want, got = interpret_and_run_on_gpu(lambda stop: _compile(src, stop), dims)
    for w, g in zip(want, got):
        if isinstance(w, np.ndarray):
            np.testing.assert_allclose(g, w, rtol=2**-7, atol=1e-3)
