"""The ``count-divisions`` pass: in an innermost loop, ``(t + c) // d`` and ``(t + c) % d`` by a
runtime divisor that cannot be negative become a quotient and a remainder the loop carries
(ring attention's rank and block of each iteration); a divisor that may be negative (a scalar
parameter) stays a division, and a zero divisor still gives the interpreter's 0.  The emulator
agrees with the interpreter on tails; the dump reads back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from device_checks import interpret_and_emulate, lowered

from tkc.compiler import compile_kernel
from tkc.interpreter import random_args
from tkc.ir.dialects import tile
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Blocks walked in one loop (t // nb, t % nb), and every dividend form: t + c, c + t, t - c; a
# divisor that is 0 on program 0 (program_id); one that may be negative (k).
WALK = """@kernel
def walk(x: f32[R, C], y: f32[2, R, C], z: i32[2, T, 5], k: i32, BR: const = 16, BC: const = 16):
    grid(2)
    p = program_id(0)
    nb = cdiv(C, BC)
    for t in range(cdiv(R, BR) * nb):
        i = t // nb
        j = t % nb
        y[p, i*BR:(i+1)*BR, j*BC:(j+1)*BC] = x[i*BR:(i+1)*BR, j*BC:(j+1)*BC] * 2.0
        z[p, t, 0] = (t + 3) // p
        z[p, t, 1] = (p + t) % nb
        z[p, t, 2] = (t - 5) // nb
        z[p, t, 3] = (t - 5) % nb
        z[p, t, 4] = t % k
"""


def _hopper(src, consts=None):
    return compile_kernel(src, consts or {}, stop="hopper", cache=False)


def _divisions(loop):
    return [op for op in loop.walk() if op.name in ("tile.floordiv", "tile.rem")
            and tile.constant_value(op.operands[1]) is None]


def test_a_walk_carries_its_quotients_and_remainders() -> None:
    kernel = _hopper(WALK).kernel_op
    (loop,) = [op for op in kernel.walk() if op.name == "tile.for"]
    # only t % k is left: k may be negative
    (left,) = _divisions(loop)
    assert left.operands[1].name_hint == "k"
    assert len(loop.regions[0].block.args) > 1


@pytest.mark.parametrize("dims,k", [({"R": 37, "C": 45, "T": 9}, -4), ({"R": 16, "C": 70, "T": 5}, 3),
                                    ({"R": 50, "C": 16, "T": 4}, 0)])
def test_emulator_matches_interpreter(dims, k) -> None:
    tile_ir = compile_kernel(WALK, {}, stop="tkir", cache=False).kernel_op
    args = random_args(tile_ir, dims, 3)
    args[-1] = k
    low = lowered(lambda stop: compile_kernel(WALK, {}, stop=stop, cache=False))
    want, got = interpret_and_emulate(tile_ir, low.kernel_op, args, 3)
    for w, g in zip(want, got):
        if isinstance(w, np.ndarray):
            np.testing.assert_array_equal(g, w)


def test_ring_attention_divides_nothing_an_iteration() -> None:
    kernel = _hopper((EXAMPLES / "ring_attn.tk").read_text(), {"defer_last": True}).kernel_op
    loops = [op for op in kernel.walk() if op.name == "tile.for" and op.operands[1].owner.name != "tile.minimum"
             and not any(inner is not op and inner.name == "tile.for" for inner in op.walk())]
    # the K/V loops of the producer and of the consumers (not a ring's prologue, a minimum of
    # the stages and the trip; the pushers' loops divide once a block)
    walks = [loop for loop in loops if any(op.name == "hopper.wgmma" or op.name == "hopper.tma_load"
                                           and op.operands[0].name_hint == "kg" for op in loop.walk())]
    assert len(walks) >= 2
    for loop in walks:
        assert _divisions(loop) == []


def test_the_dump_reads_back() -> None:
    text = _hopper(WALK).asm["hopper"]
    again = parse_module(text, "<dump>")
    verify(again)
    assert print_module(again).replace(" ", "") == text.replace(" ", "")
