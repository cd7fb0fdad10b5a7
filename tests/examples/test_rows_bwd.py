"""examples/rows_bwd.tk, the backward kernels of tkc.ops.rms_norm, layer_norm and softmax
(and rmsnorm_wgrad / layernorm_wgrad, the weights' gradients of rows too long for one
block): the interpreter against float64 autograd, the emulator against the interpreter,
ptxas without spills at the tiles tkc.ops picks, and on a GPU against float64.  Rows past a
program's share (M not a multiple of ROWS), rows shorter than their block, rows swept in
several blocks (the last one a tail), with their dw added by the sweep or left to the wgrad
kernels, a mean large beside the spread, and constant rows."""

from __future__ import annotations

import pathlib

import pytest
import torch
import torch.nn.functional as F

from device_checks import assert_no_spills, launch_tensors, needs_ptxas, require_gpu
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.interpreter import run_kernel
from tkc.ops.rows import backward_tiles, one_block_tiles, softmax_block

FILE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "rows_bwd.tk"
EPS = 1e-5
KERNELS = ("rmsnorm_bwd", "layernorm_bwd", "softmax_bwd", "rmsnorm_wgrad", "layernorm_wgrad")
WGRAD = ("rmsnorm_wgrad", "layernorm_wgrad")
BLOCK = "layernorm_bwd_block"  # layernorm_bwd for rows of exactly BN columns, what tkc.ops runs at N = BN
# (M, N, constants): a row in one block past its end; sweeps of 256 columns, the last a tail,
# dw added by the sweeps or not (the wgrad kernels': a strip past the row's end, 3 programs a
# strip);
# a row of exactly one block
SHAPES = {"one_block": (37, 300, {"BN": 512, "ROWS": 8, "CB": 128}),
          "sweeps": (21, 1000, {"BN": 256, "SBN": 256, "ROWS": 4, "CB": 256}),
          "sweeps_no_wgrad": (21, 1000, {"BN": 256, "SBN": 256, "ROWS": 4, "wgrad": False}),
          "whole": (16, 512, {"BN": 512, "ROWS": 16, "CB": 512})}


def _consts(kernel: str, consts: dict) -> dict:
    """The constants ``kernel`` takes of a shape's."""
    own = ("BN",) if kernel == "softmax_bwd" else ("CB",) if kernel in WGRAD else ("BN", "ROWS", "warps") \
        if kernel == BLOCK else ("BN", "SBN", "ROWS", "wgrad")
    return {k: v for k, v in consts.items() if k in own}


def _compile(kernel: str, consts: dict, stop: str = "cubin"):
    return compile_kernel(FILE, _consts(kernel, consts), stop=stop, cache=False, kernel=kernel)


def _bf16(g: torch.Generator, *shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=g) + shift).to(torch.bfloat16)


def _nan(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.full(shape, float("nan")).to(dtype)


def case(kernel: str, M: int, N: int, seed: int, constant_rows: bool = False, wgrad: bool = True):
    """The kernel's arguments (outputs NaN, accumulators zero) and float64 autograd's answers by
    argument index (without ``wgrad``, the norms' dw is not theirs to check)."""
    g = torch.Generator().manual_seed(seed)
    dy = _bf16(g, M, N)
    if kernel == "softmax_bwd":
        y = torch.softmax(3 * torch.randn(M, N, generator=g, dtype=torch.float64), -1).to(torch.bfloat16)
        yd = y.double()
        want = yd * (dy.double() - (dy.double() * yd).sum(-1, keepdim=True))
        return [dy, y, _nan(M, N, dtype=torch.bfloat16)], {2: want}
    x = _bf16(g, M, N, scale=2.0, shift=3.0)  # a mean large beside the spread
    if constant_rows:
        x[::3] = 1.5
    w = _bf16(g, N)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    rms = kernel.startswith("rmsnorm")
    mean = torch.zeros(M, dtype=torch.float64) if rms else xd.detach().mean(-1)
    rstd = torch.rsqrt((xd.detach() - mean[:, None]).pow(2).mean(-1) + EPS)
    bd = torch.zeros(N, dtype=torch.float64, requires_grad=True)
    y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * wd if rms else F.layer_norm(xd, (N,), wd, bd, EPS)
    y.backward(dy.double())
    dx, dw = _nan(M, N, dtype=torch.bfloat16), torch.zeros(N)
    if kernel == "rmsnorm_wgrad":
        return [dy, x, rstd.float(), dw, 3], {3: wd.grad}
    if kernel == "layernorm_wgrad":
        return [dy, x, mean.float(), rstd.float(), dw, torch.zeros(N), 3], {4: wd.grad, 5: bd.grad}
    if kernel == "rmsnorm_bwd":
        return [dy, x, w, dx, dw, _nan(M), EPS], {3: xd.grad, 5: rstd, **({4: wd.grad} if wgrad else {})}
    args = [dy, x, w, dx, dw, torch.zeros(N), _nan(M), _nan(M), EPS]
    return args, {3: xd.grad, 6: mean, 7: rstd, **({4: wd.grad, 5: bd.grad} if wgrad else {})}


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
    if kernel in ("softmax_bwd", *WGRAD) and shape == "sweeps_no_wgrad":
        pytest.skip("the norms' constant wgrad only")
    for seed in (0, 1):
        args, want = case(kernel, M, N, seed, constant_rows=seed == 1, wgrad=consts.get("wgrad", True))
        run_kernel(_compile(kernel, consts, "tkir").kernel_op, args)
        close(args, want, f"{kernel} {shape} seed {seed}")


@pytest.mark.parametrize("shape", ["one_block", "sweeps_no_wgrad"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_emulator_matches_interpreter(kernel: str, shape: str) -> None:
    M, N, consts = SHAPES[shape]
    args, want = case(kernel, M, N, 5, wgrad=consts.get("wgrad", True))
    expect = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    run_kernel(_compile(kernel, consts, "tkir").kernel_op, expect)
    emulate(_compile(kernel, consts, "hopper").kernel_op, args, seed=5)
    for i in want:  # the two sum in other orders: a bf16 rounding apart at most
        torch.testing.assert_close(args[i].float(), expect[i].float(), atol=8e-3, rtol=8e-3)


@pytest.mark.parametrize("M, rows", [(21, 8), (16, 16)])  # rows past a program's share; whole programs
def test_the_one_block_kernel_matches_autograd_and_the_emulator_the_interpreter(M: int, rows: int) -> None:
    consts = {"BN": 512, "ROWS": rows, "warps": 4}
    for seed in (0, 1):
        args, want = case(BLOCK, M, 512, seed, constant_rows=seed == 1)
        expect = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        run_kernel(_compile(BLOCK, consts, "tkir").kernel_op, expect)
        close(expect, want, f"{BLOCK} {M} rows, seed {seed}")
        emulate(_compile(BLOCK, consts, "hopper").kernel_op, args, seed=seed)
        for i in want:
            torch.testing.assert_close(args[i].float(), expect[i].float(), atol=8e-3, rtol=8e-3)


def test_the_one_block_kernel_refuses_rows_of_another_width() -> None:
    from tkc.errors import TkcLaunchError
    from tkc.kernel import interpret, load

    args, _ = case(BLOCK, 8, 500, 0)
    with pytest.raises(TkcLaunchError, match="axis 1 must have size 512, got 500"):
        interpret(load(FILE, BLOCK), *args, BN=512, ROWS=8)


def _ops_consts(kernel: str, M: int, N: int) -> dict:
    """The constants tkc.ops runs ``kernel`` with for M rows of N."""
    if kernel == BLOCK:
        return one_block_tiles(M, N)
    return {"BN": softmax_block(N)} if kernel == "softmax_bwd" else {} if kernel in WGRAD else backward_tiles(M, N)


@needs_ptxas
@pytest.mark.parametrize("kernel, N", [(k, n) for k in KERNELS[:3] for n in (4096, 8192, 12288)]
                         + [pytest.param(k, 2048, marks=pytest.mark.slow) for k in KERNELS[:3]]  # four warps, as 4096
                         + [(k, 12288) for k in WGRAD]  # the wgrad kernels' constants do not follow N
                         + [(BLOCK, n) for n in (4096, 8192)] + [pytest.param(BLOCK, 2048, marks=pytest.mark.slow)])
def test_assembles_without_spills_at_the_ops_tiles(kernel: str, N: int) -> None:
    assert_no_spills(_compile(kernel, _ops_consts(kernel, 16384, N)))


def test_ops_tiles_follow_the_rows() -> None:
    assert backward_tiles(16384, 4096) == {"ROWS": 32, "BN": 4096, "wgrad": True, "warps": 4}
    assert backward_tiles(4096, 4000) == {"ROWS": 16, "BN": 4096, "wgrad": True, "warps": 4}  # about 256 programs
    assert backward_tiles(1, 70) == {"ROWS": 4, "BN": 512, "wgrad": True, "warps": 4}
    assert backward_tiles(8192, 8192) == {"ROWS": 32, "BN": 8192, "wgrad": True, "warps": 8}
    # past one block: swept, dw from norm_wgrad
    assert backward_tiles(8192, 12288) == {"ROWS": 4, "BN": 512, "SBN": 1024, "warps": 4, "wgrad": False}
    assert [softmax_block(n) for n in (70, 8192, 8193)] == [512, 8192, 8192]
    # LayerNorm's rows of exactly one block (a multiple of 512 up to 8192) take layernorm_bwd_block
    assert one_block_tiles(16384, 4096) == {"ROWS": 32, "BN": 4096, "warps": 4}
    assert one_block_tiles(8192, 8192) == {"ROWS": 32, "BN": 8192, "warps": 8}
    assert [one_block_tiles(64, n) for n in (4000, 70, 12288)] == [None, None, None]


GPU_SHAPES = [(1000, 300), (4099, 4096), (517, 8192), (300, 12000)]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, M, N", [(k, M, N) for k in KERNELS for M, N in GPU_SHAPES]
                         + [(BLOCK, M, N) for M, N in GPU_SHAPES if one_block_tiles(M, N)])
def test_on_gpu_as_float64(kernel: str, M: int, N: int) -> None:
    require_gpu()
    consts = _ops_consts(kernel, M, N)
    args, want = case(kernel, M, N, 7, constant_rows=True, wgrad=consts.get("wgrad", True))
    close(launch_tensors(_compile(kernel, consts), args), want, f"{kernel} {M}x{N} on the GPU")


@pytest.mark.parametrize("kernel", WGRAD)
@pytest.mark.parametrize("split", [0, -2])
def test_a_split_below_one_sums_as_one(kernel: str, split: int) -> None:
    # (a grid of no programs would leave dw at zero without a word)
    M, N, consts = SHAPES["one_block"]
    args, want = case(kernel, M, N, 3)
    args[-1] = split  # the wgrad kernels' last argument
    run_kernel(_compile(kernel, consts, "tkir").kernel_op, args)
    close(args, want, f"{kernel} split {split}")
