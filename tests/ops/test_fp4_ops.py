"""tkc.ops.fp4_quantize / fp4_dequantize / fp4_matmul (examples/mx_fp4.tk and gemm_fp4.tk as
operators) against the FP4 oracle of tests/mx_reference.py, in the interpreter (CPU tensors):
MXFP4 and NVFP4, leading dims, torch.compile without graph breaks, opcheck, errors; and on a
GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tkc.ops  # noqa: E402
from mx_reference import dequantize_fp4, quantize_mxfp4, quantize_nvfp4  # noqa: E402
import tkc  # noqa: E402
import tkc.ops.kernels  # noqa: E402
from tkc.errors import TkcError, TkcUsageError  # noqa: E402
from tkc.ops.mx import SPLITK_ROWS  # noqa: E402


def _rows(M: int, K: int, seed: int) -> torch.Tensor:
    """bf16 rows whose 16-blocks span 2^-8 to 2^8, with zero blocks."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K // 16, 16, generator=g) * torch.exp2(torch.randint(-8, 8, (M, K // 16, 1), generator=g))
    x[torch.rand(M, K // 16, generator=g) < 0.05] = 0
    return x.reshape(M, K).to(torch.bfloat16)


def _oracle(x: torch.Tensor, fmt: str, g: torch.Tensor | None = None):
    """The oracle's quantization of ``x``; NVFP4 with ``g`` where given (the GPU's division by
    6 * 448 may differ from the CPU's in the last bit: torch multiplies by the reciprocal)."""
    if fmt == "mxfp4":
        return (*quantize_mxfp4(x), None)
    if g is None:
        g = (x.float().abs().amax().clamp_min(2.0**-126) / (6 * 448)).reshape(1)
    return (*quantize_nvfp4(x, g), g)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("shape", [(3, 5, 64), (7, 800), (2, 32)])
def test_as_torch_with_leading_dims(fmt: str, shape: tuple[int, ...]) -> None:
    flat = _rows(int(torch.tensor(shape[:-1]).prod()), shape[-1], sum(shape))
    q, s, g = tkc.ops.fp4_quantize(flat.view(shape), fmt)
    want_q, want_s, want_g = _oracle(flat, fmt)
    block = 32 if fmt == "mxfp4" else 16
    assert q.shape == (*shape[:-1], shape[-1] // 2) and q.dtype == torch.float4_e2m1fn_x2
    assert s.shape == (*shape[:-1], shape[-1] // block)
    assert (g is None) == (want_g is None) and (g is None or torch.equal(g, want_g))
    assert torch.equal(q.view(torch.uint8).reshape(want_q.shape), want_q.view(torch.uint8))
    assert torch.equal(s.view(torch.uint8).reshape(want_s.shape), want_s.view(torch.uint8))
    back = tkc.ops.fp4_dequantize(q, s, g)
    assert back.shape == shape
    assert torch.equal(back.reshape(flat.shape), dequantize_fp4(want_q, want_s, want_g).to(torch.bfloat16))


def test_zeros_quantize_to_zeros() -> None:
    """NVFP4's global scale of a tensor of zeros is the smallest normal, not 0 (its scales
    would be 0 / 0)."""
    q, s, g = tkc.ops.fp4_quantize(torch.zeros(2, 64, dtype=torch.bfloat16), "nvfp4")
    assert g.item() > 0 and not s.float().any() and not q.view(torch.uint8).any()
    assert not tkc.ops.fp4_dequantize(q, s, g).any()


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("tokens", [24, 40, 90], ids=["split-K 64-row tiles", "split-K 128-row tiles",
                                                    "dequantized, then multiplied"])
def test_matmul_of_bf16_activations_by_fp4_weights(fmt: str, tokens: int) -> None:
    x = _rows(2 * tokens, 160, 14).view(2, tokens, 160)
    w, s, g = tkc.ops.fp4_quantize(_rows(24, 160, 15), fmt)
    c = tkc.ops.fp4_matmul(x, w, s, g)
    wd = dequantize_fp4(w, s, g).double()
    want = (x.double() @ wd.T).float().to(torch.bfloat16)
    # one bf16 rounding of an f32 sum (past SPLITK_ROWS of the bf16 weight's product: the weight
    # is rounded to bf16 first, exact for MXFP4, an e4m3 scale times g rounded for NVFP4)
    tol = 2**-8 if fmt == "mxfp4" or 2 * tokens <= SPLITK_ROWS else 2**-6
    assert c.shape == (2, tokens, 24) and torch.all((c.float() - want.float()).abs() <= want.float().abs() * tol
                                                    + 1e-3 * want.float().abs().max())
    f = torch.compile(lambda x: tkc.ops.fp4_matmul(x, w, s, g), fullgraph=True, backend="aot_eager")
    assert torch.equal(f(x), c)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_matmul_of_fp4_by_fp4(fmt: str) -> None:
    """FP4 activations with their scales by an FP4 weight: gemm_mxfp4 / gemm_nvfp4 in the
    interpreter (on sm_100a the tensor cores' kind::mxf4nvf4), any leading dims, compiled too."""
    xq, xs, xg = tkc.ops.fp4_quantize(_rows(2 * 40, 160, 16).view(2, 40, 160), fmt)
    w, s, g = tkc.ops.fp4_quantize(_rows(24, 160, 17), fmt)
    c = tkc.ops.fp4_matmul(xq, w, s, g, xs, xg)
    exact = dequantize_fp4(xq.view(80, 80), xs.view(80, -1)).double() @ dequantize_fp4(w, s).double().T
    if fmt == "nvfp4":
        exact = exact * (xg.double() * g.double())
    want = exact.float().to(torch.bfloat16).view(2, 40, 24)
    assert c.shape == (2, 40, 24) and torch.all((c.float() - want.float()).abs() <= want.float().abs() * 2**-7
                                                + 1e-6 * want.float().abs().max())
    f = torch.compile(lambda xq: tkc.ops.fp4_matmul(xq, w, s, g, xs, xg), fullgraph=True, backend="aot_eager")
    assert torch.equal(f(xq), c)
    op = getattr(torch.ops.tkc, f"{fmt}_matmul").default
    args = (xq.view(80, 80), xs.view(80, -1), *([xg] if g is not None else []), w, s, *([g] if g is not None else []))
    torch.library.opcheck(op, args, test_utils=("test_faketensor",))
    with pytest.raises(TkcUsageError, match=r"x_scale must be x's shape with its last dim K / "):
        tkc.ops.fp4_matmul(xq, w, s, g, xs[..., :2].contiguous(), xg)
    with pytest.raises(TkcUsageError, match="x is torch.float4_e2m1fn_x2, but its kernel takes torch.bfloat16"):
        tkc.ops.fp4_matmul(xq, w, s, g)
    with pytest.raises(TkcUsageError, match="x_global belongs to FP4 activations"):
        tkc.ops.fp4_matmul(_rows(3, 160, 18), w, s, g, None, torch.ones(1))


def test_compiles_without_graph_breaks_and_opcheck() -> None:
    x = _rows(4, 64, 1)
    for fmt in ("mxfp4", "nvfp4"):
        f = torch.compile(lambda x, fmt=fmt: tkc.ops.fp4_dequantize(*tkc.ops.fp4_quantize(x, fmt)), fullgraph=True,
                          backend="aot_eager")
        q, s, g = _oracle(x, fmt)
        assert torch.equal(f(x), dequantize_fp4(q, s, g).to(torch.bfloat16))
        extra = () if g is None else (g,)
        torch.library.opcheck(getattr(torch.ops.tkc, f"{fmt}_quantize").default, (x, *extra),
                              test_utils=("test_faketensor",))
        torch.library.opcheck(getattr(torch.ops.tkc, f"{fmt}_dequantize").default, (q, s, *extra),
                              test_utils=("test_faketensor",))


def test_errors_before_any_kernel_runs() -> None:
    x = _rows(2, 64, 2)
    with pytest.raises(TkcUsageError, match=r"the last dim \(48\) must be a positive multiple of 32"):
        tkc.ops.fp4_quantize(x[:, :48].contiguous())
    with pytest.raises(TkcUsageError, match="fmt is 'mxfp4' or 'nvfp4', got 'fp4'"):
        tkc.ops.fp4_quantize(x, "fp4")
    with pytest.raises(TkcUsageError, match="has no gradient"):
        tkc.ops.fp4_quantize(x.clone().requires_grad_())
    q, s, g = tkc.ops.fp4_quantize(x, "nvfp4")
    with pytest.raises(TkcUsageError, match="NVFP4 .e4m3 scales. needs its global scale"):
        tkc.ops.fp4_dequantize(q, s)
    with pytest.raises(TkcUsageError, match=r"scales must be q's shape with its last dim 64 / 16"):
        tkc.ops.fp4_dequantize(q, s[:, :2].contiguous(), g)
    mq, ms, _ = tkc.ops.fp4_quantize(x, "mxfp4")
    with pytest.raises(TkcUsageError, match="MXFP4 .E8M0 scales. has no global scale"):
        tkc.ops.fp4_dequantize(mq, ms, g)
    with pytest.raises(TkcUsageError, match="scales are torch.float8_e8m0fnu .MXFP4. or torch.float8_e4m3fn"):
        tkc.ops.fp4_dequantize(mq, ms.float())
    with pytest.raises(TkcUsageError, match=r"w must hold x's K in pairs, \[N, K / 2\]"):
        tkc.ops.fp4_matmul(_rows(3, 128, 3), mq, ms)
    with pytest.raises(TkcUsageError, match=r"w_scale must be \[N, K / 32\]"):
        tkc.ops.fp4_matmul(x, mq, ms[:1].contiguous())
    with pytest.raises(TkcUsageError, match="w is torch.bfloat16, but its kernel takes torch.float4_e2m1fn_x2"):
        tkc.ops.fp4_matmul(x, x, ms)
    # a launch of the kernel itself on bytes says which view they need
    kernel = tkc.load(tkc.ops.kernels.path("mx_fp4.tk"), "mxfp4_dequantize")
    with pytest.raises(TkcError, match=r"pass q.view\(torch.float4_e2m1fn_x2\)"):
        tkc.interpret(kernel, mq.view(torch.uint8), ms, torch.empty(2, 64, dtype=torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_on_gpu_as_torch(fmt: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = _rows(37, 800, 9)
    q, s, g = tkc.ops.fp4_quantize(x.cuda(), fmt)
    want_q, want_s, want_g = _oracle(x, fmt, None if g is None else g.cpu())
    if g is not None:
        assert torch.allclose(g.cpu(), _oracle(x, fmt)[2], rtol=2**-23, atol=0)
    assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(s.cpu().view(torch.uint8), want_s.view(torch.uint8))
    assert torch.equal(tkc.ops.fp4_dequantize(q, s, g).cpu(), dequantize_fp4(want_q, want_s, want_g).to(torch.bfloat16))
    w, ws, wg = tkc.ops.fp4_quantize(_rows(136, 800, 10).cuda(), fmt)
    wd = tkc.ops.fp4_dequantize(w, ws, wg).double()
    for tokens in (16, 64, 100, 300):
        xt = _rows(tokens, 800, tokens).cuda()
        c = tkc.ops.fp4_matmul(xt, w, ws, wg)
        want = xt.double() @ wd.T
        assert ((c.double() - want).abs().max() / want.abs().max()).item() < 2**-7, tokens
        # FP4 activations too (on sm_90a both dequantized, then a bf16 product)
        xq, xs, xg = tkc.ops.fp4_quantize(xt, fmt)
        c = tkc.ops.fp4_matmul(xq, w, ws, wg, xs, xg)
        want = tkc.ops.fp4_dequantize(xq, xs, xg).double() @ wd.T
        assert ((c.double() - want).abs().max() / want.abs().max()).item() < 2**-7, tokens
