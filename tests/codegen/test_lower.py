"""Hopper-level IR to PTX: the kernel ABI of docs/hopper.md §4, and every op lowered to PTX
that ptxas -arch=sm_90a accepts without spilling."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from tkc.codegen.lower import kernel_to_llvm, kernel_to_ptx
from tkc.codegen.ptxas import Assembled, assemble
from tkc.errors import TkcCodegenError
from tkc.ir.core import Operation
from tkc.ir.parser import parse_module

ROOT = Path(__file__).resolve().parents[2]
GEMM = ROOT / "tests" / "data" / "hopper" / "gemm.tkir"
KERNELS = Path(__file__).parent / "kernels"


def _kernel(path: Path) -> Operation:
    return parse_module(path.read_text(), str(path)).kernel()


@cache
def _ptx(path: Path) -> str:
    return kernel_to_ptx(_kernel(path))


def _assembled(path: Path) -> Assembled:
    return assemble(_ptx(path), "sm_90a")


def _no_spills(a: Assembled, name: str) -> None:
    usage = a.kernels[name]
    assert usage.spill_stores == 0 and usage.spill_loads == 0, usage
    assert usage.stack_frame == 0, usage
    assert not [w for w in a.warnings if "C75" in w], a.warnings  # e.g. C7517: wgmma serialised


# --------------------------------------------------------------------------- gemm


def test_gemm_ptx_has_the_hopper_pipeline() -> None:
    ptx = _ptx(GEMM)
    # 4 k16 steps of one 64-wide K tile, per warpgroup (each issues its own).
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 4
    # A is one 128x64 box, B two 64x64 boxes (SharedLayout.tma_box).
    assert ptx.count("cp.async.bulk.tensor.2d") == 3
    assert "mbarrier.try_wait.parity" in ptx
    assert re.search(r"wgmma.wait_group.sync.aligned\s+0;", ptx)
    assert ".extern .shared .align 1024 .b8 smem[]" in ptx
    assert ".local" not in ptx


def test_gemm_abi() -> None:
    mod = kernel_to_llvm(_kernel(GEMM))
    text = str(mod)
    fn = mod.get_global("gemm")
    # a, b, c: pointer + 2 sizes + 2 strides each; then the two tensor maps.
    assert [str(t) for t in fn.ftype.args] == ["ptr addrspace(1)", "i32", "i32", "i64", "i64"] * 3 + ["ptr"] * 2
    assert '"nvvm.maxntid"="256"' in text and '"nvvm.minctasm"="1"' in text
    assert text.count('"nvvm.grid_constant"') == 2
    ptx = _ptx(GEMM)
    assert ".maxntid 256" in ptx
    assert len(re.findall(r"\.param \.align 64 \.b8 gemm_param_\d+\[128\]", ptx)) == 2


def test_gemm_assembles_without_spills(ptxas: Path) -> None:
    a = _assembled(GEMM)
    _no_spills(a, "gemm")
    # 64 accumulator registers per thread plus addressing.
    assert 64 < a.kernels["gemm"].registers <= 168


# --------------------------------------------------------------------------- errors


def test_kernel_before_allocate_smem_is_rejected() -> None:
    k = _kernel(GEMM)
    del k.attributes["smem_bytes"]
    with pytest.raises(TkcCodegenError, match="smem_bytes"):
        kernel_to_llvm(k)


def test_unplaced_shared_tile_is_an_error_with_its_location() -> None:
    text = GEMM.read_text().replace("hopper.smem_alloc {offset = 0}", "hopper.smem_alloc {offset = -1}")
    with pytest.raises(TkcCodegenError, match="allocate-smem") as e:
        kernel_to_llvm(parse_module(text, "g.tkir").kernel())
    assert e.value.loc is not None and e.value.loc.line == 16


def test_only_sm_90a() -> None:
    with pytest.raises(TkcCodegenError, match="sm_90a"):
        kernel_to_llvm(_kernel(GEMM), "sm_100a")
