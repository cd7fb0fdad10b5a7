"""Programs an SM (tkc.codegen.occupancy): the residency arithmetic, the directive edit, which
kernels get the choice, and the choice itself, with a stand-in ptxas and with the real one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tkc.codegen import occupancy
from tkc.codegen.ptxas import Assembled, ResourceUsage
from tkc.target import target
from tkc.compiler import compile_kernel
from tkc.errors import TkcCodegenError
from tkc.pins import Options

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SM90 = target("sm_90a")


@pytest.mark.parametrize("registers, threads, smem, want", [
    (128, 128, 512, 4),     # LayerNorm's 4-warp program as ptxas first makes it
    (96, 128, 512, 5),      # ... capped by .minnctapersm 5
    (168, 128, 512, 3),
    (255, 128, 0, 2),       # 255 is allocated as 256 a thread
    (127, 512, 1024, 1),
    (64, 512, 0, 2),
    (32, 1024, 0, 2),       # 64 warps an SM
    (16, 32, 0, 32),        # 32 CTAs an SM
    (168, 384, 229440, 1),  # the GEMM: shared memory and registers both allow one
    (24, 128, 100_000, 2),  # shared memory alone
])
def test_resident(registers, threads, smem, want):
    assert occupancy.resident(registers, threads, smem, SM90) == want


PTX = """.visible .entry k(
\t.param .u64 k_param_0
)
.maxntid 128
.minnctapersm 1
{
\tret;
}
"""


def test_with_min_ctas_sets_the_directive_and_the_attribute():
    assert ".minnctapersm 5\n" in occupancy.with_min_ctas(PTX, 5)
    assert ".maxntid 128" in occupancy.with_min_ctas(PTX, 5)
    llvm = 'define ptx_kernel void @"k"(i32 %"a") "nvvm.maxntid"="128" "nvvm.minctasm"="1"'
    assert occupancy.with_min_ctas(llvm, 3, "llvm").endswith('"nvvm.minctasm"="3"')


@pytest.mark.parametrize("text", [PTX.replace(".minnctapersm 1\n", ""), PTX + ".minnctapersm 2\n"])
def test_with_min_ctas_wants_exactly_one_directive(text):
    with pytest.raises(TkcCodegenError, match="found [02]"):
        occupancy.with_min_ctas(text, 2)


def _applies(example: str, **consts) -> bool:
    kernel = compile_kernel(EXAMPLES / example, consts, stop="hopper", cache=False).kernel_op
    return occupancy.applies(kernel, Options.from_consts(kernel.attributes["consts"]))


def test_applies_to_kernels_without_products_only():
    assert _applies("layernorm.tk")
    assert _applies("softmax.tk", BN=1024)
    assert not _applies("layernorm.tk", ctas_per_sm=1)  # pinned: left alone
    assert not _applies("gemm.tk")
    assert _applies("softmax_split.tk", BN=1024, cluster=2)  # a row over a cluster
    assert not _applies("softmax_split.tk", BN=1024, cluster=2, ctas_per_sm=3)


def _result(registers: int, spills: int = 0) -> Assembled:
    usage = ResourceUsage("k", registers=registers, spill_stores=spills, spill_loads=spills)
    return Assembled(b"", "sm_90a", Path("ptxas"), "", {"k": usage})


class _Ptxas:
    """Stands in for ptxas: answers each assembly with the next result and keeps the PTX."""

    def __init__(self, *results: Assembled):
        self.results, self.seen = list(results), []

    def __call__(self, ptx: str) -> Assembled:
        self.seen.append(ptx)
        return self.results.pop(0)


def test_one_more_program_when_ptxas_fits_it_without_spilling():
    ptxas = _Ptxas(_result(96))
    got = occupancy.one_more_program(PTX, "k", 128, 512, _result(128), SM90, ptxas)
    assert got is not None
    ctas, ptx, second = got
    assert ctas == 5 and ".minnctapersm 5" in ptx and ptxas.seen == [ptx]
    assert second.kernels["k"].registers == 96


@pytest.mark.parametrize("second", [_result(96, spills=8), _result(112)])
def test_no_more_programs_when_the_cap_spills_or_does_not_fit(second):
    # 112 registers still leave four 128-thread CTAs an SM: nothing gained, the first stays.
    assert occupancy.one_more_program(PTX, "k", 128, 512, _result(128), SM90, _Ptxas(second)) is None


@pytest.mark.parametrize("first, threads, smem", [
    (_result(128, spills=4), 128, 512),  # spills already: ptxas is not asked again
    (_result(32), 1024, 0),              # two 1024-thread CTAs fill the SM's warps
    (_result(40), 128, 120_000),         # shared memory holds one
])
def test_no_second_assembly_when_nothing_can_fit(first, threads, smem):
    ptxas = _Ptxas()
    assert occupancy.one_more_program(PTX, "k", threads, smem, first, SM90, ptxas) is None
    assert ptxas.seen == []


def test_layernorm_compiles_to_one_more_program(ptxas):
    pinned = compile_kernel(EXAMPLES / "layernorm.tk", {"ctas_per_sm": 1}, cache=False)
    chosen = compile_kernel(EXAMPLES / "layernorm.tk", {}, cache=False)
    assert ".minnctapersm 1\n" in pinned.asm["ptx"]
    n = chosen.programs_per_sm
    assert n >= pinned.programs_per_sm + 1
    # Its masked sides (rows shorter than their block) raise ptxas's own count, not what the
    # kernel needs: it gets one more program than ptxas first gives the kernel without them.
    from tkc.codegen.lower import kernel_to_llvm
    from tkc.codegen.ptxas import assemble
    from tkc.codegen.target import emit_ptx

    sm90 = target("sm_90a")
    op = chosen.kernel_op
    op.attributes["consts"] = {**op.attributes["consts"], "ctas_per_sm": 1}
    plain = assemble(emit_ptx(str(kernel_to_llvm(op, sm90, masked_sides=False)), sm90), sm90).kernels["layernorm"]
    smem = (op.attributes.get("smem_bytes") or 0) + plain.smem
    assert n == occupancy.resident(plain.registers, op.attributes["threads"], smem, sm90) + 1
    assert f".minnctapersm {n}\n" in chosen.asm["ptx"] and f'"nvvm.minctasm"="{n}"' in chosen.asm["llvm"]
    assert chosen.resources.spill_stores == chosen.resources.spill_loads == 0
    # Asking for the PTX alone makes the same choice when ptxas is there.
    assert compile_kernel(EXAMPLES / "layernorm.tk", {}, stop="ptx", cache=False).asm["ptx"] == chosen.asm["ptx"]


def test_kernels_left_as_ptxas_first_makes_them(ptxas):
    gemm = compile_kernel(EXAMPLES / "gemm.tk", {}, cache=False)
    assert ".minnctapersm 1\n" in gemm.asm["ptx"] and gemm.programs_per_sm == 1
    # Its PTX alone needs no ptxas: nothing is chosen from ptxas's answer.
    assert compile_kernel(EXAMPLES / "gemm.tk", {}, stop="ptx", cache=False).resources is None
    # A 64k-column softmax row in 256 threads spills at 255 registers: no lower cap is tried.
    wide = compile_kernel(EXAMPLES / "softmax.tk", {"BN": 65536, "warps": 8}, cache=False)
    assert ".minnctapersm 1\n" in wide.asm["ptx"] and wide.resources.spill_stores > 0
