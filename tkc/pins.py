"""Pins: compile-time choices a kernel may fix instead of leaving them to the passes.

A pin is set like any constant (``-D stages=3``, ``gemm(a, b, c, stages=3)``, or declared
as a kernel parameter ``stages: const = 3``) and lands in the kernel's ``consts``, where the
pass that would otherwise choose reads it, so the choice shows in every IR dump.  This module
only names the pins and checks their values; each pass owns its own use of them.
"""

from __future__ import annotations

from tkc.errors import Loc, TkcUsageError

#: name -> (type, what it fixes, which pass reads it)
PINS: dict[str, tuple[type, str, str]] = {
    "stages": (int, "stages of every TMA ring (1: no ring)", "pipeline-loops"),
    "warp_specialize": (bool, "a producer warpgroup issues the copies", "specialize-warps"),
    "warps": (int, "warps per program of a kernel without products, a multiple of 4 (default 4: one "
                   "warpgroup); wide rows spread over more threads stay in registers", "select-layouts"),
    "ctas_per_sm": (int, "programs resident on one SM at once: registers (.minnctapersm) and shared memory "
                         "are budgeted for that many, so one program's fill and drain overlap another's work "
                         "(default 1; a kernel without products: one more than ptxas first fits, where that "
                         "does not spill)", "pipeline-loops, specialize-warps, allocate-smem, codegen"),
    "consumers": (int, "warpgroups computing the products: their rows / 64 (the default), or rows / (64 S) for "
                       "S = 2 to 4, each warpgroup then issuing S 64-row wgmmas a K step into independent "
                       "accumulators",
                  "select-layouts, specialize-warps"),
    "pingpong": (bool, "two consumer warpgroups take turns issuing wgmmas (default: off)", "specialize-warps"),
    "issue_ahead": (bool, "a loop's first product is issued an iteration early, during the rest of the "
                          "previous iteration (default: off; with pingpong its turn moves with it)", "issue-ahead"),
    "defer_last": (bool, "a loop's last product is issued in the next iteration, right after its first, and "
                         "runs during that iteration's register work (default: off; not with issue_ahead)",
                   "defer-last"),
    "persistent": (bool, "one program per SM (per slot, with ctas_per_sm) walks the output tiles", "persistent"),
    "cluster": (int, "programs per cluster, 1, 2 or 4 (a persistent GEMM-shaped kernel): the programs of a "
                     "cluster take tiles of one column, and each copy they share (a GEMM's B tiles) is read "
                     "once and multicast into all of them (default 1)", "persistent, multicast"),
    "tma_store": (bool, "a product's result is stored by TMA from a shared tile, which drains while the "
                        "next tile computes (false: each thread stores its values)", "lower-to-hopper"),
    "tma": (bool, "tiles feeding @ are copied by TMA (false: every thread loads its part and "
                  "stores it to shared memory, for tensors whose strides TMA cannot take)", "select-layouts"),
    "prefetch": (int, "loads in a loop fetch the box they read that many iterations ahead into L2 (thread 0, one "
                      "bulk request a row; default 0: none)", "prefetch-loads"),
    "wait_timeout_ms": (int, "a debugging aid: every mbarrier wait that has not passed after this many "
                             "milliseconds prints its source line, CTA, thread, barrier and parity, and stops "
                             "the kernel (a hang becomes a launch error; default: off, and on it serializes "
                             "wgmmas around the check)", "codegen"),
}


def check_pins(consts: dict[str, object], loc: Loc | None = None) -> None:
    """Every pin in ``consts`` has a value of its type (and a positive count)."""
    for name, value in consts.items():
        if name not in PINS:
            continue
        want = PINS[name][0]
        least = 0 if name in _ZERO_MEANS_OFF else 1
        ok = isinstance(value, bool) if want is bool else (
            isinstance(value, int) and not isinstance(value, bool) and value >= least)
        if not ok:
            expected = "true or false" if want is bool else "a positive integer" if least else "an integer >= 0"
            raise TkcUsageError(f"pin {name} = {value!r}: expected {expected}", loc)


#: Count pins whose 0 turns their pass off.
_ZERO_MEANS_OFF = frozenset({"prefetch"})


#: The CTAs a cluster may have (portable sizes that divide the 132 SMs' pairs evenly).
CLUSTER_SIZES = (1, 2, 4)


def cluster_size(consts: dict[str, object] | None, loc: Loc | None = None) -> int:
    """The ``cluster`` pin of a kernel's constants (1 when unpinned), checked."""
    value = (consts or {}).get("cluster", 1)
    check_pins({"cluster": value}, loc)
    if value not in CLUSTER_SIZES:
        raise TkcUsageError(f"pin cluster = {value}: a cluster has 1, 2 or 4 programs", loc)
    return value


def ctas_per_sm(consts: dict[str, object] | None) -> int:
    """The ``ctas_per_sm`` pin of a kernel's constants (1 when unpinned), checked like every
    pin (IR written by hand reaches the passes and codegen without the frontend's check)."""
    value = (consts or {}).get("ctas_per_sm", 1)
    check_pins({"ctas_per_sm": value})
    return value
