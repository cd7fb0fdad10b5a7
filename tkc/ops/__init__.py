"""tkc kernels as PyTorch operators (``torch.library`` custom ops).

    import tkc.ops

    y = tkc.ops.rms_norm(x, w, 1e-6)            # also torch.ops.tkc.rms_norm over rows
    op = tkc.ops.custom_op("mylib::my_op", my_kernel)   # any @tkc.kernel or tkc.load(...)
    tkc.ops.register_autograd(op, backward, setup)      # torch.library's pair, eager fast path too
    y = tkc.ops.call(op, x)                             # op(x), past the dispatcher when it can

- :mod:`tkc.ops.kernel_op`: a kernel as an operator: schema, fake implementation, running.
- :mod:`tkc.ops.rows`: ``rms_norm``, ``layer_norm``, ``softmax`` over the last dim.
- :mod:`tkc.ops.matmul`: ``matmul`` through gemm.tk, backward too.
- :mod:`tkc.ops.attention`: ``attention`` through attn_train.tk, backward too (GQA).
- :mod:`tkc.ops.varlen_attention`: ``varlen_attention`` of packed sequences (``cu_seqlens``)
  through varlen_attn_train.tk, backward too (GQA).
- :mod:`tkc.ops.fftconv`: ``fft_conv``, causal FFT convolution through fftconv.tk (a plain
  function launching its kernels, with gradients; under ``torch.compile`` the operator
  ``torch.ops.tkc.fft_conv``).
- :mod:`tkc.ops.based`: ``based``, Based linear attention through based.tk, long sequences of
  few heads in segments (a plain function too, forward only; ``torch.ops.tkc.based`` under
  ``torch.compile``).
- :mod:`tkc.ops.mx`: ``mx_quantize``, ``mx_dequantize`` (MXFP8) and ``mx_matmul`` (their GEMM).
- :mod:`tkc.ops.fp4`: ``fp4_quantize``, ``fp4_dequantize`` (MXFP4, NVFP4) and ``fp4_matmul``
  (bf16 activations by an FP4 weight).
- :mod:`tkc.ops.kernels`: the kernels the shipped operators run (package data).

Every operator traces under ``torch.compile(fullgraph=True)`` (its fake implementation
comes from the kernel's signature) and runs CUDA tensors on the GPU, CPU tensors (and
everything with ``TKC_INTERPRET=1``) in the interpreter.  Importing this package imports
torch and registers the shipped operators.
"""

from tkc.ops.attention import attention
from tkc.ops.based import based
from tkc.ops.fftconv import fft_conv
from tkc.ops.fp4 import fp4_dequantize, fp4_matmul, fp4_quantize
from tkc.ops.kernel_op import call, custom_op, register_autograd
from tkc.ops.matmul import matmul
from tkc.ops.mx import mx_dequantize, mx_matmul, mx_quantize
from tkc.ops.rows import layer_norm, rms_norm, softmax
from tkc.ops.varlen_attention import varlen_attention

__all__ = ["attention", "based", "call", "custom_op", "fft_conv", "fp4_dequantize", "fp4_matmul", "fp4_quantize",
           "layer_norm", "matmul", "mx_dequantize", "mx_matmul", "mx_quantize", "register_autograd", "rms_norm",
           "softmax", "varlen_attention"]
