"""Pins: compile-time choices a kernel may fix instead of leaving them to the passes.

A pin is set like any constant (``-D stages=3``, ``gemm(a, b, c, stages=3)``, or declared
as a kernel parameter ``stages: const = 3``) and lands in the kernel's ``consts``, so the choice
shows in every IR dump.  :class:`Options` declares every pin once (its type, its default, what
it fixes, which passes read it); the pipeline builds one ``Options`` from a kernel's ``consts``
(:meth:`Options.from_consts`, which checks every value) and hands it to each pass, which reads
``options.stages`` and never the ``consts`` dictionary.  A pin whose default is "the pass
chooses" is ``None`` when unset.  This module only declares the pins and checks their values;
each pass owns its own use of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from tkc.errors import Loc, TkcUsageError
from tkc.registers import SETMAXNREG_MAX, SETMAXNREG_MIN, setmaxnreg_budget
from tkc.target import DEFAULT_TARGET, Target


def _pin(default: object, kind: type, what: str, readers: str) -> Any:
    """A field of :class:`Options`: its default, its type (a ``None`` default means unset),
    what it fixes, which passes read it."""
    return field(default=default, metadata={"kind": kind, "what": what, "readers": readers})


@dataclass(frozen=True)
class Options:
    """The pins of one compilation, typed, with their defaults: hashable, part of the cache key.

    ``None`` means unpinned where the pass chooses for itself.
    """

    stages: int | None = _pin(None, int, "stages of every TMA ring (1: no ring)", "pipeline-loops")
    outer_stages: int | None = _pin(
        None, int, "stages of a ring in a loop around another ring (a persistent program's Q tile, copied once a "
                   "tile around the K/V ring): 2 lets the next tile's copy land during this tile's loop, 1 keeps its "
                   "address fixed through the loop (default 2 where shared memory allows)", "pipeline-loops")
    warp_specialize: bool = _pin(True, bool, "a producer warpgroup issues the copies", "specialize-warps")
    warps: int | None = _pin(None, int, "warps per program of a kernel without products, a multiple of 4 (default 4: "
                                        "one warpgroup, or 8 or 16 where ptxas spills it on 4); wide rows spread "
                                        "over more threads stay in registers",
                             "select-layouts")
    ctas_per_sm: int | None = _pin(
        None, int, "programs resident on one SM at once: registers (.minnctapersm) and shared memory are budgeted "
                   "for that many, so one program's fill and drain overlap another's work (default 1; a kernel "
                   "without products: one more than ptxas first fits, where that does not spill)",
        "pipeline-loops, specialize-warps, allocate-smem, codegen")
    consumers: int | None = _pin(
        None, int, "warpgroups computing the products: their rows / 64 (the default), or rows / (64 S) for S = 2 "
                   "to 4, each warpgroup then issuing S 64-row wgmmas a K step into independent accumulators",
        "select-layouts, specialize-warps")
    transpose_in_producer: bool = _pin(True, bool, "an 8-bit tile the consumers would transpose in shared memory "
                                                   "each iteration (FP8 attention's V) is transposed by the producer "
                                                   "warpgroup into a ring of its own (false: by the consumers)",
                                       "transpose-in-producer")
    pingpong: bool = _pin(False, bool, "two consumer warpgroups take turns issuing wgmmas (default: off)",
                          "specialize-warps")
    issue_ahead: bool = _pin(False, bool, "a loop's first product is issued an iteration early, during the rest "
                                          "of the previous iteration (default: off; with pingpong its turn moves "
                                          "with it)", "issue-ahead")
    defer_last: bool = _pin(False, bool, "a loop's last product is issued in the next iteration, right after its "
                                         "first, and runs during that iteration's register work (default: off; "
                                         "not with issue_ahead)", "defer-last")
    overlap_products: bool = _pin(False, bool, "a product's wait moves down to the first op that needs its result, so "
                                               "independent products run together and an accumulation runs during "
                                               "the work after it (default: off)", "overlap-products")
    refill_first: bool = _pin(True, bool, "a ring whose copies the computing warpgroups issue themselves (no producer "
                                          "warpgroup) is refilled first in each iteration, so the copies land while it "
                                          "computes (false: last, behind the iteration's own releases)",
                              "pipeline-loops")
    persistent: bool | None = _pin(None, bool, "one program per SM (per slot, with ctas_per_sm) walks the output "
                                               "tiles", "persistent")
    longest_first: bool | None = _pin(
        None, bool, "programs launched one a tile whose loop runs longer the later their row (a causal forward) "
                    "start longest first, in groups of about an SM's count of programs (a few columns, rows from "
                    "the last): on from 16 rows a column (default); true also where the first rows run longer "
                    "(groups across columns); false keeps the grid's order", "persistent")
    cluster: int = _pin(1, int, "programs per cluster, 1, 2 or 4 (a persistent GEMM-shaped kernel): the programs "
                                "of a cluster take tiles of one column, and each copy they share (a GEMM's B tiles) "
                                "is read once and multicast into all of them (default 1)", "persistent, multicast")
    overlap_epilogue: bool = _pin(
        False, bool, "sm_100a: a persistent GEMM's MMAs are issued by the producer's thread into one of two "
                     "accumulators in tensor memory, so a tile's epilogue runs while the next tile multiplies "
                     "(default: off until measured on a Blackwell GPU: the epilogue's warpgroups issue them "
                     "into one)", "overlap-epilogue")
    cta_pairs: bool = _pin(False, bool, "sm_100a: the two programs of a cluster issue one tcgen05 MMA of 256 rows "
                                        "together (cta_group::2): each copies its own rows of A and half of B's "
                                        "columns, and the even one's thread multiplies for both (sets cluster = 2; "
                                        "default: off)", "persistent, multicast, pair-ctas")
    tma_store: bool = _pin(True, bool, "a product's result is stored by TMA from a shared tile, which drains while "
                                       "the next tile computes (false: each thread stores its values)",
                           "lower-to-hopper")
    tma: bool = _pin(True, bool, "tiles feeding @ are copied by TMA (false: every thread loads its part and "
                                 "stores it to shared memory, for tensors whose strides TMA cannot take)",
                     "select-layouts")
    tma_vectors: bool = _pin(False, bool, "a 1-D load along a read-only tensor's last axis in a loop that copies "
                                          "tiles by TMA is copied with them into shared memory (a ring stage), and "
                                          "each thread reads its values from there where the load was "
                                          "(attention backward's lse and delta; default: off)",
                             "lower-to-hopper, pipeline-loops")
    producer_regs: int | None = _pin(
        None, int, "registers each thread of a producer warpgroup keeps, a multiple of 8 from 24 to 256; the "
                   "consumers share the rest (default 24, or 40 where it also runs a multi-GPU kernel's waits or "
                   "barriers)",
        "specialize-warps")
    prefetch: int = _pin(0, int, "loads in a loop fetch the box they read that many iterations ahead into L2 "
                                 "(thread 0, one bulk request a row; default 0: none)", "prefetch-loads")
    stage_loads: int = _pin(0, int, "loads in a loop are copied that many iterations ahead into shared memory, "
                                    "each thread its own values (cp.async), and read from there where the load "
                                    "was (default 0: none)", "stage-loads")
    wait_timeout_ms: int | None = _pin(
        None, int, "a debugging aid: every mbarrier wait that has not passed after this many milliseconds prints "
                   "its source line, CTA, thread, barrier and parity, and stops the kernel (a hang becomes a "
                   "launch error; default: off, and on it serializes wgmmas around the check)", "codegen")

    @classmethod
    def from_consts(cls, consts: dict[str, object] | None, loc: Loc | None = None,
                    target: Target | None = None) -> Options:
        """The pins among a kernel's ``consts`` (other constants are left out), each checked
        (:func:`check_pins`, and the cluster's size and CTA pairs on ``target``; the default
        target's cluster sizes where none is given, for callers that read a pin the target does
        not change); a TkcUsageError at ``loc`` otherwise."""
        pins = {name: value for name, value in (consts or {}).items() if name in PINS}
        check_pins(pins, loc)
        regs = pins.get("producer_regs")
        if regs is not None and not setmaxnreg_budget(regs):
            raise TkcUsageError(f"pin producer_regs = {regs}: setmaxnreg takes a multiple of 8 from "
                                f"{SETMAXNREG_MIN} to {SETMAXNREG_MAX}", loc)
        if pins.get("cta_pairs"):
            if target is not None and target.mma != "tcgen05":
                raise TkcUsageError(f"pin cta_pairs = true: CTA pairs are tcgen05's (sm_100a); {target.name} has "
                                    f"none, drop the pin", loc)
            if pins.setdefault("cluster", 2) != 2:
                raise TkcUsageError(f"pin cta_pairs = true: a pair is a cluster of 2 programs, not "
                                    f"cluster = {pins['cluster']}", loc)
        sizes = (target or DEFAULT_TARGET).cluster_sizes
        if pins.get("cluster", 1) not in sizes:
            raise TkcUsageError(f"pin cluster = {pins['cluster']}: a cluster has "
                                f"{', '.join(map(str, sizes[:-1]))} or {sizes[-1]} programs", loc)
        return cls(**pins)

    @property
    def cluster_pin(self) -> str:
        """The pin that gave the kernel its cluster, as messages name it."""
        return "cta_pairs = true (a cluster of 2)" if self.cta_pairs else f"cluster = {self.cluster}"

    @property
    def programs_per_sm(self) -> int:
        """The programs an SM the passes and codegen budget for: the ``ctas_per_sm`` pin, 1 when
        unpinned."""
        return 1 if self.ctas_per_sm is None else self.ctas_per_sm


#: name -> (type, what it fixes, which pass reads it), in declaration order (``tkc pins``).
PINS: dict[str, tuple[type, str, str]] = {
    f.name: (f.metadata["kind"], f.metadata["what"], f.metadata["readers"]) for f in fields(Options)}


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
        most = _MOST.get(name)
        if most is not None and value > most:
            raise TkcUsageError(f"pin {name} = {value!r}: at most {most} ({_MOST_WHY[name]})", loc)
        if name == "warps" and value % 4:
            raise TkcUsageError(f"pin warps = {value}: a program runs whole warpgroups: give a multiple of 4", loc)


def check_kernel_pins(kernel: Any, loc: Loc | None = None) -> None:
    """What a ``tile.kernel``'s pins must agree with in the kernel itself, on every target: the
    pin ``warps`` is for kernels without products (a product's rows set the warps).  Checked
    by the frontend, so the interpreter refuses what no compilation would take, and by
    ``select-layouts`` for tile IR read from a file; at the product, else at ``loc``."""
    warps = (kernel.attributes.get("consts") or {}).get("warps")
    # (tile.is_product's ops, named here: the tile dialect imports this module)
    mma = next((op for op in kernel.walk() if op.name in ("tile.mma", "tile.dot_scaled")), None)
    if warps is not None and mma is not None:
        raise TkcUsageError(f"pin warps = {warps}: the pin sets the warps of kernels without products; this "
                            f"kernel's products of {mma.acc.type.shape[0]} rows set its own, so leave the pin out",
                            mma.loc or loc)


#: Count pins whose 0 turns their pass off.
_ZERO_MEANS_OFF = frozenset({"prefetch", "stage_loads"})
#: The largest value of count pins that a pass unrolls, allocates or counts with, and why.
_MOST = {"stages": 32, "outer_stages": 32, "prefetch": 64, "stage_loads": 7, "ctas_per_sm": 32,
         "wait_timeout_ms": 3_600_000, "warps": 32}
_MOST_WHY = {"stages": "a ring's stages each take shared memory",
             "outer_stages": "a ring's stages each take shared memory",
             "prefetch": "each iteration ahead is unrolled before the loop",
             "stage_loads": "a thread waits for its copies with cp.async.wait_group, which counts to 7",
             "ctas_per_sm": "an SM holds at most 32 programs", "wait_timeout_ms": "an hour",
             "warps": "a program has at most 1024 threads"}


#: The most CTAs any cluster has (CUDA's non-portable limit).  Where no target is at hand (the
#: frontend, the IR's verifier) a cluster is only checked to be a power of two up to this; which
#: sizes a target allows is ``Target.cluster_sizes``, checked by ``Options.from_consts``.
MAX_CLUSTER = 16


def is_cluster_size(n: object) -> bool:
    """Whether ``n`` can be the CTAs of a cluster on some target: a power of two up to 16."""
    return isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_CLUSTER and n & (n - 1) == 0
