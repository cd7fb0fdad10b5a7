"""tkc.ops.rms_norm, layer_norm and softmax against torch on random bf16 inputs (in the
interpreter): rows that are not multiples of the tiles, leading dims, rows longer than one
block, gradients (the backward kernels of rows_bwd.tk; second-order ones through torch ops),
opcheck and tkc's errors."""

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
# 512: layer_norm's backward by the kernel for rows of exactly one block; 8300: dw by norm_wgrad
@pytest.mark.parametrize("shape", [(37, 300), (2, 3, 19, 70), (9, 512), (3, 4100), (5, 8300)])
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


def test_second_order_gradients_match_torch() -> None:
    """create_graph=True: the backward in torch ops, which autograd differentiates again
    (against float64 torch; a loss whose second derivative is not a small difference of large
    terms, which bf16 would swamp)."""
    torch.manual_seed(3)
    n = 40
    c = torch.randn(6, n, dtype=torch.float64)
    for op in ("rms_norm", "layer_norm", "softmax"):
        tk, ref, (w, b) = references(n)[op]
        x = bf16(6, n, scale=2.0)
        got = []
        for fn, dtype in ((tk, torch.bfloat16), (ref, torch.float64)):
            leaves = [t.detach().to(dtype, copy=True).requires_grad_() for t in (x, w, b)]
            (gx,) = torch.autograd.grad((fn(*leaves).double() * c).sum(), leaves[0], create_graph=True)
            gx.double().square().sum().backward()
            got.append(leaves[0].grad.double())
        scale = got[1].abs().max().item()
        torch.testing.assert_close(got[0], got[1], atol=2e-2 * scale, rtol=2e-2, msg=op)


def test_layer_norm_backward_takes_the_one_block_kernel_for_rows_of_one_block(monkeypatch) -> None:
    """Rows of 512 columns (a multiple of 512, up to 8192) go to layernorm_bwd_block, rows of
    500 to layernorm_bwd (the parametrized test above checks both against torch)."""
    from tkc.ops import rows

    seen = []

    def recording(op, *args, **kwargs):
        seen.append(op)
        return real(op, *args, **kwargs)

    real = rows.call
    monkeypatch.setattr(rows, "call", recording)
    for n in (512, 500):
        x = bf16(3, n).requires_grad_()
        tkc.ops.layer_norm(x, bf16(n), bf16(n)).float().sum().backward()
    backward = [op for op in seen if op in (rows._layer_norm_bwd, rows._layer_norm_bwd_block)]
    assert backward == [rows._layer_norm_bwd_block, rows._layer_norm_bwd]


def test_backward_operators_have_no_gradient_of_their_own() -> None:
    x, w = bf16(4, 32).requires_grad_(), bf16(32)
    dx, _, _ = torch.ops.tkc.rms_norm_backward(bf16(4, 32), x, w, 1e-6)
    with pytest.raises(TkcUsageError, match="torch.ops.tkc.rms_norm_backward has no gradient of its own: for "
                                            "gradients of tkc.ops.rms_norm's gradients, call backward with "
                                            "create_graph=True"):
        dx.float().sum().backward()


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "softmax"])
@pytest.mark.parametrize("shape", [(37, 300), (3, 4100), (2, 517, 4096), (64, 8192), (40, 12000)])
def test_gradients_on_the_gpu_match_torch(op: str, shape: tuple[int, ...]) -> None:
    # The backward kernels (tkc/ops/kernels/rows_bwd.tk): rows past a program's share, a row
    # in one block past its end (300, 4100), rows longer than 8192 (12000: two sweeps), rows
    # copied ahead through cp.async.
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
    for got, exp in zip(leaves[:{"rms_norm": 2, "layer_norm": 3, "softmax": 1}[op]], f32):
        scale = exp.grad.abs().max().item()
        torch.testing.assert_close(got.grad.float(), exp.grad, atol=2e-2 * scale, rtol=2e-2)
