"""Checking a GPU launch's arguments before anything reaches the GPU.

Owns the GPU-specific half of the launch checks: every tensor is a CUDA torch
tensor on the device the launch uses, its innermost dim is contiguous, its
base pointer is 16-byte aligned, and, for tensors read or written through TMA,
every outer stride is a multiple of 16 bytes.  The device-independent half
(count, dtype, rank, fixed and symbolic dims, scalar kinds) is
:func:`tkc.signature.bind`, shared with the interpreter, and runs first, so both
backends word those errors identically.

Must not: touch the driver, convert or copy tensors (a non-contiguous tensor is
an error, not a silent ``.contiguous()``: the kernel writes through it), or
encode tensor maps (``tkc.runtime.tensormap`` re-checks the TMA rules it owns
when it encodes one).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from tkc import signature
from tkc.errors import TkcLaunchError, TkcTmaStrideError
from tkc.ir.types import TensorType

__all__ = ["check_launch", "check_devices", "check_layout"]


def check_devices(tensors: Sequence[tuple[str, Any]], device: Any) -> None:
    """Every ``(name, torch.device)`` must be ``device`` (a CUDA torch.device with an index)."""
    for name, d in tensors:
        if d.type != "cuda":
            raise TkcLaunchError(f"{name}: expected a CUDA tensor, got a tensor on {d}")
        index = device.index if d.index is None else d.index
        if index != device.index:
            raise TkcLaunchError(f"{name}: is on {d} but the kernel runs on {device} "
                                 "(torch.cuda.current_device()); move it or use torch.cuda.device(...)")


def check_layout(name: str, shape: Sequence[int], strides: Sequence[int], elem_bytes: int, data_ptr: int,
                 tma: bool = False) -> None:
    """Innermost dim contiguous, base 16-B aligned and, for a TMA operand, outer byte strides
    multiples of 16.  A dim of size 1 may have any stride (nothing steps along it)."""
    if any(n == 0 for n in shape):
        return  # an empty tensor is never dereferenced
    if shape and shape[-1] != 1 and strides[-1] != 1:
        raise TkcLaunchError(f"{name}: the innermost dim must be contiguous (stride 1), got strides "
                             f"{tuple(strides)} for shape {tuple(shape)}; pass .contiguous()")
    for axis, s in enumerate(strides):
        if s < 0:
            raise TkcLaunchError(f"{name}: axis {axis} has a negative stride ({s})")
    if data_ptr % 16:
        raise TkcLaunchError(f"{name}: the data pointer {data_ptr:#x} is not 16-byte aligned "
                             f"(a view at an offset of {data_ptr % 16} bytes?); pass .clone()")
    if tma:
        for axis, (n, s) in enumerate(zip(shape[:-1], strides[:-1])):
            if n != 1 and (s * elem_bytes) % 16:
                raise TkcTmaStrideError(f"{name}: axis {axis} has a stride of {s * elem_bytes} bytes; TMA "
                                     "needs outer strides that are multiples of 16 bytes (compile with the "
                                     "pin tma=False to load it without TMA, or tma_vectors=False where that "
                                     "pin is set and it is a row vector)")


def check_launch(kernel_name: str, params: Sequence[signature.Param], args: Sequence[Any],
                 tma: Collection[str] = (), device: Any = None, writes: frozenset[int] = frozenset()) -> dict[str, int]:
    """Check ``args`` for a GPU launch of a kernel with ``params`` and return the symbolic
    dims.  ``tma`` names the tensor parameters accessed through tensor maps; ``device``
    defaults to torch's current CUDA device; ``writes``: the positions of the tensors the
    kernel writes (:func:`tkc.signature.written`), which must share memory with no other."""
    dims = signature.bind(kernel_name, params, args, numpy_ok=False)
    signature.check_separate(kernel_name, params, args, writes)
    tensors = [(name, x) for (name, t), x in zip(params, args) if isinstance(t, TensorType)]
    if device is None:
        import torch

        if not torch.cuda.is_available():
            raise TkcLaunchError("no CUDA device is available to torch (torch.cuda.is_available() is False)")
        device = torch.device("cuda", torch.cuda.current_device())
    check_devices([(name, x.device) for name, x in tensors], device)
    for name, x in tensors:
        check_layout(name, tuple(x.shape), tuple(x.stride()), x.element_size(), x.data_ptr(), name in tma)
    return dims
