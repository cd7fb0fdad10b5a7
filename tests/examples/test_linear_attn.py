"""Linear attention as tile programs (issue 27): examples/linear_attn.tk (decayed, a slope a
head) and examples/based.tk (Based's Taylor feature map) against their torch references in
the interpreter, the emulator against the interpreter with ptxas finding no spills, and on a
GPU against torch.  Sequence lengths leave a tail past the last full chunk of 64."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

import tk_reference as ref
from device_checks import (assert_no_spills, interpret_and_emulate, launch_tensors, lowered, needs_ptxas,
                           require_gpu)
import tkc.ops
from tkc.compiler import compile_kernel
from tkc.errors import TkcUsageError
from tkc.interpreter import random_args, run_kernel
from tkc.ops.based import segments_for

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
B, H = 2, 3
SLOPES = torch.tensor([0.02, 0.3, -1.5])  # gamma = exp(-|slope|): slow, fast, the sign ignored


@dataclass(frozen=True)
class Case:
    """A configuration of one example: its constants, and the arguments and torch's output
    (argument ``out``) for a generator and a sequence length."""

    file: str
    consts: dict
    inputs: Callable[[torch.Generator, int], tuple[list, torch.Tensor]]
    out: int
    dims: dict = field(default_factory=dict)
    kernel: str | None = None


def _bf16(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=g)).to(torch.bfloat16)


def _linear(DV: int):
    def inputs(g: torch.Generator, N: int):
        q, k = _bf16(g, B, H, N, 64, scale=64 ** -0.5), _bf16(g, B, H, N, 64)
        v = _bf16(g, B, H, N, DV)
        o = torch.full((B, H, N, DV), float("nan")).to(torch.bfloat16)
        return [q, k, v, SLOPES.clone(), o], ref.linear_attn(q.float(), k.float(), v.float(), SLOPES)
    return inputs


def _based(g: torch.Generator, N: int):
    q, k, v = _bf16(g, B, H, N, 16), _bf16(g, B, H, N, 16), _bf16(g, B, H, N, 64)
    o = torch.full((B, H, N, 64), float("nan")).to(torch.bfloat16)
    return [q, k, v, o], ref.based(q.float(), k.float(), v.float())


CASES = {"linear_dv64": Case("linear_attn.tk", {}, _linear(64), 4, {"DV": 64}),
         "linear_dv128": Case("linear_attn.tk", {"DV": 128}, _linear(128), 4, {"DV": 128}),
         "based": Case("based.tk", {}, _based, 3, kernel="based")}


def _compile(case: Case, stop: str):
    return compile_kernel(EXAMPLES / case.file, case.consts, kernel=case.kernel, stop=stop, cache=False)


def _close(got: torch.Tensor, want: torch.Tensor, tol: float = 2e-2) -> None:
    """Within ``tol`` of the output's largest value: each term is rounded to bf16 once or twice
    (scores, decayed queries and keys, states) before its product."""
    err = (got.float() - want.float()).abs().max().item()
    assert err <= tol * want.abs().max().item(), f"max error {err:.4g}, largest value {want.abs().max():.4g}"


@pytest.mark.parametrize("N", [150, 64])
@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_matches_torch(name: str, N: int) -> None:
    case = CASES[name]
    args, want = case.inputs(torch.Generator().manual_seed(N), N)
    run_kernel(_compile(case, "tkir").kernel_op, args)
    _close(args[case.out], want)


@pytest.mark.parametrize("name", list(CASES))
def test_emulator_matches_interpreter_without_spills(name: str) -> None:
    case = CASES[name]
    tile_ir = _compile(case, "tkir").kernel_op
    args = random_args(tile_ir, {"B": 1, "H": 2, "N": 100, **case.dims}, 2)
    want, got = interpret_and_emulate(tile_ir, lowered(lambda stop: _compile(case, stop)).kernel_op, args, 2)
    # bf16 outputs: the two sum in other orders, a rounding boundary apart at most
    scale = np.abs(want[case.out]).max()
    np.testing.assert_allclose(got[case.out], want[case.out], rtol=8e-3, atol=8e-3 * scale)


@needs_ptxas
@pytest.mark.parametrize("name", list(CASES))
def test_assembles_without_spills(name: str) -> None:
    assert_no_spills(_compile(CASES[name], "cubin"))


def test_the_chunked_references_are_the_quadratic_ones() -> None:
    """The benchmark's torch peers (chunked, linear in N) compute what the tests check against."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, 150, 64, generator=g) for _ in range(3))
    torch.testing.assert_close(ref.linear_attn_chunked(q, k, v, SLOPES), ref.linear_attn(q, k, v, SLOPES),
                               rtol=1e-4, atol=1e-3)
    q, k = q[..., :16], k[..., :16]
    torch.testing.assert_close(ref.based_chunked(q, k, v), ref.based(q, k, v), rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("N", [150, 4096 + 37])
@pytest.mark.parametrize("name", list(CASES))
def test_on_gpu_as_torch(name: str, N: int) -> None:
    case = CASES[name]
    args, want = case.inputs(torch.Generator().manual_seed(7), N)
    _close(launch_tensors(_compile(case, "cubin"), args)[case.out], want)


# ------------------------------------------------------- Based in segments (tkc.ops.based)
@pytest.mark.parametrize("N,segments", [(150, 3), (300, 2), (200, 4), (129, 2), (64, 2), (150, 1)])
def test_based_in_segments_matches_torch(N: int, segments: int) -> None:
    """based_states and based_split through tkc.ops.based: segments of whole chunks (the last
    one short, a single row at N = 129, rows past N reading 0), each starting from the states
    of those before it, give the one-program-a-head result; (64, 2) and (150, 1) are one
    segment (the based kernel)."""
    g = torch.Generator().manual_seed(N + segments)
    q, k, v = _bf16(g, B, H, N, 16), _bf16(g, B, H, N, 16), _bf16(g, B, H, N, 64)
    _close(tkc.ops.based(q, k, v, segments=segments), ref.based(q.float(), k.float(), v.float()))


@pytest.mark.parametrize("kernel,dims", [("based_states", {"B": 1, "H": 2, "N": 150, "P": 2}),
                                         ("based_split", {"B": 1, "H": 2, "N": 150, "P": 2})])
def test_based_segments_emulated_agree_with_the_interpreter(kernel: str, dims: dict) -> None:
    case = Case("based.tk", {}, _based, 3, kernel=kernel)
    tile_ir = _compile(case, "tkir").kernel_op
    args = random_args(tile_ir, dims, 2)
    want, got = interpret_and_emulate(tile_ir, lowered(lambda stop: _compile(case, stop)).kernel_op, args, 2)
    outs = [3] if kernel == "based_split" else [2, 3]  # o; or s0 and st
    for i in outs:
        np.testing.assert_allclose(got[i], want[i], rtol=8e-3, atol=8e-3 * np.abs(want[i]).max())


@needs_ptxas
@pytest.mark.parametrize("kernel", ["based_states", "based_split"])
def test_based_segments_assemble_without_spills(kernel: str) -> None:
    assert_no_spills(_compile(Case("based.tk", {}, _based, 3, kernel=kernel), "cubin"))


def test_segments_fill_the_program_slots_heads_leave_empty() -> None:
    assert segments_for(4, 16, 16384, 132) == 4     # 64 heads, 264 slots
    assert segments_for(16, 16, 4096, 132) == 1     # 256 heads fill them
    assert segments_for(1, 1, 4096, 132) == 4       # segments of at least 1024 rows
    assert segments_for(1, 2, 100, 132) == 1
    assert segments_for(1, 1, 1 << 20, 132) == 32     # at most 32: segment p reads p states


def test_based_compiles_to_one_graph_as_eager() -> None:
    """Under torch.compile(fullgraph=True) tkc.ops.based is the operator torch.ops.tkc.based:
    no graph break, the output of the eager function (in segments too)."""
    g = torch.Generator().manual_seed(5)
    q, k, v = _bf16(g, 1, 2, 150, 16), _bf16(g, 1, 2, 150, 16), _bf16(g, 1, 2, 150, 64)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return tkc.ops.based(q, k, v, segments=2) * 2

    torch._dynamo.reset()
    explained = torch._dynamo.explain(f)(q, k, v)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v), f(q, k, v))
    torch.library.opcheck(torch.ops.tkc.based.default, (q, k, v, 2))


def test_based_arguments_it_does_not_take_are_tkc_errors() -> None:
    q = torch.zeros(1, 2, 64, 16, dtype=torch.bfloat16)
    v = torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16)
    for call, said in ((lambda: tkc.ops.based(q, q, v[..., :32]), "v must be \\[B, H, N, 64\\]"),
                       (lambda: tkc.ops.based(q, q[..., :8], v), "q and k must be \\[B, H, N, 16\\] alike"),
                       (lambda: tkc.ops.based(q.float(), q, v), "q is torch.float32"),
                       (lambda: tkc.ops.based(q, q, v, segments=0), "segments is a positive int, got 0"),
                       (lambda: tkc.ops.based(q[0], q, v), "q must have four dims")):
        with pytest.raises(TkcUsageError, match=said):
            call()
    with pytest.raises(TkcUsageError, match="based has no gradient: call it on tensors that need none"):
        tkc.ops.based(q.clone().requires_grad_(), q, v)


@pytest.mark.gpu
@pytest.mark.parametrize("segments", [None, 1, 4])
def test_based_in_segments_on_gpu_as_torch(segments: int | None) -> None:
    require_gpu()
    g = torch.Generator().manual_seed(11)
    N = 4096 + 37
    q, k, v = _bf16(g, 1, 2, N, 16), _bf16(g, 1, 2, N, 16), _bf16(g, 1, 2, N, 64)
    want = ref.based(q.float(), k.float(), v.float())
    _close(tkc.ops.based(q.cuda(), k.cuda(), v.cuda(), segments=segments).cpu(), want)
