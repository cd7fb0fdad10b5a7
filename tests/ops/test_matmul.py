"""tkc.ops.matmul against torch on random bf16 inputs (in the interpreter): tails past the
GEMM's 128x256 tiles, leading dims, gradients (through the same kernel), opcheck, errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tkc.ops  # noqa: E402
from tkc.errors import TkcUsageError  # noqa: E402


def bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(torch.bfloat16)


@pytest.mark.parametrize("a_shape, n", [((130, 70), 260), ((2, 3, 21, 40), 24)])
def test_forward_and_gradients_match_torch(a_shape: tuple[int, ...], n: int) -> None:
    torch.manual_seed(sum(a_shape) + n)
    a, b = bf16(*a_shape).requires_grad_(), bf16(a_shape[-1], n).requires_grad_()
    c = tkc.ops.matmul(a, b)
    assert c.shape == (*a_shape[:-1], n) and c.dtype == torch.bfloat16
    af, bf = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()
    want = af @ bf
    tol = {"atol": 2e-2 * want.abs().max().item(), "rtol": 2e-2}
    torch.testing.assert_close(c.float(), want, **tol)
    g = bf16(*c.shape)
    c.backward(g)
    want.backward(g.float())
    for got, exp in ((a, af), (b, bf)):
        torch.testing.assert_close(got.grad.float(), exp.grad, atol=2e-2 * exp.grad.abs().max().item(), rtol=2e-2)


def test_opcheck() -> None:
    torch.library.opcheck(torch.ops.tkc.matmul.default, (bf16(19, 40).requires_grad_(), bf16(40, 24).requires_grad_()))


def test_errors_before_any_kernel_runs() -> None:
    with pytest.raises(TkcUsageError, match="matmul: b is torch.float32"):
        tkc.ops.matmul(bf16(4, 8), torch.randn(8, 4))
    with pytest.raises(TkcUsageError, match="the inner dims must agree: a's last dim is 8 but b's first is 9"):
        tkc.ops.matmul(bf16(4, 8), bf16(9, 4))
    with pytest.raises(TkcUsageError, match="b must have two dims"):
        tkc.ops.matmul(bf16(2, 4, 8), bf16(2, 8, 4))
    with pytest.raises(TkcUsageError, match="a must have at least two dims"):
        tkc.ops.matmul(bf16(8), bf16(8, 4))
    with pytest.raises(TkcUsageError, match="matmul: a must be a torch tensor, got list"):
        tkc.ops.matmul([[1.0]], bf16(1, 4))
    with pytest.raises(TkcUsageError, match="matmul: b must be a torch tensor, got NoneType"):
        tkc.ops.matmul(bf16(4, 8), None)
