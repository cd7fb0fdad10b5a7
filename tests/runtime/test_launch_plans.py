"""The plan cache of repeated launches, without a GPU: a launch with the same arguments skips
the checks and goes straight to the driver; any change the checks depend on (data pointer,
shape, strides, dtype, device, scalar value) is checked again, and refused with the same error
as a first launch.  torch's CUDA queries and the driver are stubbed; tensors are CPU tensors
that say they are on a CUDA device."""

from __future__ import annotations

import ctypes
import functools
import importlib
import types
from pathlib import Path

import pytest

from tkc.compiler import Compiled
from tkc.errors import TkcLaunchError
from tkc.runtime import driver
from tkc.runtime import launch as launch_mod

from test_launch import _rmsnorm

torch = pytest.importorskip("torch")

kernel_mod = importlib.import_module("tkc.kernel")  # tkc.kernel is also the decorator's name
ROOT = Path(__file__).resolve().parents[2]
HOPPER_GEMM = ROOT / "tests" / "data" / "hopper" / "gemm.tkir"
CTX = 0x1000


class FakeCuda(torch.Tensor):
    """A CPU tensor that reports ``cuda:<index>``; torch answers everything else."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    index = 0

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.index)

    @property
    def is_cuda(self) -> bool:
        return True


def cuda_like(t: torch.Tensor, index: int = 0) -> FakeCuda:
    x = t.as_subclass(FakeCuda)
    x.index = index
    return x


class FakeLib:
    """The driver entry points a launch uses, under their driver names; each launch is recorded
    with its grid, its stream and the value of its first parameter (the first tensor's address)."""

    def __init__(self) -> None:
        self.launches: list[dict] = []
        self.result = 0  # what cuLaunchKernelEx returns
        self.current = CTX  # the thread's current context

    def cuGetErrorName(self, result: int, name: object) -> int:
        return 1  # no name: the error shows the number

    cuGetErrorString = cuGetErrorName

    def _FuncPtr(self, spec: tuple[str, object]) -> object:
        # ctypes.CDLL's way to a second, unprototyped entry point (a partial takes a restype)
        return functools.partial(getattr(self, spec[0]))

    def cuCtxGetCurrent(self, cur: object) -> int:
        getattr(cur, "_obj", cur).value = self.current  # a byref(c_void_p) from the launcher, else the c_void_p
        return 0

    def cuCtxSetCurrent(self, ctx: ctypes.c_void_p) -> int:
        self.current = ctx.value
        return 0

    def cuTensorMapEncodeTiled(self, *args: object) -> int:
        return 0

    def cuLaunchKernelEx(self, cfg: ctypes.c_void_p, handle: object, ptrs: ctypes.c_void_p, extra: None) -> int:
        c = driver.CUlaunchConfig.from_address(cfg.value)
        first = ctypes.c_void_p.from_address(ptrs.value).value  # the first parameter's address
        self.launches.append({"grid": (c.gridDimX, c.gridDimY, c.gridDimZ), "stream": c.hStream or 0,
                              "first": ctypes.c_uint64.from_address(first).value, "ctx": self.current})
        return self.result


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """Device 0 (or ``gpu.device``) of a stubbed CUDA host; ``gpu.lib.launches`` records the
    launches and ``gpu.checks`` counts the full argument checks."""
    state = types.SimpleNamespace(device=0, lib=FakeLib(), checks=0)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state.device)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: state.device, raising=False)  # under it
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0x5000 + device, raising=False)
    monkeypatch.setattr(driver, "_lib", state.lib)
    monkeypatch.setattr(driver, "context", lambda: ctypes.c_void_p(CTX))

    from tkc.runtime import args as arg_checks

    check_launch = arg_checks.check_launch

    def counted(*args: object, **kwargs: object) -> dict:
        state.checks += 1
        return check_launch(*args, **kwargs)

    monkeypatch.setattr(arg_checks, "check_launch", counted)
    return state


def gemm() -> Compiled:
    """The hopper gemm with its function already loaded on devices 0 and 1 (no module load)."""
    c = Compiled.from_asm({"hopper": HOPPER_GEMM.read_text(), "ptx": "unused"})
    module = types.SimpleNamespace(ctx=ctypes.c_void_p(CTX))
    for index in (0, 1):
        c.loaded[index] = driver.Function(ctypes.c_void_p(0x3000), "gemm", module)
    return c


def gemm_args(m: int = 128, n: int = 128, k: int = 64) -> list[FakeCuda]:
    return [cuda_like(torch.zeros(m, k, dtype=torch.bfloat16)), cuda_like(torch.zeros(k, n, dtype=torch.bfloat16)),
            cuda_like(torch.zeros(m, n, dtype=torch.bfloat16))]


def test_a_repeated_launch_skips_the_checks(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    assert launch_mod.launch(c, args) == (1, 1)
    assert launch_mod.launch(c, args) == (1, 1)
    assert gpu.checks == 1 and len(c.launch_plans) == 1
    assert [x["first"] for x in gpu.lib.launches] == [args[0].data_ptr()] * 2
    assert [x["stream"] for x in gpu.lib.launches] == [0x5000] * 2  # torch's current stream, both times


def test_a_given_stream_is_used_on_a_repeat(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    launch_mod.launch(c, args, stream=0x6000)
    assert [x["stream"] for x in gpu.lib.launches] == [0x5000, 0x6000]


def test_streams_taking_turns_keep_their_own_configs(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    for stream in (0x6000, 0x7000, 0x6000, None, 0x7000):
        launch_mod.launch(c, args, stream=stream)
    assert [x["stream"] for x in gpu.lib.launches] == [0x6000, 0x7000, 0x6000, 0x5000, 0x7000]


def test_a_repeated_launch_makes_the_modules_context_current(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    gpu.lib.current = 0x9000  # something else made another context current on this thread
    launch_mod.launch(c, args)
    assert [x["ctx"] for x in gpu.lib.launches] == [CTX, CTX]


def test_other_buffers_are_checked_and_launched_with_their_address(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    other = [args[0].clone().as_subclass(FakeCuda), *args[1:]]
    launch_mod.launch(c, other)
    assert gpu.checks == 2
    assert [x["first"] for x in gpu.lib.launches] == [args[0].data_ptr(), other[0].data_ptr()]


def test_a_failed_repeated_launch_names_the_launch(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    gpu.lib.result = 700
    with pytest.raises(TkcLaunchError, match=r"cuLaunchKernelEx\(gemm, grid=\(1, 1, 1\), block=\(256, 1, 1\), "
                                             r"shared=32776\) failed: CUresult 700"):
        launch_mod.launch(c, args)


def test_the_stream_is_torchs_current_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0x5000 + device, raising=False)
    assert driver.current_stream() == 0x5001 and driver.current_stream(0) == 0x5000
    # A torch without the raw handle: its Stream object's.
    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream")
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: types.SimpleNamespace(cuda_stream=0x7000 + device))
    assert driver.current_stream() == 0x7001 and driver.current_stream(0) == 0x7000


def test_another_shape_gets_its_own_grid(gpu: types.SimpleNamespace) -> None:
    c = gemm()
    assert launch_mod.launch(c, gemm_args()) == (1, 1)
    assert launch_mod.launch(c, gemm_args(m=256)) == (2, 1)
    assert gpu.checks == 2 and [x["grid"] for x in gpu.lib.launches] == [(1, 1, 1), (2, 1, 1)]


def test_a_changed_shape_at_the_same_address_is_checked_again(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    a, out = torch.zeros(256 * 64, dtype=torch.bfloat16), torch.zeros(256 * 128, dtype=torch.bfloat16)
    args[0], args[2] = cuda_like(a[:128 * 64].view(128, 64)), cuda_like(out[:128 * 128].view(128, 128))
    assert launch_mod.launch(c, args) == (1, 1)
    args[0], args[2] = cuda_like(a.view(256, 64)), cuda_like(out.view(256, 128))
    assert launch_mod.launch(c, args) == (2, 1)
    args[0] = cuda_like(a[:128 * 32].view(128, 32))
    with pytest.raises(TkcLaunchError, match="dim K is 32 from a"):
        launch_mod.launch(c, args)
    assert gpu.checks == 3 and [x["grid"] for x in gpu.lib.launches] == [(1, 1, 1), (2, 1, 1)]


def test_changed_strides_at_the_same_address_are_refused(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    base = torch.zeros(128 * 68, dtype=torch.bfloat16)
    args[0] = cuda_like(base.as_strided((128, 64), (64, 1)))
    launch_mod.launch(c, args)
    args[0] = cuda_like(base.as_strided((128, 64), (68, 1)))  # 136-byte rows: not TMA-able
    with pytest.raises(TkcLaunchError, match="a: axis 0 has a stride of 136 bytes; TMA"):
        launch_mod.launch(c, args)
    args[0] = cuda_like(base.as_strided((128, 64), (1, 128)))  # same address, transposed
    with pytest.raises(TkcLaunchError, match="a: the innermost dim must be contiguous"):
        launch_mod.launch(c, args)
    assert len(gpu.lib.launches) == 1


def test_a_changed_dtype_at_the_same_address_is_refused(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    args[0] = cuda_like(args[0].view(torch.float16))
    with pytest.raises(TkcLaunchError, match="a: expected a tensor of dtype bf16, got torch.float16"):
        launch_mod.launch(c, args)
    assert len(gpu.lib.launches) == 1


def test_a_misaligned_view_is_refused(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    base = torch.zeros(128 * 64 + 8, dtype=torch.bfloat16)
    args[0] = cuda_like(base.as_strided((128, 64), (64, 1)))
    launch_mod.launch(c, args)
    args[0] = cuda_like(base.as_strided((128, 64), (64, 1), 1))  # 2 bytes further
    with pytest.raises(TkcLaunchError, match="a: the data pointer .* is not 16-byte aligned"):
        launch_mod.launch(c, args)


def test_another_device_is_refused(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    gpu.device = 1  # the same tensors, with torch's current device switched
    with pytest.raises(TkcLaunchError, match="a: is on cuda:0 but the kernel runs on cuda:1"):
        launch_mod.launch(c, args)
    gpu.device = 0
    args[1] = cuda_like(args[1], index=1)  # the same address, said to be on another device
    with pytest.raises(TkcLaunchError, match="b: is on cuda:1 but the kernel runs on cuda:0"):
        launch_mod.launch(c, args)
    assert len(gpu.lib.launches) == 1


def test_an_explicit_grid_is_part_of_the_plan(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    assert launch_mod.launch(c, args, grid=(1,)) == (1,)
    with pytest.raises(TkcLaunchError, match="grid must be 1 to 3 non-negative integers, got \\(1.0,\\)"):
        launch_mod.launch(c, args, grid=(1.0,))
    assert launch_mod.launch(c, args, grid=(0,)) == (0,)  # nothing launched, now or on a repeat
    assert launch_mod.launch(c, args, grid=(0,)) == (0,)
    assert len(gpu.lib.launches) == 1 and gpu.checks == 3


def test_scalars_that_compare_equal_but_encode_differently_get_their_own_plans() -> None:
    x = torch.zeros(4, dtype=torch.bfloat16)
    key = launch_mod._plan_key
    assert key(torch, [x, 0.0], None, 0) != key(torch, [x, -0.0], None, 0)
    assert key(torch, [x, 1], None, 0) != key(torch, [x, True], None, 0)
    assert key(torch, [x, 1], None, 0) != key(torch, [x, 1.0], None, 0)
    assert key(torch, [x, 1.5], None, 0) == key(torch, [x, 1.5], None, 0)
    assert key(torch, [x], None, 0) != key(torch, [x], None, 1)
    assert key(torch, [x, x.float().numpy()], None, 0) is None  # not cached: checked every time


def test_the_plan_cache_is_bounded(gpu: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_mod, "_MAX_PLANS", 2)
    c = gemm()
    for m in (128, 256, 384):
        launch_mod.launch(c, gemm_args(m=m))
    assert len(c.launch_plans) == 1


# ------------------------------------------------------------- @tkc.kernel
def test_a_repeated_kernel_call_compiles_once_and_reads_no_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    import tkc.compiler

    compiled, launched = object(), []
    compiles = []
    monkeypatch.delenv("TKC_INTERPRET", raising=False)
    monkeypatch.setattr(tkc.compiler, "compile_kernel", lambda *a, **kw: compiles.append(kw) or compiled)
    monkeypatch.setattr(kernel_mod, "_launch", lambda: lambda c, args, grid=None: launched.append(c))
    monkeypatch.setattr(kernel_mod, "knobs", lambda: pytest.fail("knobs() read on a plain call"))
    k, x = _rmsnorm(), cuda_like(torch.zeros(4, 8, dtype=torch.bfloat16))
    for _ in range(3):
        k(x, x, x, 1e-6)
    assert len(compiles) == 1 and launched == [compiled] * 3


@pytest.mark.parametrize("value, interprets", [("1", True), ("on", True), ("0", False), ("", False)])
def test_kernel_calls_follow_tkc_interpret(monkeypatch: pytest.MonkeyPatch, value: str, interprets: bool) -> None:
    ran = []
    monkeypatch.setenv("TKC_INTERPRET", value)
    monkeypatch.setattr(kernel_mod, "interpret", lambda *a, **kw: ran.append("interpreter"))
    monkeypatch.setattr(kernel_mod.Kernel, "specialize", lambda self, **consts: None)
    monkeypatch.setattr(kernel_mod, "_launch", lambda: lambda c, args, grid=None: ran.append("gpu"))
    x = cuda_like(torch.zeros(4, 8, dtype=torch.bfloat16))
    _rmsnorm()(x, x, x, 1e-6)
    assert ran == ["interpreter" if interprets else "gpu"]


def test_a_bad_tkc_interpret_is_still_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from tkc.errors import TkcUsageError

    monkeypatch.setenv("TKC_INTERPRET", "maybe")
    with pytest.raises(TkcUsageError, match="TKC_INTERPRET='maybe': expected 1 or 0"):
        _rmsnorm()(torch.zeros(1))
