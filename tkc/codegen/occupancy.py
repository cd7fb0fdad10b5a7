"""Programs an SM: how many of a kernel's CTAs one SM holds, and the register cap that fits
one more where ptxas left room for fewer.

A kernel without products (softmax, LayerNorm) keeps its rows in registers, and ptxas, given
``.maxntid T`` and ``.minnctapersm 1``, takes up to 255 registers a thread: a 4-warp LayerNorm
program over 4096 columns took 128 and four shared an SM, at 8192 columns 255 and two (before
its weight rows were deferred to its store and its row kept packed, tkc/codegen/deferred.py:
now 80 and 167).
Fewer programs an SM means fewer bytes in flight for a kernel that waits on DRAM, and capping the
registers so that one more program fits (``.minnctapersm k + 1``) moved LayerNorm from 0.92x to
0.98x of copy bandwidth at 4096 columns and, in 8k-column blocks, from 0.84x to 0.93x at 16384
on an H100 (benchmarks/RESULTS.md), as long as ptxas met the cap without spilling.  It is not
free everywhere: two two-sweep configurations, which re-read each row through L2, lost 6.3% and
3.7% of the eight measured (more rows in flight than L2 keeps); the row length is a runtime size,
so one compiled kernel serves both kinds of row, and the pin ``ctas_per_sm = 1`` restores
ptxas's own choice.

:func:`one_more_program` is that choice, made once ptxas has assembled the kernel as LLVM wrote
it: it applies to kernels whose ``ctas_per_sm`` is not pinned and that have no products, TMA
copies or warp roles (those budget registers and shared memory for ``ctas_per_sm`` in the
passes themselves); it asks ptxas once more with the directive raised and keeps the result only
when nothing spills and the SM really holds one more program.  Rows split over a cluster
(``cluster_sum``, ``cluster_max``) take it too: softmax_split.tk's 16k-column part of a 64k row
went from two programs an SM to three and from 0.85x to 0.93x of copy bandwidth on an H100
(``benchmarks/occupancy_compare.py``, benchmarks/RESULTS.md).

Must not: choose anything for kernels the passes budgeted, or keep a cubin that spills.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tkc.errors import TkcCodegenError
from tkc.ir.core import Operation
from tkc.pins import Options
from tkc.registers import ctas_by_registers
from tkc.target import Target

#: Ops whose kernels budget registers and shared memory per ``ctas_per_sm`` in the passes.
BUDGETED_OPS = frozenset({"hopper.wgmma", "hopper.tma_load", "hopper.role"})


def resident(registers: int, threads: int, smem_bytes: int, target: Target) -> int:
    """CTAs of ``threads`` threads using ``registers`` a thread and ``smem_bytes`` of shared
    memory (dynamic and static) that one SM holds at once."""
    warps = -(-threads // target.warp_size)
    return max(min(ctas_by_registers(registers, threads, target), target.max_warps_per_sm // warps,
                   target.max_ctas_per_sm, target.programs_by_smem(smem_bytes)), 0)


def applies(kernel: Operation, options: Options) -> bool:
    """Whether the programs an SM are left to :func:`one_more_program`: ``ctas_per_sm`` not
    pinned, and no op whose pass budgets for it."""
    return options.ctas_per_sm is None and not any(op.name in BUDGETED_OPS for op in kernel.walk())


_PTX_DIRECTIVE = re.compile(r"^(\s*\.minnctapersm\s+)\d+(\s*)$", re.MULTILINE)
_LLVM_ATTRIBUTE = re.compile(r'("nvvm\.minctasm"=")\d+(")')


def with_min_ctas(text: str, ctas: int, stage: str = "ptx") -> str:
    """``text`` (one kernel's PTX, or its LLVM IR with ``stage="llvm"``) with its minimum CTAs
    an SM (``.minnctapersm``, ``"nvvm.minctasm"``) set to ``ctas``."""
    rx = _PTX_DIRECTIVE if stage == "ptx" else _LLVM_ATTRIBUTE
    found = rx.findall(text)
    if len(found) != 1:
        raise TkcCodegenError(f"expected the kernel's {stage} to set its minimum CTAs an SM once, "
                              f"found {len(found)}")
    return rx.sub(lambda m: f"{m.group(1)}{ctas}{m.group(2)}", text)


def one_more_program(ptx: str, name: str, threads: int, smem_bytes: int, first: Any, target: Target,
                     assemble: Callable[[str], Any]) -> tuple[int, str, Any] | None:
    """The programs an SM, the PTX and ptxas's result with ``.minnctapersm`` raised to one more
    program than ``first`` (ptxas's result for ``ptx``) fits, or None when no more fit (threads,
    CTAs or shared memory), ptxas spills at that cap, or the SM still holds no more programs."""
    usage = first.kernels.get(name)
    if usage is None or usage.spills:
        return None  # a kernel that spills already would spill more under a lower cap
    now = resident(usage.registers, threads, smem_bytes + usage.smem, target)
    got = at_least(ptx, name, threads, smem_bytes, now + 1, first, target, assemble) if now >= 1 else None
    return None if got is None else (now + 1, *got)


def at_least(ptx: str, name: str, threads: int, smem_bytes: int, ctas: int, current: Any, target: Target,
             assemble: Callable[[str], Any]) -> tuple[str, Any] | None:
    """The PTX and ptxas's result with ``.minnctapersm`` set to ``ctas``, where ``current``
    (ptxas's result for ``ptx``) holds fewer and ptxas meets the cap without spilling; else
    None."""
    usage = current.kernels.get(name)
    if usage is None or usage.spills:
        return None
    smem = smem_bytes + usage.smem
    if resident(usage.registers, threads, smem, target) >= ctas or resident(1, threads, smem, target) < ctas:
        return None
    raised = with_min_ctas(ptx, ctas)
    got = assemble(raised)
    usage = got.kernels.get(name)
    if usage is None or usage.spills or resident(usage.registers, threads, smem, target) < ctas:
        return None
    return raised, got
