"""The ``overlap-products`` pass: a product's wait moves down to the first op that needs it, so
products that do not depend on each other run on the tensor cores together, and a product
into an accumulator runs while the warpgroup goes on with other work.

lower-to-hopper waits for every ``hopper.wgmma`` right after issuing it.  Under the pin
``overlap_products = true`` each ``hopper.wgmma_wait`` of a block (a loop body, a role, the
kernel) sinks past the ops after it that can run while the product is in flight, and stops
before the first that cannot:

- an op reading the wait's result (or holding one that does), or any op with regions;
- an op that touches shared memory or synchronizes threads (a stage release, a store for a
  later product's operand, a barrier, a reduction or layout change through shared memory, a
  turn): an in-flight product may still read the shared tiles they hand over;
- the block's end (a loop-carried accumulator is waited for before the next iteration).

Register-only tile ops, other products' issues and waits, waits for a ring's full barrier and
stage views pass.  A wait that moved past ``n`` issues of later products gets ``pending =
n``: groups complete in order, so at most ``n`` younger ones may still be in flight when it
passes.  Attention's backward (examples/attn_train.tk) writes its two score products
``K Q^T`` and ``V dO^T`` one after the other: they then run together, and ``dV += P^T dO``
runs during the work on ``dP``.

Runs after ``defer-last``, before ``multicast``.  Must not: move an op other than a wait, or
let any op read a product before its wait.
"""

from __future__ import annotations

from tkc.ir.core import Block, Module, Operation
from tkc.passes.rotate import pinned_kernels
from tkc.pins import Options
from tkc.target import Target

#: Hopper ops a wait may pass: they neither read nor write a shared tile an in-flight product
#: reads, nor meet other threads.
_PASSABLE = frozenset({"hopper.wgmma", "hopper.wgmma_wait", "hopper.mbarrier_wait", "hopper.stage",
                       "hopper.load"})  # a load from global memory straight into registers


def overlap_products(module: Module, options: Options, target: Target) -> None:
    if target.mma != "wgmma":
        return  # tcgen05 completes through mbarriers (lower-to-blackwell), not wgmma waits
    for kernel in pinned_kernels(module, options.overlap_products):
        for block in _blocks(kernel):
            _sink_waits(block)


def _blocks(op: Operation) -> list[Block]:
    return [b for inner in op.walk() for r in inner.regions for b in r.blocks]


def _passable(op: Operation) -> bool:
    if op.regions:
        return False
    if op.name in _PASSABLE:
        return True
    return op.name.startswith("tile.") and op.has_trait("pure")


def _reads(op: Operation, values: set) -> bool:
    return any(x in values for inner in op.walk() for x in inner.operands)


def _sink_waits(block: Block) -> None:
    ops = block.ops
    for wait in [op for op in ops if op.name == "hopper.wgmma_wait" and op.pending == 0]:
        issue = wait.x.owner if getattr(wait.x, "owner", None) is not None else None
        if issue is None or issue.name != "hopper.wgmma" or issue.parent is not block:
            continue
        start = ops.index(wait)
        later = 0  # products issued after this one, before the wait's new place
        for op in ops[ops.index(issue) + 1:start]:
            later += op.name == "hopper.wgmma"
        end = start + 1
        result = {wait.result}
        while end < len(ops) - 1 and _passable(ops[end]) and not _reads(ops[end], result):
            later += ops[end].name == "hopper.wgmma"
            end += 1
        if end == start + 1:
            continue
        ops.remove(wait)
        ops.insert(end - 1, wait)
        wait.attributes["pending"] = later
