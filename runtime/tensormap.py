"""TMA tensor maps: ``cuTensorMapEncodeTiled`` from a torch tensor.

Owns: the torch-dtype -> ``CU_TENSOR_MAP_DATA_TYPE`` table (fp8 travels as
UINT8: TMA only moves bytes), every rule PTX-FACTS §3 lists for a tiled map,
checked in pure Python *before* the driver sees the arguments
(:func:`tiled_params`, testable without a GPU), and :class:`TensorMap`, the
128-byte, 64-byte-aligned host copy that is passed to a kernel by value.

Must not: choose boxes or swizzles (``tkc.ir.layouts.SharedLayout.tma_box`` and
``tma_swizzle_enum`` do), check a kernel signature (``tkc.runtime.args``) or
launch anything.  Shapes and strides are taken in torch order (outermost first,
strides in elements) and given to the driver innermost first, in bytes.
"""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

from tkc.dtypes import DType
from tkc.errors import TkcLaunchError
from tkc.target import TENSOR_MAP_BYTES
from tkc.runtime import driver  # touches no GPU until a function of it is called

__all__ = ["DATA_TYPE", "SWIZZLE_BYTES", "TensorMap", "TiledParams", "data_type", "encode_tiled", "tiled_params"]

# torch dtype name -> (CU_TENSOR_MAP_DATA_TYPE, element bytes, is float)
DATA_TYPE: dict[str, tuple[int, int, bool]] = {
    "uint8": (0, 1, False), "int8": (0, 1, False), "bool": (0, 1, False),
    "float8_e4m3fn": (0, 1, True), "float8_e5m2": (0, 1, True),  # fp8: UINT8, TMA only moves bytes
    "float8_e8m0fnu": (0, 1, True),
    "float4_e2m1fn_x2": (0, 1, False),  # a pair of FP4 values a byte: UINT8
    "uint16": (1, 2, False), "int16": (1, 2, False),
    "uint32": (2, 4, False), "int32": (3, 4, False),
    "uint64": (4, 8, False), "int64": (5, 8, False),
    "float16": (6, 2, True), "float32": (7, 4, True), "float64": (8, 8, True), "bfloat16": (9, 2, True),
}
# CU_TENSOR_MAP_SWIZZLE_{NONE,32B,64B,128B} -> the most bytes the inner box dim may span.
SWIZZLE_BYTES = {0: None, 1: 32, 2: 64, 3: 128}
_MAX_STRIDE = 1 << 40
_MAX_DIM = 1 << 32


class TiledParams(NamedTuple):
    """The arguments of ``cuTensorMapEncodeTiled`` after the map pointer, in call order."""

    data_type: int
    rank: int
    global_address: int
    global_dim: tuple[int, ...]  # innermost first
    global_strides: tuple[int, ...]  # bytes, dims 1..rank-1
    box_dim: tuple[int, ...]  # innermost first
    element_strides: tuple[int, ...]
    interleave: int
    swizzle: int
    l2_promotion: int
    oob_fill: int


def data_type(dtype: Any) -> tuple[int, int, bool]:
    """(CU_TENSOR_MAP_DATA_TYPE, element bytes, is float) of a torch dtype or tkc DType."""
    if isinstance(dtype, DType):
        dtype = dtype.torch_dtype()
    name = str(dtype).removeprefix("torch.")
    if name not in DATA_TYPE:
        raise TkcLaunchError(f"TMA cannot move elements of dtype {dtype}")
    return DATA_TYPE[name]


def tiled_params(shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any, data_ptr: int,
                 box: tuple[int, ...], swizzle: int, *, oob_fill: int = 0, l2_promotion: int = 2,
                 name: str = "tensor") -> TiledParams:
    """Validate a tiled tensor map and return the driver's arguments.

    ``shape``/``strides`` are torch's (outermost first, strides in elements); ``box`` is
    innermost first, like the driver's boxDim; ``swizzle`` is the CU_TENSOR_MAP_SWIZZLE
    enum.  Every broken rule raises TkcLaunchError naming ``name`` and the rule.
    """
    dt, esize, is_float = data_type(dtype)
    rank = len(shape)

    def fail(rule: str) -> TkcLaunchError:
        return TkcLaunchError(f"{name}: cannot make a TMA tensor map: {rule}")

    if len(strides) != rank:
        raise fail(f"{len(strides)} strides for a rank-{rank} shape")
    if not 1 <= rank <= 5:
        raise fail(f"rank must be 1 to 5, got {rank} (shape {tuple(shape)})")
    if len(box) != rank:
        raise fail(f"the box has {len(box)} dims but the tensor has rank {rank}")
    if data_ptr % 16:
        raise fail(f"the base address {data_ptr:#x} is not 16-byte aligned")
    dims = tuple(int(d) for d in reversed(shape))
    estrides = tuple(int(s) for s in reversed(strides))
    for i, d in enumerate(dims):
        if not 1 <= d <= _MAX_DIM:
            raise fail(f"dim {rank - 1 - i} has size {d}; TMA needs 1 <= size <= 2^32")
    if estrides[0] != 1 and dims[0] != 1:
        raise fail(f"the innermost dim must be contiguous (stride 1), got stride {estrides[0]}")
    byte_strides = tuple(s * esize for s in estrides[1:])
    for i, s in enumerate(byte_strides, start=1):
        axis = rank - 1 - i
        if s <= 0 or s % 16 or s >= _MAX_STRIDE:
            raise fail(f"the stride of dim {axis} is {s} bytes; TMA needs a positive multiple of 16 "
                       "below 2^40")
    box = tuple(int(b) for b in box)
    for i, b in enumerate(box):
        if not 1 <= b <= 256:
            raise fail(f"box dim {i} (innermost first) is {b}; it must be in [1, 256]")
    if swizzle not in SWIZZLE_BYTES:
        raise fail(f"swizzle enum {swizzle} is not one of 0 (none), 1 (32B), 2 (64B), 3 (128B)")
    inner = box[0] * esize
    if inner % 16:
        raise fail(f"the inner box dim spans {inner} bytes ({box[0]} x {esize} B); it must be a multiple of 16")
    width = SWIZZLE_BYTES[swizzle]
    if width is not None and inner > width:
        raise fail(f"the inner box dim spans {inner} bytes, more than the {width}-byte swizzle")
    if l2_promotion not in (0, 1, 2, 3):
        raise fail(f"l2_promotion must be 0..3, got {l2_promotion}")
    if oob_fill not in (0, 1):
        raise fail(f"oob_fill must be 0 (zeros) or 1 (NaN), got {oob_fill}")
    if oob_fill == 1 and not is_float:
        raise fail(f"NaN out-of-bounds fill needs a float dtype, not {dtype}")
    return TiledParams(dt, rank, int(data_ptr), dims, byte_strides, box, (1,) * rank, 0, swizzle,
                       l2_promotion, oob_fill)


class TensorMap:
    """A 128-byte ``CUtensorMap`` in host memory, aligned to 128 bytes (the driver needs 64;
    CUDA 13 declares 128).  Pass it in a launch's ``params``; it must stay alive until the
    launch call returns (the driver copies it into the kernel's parameter space).

    ``params`` is the layout the map was validated for; :meth:`encode` writes it, at
    ``params.global_address`` or, for a launch that reuses the layout over another tensor of
    the same shape, strides and dtype, at that tensor's address (``base`` says which)."""

    def __init__(self, params: TiledParams, keepalive: Any = None):
        self.params = params
        self.base = params.global_address
        self._buf = ctypes.create_string_buffer(2 * TENSOR_MAP_BYTES - 1)
        self.address = -(-ctypes.addressof(self._buf) // TENSOR_MAP_BYTES) * TENSOR_MAP_BYTES
        self._keepalive = keepalive  # the tensor: its memory must outlive every launch using the map
        self._call: tuple | None = None  # the driver's entry point and arguments, made on first use
        self._replace: tuple | None = None  # cuTensorMapReplaceAddress and this map, made on first use

    @property
    def raw(self) -> bytes:
        return ctypes.string_at(self.address, TENSOR_MAP_BYTES)

    def copy(self) -> TensorMap:
        """A second map of the same layout and base, its 128 bytes copied (no driver call):
        what a launch plan re-bases for another address while keeping this one."""
        other = TensorMap(self.params)
        ctypes.memmove(other.address, self.address, TENSOR_MAP_BYTES)
        other.base = self.base
        return other

    def encode(self, address: int | None = None, name: str = "tensor") -> None:
        """``cuTensorMapEncodeTiled`` of ``params`` into this map, based at ``address``
        (default ``params.global_address``), which the caller has checked is 16-byte aligned.
        Every argument but the address is made once, as the ctypes objects an unprototyped
        call takes, so re-basing a map for another launch costs one bare driver call."""
        p = self.params
        if self._call is None:
            u64, u32, i32 = ctypes.c_uint64, ctypes.c_uint, ctypes.c_int
            self._call = (driver.unprototyped("cuTensorMapEncodeTiled"),
                          (ctypes.c_void_p(self.address), i32(p.data_type), u32(p.rank)),
                          ((u64 * p.rank)(*p.global_dim), (u64 * max(1, p.rank - 1))(*p.global_strides),
                           (u32 * p.rank)(*p.box_dim), (u32 * p.rank)(*p.element_strides), i32(p.interleave),
                           i32(p.swizzle), i32(p.l2_promotion), i32(p.oob_fill)))
        encode, head, tail = self._call
        base = p.global_address if address is None else address
        r = encode(*head, ctypes.c_void_p(base), *tail)
        if r:
            driver.check(r, f"cuTensorMapEncodeTiled({name}: {p._replace(global_address=base)})")
        self.base = base

    def rebase(self, address: int, name: str = "tensor") -> None:
        """The same map over another tensor of its layout at ``address`` (16-byte aligned, as the
        caller has checked): ``cuTensorMapReplaceAddress``, one two-argument driver call, where
        the driver has it, else the whole map encoded again."""
        if self._replace is None:
            try:
                self._replace = (driver.unprototyped("cuTensorMapReplaceAddress"), ctypes.c_void_p(self.address))
            except AttributeError:  # a driver older than the entry point
                self._replace = ()
        if not self._replace:
            self.encode(address, name)
            return
        replace, me = self._replace
        r = replace(me, ctypes.c_void_p(address))
        if r:
            driver.check(r, f"cuTensorMapReplaceAddress({name}: {address:#x})")
        self.base = address


def encode_tiled(tensor: Any, box: tuple[int, ...], swizzle: int, dtype: Any = None, *, oob_fill: int = 0,
                 l2_promotion: int = 2, name: str = "tensor", keep: bool = True) -> TensorMap:
    """A tiled tensor map over a CUDA torch tensor.  ``dtype`` (a torch dtype or tkc DType,
    default the tensor's) may reinterpret elements of the same size.  The map keeps the
    tensor alive unless ``keep`` is False (a launch plan, which re-bases the map on the
    tensors of each launch and must not hold on to those of the first)."""
    if not getattr(tensor, "is_cuda", False):
        raise TkcLaunchError(f"{name}: a TMA tensor map needs a CUDA tensor, got one on {tensor.device}")
    dtype = tensor.dtype if dtype is None else dtype
    if data_type(dtype)[1] != tensor.element_size():
        raise TkcLaunchError(f"{name}: cannot read {tensor.dtype} elements as {dtype} (different sizes)")
    p = tiled_params(tuple(tensor.shape), tuple(tensor.stride()), dtype, tensor.data_ptr(), box, swizzle,
                     oob_fill=oob_fill, l2_promotion=l2_promotion, name=name)
    driver.context()
    tm = TensorMap(p, tensor if keep else None)
    tm.encode(name=name)
    return tm
