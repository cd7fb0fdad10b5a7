"""Host (CPU) time of a launch: the Python work tkc does per call, beside torch's own launch.

    python benchmarks/launch_overhead.py               # on a CUDA GPU host: real launches
    python benchmarks/launch_overhead.py --stub        # a stub driver (what runs without a GPU)
    python benchmarks/launch_overhead.py --profile     # and a cProfile of each tkc path

Each row is the best and median microseconds per call over several rounds of many calls:

* ``softmax``: ``tkc.runtime.launch.launch(compiled, [x, y])``, the 64x256 bf16 softmax of
  ``overhead_rows()`` in benchmarks/run.py, called again and again with the same tensors;
* ``rmsnorm``: a ``@tkc.kernel`` (examples/rmsnorm.py) called the same way, with a scalar,
  then with a new output tensor at every call (``y = torch.empty(...); rmsnorm(x, w, y, eps)``),
  beside ``torch.nn.functional.rms_norm`` on a GPU;
* ``gemm``: examples/gemm.tk at 256x256x256, first with the same three tensors at every call,
  then with a new output tensor at every call (``c = torch.empty(...); launch(gemm, [a, b, c])``,
  as a PyTorch program calls a kernel): a launch with new tensors of a shape seen before must
  cost about what a repeated one does.  On a GPU, torch's own launch of the same product is the
  peer of each: ``torch.matmul(a, b, out=c)``; for the new output, the same Python allocation
  then ``torch.matmul(a, b, out=out)``, and ``torch.matmul(a, b)``, which allocates in C++;
* ``tkc.ops``: ``tkc.ops.matmul(a, b)``, ``tkc.ops.rms_norm(x, w)`` and ``tkc.ops.softmax(x)``,
  operators that return a new tensor at every call, beside ``torch.matmul(a, b)``,
  ``torch.nn.functional.rms_norm`` and ``torch.softmax``; ``rms_norm`` of an ``x`` that needs a
  gradient (training's forward: the backward is recorded), eagerly and through torch's
  dispatcher (``torch.ops.tkc.rms_norm``), and its backward (``torch.autograd.grad``: autograd
  runs the operator's backward kernel) beside ``F.rms_norm``'s.

Where Triton is installed (GPU runs), the Triton kernels of benchmarks/triton_kernels.py are
peers too: its softmax (same tensors, and a new output each call, as ``tkc.ops.softmax``) and
its GEMM (a new output each call).

On a GPU host each round is a few hundred calls, so the GPU keeps up or queues and the time
is the host's.  Without a GPU (or with ``--stub``) only what needs a GPU is replaced: libcuda
by a stub library built here with ``cc`` (every entry point returns CUDA_SUCCESS at once;
ctypes still converts every argument as it would), torch's CUDA queries (current device and
stream, capability, SM count) by functions that answer device 0, CUDA tensors by CPU
tensors that report ``cuda:0``, and ``torch.empty``/``torch.zeros`` on a CUDA device (the
operators' outputs) by the CPU allocation of such a tensor.  Everything else is tkc's real
code.  The stubs are cheaper than the real torch queries, CUDA allocations and
``cuLaunchKernelEx``, so that mode measures tkc's own share (the Python work of a call), and
has no torch peer.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "examples"))

import cProfile  # noqa: E402
import pstats  # noqa: E402

_STUB_C = r"""
#include <stddef.h>
#include <stdint.h>
static void *const CTX = (void *)0x1000;
static long launches;
long stub_launches(void) { return launches; }
int cuInit(unsigned f) { return 0; }
int cuGetErrorName(int r, const char **s) { *s = "CUDA_ERROR_STUB"; return 0; }
int cuGetErrorString(int r, const char **s) { *s = "stub driver"; return 0; }
int cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
int cuCtxGetCurrent(void **c) { *c = CTX; return 0; }
int cuCtxSetCurrent(void *c) { return 0; }
int cuCtxGetDevice(int *d) { *d = 0; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { *c = CTX; return 0; }
int cuModuleLoadDataEx(void **m, const void *image, unsigned n, int *opts, void **vals) {
    *m = (void *)0x2000; return 0; }
int cuModuleGetFunction(void **f, void *m, const char *name) { *f = (void *)0x3000; return 0; }
int cuModuleUnload(void *m) { return 0; }
int cuFuncSetAttribute(void *f, int attr, int v) { return 0; }
int cuFuncGetAttribute(int *v, int attr, void *f) { *v = 0; return 0; }
int cuLaunchKernelEx(const void *cfg, void *f, void **params, void **extra) { launches++; return 0; }
int cuOccupancyMaxActiveClusters(int *n, void *f, const void *cfg) { *n = 132; return 0; }
int cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, void *f, int threads, size_t smem) { *n = 1; return 0; }
int cuTensorMapReplaceAddress(void *map, void *addr) { return 0; }
int cuTensorMapEncodeTiled(void *map, int dt, unsigned rank, void *addr, const uint64_t *dims,
                           const uint64_t *strides, const unsigned *box, const unsigned *estrides,
                           int interleave, int swizzle, int l2, int oob) { return 0; }
"""


def _stub_driver(tmp: Path) -> ctypes.CDLL:
    """Build the stub libcuda and install it where ``tkc.runtime.driver.lib()`` keeps its library."""
    from tkc.runtime import driver

    src, so = tmp / "cuda_stub.c", tmp / "libcuda_stub.so"
    src.write_text(_STUB_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    cuda = ctypes.CDLL(str(so))
    for name, argtypes in driver._PROTOTYPES.items():
        fn = getattr(cuda, name)
        fn.argtypes, fn.restype = argtypes, driver.CUresult
    cuda.stub_launches.restype = ctypes.c_long
    driver._lib = cuda
    return cuda


class _Stream:
    cuda_stream = 0


def _stub_torch_cuda() -> None:
    """torch's CUDA state as on a host whose CUDA is initialised, on device 0."""
    cuda = torch.cuda
    cuda._initialized = True  # the real is_initialized() and _lazy_init() still run
    torch._C._cuda_getDevice = lambda: 0  # under the real torch.cuda.current_device()
    torch._C._cuda_getCurrentRawStream = lambda device: 0
    cuda.is_available = lambda: True
    cuda.init = lambda: None
    cuda.current_stream = lambda device=None: _Stream()
    cuda.get_device_capability = lambda device=None: (9, 0)
    cuda.get_device_name = lambda device=None: "stub"
    cuda.get_device_properties = lambda device=None: types.SimpleNamespace(multi_processor_count=132)


_CUDA0 = torch.device("cuda", 0)


class FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on cuda:0; torch's own getters answer everything else."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self) -> torch.device:
        return _CUDA0

    @property
    def is_cuda(self) -> bool:
        return True

    def get_device(self) -> int:
        return 0


_cpu_empty, _cpu_zeros = torch.empty, torch.zeros


def cuda_like(*shape: int, dtype: torch.dtype = torch.bfloat16) -> FakeCuda:
    # 64-byte aligned storage, as the CUDA caching allocator gives.
    return _cpu_empty(*shape, dtype=dtype).as_subclass(FakeCuda)


def _stub_cuda_allocations() -> None:
    """``torch.empty``/``torch.zeros`` on a CUDA device make a CPU tensor that says it is on
    cuda:0 (what the operators allocate their outputs with); other devices as torch does."""
    def on(alloc):
        def stub(*shape, device=None, **kwargs):
            if device is _CUDA0 or (device is not None and torch.device(device).type == "cuda"):
                return alloc(*shape, **kwargs).as_subclass(FakeCuda)
            return alloc(*shape, device=device, **kwargs)
        return stub

    torch.empty, torch.zeros = on(_cpu_empty), on(_cpu_zeros)


def _triton_kernels():
    """benchmarks/triton_kernels.py, or None where Triton is not installed."""
    try:
        import importlib.util

        import triton  # noqa: F401
    except ImportError:
        return None
    spec = importlib.util.spec_from_file_location("triton_kernels", HERE / "triton_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def per_call_us(fn, calls: int, rounds: int, sync=None) -> tuple[float, float]:
    """(best, median) microseconds per call over ``rounds`` rounds of ``calls`` calls; ``sync``
    (the GPU's) runs before each round, outside the timing."""
    fn()
    times = []
    for _ in range(rounds):
        if sync is not None:
            sync()
        t = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter_ns() - t) / calls / 1e3)
    if sync is not None:
        sync()
    return min(times), statistics.median(times)


def new_output_each_call(launch_on, alloc):
    """A call that launches on a new output, as ``c = alloc(); launch_on(c)`` in a loop does:
    the last call's output lives until the new one exists, so addresses change at every call."""
    last = [alloc()]

    def call() -> None:
        last[0] = alloc()
        launch_on(last[0])

    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=None, help="calls per round (default 10,000 stubbed, 200 on a GPU)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 7 stubbed, 30 on a GPU)")
    ap.add_argument("--stub", action="store_true", help="the stub driver even where torch sees a GPU")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of each tkc path")
    args = ap.parse_args()
    gpu = torch.cuda.is_available() and not args.stub
    calls = args.calls or (200 if gpu else 10_000)
    rounds = args.rounds or (30 if gpu else 7)

    from rmsnorm import rmsnorm

    from tkc.compiler import compile_kernel
    from tkc.runtime.launch import launch

    with tempfile.TemporaryDirectory() as tmp:
        if gpu:
            cuda, sync = None, torch.cuda.synchronize

            def tensor(*shape: int) -> torch.Tensor:
                return torch.empty(*shape, dtype=torch.bfloat16, device="cuda")

            print(f"real launches on {torch.cuda.get_device_name()}, torch {torch.__version__}")
        else:
            cuda, sync, tensor = _stub_driver(Path(tmp)), None, cuda_like
            _stub_torch_cuda()
            _stub_cuda_allocations()
            print("stub driver (no GPU work): tkc's own host time")
        softmax = compile_kernel(ROOT / "examples" / "softmax.tk", {})
        gemm = compile_kernel(ROOT / "examples" / "gemm.tk", {})
        x, y, w = tensor(64, 256), tensor(64, 256), tensor(256)
        if gpu:
            x.normal_()
            w.fill_(1)
        n = 256
        a, b, c = tensor(n, n), tensor(n, n), tensor(n, n)
        tkc_cases = {
            "softmax 64x256, same tensors": lambda: launch(softmax, [x, y]),
            "rmsnorm (@tkc.kernel), same tensors": lambda: rmsnorm(x, w, y, 1e-6),
            "rmsnorm (@tkc.kernel), new output tensor each call": new_output_each_call(
                lambda out: rmsnorm(x, w, out, 1e-6), lambda: tensor(64, 256)),
            f"gemm {n}^3, same tensors": lambda: launch(gemm, [a, b, c]),
            f"gemm {n}^3, new output tensor each call": new_output_each_call(lambda out: launch(gemm, [a, b, out]),
                                                                          lambda: tensor(n, n)),
        }
        import tkc.ops

        tkc_cases["tkc.ops.matmul(a, b) (new output)"] = lambda: tkc.ops.matmul(a, b)
        tkc_cases["tkc.ops.rms_norm(x, w) (new output)"] = lambda: tkc.ops.rms_norm(x, w, 1e-6)
        tkc_cases["tkc.ops.softmax(x) (new output)"] = lambda: tkc.ops.softmax(x)
        # the backward recorded: training's forward (a copy of x on a GPU; the stub's x copies as a plain CPU tensor)
        xg = (x.detach().clone() if gpu else tensor(64, 256)).requires_grad_()
        tkc_cases["tkc.ops.rms_norm(x, w), x needs grad"] = lambda: tkc.ops.rms_norm(xg, w, 1e-6)
        # The same operator through torch's dispatcher (what tkc.ops ran with a gradient before
        # its eager autograd.Function): what that path saves.
        tkc_cases["torch.ops.tkc.rms_norm (dispatcher), x needs grad"] = \
            lambda: torch.ops.tkc.rms_norm(xg, w, 1e-6)
        # training's backward: autograd runs the operator's backward kernel (rows_bwd.tk's rmsnorm_bwd)
        y_tkc, dy = tkc.ops.rms_norm(xg, w, 1e-6), (x.detach().clone() if gpu else tensor(64, 256))
        tkc_cases["tkc.ops.rms_norm backward (autograd.grad)"] = \
            lambda: torch.autograd.grad(y_tkc, xg, dy, retain_graph=True)
        y_torch = torch.nn.functional.rms_norm(xg, (256,), w, 1e-6) if gpu else None
        triton = _triton_kernels() if gpu else None
        torch_cases = {  # per tkc row, its peers: torch's (and below Triton's) launches of the same work
            "rmsnorm (@tkc.kernel), new output tensor each call": [
                ("torch.nn.functional.rms_norm", lambda: torch.nn.functional.rms_norm(x, (256,), w, 1e-6))],
            f"gemm {n}^3, same tensors": [("torch.matmul(a, b, out=c)", lambda: torch.matmul(a, b, out=c))],
            f"gemm {n}^3, new output tensor each call": [
                ("out = torch.empty(...); torch.matmul(a, b, out=out)",
                 new_output_each_call(lambda out: torch.matmul(a, b, out=out), lambda: tensor(n, n))),
                ("torch.matmul(a, b) (allocates in C++)", lambda: torch.matmul(a, b))],
            "tkc.ops.matmul(a, b) (new output)": [("torch.matmul(a, b)", lambda: torch.matmul(a, b))],
            "tkc.ops.rms_norm(x, w) (new output)": [
                ("torch.nn.functional.rms_norm", lambda: torch.nn.functional.rms_norm(x, (256,), w, 1e-6))],
            "tkc.ops.softmax(x) (new output)": [("torch.softmax(x, -1)", lambda: torch.softmax(x, -1))],
            "tkc.ops.rms_norm(x, w), x needs grad": [
                ("torch.nn.functional.rms_norm", lambda: torch.nn.functional.rms_norm(xg, (256,), w, 1e-6))],
            "tkc.ops.rms_norm backward (autograd.grad)": [
                ("torch.nn.functional.rms_norm's backward",
                 lambda: torch.autograd.grad(y_torch, xg, dy, retain_graph=True))],
        } if gpu else {}
        if triton is not None:
            torch_cases["softmax 64x256, same tensors"] = [("Triton softmax(x, y)", lambda: triton.softmax(x, y))]
            torch_cases[f"gemm {n}^3, new output tensor each call"].append(
                ("out = torch.empty(...); Triton gemm(a, b, out)",
                 new_output_each_call(lambda out: triton.gemm(a, b, out), lambda: tensor(n, n))))

            def triton_softmax() -> torch.Tensor:
                out = torch.empty_like(x)
                triton.softmax(x, out)
                return out

            torch_cases["tkc.ops.softmax(x) (new output)"].append(
                ("out = torch.empty_like(x); Triton softmax(x, out)", triton_softmax))
        before = cuda.stub_launches() if cuda is not None else 0
        print(f"us per call: best of {rounds} rounds of {calls} calls (median)")
        for name, fn in tkc_cases.items():
            best, median = per_call_us(fn, calls, rounds, sync)
            print(f"  {name:52s} tkc  {best:7.2f} ({median:.2f})")
            for peer, torch_fn in torch_cases.get(name, []):
                best, median = per_call_us(torch_fn, calls, rounds, sync)
                print(f"  {'':52s} peer {best:7.2f} ({median:.2f})  {peer}")
        if cuda is not None:
            launched = cuda.stub_launches() - before
            expected = len(tkc_cases) * (rounds * calls + 1)
            assert launched == expected, f"{launched} launches reached the driver, expected {expected}"
        for name, fn in tkc_cases.items() if args.profile else ():
            print(f"\n--- {name}, {calls} calls")
            prof = cProfile.Profile()
            prof.runcall(lambda: [fn() for _ in range(calls)])
            pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
