"""tkc.ops.mx_quantize / mx_dequantize / mx_matmul (examples/mx_fp8.tk and gemm_mx.tk as
operators) against torch's own conversions of the OCP MX rule, in the interpreter (CPU
tensors): leading dims, a last dim that leaves a tile's blocks part full, torch.compile without
graph breaks, opcheck, errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tkc.ops  # noqa: E402
from mx_reference import dequantize, quantize, rows  # noqa: E402
from tkc.errors import TkcUsageError  # noqa: E402
from tkc.ops.mx import SPLITK_ROWS  # noqa: E402


@pytest.mark.parametrize("shape", [(3, 5, 64), (7, 800), (2, 32)])
def test_as_torch_with_leading_dims(shape: tuple[int, ...]) -> None:
    flat = rows(int(torch.tensor(shape[:-1]).prod()), shape[-1], sum(shape))
    x = flat.view(shape)
    q, s = tkc.ops.mx_quantize(x)
    want_q, want_s = quantize(flat)
    assert q.shape == shape and s.shape == (*shape[:-1], shape[-1] // 32)
    assert torch.equal(q.view(torch.uint8).reshape(want_q.shape), want_q.view(torch.uint8))
    assert torch.equal(s.view(torch.uint8).reshape(want_s.shape), want_s.view(torch.uint8))
    back = tkc.ops.mx_dequantize(q, s)
    assert back.shape == shape and torch.equal(back.reshape(flat.shape), dequantize(want_q, want_s))


def test_compiles_without_graph_breaks_and_opcheck() -> None:
    x = rows(4, 64, 1)
    f = torch.compile(lambda x: tkc.ops.mx_dequantize(*tkc.ops.mx_quantize(x)), fullgraph=True, backend="aot_eager")
    assert torch.equal(f(x), dequantize(*quantize(x)))
    torch.library.opcheck(torch.ops.tkc.mx_quantize.default, (x,), test_utils=("test_schema", "test_faketensor"))
    q, s = quantize(x)
    # (test_schema perturbs the inputs, which torch cannot for fp8 tensors on the CPU)
    torch.library.opcheck(torch.ops.tkc.mx_dequantize.default, (q, s), test_utils=("test_faketensor",))


def test_errors_before_any_kernel_runs() -> None:
    with pytest.raises(TkcUsageError, match=r"the last dim \(48\) must be a positive multiple of 32"):
        tkc.ops.mx_quantize(rows(2, 64, 2)[:, :48])
    with pytest.raises(TkcUsageError, match="x is torch.float32, but its kernel takes torch.bfloat16"):
        tkc.ops.mx_quantize(torch.randn(2, 64))
    with pytest.raises(TkcUsageError, match="has no gradient"):
        tkc.ops.mx_quantize(rows(2, 64, 3).requires_grad_())
    q, s = quantize(rows(2, 64, 4))
    for dequantize_op in (tkc.ops.mx_dequantize, torch.ops.tkc.mx_dequantize):  # the operator checks too
        with pytest.raises(TkcUsageError, match="scales must be q's shape with its last dim / 32"):
            dequantize_op(q, s[:, :1].contiguous())


def _moderate(M: int, K: int, seed: int) -> torch.Tensor:
    """bf16 rows whose 32-blocks span 2^-20 to 2^20: products far from f32's and bf16's range ends."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K // 32, 32, generator=g) * torch.exp2(torch.randint(-20, 20, (M, K // 32, 1), generator=g))
    return x.reshape(M, K).to(torch.bfloat16)


def _matmul_reference(a, sa, b, sb):
    return (dequantize(a.reshape(-1, a.shape[-1]), sa.reshape(-1, sa.shape[-1])).double()
            @ dequantize(b, sb).double().T).float().to(torch.bfloat16).view(*a.shape[:-1], b.shape[0])


def _close(c, want) -> bool:
    """Within one bf16 rounding (the interpreter sums exactly; the reference in float64)."""
    return bool(torch.all((c.float() - want.float()).abs() <= want.float().abs() * 2**-8))


def test_mx_matmul_as_torch_with_leading_dims() -> None:
    x, w = _moderate(2 * 70, 96, 5).view(2, 70, 96), _moderate(40, 96, 6)
    a, sa = tkc.ops.mx_quantize(x)
    b, sb = tkc.ops.mx_quantize(w)
    c = tkc.ops.mx_matmul(a, sa, b, sb)
    assert c.shape == (2, 70, 40) and c.dtype == torch.bfloat16
    assert _close(c, _matmul_reference(a, sa, b, sb))


def test_mx_matmul_compiles_without_graph_breaks_and_opcheck() -> None:
    a, sa = quantize(_moderate(16, 64, 7))
    b, sb = quantize(_moderate(32, 64, 8))
    f = torch.compile(tkc.ops.mx_matmul, fullgraph=True, backend="aot_eager")
    assert _close(f(a, sa, b, sb), _matmul_reference(a, sa, b, sb))
    torch.library.opcheck(torch.ops.tkc.mx_matmul.default, (a, sa, b, sb), test_utils=("test_faketensor",))


def test_mx_matmul_errors_before_any_kernel_runs() -> None:
    a, sa = quantize(rows(4, 64, 9))
    b, sb = quantize(rows(8, 64, 10))
    with pytest.raises(TkcUsageError, match="a and b must share their last dim"):
        tkc.ops.mx_matmul(a, sa, b[:, :32].contiguous(), sb[:, :1].contiguous())
    for op in (tkc.ops.mx_matmul, torch.ops.tkc.mx_matmul):  # the operator checks too
        with pytest.raises(TkcUsageError, match="b_scale must be its operand's shape with the last dim / 32"):
            op(a, sa, b, sb[:4].contiguous())
    with pytest.raises(TkcUsageError, match="b is torch.bfloat16, but its kernel takes torch.float8_e4m3fn"):
        tkc.ops.mx_matmul(a, sa, rows(8, 64, 11), sb)
    with pytest.raises(TkcUsageError, match=r"b must have two dims \[N, K\]"):
        tkc.ops.mx_matmul(a, sa, b.view(2, 4, 64), sb.view(2, 4, 2))
    with pytest.raises(TkcUsageError, match=r"the last dim \(0\) must be a positive multiple of 32"):
        tkc.ops.mx_matmul(a[:, :0], sa[:, :0], b[:, :0], sb[:, :0])


@pytest.mark.parametrize("tokens", [24, 40, 90], ids=["split-K 64-row tiles", "split-K 128-row tiles",
                                                    "a program a tile"])
def test_mx_matmul_of_bf16_activations_by_mx_weights(tokens: int) -> None:
    """``a_scale=None``: a bf16 ``a`` (any leading dims) by an MXFP8 weight; up to
    ``SPLITK_ROWS`` rows with K split over programs (48 and 80 rows), past it a program a tile
    (180)."""
    x = _moderate(2 * tokens, 160, 14).view(2, tokens, 160)
    b, sb = quantize(_moderate(24, 160, 15))
    c = tkc.ops.mx_matmul(x, None, b, sb)
    want = (x.double() @ dequantize(b, sb).double().T).float().to(torch.bfloat16)
    assert c.shape == (2, tokens, 24) and _close(c, want)
    f = torch.compile(lambda x: tkc.ops.mx_matmul(x, None, b, sb), fullgraph=True, backend="aot_eager")
    assert _close(f(x), want)
    op = torch.ops.tkc.mx_matmul_weights_splitk if 2 * tokens <= SPLITK_ROWS else torch.ops.tkc.mx_matmul_weights
    torch.library.opcheck(op.default, (x.view(2 * tokens, 160), b, sb), test_utils=("test_faketensor",))
    with pytest.raises(TkcUsageError, match="a is torch.float8_e4m3fn, but its kernel takes torch.bfloat16"):
        tkc.ops.mx_matmul(quantize(x.view(2 * tokens, 160))[0], None, b, sb)


@pytest.mark.gpu
def test_on_gpu_as_torch() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = rows(37, 800, 9)
    q, s = tkc.ops.mx_quantize(x.cuda().view(37, 25, 32).view(37, 800))
    want_q, want_s = quantize(x)
    assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(s.cpu().view(torch.uint8), want_s.view(torch.uint8))
    assert torch.equal(tkc.ops.mx_dequantize(q, s).cpu(), dequantize(want_q, want_s))


@pytest.mark.gpu
def test_mx_matmul_on_gpu_as_torch() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    a, sa = quantize(_moderate(300, 320, 12))
    b, sb = quantize(_moderate(136, 320, 13))
    c = tkc.ops.mx_matmul(a.cuda(), sa.cuda(), b.cuda(), sb.cuda()).cpu()
    want = _matmul_reference(a, sa, b, sb)
    size = dequantize(a, sa).double().abs() @ dequantize(b, sb).double().abs().T
    assert torch.all((c.double() - want.double()).abs() <= want.double().abs() * 2**-7 + size * 2**-20)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens, k", [(300, 320), (37, 1312), (128, 4128)])
def test_mx_matmul_weights_on_gpu_as_torch(tokens: int, k: int) -> None:
    """A program a tile (300 rows) and K split over programs (37 and 128 rows, tails in K)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = _moderate(tokens, k, 16)
    b, sb = quantize(_moderate(136, k, 17))
    c = tkc.ops.mx_matmul(x.cuda(), None, b.cuda(), sb.cuda()).cpu()
    want = (x.double() @ dequantize(b, sb).double().T)
    size = x.double().abs() @ dequantize(b, sb).double().abs().T
    assert torch.all((c.double() - want).abs() <= want.abs() * 2**-7 + size * 2**-20)
