"""tkc.ops on a real GPU: each operator against torch, gradients, a user kernel's operator,
torch.compile, and CUDA-graph capture and replay.

Run on a Hopper machine: ``python -m pytest -m gpu tests/gpu/test_ops_gpu.py -q``.  Without a
CUDA GPU every test here is skipped.
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

import tkc  # noqa: E402
import tkc.ops  # noqa: E402

F = torch.nn.functional


def bf16(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device="cuda") * scale).to(torch.bfloat16)


def close(got: torch.Tensor, want: torch.Tensor, tol: float = 3e-2) -> None:
    scale = max(want.abs().max().item(), 1e-3)
    torch.testing.assert_close(got.float(), want.float(), atol=tol * scale, rtol=tol)


def cases(n: int) -> dict:
    """Per operator: the tkc call and its fp32 torch reference, on (x, w, b)."""
    return {
        "rms_norm": (lambda x, w, b: tkc.ops.rms_norm(x, w, 1e-6), lambda x, w, b: F.rms_norm(x, (n,), w, 1e-6), 2),
        "layer_norm": (lambda x, w, b: tkc.ops.layer_norm(x, w, b, 1e-5),
                       lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5), 3),
        "softmax": (lambda x, w, b: tkc.ops.softmax(x), lambda x, w, b: torch.softmax(x, -1), 1),
    }


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "softmax"])
@pytest.mark.parametrize("shape", [(1000, 4096), (3, 77, 700), (5, 9000)])
def test_row_ops_match_torch(op: str, shape: tuple[int, ...]) -> None:
    tk, ref, used = cases(shape[-1])[op]
    x, w, b = bf16(*shape, scale=2.0), bf16(shape[-1]), bf16(shape[-1])
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    f32 = [t.float().requires_grad_() for t in (x, w, b)]
    y, want = tk(*leaves), ref(*f32)
    close(y, want)
    g = bf16(*shape)
    y.backward(g)
    want.backward(g.float())
    for got, exp in zip(leaves[:used], f32[:used]):
        close(got.grad, exp.grad)


@pytest.mark.parametrize("a_shape, n", [((4096, 4096), 4096), ((3, 333, 520), 264), ((2, 100, 136), 4104)])
def test_matmul_matches_torch(a_shape: tuple[int, ...], n: int) -> None:
    a, b = bf16(*a_shape).requires_grad_(), bf16(a_shape[-1], n).requires_grad_()
    af, bf = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()
    c, want = tkc.ops.matmul(a, b), af @ bf
    close(c, want, 2e-2)
    g = bf16(*c.shape)
    c.backward(g)
    want.backward(g.float())
    close(a.grad, af.grad, 2e-2)
    close(b.grad, bf.grad, 2e-2)


def test_interpret_knob_runs_cuda_tensors_in_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w = bf16(20, 64), bf16(64)
    on_gpu = tkc.ops.rms_norm(x, w)
    monkeypatch.setenv("TKC_INTERPRET", "1")
    interpreted = tkc.ops.rms_norm(x, w)
    assert interpreted.is_cuda
    close(interpreted, on_gpu, 1e-2)


def block(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, proj: torch.Tensor) -> torch.Tensor:
    h = tkc.ops.rms_norm(x, w)
    h = tkc.ops.matmul(h, proj)
    h = tkc.ops.softmax(h)
    return tkc.ops.layer_norm(h + x, w, b)


def block_inputs() -> tuple[torch.Tensor, ...]:
    return bf16(4, 100, 512), bf16(512), bf16(512), bf16(512, 512, scale=0.05)


def test_cuda_graph_replay_gives_identical_results() -> None:
    x, w, b, proj = block_inputs()
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up: compile, load and plan every launch first
        for _ in range(2):
            block(static_x, w, b, proj)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = block(static_x, w, b, proj)
    for _ in range(3):
        new_x = bf16(*x.shape)
        static_x.copy_(new_x)
        graph.replay()
        torch.cuda.synchronize()
        eager = block(new_x, w, b, proj)
        assert torch.equal(static_y, eager)  # the same kernels on the same inputs: bit for bit
        first = static_y.clone()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, first)


def test_compiled_with_cuda_graphs_matches_eager() -> None:
    inputs = block_inputs()
    explained = torch._dynamo.explain(block)(*inputs)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # recorded, then replayed as a CUDA graph
        out = compiled(*inputs).clone()
    assert torch.equal(out, block(*inputs))


def test_a_user_kernel_as_an_operator_on_the_gpu() -> None:
    from tkc.ops.kernels import path

    gemm = tkc.load(path("gemm.tk"))
    op = tkc.ops.custom_op("tkcgputest::gemm", gemm, consts={"BM": 128, "BN": 128})
    a, b = bf16(300, 200), bf16(200, 136)
    close(op(a, b), a.float() @ b.float(), 2e-2)


@pytest.mark.parametrize("B, H, KVH, N, D", [(2, 16, 4, 1000, 128), (1, 8, 8, 2125, 64), (4, 8, 1, 300, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_sdpa(B: int, H: int, KVH: int, N: int, D: int, causal: bool) -> None:
    q, k, v = (bf16(B, h, N, D).requires_grad_() for h in (H, KVH, KVH))
    f32 = [t.detach().float().requires_grad_() for t in (q, k, v)]
    o = tkc.ops.attention(q, k, v, causal=causal)
    want = F.scaled_dot_product_attention(*f32, is_causal=causal, enable_gqa=True)
    close(o, want, 2e-2)
    g = bf16(*o.shape)
    o.backward(g)
    want.backward(g.float())
    for got, exp in zip((q, k, v), f32):
        close(got.grad, exp.grad, 3e-2)


@pytest.mark.parametrize("H, KVH, D, lengths", [(16, 4, 128, [1, 0, 1000, 333, 2048, 64]),
                                                 (8, 8, 64, [3000, 17, 1, 900])])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_attention_matches_torch(H: int, KVH: int, D: int, lengths: list, causal: bool) -> None:
    """Packed sequences of ragged lengths, under torch.compile(fullgraph=True), against the
    float64 reference of each sequence on its own."""
    from varlen_reference import packed, reference

    q, k, v, do, cu = (t.cuda() for t in packed(11, lengths, H, KVH, D))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    f = torch.compile(tkc.ops.varlen_attention, fullgraph=True)
    o = f(*leaves, cu, max(lengths), causal=causal)
    o.backward(do)
    wo, _, *want = reference(q, k, v, do, cu, causal, D ** -0.5)
    close(o, wo, 2e-2)
    for got, exp in zip(leaves, want):
        close(got.grad, exp, 3e-2)


def test_varlen_tokens_past_the_last_offset_get_zero_gradients() -> None:
    """A padded batch: 300 tokens, sequences ending at 250; the padding's dQ, dK and dV are zero
    (dK and dV were whatever the allocator left), masked on the device."""
    from varlen_reference import assert_padding_gets_zero_gradients

    assert_padding_gets_zero_gradients(300, [100, 150], H=4, D=128, device="cuda")


def test_a_training_step_with_attention_replays_in_a_cuda_graph() -> None:
    """Forward and backward (dQ accumulated atomically, so equal to eager within rounding, not
    bit for bit) of rms_norm -> attention (GQA) -> matmul, captured once and replayed."""
    B, H, KVH, N, D = 2, 8, 2, 500, 64
    x, w = bf16(B, H, N, D), bf16(D)
    kv = [bf16(B, KVH, N, D).requires_grad_() for _ in range(2)]
    proj = bf16(D, D, scale=0.1).requires_grad_()

    def step(x: torch.Tensor) -> torch.Tensor:
        o = tkc.ops.attention(tkc.ops.rms_norm(x, w), *kv, causal=True)
        loss = tkc.ops.matmul(o, proj).float().square().mean()
        loss.backward()
        return loss.detach()

    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    for t in (*kv, proj):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step(static_x)
    static_grads = [t.grad for t in (*kv, proj)]  # made in the capture: each replay rewrites them
    for _ in range(2):
        static_x.copy_(bf16(*x.shape))
        graph.replay()
        torch.cuda.synchronize()
        for t in (*kv, proj):
            t.grad = None
        eager = [step(static_x.clone()), *(t.grad for t in (*kv, proj))]
        for r, e in zip([static_loss, *static_grads], eager):
            close(r, e, 1e-2)


def test_eager_calls_skip_the_dispatcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under no_grad a shipped operator runs its kernel straight away (``kernel_op.call``); with
    an input that needs a gradient it runs through its eager ``autograd.Function``, which
    records the operator's backward, here launching by the plan of the first call (inputs of
    the same shapes: the operator's body does not run again).  The numbers and the gradients
    are the dispatcher's."""
    import tkc.ops.rows as rows

    seen = []
    run = rows._rms_norm.tkc_run
    monkeypatch.setattr(rows._rms_norm, "tkc_run", lambda *a, **k: seen.append(1) or run(*a, **k))
    monkeypatch.setattr(rows._rms_norm.tkc_impl, "_plans", {})  # earlier tests' plans: start afresh
    monkeypatch.setattr(rows._rms_norm.tkc_impl, "_last", None)
    x, w = bf16(100, 256), bf16(256)
    with torch.no_grad():
        y = tkc.ops.rms_norm(x, w)
    assert seen == [1]
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    y2 = tkc.ops.rms_norm(xg, wg)
    node = y2.grad_fn  # 2-D rows: the operator's output itself, no view back to x's shape
    assert seen == [1] and type(node).__name__.endswith("_autogradBackward")
    torch.testing.assert_close(y, y2.detach(), rtol=0, atol=0)
    g = bf16(100, 256)
    y2.backward(g)
    xd, wd = x.clone().requires_grad_(), w.clone().requires_grad_()
    rows._rms_norm(xd, wd, 1e-6).backward(g)  # the dispatcher's operator
    for got, want in ((xg.grad, xd.grad), (wg.grad, wd.grad)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_attention_gradients_through_the_eager_function_are_the_dispatchers() -> None:
    attention = importlib.import_module("tkc.ops.attention")
    q, k, v = bf16(2, 4, 200, 64), bf16(2, 2, 200, 64), bf16(2, 2, 200, 64)
    do = bf16(2, 4, 200, 64)
    grads = []
    for eager in (True, False):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        if eager:
            o = tkc.ops.attention(*leaves, causal=True)
            assert type(o.grad_fn).__name__ == "attn_fwd_autogradBackward"
        else:
            o, _ = attention._fwd(*leaves, 0.125, D=64, BM=128, BN=128, causal=True)
        o.backward(do)
        grads.append([o.detach(), *(t.grad for t in leaves)])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=0, atol=2e-2)  # dQ's atomic adds: any order
