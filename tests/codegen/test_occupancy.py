"""Programs an SM (tkc.codegen.occupancy): the residency arithmetic, the directive edit, which
kernels get the choice, and the choice itself, with a stand-in ptxas and with the real one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tkc.codegen import occupancy
from tkc.codegen.ptxas import Assembled, ResourceUsage
from tkc.target import target
from tkc.compiler import compile_kernel
from tkc.errors import TkcCodegenError
from tkc.pins import Options
from tkc.registers import entry_registers

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
    """Stands in for ptxas: a kernel that needs ``need`` registers, ptxas's own choice taking
    ``own`` (no ``.minnctapersm`` above 1); keeps every PTX it is asked about."""

    def __init__(self, own: int, need: int, spills_first: bool = False):
        self.own, self.need, self.spills_first, self.seen = own, need, spills_first, []

    def __call__(self, ptx: str) -> Assembled:
        self.seen.append(ptx)
        ctas = int(re.search(r"\.minnctapersm (\d+)", ptx).group(1))
        if ctas == 1:
            return _result(self.own, spills=8 if self.spills_first else 0)
        cap = entry_registers(128, ctas, SM90)
        return _result(min(cap, self.own), spills=0 if cap >= self.need else 8)


@pytest.mark.parametrize("probes", [2, 3, 8])
@pytest.mark.parametrize("own, need, want", [
    (96, 56, 9),     # layernorm.tk: 96 registers, five programs; at 56 (nine) nothing spills
    (168, 72, 7),    # layernorm_split.tk
    (149, 96, 5),    # layernorm_residual.tk
    (46, 32, 16),    # the decode combine: as many as the SM holds
    (64, 64, 8),     # ptxas's own choice needs every register it took: fits at its own count only
])
def test_the_most_programs_ptxas_fits_without_spilling(own, need, want, probes):
    ptxas = _Ptxas(own, need)
    ctas, ptx, got = occupancy.most_programs(PTX, "k", 128, 512, SM90, ptxas, probes=probes)
    if occupancy.resident(own, 128, 512, SM90) >= want:
        assert ctas is None and ptx == PTX and got.kernels["k"].registers == own
    else:
        assert ctas == want and f".minnctapersm {want}\n" in ptx and got.kernels["k"].spills == 0
    assert len(ptxas.seen) <= 1 + 4 * probes  # bisected, not every cap in turn


def test_one_round_of_probes_beside_ptxas_own_choice_when_there_are_enough():
    # 128 threads: 11 register caps from 2 to 16 programs; 11 probes ask them all at once.
    ptxas = _Ptxas(96, 56)
    assert occupancy.most_programs(PTX, "k", 128, 512, SM90, ptxas, probes=12)[0] == 9
    assert len(ptxas.seen) == 1 + 11


@pytest.mark.parametrize("threads, smem", [
    (1024, 0),        # two 1024-thread CTAs fill the SM's warps: no cap gives more
    (128, 120_000),   # shared memory holds one
])
def test_nothing_raised_where_nothing_more_can_fit(threads, smem):
    ptxas = _Ptxas(32, 32)
    assert occupancy.most_programs(PTX.replace("128", str(threads)), "k", threads, smem, SM90, ptxas,
                                   probes=2)[0] is None


def test_a_kernel_that_spills_already_keeps_ptxas_own_choice():
    ptxas = _Ptxas(255, 255, spills_first=True)
    ctas, ptx, got = occupancy.most_programs(PTX, "k", 128, 512, SM90, ptxas, probes=2)
    assert ctas is None and ptx == PTX and got.kernels["k"].spills


def test_layernorm_compiles_to_the_most_programs_ptxas_fits(ptxas):
    pinned = compile_kernel(EXAMPLES / "layernorm.tk", {"ctas_per_sm": 1}, cache=False)
    chosen = compile_kernel(EXAMPLES / "layernorm.tk", {}, cache=False)
    assert ".minnctapersm 1\n" in pinned.asm["ptx"]
    n = chosen.programs_per_sm
    assert n > pinned.programs_per_sm
    assert f".minnctapersm {n}\n" in chosen.asm["ptx"] and f'"nvvm.minctasm"="{n}"' in chosen.asm["llvm"]
    assert chosen.resources.spill_stores == chosen.resources.spill_loads == 0
    # one more program an SM spills
    from tkc.codegen.ptxas import assemble

    more = assemble(occupancy.with_min_ctas(chosen.asm["ptx"], n + 1), target("sm_90a")).kernels["layernorm"]
    assert more.spills or occupancy.resident(more.registers, 128, 0, SM90) <= n
    # Asking for the PTX alone makes the same choice when ptxas is there.
    assert compile_kernel(EXAMPLES / "layernorm.tk", {}, stop="ptx", cache=False).asm["ptx"] == chosen.asm["ptx"]


def test_persistent_grids_are_left_to_ptxas():
    # grid(num_sms()): one program an SM whatever fits; the retry on more warps where such a
    # kernel spills still applies
    kernel = compile_kernel(EXAMPLES / "reducescatter.tk", {}, stop="hopper", cache=False).kernel_op
    assert occupancy.one_program_an_sm(kernel) and _applies("reducescatter.tk")
    assert not occupancy.one_program_an_sm(compile_kernel(EXAMPLES / "layernorm.tk", {}, stop="hopper",
                                                          cache=False).kernel_op)


def test_a_persistent_kernel_that_spills_still_gets_more_warps(ptxas):
    src = """
@kernel
def rows(x: bf16[M, N], y: bf16[M, N], BN: const = 32768):
    grid(num_sms())
    for j in range(cdiv(M, num_sms())):
        r = j * num_sms() + program_id(0)
        t = load(x[r:r+1, 0:BN], other=-inf).to(f32)
        e = exp(t - t.max(1)[:, None])
        y[r:r+1, 0:BN] = (e * (1.0 / e.sum(1))[:, None]).to(bf16)
"""
    k = compile_kernel(src, {}, cache=False)
    assert k.threads > 128 and not k.resources.spills


def test_kernels_left_as_ptxas_first_makes_them(ptxas):
    gemm = compile_kernel(EXAMPLES / "gemm.tk", {}, cache=False)
    assert ".minnctapersm 1\n" in gemm.asm["ptx"] and gemm.programs_per_sm == 1
    # Its PTX alone needs no ptxas: nothing is chosen from ptxas's answer.
    assert compile_kernel(EXAMPLES / "gemm.tk", {}, stop="ptx", cache=False).resources is None
    # A 64k-column softmax row in 256 threads spills at 255 registers: no lower cap is tried.
    wide = compile_kernel(EXAMPLES / "softmax.tk", {"BN": 65536, "warps": 8}, cache=False)
    assert ".minnctapersm 1\n" in wide.asm["ptx"] and wide.resources.spill_stores > 0
