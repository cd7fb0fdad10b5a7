"""``kernel_op.register_autograd``: the eager ``autograd.Function`` that ``call`` uses for CUDA
tensors needing gradients records the same backward as the operator under torch's
dispatcher.  Run here on CPU tensors (the interpreter), straight through the Function, against
the operator: outputs and every gradient equal, ``ctx.needs_input_grad`` per operator
argument, keyword constants, a non-differentiable second output, one-tensor backwards."""

from __future__ import annotations

import importlib

import pytest
import torch

import tkc.ops.rows as rows

# The modules (tkc.ops.attention and tkc.ops.matmul are also the functions' names).
attention = importlib.import_module("tkc.ops.attention")
matmul = importlib.import_module("tkc.ops.matmul")


def bf16(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).bfloat16()


def both(op, inputs: list[torch.Tensor], scalars: tuple, kwargs: dict, grad_mask: list[bool], seed: int):
    """Outputs and leaf gradients from the operator, then from its eager Function (through
    ``tkc_apply``, the way ``call`` takes to it)."""
    results = []
    for via_function in (False, True):
        leaves = [t.clone().requires_grad_(m) for t, m in zip(inputs, grad_mask)]
        out = op.tkc_apply(*leaves, *scalars, kwargs) if via_function else op(*leaves, *scalars, **kwargs)
        first = out[0] if isinstance(out, tuple) else out
        if via_function:
            assert type(first.grad_fn).__name__ == f"{op.tkc_kernel.name}_autogradBackward"
        first.backward(bf16(*first.shape, seed=seed))
        results.append((out, [t.grad for t in leaves]))
    return results


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "softmax"])
def test_row_ops(name: str) -> None:
    x = bf16(20, 64, seed=1)
    inputs, scalars = {"rms_norm": ([x, bf16(64, seed=2)], (1e-6,)),
                       "layer_norm": ([x, bf16(64, seed=2), bf16(64, seed=3)], (1e-5,)),
                       "softmax": ([x], ())}[name]
    (o1, g1), (o2, g2) = both(getattr(rows, f"_{name}"), inputs, scalars, {}, [True] * len(inputs), seed=4)
    torch.testing.assert_close(o2, o1, rtol=0, atol=0)
    for a, b in zip(g2, g1):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("mask", [[True, True], [True, False], [False, True]])
def test_matmul_reads_needs_input_grad_per_argument(mask: list[bool]) -> None:
    a, b = bf16(70, 48, seed=5), bf16(48, 40, seed=6)
    (o1, g1), (o2, g2) = both(matmul._matmul, [a, b], (), {}, mask, seed=7)
    torch.testing.assert_close(o2, o1, rtol=0, atol=0)
    for a_, b_, m in zip(g2, g1, mask):
        assert (a_ is None) == (not m) and (b_ is None) == (not m)
        if m:
            torch.testing.assert_close(a_, b_, rtol=0, atol=0)


def test_attention_with_keyword_constants_and_lse() -> None:
    q, k, v = bf16(1, 2, 40, 64, seed=8), bf16(1, 1, 40, 64, seed=9), bf16(1, 1, 40, 64, seed=10)
    kwargs = {"D": 64, "BM": 16, "BN": 16, "causal": True}
    (o1, g1), (o2, g2) = both(attention._fwd, [q, k, v], (0.125,), kwargs, [True] * 3, seed=11)
    assert not o2[1].requires_grad  # lse: marked non-differentiable, as under the dispatcher
    for a, b in zip(o2, o1):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(g2, g1):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-2)  # dQ: f32 atomic adds in any order


def test_inside_functorch_transforms_the_function_takes_torchs_own_apply() -> None:
    """``tkc_apply`` skips ``Function.apply``'s Python wrapper only outside functorch transforms;
    inside one (here ``torch.func.grad``) the wrapper's own answer comes back."""
    x, w = bf16(4, 64, seed=8), bf16(64, seed=9)
    with pytest.raises(RuntimeError, match="it must override the setup_context"):
        torch.func.grad(lambda t: rows._rms_norm.tkc_apply(t, w, 1e-6, {}).float().sum())(x)
