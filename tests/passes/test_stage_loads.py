"""The stage-loads pass (pin ``stage_loads``): which loads it copies ahead into each thread's
own shared bytes, how far, and that the kernel computes the same: the emulator runs the
staged hopper IR against the interpreter on rows with tails, and the protocol of the copies
(a read before its wait, a copy still flying at the end) is an error in the emulator."""

from __future__ import annotations

import re

import numpy as np
import pytest
from device_checks import HAVE_PTXAS, assert_no_spills, interpret_and_emulate

from tkc.codegen.runs import private_offsets
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.errors import TkcEmulatorError, TkcUsageError, TkcVerifyError
from tkc.interpreter import random_args
from tkc.ir.layouts import Blocked
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify

# A norm backward's row loop: each program takes ROWS rows one after another, reads three rows
# and two row statistics, writes one row and sums a weight gradient over its rows.
ROWS = '''
@kernel
def rows(dy: bf16[M, N], h: bf16[M, N], dh: bf16[M, N], w: bf16[N], mu: f32[M], rs: f32[M],
         dx: bf16[M, N], dw: f32[N], ROWS: const = 4, BN: const = 256):
    grid(cdiv(M, ROWS))
    acc = zeros([1, BN], f32)
    wt = w[0:BN].to(f32)
    for i in range(ROWS):
        r = program_id(0) * ROWS + i
        xhat = (h[r:r+1, 0:BN].to(f32) - mu[r:r+1][:, None]) * rs[r:r+1][:, None]
        g = dy[r:r+1, 0:BN].to(f32) * wt[None, :]
        c = (g * xhat).sum(1) / N.to(f32)
        dx[r:r+1, 0:BN] = (rs[r:r+1][:, None] * (g - xhat * c[:, None]) + dh[r:r+1, 0:BN].to(f32)).to(bf16)
        acc += g * xhat
    atomic_add(dw[0:BN], acc.sum(0))
'''


def _hopper(src: str, consts: dict) -> str:
    return compile_kernel(src, consts, stop="hopper", cache=False).asm["hopper"]


@pytest.mark.parametrize("distance", [1, 2, 3])
@pytest.mark.parametrize("dims", [{"M": 10, "N": 200}, {"M": 16, "N": 256}, {"M": 3, "N": 250}])
def test_the_emulator_agrees_with_the_interpreter(distance, dims):
    # Rows past M (10 and 3 are no multiple of ROWS = 4) and columns past N take the loads'
    # edge path into the thread's bytes; a program with fewer rows than the distance issues
    # copies only for rows its loop runs.
    tile_ir = compile_kernel(ROWS, {"stage_loads": distance}, stop="tkir", cache=False)
    staged = compile_kernel(ROWS, {"stage_loads": distance}, stop="hopper", cache=False)
    assert "hopper.async_load" in staged.asm["hopper"]
    args = random_args(tile_ir.kernel_op, dims, 3)
    want, got = interpret_and_emulate(tile_ir.kernel_op, staged.kernel_op, args, seed=distance)
    for i in (6, 7):  # dx, dw
        np.testing.assert_allclose(np.asarray(got[i], np.float64), np.asarray(want[i], np.float64),
                                   rtol=1e-2, atol=1e-3)


def test_every_row_load_is_staged_with_its_prologue():
    text = _hopper(ROWS, {"stage_loads": 2})
    # h, dy, dh, mu and rs (read twice: two loads, which cse leaves) each: two copies before the
    # loop and one in the body; a wait and a read at each load's first use.
    loads = {"h": 1, "dy": 1, "dh": 1, "mu": 1, "rs": 2}
    for name, n in loads.items():
        assert len(re.findall(rf"hopper\.async_load %{name}\b", text)) == 3 * n, name
        assert re.search(rf"%{name}_staged = hopper\.smem_alloc {{offset = \d+, stages = 3}}", text), name
    assert text.count("hopper.async_commit") == 3
    assert text.count("hopper.async_wait {pending = 2}") == 6
    assert text.count("hopper.async_read") == 6
    assert "hopper.load %w" in text  # outside the loop: left alone
    assert not re.search(r"hopper\.load %(h|dy|dh|mu|rs)\b", text)


def test_the_dump_reads_back():
    text = _hopper(ROWS, {"stage_loads": 1})
    module = parse_module(text)
    verify(module)
    assert print_module(module) == text


@pytest.mark.parametrize("consts", [{}, {"stage_loads": 0}])
def test_without_the_pin_nothing_changes(consts):
    assert "async" not in _hopper(ROWS, consts)


def test_the_pin_counts_to_seven():
    with pytest.raises(TkcUsageError, match="stage_loads = 8: at most 7"):
        _hopper(ROWS, {"stage_loads": 8})
    with pytest.raises(TkcUsageError, match="stage_loads = -1"):
        _hopper(ROWS, {"stage_loads": -1})


def test_the_distance_shrinks_to_the_shared_memory_left():
    # Three 16k-column bf16 rows take 96 KB a stage: two stages fit the 227 KB a program may
    # take, so distance 1 whatever the pin asks.
    text = _hopper(ROWS, {"stage_loads": 5, "BN": 16384, "warps": 16})
    assert "hopper.async_wait {pending = 1}" in text and "stages = 2" in text


OTHERS = '''
@kernel
def k(x: bf16[M, N], y: bf16[M, N], z: f32[M, N], BN: const = 256):
    grid(M)
    r = program_id(0)
    acc = zeros([1, BN], f32)
    for j in range(4):
        acc += x[r:r+1, 0:BN].to(f32)                        # the same box every iteration
        acc += y[(r + j) % M:(r + j) % M + 1, 0:BN].to(f32)  # y is written below
        if j > 1:
            acc += z[r:r+1, 0:BN]                             # under an if
    y[r:r+1, 0:BN] = acc.to(bf16)
'''


def test_loads_that_do_not_qualify_are_left_alone():
    assert "async" not in _hopper(OTHERS, {"stage_loads": 2})


def _rows_ir() -> str:
    """The staged kernel's hopper IR with distance 1."""
    return _hopper(ROWS, {"stage_loads": 1})


def _run(text: str) -> None:
    module = parse_module(text)
    kernel = module.kernel("rows")
    args = random_args(kernel, {"M": 8, "N": 256}, 0)
    emulate(kernel, args)


def test_a_read_before_its_wait_is_an_error():
    text = _rows_ir()
    # Drop the wait before the first read: the body's copy of the next row is still flying when
    # the read of this one... is fine, but the prologue's copy of row 0 has not landed.
    first = text.index("hopper.async_wait {pending = 1}")
    line_end = text.index("\n", first)
    broken = text[:text.rindex("\n", 0, first) + 1] + text[line_end + 1:]
    with pytest.raises(TkcEmulatorError, match="still copying into: a hopper.async_wait"):
        _run(broken)


def test_a_copy_flying_at_the_end_is_an_error():
    text = _rows_ir()
    broken = text.replace("hopper.async_wait {pending = 1}", "hopper.async_wait {pending = 2}")
    with pytest.raises(TkcEmulatorError, match="still copying into|still copying when the kernel ends"):
        _run(broken)


def test_the_verifier_refuses_a_short_destination():
    text = _rows_ir()
    small = "tile<8x8xbf16, smem, #smem<8x8xbf16, k, sw0>>"
    broken = re.sub(r"tile<(\d+)x8xbf16, smem, #smem<\1x8xbf16, k, sw0>>", small, text)
    with pytest.raises(TkcVerifyError, match="needs a shared tile of at least 512 bytes"):
        verify(parse_module(broken))


def test_the_verifier_refuses_a_bad_layout():
    text = _rows_ir().replace('layout = "#blocked<1x256', 'layout = "#nonsense<1x256', 1)
    with pytest.raises(TkcVerifyError, match="unknown layout"):
        verify(parse_module(text))


def test_each_thread_keeps_its_runs_side_by_side_with_the_others():
    layout = Blocked((1, 1024), 4, (1, 32), (1, 4))  # 128 threads, two runs of 4 bf16 (8 bytes) each
    offs = private_offsets(layout, 2)
    assert offs.shape == (128, 8)
    assert sorted(offs.reshape(-1)) == list(range(0, 2048, 2))  # every byte of 128 x 8 values once
    assert list(offs[1]) == [8, 10, 12, 14, 1032, 1034, 1036, 1038]  # beside thread 0's runs


@pytest.mark.skipif(not HAVE_PTXAS, reason="needs ptxas")
def test_ptx_copies_with_cp_async_and_assembles_without_spills():
    c = compile_kernel(ROWS, {"stage_loads": 2, "BN": 4096, "warps": 8}, stop="cubin", cache=False)
    ptx = c.asm["ptx"]
    assert "cp.async.ca.shared.global" in ptx and "cp.async.commit_group;" in ptx
    assert "cp.async.wait_group 2;" in ptx
    # Boxes past the tensor's end copy the bytes in bounds and zero-fill the rest (src-size).
    assert re.search(r"cp\.async\.ca\.shared\.global \[%r\d+\], \[%rd\d+\], 8, %r\d+;", ptx)
    assert_no_spills(c)


@pytest.mark.gpu
@pytest.mark.parametrize("distance", [1, 2])
@pytest.mark.parametrize("N", [1000, 1001])
def test_on_the_gpu_as_the_interpreter(distance, N):
    # Rows past M and columns past N: at N = 1000 copied with their bytes past the end
    # zero-filled, at N = 1001 (rows not 16-byte aligned) on the edge path.
    from device_checks import interpret_and_run_on_gpu

    args, want, got = interpret_and_run_on_gpu(
        lambda stop: compile_kernel(ROWS, {"stage_loads": distance, "BN": 1024}, stop=stop, cache=False),
        {"M": 37, "N": N})
    for i in (6, 7):  # dx, dw
        np.testing.assert_allclose(np.asarray(got[i], np.float64), np.asarray(want[i], np.float64),
                                   rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_cross_entropy_staged_on_the_gpu_as_torch():
    # A long vocabulary's blocks through cp.async, the last one a tail filled with -inf.
    import torch
    from device_checks import launch_tensors

    from tkc.compiler import compile_kernel as compile_

    path = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "cross_entropy.tk"
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 50_000, generator=g).to(torch.bfloat16)
    labels = torch.randint(0, 50_000, (64,), generator=g)
    got = launch_tensors(compile_(path, {"stage_loads": 2}), [logits, labels, torch.zeros(1)])
    want = torch.nn.functional.cross_entropy(logits.float(), labels)
    torch.testing.assert_close(got[2][0], want, rtol=1e-4, atol=1e-4)


def _staged_rows_fixture() -> str:
    from pathlib import Path

    return (Path(__file__).resolve().parents[1] / "codegen" / "kernels" / "staged_rows.tkir").read_text()


def _emulate(text: str, name: str = "staged_rows") -> None:
    kernel = parse_module(text).kernel(name)
    emulate(kernel, random_args(kernel, {"M": 8, "N": 1024}, 0))


def test_the_fixture_runs_as_written():
    _emulate(_staged_rows_fixture())


def test_a_read_of_another_threads_copy_is_an_error():
    # The copies of x with runs of 4 values a thread, the reads with runs of 8: half of what a
    # thread reads back another thread copied, which cp.async.wait_group does not wait for.
    text = _staged_rows_fixture().replace('hopper.async_load %x, %8, %r, %2 {box = [1, 1024], layout = '
                                          '"#blocked<1x1024, vec=8',
                                          'hopper.async_load %x, %8, %r, %2 {box = [1, 1024], layout = '
                                          '"#blocked<1x1024, vec=4')
    text = text.replace('hopper.async_load %x, %17, %r_1, %2 {box = [1, 1024], layout = "#blocked<1x1024, vec=8',
                        'hopper.async_load %x, %17, %r_1, %2 {box = [1, 1024], layout = "#blocked<1x1024, vec=4')
    assert text.count("vec=4") == 2
    with pytest.raises(TkcEmulatorError, match="reads shared bytes that thread \\d+'s copy put there"):
        _emulate(text)


def test_two_copies_into_the_same_bytes_in_flight_are_an_error():
    text = _staged_rows_fixture()
    line = next(ln for ln in text.splitlines() if "hopper.async_load %x, %8," in ln)
    with pytest.raises(TkcEmulatorError, match="copies into shared bytes that .* still copies into"):
        _emulate(text.replace(line, line + "\n" + line))


def test_the_verifier_refuses_runs_cp_async_cannot_copy():
    # Runs of one bf16 value (2 bytes) a thread: cp.async copies 4, 8 or 16.
    text = _staged_rows_fixture().replace('"#blocked<1x1024, vec=8, lanes=1x32, warps=1x4>"}',
                                          '"#blocked<1x1024, vec=1, lanes=1x32, warps=1x4>"}', 1)
    with pytest.raises(TkcVerifyError, match="gives runs that cp.async cannot copy"):
        verify(parse_module(text))


BOOLS = '''
@kernel
def k(x: bool[M, N], y: f32[M, N], BN: const = 1024):
    grid(1)
    acc = zeros([1, BN], f32)
    for i in range(M):
        acc += where(x[i:i+1, 0:BN], 1.0, 0.0)
        y[i:i+1, 0:BN] = acc
'''


def test_bool_tiles_are_left_alone():
    assert "async" not in _hopper(BOOLS, {"stage_loads": 2})


NESTED = '''
@kernel
def k(x: bf16[M, N], s: f32[M], y: f32[M], BN: const = 256):
    grid(1)
    for i in range(M):
        acc = s[i:i+1]
        for j in range(cdiv(N, BN)):
            acc += x[i:i+1, j*BN:(j+1)*BN].to(f32).sum(1)
        y[i:i+1] = acc
'''


def test_a_loop_around_a_staged_loop_is_left_alone():
    # The inner loop's blocks are staged; the outer loop's s is not: its wait would count the
    # inner loop's groups too.
    text = _hopper(NESTED, {"stage_loads": 2})
    assert re.search(r"hopper\.async_load %x\b", text) and "hopper.load %s" in text
    tile_ir = compile_kernel(NESTED, {"stage_loads": 2}, stop="tkir", cache=False)
    staged = compile_kernel(NESTED, {"stage_loads": 2}, stop="hopper", cache=False)
    args = random_args(tile_ir.kernel_op, {"M": 5, "N": 700}, 1)
    want, got = interpret_and_emulate(tile_ir.kernel_op, staged.kernel_op, args, seed=1)
    np.testing.assert_allclose(np.asarray(got[2], np.float64), np.asarray(want[2], np.float64), rtol=1e-5)


def test_every_sweep_of_a_tensor_is_staged():
    # Softmax's two sweeps over x (the second once the first is staged): both through copies;
    # the one-block rows' load is in no loop.
    text = compile_kernel(__import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "softmax.tk",
                          {"stage_loads": 2, "BN": 256}, stop="hopper", cache=False).asm["hopper"]
    assert len(re.findall(r"hopper\.load %x\b", text)) == 1
    assert len(re.findall(r"hopper\.async_load %x\b", text)) == 6  # two sweeps x (two before, one in)
