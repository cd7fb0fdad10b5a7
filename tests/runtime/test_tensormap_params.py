"""cuTensorMapEncodeTiled arguments, computed and validated without a GPU (PTX-FACTS §3)."""

from __future__ import annotations

import pytest
import torch

from tkc.dtypes import bf16, f8e4m3, f8e5m2, f16, f32, i32
from tkc.errors import TkcLaunchError
from tkc.ir.layouts import SharedLayout
from tkc.runtime.tensormap import TensorMap, data_type, tiled_params

BASE = 0x7F00_0000_0000


@pytest.mark.parametrize("M,K", [(128, 256), (64, 64), (4096, 8192), (100, 72)])
def test_ptx_facts_example(M, K):
    # A[M][K] bf16 row-major, 64x64 K-major SW128 boxes -> (9, 2, {K,M}, {2K}, {64,64}, {1,1}, 0, 3, 2, 0)
    layout = SharedLayout(64, 64, bf16, "k", 128)
    p = tiled_params((M, K), (K, 1), bf16, BASE, layout.tma_box().dims, layout.tma_swizzle_enum())
    assert p == (9, 2, BASE, (K, M), (2 * K,), (64, 64), (1, 1), 0, 3, 2, 0)
    assert p.global_address == BASE and p.global_dim == (K, M)


@pytest.mark.parametrize("dtype,enum,size", [
    (torch.float32, 7, 4), (torch.float16, 6, 2), (torch.bfloat16, 9, 2), (torch.float8_e4m3fn, 0, 1),
    (torch.float8_e5m2, 0, 1), (torch.int32, 3, 4), (torch.uint8, 0, 1), (torch.float64, 8, 8),
    (f32, 7, 4), (f16, 6, 2), (bf16, 9, 2), (f8e4m3, 0, 1), (f8e5m2, 0, 1), (i32, 3, 4),
])
def test_data_types(dtype, enum, size):
    assert data_type(dtype)[:2] == (enum, size)


def test_fp8_box_and_higher_ranks():
    p = tiled_params((3, 256, 512), (256 * 512, 512, 1), torch.float8_e4m3fn, BASE, (128, 64, 1), 3)
    assert p == (0, 3, BASE, (512, 256, 3), (512, 256 * 512), (128, 64, 1), (1, 1, 1), 0, 3, 2, 0)
    p = tiled_params((7,), (1,), f32, BASE, (4,), 0, oob_fill=1, l2_promotion=0)
    assert p == (7, 1, BASE, (7,), (), (4,), (1,), 0, 0, 0, 1)
    # a padded view: logical width 70, row stride 72 elements = 144 B
    p = tiled_params((100, 70), (72, 1), bf16, BASE, (64, 64), 3)
    assert p.global_dim == (70, 100) and p.global_strides == (144,)
    # a size-1 innermost dim may have any stride
    assert tiled_params((16, 1), (16, 5), f32, BASE, (4, 16), 0).global_strides == (64,)


@pytest.mark.parametrize("kw,message", [
    (dict(shape=(64, 64, 1, 1, 1, 1), strides=(64,) * 5 + (1,), box=(64,) + (1,) * 5), r"rank must be 1 to 5, got 6"),
    (dict(shape=(), strides=(), box=()), r"rank must be 1 to 5, got 0"),
    (dict(strides=(64,)), r"1 strides for a rank-2 shape"),
    (dict(box=(64,)), r"the box has 1 dims but the tensor has rank 2"),
    (dict(ptr=BASE + 8), r"the base address 0x7f0000000008 is not 16-byte aligned"),
    (dict(shape=(0, 64)), r"dim 0 has size 0; TMA needs 1 <= size <= 2\^32"),
    (dict(shape=(1, 2**32 + 1), strides=(2**32 + 8, 1)), r"dim 1 has size 4294967297"),
    (dict(strides=(64, 2)), r"the innermost dim must be contiguous \(stride 1\), got stride 2"),
    (dict(shape=(64, 70), strides=(70, 1)), r"the stride of dim 0 is 140 bytes; TMA needs a positive multiple of 16 "
                                            r"below 2\^40"),
    (dict(strides=(0, 1)), r"the stride of dim 0 is 0 bytes"),
    (dict(shape=(2, 64), strides=(2**39, 1)), r"the stride of dim 0 is 1099511627776 bytes"),
    (dict(box=(64, 257)), r"box dim 1 \(innermost first\) is 257; it must be in \[1, 256\]"),
    (dict(box=(0, 64)), r"box dim 0 \(innermost first\) is 0"),
    (dict(box=(4, 64), swizzle=0), r"the inner box dim spans 8 bytes \(4 x 2 B\); it must be a multiple of 16"),
    (dict(box=(128, 64)), r"the inner box dim spans 256 bytes, more than the 128-byte swizzle"),
    (dict(box=(64, 64), swizzle=2), r"the inner box dim spans 128 bytes, more than the 64-byte swizzle"),
    (dict(box=(32, 64), swizzle=1), r"the inner box dim spans 64 bytes, more than the 32-byte swizzle"),
    (dict(swizzle=7), r"swizzle enum 7 is not one of 0 \(none\), 1 \(32B\), 2 \(64B\), 3 \(128B\)"),
    (dict(l2=4), r"l2_promotion must be 0..3, got 4"),
    (dict(oob=2), r"oob_fill must be 0 \(zeros\) or 1 \(NaN\), got 2"),
    (dict(dtype=torch.int32, box=(32, 64), oob=1), r"NaN out-of-bounds fill needs a float dtype, not torch.int32"),
])
def test_invalid(kw, message):
    a = dict(shape=(64, 64), strides=(64, 1), dtype=bf16, ptr=BASE, box=(64, 64), swizzle=3, l2=2, oob=0) | kw
    with pytest.raises(TkcLaunchError, match="error: A: cannot make a TMA tensor map: " + message):
        tiled_params(a["shape"], a["strides"], a["dtype"], a["ptr"], a["box"], a["swizzle"],
                     l2_promotion=a["l2"], oob_fill=a["oob"], name="A")


def test_unsupported_dtype():
    with pytest.raises(TkcLaunchError, match="TMA cannot move elements of dtype torch.complex64"):
        data_type(torch.complex64)


def test_every_shared_layout_box_is_valid():
    for dt in (bf16, f16, f32, f8e4m3):
        for sw in (0, 32, 64, 128):
            for cols in (16, 32, 64, 128, 256):
                try:
                    lay = SharedLayout(64, cols, dt, "k", sw)
                except ValueError:
                    continue
                box = lay.tma_box()
                p = tiled_params((512, 1024), (1024, 1), dt, BASE, box.dims, lay.tma_swizzle_enum())
                assert p.box_dim == box.dims


def test_tensor_map_storage_is_aligned():
    p = tiled_params((64, 64), (64, 1), bf16, BASE, (64, 64), 3)
    maps = [TensorMap(p) for _ in range(8)]
    assert all(m.address % 128 == 0 for m in maps)
    assert len(maps[0].raw) == 128


def test_a_map_is_encoded_again_at_another_address_with_the_same_arguments(monkeypatch):
    """:meth:`TensorMap.encode` hands the driver the validated layout, based at the address
    given (a launch re-bases a map on each new tensor), through one entry point made once."""
    import ctypes

    from tkc.runtime import driver

    calls = []

    class Lib:
        def _FuncPtr(self, spec):  # noqa: N802 - ctypes' name
            assert spec[0] == "cuTensorMapEncodeTiled"
            return lambda *args: calls.append(args) or 0

    monkeypatch.setattr(driver, "_lib", Lib())
    p = tiled_params((300, 136), (136, 1), bf16, BASE, (64, 128), 3)
    tm = TensorMap(p)
    tm.encode()
    tm.encode(BASE + 0x1000)

    def plain(args):
        return [list(a) if isinstance(a, ctypes.Array) else a.value for a in args]

    first, second = (plain(args) for args in calls)
    assert first == [tm.address, 9, 2, BASE, [136, 300], [272], [64, 128], [1, 1], 0, 3, 2, 0]
    assert second == [*first[:3], BASE + 0x1000, *first[4:]] and tm.base == BASE + 0x1000
    assert all(a is b for a, b in zip(calls[0][4:8], calls[1][4:8]))  # the arrays, made once
