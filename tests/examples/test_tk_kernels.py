"""ThunderKittens' kernel set (issue 27): GEMMs with epilogues written after the `@`
(gemm_bias_gelu.tk, gemm_swiglu.tk, gemm_residual.tk, gemm_rope.tk), the scaled FP8 GEMM
(gemm_fp8_scaled.tk, per-tensor and rowwise scales), RoPE (rope.tk) and residual +
LayerNorm/RMSNorm forward and backward (layernorm_residual.tk, layernorm_residual_bwd.tk)
against torch in the interpreter, the emulator against the interpreter, ptxas without
spills, and on a GPU against torch.  Shapes have tails on every axis."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F

import tk_reference as ref
from device_checks import assert_no_spills, launch_tensors, needs_ptxas, require_gpu
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.interpreter import run_kernel

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


@dataclass(frozen=True)
class Case:
    """One kernel of one example: its file, its constants (``small``: for the CPU tests;
    ``full``: as the benchmark runs it), the arguments and torch's answers for a seed, and the
    tolerance of its outputs (bf16: a few roundings)."""

    file: str
    inputs: Callable[[torch.Generator], tuple[list, dict[int, torch.Tensor]]]
    small: dict = field(default_factory=dict)
    full: dict = field(default_factory=dict)
    kernel: str | None = None
    tol: tuple[float, float] = (2e-2, 2e-2)


def _bf16(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=g)).to(torch.bfloat16)


# ------------------------------------------------------------------ GEMM epilogues
GEMM_SMALL = {"BM": 64, "BN": 64, "BK": 32}
M, N, K = 150, 200, 200  # tails on every axis of a 64 x 64 x 32 tile


def _gemm_operands(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return _bf16(g, M, K), _bf16(g, K, N, scale=K ** -0.5)


def _bias_gelu(approximate: str):
    def inputs(g: torch.Generator):
        a, b = _gemm_operands(g)
        bias = _bf16(g, N)
        c = torch.full((M, N), float("nan")).to(torch.bfloat16)
        want = F.gelu(a.float() @ b.float() + bias.float(), approximate=approximate)
        return [a, b, bias, c], {3: want}
    return inputs


def _swiglu(g: torch.Generator):
    a, wg = _gemm_operands(g)
    wu = _bf16(g, K, N, scale=K ** -0.5)
    c = torch.full((M, N), float("nan")).to(torch.bfloat16)
    return [a, wg, wu, c], {3: F.silu(a.float() @ wg.float()) * (a.float() @ wu.float())}


def _residual(g: torch.Generator):
    a, b = _gemm_operands(g)
    r = _bf16(g, M, N)
    c = torch.full((M, N), float("nan")).to(torch.bfloat16)
    return [a, b, r, c], {3: a.float() @ b.float() + r.float()}


# ------------------------------------------------------------------ FP8 GEMM with scales
FP8_SMALL = {"BM": 64, "BN": 64, "BK": 64}
FP8_K = 208  # a tail of 16 past three blocks of 64 (an fp8 row stays a multiple of 16 bytes, as TMA needs)


def _fp8_scaled(rowwise: bool):
    """A [M, K] and B [N, K] in e4m3, scales near K^-1/2 (outputs near 1): one each, or one
    per row of A and per column of C; torch's answer from the dequantized f32 product."""
    def inputs(g: torch.Generator):
        a, b = (torch.randn(n, FP8_K, generator=g).to(torch.float8_e4m3fn) for n in (M, N))
        sa, sb = ((torch.rand(n if rowwise else 1, generator=g) + 0.5) * FP8_K ** -0.25 for n in (M, N))
        c = torch.full((M, N), float("nan")).to(torch.bfloat16)
        return [a, b, sa, sb, c], {4: (a.float() @ b.float().T) * sa[:, None] * sb[None, :]}
    return inputs


# ------------------------------------------------------------------ RoPE
def _gemm_rope(interleaved: bool):
    def inputs(g: torch.Generator):
        a, w = _gemm_operands(g)  # N = 200: three heads of 64, the last one short (a column tail)
        cos, sin = ref.rope_tables(M, 64)
        y = torch.full((M, N), float("nan")).to(torch.bfloat16)
        want = torch.nn.functional.pad(a.float() @ w.float(), (0, 256 - N)).reshape(1, M, 4, 64)
        want = ref.rope(want, cos.float(), sin.float(), interleaved).reshape(M, 256)[:, :N]
        return [a, w, cos, sin, y], {4: want}
    return inputs


def _rope(interleaved: bool, D: int = 64):
    def inputs(g: torch.Generator):
        B, N, H = 2, 37, 3  # N: a tail of 5 past two blocks of 16
        x = _bf16(g, B, N, H, D)
        cos, sin = ref.rope_tables(N, D)
        y = torch.full((B, N, H, D), float("nan")).to(torch.bfloat16)
        return [x, cos, sin, y], {3: ref.rope(x.float(), cos.float(), sin.float(), interleaved)}
    return inputs


# ------------------------------------------------------------------ residual + LayerNorm / RMSNorm
EPS = 1e-5
ROWS_M = 37  # rows: a tail past two programs of 16


def _norm_operands(g: torch.Generator, N: int):
    x = _bf16(g, ROWS_M, N) + 3.0  # a mean large beside the spread: the variance keeps its digits
    return x.to(torch.bfloat16), _bf16(g, ROWS_M, N), _bf16(g, N), _bf16(g, N)


SEED, P = -(2 ** 35) - 12345, 0.3  # a seed with both key words set; the dropout probability


def _ln_forward(rms: bool, N: int, dropout: bool):
    def inputs(g: torch.Generator):
        x, res, w, bias = _norm_operands(g, N)
        keep = ref.dropout_mask(SEED, ROWS_M, N, P) if dropout else None
        h, y, mean, rstd = ref.layernorm_residual(x, res, w, bias, EPS, rms, keep, P)
        outs = [torch.full((ROWS_M, N), float("nan")).to(torch.bfloat16) for _ in range(2)]
        stats = [torch.full((ROWS_M,), float("nan")) for _ in range(2)]
        return [x, res, w, bias, *outs, *stats, EPS, SEED, P], {4: h, 5: y, 6: mean, 7: rstd}
    return inputs


def _ln_backward(rms: bool, N: int, dropout: bool):
    def inputs(g: torch.Generator):
        x, res, w, bias = _norm_operands(g, N)
        h, _, mean, rstd = ref.layernorm_residual(x, res, w, bias, EPS, rms)
        dy, dh = _bf16(g, ROWS_M, N), _bf16(g, ROWS_M, N)
        dres, dw, db = ref.layernorm_residual_bwd(dy, dh, h, w, bias, EPS, rms)
        out = [torch.full((ROWS_M, N), float("nan")).to(torch.bfloat16) for _ in range(2)]
        want = {7: dres, 8: dw, 9: db}
        if dropout:
            want[6] = ref.dropped(dres.to(torch.bfloat16), ref.dropout_mask(SEED, ROWS_M, N, P), P)
        else:
            want[6] = dres
            del want[7]
        return [dy, dh, h, w, mean, rstd, *out, torch.zeros(N), torch.zeros(N), SEED, P], want
    return inputs


def _norm_cases() -> dict[str, Case]:
    cases = {}
    for rms in (False, True):
        for dropout in (False, True):
            name = ("rmsnorm" if rms else "layernorm") + ("_dropout" if dropout else "")
            # dropout's Philox rounds need registers: 16 warps at the default BN of 4096
            full = {"rms": rms, "dropout": dropout, **({"warps": 16} if dropout else {})}
            for blocks, N, BN in (("one_block", 1000, 1024), ("blocks", 1000, 256)):
                small = {"BN": BN, "rms": rms, "dropout": dropout}
                cases[f"{name}_fwd_{blocks}"] = Case("layernorm_residual.tk", _ln_forward(rms, N, dropout),
                                                     small, full, tol=(1e-2, 1e-2))
                # The backward's long rows sweep in SBN-wide blocks: two of 512 (the second a tail).
                bwd_small = {**small, "SBN": 512} if blocks == "blocks" else small
                cases[f"{name}_bwd_{blocks}"] = Case("layernorm_residual_bwd.tk", _ln_backward(rms, N, dropout),
                                                     bwd_small, full)
    return cases


CASES = {
    "gelu_tanh": Case("gemm_bias_gelu.tk", _bias_gelu("tanh"), GEMM_SMALL),
    "gelu_erf": Case("gemm_bias_gelu.tk", _bias_gelu("none"), {**GEMM_SMALL, "approx_tanh": False},
                     {"approx_tanh": False}),
    "swiglu": Case("gemm_swiglu.tk", _swiglu, GEMM_SMALL),
    "residual": Case("gemm_residual.tk", _residual, GEMM_SMALL),
    "fp8_tensorwise": Case("gemm_fp8_scaled.tk", _fp8_scaled(False), FP8_SMALL),
    "fp8_rowwise": Case("gemm_fp8_scaled.tk", _fp8_scaled(True), {**FP8_SMALL, "rowwise": True}, {"rowwise": True}),
    "gemm_rope": Case("gemm_rope.tk", _gemm_rope(False), {"BM": 64, "D": 64, "BK": 32}, {"D": 64}),
    "gemm_rope_interleaved": Case("gemm_rope.tk", _gemm_rope(True), {"BM": 64, "D": 64, "BK": 32, "interleaved": True},
                                  {"D": 64, "interleaved": True}),
    "rope_half": Case("rope.tk", _rope(False), {"D": 64, "BN": 16}, {"D": 64}, tol=(1e-2, 1e-2)),
    "rope_interleaved": Case("rope.tk", _rope(True), {"D": 64, "BN": 16, "interleaved": True},
                             {"D": 64, "interleaved": True}, tol=(1e-2, 1e-2)),
    "rope_half_d128": Case("rope.tk", _rope(False, 128), {"BN": 16}, tol=(1e-2, 1e-2)),
    "rope_interleaved_d128": Case("rope.tk", _rope(True, 128), {"BN": 16, "interleaved": True},
                                  {"interleaved": True}, tol=(1e-2, 1e-2)),
    **_norm_cases(),
}


def _compile(case: Case, consts: dict, stop: str = "cubin"):
    return compile_kernel(EXAMPLES / case.file, consts, stop=stop, cache=False, kernel=case.kernel)


def _close(got: dict[int, torch.Tensor], want: dict[int, torch.Tensor], tol: tuple[float, float]) -> None:
    for i, w in want.items():
        torch.testing.assert_close(got[i].float(), w.float(), rtol=tol[0], atol=tol[1],
                                   msg=lambda m, i=i: f"argument {i}: {m}")


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_matches_torch(name: str, seed: int) -> None:
    case = CASES[name]
    args, want = case.inputs(torch.Generator().manual_seed(seed))
    run_kernel(_compile(case, case.small, "tkir").kernel_op, args)
    _close(dict(enumerate(args)), want, case.tol)


@pytest.mark.parametrize("name", list(CASES))
def test_emulator_matches_interpreter(name: str) -> None:
    case = CASES[name]
    args, want = case.inputs(torch.Generator().manual_seed(3))
    expect = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    run_kernel(_compile(case, case.small, "tkir").kernel_op, expect)
    emulate(_compile(case, case.small, "hopper").kernel_op, args, seed=3)
    # bf16 outputs: the two sum in other orders, a rounding boundary apart at most
    _close(dict(enumerate(args)), {i: expect[i] for i in want}, (8e-3, 8e-3))


def _distinct(size: str) -> list[str]:
    """The cases whose kernel at ``size`` no case before them compiles (the norms' one-block and
    blocks cases differ in their small constants only)."""
    seen, names = set(), []
    for name, case in CASES.items():
        key = (case.file, case.kernel, tuple(sorted(getattr(case, size).items())))
        if key not in seen:
            seen.add(key)
            names.append(name)
    return names


@needs_ptxas
@pytest.mark.parametrize("name, size", [pytest.param(n, "small", marks=pytest.mark.slow) for n in _distinct("small")]
                         + [(n, "full") for n in _distinct("full")])  # small: emulated below
def test_assembles_without_spills(name: str, size: str) -> None:
    case = CASES[name]
    assert_no_spills(_compile(case, getattr(case, size)))


@pytest.mark.gpu
@pytest.mark.parametrize("size", ["small", "full"])
@pytest.mark.parametrize("name", list(CASES))
def test_on_gpu_as_torch(name: str, size: str) -> None:
    require_gpu()
    case = CASES[name]
    args, want = case.inputs(torch.Generator().manual_seed(7))
    _close(dict(enumerate(launch_tensors(_compile(case, getattr(case, size)), args))), want, case.tol)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(256, 512, 256), (1008, 784, 528), (4096, 4096, 4096)])
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
def test_fp8_scaled_as_torch_scaled_mm(rowwise: bool, M: int, N: int, K: int) -> None:
    """gemm_fp8_scaled.tk as it ships against torch._scaled_mm on the same operands: B [N, K]
    is _scaled_mm's column-major [K, N] transposed, the scales its f32 tensors (rowwise:
    scale_a [M, 1], scale_b [1, N]) seen as vectors.  Shapes whose dims are multiples of 16
    (as _scaled_mm needs) with tails past the 128 x 256 x 128 tile."""
    require_gpu()
    from tkc.runtime.launch import launch

    g = torch.Generator(device="cuda").manual_seed(11)
    a, b = (torch.randn(n, K, generator=g, device="cuda").to(torch.float8_e4m3fn) for n in (M, N))
    shapes = ((M, 1), (1, N)) if rowwise else ((), ())
    sa, sb = ((torch.rand(s, generator=g, device="cuda") + 0.5) * K ** -0.25 for s in shapes)
    want = torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)
    c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    launch(_compile(CASES["fp8_rowwise" if rowwise else "fp8_tensorwise"], {"rowwise": rowwise}),
           [a, b, sa.reshape(-1), sb.reshape(-1), c])
    # Both accumulate in f32 and round once to bf16, in other orders: a bf16 ulp or two apart.
    torch.testing.assert_close(c.float(), want.float(), rtol=2e-2, atol=2e-2)
