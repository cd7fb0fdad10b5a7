"""tkc.ops.mx_quantize / mx_dequantize (examples/mx_fp8.tk as operators) against torch's own
conversions of the OCP MX rule, in the interpreter (CPU tensors): leading dims, a last dim
that leaves a tile's blocks part full, torch.compile without graph breaks, opcheck, errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tkc.ops  # noqa: E402
from mx_reference import dequantize, quantize, rows  # noqa: E402
from tkc.errors import TkcUsageError  # noqa: E402


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
    with pytest.raises(TkcUsageError, match=r"the last dim \(48\) must be a multiple of 32"):
        tkc.ops.mx_quantize(rows(2, 64, 2)[:, :48])
    with pytest.raises(TkcUsageError, match="x is torch.float32, but its kernel takes torch.bfloat16"):
        tkc.ops.mx_quantize(torch.randn(2, 64))
    with pytest.raises(TkcUsageError, match="has no gradient"):
        tkc.ops.mx_quantize(rows(2, 64, 3).requires_grad_())
    q, s = quantize(rows(2, 64, 4))
    for dequantize_op in (tkc.ops.mx_dequantize, torch.ops.tkc.mx_dequantize):  # the operator checks too
        with pytest.raises(TkcUsageError, match="scales must be q's shape with its last dim / 32"):
            dequantize_op(q, s[:, :1].contiguous())


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
