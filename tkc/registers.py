"""The SM's register file and a CTA's share of it (PTX-FACTS §5), on a :class:`Target`.

A CTA of ``T`` threads declared with ``.maxntid T`` and ``.minnctapersm C`` is launched with
:func:`entry_registers` registers a thread, and that allocation is its pool for the kernel's
life: ``setmaxnreg.dec`` gives registers back to it and ``setmaxnreg.inc`` waits until it holds
what the warpgroup asks for.  Role budgets that add up to more than the pool do not fail; the
``.inc`` waits forever.  Where ``65536 / (T * C)`` is not a multiple of 8 the pool is smaller
than the CTA's share of the file (640 threads: 96 a thread, 61440 in all, not 65536), so budgets
are checked against the pool, never against the file.
"""

from __future__ import annotations

from typing import Any

from tkc.target import Target

#: Registers ptxas needs for one wgmma beyond its accumulator, counted against the kernel's
#: entry budget whatever the warpgroup's ``setmaxnreg`` budget: with 80 at entry (384 threads,
#: two CTAs an SM) ptxas 13 stopped with C7602 asking for 82 for a 56-register accumulator and
#: 90 for a 64-register one, and compiled a 48-register one.
WGMMA_EXTRA_REGISTERS = 26
#: ``setmaxnreg``'s budgets (PTX-FACTS §5): an immediate multiple of 8 from 24 to 256.
SETMAXNREG_MIN, SETMAXNREG_MAX = 24, 256


def setmaxnreg_budget(regs: object) -> bool:
    """Whether ``regs`` is a budget ``setmaxnreg`` takes."""
    return isinstance(regs, int) and not isinstance(regs, bool) and regs % 8 == 0 \
        and SETMAXNREG_MIN <= regs <= SETMAXNREG_MAX


def entry_registers(threads: int, ctas_per_sm: int, target: Target) -> int:
    """The per-thread register budget ptxas assumes at kernel entry for a CTA of ``threads``
    threads declared with ``.maxntid threads`` and ``.minnctapersm ctas_per_sm``: the register
    file split evenly, at most the target's 255, rounded down to a multiple of 8 (PTX-FACTS §5:
    168 for 384 threads and one CTA).  ``setmaxnreg`` moves a warpgroup's budget up or down from
    there."""
    return min(target.register_file // (threads * ctas_per_sm), target.max_registers) // 8 * 8


def register_pool(threads: int, ctas_per_sm: int, target: Target) -> int:
    """The registers a CTA holds from launch, which its warpgroups' budgets share."""
    return entry_registers(threads, ctas_per_sm, target) * threads


def ctas_by_registers(registers: int, threads: int, target: Target) -> int:
    """CTAs of ``threads`` threads at ``registers`` a thread that the register file holds at
    once: each warp takes ``registers`` a lane rounded up to the target's allocation unit, and a
    CTA's warps are dealt over the SM's sub-partitions (four, each a quarter of the file).  The
    inverse of :func:`entry_registers`'s split."""
    lanes, unit, parts = target.warp_size, target.register_unit, target.subpartitions
    warps = -(-threads // lanes)
    per_warp = -(-max(registers, 1) * lanes // unit) * unit
    return parts * (target.register_file // parts // per_warp) // warps


def role_budget_problem(kernel: Any, roles: list[Any], threads: int, ctas_per_sm: int,
                        target: Target) -> tuple[Any, str, bool] | None:
    """The first role whose register budget cannot be granted, why, and whether the message is
    about that role alone (else the kernel's roles together); None when all fit.  Each
    warpgroup keeps the entry budget until its role's ``setmaxnreg`` moves it, one warpgroup
    keeps one budget, and the budgets together must fit the pool, or ``setmaxnreg.inc`` waits
    forever for registers the others never give back."""
    entry = entry_registers(threads, ctas_per_sm, target)
    pool = register_pool(threads, ctas_per_sm, target)
    budget = [entry] * (threads // target.warpgroup)
    asked: dict[int, Any] = {}
    for r in roles:
        for g in range(r.first, min(r.first + r.warpgroups, len(budget))):
            if not r.regs:
                continue
            prev = asked.setdefault(g, r)
            if prev.regs != r.regs:
                return r, (f"warpgroup {g} runs role {prev.attributes['name']!r} with regs = {prev.regs} and "
                           f"role {r.attributes['name']!r} with regs = {r.regs}: one warpgroup keeps one "
                           f"register budget"), True
            budget[g] = r.regs
    total = target.warpgroup * sum(budget)
    if total <= pool:
        return None
    parts = [f"{r.attributes['name']!r} {r.warpgroups} x 128 threads x {r.regs or entry}" for r in roles]
    rest = len(budget) - len({g for r in roles for g in range(r.first, r.first + r.warpgroups)})
    if rest:
        parts.append(f"{rest} warpgroup{'s' if rest > 1 else ''} in no role x 128 threads x {entry}")
    return roles[0], (f"kernel @{kernel.attributes['sym_name']}: roles need {total} registers, the CTA holds "
                      f"{pool} ({threads} threads x {entry} at entry; roles " + " + ".join(parts) +
                      "; regs = 0 keeps the entry budget): setmaxnreg.inc would wait forever"), False
