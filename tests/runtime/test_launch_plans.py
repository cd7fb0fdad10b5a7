"""The plan cache of repeated launches, without a GPU: a launch with arguments like an earlier
one's (tensors of the same shapes, strides, dtypes and devices, at any aligned address; the same
scalars, device and grid) skips the checks, puts the tensors' addresses into the parameters and
tensor maps and goes straight to the driver; any change the checks depend on (shape, strides,
dtype, device, scalar value, an address's alignment) is checked again, and refused with the same
error as a first launch.  torch's CUDA queries and the driver are stubbed; tensors are CPU tensors
that say they are on a CUDA device."""

from __future__ import annotations

import ctypes
import functools
import importlib
import types
import weakref
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


@functools.cache
def _on_device(index: int) -> type:
    """The fake's class for tensors on ``cuda:<index>``: one of its own past device 0, since a
    launch's match (torch's tensor guard, C++) sees the tensors' real device, cpu for all."""
    return FakeCuda if index == 0 else type(f"FakeCuda{index}", (FakeCuda,), {"index": index})


def cuda_like(t: torch.Tensor, index: int = 0) -> FakeCuda:
    return t.as_subclass(_on_device(index))


class FakeLib:
    """The driver entry points a launch uses, under their driver names; each launch is recorded
    with its grid, its stream, the value of its first parameter (the first tensor's address) and
    the values of the ``u64`` parameters at ``slots`` and of the ``f32`` ones at ``f32_slots``;
    each tensor map encoded, with the address it is based at."""

    def __init__(self) -> None:
        self.launches: list[dict] = []
        self.encoded: list[int] = []  # each cuTensorMapEncodeTiled's (or ReplaceAddress's) global address
        self.replaced = 0  # how many of those only replaced the address
        self.slots: tuple[int, ...] = ()
        self.f32_slots: tuple[int, ...] = ()
        self.map_slots: tuple[int, ...] = ()
        self.result = 0  # what cuLaunchKernelEx returns
        self.refused = 0  # launches refused because the kernel's context was not current
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
        self._based(args[0], args[3])
        return 0

    def cuTensorMapReplaceAddress(self, tensor_map: object, address: object) -> int:
        # a map re-based on a new tensor: recorded as an encoding at that address
        self._based(tensor_map, address)
        self.replaced += 1
        return 0

    def _based(self, tensor_map: object, address: object) -> None:
        """Record a map based at ``address`` and write the address into its first 8 bytes, where
        a launch reads which address each of its maps is based at (``map_slots``)."""
        address = getattr(address, "value", address) or 0
        self.encoded.append(address)
        ctypes.c_uint64.from_address(getattr(tensor_map, "value", tensor_map)).value = address

    def cuLaunchKernelEx(self, cfg: ctypes.c_void_p, handle: object, ptrs: ctypes.c_void_p, extra: None) -> int:
        if self.current != CTX:
            self.refused += 1
            return 201  # CUDA_ERROR_INVALID_CONTEXT: the function belongs to another context
        c = driver.CUlaunchConfig.from_address(cfg.value)
        last = max((*self.slots, *self.f32_slots, *self.map_slots), default=0)
        pointers = (ctypes.c_void_p * (last + 1)).from_address(ptrs.value)
        self.launches.append({"grid": (c.gridDimX, c.gridDimY, c.gridDimZ), "stream": c.hStream or 0,
                              "first": ctypes.c_uint64.from_address(pointers[0]).value, "ctx": self.current,
                              "slots": [ctypes.c_uint64.from_address(pointers[j]).value for j in self.slots],
                              "f32": [ctypes.c_float.from_address(pointers[j]).value for j in self.f32_slots],
                              "maps": [ctypes.c_uint64.from_address(pointers[j]).value for j in self.map_slots]})
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
        launch_mod.launch_state(c).functions[index] = driver.Function(ctypes.c_void_p(0x3000), "gemm", module)
    return c


def plans(c: Compiled) -> dict:
    return launch_mod.launch_state(c).plans


def gemm_args(m: int = 128, n: int = 128, k: int = 64) -> list[FakeCuda]:
    return [cuda_like(torch.zeros(m, k, dtype=torch.bfloat16)), cuda_like(torch.zeros(k, n, dtype=torch.bfloat16)),
            cuda_like(torch.zeros(m, n, dtype=torch.bfloat16))]


def test_a_repeated_launch_skips_the_checks(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    assert launch_mod.launch(c, args) == (1, 1)
    assert launch_mod.launch(c, args) == (1, 1)
    assert gpu.checks == 1 and len(plans(c)) == 1
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
    """A repeated launch does not ask the driver which context is current; when the driver
    refuses it because another one is (or none, on a new thread), it makes the kernel's
    current and launches again."""
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    for other in (0x9000, None):  # something else made another context current on this thread; none
        gpu.lib.current = other
        launch_mod.launch(c, args)
    assert [x["ctx"] for x in gpu.lib.launches] == [CTX, CTX, CTX] and gpu.lib.refused == 2


def test_a_launch_refused_in_its_own_context_is_an_error(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    gpu.lib.result = 700  # e.g. an earlier kernel's illegal address, reported at the next call
    with pytest.raises(TkcLaunchError, match="cuLaunchKernelEx\\(gemm, grid=\\(1, 1, 1\\)"):
        launch_mod.launch(c, args)
    assert len(gpu.lib.launches) == 2 and gpu.lib.refused == 0  # tried once: the context was current


def test_other_buffers_of_the_same_shape_are_launched_with_their_address(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    other = [args[0].clone().as_subclass(FakeCuda), *args[1:]]
    launch_mod.launch(c, other)
    assert gpu.checks == 1
    assert [x["first"] for x in gpu.lib.launches] == [args[0].data_ptr(), other[0].data_ptr()]
    # a's tensor map, first at a's address, is based again at the other tensor's (b's is not)
    assert gpu.lib.encoded == [args[0].data_ptr(), args[1].data_ptr(), other[0].data_ptr()]
    assert gpu.lib.replaced == 1  # by cuTensorMapReplaceAddress, not a whole new encoding


def test_a_new_output_tensor_at_each_call_reuses_the_plan(gpu: types.SimpleNamespace) -> None:
    """``c = torch.empty(...); gemm(a, b, c)``: every tensor's address reaches its parameter,
    and each launch gets the addresses it was called with, after others were launched."""
    gpu.lib.slots = (0, 5, 10)  # a, b and c's addresses among the gemm's parameters
    c, (a, b, _) = gemm(), gemm_args()
    outs = [cuda_like(torch.zeros(128, 128, dtype=torch.bfloat16)) for _ in range(3)]
    for out in [*outs, outs[0], outs[0], outs[2]]:
        assert launch_mod.launch(c, [a, b, out]) == (1, 1)
    assert gpu.checks == 1 and len(plans(c)) == 1
    want = [[a.data_ptr(), b.data_ptr(), out.data_ptr()] for out in [*outs, outs[0], outs[0], outs[2]]]
    assert [x["slots"] for x in gpu.lib.launches] == want
    # a and b take TMA; c does not: their maps were encoded once, at their addresses
    assert gpu.lib.encoded == [a.data_ptr(), b.data_ptr()]
    # and with a new a each time, a's map follows it: a copy of the map re-based at each new
    # address, kept, so an address seen before costs no driver call
    gpu.lib.map_slots = (15, 16)  # a's and b's maps, after the 15 parameters of a, b and c
    others = [cuda_like(torch.zeros(128, 64, dtype=torch.bfloat16)) for _ in range(2)]
    order = [*others, a, others[1], others[0], a]
    for x in order:
        launch_mod.launch(c, [x, b, outs[0]])
    assert gpu.lib.encoded[2:] == [x.data_ptr() for x in others] and gpu.lib.replaced == 2
    assert [x["slots"][0] for x in gpu.lib.launches[-6:]] == [x.data_ptr() for x in order]
    assert [x["maps"] for x in gpu.lib.launches[-6:]] == [[x.data_ptr(), b.data_ptr()] for x in order]
    assert gpu.checks == 1


def test_an_output_overlapping_an_input_is_refused_before_the_driver(gpu: types.SimpleNamespace) -> None:
    """A plan made on separate tensors is not taken when a later call's output overlaps an
    input (its addresses are checked apart): the checked launch refuses it, nothing launched."""
    c, (a, b, out) = gemm(), gemm_args(128, 128, 128)
    launch_mod.launch(c, [a, b, out])
    launch_mod.launch(c, [a, b, cuda_like(torch.zeros(128, 128, dtype=torch.bfloat16))])
    assert gpu.checks == 1 and len(gpu.lib.launches) == 2
    with pytest.raises(TkcLaunchError, match="'c' shares memory with 'a', which the kernel reads"):
        launch_mod.launch(c, [a, b, a])
    base = torch.zeros(3 * 128 * 128, dtype=torch.bfloat16)
    with pytest.raises(TkcLaunchError, match="'c' shares memory with 'b'"):  # views that overlap by half
        launch_mod.launch(c, [a, cuda_like(base[:128 * 128].view(128, 128)),
                              cuda_like(base[64 * 128:192 * 128].view(128, 128))])
    assert len(gpu.lib.launches) == 2 and gpu.checks == 3
    launch_mod.launch(c, [a, cuda_like(base[:128 * 128].view(128, 128)),
                          cuda_like(base[128 * 128:256 * 128].view(128, 128))])  # adjacent: fine
    assert len(gpu.lib.launches) == 3


def test_a_plan_keeps_a_bounded_number_of_tensor_maps(gpu: types.SimpleNamespace,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_mod, "_MAX_MAPS", 3)
    gpu.lib.map_slots = (15, 16)
    c, (_, b, out) = gemm(), gemm_args()
    inputs = [cuda_like(torch.zeros(128, 64, dtype=torch.bfloat16)) for _ in range(5)]
    for x in [*inputs, inputs[0], inputs[4]]:
        launch_mod.launch(c, [x, b, out])
    slot = plans(c)[next(iter(plans(c)))].maps[0]
    assert len(slot.maps) <= 3 and inputs[4].data_ptr() in slot.maps
    assert [x["maps"][0] for x in gpu.lib.launches] == [x.data_ptr() for x in [*inputs, inputs[0], inputs[4]]]


def test_a_plan_keeps_no_tensor_alive(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    launch_mod.launch(c, args)
    refs = [weakref.ref(x) for x in args]
    del args
    assert [r() for r in refs] == [None, None, None]
    assert len(plans(c)) == 1


def test_new_tensors_of_other_strides_are_checked_again(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    padded = torch.zeros(128, 72, dtype=torch.bfloat16)
    args[0] = cuda_like(padded[:, :64])  # 144-byte rows: TMA-able, but another layout
    launch_mod.launch(c, args)
    assert gpu.checks == 2 and len(plans(c)) == 2
    args[0] = cuda_like(torch.zeros(128, 68, dtype=torch.bfloat16)[:, :64])  # 136-byte rows: not TMA-able
    with pytest.raises(TkcLaunchError, match="a: axis 0 has a stride of 136 bytes; TMA"):
        launch_mod.launch(c, args)
    assert len(gpu.lib.launches) == 2


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
    gpu.lib.slots = (0, 5, 10)
    c, args = gemm(), gemm_args()
    base = torch.zeros(128 * 64 + 8, dtype=torch.bfloat16)
    args[0] = cuda_like(base.as_strided((128, 64), (64, 1)))
    launch_mod.launch(c, args)
    aligned = args[0]
    args[0] = cuda_like(base.as_strided((128, 64), (64, 1), 1))  # 2 bytes further
    with pytest.raises(TkcLaunchError, match="a: the data pointer .* is not 16-byte aligned"):
        launch_mod.launch(c, args)
    out = torch.zeros(128 * 128 + 8, dtype=torch.bfloat16)
    args[0], args[2] = aligned, cuda_like(out.as_strided((128, 128), (128, 1), 4))  # c: 8 bytes further
    with pytest.raises(TkcLaunchError, match="c: the data pointer .* is not 16-byte aligned"):
        launch_mod.launch(c, args)
    assert len(gpu.lib.launches) == 1 and len(plans(c)) == 1
    args[2] = cuda_like(out.as_strided((128, 128), (128, 1), 8))  # 16 bytes further: fine
    launch_mod.launch(c, args)
    assert gpu.lib.launches[-1]["slots"] == [aligned.data_ptr(), args[1].data_ptr(), args[2].data_ptr()]


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


def key(args: list, grid: object = None, device: int = 0, addresses: list | None = None) -> tuple | None:
    return launch_mod._plan_key(torch, args, grid, device, [] if addresses is None else addresses)


def test_scalars_that_compare_equal_but_encode_differently_get_their_own_plans() -> None:
    x = torch.zeros(4, dtype=torch.bfloat16)
    assert key([x, 0.0]) != key([x, -0.0])
    assert key([x, 1]) != key([x, True])
    assert key([x, 1]) != key([x, 1.0])
    assert key([x, 1.5]) == key([x, 1.5])
    assert key([x]) != key([x], device=1)
    assert key([x, x.float().numpy()]) is None  # not cached: checked every time


def test_a_plan_key_holds_no_address() -> None:
    x, y = torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(4, 8, dtype=torch.bfloat16)
    ax, ay = [], []
    assert key([x, 2], addresses=ax) == key([y, 2], addresses=ay)
    assert ax == [x.data_ptr()] and ay == [y.data_ptr()]
    for other in (x.T, x[:, :4], x.float(), x.view(2, 16)):
        assert key([other, 2]) != key([x, 2])
    assert key([x, 3]) != key([x, 2]) and key([x, 2], grid=(4,)) != key([x, 2])


def test_each_thread_has_its_own_plans(gpu: types.SimpleNamespace) -> None:
    """A plan's parameters are rewritten in place for new addresses: threads never share one."""
    import threading

    c, args = gemm(), gemm_args()
    x = torch.zeros(4, dtype=torch.bfloat16)
    keys = [key([x])]
    other = threading.Thread(target=lambda: keys.append(key([x])))
    other.start()
    other.join()
    assert keys[0] != keys[1]
    launch_mod.launch(c, args)
    other = threading.Thread(target=lambda: launch_mod.launch(c, args))
    other.start()
    other.join()
    assert len(plans(c)) == 2 and gpu.checks == 2


def test_the_plan_cache_is_bounded(gpu: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_mod, "_MAX_PLANS", 2)
    c = gemm()
    for m in (128, 256, 384):
        launch_mod.launch(c, gemm_args(m=m))
    assert len(plans(c)) == 1


def test_runtime_state_lives_beside_the_compiled_kernel(gpu: types.SimpleNamespace) -> None:
    """A Compiled holds no launch state; the runtime's goes when the Compiled does."""
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    assert not hasattr(c, "launch_plans") and not hasattr(c, "loaded")
    assert id(c) in launch_mod._states
    key = id(c)
    del c
    import gc

    gc.collect()
    assert key not in launch_mod._states


def rmsnorm_hopper() -> Compiled:
    """examples/rmsnorm.py's kernel (a scalar eps) to hopper IR, its function loaded on device 0."""
    from tkc.compiler import compile_kernel

    k = _rmsnorm()
    c = compile_kernel(k._text, {}, stop="hopper", cache=False, file=k.file, first_line=k.first_line,
                       python_function=True)
    module = types.SimpleNamespace(ctx=ctypes.c_void_p(CTX))
    launch_mod.launch_state(c).functions[0] = driver.Function(ctypes.c_void_p(0x3000), "rmsnorm", module)
    return c


def test_another_scalar_is_checked_again_and_reaches_the_kernel(gpu: types.SimpleNamespace) -> None:
    c = rmsnorm_hopper()
    gpu.lib.f32_slots = (13,)  # eps, after x (5 entries), w (3) and y (5)
    x, w = cuda_like(torch.zeros(32, 256, dtype=torch.bfloat16)), cuda_like(torch.zeros(256, dtype=torch.bfloat16))
    outs = [cuda_like(torch.zeros(32, 256, dtype=torch.bfloat16)) for _ in range(3)]
    for y, eps in zip(outs, (1e-6, 1e-5, 1e-6)):
        launch_mod.launch(c, [x, w, y, eps])
    assert gpu.checks == 2 and len(plans(c)) == 2
    assert [x["f32"][0] for x in gpu.lib.launches] == pytest.approx([1e-6, 1e-5, 1e-6])
    with pytest.raises(TkcLaunchError, match="eps"):
        launch_mod.launch(c, [x, w, outs[0], "1e-6"])


def test_a_match_refuses_what_the_key_would_tell_apart(gpu: types.SimpleNamespace,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The last plan's match (torch's tensor guard and the scalars) refuses every argument list
    whose plan key differs from its own (other shapes, strides, dtypes, classes, devices,
    scalars or their types, another thread or torch device), and what only it sees (the
    gradient flag); arguments that differ only in their addresses give those addresses."""
    import threading

    monkeypatch.setattr(launch_mod, "_torch", torch)
    x, w = torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)
    match = launch_mod.Match.of([x, w, 1.5, 3], 0)
    same = [torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16), 1.5, 3]
    assert match.addresses(same) == [t.data_ptr() for t in same[:2]]
    assert match.addresses([x, w, 1.5, 3]) == [x.data_ptr(), w.data_ptr()]
    others = [[x.T.contiguous().T, w, 1.5, 3], [x.view(8, 4), w, 1.5, 3], [x.float(), w, 1.5, 3],
              [x[:, :4], w, 1.5, 3], [x.to("meta"), w, 1.5, 3], [x.as_subclass(FakeCuda), w, 1.5, 3],
              [x, w, 2.5, 3], [x, w, 1.5, 3.0], [x, w, 1.5, True], [x, w, 1.5], [x, w, 1.5, 3, 3],
              [x, 1.5, w, 3], [w, x, 1.5, 3]]
    for args in others:
        assert key(args) != key([x, w, 1.5, 3]) and match.addresses(args) is None, args
    assert match.addresses([x.clone().requires_grad_(), w, 1.5, 3]) is None  # the key does not see it
    gpu.device = 1
    assert match.addresses(same) is None
    gpu.device = 0
    seen = []
    other = threading.Thread(target=lambda: seen.append(match.addresses(same)))
    other.start()
    other.join()
    assert seen == [None]
    # equal scalars that encode differently: only the key tells them apart, so no match
    assert launch_mod.Match.of([x, 0.0], 0) is None and launch_mod.Match.of([x, float("nan")], 0) is None
    assert launch_mod.Match.of([x, 1], 0).addresses([x, True]) is None
    assert launch_mod.Match.of([x, x, w], 0) is None  # the guard refuses a tensor passed twice
    assert launch_mod.Match.of([x, w], 0).addresses([x, x]) is None


def test_a_plan_found_by_its_key_matches_the_calls_after(gpu: types.SimpleNamespace) -> None:
    """Tensors that differ from a plan's match only in their gradient flag are found by the key;
    the plan's match is then made of them, so the launches after skip the key, a few times
    per plan: arguments taking turns go by the key from then on."""
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    plan = launch_mod.launch_state(c).last
    grads = [cuda_like(torch.zeros(128, 64, dtype=torch.bfloat16)).requires_grad_(), *args[1:]]
    assert plan.match.addresses(grads) is None
    launch_mod.launch(c, grads)
    assert plan.match.addresses(grads) is not None and plan.rematches == 1
    for n in range(20):
        launch_mod.launch(c, grads if n % 2 else args)
    assert plan.rematches == launch_mod._MAX_REMATCHES and gpu.checks == 1 and len(gpu.lib.launches) == 22


def test_a_tensor_passed_twice_is_launched_by_the_key(gpu: types.SimpleNamespace) -> None:
    c, (a, _, out) = gemm(), gemm_args(128, 128, 128)
    for _ in range(3):
        launch_mod.launch(c, [a, a, out])
    assert gpu.checks == 1 and len(gpu.lib.launches) == 3 and launch_mod.launch_state(c).last.match is None


def test_a_launch_by_the_match_refuses_a_misaligned_tensor(gpu: types.SimpleNamespace) -> None:
    c, args = gemm(), gemm_args()
    launch_mod.launch(c, args)
    base = torch.zeros(128 * 128 + 8, dtype=torch.bfloat16)
    out = cuda_like(base[1:128 * 128 + 1].view(128, 128))  # 2 bytes further: same shape and strides
    assert launch_mod.launch_state(c).last.match.addresses([*args[:2], out]) is not None
    with pytest.raises(TkcLaunchError, match="c: the data pointer .* is not 16-byte aligned"):
        launch_mod.launch(c, [*args[:2], out])
    assert len(gpu.lib.launches) == 1


# ------------------------------------------------------------- @tkc.kernel
def test_a_repeated_kernel_call_compiles_once_and_reads_no_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    import tkc.compiler
    import tkc.options

    compiled, launched = object(), []
    compiles = []
    monkeypatch.delenv("TKC_INTERPRET", raising=False)
    # The kernel parsed and its tile IR built first (parsing may read the cache folder), as
    # earlier calls in a process leave them: what is counted is what a call compiles.
    k, x = _rmsnorm(), cuda_like(torch.zeros(4, 8, dtype=torch.bfloat16))
    k.kernel_op()
    monkeypatch.setattr(tkc.compiler, "compile_kernel", lambda *a, **kw: compiles.append(kw) or compiled)
    monkeypatch.setattr(kernel_mod, "_launch", lambda: lambda c, args, grid=None: launched.append(c))
    monkeypatch.setattr(tkc.options, "knobs", lambda: pytest.fail("knobs() read on a plain call"))
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


def test_a_repeated_launch_only_launches(gpu: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """What capturing a launch in a CUDA graph needs: once a shape has been launched, a launch
    with new tensors of that shape (``c = torch.empty(...)``, as every PyTorch operator makes
    its output) makes no synchronisation, allocation or query: the driver sees only the
    tensor maps' new addresses (host memory) and the launch, and torch's device queries and
    synchronize are not called; with tensors seen before, only the launch."""
    calls: list[str] = []

    def recorded(name: str, fn: object) -> object:
        def call(*args: object) -> object:
            calls.append(name)
            return fn(*args)
        return call

    for name in [n for n in dir(FakeLib) if n.startswith("cu")]:
        monkeypatch.setattr(gpu.lib, name, recorded(name, getattr(gpu.lib, name)))
    c, (a, b, out) = gemm(), gemm_args()
    launch_mod.launch(c, [a, b, out])
    calls.clear()

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a repeated launch called torch's CUDA queries or synchronize")

    for name in ("synchronize", "current_device", "get_device_properties", "get_device_capability"):
        monkeypatch.setattr(torch.cuda, name, refused)
    new = gemm_args()
    launch_mod.launch(c, new)
    assert calls == ["cuTensorMapReplaceAddress", "cuTensorMapReplaceAddress", "cuLaunchKernelEx"]
    calls.clear()
    launch_mod.launch(c, [a, b, new[2]])  # tensors seen before: their maps are kept
    assert calls == ["cuLaunchKernelEx"]
    assert gpu.checks == 1


# ------------------------------------------------------------- tkc.ops operators
@pytest.fixture
def ops(gpu: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """``gpu``, with torch.empty/zeros on a CUDA device making CPU tensors that say they are on
    it (an operator's outputs) and every kernel's function loaded on the stub."""
    def on(alloc: object) -> object:
        def stub(*shape: int, device: object = None, **kwargs: object) -> torch.Tensor:
            if device is not None and torch.device(device).type == "cuda":
                return cuda_like(alloc(*shape, **kwargs), torch.device(device).index or 0)
            return alloc(*shape, device=device, **kwargs)
        return stub

    monkeypatch.setattr(torch, "empty", on(torch.empty))
    monkeypatch.setattr(torch, "zeros", on(torch.zeros))
    module = types.SimpleNamespace(ctx=ctypes.c_void_p(CTX))
    monkeypatch.setattr(launch_mod, "_function",
                        lambda compiled, index: driver.Function(ctypes.c_void_p(0x3000), compiled.name, module))
    monkeypatch.delenv("TKC_INTERPRET", raising=False)
    import tkc.ops.rows as rows

    # plans of earlier tests launch on their own stub: start afresh
    monkeypatch.setattr(launch_mod, "_states", {})
    monkeypatch.setattr(rows._rms_norm.tkc_impl, "_plans", {})
    monkeypatch.setattr(rows._rms_norm.tkc_impl, "_last", None)
    gpu.lib.slots, gpu.lib.f32_slots = (0, 5, 8), (13,)  # rmsnorm's x, w, y and eps
    return gpu


def test_an_operator_launches_by_the_plan_of_its_inputs(ops: types.SimpleNamespace) -> None:
    """``tkc.ops.rms_norm``: a new output at every call, the launch checked once per set of
    input shapes, strides, dtypes and scalars, each launch on its own output's address; another
    shape or scalar is checked again and gets outputs of its own shape."""
    import tkc.ops

    x, w = cuda_like(torch.randn(32, 256).bfloat16()), cuda_like(torch.randn(256).bfloat16())
    ys = [tkc.ops.rms_norm(x, w) for _ in range(3)]
    assert ops.checks == 1 and len({y.data_ptr() for y in ys}) == 3
    assert all(type(y) is FakeCuda and y.shape == (32, 256) for y in ys)
    assert [launch["slots"] for launch in ops.lib.launches] == [[x.data_ptr(), w.data_ptr(), y.data_ptr()]
                                                              for y in ys]
    x2 = cuda_like(torch.randn(48, 256).bfloat16())
    y2 = tkc.ops.rms_norm(x2, w)
    assert y2.shape == (48, 256) and ops.checks == 2
    assert ops.lib.launches[-1]["grid"] == (3, 1, 1) and ops.lib.launches[-1]["slots"][2] == y2.data_ptr()
    tkc.ops.rms_norm(x, w, 1e-3)
    tkc.ops.rms_norm(x, w, 1e-3)
    assert ops.checks == 3 and [launch["f32"][0] for launch in ops.lib.launches[-3:]] == \
        pytest.approx([1e-6, 1e-3, 1e-3])
    assert ops.lib.launches[-1]["grid"] == (2, 1, 1)


def test_an_operator_with_a_plan_still_refuses_wrong_inputs(ops: types.SimpleNamespace) -> None:
    import tkc.ops
    import tkc.ops.rows as rows
    from tkc.errors import TkcUsageError

    x, w = cuda_like(torch.randn(32, 256).bfloat16()), cuda_like(torch.randn(256).bfloat16())
    tkc.ops.rms_norm(x, w)
    tkc.ops.rms_norm(x, w)
    with pytest.raises(TkcUsageError, match="x is torch.float16, but its kernel takes torch.bfloat16"):
        tkc.ops.rms_norm(cuda_like(x.view(torch.float16)), w)
    with pytest.raises(TkcLaunchError, match="x: expected a tensor of dtype bf16, got torch.float16"):
        rows._rms_norm.tkc_run(cuda_like(x.view(torch.float16)), w, 1e-6)  # past the operator's own checks
    with pytest.raises(TkcUsageError, match="weight's size is 128 but x's last dim is 256"):
        tkc.ops.rms_norm(x, cuda_like(torch.randn(128).bfloat16()))
    base = torch.zeros(32 * 256 + 8, dtype=torch.bfloat16)
    misaligned = cuda_like(base[1:32 * 256 + 1].view(32, 256))  # 2 bytes further
    with pytest.raises(TkcLaunchError, match="x: the data pointer .* is not 16-byte aligned"):
        tkc.ops.rms_norm(misaligned, w)
    with pytest.raises(TkcUsageError, match="rms_norm: x and weight must be on one device, got cuda:0 and cuda:1"):
        tkc.ops.rms_norm(x, cuda_like(w, index=1))
    assert len(ops.lib.launches) == 2


def test_an_operator_with_a_plan_follows_tkc_interpret(ops: types.SimpleNamespace,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import tkc.ops

    x, w = cuda_like(torch.randn(4, 256).bfloat16()), cuda_like(torch.randn(256).bfloat16())
    tkc.ops.rms_norm(x, w)
    tkc.ops.rms_norm(x, w)
    monkeypatch.setenv("TKC_INTERPRET", "1")
    y = tkc.ops.rms_norm(x, w)
    assert len(ops.lib.launches) == 2  # the interpreter ran it
    want = torch.nn.functional.rms_norm(x.float(), (256,), w.float(), 1e-6)
    torch.testing.assert_close(torch.Tensor(y).float(), want, rtol=2e-2, atol=2e-2)


@functools.cache
def split_op() -> object:
    """tests/ops/op_kernels.py's ``split`` as an operator: its outputs y and z around its input x."""
    import sys

    import tkc.ops

    sys.path.insert(0, str(ROOT / "tests" / "ops"))
    import op_kernels

    return tkc.ops.custom_op("tkc_plan_test::split", op_kernels.split)


def test_an_operators_outputs_reach_their_own_parameters(ops: types.SimpleNamespace) -> None:
    op = split_op()
    ops.lib.slots, ops.lib.f32_slots = (0, 3, 6), ()  # y, x and z
    xs = [cuda_like(torch.randn(100)) for _ in range(2)]
    outs = [op(x) for x in (*xs, xs[0])]
    assert ops.checks == 1
    assert [launch["slots"] for launch in ops.lib.launches] == \
        [[y.data_ptr(), x.data_ptr(), z.data_ptr()] for x, (y, z) in zip((*xs, xs[0]), outs)]


def test_an_operators_own_function_takes_the_plan_only_for_arguments_it_passes_on(
        ops: types.SimpleNamespace) -> None:
    """``tkc.ops.rms_norm`` looks up the plan of its arguments before its own checks: rows of
    the shapes, strides and dtypes of an earlier call launch at once, on their own addresses;
    an x it would copy (other strides) or reshape (other dims) is not found, and takes the
    function's own way (here its copy is a CPU tensor of the fake beside the fake's CUDA w:
    refused as tensors on two devices, once the look-up launched nothing)."""
    import tkc.ops
    from tkc.errors import TkcUsageError

    x, w = cuda_like(torch.randn(32, 256).bfloat16()), cuda_like(torch.randn(256).bfloat16())
    tkc.ops.rms_norm(x, w)
    x2 = cuda_like(torch.randn(32, 256).bfloat16())
    y2 = tkc.ops.rms_norm(x2, w)
    assert ops.checks == 1 and ops.lib.launches[-1]["slots"] == [x2.data_ptr(), w.data_ptr(), y2.data_ptr()]
    strided = cuda_like(torch.randn(32, 512).bfloat16()[:, ::2])
    deep = cuda_like(torch.randn(4, 8, 256).bfloat16())
    for t in (strided, deep):
        with pytest.raises(TkcUsageError, match="its tensors must be on one device, got cpu and cuda:0"):
            tkc.ops.rms_norm(t, w)
    assert len(ops.lib.launches) == 2 and ops.checks == 1


def test_an_operator_with_a_plan_records_the_gradient_with_it(ops: types.SimpleNamespace,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An input that needs a gradient: the eager autograd.Function launches the plan that
    ``call`` found (no second look-up, no check) and records the operator's backward."""
    import tkc.ops
    import tkc.ops.rows as rows

    x, w = cuda_like(torch.randn(32, 256).bfloat16()), cuda_like(torch.randn(256).bfloat16())
    tkc.ops.rms_norm(x, w)
    impl, lookups = rows._rms_norm.tkc_impl, []
    planned = impl.planned
    monkeypatch.setattr(impl, "planned", lambda *a: lookups.append(1) or planned(*a))
    xg = cuda_like(torch.randn(32, 256).bfloat16()).requires_grad_()
    for n in range(2):
        y = tkc.ops.rms_norm(xg, w)
        assert type(y.grad_fn).__name__ == "rmsnorm_autogradBackward" and len(lookups) == n + 1
        assert ops.lib.launches[-1]["slots"] == [xg.data_ptr(), w.data_ptr(), y.data_ptr()]
    assert ops.checks == 1 and len(ops.lib.launches) == 3
    with torch.no_grad():
        tkc.ops.rms_norm(xg, w)
    assert ops.checks == 1 and len(ops.lib.launches) == 4
