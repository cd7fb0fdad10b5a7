"""The CUDA driver API through ctypes: context, module loading, launch.

Owns: finding ``libcuda.so.1`` (lazily, on first use), the prototypes of the few
driver entry points tkc calls, turning a ``CUresult`` into a
:class:`~tkc.errors.TkcLaunchError` that names the call and quotes
``cuGetErrorName``/``cuGetErrorString``, picking the context (the one torch made
current, else the device's primary context, which is the one torch uses),
``Module`` (PTX or cubin via ``cuModuleLoadDataEx`` with the JIT logs surfaced)
and ``Function`` (dynamic shared memory attribute, ``cuLaunchKernelEx`` with an
optional cluster shape, on torch's current stream by default).

Must not: check kernel arguments against a signature (``tkc.runtime.args``),
encode tensor maps (``tkc.runtime.tensormap``), allocate or copy memory (torch
owns every buffer), or be imported by anything that must run without a GPU at
import time: nothing here touches the driver until a function is called.

Layouts (PTX-FACTS §9, cuda.h 13.0): ``CUlaunchConfig`` is 56 bytes (seven u32
grid/block/shared fields, ``hStream`` at 32, ``attrs`` at 40, ``numAttrs`` at 48),
``CUlaunchAttribute`` 72 bytes (u32 id, 4 bytes of padding, a 64-byte value
union at 8).  Both sizes are asserted at import.  Exports with versioned names
(``cuMemAlloc_v2`` ...) are named explicitly in ``_PROTOTYPES``; the ones used
here have a single, unversioned ABI in CUDA 12 and 13.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

from tkc.errors import TkcLaunchError, TkcUsageError

__all__ = [
    "CUlaunchAttribute", "CUlaunchConfig", "Function", "Module", "check", "context", "lib",
    "current_stream", "raw_stream", "stream_getter", "unprototyped",
]

CUresult = ctypes.c_int
_p = ctypes.c_void_p
_u32 = ctypes.c_uint
_i32 = ctypes.c_int

# Exported symbol -> (argtypes).  Every one returns CUresult.
_PROTOTYPES: dict[str, list[Any]] = {
    "cuInit": [_u32],
    "cuGetErrorName": [CUresult, ctypes.POINTER(ctypes.c_char_p)],
    "cuGetErrorString": [CUresult, ctypes.POINTER(ctypes.c_char_p)],
    "cuDeviceGet": [ctypes.POINTER(_i32), _i32],
    "cuCtxGetCurrent": [ctypes.POINTER(_p)],
    "cuCtxSetCurrent": [_p],
    "cuCtxGetDevice": [ctypes.POINTER(_i32)],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(_p), _i32],
    "cuModuleLoadDataEx": [ctypes.POINTER(_p), ctypes.c_char_p, _u32, ctypes.POINTER(_i32),
                           ctypes.POINTER(_p)],
    "cuModuleGetFunction": [ctypes.POINTER(_p), _p, ctypes.c_char_p],
    "cuModuleUnload": [_p],
    "cuFuncSetAttribute": [_p, _i32, _i32],
    "cuFuncGetAttribute": [ctypes.POINTER(_i32), _i32, _p],
    "cuLaunchKernelEx": [_p, _p, ctypes.POINTER(_p), ctypes.POINTER(_p)],
    "cuOccupancyMaxActiveClusters": [ctypes.POINTER(_i32), _p, _p],
    "cuOccupancyMaxActiveBlocksPerMultiprocessor": [ctypes.POINTER(_i32), _p, _i32, ctypes.c_size_t],
    "cuTensorMapEncodeTiled": [_p, _i32, _u32, _p, ctypes.POINTER(ctypes.c_uint64),
                               ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(_u32), ctypes.POINTER(_u32),
                               _i32, _i32, _i32, _i32],
}

# CUjit_option (PTX-FACTS §9)
CU_JIT_INFO_LOG_BUFFER = 3
CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
CU_JIT_LOG_VERBOSE = 12
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
_LOG_BYTES = 1 << 16


class _Dim3(ctypes.Structure):
    _fields_ = [("x", _u32), ("y", _u32), ("z", _u32)]


class _LaunchAttrValue(ctypes.Union):
    _fields_ = [("clusterDim", _Dim3), ("pad", ctypes.c_ubyte * 64), ("_align", ctypes.c_uint64)]


class CUlaunchAttribute(ctypes.Structure):
    _fields_ = [("id", _u32), ("pad", ctypes.c_ubyte * 4), ("value", _LaunchAttrValue)]


class CUlaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", _u32), ("gridDimY", _u32), ("gridDimZ", _u32),
        ("blockDimX", _u32), ("blockDimY", _u32), ("blockDimZ", _u32),
        ("sharedMemBytes", _u32),
        ("hStream", _p),
        ("attrs", ctypes.POINTER(CUlaunchAttribute)),
        ("numAttrs", _u32),
    ]


assert ctypes.sizeof(CUlaunchConfig) == 56, ctypes.sizeof(CUlaunchConfig)
assert CUlaunchConfig.hStream.offset == 32 and CUlaunchConfig.attrs.offset == 40
assert CUlaunchConfig.numAttrs.offset == 48
assert ctypes.sizeof(CUlaunchAttribute) == 72, ctypes.sizeof(CUlaunchAttribute)
assert CUlaunchAttribute.value.offset == 8

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_initialized = False


def lib() -> ctypes.CDLL:
    """libcuda.so.1 with the prototypes above, loaded on first use."""
    global _lib
    if _lib is not None:
        return _lib  # every call after the first: no lock (the name is bound once, fully set up)
    with _lock:
        if _lib is None:
            try:
                cuda = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise TkcLaunchError(f"no CUDA driver found (libcuda.so.1): {e}") from None
            for name, argtypes in _PROTOTYPES.items():
                try:
                    fn = getattr(cuda, name)
                except AttributeError:
                    raise TkcLaunchError(f"the CUDA driver (libcuda.so.1) has no {name}: it is older than "
                                         "CUDA 12.0, which tkc needs for cuLaunchKernelEx and TMA") from None
                fn.argtypes = argtypes
                fn.restype = CUresult
            _lib = cuda
        return _lib


def unprototyped(name: str) -> Any:
    """The driver entry point ``name`` without argument conversion, for calls repeated on every
    launch: every argument must be a ctypes object (a Python int would go as a 32-bit int),
    made once by the caller, which saves ctypes' per-argument conversion.  A fresh function
    object of the same library, so the prototyped one every other call uses is untouched."""
    cuda = lib()
    fn = cuda._FuncPtr((name, cuda))
    fn.restype = CUresult
    return fn


def _error_text(result: int) -> str:
    cuda = lib()
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    n = cuda.cuGetErrorName(result, ctypes.byref(name))
    s = cuda.cuGetErrorString(result, ctypes.byref(text))
    shown_name = name.value.decode() if n == 0 and name.value else f"CUresult {result}"
    return f"{shown_name} ({text.value.decode()})" if s == 0 and text.value else shown_name


def check(result: int, what: str, detail: str = "") -> None:
    """Raise TkcLaunchError naming ``what`` when ``result`` is not CUDA_SUCCESS."""
    if result != 0:
        msg = f"{what} failed: {_error_text(result)}"
        raise TkcLaunchError(f"{msg}\n{detail}" if detail else msg)


def context() -> ctypes.c_void_p:
    """The CUDA context kernels run in: the one current on this thread once torch has
    initialised CUDA for its current device, else that device's primary context
    (which is what torch uses), made current."""
    global _initialized
    try:
        import torch
    except ImportError:
        raise TkcUsageError("the tkc runtime needs torch (pip install torch)") from None
    if not torch.cuda.is_available():
        raise TkcLaunchError("no CUDA device is available to torch (torch.cuda.is_available() is False)")
    torch.cuda.init()
    dev = torch.cuda.current_device()
    cuda = lib()
    if not _initialized:
        check(cuda.cuInit(0), "cuInit")
        _initialized = True
    ctx = ctypes.c_void_p()
    check(cuda.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if ctx.value:
        cur = ctypes.c_int()
        check(cuda.cuCtxGetDevice(ctypes.byref(cur)), "cuCtxGetDevice")
        if cur.value == dev:
            return ctx
    handle = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(handle), dev), "cuDeviceGet")
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), handle), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def _make_current(ctx: ctypes.c_void_p) -> None:
    cur = ctypes.c_void_p()
    cuda = lib()
    check(cuda.cuCtxGetCurrent(cur), "cuCtxGetCurrent")  # ctypes passes ``cur`` by reference
    if cur.value != ctx.value:
        check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def stream_getter(torch: Any) -> Any:
    """A function from a device index to the handle of torch's current stream there, for a
    caller that asks at every launch: torch's raw getter where this torch build has it (what
    torch's own compiled kernels launch on), since ``torch.cuda.current_stream()`` builds a
    Stream object (microseconds)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw if raw is not None else lambda device: int(torch.cuda.current_stream(device).cuda_stream)


def raw_stream(torch: Any, device: int) -> int:
    """:func:`current_stream` for a caller that has torch and the device at hand (a launch)."""
    return stream_getter(torch)(device)


def current_stream(device: int | None = None) -> int:
    """The handle of torch's current CUDA stream on ``device`` (default: torch's current
    device); 0 is the legacy default stream."""
    import torch

    return raw_stream(torch, torch.cuda.current_device() if device is None else device)


def _log(buf: ctypes.Array, size: int) -> str:
    return buf.raw[: max(0, min(size, len(buf)))].split(b"\0", 1)[0].decode(errors="replace").strip()


class Module:
    """A loaded PTX or cubin image.  ``info_log`` holds what the JIT said on success."""

    def __init__(self, handle: ctypes.c_void_p, ctx: ctypes.c_void_p, info_log: str):
        self.handle = handle
        self.ctx = ctx
        self.info_log = info_log
        self._functions: dict[str, Function] = {}

    @classmethod
    def load(cls, image: bytes | str, kind: str = "ptx") -> Module:
        """Load ``image`` (PTX text or a cubin) into the current context."""
        if kind not in ("ptx", "cubin"):
            raise TkcUsageError(f"Module.load: kind is 'ptx' or 'cubin', not {kind!r}")
        data = image.encode() if isinstance(image, str) else bytes(image)
        if kind == "ptx" and not data.endswith(b"\0"):
            data += b"\0"  # the driver reads PTX as a C string
        ctx = context()
        cuda = lib()
        info, err = ctypes.create_string_buffer(_LOG_BYTES), ctypes.create_string_buffer(_LOG_BYTES)
        opts = (ctypes.c_int * 5)(CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                                  CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_LOG_VERBOSE)
        vals = (ctypes.c_void_p * 5)(ctypes.addressof(info), _LOG_BYTES, ctypes.addressof(err), _LOG_BYTES, 1)
        handle = ctypes.c_void_p()
        r = cuda.cuModuleLoadDataEx(ctypes.byref(handle), data, 5, opts, vals)
        info_log, err_log = _log(info, vals[1] or 0), _log(err, vals[3] or 0)
        if r != 0:
            detail = f"JIT error log:\n{err_log}" if err_log else "(the driver's JIT error log is empty)"
            if info_log:
                detail += f"\nJIT info log:\n{info_log}"
            check(r, f"cuModuleLoadDataEx ({kind}, {len(data)} bytes)", detail)
        return cls(handle, ctx, info_log)

    def function(self, name: str) -> Function:
        """The kernel ``name`` (its ``.entry`` name in the PTX)."""
        f = self._functions.get(name)
        if f is None:
            h = ctypes.c_void_p()
            _make_current(self.ctx)
            check(lib().cuModuleGetFunction(ctypes.byref(h), self.handle, name.encode()),
                  f"cuModuleGetFunction({name!r})")
            f = self._functions[name] = Function(h, name, self)
        return f

    def unload(self) -> None:
        """Free the module; its functions must not be launched afterwards."""
        if self.handle.value:
            _make_current(self.ctx)
            check(lib().cuModuleUnload(self.handle), "cuModuleUnload")
            self.handle = ctypes.c_void_p()
            self._functions.clear()


def _dim3(v: int | Sequence[int], what: str) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, int) else tuple(v)
    if not 1 <= len(t) <= 3 or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in t):
        raise TkcLaunchError(f"{what} must be 1 to 3 positive integers, got {v!r}")
    return (t + (1, 1))[:3]  # type: ignore[return-value]


def _param_pointer(p: Any, i: int) -> int:
    """The address the driver reads parameter ``i`` from."""
    if isinstance(p, ctypes._SimpleCData):
        return ctypes.addressof(p)
    address = getattr(p, "address", None)  # a tkc.runtime.tensormap.TensorMap: its 128-B host map
    if isinstance(address, int):
        return address
    raise TkcUsageError(f"kernel parameter {i}: expected a ctypes value (c_void_p for a pointer, c_int32, "
                        f"c_float ...) or a TensorMap, got {type(p).__name__}: the parameter's width is "
                        "not known here")


class PreparedLaunch(NamedTuple):
    """A launch's dims and packed parameter pointers; ``keep`` holds the parameter objects the
    pointers point into; ``config`` is the launch's ``CUlaunchConfig`` with stream 0, as bytes."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    ptrs: ctypes.Array
    keep: list
    config: bytes


class Function:
    """A kernel in a loaded module."""

    def __init__(self, handle: ctypes.c_void_p, name: str, module: Module):
        self.handle = handle
        self.name = name
        self.module = module

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Allow ``nbytes`` of dynamic shared memory (needed above 48 KB)."""
        _make_current(self.module.ctx)
        check(lib().cuFuncSetAttribute(self.handle, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes)),
              f"cuFuncSetAttribute({self.name}, MAX_DYNAMIC_SHARED_SIZE_BYTES, {nbytes})")

    def attribute(self, attr: int) -> int:
        """``cuFuncGetAttribute`` (e.g. 4 = NUM_REGS, 1 = SHARED_SIZE_BYTES)."""
        v = ctypes.c_int()
        check(lib().cuFuncGetAttribute(ctypes.byref(v), attr, self.handle), f"cuFuncGetAttribute({attr})")
        return v.value

    def max_active_blocks(self, threads: int, shared_bytes: int) -> int:
        """How many CTAs of ``threads`` threads with ``shared_bytes`` of dynamic shared memory
        one SM holds at once (``cuOccupancyMaxActiveBlocksPerMultiprocessor``)."""
        n = ctypes.c_int()
        _make_current(self.module.ctx)
        check(lib().cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), self.handle, int(threads),
                                                                 int(shared_bytes)),
              f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name}, {threads} threads)")
        return n.value

    def max_active_clusters(self, cluster: int, block: int | Sequence[int], shared_bytes: int) -> int:
        """How many clusters of ``cluster`` CTAs (along x) of this kernel the device holds at
        once (``cuOccupancyMaxActiveClusters``): fewer than SMs / ``cluster`` where the SMs of
        a GPC do not pair up, and a persistent kernel sized by the SM count would leave some
        clusters for a second wave."""
        b = _dim3(block, "block")
        attrs = (CUlaunchAttribute * 1)()
        attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attrs[0].value.clusterDim = _Dim3(cluster, 1, 1)
        cfg = CUlaunchConfig(cluster, 1, 1, *b, int(shared_bytes), None, attrs, 1)
        n = ctypes.c_int()
        _make_current(self.module.ctx)
        check(lib().cuOccupancyMaxActiveClusters(ctypes.byref(n), self.handle, ctypes.addressof(cfg)),
              f"cuOccupancyMaxActiveClusters({self.name}, cluster={cluster})")
        return n.value

    def prepare(self, grid: int | Sequence[int], block: int | Sequence[int], shared_bytes: int,
                params: Sequence[Any]) -> PreparedLaunch:
        """Everything of a launch but the stream, checked and packed once (see
        :meth:`launcher`): for launches repeated with the same parameters."""
        g, b = _dim3(grid, "grid"), _dim3(block, "block")
        ptrs = (ctypes.c_void_p * max(1, len(params)))(*[_param_pointer(p, i) for i, p in enumerate(params)])
        config = bytes(CUlaunchConfig(*g, *b, int(shared_bytes), None, None, 0))
        return PreparedLaunch(g, b, int(shared_bytes), ptrs, list(params), config)

    def launcher(self, prep: PreparedLaunch) -> Any:
        """A function ``go(stream)`` that launches ``prep`` on ``stream`` (an int handle):
        what a repeated launch calls, with everything but the driver call done here once.

        Per call it takes the launch config for that stream (built on the first launch on it,
        then only read, so threads may share it) and calls ``cuLaunchKernelEx`` through an
        unprototyped entry point on ctypes objects made here: at a few microseconds a call,
        the driver's own time is most of a launch, and ctypes' argument conversion was a fifth
        of the rest.  It asks the driver nothing else: the module's context is made current at
        the first launch on each stream, and a launch the driver refuses is retried once after
        making it current if another context (or none, on a new thread) was current, since
        the driver refuses a function of one context launched in another."""
        launch, get_current = unprototyped("cuLaunchKernelEx"), unprototyped("cuCtxGetCurrent")
        handle, ptrs, ctx = _p(self.handle.value), _p(ctypes.addressof(prep.ptrs)), self.module.ctx
        configs: dict[int, tuple[Any, Any]] = {}  # stream -> (the config, its address)

        def current() -> bool:
            cur = _p()
            return not get_current(ctypes.byref(cur)) and cur.value == ctx.value

        def go(stream: int) -> None:
            entry = configs.get(stream)
            if entry is None:
                cfg = CUlaunchConfig.from_buffer_copy(prep.config)
                cfg.hStream = stream
                if len(configs) >= 16:  # a program cycling through streams: keep the few latest
                    configs.clear()
                configs[stream] = entry = (cfg, _p(ctypes.addressof(cfg)))
                if not current():
                    _make_current(ctx)
            result = launch(entry[1], handle, ptrs, None)
            if result and not current():
                _make_current(ctx)
                result = launch(entry[1], handle, ptrs, None)
            if result:  # the message is built only for a failure: formatting it costs a microsecond
                check(result, f"cuLaunchKernelEx({self.name}, grid={prep.grid}, block={prep.block}, "
                              f"shared={prep.shared})")

        return go

    def launch(self, grid: int | Sequence[int], block: int | Sequence[int], shared_bytes: int = 0,
               stream: int | None = None, params: Sequence[Any] = (),
               cluster: int | Sequence[int] | None = None) -> None:
        """``cuLaunchKernelEx`` on ``stream`` (default: torch's current stream).

        ``params`` are ctypes values (``c_void_p(t.data_ptr())`` for a tensor, ``c_int32``,
        ``c_float`` ...) or :class:`~tkc.runtime.tensormap.TensorMap`, in the kernel's
        parameter order.  ``cluster`` adds a CLUSTER_DIMENSION attribute; each grid extent
        must be a multiple of the cluster's.
        """
        g, b = _dim3(grid, "grid"), _dim3(block, "block")
        attrs = (CUlaunchAttribute * 1)()
        n_attrs = 0
        if cluster is not None:
            c = _dim3(cluster, "cluster")
            if any(gi % ci for gi, ci in zip(g, c)):
                raise TkcLaunchError(f"grid {g} is not a multiple of the cluster shape {c}")
            attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attrs[0].value.clusterDim = _Dim3(*c)
            n_attrs = 1
        ptrs = (ctypes.c_void_p * max(1, len(params)))(*[_param_pointer(p, i) for i, p in enumerate(params)])
        cfg = CUlaunchConfig(*g, *b, int(shared_bytes), current_stream() if stream is None else int(stream),
                             attrs, n_attrs)
        _make_current(self.module.ctx)
        check(lib().cuLaunchKernelEx(ctypes.addressof(cfg), self.handle, ptrs, None),
              f"cuLaunchKernelEx({self.name}, grid={g}, block={b}, shared={shared_bytes}"
              + (f", cluster={tuple(cluster) if not isinstance(cluster, int) else cluster}" if cluster else "")
              + ")")
