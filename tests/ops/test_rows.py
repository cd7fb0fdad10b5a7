"""tkc.ops.rms_norm, layer_norm and softmax against torch on random bf16 inputs (in the
interpreter): rows that are not multiples of the tiles, leading dims, rows longer than one
block, gradients, opcheck and tkc's errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tkc.ops  # noqa: E402
from tkc.errors import TkcUsageError  # noqa: E402

F = torch.nn.functional
BF16 = {"atol": 3e-2, "rtol": 3e-2}


def bf16(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape) * scale).to(torch.bfloat16)


def references(n: int) -> dict:
    """(tkc op, the same in fp32 torch, its extra arguments) per operator."""
    w, b = bf16(n), bf16(n)
    return {
        "rms_norm": (lambda x, w, b: tkc.ops.rms_norm(x, w, 1e-6),
                     lambda x, w, b: F.rms_norm(x, (n,), w, 1e-6), (w, b)),
        "layer_norm": (lambda x, w, b: tkc.ops.layer_norm(x, w, b, 1e-5),
                       lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5), (w, b)),
        "softmax": (lambda x, w, b: tkc.ops.softmax(x), lambda x, w, b: torch.softmax(x, -1), (w, b)),
    }


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "softmax"])
@pytest.mark.parametrize("shape", [(37, 300), (2, 3, 19, 70), (3, 4100)])
def test_forward_and_gradients_match_torch(op: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(sum(shape) * 10 + len(op))
    tk, ref, (w, b) = references(shape[-1])[op]
    x = bf16(*shape, scale=2.0)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    y = tk(*leaves)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    f32 = [t.detach().float().requires_grad_() for t in (x, w, b)]
    want = ref(*f32)
    torch.testing.assert_close(y.float(), want, **BF16)
    g = bf16(*shape)
    y.backward(g)
    want.backward(g.float())
    used = {"rms_norm": 2, "layer_norm": 3, "softmax": 1}[op]
    for got, exp in zip(leaves[:used], f32[:used]):
        scale = exp.grad.abs().max().item()
        torch.testing.assert_close(got.grad.float(), exp.grad, atol=3e-2 * scale, rtol=3e-2)


def test_layer_norm_without_weight_or_bias() -> None:
    x = bf16(5, 40)
    torch.testing.assert_close(tkc.ops.layer_norm(x).float(), F.layer_norm(x.float(), (40,)), **BF16)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "softmax"])
def test_opcheck(op: str) -> None:
    x, w, b = bf16(19, 40).requires_grad_(), bf16(40).requires_grad_(), bf16(40).requires_grad_()
    args = {"rms_norm": (x, w, 1e-6), "layer_norm": (x, w, b, 1e-5), "softmax": (x,)}[op]
    torch.library.opcheck(getattr(torch.ops.tkc, op).default, args)


def test_errors_before_any_kernel_runs() -> None:
    x = torch.randn(4, 64)
    with pytest.raises(TkcUsageError, match=r"rms_norm: x is torch.float32, but its kernel takes torch.bfloat16"):
        tkc.ops.rms_norm(x, torch.ones(64))
    with pytest.raises(TkcUsageError, match="weight must span x's last dim: weight's size is 32 but x's last"):
        tkc.ops.layer_norm(x.bfloat16(), bf16(32), bf16(64))
    with pytest.raises(TkcUsageError, match="weight must have one dim"):
        tkc.ops.rms_norm(x.bfloat16(), bf16(2, 32))
    with pytest.raises(TkcUsageError, match="softmax: x must have at least one dim"):
        tkc.ops.softmax(torch.tensor(1.0, dtype=torch.bfloat16))
    for op in (tkc.ops.rms_norm, tkc.ops.layer_norm):
        with pytest.raises(TkcUsageError, match=f"{op.__name__}: x must have at least one dim, got shape"):
            op(torch.tensor(1.0, dtype=torch.bfloat16), bf16(1))
    with pytest.raises(TkcUsageError, match="rms_norm: weight must be a torch tensor, got NoneType"):
        tkc.ops.rms_norm(x.bfloat16(), None)
    with pytest.raises(TkcUsageError, match="softmax: x must be a torch tensor, got list"):
        tkc.ops.softmax([[1.0, 2.0]])
    for bad in ("a", None, True):
        with pytest.raises(TkcUsageError, match="rms_norm: eps must be a number"):
            tkc.ops.rms_norm(x.bfloat16(), bf16(64), bad)
    with pytest.raises(TkcUsageError, match="layer_norm: eps must be a number, got str"):
        tkc.ops.layer_norm(x.bfloat16(), eps="a")
    with pytest.raises(TkcUsageError, match="rms_norm: x and weight must be on one device, got cpu and meta"):
        tkc.ops.rms_norm(x.bfloat16(), bf16(64).to("meta"))
    with pytest.raises(TkcUsageError, match="matmul: a and b must be on one device, got cpu and meta"):
        tkc.ops.matmul(x.bfloat16(), bf16(64, 8).to("meta"))


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("shape", [(37, 300), (3, 4100), (2, 517, 4096), (64, 8192)])
def test_gradients_on_the_gpu_match_torch(op: str, shape: tuple[int, ...]) -> None:
    # The backward kernels (tkc/ops/kernels/norm_backward.tk): rows past a program's share, a
    # row longer than one block (4100, 8192: two sweeps), rows copied ahead through cp.async.
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(sum(shape))
    tk, ref, (w, b) = references(shape[-1])[op]
    x = bf16(*shape, scale=2.0) + 1.0
    leaves = [t.cuda().requires_grad_() for t in (x, w, b)]
    f32 = [t.detach().float().requires_grad_() for t in leaves]
    g = bf16(*shape).cuda()
    tk(*leaves).backward(g)
    ref(*f32).backward(g.float())
    for got, exp in zip(leaves[:2 if op == "rms_norm" else 3], f32):
        scale = exp.grad.abs().max().item()
        torch.testing.assert_close(got.grad.float(), exp.grad, atol=2e-2 * scale, rtol=2e-2)
