"""Rows that once broke the examples (tests/examples/hard_rows.py), against torch: in the
interpreter as the frontend emits each example and after the default pipeline, and in the
emulator after the hopper pipeline.  softmax.tk and softmax_split.tk gave NaN for a row whose
first block of columns was -inf; layernorm.tk and layernorm_split.tk gave NaN for constant rows
(E[x^2] - mean^2 < 0 in f32).  The seed of each run is in the failure message."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import secrets

import pytest

torch = pytest.importorskip("torch")

import hard_rows  # noqa: E402

from tkc.compiler import compile_kernel  # noqa: E402
from tkc.emulator.machine import emulate  # noqa: E402
from tkc.frontend import compile_file  # noqa: E402
from tkc.interpreter import run_kernel  # noqa: E402
from tkc.passes.manager import PassManager  # noqa: E402
from tkc.passes.pipeline import DEFAULT_PIPELINE  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
STAGES = ["frontend", "pipeline", "emulator"]


def run(stage: str, name: str, consts: dict, args: list) -> None:
    """``name`` with ``consts`` on ``args`` (outputs written in place) at ``stage``."""
    if stage == "emulator":
        emulate(compile_kernel(EXAMPLES / name, consts, stop="hopper", cache=False).kernel_op, args)
        return
    module = compile_file(str(EXAMPLES / name), consts)
    if stage == "pipeline":
        PassManager(DEFAULT_PIPELINE).run(module)
    run_kernel(module.kernel(), args)


def generator() -> tuple[torch.Generator, int]:
    seed = secrets.randbits(32)
    return torch.Generator().manual_seed(seed), seed


def poisoned(*shape: int) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=torch.bfloat16)


# (example, constants, N): one block a row; two sweeps over blocks, the last partial; a row
# over a cluster, one block a program (the last program's partial, at 500 two read nothing)
# and two sweeps over each program's blocks.
SOFTMAXES = [("softmax.tk", {"BM": 16, "BN": 1024}, 700), ("softmax.tk", {"BN": 128}, 600),
             ("softmax_split.tk", {"BN": 256, "cluster": 4}, 900), ("softmax_split.tk", {"BN": 256, "cluster": 4}, 500),
             ("softmax_split.tk", {"BN": 128, "cluster": 2}, 700)]


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("name,consts,N", SOFTMAXES, ids=str)
def test_softmax_masked_and_extreme_rows(stage: str, name: str, consts: dict, N: int) -> None:
    g, seed = generator()
    x = hard_rows.softmax_rows(g, N, consts["BN"]).to(torch.bfloat16)
    y = poisoned(*x.shape)
    run(stage, name, consts, [x, y])
    ref = torch.softmax(x.float(), -1)
    assert ref[4].isnan().all()  # torch: a row of -inf has no softmax
    hard_rows.check(f"{name} {consts} {stage} (seed {seed})", y, ref, atol=4e-3, rtol=1e-2)


# Rows of 3001 columns (about one constant row in eight gave NaN before, whatever the summation
# order): one block a row (16 rows a program, and one), two sweeps of 1024- and 512-column
# blocks (one row a program, and 16), and the split kernel's one block a program (at 1500
# columns two of four read nothing) and two sweeps.
LAYERNORMS = [("layernorm.tk", {"BM": 16, "BN": 4096}, 3001), ("layernorm.tk", {"BN": 4096}, 3001),
              ("layernorm.tk", {"BN": 1024}, 3001), ("layernorm.tk", {"BM": 16, "BN": 512}, 3001),
              ("layernorm_split.tk", {"BN": 1024, "cluster": 4}, 3001),
              ("layernorm_split.tk", {"BN": 1024, "cluster": 4}, 1500),
              ("layernorm_split.tk", {"BN": 512, "cluster": 2}, 3001)]


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("name,consts,N", LAYERNORMS, ids=str)
def test_layernorm_constant_and_extreme_rows(stage: str, name: str, consts: dict, N: int) -> None:
    g, seed = generator()
    x = hard_rows.norm_rows(g, N).to(torch.bfloat16)
    w, b = (torch.randn(N, generator=g).to(torch.bfloat16) for _ in range(2))
    y = poisoned(*x.shape)
    run(stage, name, consts, [x, w, b, y, 1e-5])
    ref = torch.nn.functional.layer_norm(x.float(), (N,), w.float(), b.float(), 1e-5)
    hard_rows.check(f"{name} {consts} {stage} (seed {seed})", y, ref, atol=5e-2, rtol=2e-2)


def test_rmsnorm_constant_and_extreme_rows() -> None:
    spec = importlib.util.spec_from_file_location("rmsnorm_hard_rows", EXAMPLES / "rmsnorm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import tkc

    g, seed = generator()
    N = 300
    x = hard_rows.norm_rows(g, N).to(torch.bfloat16)
    w = torch.randn(N, generator=g).to(torch.bfloat16)
    for consts in ({"BM": 16, "BN": 128}, {"BM": 1, "BN": 512}):
        y = poisoned(*x.shape)
        tkc.interpret(mod.rmsnorm, x, w, y, 1e-6, **consts)
        hard_rows.check(f"rmsnorm {consts} (seed {seed})", y, mod.reference(x, w, 1e-6), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("N", [100, 33])
def test_attention_extreme_heads(stage: str, causal: bool, N: int) -> None:
    """Queries past N (a tail block) and keys past the diagonal masked, with scores in the
    thousands, queries of 1e-30, values of 1e30 and equal scores of 1e4."""
    g, seed = generator()
    D = 64
    q, k, v, scale = hard_rows.attention_heads(g, N, D)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    o = poisoned(*q.shape)
    consts = {"D": D, "BM": 64, "BN": 32, "causal": causal}
    if stage == "emulator":
        consts = {"D": D, "BM": 64, "BN": 64, "causal": causal}
    run(stage, "attn.tk", consts, [q, k, v, o, 1 / math.sqrt(D)])
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                           scale=1 / math.sqrt(D))
    hard_rows.check(f"attn {consts} {stage} (seed {seed})", o.float() / scale, ref / scale, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("stage", STAGES)
def test_gemm_extreme_rows(stage: str) -> None:
    g, seed = generator()
    M, N, K = 100, 72, 80
    a, b, scale = hard_rows.gemm_operands(g, M, N, K)
    a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    c = poisoned(M, N)
    run(stage, "gemm.tk", {"BM": 64, "BN": 64, "BK": 32}, [a, b, c])
    ref = (a.float() @ b.float()).to(torch.bfloat16)
    hard_rows.check(f"gemm {stage} (seed {seed})", c.float() / scale, ref.float() / scale, atol=3e-2, rtol=2e-2)
