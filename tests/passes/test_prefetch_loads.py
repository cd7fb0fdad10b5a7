"""The prefetch-loads pass (pin ``prefetch``): which loads it prefetches, how far ahead, and
that every prefetched box is one a later iteration loads, checked by running its output in
the emulator with the loads and prefetches recorded."""

from __future__ import annotations

import collections
import pathlib

import numpy as np
import pytest

from tkc.codegen.ptxas import assemble, find_ptxas
from tkc.compiler import compile_kernel
from tkc.emulator import machine
from tkc.errors import TkcUsageError, TkcVerifyError
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def hopper(example: str, consts: dict) -> str:
    return compile_kernel(EXAMPLES / example, consts, stop="hopper", cache=False).asm["hopper"]


def _recorded(example: str, consts: dict, args: list) -> list[tuple[str, str, tuple[int, ...]]]:
    """("load" or "prefetch", tensor, offsets) in the order the emulator ran them."""
    compiled = compile_kernel(EXAMPLES / example, consts, stop="hopper", cache=False)
    events = []
    load = machine._HANDLERS["hopper.load"]

    def record(kind):
        def handler(wg, op, tensor, *offsets):
            events.append((kind, op.tensor.name_hint, tuple(int(o) for o in offsets)))
            return load(wg, op, tensor, *offsets) if kind == "load" else None
        return handler

    patched = {"hopper.load": record("load"), "hopper.prefetch": record("prefetch")}
    saved = {k: machine._HANDLERS[k] for k in patched}
    machine._HANDLERS.update(patched)
    try:
        machine.emulate(compiled.kernel_op, args)
    finally:
        machine._HANDLERS.update(saved)
    return events


def _layernorm_args(M: int, N: int) -> list:
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((M, N), (N,), (N,)))
    return [x, w, b, np.zeros((M, N), np.float32), 1e-5]


@pytest.mark.parametrize("distance", [1, 2, 3])
def test_every_prefetch_is_a_later_iterations_load(distance):
    # One row of four 256-wide blocks, the last partial: each sweep loads blocks in order (the
    # first after block 0 once more, for the mean its sums are shifted by, with the partial
    # block after its loop; the second back to front, with w and b), and every load in a loop
    # but its first iteration's was prefetched, earlier, exactly once; nothing past either
    # loop's end.
    events = _recorded("layernorm.tk", {"BN": 256, "prefetch": distance}, _layernorm_args(1, 1000))
    loads = [(t, o) for kind, t, o in events if kind == "load"]
    prefetches = [(t, o) for kind, t, o in events if kind == "prefetch"]
    sweeps = [loads[:5], loads[5:]]  # x blocks 0, 0..2 and 3; then (x, w, bias) for blocks 3..0
    assert [o[-1] for _, o in sweeps[0]] == [0, 0, 256, 512, 768]
    assert [o[-1] for _, o in sweeps[1][::3]] == [768, 512, 256, 0]
    later = sweeps[0][2:4] + sweeps[1][3:]  # the loops' loads but each loop's first iteration's
    assert collections.Counter(prefetches) == collections.Counter(later)
    for i, (kind, t, o) in enumerate(events):
        if kind == "prefetch":
            assert ("load", t, o) in events[i + 1:], f"prefetch of {t} at {o} comes after its load"


def test_distance_sets_the_prologue():
    text = hopper("layernorm.tk", {"BN": 256, "prefetch": 3})
    # Per loop: the guarded block in the body, and iterations lb + 1 and lb + 2 before the loop.
    assert text.count("hopper.prefetch %x") == 2 * 3
    assert text.count("hopper.prefetch %w") == 3 and text.count("hopper.prefetch %bias") == 3


@pytest.mark.parametrize("consts", [{}, {"prefetch": 0}])
def test_without_the_pin_nothing_changes(consts):
    assert "hopper.prefetch" not in hopper("layernorm.tk", {"BN": 256, **consts})


def test_loads_outside_loops_are_left_alone():
    # The one-block branch has no loop; only the two sweeps' loads are prefetched.
    text = hopper("softmax.tk", {"BN": 256, "prefetch": 1})
    assert text.count("hopper.prefetch") == 2


SOURCE = '''
@kernel
def k(x: bf16[M, N], y: bf16[M, N], c: bf16[M, N], BN: const = 256):
    grid(M)
    r = program_id(0)
    acc = zeros([1, BN], f32)
    for j in range(4):
        acc += x[r:r+1, 0:BN].to(f32) + c[r:r+1, 0:BN].to(f32) * 0.0
    y[r:r+1, 0:BN] = acc.to(bf16)
'''


def test_a_load_that_does_not_move_with_the_loop_is_not_prefetched():
    text = compile_kernel(SOURCE, {"prefetch": 1}, stop="hopper", cache=False).asm["hopper"]
    assert "hopper.prefetch" not in text


def test_tall_boxes_are_not_prefetched():
    tall = hopper("layernorm.tk", {"BM": 32, "BN": 256, "prefetch": 1})
    assert "hopper.prefetch %x" not in tall and "hopper.prefetch %w" in tall  # w's box is one row
    assert "hopper.prefetch %x" in hopper("layernorm.tk", {"BM": 16, "BN": 256, "prefetch": 1})


def test_the_pin_takes_zero_but_not_a_negative():
    with pytest.raises(TkcUsageError, match="prefetch = -1: expected an integer >= 0"):
        hopper("layernorm.tk", {"prefetch": -1})


def test_the_verifier_refuses_a_squeezed_last_axis():
    text = '''
tile.kernel @k {threads = 128, tma_maps = [], smem_bytes = 0} {
^(%x: tensor<bf16[M, N]>):
  %0 = tile.constant {value = 0} : i32
  hopper.prefetch %x, %0, %0 {box = [1, 1], squeeze = [1]}
  tile.return
}
'''
    with pytest.raises(TkcVerifyError, match="rows along the last axis"):
        verify(parse_module(text))


def test_thread_zero_issues_one_bulk_prefetch_a_row():
    ptx = compile_kernel(EXAMPLES / "layernorm.tk", {"BM": 16, "BN": 256, "prefetch": 1}, stop="ptx",
                         cache=False).asm["ptx"]
    # Sixteen rows a box: x 16 times in each sweep, w and bias once each in the second.
    assert ptx.count("cp.async.bulk.prefetch.L2.global") == 16 + 16 + 1 + 1
    if find_ptxas() is not None:
        assemble(ptx, "sm_90a")
