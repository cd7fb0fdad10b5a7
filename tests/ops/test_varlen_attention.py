"""tkc.ops.varlen_attention against a float64 torch reference of each sequence on its own (in the
interpreter): forward and gradients of packed sequences of ragged lengths (empty and one-token
ones too), causal and not, grouped-query heads, head dims 64 and 128; the operator against
tkc.ops.attention on one sequence; opcheck, torch.compile and tkc's errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tkc.ops  # noqa: E402
from compiled_graphs import backward_operators  # noqa: E402
from tkc.errors import TkcUsageError  # noqa: E402
from varlen_reference import (assert_gradients_close, assert_padding_gets_zero_gradients, packed,  # noqa: E402
                              ragged_lengths, reference)


@pytest.mark.parametrize("seed, count, longest, H, KVH, D, causal", [
    (0, 5, 140, 2, 1, 64, False),    # two query heads per kv head, tails, an empty sequence
    (1, 5, 200, 2, 2, 64, True),     # causal, 128-row blocks with tails
    (2, 4, 150, 4, 2, 128, True),    # D=128: the backward's 64-row query blocks, GQA
    (3, 3, 130, 1, 1, 128, False),
])
def test_forward_and_gradients_match_torch(seed, count, longest, H, KVH, D, causal) -> None:
    q, k, v, do, cu = packed(seed, ragged_lengths(seed, count, longest), H, KVH, D)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = tkc.ops.varlen_attention(*leaves, cu, longest, causal=causal)
    assert o.shape == q.shape and o.dtype == torch.bfloat16
    wo, _, *want = reference(q, k, v, do, cu, causal, D ** -0.5)
    torch.testing.assert_close(o.double(), wo, atol=2e-2, rtol=2e-2)
    o.backward(do)
    assert_gradients_close([t.grad for t in leaves], want)


def test_one_sequence_is_attention() -> None:
    """One sequence of the packed layout is tkc.ops.attention of the [1, H, N, D] layout, forward
    and gradients, within the order of dQ's additions."""
    q, k, v, do, cu = packed(4, [150], 4, 2, 64)
    a = [t.clone().requires_grad_() for t in (q, k, v)]
    b = [t.transpose(0, 1)[None].clone().requires_grad_() for t in (q, k, v)]
    o = tkc.ops.varlen_attention(*a, cu, 150, causal=True, scale=0.2)
    o.backward(do)
    ob = tkc.ops.attention(*b, causal=True, scale=0.2)
    ob.backward(do.transpose(0, 1)[None])
    torch.testing.assert_close(o, ob[0].transpose(0, 1), atol=0, rtol=0)
    for x, y in zip(a, b):
        torch.testing.assert_close(x.grad, y.grad[0].transpose(0, 1), atol=1e-2, rtol=1e-2)


def test_opcheck() -> None:
    q, k, v, _, cu = packed(5, [30, 0, 17], 2, 1, 64)
    args = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), cu, 0.125, 30)
    torch.library.opcheck(torch.ops.tkc.varlen_attn_fwd.default, args, {"D": 64, "causal": True})
    # the whole backward, also on a q that is a transposed view (the fake's strides are the real
    # call's); not aot_dispatch: it differentiates the backward again, which tkc refuses
    for qq in (q, q.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()):
        o, lse = torch.ops.tkc.varlen_attn_fwd(qq, k, v, cu, 0.125, 30, D=64, causal=True)
        do = torch.randn(o.shape).to(torch.bfloat16)
        torch.library.opcheck(torch.ops.tkc.varlen_attn_backward.default, (qq, k, v, o, lse, cu, do, 0.125, 30),
                              {"D": 64, "causal": True},
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_compiles_without_graph_breaks() -> None:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
        return tkc.ops.varlen_attention(q * 2, k, v, cu, 40, causal=True).float().sum()

    q, k, v, _, cu = packed(6, [40, 1, 23], 2, 1, 64)
    explained = torch._dynamo.explain(f)(q, k, v, cu)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    # the compiled backward runs one tkc operator (pre-pass, kernel, dQ's cast, padding zeroed)
    ops = backward_operators(f, *leaves, cu)
    assert [t for t in ops if "tkc" in str(t)] == [torch.ops.tkc.varlen_attn_backward.default]
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    f(*eager, cu).backward()
    for a, b in zip(leaves, eager):
        torch.testing.assert_close(a.grad, b.grad)
    # the compiled graph checks offsets on the host as an eager call does (in the operator)
    with pytest.raises(TkcUsageError, match="cu_seqlens must rise from 0 to at most the 64 tokens; they run from 0 "
                                            "to 99"):
        torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, torch.tensor([0, 40, 99], dtype=torch.int32))


def test_errors_before_any_kernel_runs() -> None:
    q, k, v, _, cu = packed(7, [20, 20], 4, 2, 64)
    f = tkc.ops.varlen_attention
    with pytest.raises(TkcUsageError, match="varlen_attention: k is torch.float32"):
        f(q, k.float(), v, cu, 20)
    with pytest.raises(TkcUsageError, match=r"cu_seqlens is torch.int64, but its kernel takes torch.int32 "
                                            r"\(convert with .to\(torch.int32\)\)"):
        f(q, k, v, cu.long(), 20)
    with pytest.raises(TkcUsageError, match=r"q's heads \(4\) must be a positive multiple of k's and v's \(3\)"):
        f(q, k[:, :1].expand(-1, 3, -1), v[:, :1].expand(-1, 3, -1), cu, 20)
    with pytest.raises(TkcUsageError, match="the head dim is 32; its kernels take 64 or 128"):
        f(q[..., :32], k[..., :32], v[..., :32], cu, 20)
    with pytest.raises(TkcUsageError, match="q and k must have one token count: q's is 40 but k's is 39"):
        f(q, k[1:], v[1:], cu, 20)
    with pytest.raises(TkcUsageError, match=r"q must have three dims \[tokens, heads, D\]"):
        f(q[None], k, v, cu, 20)
    with pytest.raises(TkcUsageError, match="cu_seqlens must have one dim of at least two offsets"):
        f(q, k, v, cu[:1], 20)
    for bad in (0, 27.0, None, True, 2**31):  # (2**31 was refused as the kernel's max_len)
        with pytest.raises(TkcUsageError, match="max_seqlen is the longest sequence's length, an int from 1 to 2"):
            f(q, k, v, cu, bad)
    for bad in (0.0, -1.0, float("inf"), "a"):
        with pytest.raises(TkcUsageError, match="varlen_attention: scale must be a positive number"):
            f(q, k, v, cu, 20, scale=bad)
    # offsets on the host are checked (past the tokens or going down read memory of no sequence)
    for bad, said in (([0, 20, 41], "they run from 0 to 41"), ([0, 30, 20], r"cu_seqlens\[2\] = 20 is below"),
                      ([4, 20, 40], "they run from 4 to 40")):
        with pytest.raises(TkcUsageError, match=f"cu_seqlens must rise from 0 to at most the 40 tokens; {said}"):
            f(q, k, v, torch.tensor(bad, dtype=torch.int32), 30)
    with pytest.raises(TkcUsageError, match="max_seqlen is 16, but a sequence has 20 tokens"):
        f(q, k, v, cu, 16)


def test_tokens_past_the_last_offset_get_zero_gradients() -> None:
    assert_padding_gets_zero_gradients(50, [30, 10], H=2, D=64)  # tokens 40-49 belong to no sequence


def test_the_backward_operator_refuses_lse_one_row_a_token() -> None:
    """torch.ops.tkc.varlen_attn_bwd takes lse and delta in the forward's layout (each sequence's
    rows from a multiple of 128), not [H, T]: the kernel would read other rows."""
    q, k, v, do, cu = packed(5, [30, 0, 17], 2, 1, 64)
    lse = torch.zeros(2, q.shape[0])
    with pytest.raises(TkcUsageError, match="lse has 47 rows a head; the forward's layout has 512"):
        torch.ops.tkc.varlen_attn_bwd(q, k, v, do, lse, torch.zeros(2, 512), cu, 0.125, 30, D=64)
    with pytest.raises(TkcUsageError, match="delta has 47 rows a head"):
        torch.ops.tkc.varlen_attn_bwd(q, k, v, do, torch.zeros(2, 512), lse, cu, 0.125, 30, D=64)
