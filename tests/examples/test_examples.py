"""Every example against a torch reference, in the interpreter, on fresh random
inputs (shapes that are and are not tile multiples), before and after the
default pipeline.  The seed of each run is in the failure message."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import secrets

import pytest

torch = pytest.importorskip("torch")

from tkc.frontend import compile_file  # noqa: E402
from tkc.interpreter import run_kernel  # noqa: E402
from tkc.passes.manager import PassManager  # noqa: E402
from tkc.passes.pipeline import DEFAULT_PIPELINE  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
BF16 = dict(atol=2e-2, rtol=2e-2)


def kernels(name: str, consts: dict):
    """The example's kernel as the frontend emits it and after the default pipeline."""
    raw = compile_file(str(EXAMPLES / name), consts)
    opt = compile_file(str(EXAMPLES / name), consts)
    PassManager(DEFAULT_PIPELINE).run(opt)
    return {"frontend": raw.kernel(), "pipeline": opt.kernel()}


def generator():
    seed = secrets.randbits(32)
    return torch.Generator().manual_seed(seed), seed


def randn(g, *shape):
    return torch.randn(*shape, generator=g).to(torch.bfloat16)


def poisoned(*shape):
    return torch.full(shape, float("nan"), dtype=torch.bfloat16)


def check(out, ref, seed, **tol):
    assert not torch.isnan(out).any(), f"unwritten or NaN outputs (seed {seed})"
    torch.testing.assert_close(out.float(), ref.float(), msg=lambda m: f"seed {seed}: {m}", **tol)


@pytest.mark.parametrize("stage", ["frontend", "pipeline"])
@pytest.mark.parametrize("M,N,K", [(128, 64, 64), (100, 72, 80), (17, 130, 33)])
def test_gemm(stage, M, N, K):
    k = kernels("gemm.tk", {"BM": 64, "BN": 64, "BK": 32})[stage]
    g, seed = generator()
    a, b, c = randn(g, M, K), randn(g, K, N), poisoned(M, N)
    run_kernel(k, [a, b, c])
    check(c, (a.float() @ b.float()).to(torch.bfloat16), seed, **BF16)


@pytest.mark.parametrize("stage", ["frontend", "pipeline"])
@pytest.mark.parametrize("M,N,K", [(128, 128, 128), (100, 72, 96)])
def test_gemm_fp8(stage, M, N, K):
    k = kernels("gemm_fp8.tk", {"BM": 64, "BN": 64, "BK": 64})[stage]
    g, seed = generator()
    a = torch.randn(M, K, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(N, K, generator=g).to(torch.float8_e4m3fn)
    c = poisoned(M, N)
    run_kernel(k, [a, b, c])
    check(c, (a.float() @ b.float().T).to(torch.bfloat16), seed, **BF16)


@pytest.mark.parametrize("stage", ["frontend", "pipeline"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D,N", [(64, 128), (64, 100), (128, 80)])
def test_attention(stage, causal, D, N):
    k = kernels("attn.tk", {"D": D, "BM": 64, "BN": 32, "causal": causal})[stage]
    g, seed = generator()
    B, H = 1, 2
    q, kk, v = (randn(g, B, H, N, D) for _ in range(3))
    o = poisoned(B, H, N, D)
    scale = 1 / math.sqrt(D)
    run_kernel(k, [q, kk, v, o, scale])
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), kk.float(), v.float(), is_causal=causal, scale=scale)
    check(o, ref, seed, **BF16)


@pytest.mark.parametrize("stage", ["frontend", "pipeline"])
@pytest.mark.parametrize("M,N", [(32, 512), (20, 700), (5, 33)])
def test_softmax(stage, M, N):
    k = kernels("softmax.tk", {"BM": 16, "BN": 256})[stage]
    g, seed = generator()
    x, y = randn(g, M, N) * 4, poisoned(M, N)
    run_kernel(k, [x, y])
    check(y, torch.softmax(x.float(), -1), seed, atol=4e-3, rtol=1e-2)


# Rows split over a cluster (softmax_split.tk, layernorm_split.tk).
SPLITS = [
    ({"BN": 256, "cluster": 4}, 5, 1000),   # one block a program, the last part partial
    ({"BN": 256, "cluster": 4}, 3, 500),    # two programs of each cluster have nothing to read
    ({"BN": 128, "cluster": 2}, 4, 700),    # two sweeps over each program's blocks
]


@pytest.mark.parametrize("stage", ["frontend", "pipeline"])
@pytest.mark.parametrize("consts,M,N", SPLITS)
def test_softmax_split_over_a_cluster(stage, consts, M, N):
    k = kernels("softmax_split.tk", consts)[stage]
    g, seed = generator()
    x, y = randn(g, M, N) * 4, poisoned(M, N)
    run_kernel(k, [x, y])
    check(y, torch.softmax(x.float(), -1), seed, atol=4e-3, rtol=1e-2)


@pytest.mark.parametrize("stage", ["frontend", "pipeline"])
@pytest.mark.parametrize("consts,M,N", SPLITS)
def test_layernorm_split_over_a_cluster(stage, consts, M, N):
    k = kernels("layernorm_split.tk", consts)[stage]
    g, seed = generator()
    x, w, b, y = randn(g, M, N), randn(g, N), randn(g, N), poisoned(M, N)
    run_kernel(k, [x, w, b, y, 1e-5])
    ref = torch.nn.functional.layer_norm(x.float(), (N,), w.float(), b.float(), 1e-5)
    check(y, ref, seed, atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("stage", ["frontend", "pipeline"])
@pytest.mark.parametrize("M,N", [(32, 512), (33, 300)])
def test_layernorm(stage, M, N):
    k = kernels("layernorm.tk", {"BM": 16, "BN": 256})[stage]
    g, seed = generator()
    x, w, b, y = randn(g, M, N), randn(g, N), randn(g, N), poisoned(M, N)
    eps = 1e-5
    run_kernel(k, [x, w, b, y, eps])
    ref = torch.nn.functional.layer_norm(x.float(), (N,), w.float(), b.float(), eps)
    check(y, ref, seed, atol=5e-2, rtol=2e-2)


def test_rmsnorm_python_kernel():
    spec = importlib.util.spec_from_file_location("rmsnorm_example", EXAMPLES / "rmsnorm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import tkc

    g, seed = generator()
    M, N, eps = 37, 300, 1e-6
    x, w, y = randn(g, M, N), randn(g, N), poisoned(M, N)
    tkc.interpret(mod.rmsnorm, x, w, y, eps, BM=16, BN=128)
    check(y, mod.reference(x, w, eps), seed, **BF16)


def test_tkc_interpret_env(monkeypatch):
    """TKC_INTERPRET=1 makes a plain call of a @tkc.kernel run in the interpreter."""
    spec = importlib.util.spec_from_file_location("rmsnorm_example2", EXAMPLES / "rmsnorm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    g, seed = generator()
    x, w, y = randn(g, 16, 256), randn(g, 256), poisoned(16, 256)
    monkeypatch.setenv("TKC_INTERPRET", "1")
    mod.rmsnorm(x, w, y, 1e-6)
    check(y, mod.reference(x, w, 1e-6), seed, **BF16)


def test_arguments_by_keyword(monkeypatch):
    """Tensors and scalars may be named like Python arguments; a name given twice, or one past
    a missing argument, is refused rather than taken for a constant that nothing reads; numpy
    integers are constants like ints."""
    import numpy as np

    import tkc
    from tkc.errors import TkcLaunchError

    spec = importlib.util.spec_from_file_location("rmsnorm_example3", EXAMPLES / "rmsnorm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    g, seed = generator()
    x, w = randn(g, 16, 256), randn(g, 256)
    want = mod.reference(x, w, 1e-6)
    monkeypatch.setenv("TKC_INTERPRET", "1")
    for call in (lambda y: mod.rmsnorm(x, w, y=y, eps=1e-6), lambda y: mod.rmsnorm(eps=1e-6, y=y, w=w, x=x),
                 lambda y: tkc.interpret(mod.rmsnorm, x, w, y, eps=1e-6, BN=np.int64(128))):  # numpy consts too
        y = poisoned(16, 256)
        call(y)
        check(y, want, seed, **BF16)
    with pytest.raises(TkcLaunchError, match=r"got two values for argument 'x' \(by position and by keyword\)"):
        mod.rmsnorm(x, w, poisoned(16, 256), 1e-6, x=x)
    with pytest.raises(TkcLaunchError, match=r"argument 'w' is missing before 'y'$"):
        mod.rmsnorm(x, y=poisoned(16, 256), eps=1e-6)
    with pytest.raises(TkcLaunchError, match=r"argument 'w' is missing before 'y' \('ww' is no parameter of it\)"):
        mod.rmsnorm(x, ww=w, y=poisoned(16, 256), eps=1e-6)
    from tkc.errors import TkcUsageError

    with pytest.raises(TkcUsageError, match="@tkc.kernel decorates a Python function, got int"):
        tkc.kernel(5)
    with pytest.raises(TkcUsageError, match=r"tkc.load takes the path of a .tk file \(a str or a Path\), got int"):
        tkc.load(5)


def test_a_meta_tensor_binds_but_does_not_run():
    # Meta tensors carry shapes (tkc.schedule binds them to pick pins); running one in the
    # interpreter is a launch error, not torch's "Cannot copy out of meta tensor".
    import tkc
    from tkc.errors import TkcLaunchError

    spec = importlib.util.spec_from_file_location("rmsnorm_example4", EXAMPLES / "rmsnorm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = torch.empty(16, 256, dtype=torch.bfloat16, device="meta")
    w, y = torch.zeros(256, dtype=torch.bfloat16), poisoned(16, 256)
    with pytest.raises(TkcLaunchError, match=r"^error: x: a meta tensor holds no data; pass a CPU tensor to the "
                                             r"interpreter \(or a CUDA one to the GPU\)$"):
        tkc.interpret(mod.rmsnorm, x, w, y, 1e-6)
