"""examples/rows_bwd.tk, the backward kernels of tkc.ops.rms_norm, layer_norm and softmax:
the interpreter against float64 autograd, the emulator against the interpreter, ptxas without
spills at the tiles tkc.ops picks, and on a GPU against torch.  Rows past a program's share
(M not a multiple of ROWS), rows shorter than their block, rows swept in several blocks (the
last one a tail), a mean large beside the spread, and constant rows."""

from __future__ import annotations

import pathlib

import pytest
import torch
import torch.nn.functional as F

from device_checks import assert_no_spills, launch_tensors, needs_ptxas, require_gpu
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.interpreter import run_kernel
from tkc.ops.rows import backward_tiles

FILE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "rows_bwd.tk"
EPS = 1e-5
KERNELS = ("rmsnorm_bwd", "layernorm_bwd", "softmax_bwd")
# (M, N, constants): one block past the row's end; sweeps of 256 columns, the last a tail;
# a row of exactly one block
SHAPES = {"one_block": (37, 300, {"BN": 512, "ROWS": 8}),
          "sweeps": (21, 1000, {"BN": 256, "SBN": 256, "ROWS": 4}),
          "whole": (16, 512, {"BN": 512, "ROWS": 16})}


def _compile(kernel: str, consts: dict, stop: str = "cubin"):
    if kernel == "softmax_bwd":
        consts = {"BN": consts["BN"]}
    return compile_kernel(FILE, consts, stop=stop, cache=False, kernel=kernel)


def _bf16(g: torch.Generator, *shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=g) + shift).to(torch.bfloat16)


def case(kernel: str, M: int, N: int, seed: int, constant_rows: bool = False):
    """The kernel's arguments (outputs NaN, accumulators zero) and float64 autograd's answers by
    argument index."""
    g = torch.Generator().manual_seed(seed)
    dy = _bf16(g, M, N)
    if kernel == "softmax_bwd":
        yd = torch.softmax(3 * torch.randn(M, N, generator=g, dtype=torch.float64), -1)
        y = yd.to(torch.bfloat16)
        yd = y.double()
        want = yd * (dy.double() - (dy.double() * yd).sum(-1, keepdim=True))
        return [dy, y, torch.full((M, N), float("nan")).to(torch.bfloat16)], {2: want}
    x = _bf16(g, M, N, scale=2.0, shift=3.0)  # a mean large beside the spread
    if constant_rows:
        x[::3] = 1.5
    w = _bf16(g, N)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    if kernel == "rmsnorm_bwd":
        y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * wd
        bd = None
    else:
        bd = torch.zeros(N, dtype=torch.float64, requires_grad=True)
        y = F.layer_norm(xd, (N,), wd, bd, EPS)
    y.backward(dy.double())
    args = [dy, x, w, torch.full((M, N), float("nan")).to(torch.bfloat16), torch.zeros(N)]
    want = {3: xd.grad, 4: wd.grad}
    if bd is not None:
        args.append(torch.zeros(N))
        want[5] = bd.grad
    return args + [EPS], want


def close(got: list, want: dict, what: str) -> None:
    for i, w in want.items():
        scale = w.abs().max().item()
        # bf16 inputs and outputs: dx a rounding or two of its largest value; f32 sums of M rows
        torch.testing.assert_close(got[i].double(), w, atol=2e-2 * scale, rtol=2e-2,
                                   msg=lambda m, i=i: f"{what}, argument {i}: {m}")


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kernel", KERNELS)
def test_interpreter_matches_float64_autograd(kernel: str, shape: str) -> None:
    M, N, consts = SHAPES[shape]
    for seed in (0, 1):
        args, want = case(kernel, M, N, seed, constant_rows=seed == 1)
        run_kernel(_compile(kernel, consts, "tkir").kernel_op, args)
        close(args, want, f"{kernel} {shape} seed {seed}")


@pytest.mark.parametrize("shape", ["one_block", "sweeps"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_emulator_matches_interpreter(kernel: str, shape: str) -> None:
    M, N, consts = SHAPES[shape]
    args, want = case(kernel, M, N, 5)
    expect = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    run_kernel(_compile(kernel, consts, "tkir").kernel_op, expect)
    emulate(_compile(kernel, consts, "hopper").kernel_op, args, seed=5)
    for i in want:  # the two sum in other orders: a bf16 rounding apart at most
        torch.testing.assert_close(args[i].float(), expect[i].float(), atol=8e-3, rtol=8e-3)


@needs_ptxas
@pytest.mark.parametrize("N", [1024, 4096, 8192, 12288])
@pytest.mark.parametrize("kernel", KERNELS)
def test_assembles_without_spills_at_the_ops_tiles(kernel: str, N: int) -> None:
    assert_no_spills(_compile(kernel, backward_tiles(16384, N)))


def test_ops_tiles_follow_the_rows() -> None:
    assert backward_tiles(16384, 4096) == {"ROWS": 32, "BN": 4096}
    assert backward_tiles(4096, 4000) == {"ROWS": 16, "BN": 4096}  # about 256 programs
    assert backward_tiles(1, 70) == {"ROWS": 4, "BN": 512}
    assert backward_tiles(8192, 12288) == {"ROWS": 32, "BN": 8192}  # swept: BN is the one-block limit


@pytest.mark.gpu
@pytest.mark.parametrize("M, N", [(1000, 300), (4099, 4096), (517, 8192), (300, 12000)])
@pytest.mark.parametrize("kernel", KERNELS)
def test_on_gpu_as_float64(kernel: str, M: int, N: int) -> None:
    require_gpu()
    args, want = case(kernel, M, N, 7, constant_rows=True)
    got = launch_tensors(_compile(kernel, backward_tiles(M, N)), args)
    close(got, want, f"{kernel} {M}x{N} on the GPU")
