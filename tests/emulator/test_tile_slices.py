"""Slices of register tiles: ``acc[:, 0:64]`` (an aligned block of an axis), ``acc[:, 1::2]``
(every second element) and ``t[:, 5]`` (one index, the axis dropped) become a reshape and a
``tile.take``.  The interpreter takes numpy's
elements; lowered, an accumulator's halves are registers its threads already hold (no
conversion), a block of a tile whose threads split the axis moves it once through shared
memory, and a few single rows or columns of such a tile are masked sums over the axis (nothing
moves but through the reduction); the emulator agrees with the interpreter, -0.0, infinities
and NaN included, and the dumps read back."""

from __future__ import annotations

import numpy as np
import pytest
from device_checks import interpret_and_emulate, interpret_and_run_on_gpu, lowered

from tkc.compiler import compile_kernel
from tkc.interpreter import random_args, run_kernel
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify

HALVES = """@kernel
def halves(a: bf16[M, K], w: bf16[K, 128], y: f32[M, 64], z: f32[M, 32], o: f32[M, 64]):
    grid(cdiv(M, 128))
    pm = program_id(0)
    x = zeros([128, 128], f32)
    for k in range(cdiv(K, 64)):
        x += a[pm*128:(pm+1)*128, k*64:(k+1)*64] @ w[k*64:(k+1)*64, :]
    y[pm*128:(pm+1)*128, :] = x[:, 0:64] - x[:, 64:]
    z[pm*128:(pm+1)*128, :] = x[:, 96:128] * 2.0
    o[pm*128:(pm+1)*128, :] = x[:, 1::2]
"""

BLOCKED = """@kernel
def columns(x: f32[M, 128], y: f32[M, 64], z: f32[M, 128], c: f32[M]):
    grid(cdiv(M, 64))
    r = program_id(0) * 64
    t = x[r:r+64, :]
    y[r:r+64, :] = t[:, 0:64] * 2.0 + t[:, 64:128]
    z[r:r+64, :] = t * 3.0
    c[r:r+64] = t[:, 5] + t[:, -1]
"""


PICKS = """@kernel
def picks(x: f32[M, 128], y: f32[P, 128], z: f32[M, 2]):
    grid(cdiv(M, 64))
    p = program_id(0)
    r = p * 64
    t = x[r:r+64, :]
    y[p, :] = t[23, :]
    z[r:r+64, 0] = t[:, 5]
    z[r:r+64, 1] = t[:, -1]
"""

MANY = """@kernel
def many(x: bf16[M, 64], z: bf16[M]):
    grid(cdiv(M, 64))
    r = program_id(0) * 64
    t = x[r:r+64, :]
    z[r:r+64] = t[:, 0] + t[:, 1] + t[:, 2] + t[:, 3] + t[:, 4]
"""

# A pick broadcast back against another tile: its slice of that tile's layout is repeated
# across the threads splitting the columns, and stacking it repeated the picked tile 32 times
# (a 64 x 128 f32 tile was refused as 2048 values a thread).
BROADCAST_PICK = """@kernel
def bpick(x0: f32[M, N], x1: f32[M, N], y: f32[M, N]):
    grid(cdiv(M, 64))
    r = program_id(0) * 64
    a = x0[r:r+64, 0:128]
    b = x1[r:r+64, 0:128]
    y[r:r+64, 0:128] = a * b[:, -1][:, None]
"""

# Picks along both axes of a tile made by a reshape round trip, one also used whole: the
# reshape's block path moved the tile for one pick under the other's (invalid IR).
RESHAPED_PICKS = """@kernel
def rpicks(x: f32[M, N], w: f32[N, N], yr: f32[M], yc: f32[M, N], yd: f32[M, N]):
    grid(cdiv(M, 32))
    r = program_id(0) * 32
    t = x[r:r+32, 0:32]
    u = t.reshape(1024).reshape(32, 32)
    yr[r:r+32] = u[:, -1]
    yc[r, 0:32] = u[7, :]
    yd[r:r+32, 0:32] = u - t[7, :][None, :]
"""

# The same with a product's accumulator beside it (its column maxima in a slice of #wgmma_acc).
ACC_PICK = """@kernel
def apick(x: f32[M, N], w: f32[N, N], yc: f32[M, N]):
    grid(cdiv(M, 64))
    r = program_id(0) * 64
    acc = x[r:r+64, 0:32].to(bf16) @ w[0:32, 0:64].to(bf16)
    u = x[r:r+64, 0:64].reshape(4096).reshape(64, 64)
    yc[r, 0:64] = acc.max(0) + u[-1, :]
"""


def _compile(src, stop):
    return compile_kernel(src, {}, stop=stop, cache=False)


def test_the_interpreter_takes_numpys_elements() -> None:
    tile_ir = _compile(BLOCKED, "tkir").kernel_op
    args = random_args(tile_ir, {"M": 100}, 1)
    x = args[0].copy()
    run_kernel(tile_ir, args)
    np.testing.assert_array_equal(args[1], x[:, :64] * np.float32(2) + x[:, 64:])
    np.testing.assert_array_equal(args[3], x[:, 5] + x[:, 127])


@pytest.mark.parametrize("src, dims", [(HALVES, {"M": 200, "K": 200}), (BLOCKED, {"M": 100}),
                                       (PICKS, {"M": 150, "P": 3}), (MANY, {"M": 100}),
                                       (BROADCAST_PICK, {"M": 133, "N": 61}), (RESHAPED_PICKS, {"M": 133, "N": 61}),
                                       (ACC_PICK, {"M": 133, "N": 61})])
def test_emulator_matches_interpreter(src, dims) -> None:
    tile_ir = _compile(src, "tkir").kernel_op
    args = random_args(tile_ir, dims, 2)
    want, got = interpret_and_emulate(tile_ir, lowered(lambda stop: _compile(src, stop)).kernel_op, args, 2)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_an_accumulators_halves_are_its_threads_registers() -> None:
    ops = [op.name for op in _compile(HALVES, "hopper").kernel_op.walk()]
    assert ops.count("tile.take") == 4 and "hopper.convert_layout" not in ops


def test_a_split_axis_moves_once() -> None:
    kernel = _compile(BLOCKED, "hopper").kernel_op
    convs = [op for op in kernel.walk() if op.name == "hopper.convert_layout" and op.x.type.shape == (64, 128)]
    # t once for its two halves; its two columns are sums; never a 3-D tile.
    assert len(convs) == 1
    assert all(op.result.type.rank <= 2 for op in kernel.walk() if op.name == "hopper.convert_layout")


def test_a_few_picks_are_sums_and_move_no_tile() -> None:
    kernel = _compile(PICKS, "hopper").kernel_op
    names = [op.name for op in kernel.walk()]
    assert names.count("hopper.reduce") == 3 and "tile.take" not in names
    assert not [op for op in kernel.walk() if op.name == "hopper.convert_layout" and op.x.type.rank == 2]


def test_a_pick_broadcast_against_a_tile_is_a_sum_in_its_layout() -> None:
    kernel = _compile(BROADCAST_PICK, "hopper").kernel_op
    names = [op.name for op in kernel.walk()]
    assert "tile.take" not in names and "hopper.convert_layout" not in names
    assert all(getattr(v.type.layout, "regs", 0) <= 64 for op in kernel.walk() for v in op.results
               if getattr(v.type, "layout", None) is not None)


def test_many_picks_share_one_move() -> None:
    kernel = _compile(MANY, "hopper").kernel_op
    convs = [op for op in kernel.walk() if op.name == "hopper.convert_layout" and op.x.type.shape == (64, 64)]
    assert len(convs) == 1 and [op.name for op in kernel.walk()].count("tile.take") == 5


def test_picked_specials_are_exact() -> None:
    """-0.0 stays -0.0 (the sum's zero is -0.0), infinities and NaN come through."""
    tile_ir = _compile(PICKS, "tkir").kernel_op
    args = random_args(tile_ir, {"M": 70, "P": 2}, 3)
    x = args[0]
    x[23, :4] = [-0.0, np.inf, -np.inf, np.nan]
    x[:8, 5] = [-0.0, np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, -3.0e38]
    want, got = interpret_and_emulate(tile_ir, lowered(lambda stop: _compile(PICKS, stop)).kernel_op, args, 3)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w))
        np.testing.assert_array_equal(g, w)
    assert np.signbit(got[1][0, 0]) and np.isnan(got[1][0, 3]) and np.signbit(got[2][5, 0])


@pytest.mark.gpu
@pytest.mark.parametrize("src, dims", [(PICKS, {"M": 150, "P": 3}), (MANY, {"M": 100}), (BLOCKED, {"M": 100})])
def test_picks_on_the_gpu(src, dims) -> None:
    _, want, got = interpret_and_run_on_gpu(lambda stop: _compile(src, stop), dims)
    for w, g in zip(want, got):
        if isinstance(w, np.ndarray):
            np.testing.assert_array_equal(g, w.astype(g.dtype))


def test_the_dump_reads_back() -> None:
    text = _compile(BLOCKED, "hopper").asm["hopper"]
    assert "#stack<" in text
    verify(parse_module(text, "<dump>"))


NARROW = [
    # A 64 x 1 tile's half, a 128-column row's block: fewer elements than threads, so the
    # threads that pick the block must hold it repeated.
    ("@kernel\ndef k(x: f32[M, N], o: f32[G, 32, 32]):\n    grid(cdiv(M, 64))\n    p = program_id(0)\n"
     "    v = x[p*64:p*64+64, 0:1]\n    o[p, :, :] = v[32:64, :]\n", {"M": 130, "N": 140, "G": 3}, {}),
    ("@kernel\ndef k(x: f32[M, N], o: f32[G, 32, 32]):\n    grid(cdiv(M, 64))\n    p = program_id(0)\n"
     "    v = x[p:p+1, 0:128]\n    o[p, 0:1, 0:32] = v[:, 32:64]\n", {"M": 130, "N": 140, "G": 3}, {}),
    # A row's block, and its even and odd elements (one load, merge-steps), over 8 warps.
    ("@kernel\ndef k(x: bf16[M, N], s: f32[M], BN: const = 1024):\n    grid(M)\n    r = program_id(0)\n"
     "    e = x[r:r+1, 0:BN].to(f32)\n    s[r:r+1] = e[:, 0:64].sum(1)\n", {"M": 5, "N": 600}, {"warps": 8}),
    ("@kernel\ndef k(x: bf16[M, N], s: f32[M], BN: const = 64):\n    grid(M)\n    r = program_id(0)\n"
     "    ev = x[r:r+1, 0:BN:2].to(f32)\n    od = x[r:r+1, 1:BN:2].to(f32)\n    s[r:r+1] = (ev * od).sum(1)\n",
     {"M": 5, "N": 600}, {"warps": 8}),
]


@pytest.mark.parametrize("src, dims, consts", NARROW)
def test_a_block_of_a_tile_narrower_than_its_threads_moves_repeated(src: str, dims: dict, consts: dict) -> None:
    """Its threads hold it in an order the block cannot be picked from, and no layout holds the
    sliced axis whole in each thread without repeating the tile: the tile moves, repeated,
    through shared memory (it was refused, or refused with advice that did not help)."""
    tile_ir = compile_kernel(src, consts, stop="tkir", cache=False).kernel_op
    c = lowered(lambda stop: compile_kernel(src, consts, stop=stop, cache=False))
    want, got = interpret_and_emulate(tile_ir, c.kernel_op, random_args(tile_ir, dims, 4), seed=0)
    np.testing.assert_allclose(np.asarray(got[-1], np.float64), np.asarray(want[-1], np.float64), rtol=1e-5)
