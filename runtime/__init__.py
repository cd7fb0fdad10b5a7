"""The runtime: the only part of tkc that touches the CUDA driver and torch's CUDA state.

- ``tkc.runtime.driver``: libcuda through ctypes: context, ``Module`` (PTX/cubin load with
  JIT logs), ``Function`` (dynamic shared memory, ``cuLaunchKernelEx`` with clusters, on
  torch's current stream).
- ``tkc.runtime.tensormap``: TMA tensor maps (``cuTensorMapEncodeTiled``), validated in
  pure Python first.
- ``tkc.runtime.args``: GPU-specific launch checks (device, strides, alignment) on top of
  ``tkc.signature.bind``, which the interpreter shares.
- ``tkc.runtime.cache``: the on-disk cache of compiled kernels (``TKC_CACHE_DIR``).
- ``tkc.runtime.launch``: launching a ``tkc.compiler.Compiled`` on torch tensors: the checks
  above, the grid, the parameter list and tensor maps of docs/hopper.md §4, the loaded
  module per device.

Why ctypes over ``libcuda.so.1`` rather than NVIDIA's ``cuda-bindings``: it needs no extra
install (the driver is on every machine that can run a kernel, and a tkc install that never
touches a GPU stays lean); tkc needs about fifteen entry points, each a one-line prototype
here; and the driver's versioned exports (``cuMemAlloc_v2`` ...) are named explicitly
rather than hidden behind a binding whose major version must match the driver's.

Importing this package, or any module in it, never loads libcuda or initialises CUDA:
that happens on the first call that needs the GPU, so CPU-only machines can import and
test the pure-Python parts.  ``tkc.frontend`` (lark) is never imported from here.
"""
