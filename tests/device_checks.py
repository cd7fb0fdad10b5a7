"""What the tests of single kernels share: running a kernel in the interpreter and the emulator
on copies of one set of arguments, ptxas without spills (checked on the way to the emulator
where ptxas is found), located refusals, and a launch on a GPU of the interpreter's arguments."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tkc import dtypes
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.interpreter import random_args, run_kernel

from tkc.codegen.ptxas import find_ptxas  # noqa: E402  (the compiler's own search)

HAVE_PTXAS = find_ptxas() is not None

def is_multi_gpu(path: Path) -> bool:
    """Whether an example is a multi-GPU kernel (its tensors ``@ ranks``): it runs on R ranks,
    simulated (tests/ranks) or under torchrun, not through the single-GPU ``tkc run``."""
    return "@ ranks" in path.read_text()


def lowered_examples(root: Path, suffixes: tuple[str, ...] = (".tk", ".py")) -> list[Path]:
    """The single-GPU example files the compiler lowers: all but those whose first line says
    ``# refused:`` and the multi-GPU ones (tests/ranks)."""
    return sorted(p for p in root.iterdir() if p.suffix in suffixes and not p.read_text().startswith("# refused:")
                  and not is_multi_gpu(p))


_KERNEL_DEF = re.compile(r"^@kernel\s*\ndef\s+(\w+)\s*\(", re.M)


def kernel_names(path: Path) -> list[str]:
    """The kernels of a ``.tk`` file in order, read off its ``@kernel`` lines (the tests'
    parametrizations list them at collection, where compiling every file cost seconds)."""
    return _KERNEL_DEF.findall(path.read_text())


#: The constants tests/test_contract.py compiles each example with (the defaults of a few are large
#: for a CPU); an example not named here is compiled, assembled and checked for spills there
#: at its defaults.
CONTRACT_CONSTS = {"attn.tk": {"D": 64, "BM": 64, "BN": 32}, "gemm.tk": {"BM": 64, "BN": 64, "BK": 32},
                   "gemm_fp8.tk": {"BM": 64, "BN": 64, "BK": 64}, "softmax.tk": {"BN": 256},
                   "gemm_fp8_scaled.tk": {"BM": 64, "BN": 64, "BK": 64},
                   "softmax_split.tk": {"BN": 256, "cluster": 2}, "layernorm.tk": {"BN": 256},
                   "layernorm_split.tk": {"BN": 256, "cluster": 2}, "cross_entropy.tk": {"BV": 512},
                   "embedding.tk": {"BD": 256}, "splitk_gemm.tk": {"BM": 64, "BN": 64, "SPLIT": 2},
                   "paged_decode.tk": {"D": 64, "SPLITS": 16}, "varlen_attn.tk": {"D": 64, "BM": 64, "BN": 64},
                   "attn_train.tk": {"D": 64, "BM": 64, "BN": 64},
                   "varlen_attn_train.tk": {"D": 64, "BM": 64, "BN": 64},
                   "gemm_bias_gelu.tk": {"BM": 64, "BN": 64, "BK": 32},
                   "gemm_swiglu.tk": {"BM": 64, "BN": 64, "BK": 32},
                   "gemm_residual.tk": {"BM": 64, "BN": 64, "BK": 32}, "rope.tk": {"D": 64, "BN": 16},
                   "gemm_rope.tk": {"BM": 64, "D": 64, "BK": 32},
                   "layernorm_residual.tk": {"BN": 256}, "layernorm_residual_bwd.tk": {"BN": 256, "ROWS": 2}}

#: Example files with several kernels and the ones ``tkc run FILE --check`` checks (it takes one
#: at a time, --kernel).  attn_train.tk's backward needs the log-sum-exp its forward wrote: from
#: random ones its P reaches 2^60, where the order of the sums decides
#: (tests/examples/test_attn_train.py checks it on real inputs); so does varlen_attn_train.tk's.
RUN_KERNELS = {"paged_decode.tk": ["paged_decode", "combine"], "attn_train.tk": ["attn_fwd", "attn_bwd_pre"],
               "varlen_attn_train.tk": ["varlen_attn_fwd", "varlen_attn_bwd_pre"],
               # fftconv's and fft_rows' outputs on N(0, 1) inputs (not DFT matrices) reach 1e4-3e4,
               # where a bf16 step of 64-128 separates the emulator's order of additions from the
               # interpreter's; tests/examples/test_fftconv.py checks them on DFT matrices.
               "fftconv.tk": ["fft_cols", "ifft_cols", "row_norms"],
               "based.tk": ["based", "based_states", "based_split"],
               "mx_fp8.tk": ["mx_quantize", "mx_dequantize"], "gemm_mx.tk": ["gemm_mx", "gemm_mx_weights"],
               "mx_fp4.tk": ["mxfp4_quantize", "nvfp4_dequantize"],
               "gemm_fp4.tk": ["gemm_mxfp4", "gemm_nvfp4_weights_splitk"],
               "rows_bwd.tk": ["layernorm_bwd", "softmax_bwd", "layernorm_wgrad"]}

#: The examples ``tkc run --check`` checks in the default run, one of each kind of kernel (products,
#: attention and its backward, rows, 64-row products, gathers); every other example's run is
#: marked slow: tests/test_contract.py emulates each example against the interpreter.
RUN_FAST = {"gemm.tk", "attn.tk", "softmax.tk", "attn_train.tk", "linear_attn.tk", "moe_dispatch.tk"}

#: Marks a test that assembles PTX.
needs_ptxas = pytest.mark.skipif(not HAVE_PTXAS, reason="needs ptxas (CUDA toolkit or nvidia-cuda-nvcc)")


def lowered(compile_to: Callable[[str], Any]) -> Any:
    """The kernel as ``compile_to(stop)`` gives it: a cubin where ptxas is found (its spills
    asserted to be none), else hopper IR; ``.kernel_op`` is its hopper IR either way."""
    c = compile_to("cubin" if HAVE_PTXAS else "hopper")
    if HAVE_PTXAS:
        assert_no_spills(c)
    return c


def interpret_and_emulate(tile_ir: Any, hopper: Any, args: list, seed: int) -> tuple[list, list]:
    """(the interpreter's arguments, the emulator's) after running ``tile_ir`` and ``hopper`` on
    copies of ``args``."""
    want = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_kernel(tile_ir, want)
    emulate(hopper, got, seed=seed)
    return want, got


def assert_atomics_close(got: list, want: list, outs: tuple[int, ...], f32: float = 1e-4) -> None:
    """The torch tensors ``got[i]`` (the emulator's) against ``want[i]`` (the interpreter's) for
    each ``i`` in ``outs``: atomics and wgmma add in other orders than the interpreter, a few
    f32 ulps of the sums' largest terms (so of the output's scale, not of an element that
    cancels to near zero: attention backward's dQ reaches 44 where an element is 0.007), which
    may move a bf16 result by one of its ulps.  ``f32``: an f32 output's tolerance, relative to
    its scale; where it sums values rounded to bf16 in between (attention backward's dQ from
    dS), a sum's other order may move such a value by one bf16 ulp, 2^-8 of the terms."""
    import torch

    for i in outs:
        bf16 = got[i].dtype == torch.bfloat16
        scale = max(1.0, float(want[i].float().abs().max()))
        torch.testing.assert_close(got[i].float(), want[i].float(), rtol=1e-2 if bf16 else f32,
                                   atol=4e-3 if bf16 else f32 * scale)


def assert_no_spills(compiled: Any) -> None:
    r = compiled.resources
    assert r.spill_stores == 0 and r.spill_loads == 0, r


def assert_refused(src: str, error: type, message: str, line: int, **compile_args: Any) -> None:
    """Compiling ``src`` raises ``error`` matching ``message``, located at ``line``."""
    with pytest.raises(error, match=message) as e:
        compile_kernel(src, cache=False, **compile_args)
    assert e.value.loc is not None and e.value.loc.line == line, e.value


def interpret_and_run_on_gpu(compile_to: Callable[[str], Any], args: Any) -> tuple[list, list, list]:
    """(the arguments, the interpreter's after the kernel ``compile_to(stop)`` gives, and
    :func:`run_on_gpu`'s after its cubin).  ``args``: the arguments, or the dims to draw them
    from (``random_args`` with seed 5)."""
    require_gpu()
    c = compile_to("cubin")
    if isinstance(args, dict):
        args = random_args(c.kernel_op, args, 5)
    want = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_kernel(compile_to("tkir").kernel_op, want)
    return args, want, run_on_gpu(c, args)


def require_gpu() -> None:
    """Skip the test without a CUDA GPU (before it compiles a cubin it cannot run)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")


def blackwell_gpu() -> bool:
    """Whether torch sees an sm_100 GPU (B200/GB200), which sm_100a kernels need."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (10, 0)


needs_blackwell = pytest.mark.skipif(not blackwell_gpu(), reason="needs an sm_100 GPU (B200/GB200)")


def launch_tensors(compiled: Any, args: list) -> list:
    """``compiled`` launched on CUDA copies of ``args`` (torch CPU tensors, scalars); the
    arguments back, on the CPU.  Skips the test without a GPU."""
    import torch

    require_gpu()
    from tkc.runtime.launch import launch

    cuda = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    launch(compiled, cuda)
    torch.cuda.synchronize()
    return [a.cpu() if isinstance(a, torch.Tensor) else a for a in cuda]


def run_on_gpu(compiled: Any, args: list) -> list:
    """``compiled`` launched on GPU copies of ``args`` (numpy arrays in storage form, scalars);
    the tensors back as numpy arrays, float64 for floats and their own dtype for integers (an
    i64 past 2^53 stays exact), scalars as they were.  Skips the test without a GPU."""
    import torch

    require_gpu()
    from tkc.runtime.launch import launch

    params = compiled.kernel_op.regions[0].block.args
    cuda = [dtypes.to_torch(a, p.type.dtype).cuda() if isinstance(a, np.ndarray) else a
            for a, p in zip(args, params)]
    launch(compiled, cuda)
    torch.cuda.synchronize()
    return [(t.double() if t.dtype.is_floating_point else t).cpu().numpy() if isinstance(t, torch.Tensor) else t
            for t in cuda]
