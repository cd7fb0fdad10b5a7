"""Mamba-2's SSD forward as a tile program (issue 27): examples/mamba2_ssd.tk against the
paper's ssd_minimal_discrete in float64 (tk_reference.ssd) in the interpreter, the emulator
against the interpreter with ptxas finding no spills, and on a GPU against torch.  Sequence
lengths leave a tail past the last full chunk of 64; heads share B and C in groups."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tk_reference as ref
from device_checks import assert_no_spills, interpret_and_emulate, launch_tensors, lowered, needs_ptxas
from tkc.compiler import compile_kernel
from tkc.interpreter import random_args, run_kernel

FILE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "mamba2_ssd.tk"
OUTS = {"y": 7, "ht": 8}  # the outputs' places among the arguments
#: (constants, heads, groups): N = 128 and 64, an initial state, dt softplus'd by the caller
CASES = {"n128": ({}, 4, 2), "n64_init": ({"N": 64, "init": True}, 4, 1),
         "caller_softplus": ({"softplus": False, "init": True}, 2, 2)}


def _compile(consts: dict, stop: str):
    return compile_kernel(FILE, consts, stop=stop, cache=False)


def inputs(g: torch.Generator, consts: dict, B: int, T: int, H: int, G: int) -> tuple[list, tuple]:
    """The kernel's arguments (as Mamba-2 initializes dt and A: dt in [0.001, 0.1] through its
    bias, A in [-16, -1]) and the float64 reference's (y, final state)."""
    N, softplus = consts.get("N", 128), consts.get("softplus", True)
    x = torch.randn(B, T, H, 64, generator=g).to(torch.bfloat16)
    dt_bias = torch.expm1(torch.exp(torch.empty(H).uniform_(np.log(1e-3), np.log(0.1), generator=g))).log()
    dt_raw = 0.5 * torch.randn(B, T, H, generator=g)
    A = -torch.empty(H).uniform_(1, 16, generator=g)
    b_in, c_in = (torch.randn(B, T, G, N, generator=g).to(torch.bfloat16) for _ in range(2))
    h0 = torch.randn(B, H, 64, N, generator=g).to(torch.bfloat16)
    if not softplus:  # softplus'd by the caller: the kernel takes dt + dt_bias as it is
        dt_raw = F.softplus(dt_raw + dt_bias) - dt_bias
    dt = (dt_raw + dt_bias).double()
    dt = F.softplus(dt) if softplus else dt
    y, ht = (torch.full(s, float("nan")).to(torch.bfloat16) for s in ((B, T, H, 64), (B, H, 64, N)))
    want = ref.ssd(x.double(), dt, A.double(), b_in.double(), c_in.double(),
                   h0.double() if consts.get("init") else None)
    return [x, dt_raw, dt_bias, A, b_in, c_in, h0, y, ht], want


def _close(got: torch.Tensor, want: torch.Tensor, tol: float = 2e-2) -> None:
    """Within ``tol`` of the output's largest value: the scores, the state and the weighed x
    are each rounded to bf16 before their products."""
    err = (got.float() - want.float()).abs().max().item()
    assert err <= tol * want.abs().max().item(), f"max error {err:.4g}, largest value {want.abs().max():.4g}"


@pytest.mark.parametrize("T", [150, 64, 37])
@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_matches_the_float64_reference(name: str, T: int) -> None:
    consts, H, G = CASES[name]
    args, (y, ht) = inputs(torch.Generator().manual_seed(T), consts, 2, T, H, G)
    run_kernel(_compile(consts, "tkir").kernel_op, args)
    _close(args[OUTS["y"]], y)
    _close(args[OUTS["ht"]], ht)


@pytest.mark.parametrize("pins", [{}, {"issue_ahead": True}], ids=["default", "issue_ahead"])
@pytest.mark.parametrize("name", list(CASES)[:2])
def test_emulator_matches_interpreter_without_spills(name: str, pins: dict) -> None:
    """Also under issue_ahead (spills are the default's business only): it once issued the
    next chunk's C @ state^T before the chunk had staged its state into shared memory (the
    emulator: a read of unwritten memory; the GPU: y off by 28)."""
    consts, H, G = CASES[name]
    consts = {**consts, **pins}
    tile_ir = _compile(consts, "tkir").kernel_op
    args = random_args(tile_ir, {"B": 1, "T": 100, "H": H, "G": G}, 2)
    hopper = _compile(consts, "hopper") if pins else lowered(lambda stop: _compile(consts, stop))
    want, got = interpret_and_emulate(tile_ir, hopper.kernel_op, args, 2)
    for i in OUTS.values():  # bf16 outputs: the two sum in other orders, a rounding apart at most
        scale = np.abs(want[i]).max()
        np.testing.assert_allclose(got[i], want[i], rtol=8e-3, atol=8e-3 * scale)


@needs_ptxas
@pytest.mark.parametrize("name", list(CASES))
def test_assembles_without_spills(name: str) -> None:
    assert_no_spills(_compile(CASES[name][0], "cubin"))


def test_the_chunked_reference_is_the_recurrence() -> None:
    """ssd_minimal_discrete (chunked, with a tail and groups) is the step-by-step recurrence."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 150, 4, 8, generator=g, dtype=torch.float64)
    dt = F.softplus(torch.randn(2, 150, 4, generator=g, dtype=torch.float64))
    A = -torch.rand(4, generator=g, dtype=torch.float64) - 0.1
    B, C = (torch.randn(2, 150, 2, 16, generator=g, dtype=torch.float64) for _ in range(2))
    h0 = torch.randn(2, 4, 8, 16, generator=g, dtype=torch.float64)
    for want, got in zip(ref.ssd_recurrent(x, dt, A, B, C, h0), ref.ssd(x, dt, A, B, C, h0)):
        torch.testing.assert_close(got, want)


def test_a_kernel_of_dt_zero_past_t_changes_no_state() -> None:
    """The state after T steps is the same whether T ends a chunk or not: a tail of 37 steps and
    the same 37 followed by 27 steps of x = B = C = 0 and dt = -inf (softplus 0) give one
    final state."""
    consts, H, G = CASES["n128"]
    k = _compile(consts, "tkir").kernel_op
    args, _ = inputs(torch.Generator().manual_seed(3), consts, 1, 37, H, G)
    padded = [torch.cat([a, torch.zeros(1, 27, *a.shape[2:], dtype=a.dtype)], 1) if i in (0, 4, 5, 7) else a.clone()
              for i, a in enumerate(args)]
    padded[1] = torch.cat([args[1], torch.full((1, 27, H), -1e4)], 1)
    run_kernel(k, args)
    run_kernel(k, padded)
    torch.testing.assert_close(padded[OUTS["ht"]].float(), args[OUTS["ht"]].float(), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [150, 4096 + 37])
@pytest.mark.parametrize("name", list(CASES))
def test_on_gpu_as_torch(name: str, T: int) -> None:
    consts, H, G = CASES[name]
    args, (y, ht) = inputs(torch.Generator().manual_seed(7), consts, 2, T, H, G)
    out = launch_tensors(_compile(consts, "cubin"), args)
    _close(out[OUTS["y"]], y)
    _close(out[OUTS["ht"]], ht)
