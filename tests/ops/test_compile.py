"""The shipped operators under torch.compile(fullgraph=True): one graph, no breaks, forward
and backward equal to eager (which the other tests compare with torch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tkc.ops  # noqa: E402


def block(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, proj: torch.Tensor) -> torch.Tensor:
    h = tkc.ops.rms_norm(x, w)
    h = tkc.ops.matmul(h, proj)
    h = tkc.ops.softmax(h) * 2
    return tkc.ops.layer_norm(h + x, w, b)


def test_a_block_of_tkc_ops_compiles_to_one_graph_and_trains() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 9, 32).to(torch.bfloat16)
    params = [torch.randn(32).to(torch.bfloat16), torch.randn(32).to(torch.bfloat16),
              (torch.randn(32, 32) / 6).to(torch.bfloat16)]
    explained = torch._dynamo.explain(block)(x, *params)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    grads = []
    for fn in (block, compiled):
        leaves = [p.clone().requires_grad_() for p in params]
        out = fn(x, *leaves)
        out.float().square().mean().backward()
        grads.append((out, [p.grad for p in leaves]))
    (eager, eager_grads), (comp, comp_grads) = grads
    torch.testing.assert_close(comp, eager)
    for g_eager, g_comp in zip(eager_grads, comp_grads):
        torch.testing.assert_close(g_comp, g_eager)


def test_the_compiled_backward_runs_the_backward_kernels() -> None:
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    torch._dynamo.reset()
    graphs = AotEagerAndRecordGraphs()
    x = torch.randn(2, 9, 32).to(torch.bfloat16).requires_grad_()
    params = [torch.randn(32).to(torch.bfloat16).requires_grad_() for _ in range(2)]
    proj = (torch.randn(32, 32) / 6).to(torch.bfloat16)
    torch.compile(block, fullgraph=True, backend=graphs)(x, *params, proj).float().sum().backward()
    (bw,) = graphs.bw_graphs
    called = {str(n.target) for n in bw.graph.nodes if n.op == "call_function"}
    assert {"tkc.rms_norm_backward.default", "tkc.layer_norm_backward.default",
            "tkc.softmax_backward.default"} <= called, called


def test_dynamic_shapes_trace_through_the_fake_implementations() -> None:
    """With symbolic sizes the signature's dims bind to SymInts: one graph serves every row count."""
    def f(x: torch.Tensor, w: torch.Tensor, proj: torch.Tensor) -> torch.Tensor:
        return tkc.ops.matmul(tkc.ops.rms_norm(x, w), proj)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    w, proj = torch.randn(32).to(torch.bfloat16), torch.randn(32, 16).to(torch.bfloat16)
    for rows in (5, 9, 17):
        x = torch.randn(2, rows, 32).to(torch.bfloat16)
        torch.testing.assert_close(compiled(x, w, proj), f(x, w, proj))
