"""Binding launch arguments to a kernel's signature: the checks every backend shares.

Owns the device-independent half of "do these arguments fit this kernel": the
argument count, tensor vs scalar, element dtype, rank, fixed dims, symbolic
dims that must agree across tensors (``dim M is 128 from a (axis 0) but 96
from c (axis 0)``), scalar kinds and ranges, and that a tensor the kernel writes shares no
memory with another argument (:func:`check_separate`; numpy's overlap test, a torch
tensor's byte range).  The interpreter
(``tkc.interpreter``) and the GPU runtime (``tkc.runtime.args``) both call
:func:`bind`, so a wrong argument gets the same message whichever runs it.

Must not: look at where a tensor lives or how it is laid out (device, strides,
alignment: that is ``tkc.runtime.args``), convert or copy values, or import
torch (a torch tensor is recognised only if torch was already imported by the
caller).  Every failure is a :class:`~tkc.errors.TkcLaunchError`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from tkc import dtypes
from tkc.dtypes import DType, round_to
from tkc.errors import TkcLaunchError
from tkc.ir.types import ScalarType, TensorType, Type

__all__ = ["Param", "kernel_params", "bind", "check_scalar", "check_separate", "is_torch", "shares_memory",
           "written"]

#: A kernel parameter as the checks see it: its name and its IR type.
Param = tuple[str, Type]


def kernel_params(kernel: Any) -> list[Param]:
    """``(name, type)`` of each parameter of a ``tile.kernel`` op.  A parameter with no
    source name is called ``argument <i>``."""
    return [(a.name_hint or f"argument {a.index}", a.type) for a in kernel.regions[0].block.args]


def written(kernel: Any) -> frozenset[int]:
    """The positions of the tensor parameters a kernel (tile or hopper IR) writes."""
    from tkc.ir.dialects.hopper import LOWERED_WRITES

    params = list(kernel.regions[0].block.args)
    out = set()
    for op in kernel.walk():
        if op.name in LOWERED_WRITES and op.operands:
            t = op.operands[0]
            owner = getattr(t, "owner", None)
            if owner is not None and owner.name == "tile.peer":
                t = owner.operands[0]
            if t in params:
                out.add(params.index(t))
    return frozenset(out)


def check_separate(kernel_name: str, params: Sequence[Param], args: Sequence[Any], writes: frozenset[int]) -> None:
    """No tensor the kernel writes shares memory with another of its arguments: programs run
    in no fixed order and the compiler moves reads (docs/language.md), so a launch on
    overlapping tensors gives no defined result.  One tensor passed to two parameters the
    kernel only reads is fine."""
    for w in sorted(writes):
        for j, ((name, t), x) in enumerate(zip(params, args)):
            if j != w and isinstance(t, TensorType) and shares_memory(args[w], x):
                what = "also writes" if j in writes else "reads"
                raise TkcLaunchError(f"kernel @{kernel_name}: '{params[w][0]}' shares memory with '{name}', which "
                                     f"the kernel {what}; a tensor it writes must not overlap another argument "
                                     f"(programs run in no fixed order): pass a separate tensor, e.g. a .clone()")


def shares_memory(a: Any, b: Any) -> bool:
    """Whether two arrays (numpy) or tensors (torch, one device) share an element's memory."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        try:  # bounds that overlap, then whether an element is shared (strided views may interleave)
            return bool(np.may_share_memory(a, b)) and bool(np.shares_memory(a, b, max_work=10**6))
        except np.exceptions.TooHardError:
            return True
    if is_torch(a) and is_torch(b) and a.device == b.device and a.device.type != "meta":  # (meta: no memory)
        (a0, a1), (b0, b1) = byte_range(a), byte_range(b)
        return a0 < b1 and b0 < a1  # byte ranges that overlap (disjoint slices of one tensor do not)
    return False


def byte_range(t: Any) -> tuple[int, int]:
    """The bytes a torch tensor's elements span, [first, last + 1) (empty: none)."""
    if t.numel() == 0:
        return 0, 0
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def is_torch(x: Any) -> bool:
    """True for a torch tensor.  If torch was never imported, ``x`` cannot be one."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


#: The most elements an axis may have: kernels index with i32.
I32_MAX = 2**31 - 1


def check_axis(name: str, axis: int, size: int) -> None:
    """A tensor's axis of ``size`` elements fits the kernel's i32 indices."""
    if size > I32_MAX:
        raise TkcLaunchError(f"{name}: axis {axis} has {size} elements; tkc kernels index with i32 "
                             f"(at most {I32_MAX})")


def bind(kernel_name: str, params: Sequence[Param], args: Sequence[Any], *,
         numpy_ok: bool = True) -> dict[str, int]:
    """Check ``args`` against ``params`` and return the size of every symbolic dim.

    ``numpy_ok``: whether a numpy array may stand for a tensor (the interpreter takes
    them in tkc's storage form; the GPU runtime takes only torch tensors).
    """
    if len(args) != len(params):
        names = ", ".join(name for name, _ in params)
        raise TkcLaunchError(f"kernel @{kernel_name} takes {len(params)} arguments ({names}), "
                             f"got {len(args)}")
    dims: dict[str, tuple[int, str, int]] = {}
    for (name, t), x in zip(params, args):
        if isinstance(t, TensorType):
            _check_tensor(name, t, x, dims, numpy_ok)
        elif isinstance(t, ScalarType):
            check_scalar(name, t.dtype, x)
        else:
            raise TkcLaunchError(f"{name}: parameters of type {t} cannot be passed at launch")
    return {d: size for d, (size, _, _) in dims.items()}


def _check_tensor(name: str, t: TensorType, x: Any, dims: dict[str, tuple[int, str, int]],
                  numpy_ok: bool) -> None:
    if is_torch(x):
        if x.layout != sys.modules["torch"].strided:
            raise TkcLaunchError(f"{name}: a {str(x.layout).removeprefix('torch.')} tensor; kernels take dense "
                                 f"tensors (pass {name}.to_dense())")
        if dtypes.from_torch(x.dtype) != t.dtype:
            # FP4 pairs often come as bytes: the view that says what they are
            hint = f" (bytes of FP4 pairs: pass {name}.view(torch.float4_e2m1fn_x2))" \
                if t.dtype.is_packed and str(x.dtype) == "torch.uint8" else ""
            raise TkcLaunchError(f"{name}: expected a tensor of dtype {t.dtype.name}, got {x.dtype}{hint}")
    elif numpy_ok and isinstance(x, np.ndarray):
        # numpy has no bf16/fp8: those come as float32 arrays (tkc's storage form).
        if x.dtype != t.dtype.np_storage and dtypes.from_numpy(x.dtype) != t.dtype:
            raise TkcLaunchError(f"{name}: expected a numpy array of dtype {t.dtype.np_storage} "
                                 f"(holding {t.dtype.name} values), got {x.dtype}")
    else:
        what = "a numpy array or torch tensor" if numpy_ok else "a torch tensor"
        raise TkcLaunchError(f"{name}: expected {t} ({what}), got {type(x).__name__}")
    shape = tuple(x.shape)
    if len(shape) != t.rank:
        raise TkcLaunchError(f"{name}: expected rank {t.rank} for {t}, got shape {shape}")
    for axis, size in enumerate(shape):
        check_axis(name, axis, size)
    for axis, (size, stride) in enumerate(zip(shape, x.stride() if is_torch(x) else x.strides)):
        if stride == 0 and size > 1 and 0 not in shape:  # an expanded view: writing it would race with itself
            raise TkcLaunchError(f"{name}: axis {axis} has stride 0 (an expanded view, whose {size} elements there "
                                 f"share one place in memory); kernels take tensors whose elements each have "
                                 f"their own: pass {name}.contiguous()")
    for axis, (d, size) in enumerate(zip(t.dims, shape)):
        if isinstance(d, int):
            if d != size:
                raise TkcLaunchError(f"{name}: axis {axis} must have size {d}, got {size} (shape {shape})")
        elif d in dims and dims[d][0] != size:
            prev, pname, paxis = dims[d]
            raise TkcLaunchError(f"dim {d} is {prev} from {pname} (axis {paxis}) "
                                 f"but {size} from {name} (axis {axis})")
        else:
            dims.setdefault(d, (size, name, axis))


def check_scalar(name: str, dt: DType, x: Any) -> Any:
    """Check a scalar argument's kind (bool for i1, an integer for i32, any real number
    for floats) and range; return it as a plain numpy scalar (0-d arrays unwrapped)."""
    if isinstance(x, np.ndarray) and x.ndim == 0:
        x = x[()]
    is_bool = isinstance(x, (bool, np.bool_))
    is_int = isinstance(x, (int, np.integer)) and not is_bool
    ok = is_bool if dt.is_bool else is_int if dt.is_int else (is_int or isinstance(x, (float, np.floating)))
    if not ok:
        shown = f" {x!r}" if isinstance(x, (int, float, str, np.generic)) else ""
        kind = "bool" if dt.is_bool else dt.name
        raise TkcLaunchError(f"{name}: expected a scalar of type {kind}, got {type(x).__name__}{shown}")
    if dt.is_int and not dt.min <= int(x) <= dt.max:
        raise TkcLaunchError(f"{name}: {x} does not fit in {dt.name}")
    if dt.is_float and is_int and abs(int(x)) > sys.float_info.max:
        raise TkcLaunchError(f"{name}: an integer of {len(str(abs(int(x))))} digits is out of the range of a float "
                             f"(at most about 1.8e308; an f32 takes up to 3.4e38)")
    if dt.is_float and not -dt.max <= x <= dt.max and math.isfinite(float(x)) \
            and not math.isfinite(float(round_to(float(x), dt))):
        # The kernel would compute with an infinity the caller never wrote (inf and nan pass as given).
        becomes = "NaN" if dt == dtypes.f8e8m0 else "infinity"
        raise TkcLaunchError(f"{name}: {x!r} is out of {dt.name}'s range: it would round to {becomes}")
    return x
