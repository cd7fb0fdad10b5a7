"""``kernel_op.call``: a shipped operator goes straight to its kernel only for plain CUDA
tensors without gradients outside tracing; everything else (here: CPU tensors, fake tensors
under torch.compile) goes through the registered operator."""

from __future__ import annotations

import pytest
import torch

import tkc.ops
import tkc.ops.rows as rows


def test_cpu_tensors_go_through_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    run = rows._rms_norm.tkc_run
    monkeypatch.setattr(rows._rms_norm, "tkc_run", lambda *a, **k: seen.append(1) or run(*a, **k))
    x, w = torch.randn(20, 64).bfloat16(), torch.randn(64).bfloat16()
    with torch.no_grad():
        y = tkc.ops.rms_norm(x, w)
    want = torch.nn.functional.rms_norm(x.float(), (64,), w.float(), 1e-6)
    torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2)
    assert seen == []  # the operator ran it (the interpreter), not the direct path


def test_parameters_are_plain_tensors_and_wrappers_are_not() -> None:
    """A model's weights (``nn.Parameter``) go straight to the kernel as plain tensors do;
    tensors that override torch's dispatch (fake tensors under torch.compile) go through the
    operator."""
    from torch._subclasses.fake_tensor import FakeTensor

    from tkc.ops.kernel_op import _plain

    class Traced(torch.Tensor):  # a subclass that sees every torch function
        pass

    assert _plain(torch.Tensor) and _plain(torch.nn.Parameter)
    assert not _plain(FakeTensor) and not _plain(Traced)
