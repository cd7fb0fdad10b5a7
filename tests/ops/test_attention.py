"""tkc.ops.attention against torch's SDPA in fp32 (in the interpreter): forward and gradients,
causal and not, grouped-query heads, head dims 64 and 128, sequence lengths that are not tile
multiples; opcheck, torch.compile and tkc's errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tkc.ops  # noqa: E402
from tkc.errors import TkcUsageError  # noqa: E402
from compiled_graphs import backward_operators  # noqa: E402

F = torch.nn.functional


def bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(torch.bfloat16)


@pytest.mark.parametrize("B, H, KVH, N, D, causal", [
    (1, 2, 1, 70, 64, False),     # one block with a tail, two query heads per kv head
    (2, 2, 2, 200, 64, True),     # two blocks, the second partial, causal
    (1, 4, 2, 150, 128, True),    # D=128: the backward's 64-row query blocks, GQA
    (1, 1, 1, 130, 128, False),
])
def test_forward_and_gradients_match_sdpa(B: int, H: int, KVH: int, N: int, D: int, causal: bool) -> None:
    torch.manual_seed(B + H + KVH + N + D + causal)
    q, k, v = (bf16(B, h, N, D).requires_grad_() for h in (H, KVH, KVH))
    o = tkc.ops.attention(q, k, v, causal=causal)
    assert o.shape == q.shape and o.dtype == torch.bfloat16
    f32 = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*f32, is_causal=causal, enable_gqa=True)
    torch.testing.assert_close(o.float(), want, atol=2e-2, rtol=2e-2)
    g = bf16(*o.shape)
    o.backward(g)
    want.backward(g.float())
    for got, exp in zip((q, k, v), f32):
        torch.testing.assert_close(got.grad.float(), exp.grad, atol=2e-2 * exp.grad.abs().max().item(), rtol=2e-2)


def test_scale() -> None:
    q, k, v = bf16(1, 1, 40, 64), bf16(1, 1, 40, 64), bf16(1, 1, 40, 64)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.3)
    torch.testing.assert_close(tkc.ops.attention(q, k, v, scale=0.3).float(), want, atol=2e-2, rtol=2e-2)


def test_opcheck() -> None:
    q, k, v = (bf16(1, 2, 40, 64).requires_grad_() for _ in range(3))
    torch.library.opcheck(torch.ops.tkc.attn_fwd.default, (q, k, v, 0.125), {"D": 64, "causal": True})
    # the whole backward, also on a q that is a transposed view (the fake's strides are the real
    # call's); not aot_dispatch: it differentiates the backward again, which tkc refuses
    for qq in (q, bf16(1, 40, 2, 64).transpose(1, 2).requires_grad_()):
        o, lse = torch.ops.tkc.attn_fwd(qq, k, v, 0.125, D=64, causal=True)
        torch.library.opcheck(torch.ops.tkc.attn_backward.default, (qq, k, v, o, lse, bf16(1, 2, 40, 64), 0.125),
                              {"D": 64, "causal": True},
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_compiles_without_graph_breaks() -> None:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return tkc.ops.attention(q * 2, k, v, causal=True).float().sum()

    q, k, v = bf16(1, 2, 40, 64), bf16(1, 1, 40, 64), bf16(1, 1, 40, 64)
    explained = torch._dynamo.explain(f)(q, k, v)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    # the compiled backward runs one tkc operator (pre-pass, kernel and dQ's cast inside)
    ops = backward_operators(f, *leaves)
    assert [t for t in ops if "tkc" in str(t)] == [torch.ops.tkc.attn_backward.default]
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    f(*eager).backward()
    for a, b in zip(leaves, eager):
        torch.testing.assert_close(a.grad, b.grad)


def test_errors_before_any_kernel_runs() -> None:
    q = bf16(1, 4, 40, 64)
    with pytest.raises(TkcUsageError, match="attention: k is torch.float32"):
        tkc.ops.attention(q, torch.randn(1, 4, 40, 64), bf16(1, 4, 40, 64))
    with pytest.raises(TkcUsageError, match=r"q's heads \(4\) must be a positive multiple of k's and v's \(3\)"):
        tkc.ops.attention(q, bf16(1, 3, 40, 64), bf16(1, 3, 40, 64))
    with pytest.raises(TkcUsageError, match="the head dim is 32; its kernels take 64 or 128"):
        tkc.ops.attention(bf16(1, 1, 40, 32), bf16(1, 1, 40, 32), bf16(1, 1, 40, 32))
    with pytest.raises(TkcUsageError, match="q and k must have one sequence length"):
        tkc.ops.attention(q, bf16(1, 4, 41, 64), bf16(1, 4, 41, 64))
    with pytest.raises(TkcUsageError, match="q must have four dims"):
        tkc.ops.attention(bf16(4, 40, 64), bf16(4, 40, 64), bf16(4, 40, 64))
    # masked scores are -inf and the kernels scale a row's largest score: a scale of 0 made NaN
    for bad in (0.0, -0.5, float("nan")):
        with pytest.raises(TkcUsageError, match="attention: scale must be a positive number"):
            tkc.ops.attention(q, q, q, scale=bad)
    for bad in (1e39, 1e-46):  # positive doubles that are inf or 0 as the kernels' f32
        with pytest.raises(TkcUsageError, match="attention: scale must lie within f32's normal range"):
            tkc.ops.attention(q, q, q, scale=bad)
    with pytest.raises(TkcUsageError, match=r"attention: q and k must be on one device, got cpu and meta"):
        tkc.ops.attention(q, q.to("meta"), q)


def test_the_operators_themselves_refuse_what_their_kernels_do_not_take() -> None:
    # torch.ops.tkc.attn_fwd is public: 3 query heads over 2 kv heads read a kv head past the
    # last (zeros here, another tensor's memory on a GPU) and a negative scale made NaN
    q, k = bf16(1, 3, 20, 64), bf16(1, 2, 20, 64)
    with pytest.raises(TkcUsageError, match=r"attn_fwd: q's heads \(3\) must be a positive multiple of k's"):
        torch.ops.tkc.attn_fwd(q, k, k, 0.125, D=64)
    with pytest.raises(TkcUsageError, match="attn_fwd: q's heads .* of k's and v's \\(0\\)"):
        torch.ops.tkc.attn_fwd(q, bf16(1, 0, 20, 64), bf16(1, 0, 20, 64), 0.125, D=64)
    with pytest.raises(TkcUsageError, match="attn_fwd: scale must be a positive number"):
        torch.ops.tkc.attn_fwd(q[:, :2], k, k, -1.0, D=64)
    lse, delta = torch.zeros(1, 3, 20), torch.zeros(1, 3, 20)
    with pytest.raises(TkcUsageError, match="attn_bwd: q's heads"):
        torch.ops.tkc.attn_bwd(q, k, k, q, lse, delta, torch.zeros(1, 3, 20, 64), 0.125, D=64)
    # and under torch.compile, through the fake implementation
    f = torch.compile(lambda q, k: torch.ops.tkc.attn_fwd(q, k, k, 0.125, D=64), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="must be a positive multiple"):
        f(q, k)
    with pytest.raises(TkcUsageError, match="attention: causal is True or False, got 'no'"):
        tkc.ops.attention(q, q, q, causal="no")
    import numpy as np

    assert tkc.ops.attention(q, q, q, causal=np.True_).shape == q.shape  # numpy's bool is a bool


def test_an_argument_error_under_torch_compile_keeps_its_words() -> None:
    # Dynamo traces the checks; an error it could not construct lost its message
    f = torch.compile(lambda q, k: tkc.ops.attention(q, k, k), fullgraph=True, backend="eager")
    with pytest.raises(Exception) as e:
        f(bf16(1, 4, 40, 64), bf16(1, 3, 40, 64))
    assert "must be a positive multiple of k's and v's (3)" in f"{e.value} {e.value.__cause__!r}"


def test_a_tkc_error_keeps_its_arguments() -> None:
    # args-based for torch.compile, and still TkcError(message, loc=...) with a settable loc
    import pickle

    from tkc.errors import Loc

    e = TkcUsageError("bad", loc=Loc("k.tk", 3, 5))
    assert (e.message, e.loc.line, str(e)) == ("bad", 3, "k.tk:3:5: error: bad")
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), back.message, back.loc) == (TkcUsageError, "bad", e.loc)
    e.loc = None
    assert str(e) == "error: bad"


def test_gradients_of_gradients_are_refused_in_its_words() -> None:
    q, k, v = (bf16(1, 2, 40, 64).requires_grad_() for _ in range(3))
    (dq,) = torch.autograd.grad(tkc.ops.attention(q, k, v).float().sum(), q, create_graph=True)
    with pytest.raises(TkcUsageError, match="tkc.ops.attention has no second-order gradient"):
        dq.float().sum().backward()


def test_a_small_block_trains_under_compile_like_its_torch_twin() -> None:
    """A Llama-style block (RMSNorm, GQA attention, projections) of tkc.ops, compiled with
    fullgraph=True and trained a few SGD steps, follows the same block written in torch ops
    (SDPA) within bf16 noise."""
    torch.manual_seed(0)
    B, H, KVH, N, D = 1, 2, 1, 40, 64
    E = H * D

    def block(x: torch.Tensor, p: list[torch.Tensor], tkc_ops: bool) -> torch.Tensor:
        wn, wq, wk, wv, wo = p
        mm = tkc.ops.matmul if tkc_ops else torch.matmul
        h = tkc.ops.rms_norm(x, wn) if tkc_ops else F.rms_norm(x, (E,), wn, 1e-6)
        q, k, v = (mm(h, w).view(B, N, -1, D).transpose(1, 2) for w in (wq, wk, wv))
        if tkc_ops:
            o = tkc.ops.attention(q, k, v, causal=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return x + mm(o.transpose(1, 2).reshape(B, N, E), wo)

    x, target = bf16(B, N, E), bf16(B, N, E)
    init = [torch.ones(E), torch.randn(E, E) / 12, torch.randn(E, KVH * D) / 12, torch.randn(E, KVH * D) / 12,
            torch.randn(E, E) / 12]
    compiled = torch.compile(lambda x, p: block(x, p, True), fullgraph=True, backend="aot_eager")
    losses = {}
    for name, fn in (("tkc", compiled), ("torch", lambda x, p: block(x, p, False))):
        p = [t.to(torch.bfloat16).requires_grad_() for t in init]
        opt = torch.optim.SGD(p, lr=0.5)
        losses[name] = []
        for _ in range(4):
            opt.zero_grad()
            loss = (fn(x, p).float() - target.float()).square().mean()
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
    assert losses["tkc"][-1] < losses["tkc"][0]
    torch.testing.assert_close(torch.tensor(losses["tkc"]), torch.tensor(losses["torch"]), atol=0, rtol=2e-3)
