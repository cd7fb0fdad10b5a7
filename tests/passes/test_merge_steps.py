"""The ``merge-steps`` pass: stepped slices that together cover a range (``x[:, 0:D:2]`` and
``x[:, 1:D:2]``) become one access of the range, a reshape and ``tile.take``s (``tile.stack``
for stores); select-layouts keeps each thread's pairs in its own registers, so the range moves
as vectors.  Stores of blocks side by side become one store; an accumulator's column blocks
then leave through TMA.  Slices that leave a phase out, differ elsewhere or have a write
between them stay as written.  The emulator agrees with the interpreter on tails; dumps read
back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from device_checks import HAVE_PTXAS, interpret_and_emulate, lowered

from tkc.compiler import compile_kernel
from tkc.errors import TkcVerifyError
from tkc.interpreter import random_args
from tkc.ir.layouts import Blocked, reshape_layout, take_registers
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify
from tkc.passes.merge_steps import merge_steps
from tkc.pins import Options
from tkc.target import DEFAULT_TARGET

ROPE = Path(__file__).resolve().parents[2] / "examples" / "rope.tk"
GEMM_ROPE = ROPE.with_name("gemm_rope.tk")

# Pairs at a runtime offset k (k + 1 for the odd ones), the four phases of a step of 4, a slice
# whose partners are missing, and the three phases of a step of 3 (whose groups a thread's
# vectors do not hold whole: they stay as written).
PAIRS = """@kernel
def pairs(x: f32[M, 256], y: f32[M, 128], z: f32[M, 128], w: f32[M, 96], k: i32):
    grid(cdiv(M, 32))
    r = program_id(0) * 32
    a = x[r:r+32, k:k+128:2]
    b = x[r:r+32, k+1:k+128:2]
    y[r:r+32, 0:128:2] = a * b
    y[r:r+32, 1:128:2] = a - b
    p0 = x[r:r+32, 0:128:4]
    p1 = x[r:r+32, 1:128:4]
    p2 = x[r:r+32, 2:128:4]
    p3 = x[r:r+32, 3:128:4]
    q = x[r:r+32, 128:256:4]
    z[r:r+32, 0:128:4] = p2
    z[r:r+32, 1:128:4] = p0
    z[r:r+32, 2:128:4] = p1 + q
    z[r:r+32, 3:128:4] = p3
    w[r:r+32, 0:96:3] = x[r:r+32, 2:96:3]
    w[r:r+32, 1:96:3] = x[r:r+32, 0:96:3]
    w[r:r+32, 2:96:3] = x[r:r+32, 1:96:3]
"""


def _tile_ir(src, consts=None):
    return compile_kernel(src, consts or {}, stop="tkir", cache=False)


def _merged(src, consts=None):
    module = parse_module(_tile_ir(src, consts).asm["tkir"], "<tkir>")
    merge_steps(module, Options(), DEFAULT_TARGET)
    verify(module)
    return module.ops[0]


def _ops(kernel, name):
    return [op for op in kernel.walk() if op.name == name]


def test_interleaved_rope_reads_and_writes_whole_rows() -> None:
    module = _merged(ROPE, {"interleaved": True})
    loads = [op for op in _ops(module, "tile.load") if op.tensor.name_hint == "x"]
    (load,) = loads
    assert load.box[-1] == 128 and "steps" not in load.attributes
    assert sorted(op.index for op in _ops(module, "tile.take")) == [0, 1]
    (store,) = _ops(module, "tile.store")
    assert store.box[-1] == 128 and "steps" not in store.attributes
    assert len(_ops(module, "tile.stack")) == 1


def test_only_whole_sets_of_phases_merge() -> None:
    module = _merged(PAIRS)
    steps = [op for op in module.walk() if op.name in ("tile.load", "tile.store")
             and op.attributes.get("steps")]
    # x[:, 128:256:4], a phase without its partners, and the step of 3 keep their steps.
    assert sorted((op.name, op.attributes["steps"][-1]) for op in steps) == \
        [("tile.load", 3)] * 3 + [("tile.load", 4)] + [("tile.store", 3)] * 3
    assert sorted(op.index for op in _ops(module, "tile.take")) == [0, 0, 1, 1, 2, 3]
    assert [len(op.operands) for op in _ops(module, "tile.stack")] == [2, 4]


def test_a_write_between_keeps_the_slices() -> None:
    src = PAIRS.replace("    b = x[r:r+32, k+1:k+128:2]\n", "    x[r:r+32, 0:1] = zeros([32, 1], f32)\n"
                                                             "    b = x[r:r+32, k+1:k+128:2]\n")
    module = _merged(src)
    pairs = [op for op in _ops(module, "tile.load") if op.attributes.get("steps") == [1, 2]]
    assert len(pairs) == 2  # the store to x between them keeps both loads where they are
    # A read between stores keeps them too (the tensors may be one buffer).
    src = PAIRS.replace("    q = x[r:r+32, 128:256:4]\n", "").replace("p1 + q", "p1 + x[r:r+32, 128:256:4]")
    stores = [op for op in _ops(_merged(src), "tile.store") if op.attributes.get("steps") == [1, 4]]
    assert len(stores) == 4


@pytest.mark.parametrize("src, consts, dims, scalars", [
    (ROPE, {"interleaved": True}, {"B": 2, "N": 100, "H": 3, "D2": 64}, ()),
    (ROPE, {"interleaved": True, "D": 64}, {"B": 1, "N": 77, "H": 2, "D2": 32}, ()),
    (PAIRS, {}, {"M": 70}, (3,)),
])
def test_emulator_matches_interpreter(src, consts, dims, scalars) -> None:
    tile_ir = _tile_ir(src, consts).kernel_op
    args = random_args(tile_ir, dims, 4)
    for i, v in zip([i for i, a in enumerate(args) if not isinstance(a, np.ndarray)], scalars):
        args[i] = v
    low = lowered(lambda stop: compile_kernel(src, consts, stop=stop, cache=False))
    want, got = interpret_and_emulate(tile_ir, low.kernel_op, args, 4)
    for w, g in zip(want, got):
        if isinstance(w, np.ndarray):
            np.testing.assert_array_equal(g, w)


def test_the_lowered_dump_reads_back() -> None:
    text = compile_kernel(ROPE, {"interleaved": True}, stop="hopper", cache=False).asm["hopper"]
    assert "tile.take" in text and "tile.stack" in text
    again = parse_module(text, "<dump>")
    verify(again)
    assert print_module(again).replace(" ", "") == text.replace(" ", "")


@pytest.mark.skipif(not HAVE_PTXAS, reason="ptxas not found")
def test_the_pairs_move_as_vectors() -> None:
    ptx = compile_kernel(ROPE, {"interleaved": True}, stop="ptx", cache=False).asm["ptx"]
    assert "st.global.cs.v4.b32" in ptx  # y's rows, 8 values a store (was one bf16 a store)
    assert ptx.count("ld.global.v4.b32") >= 8


def test_take_registers() -> None:
    whole = reshape_layout(Blocked((64, 128), 8, (2, 16), (4, 1)), (64, 64, 2))
    assert take_registers(whole, 2, 1) is not None
    # One value a thread: the pairs' halves live in neighbouring threads.
    split = reshape_layout(Blocked((64, 128), 1, (1, 32), (4, 1)), (64, 64, 2))
    assert take_registers(split, 2, 0) is None


def test_a_take_checks_its_index() -> None:
    src = """tile.kernel @k {consts = {}} {
^(%x: tensor<f32[8, 2]>):
  %0 = tile.constant {value = 0} : i32
  %1 = tile.load %x, %0, %0 {box = [8, 2]} : tile<8x2xf32>
  %2 = tile.take %1 {axis = 1, index = 2} : tile<8xf32>
  tile.return
}
"""
    with pytest.raises(TkcVerifyError, match="index 2 out of range for axis 1"):
        verify(parse_module(src, "<t>"))


@pytest.mark.parametrize("interleaved", [False, True])
def test_an_accumulators_blocks_leave_as_one_tile(interleaved) -> None:
    kernel = _merged(GEMM_ROPE, {"interleaved": interleaved})
    (store,) = _ops(kernel, "tile.store")
    assert store.box == [128, 256] and "steps" not in store.attributes
    lowered_ops = [op.name for op in compile_kernel(GEMM_ROPE, {"interleaved": interleaved}, stop="hopper",
                                                    cache=False).kernel_op.walk()]
    assert "hopper.tma_store" in lowered_ops and "hopper.store" not in lowered_ops


# The halves of one tile, changed and put back side by side.
BLOCKS = """@kernel
def blocks(x: f32[M, 256], y: f32[M, 256]):
    grid(cdiv(M, 32))
    r = program_id(0) * 32
    t = x[r:r+32, :]
    y[r:r+32, 0:128] = t[:, 0:128] * 2.0
    y[r:r+32, 128:256] = t[:, 128:256] + 1.0
"""


@pytest.mark.parametrize("edit, merged", [
    (None, True),
    (("y[r:r+32, 128:256] = t[:, 128:256]", "y[r:r+32, 160:288] = t[:, 128:256]"), False),  # a gap
    (("    y[r:r+32, 128:256] = t[:, 128:256] + 1.0\n",
      "    u = x[r:r+32, :]\n    y[r:r+32, 128:256] = u[:, 128:256] + 1.0\n"), False),  # a read between
    (("t[:, 128:256] + 1.0", "x[r:r+32, 0:128] + 1.0"), False),  # not cut from one tile
])
def test_blocks_side_by_side(edit, merged) -> None:
    src = BLOCKS if edit is None else BLOCKS.replace(*edit)
    stores = _ops(_merged(src), "tile.store")
    assert len(stores) == (1 if merged else 2)
    tile_ir = _tile_ir(src).kernel_op
    args = random_args(tile_ir, {"M": 70}, 6)
    want, got = interpret_and_emulate(tile_ir, lowered(lambda stop: compile_kernel(src, {}, stop=stop,
                                                                                   cache=False)).kernel_op, args, 6)
    np.testing.assert_array_equal(got[1], want[1])
