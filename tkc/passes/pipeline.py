"""The pass registry and the default pipelines, as data.

This module only names things: which function runs for each pass name, and
which passes run by default, in order.  It does not run passes (that is
``manager.py``) and holds no pass logic (one file per pass next to it).
Read it top to bottom to see what ``tkc compile`` does to a kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tkc.ir.core import Module, Operation
from tkc.passes.allocate_smem import allocate_smem
from tkc.passes.buffer_operands import buffer_operands
from tkc.passes.canonicalize import canonicalize
from tkc.passes.count_divisions import count_divisions
from tkc.passes.cse import cse
from tkc.passes.dce import dce
from tkc.passes.decompose import decompose
from tkc.passes.defer_last import defer_last
from tkc.passes.issue_ahead import issue_ahead
from tkc.passes.licm import licm
from tkc.passes.lower_to_blackwell import lower_to_blackwell
from tkc.passes.overlap_epilogue import overlap_epilogue
from tkc.passes.pair_ctas import pair_ctas
from tkc.passes.lower_to_hopper import lower_to_hopper
from tkc.passes.merge_barriers import merge_barriers
from tkc.passes.merge_reductions import merge_reductions
from tkc.passes.merge_steps import merge_steps
from tkc.passes.multicast import multicast
from tkc.passes.order_memory import order_memory
from tkc.passes.overlap_products import overlap_products
from tkc.passes.persistent import persistent
from tkc.passes.pipeline_loops import pipeline_loops
from tkc.passes.prefetch_loads import prefetch_loads
from tkc.passes.stage_loads import stage_loads
from tkc.passes.select_layouts import select_layouts
from tkc.passes.specialize_warps import specialize_warps
from tkc.passes.transpose_in_producer import transpose_in_producer
from tkc.pins import Options
from tkc.target import Target

#: A pass: it mutates the module in place, reading the kernel's pins and the target it
#: compiles for (never naming an architecture), and raises a TkcError when the input is
#: outside what it handles.  The target-independent cleanups take both as ``*_`` and read
#: neither.
PassFn = Callable[[Module, Options, Target], None]

#: Every pass by its pipeline name.
PASSES: dict[str, PassFn] = {
    # --- target-independent cleanups on tile IR
    "canonicalize": canonicalize,  # fold constants, simplify identities, acc += a @ b
    "licm": licm,                  # hoist loop-invariant pure ops out of tile.for
    "cse": cse,                    # merge identical pure ops
    "dce": dce,                    # drop pure/readonly ops (and loop results) nobody uses
    # --- on the way to a target: ops it does not render become simpler ones
    "decompose": decompose,              # sigmoid, erf, log1p, expm1, x ** y, mean -> simpler tile ops
    "merge-steps": merge_steps,          # x[:, 0:D:2] and x[:, 1:D:2] -> one access of x[:, 0:D]
    # --- to hopper IR (a Target with warpgroup MMA and TMA), in the order they run (docs/hopper.md)
    "persistent": persistent,            # GEMM-shaped kernels: one program per SM walks the tiles
    "order-memory": order_memory,        # a loop's loads before its first product, outputs before accumulations
    "select-layouts": select_layouts,    # smem/register layouts on every tile, conversions
    "lower-to-hopper": lower_to_hopper,  # TMA + mbarriers, wgmma, per-thread loads/stores, reductions
    "pipeline-loops": pipeline_loops,    # TMA copies in loops -> S-stage rings (full/empty mbarriers)
    "specialize-warps": specialize_warps,  # a producer warpgroup issues the copies, consumers compute
    "transpose-in-producer": transpose_in_producer,  # an 8-bit V transposed by the producer, into a ring
    "issue-ahead": issue_ahead,          # pin issue_ahead: a loop's first product issued an iteration early
    "defer-last": defer_last,            # pin defer_last: a loop's last product issued in the next iteration
    "overlap-products": overlap_products,  # pin overlap_products: each product waited for where it is needed
    "multicast": multicast,              # pin cluster: copies a cluster's CTAs share are read once, multicast
    "prefetch-loads": prefetch_loads,    # pin prefetch: a loop's loads fetch a later iteration's box into L2
    "stage-loads": stage_loads,          # pin stage_loads: a loop's loads copied ahead into each thread's own smem
    "merge-reductions": merge_reductions,  # independent cross-warp reductions trade partials in one round trip
    "merge-barriers": merge_barriers,    # a loop's barriers that another one already orders are dropped
    "buffer-operands": buffer_operands,  # operands the threads write each iteration: two buffers, product in flight
    "count-divisions": count_divisions,  # a loop's i // d, i % d by a runtime d: a carried quotient, remainder
    "allocate-smem": allocate_smem,      # byte offsets of shared tiles and mbarriers, smem_bytes
    # --- tcgen05 targets: the same passes, then the products move to tensor memory
    "lower-to-blackwell": lower_to_blackwell,  # wgmma -> tcgen05.mma + commit, accumulators in TMEM
    "overlap-epilogue": overlap_epilogue,  # a GEMM's MMAs by the producer's thread, two accumulators
    "pair-ctas": pair_ctas,  # cta_pairs: one tcgen05.mma.cta_group::2 for the two CTAs of a cluster
}

#: The IR a pass takes, where it takes one level only: ``"tile"`` (no layouts yet: before
#: select-layouts), ``"laid-out"`` (layouts selected, not yet lowered) or ``"lowered"`` (past
#: lower-to-hopper: TMA maps, barriers, shared allocations; a hand-written kernel of hopper ops
#: is at this level too).  The pass manager refuses a kernel of another level at its line
#: (``tkc opt`` runs any pass on any dump).  The cleanups take all.
TAKES: dict[str, str] = {
    **dict.fromkeys(("decompose", "merge-steps", "persistent", "order-memory", "select-layouts"), "tile"),
    "lower-to-hopper": "laid-out",
    **dict.fromkeys(("pipeline-loops", "specialize-warps", "transpose-in-producer", "issue-ahead", "defer-last",
                     "overlap-products", "multicast", "prefetch-loads", "stage-loads", "merge-reductions",
                     "merge-barriers", "buffer-operands", "count-divisions", "allocate-smem", "lower-to-blackwell",
                     "overlap-epilogue", "pair-ctas"),
                    "lowered"),
}


#: The hopper ops select-layouts itself places (conversions between layouts, register tiles
#: staged in shared memory for a product): a kernel holding only these is laid out, not lowered.
LAYOUT_OPS = frozenset({"hopper.convert_layout", "hopper.to_smem", "hopper.transpose_smem"})


def is_lowered(kernel: Operation) -> bool:
    """Whether ``kernel`` is IR the backend passes made (hopper or blackwell ops in it)."""
    return any(op.name.partition(".")[0] in ("hopper", "blackwell") for op in kernel.walk())


def level(kernel: Operation) -> str:
    """The level of :data:`TAKES` ``kernel`` is at."""
    backend = {op.name for op in kernel.walk() if op.name.partition(".")[0] in ("hopper", "blackwell")}
    if "tma_maps" in kernel.attributes or backend - LAYOUT_OPS:
        return "lowered"
    return "laid-out" if "threads" in kernel.attributes or backend else "tile"


def laid_out_for(ops: Iterable[Operation]) -> str | None:
    """The target the kernels among ``ops`` (a module's) were laid out for (select-layouts
    records it in each kernel), where they name one; None for tile IR."""
    names = {op.attributes.get("target") for op in ops if op.name == "tile.kernel"} - {None}
    return next(iter(names)) if len(names) == 1 else None


def after(pipeline: str, name: str) -> str:
    """The passes of ``pipeline`` after ``name`` (a dump made by ``name`` goes on with them)."""
    names = pipeline.split(",")
    return ",".join(names[names.index(name) + 1:]) if name in names else pipeline


#: What ``tkc compile`` and ``tkc run`` run on tile IR by default: the
#: target-independent cleanups.
DEFAULT_PIPELINE = "canonicalize,licm,cse,dce"

#: What turns cleaned-up tile IR into hopper IR that codegen and the emulator take.
HOPPER_PIPELINE = ("decompose,merge-steps,persistent,order-memory,select-layouts,lower-to-hopper,pipeline-loops,"
                   "specialize-warps,transpose-in-producer,issue-ahead,defer-last,overlap-products,multicast,prefetch-loads,stage-loads,merge-reductions,merge-barriers,buffer-operands,count-divisions,cse,dce,"
                   "allocate-smem")

#: The same for a tcgen05 target (sm_100a): Hopper's passes, parameterized by the target
#: (select-layouts picks #tmem_acc accumulators), then lower-to-blackwell (docs/blackwell.md).
BLACKWELL_PIPELINE = HOPPER_PIPELINE.replace(",cse,dce,allocate-smem",
                                             ",lower-to-blackwell,cse,dce,overlap-epilogue,pair-ctas,cse,dce,allocate-smem")


def backend_pipeline(target: Target) -> str:
    """The passes from cleaned-up tile IR to the IR ``target``'s codegen takes."""
    return BLACKWELL_PIPELINE if target.mma == "tcgen05" else HOPPER_PIPELINE
