"""The launch path without a GPU: parameter encoding, tensor-map operands, and every check
that must fail before the driver is reached."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

from tkc import dtypes
from tkc.compiler import Compiled
from tkc.errors import TkcLaunchError, TkcUsageError
from tkc.ir.types import ScalarType, TensorType
from tkc.runtime import launch as launch_mod
from tkc.runtime import tensormap
from tkc.runtime.launch import TensorArg, param_values, swizzle_enum, tma_operands, to_ctypes

ROOT = Path(__file__).resolve().parents[2]
HOPPER_GEMM = ROOT / "tests" / "data" / "hopper" / "gemm.tkir"

A = ("a", TensorType(dtypes.bf16, ("M", "K")))
EPS = ("eps", ScalarType(dtypes.f32))
N = ("n", ScalarType(dtypes.i32))
FLAG = ("flag", ScalarType(dtypes.i1))
H = ("h", ScalarType(dtypes.bf16))


def test_params_follow_the_abi() -> None:
    t = TensorArg(0x7F0000001000, (300, 130), (136, 1))
    values = param_values([A, EPS, N, FLAG, H], [t, 1e-6, -3, True, 0.5])
    assert values == [("u64", 0x7F0000001000), ("u32", 300), ("u32", 130), ("u64", 136), ("u64", 1),
                      ("f32", 1e-6), ("u32", 0xFFFFFFFD), ("u32", 1), ("f32", 0.5)]
    c = to_ctypes(values)
    assert [type(v) for v in c] == [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint64,
                                    ctypes.c_uint64, ctypes.c_float, ctypes.c_uint32, ctypes.c_uint32,
                                    ctypes.c_float]
    assert c[6].value == 0xFFFFFFFD and c[5].value == pytest.approx(1e-6)


def test_param_errors() -> None:
    with pytest.raises(TkcLaunchError, match="n: expected a scalar of type i32, got float"):
        param_values([N], [1.5])
    with pytest.raises(TkcLaunchError, match="n: 4294967296 does not fit in i32"):
        param_values([N], [2**32])
    with pytest.raises(TkcLaunchError, match="a: axis 0 has 2147483648 elements; tkc kernels index with i32"):
        param_values([A], [TensorArg(16, (2**31, 1), (1, 1))])


def test_i64_scalars_travel_as_u64() -> None:
    n64 = ("n", ScalarType(dtypes.i64))
    ids = ("ids", TensorType(dtypes.i64, ("B",)))
    values = param_values([ids, n64, n64], [TensorArg(0x7F0000002000, (5,), (1,)), 2**40 + 3, -2])
    assert values == [("u64", 0x7F0000002000), ("u32", 5), ("u64", 1), ("u64", 2**40 + 3),
                      ("u64", 2**64 - 2)]
    assert [type(v) for v in to_ctypes(values)[3:]] == [ctypes.c_uint64, ctypes.c_uint64]
    with pytest.raises(TkcLaunchError, match="n: 9223372036854775808 does not fit in i64"):
        param_values([n64], [2**63])
    with pytest.raises(TkcLaunchError, match="n: expected a scalar of type i64, got float"):
        param_values([n64], [1.0])


def test_tma_operands_reverse_the_box_and_map_the_swizzle() -> None:
    params = [A, ("b", TensorType(dtypes.bf16, ("B", "H", "N", 64)))]
    assert tma_operands(params, [[0, [128, 64], 128], [1, [1, 1, 64, 32], 64]]) == [
        (0, (64, 128), 3), (1, (32, 64, 1, 1), 2)]
    with pytest.raises(TkcLaunchError, match="does not name a tensor parameter"):
        tma_operands([EPS], [[0, [64], 128]])
    with pytest.raises(TkcLaunchError, match="3 box extents for a rank-2 tensor"):
        tma_operands(params, [[0, [1, 128, 64], 128]])


def test_swizzle_enum_inverts_the_tensormap_table() -> None:
    for enum, width in tensormap.SWIZZLE_BYTES.items():
        assert swizzle_enum(width or 0) == enum
    with pytest.raises(TkcLaunchError, match="swizzle of 16 B"):
        swizzle_enum(16)


# ------------------------------------------- checks before the driver is reached
torch = pytest.importorskip("torch")


@pytest.fixture
def no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any driver call fails the test: the checks must stop the launch first."""
    from tkc.runtime import driver

    def touched(*args: object, **kwargs: object) -> None:
        raise AssertionError("the launch reached the CUDA driver")

    for name in ("lib", "context"):
        monkeypatch.setattr(driver, name, touched)
    monkeypatch.setattr(tensormap, "encode_tiled", touched)


def gemm() -> Compiled:
    return Compiled.from_asm({"hopper": HOPPER_GEMM.read_text(), "ptx": "unused"})


@pytest.mark.parametrize("args, message", [
    ([torch.zeros(4, 8), torch.zeros(8, 4, dtype=torch.bfloat16), torch.zeros(4, 4, dtype=torch.bfloat16)],
     "a: expected a tensor of dtype bf16, got torch.float32"),
    ([torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(6, 4, dtype=torch.bfloat16),
      torch.zeros(4, 4, dtype=torch.bfloat16)], "dim K is 8 from a (axis 1) but 6 from b (axis 0)"),
    ([torch.zeros(4, 8, dtype=torch.bfloat16)], "kernel @gemm takes 3 arguments (a, b, c), got 1"),
    ([torch.zeros(4, 8, dtype=torch.bfloat16), 1.0, torch.zeros(4, 4, dtype=torch.bfloat16)],
     "b: expected tensor<bf16[K, N]> (a torch tensor), got float"),
])
def test_signature_errors_come_first(no_driver: None, args: list, message: str) -> None:
    with pytest.raises(TkcLaunchError) as e:
        launch_mod.launch(gemm(), args)
    assert message in e.value.message


@pytest.mark.parametrize("given, want", [(torch.int32, "i64"), (torch.int64, "i32")])
def test_index_dtype_mismatch_is_refused_before_launch(no_driver: None, given: object, want: str) -> None:
    from tkc.runtime.args import check_launch

    other = torch.int64 if want == "i64" else torch.int32
    params = [("ids", TensorType(dtypes.from_torch(other), ("B",))), ("y", TensorType(dtypes.f32, ("B",)))]
    with pytest.raises(TkcLaunchError) as e:
        check_launch("emb", params, [torch.zeros(4, dtype=given), torch.zeros(4)])
    assert e.value.message == f"ids: expected a tensor of dtype {want}, got {given}"


def test_tma_tensors_are_named_to_the_layout_checks(no_driver: None, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def check_launch(name, params, args, tma=(), device=None, writes=frozenset()):
        seen.update(name=name, tma=set(tma))
        raise TkcLaunchError("stop here")

    monkeypatch.setattr("tkc.runtime.args.check_launch", check_launch)
    with pytest.raises(TkcLaunchError, match="stop here"):
        launch_mod.launch(gemm(), [None, None, None])
    assert seen == {"name": "gemm", "tma": {"a", "b"}}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_cpu_tensors_without_a_gpu(no_driver: None) -> None:
    args = [torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(8, 4, dtype=torch.bfloat16),
            torch.zeros(4, 4, dtype=torch.bfloat16)]
    with pytest.raises(TkcLaunchError, match="no CUDA device is available"):
        launch_mod.launch(gemm(), args)


def test_tile_ir_only_is_not_launchable(no_driver: None) -> None:
    c = Compiled("k", "sm_90a", {"tkir": ""})
    with pytest.raises(TkcUsageError, match="stopped at tile IR"):
        launch_mod.launch(c, [])


def test_grid_override_is_checked() -> None:
    from tkc.grid import check_grid

    assert check_grid(4) == (4,)
    assert check_grid([2, 3]) == (2, 3)
    for bad in ((), (1, 2, 3, 4), (1.5,), (True,), (-1,), "4"):
        with pytest.raises(TkcLaunchError, match="grid must be 1 to 3 non-negative integers"):
            check_grid(bad)


# ------------------------------------------------------------- @tkc.kernel
def _rmsnorm():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from rmsnorm import rmsnorm
    finally:
        sys.path.pop(0)
    return rmsnorm


def test_kernel_call_without_cuda_tensors_points_at_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TKC_INTERPRET", raising=False)
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    with pytest.raises(TkcLaunchError, match="takes CUDA torch tensors, got none; set TKC_INTERPRET=1"):
        _rmsnorm()(x, torch.zeros(8, dtype=torch.bfloat16), x, 1e-6)


def test_kernel_asm_is_compiled_once_per_specialization(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TKC_CACHE_DIR", str(tmp_path))
    k = _rmsnorm()
    asm = k.asm(BN=128)
    assert {"tkir", "hopper", "llvm", "ptx"} <= set(asm) and ".entry rmsnorm(" in asm["ptx"]
    assert k.specialize(BN=128) is k.specialize(BN=128)
    assert k.specialize(BN=128) is not k.specialize(BN=64)
    assert "BN = 64" in k.asm(BN=64)["tkir"]
