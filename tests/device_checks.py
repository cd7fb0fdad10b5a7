"""Checks the tests of single kernels share: ptxas without spills, and a launch on the GPU of
the same arguments the interpreter ran (numpy arrays in storage form, scalars)."""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest

#: Marks a test that assembles PTX (ptxas on the PATH or in /usr/local/cuda/bin).
needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None and shutil.which("/usr/local/cuda/bin/ptxas") is None,
                                 reason="needs ptxas")


def assert_no_spills(compiled: Any) -> None:
    assert compiled.resources.spill_stores == 0 and compiled.resources.spill_loads == 0, compiled.resources


def launch_on_gpu(compiled: Any, args: list) -> list:
    """Launch ``compiled`` on CUDA copies of ``args``; the tensors back as numpy arrays (f32 for
    floats), scalars as they were.  Skips the test without a GPU."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    from tkc import dtypes
    from tkc.runtime.launch import launch

    params = compiled.kernel_op.regions[0].block.args
    cuda = [dtypes.to_torch(a, p.type.dtype).cuda() if isinstance(a, np.ndarray) else a
            for a, p in zip(args, params)]
    launch(compiled, cuda)
    torch.cuda.synchronize()
    return [(g.float() if g.dtype.is_floating_point else g).cpu().numpy() if isinstance(g, torch.Tensor) else g
            for g in cuda]
