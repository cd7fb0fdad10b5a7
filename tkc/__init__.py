"""tkc: a compiler from a small tile language to GPU kernels.

    import tkc

    @tkc.kernel
    def add(x: f32[N], y: f32[N], out: f32[N], BN: const = 256): ...

    tkc.interpret(add, x, y, out)          # reference interpreter (numpy)
    tkc.interpret_ranks(ag, [args0, args1])  # a multi-GPU kernel on 2 simulated ranks
    add(x, y, out)                         # on the GPU (CUDA torch tensors)
    add.asm()["ptx"]                       # every stage: tkir, hopper, llvm, ptx, cubin
    gemm = tkc.load("gemm.tk")             # a .tk file's kernel, called like a @tkc.kernel
    tkc.compile_kernel(Path("k.tk"))       # the driver: source -> Compiled (tkc.compiler)
    tkc.autotune(add, [x, y, out], [{"BN": 256}, {"BN": 512}])   # the fastest configuration

The names below are what a kernel author needs from Python; the dtype and
``const`` names exist so editors and readers can resolve annotations.
"""

from tkc.dtypes import bf16, f8e4m3, f8e5m2, f16, f32, i1, i32, i64
from tkc.autotune import AutotuneResult, autotune
from tkc.compiler import Compiled, compile_kernel
from tkc.errors import TkcError
from tkc.kernel import Kernel, interpret, interpret_ranks, kernel, load

__version__ = "0.1.0"


class const:  # noqa: N801 - spelled like the annotation it names
    """Annotation of a compile-time constant parameter: ``BM: const = 128``."""


__all__ = [
    "AutotuneResult", "Compiled", "Kernel", "TkcError", "autotune", "bf16", "compile_kernel", "const", "f8e4m3",
    "f8e5m2", "f16", "f32", "i1", "i32", "i64", "interpret", "interpret_ranks", "kernel", "load", "__version__",
]
