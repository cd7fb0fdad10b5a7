"""Programs an SM: how many of a kernel's CTAs one SM holds, and the register cap that fits
the most of them without spilling.

A kernel without products (softmax, LayerNorm) keeps its rows in registers, and ptxas, given
``.maxntid T`` and ``.minnctapersm 1``, takes as many registers a thread as it likes: a 4-warp
LayerNorm program took 96 and five shared an SM.  Fewer programs an SM means fewer bytes in
flight for a kernel that waits on DRAM, and capping the registers (``.minnctapersm k``) so
that more programs fit moved LayerNorm from 0.92x to 0.98x of copy bandwidth at 4096 columns
on an H100, as long as ptxas met the cap without spilling.  On an H200, every such kernel
measured ran fastest, or within 1% of it, at the most programs ptxas fits without spilling
(LayerNorm 5 -> 9 programs: 3165 -> 3664 GB/s at 4096 columns, 1.21x over seven at 65536
columns in 8 sweeps; split LayerNorm 4 -> 7: 1.15x; the decode combine 12 -> 16: 1.10x;
benchmarks/RESULTS.md), so that is the choice.

:func:`most_programs` makes it once LLVM has written the kernel, for kernels whose
``ctas_per_sm`` is not pinned and that have no products, TMA copies or warp roles (those
budget registers and shared memory for ``ctas_per_sm`` in the passes themselves).  Each cap is
one ptxas run: the caps between ptxas's own choice and the SM's limit are bisected, a few runs
at a time, the first beside ptxas's own choice.  Rows split over a cluster (``cluster_sum``,
``cluster_max``) take it too; a grid of ``num_sms()`` programs (:func:`one_program_an_sm`) keeps
ptxas's own choice.  The pin ``ctas_per_sm = 1`` restores ptxas's own choice.

Must not: choose anything for kernels the passes budgeted, or keep a cubin that spills.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tkc.errors import TkcCodegenError
from tkc.ir.core import Operation
from tkc.pins import Options
from tkc.registers import ctas_by_registers, entry_registers
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
    """Whether the programs an SM are left to ptxas's answers (:func:`most_programs`, and the
    compiler's retry on more warps where a kernel spills): ``ctas_per_sm`` not pinned and no op
    whose pass budgets for it."""
    return options.ctas_per_sm is None and not any(op.name in BUDGETED_OPS for op in kernel.walk())


def one_program_an_sm(kernel: Operation) -> bool:
    """Whether the kernel's grid is ``num_sms()`` programs (``grid(num_sms())``, other extents
    1): one program an SM, so more programs an SM would fit for nothing."""
    grid = next((op for op in kernel.regions[0].block.ops if op.name == "tile.grid"), None)
    if grid is None or not grid.operands:
        return False
    owners = [getattr(v, "owner", None) for v in grid.operands]
    return owners[0] is not None and owners[0].name == "tile.num_sms" and all(
        o is not None and o.name == "tile.constant" and o.attributes.get("value") == 1 for o in owners[1:])


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


def _caps(threads: int, most: int, target: Target) -> list[int]:
    """The programs an SM to ask ptxas for, from 2 up to ``most``: one for each register cap
    they give (the largest count of each), fewest first."""
    by_cap: dict[int, int] = {}
    for k in range(2, most + 1):
        by_cap[entry_registers(threads, k, target)] = k
    return sorted(by_cap.values())


def _spread(window: range, n: int) -> list[int]:
    """``n`` indices of ``window`` that cut it into ``n + 1`` parts of about one size (all of
    it where it has no more than ``n``)."""
    if len(window) <= n:
        return list(window)
    return sorted({window[(j + 1) * len(window) // (n + 1)] for j in range(n)})


def _cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 2


def most_programs(ptx: str, name: str, threads: int, smem_bytes: int, target: Target,
                  assemble: Callable[[str], Any], probes: int | None = None) -> tuple[int | None, str, Any]:
    """``(programs, PTX, ptxas's result)`` with ``.minnctapersm`` raised to the most programs
    an SM ptxas fits without spilling, where that is more than ptxas's own choice for ``ptx``
    gives; else ``(None, ptx, ptxas's result for ptx)``.

    ``probes`` runs of ptxas at a time (default: the CPUs, 2 to 16).  Every cap below one that
    fits is taken to fit too, so the caps are bisected; the first probes run beside ptxas's
    own choice, so with 12 CPUs (128 threads: 11 caps) one round of ptxas runs decides."""
    probes = probes or max(2, min(16, _cpus()))
    caps = _caps(threads, resident(1, threads, smem_bytes, target), target)
    pool = ThreadPoolExecutor(max_workers=probes)
    asked: dict[int, Future] = {}

    def ask(indices: list[int]) -> None:
        for i in indices:
            if i not in asked:
                asked[i] = pool.submit(assemble, with_min_ctas(ptx, caps[i]))

    try:
        ask(_spread(range(len(caps)), probes - 1))
        own = assemble(ptx)
        usage = own.kernels.get(name)
        if usage is None or usage.spills:
            return None, ptx, own  # a kernel that spills already would spill more under a cap
        smem = smem_bytes + usage.smem
        now, most = resident(usage.registers, threads, smem, target), resident(1, threads, smem, target)
        # caps[: lo + 1] fit (ptxas's own choice holds as many), caps[hi:] spill or cannot fit
        lo = sum(k <= now for k in caps) - 1
        hi = sum(k <= most for k in caps)
        best = None
        while hi - lo > 1:
            if not any(lo < i < hi for i in asked):
                # the next cap up, and the rest of the window cut evenly: where one more
                # program is all that fits (or none), one round says so
                window = range(lo + 1, hi)
                ask(sorted({window[0], *_spread(window, probes - 1)}))
            for i in sorted(i for i in asked if lo < i < hi):
                got = asked[i].result()
                u = got.kernels.get(name)
                if u is not None and not u.spills and resident(u.registers, threads, smem, target) >= caps[i]:
                    if i > lo:
                        lo, best = i, (caps[i], got)
                else:
                    hi = min(hi, i)
            if lo >= hi:
                break  # ptxas fit a cap above one it spilled at: keep the most that fit
    finally:
        # ptxas runs asked for and not needed are let finish (they started beside the ones that
        # were: about as long), so that none outlives the compilation
        pool.shutdown(wait=True, cancel_futures=True)
    if best is None:
        return None, ptx, own
    return best[0], with_min_ctas(ptx, best[0]), best[1]
