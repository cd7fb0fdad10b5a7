"""tkc: a compiler from a small tile language to GPU kernels.

    import tkc

    @tkc.kernel
    def add(x: f32[N], y: f32[N], out: f32[N], BN: const = 256): ...

    tkc.interpret(add, x, y, out)          # reference interpreter (numpy)
    tkc.interpret_ranks(ag, [args0, args1])  # a multi-GPU kernel on 2 simulated ranks
    a = tkc.symmetric_empty((M, K), torch.bfloat16)  # under torchrun: a tensor @ ranks, on every rank
    add(x, y, out)                         # on the GPU (CUDA torch tensors)
    add.asm()["ptx"]                       # every stage: tkir, hopper, llvm, ptx, cubin
    gemm = tkc.load("gemm.tk")             # a .tk file's kernel, called like a @tkc.kernel
    tkc.compile_kernel(Path("k.tk"))       # the driver: source -> Compiled (tkc.compiler)
    tkc.autotune(add, [x, y, out], [{"BN": 256}, {"BN": 512}])   # the fastest configuration

The names below are what a kernel author needs from Python; the dtype and
``const`` names exist so editors and readers can resolve annotations.
"""

from typing import Any

from tkc.dtypes import bf16, f8e4m3, f8e5m2, f8e8m0, f16, f32, i1, i32, i64
from tkc.autotune import AutotuneResult, autotune
from tkc.compiler import Compiled, compile_kernel
from tkc.errors import TkcError
from tkc.kernel import Kernel, interpret, interpret_ranks, kernel, load

__version__ = "0.1.0"


def symmetric_empty(shape: Any, dtype: Any, group: Any = None, device: Any = None) -> Any:
    """A CUDA tensor in PyTorch's symmetric memory on every rank of ``group`` (default: the
    default process group), for a ``@ ranks`` parameter: every rank calls it alike, in the same
    order (:func:`tkc.runtime.ranks.symmetric_empty`)."""
    from tkc.runtime.ranks import symmetric_empty as empty

    return empty(shape, dtype, group, device)


def symmetric_zeros(shape: Any, dtype: Any, group: Any = None, device: Any = None) -> Any:
    """:func:`symmetric_empty`, zeroed on every rank before any returns (flags start at zero)."""
    from tkc.runtime.ranks import symmetric_zeros as zeros

    return zeros(shape, dtype, group, device)


class const:  # noqa: N801 - spelled like the annotation it names
    """Annotation of a compile-time constant parameter: ``BM: const = 128``."""


__all__ = [
    "AutotuneResult", "Compiled", "Kernel", "TkcError", "autotune", "bf16", "compile_kernel", "const", "f8e4m3",
    "f8e5m2", "f8e8m0", "f16", "f32", "i1", "i32", "i64", "interpret", "interpret_ranks", "kernel", "load",
    "symmetric_empty", "symmetric_zeros", "__version__",
]
