"""The ``overlap-products`` pass: a product's wait moves down to the first op that needs it, so
products that do not depend on each other run on the tensor cores together, and a product
into an accumulator runs while the warpgroup goes on with other work.

lower-to-hopper waits for every ``hopper.wgmma`` right after issuing it.  Under the pin
``overlap_products = true`` each ``hopper.wgmma_wait`` of a block (a loop body, a role, the
kernel) sinks past the ops after it that can run while the product is in flight, and stops
before the first that cannot:

- an op reading the wait's result (or holding one that does), or an op with regions other
  than a ``tile.if`` of register-only tile ops (an edge mask);
- an op that touches shared memory or synchronizes threads (a store for a later product's
  operand, a barrier, a reduction or layout change through shared memory, a turn): an
  in-flight product may still read the shared tiles they hand over.  Stores, proxy fences,
  TMA stores, waits for TMA stores to have read their tile and barriers are passed while every
  product in flight reads only tiles that TMA alone writes (a ring's stages, a tile copied in once: no
  thread stores into them anywhere in the kernel, and their stages come back only through the
  releases the wait carries);
- the block's end (a loop-carried accumulator is waited for before the next iteration).

Register-only tile ops (and ``hopper.convert_layout`` without a scratch tile: each thread keeps
its values), other products' issues, waits that leave products in flight, waits for a ring's
full barrier, stage views and the threads' reads of shared memory (``hopper.smem_load``: a
product only reads shared memory too) pass.  A stage's release (``hopper.mbarrier_arrive``) met
on the way goes down with the wait, right behind it: a release may come later, never earlier.
Once the wait carries one it passes no barrier's wait, which that release might be what
completes.  A wait that moved past ``n`` issues of later products gets ``pending = n``: groups
complete in order, so at most ``n`` younger ones may still be in flight when it passes.
Attention's backward (examples/attn_train.tk, D = 128) issues its two score products ``K Q^T``
and ``V dO^T`` one after the other: ``V dO^T`` then runs under the exponentials of ``K Q^T``'s
scores and their edge mask, and ``dV += P^T dO`` (P^T from registers, dO from its ring),
which the example issues right behind ``dQ^T = K^T dS^T``, under the staging of dQ's result, its
TMA reduction and dK's issue.

Runs after ``defer-last``, before ``multicast``.  Must not: move an op other than a wait and
the releases behind it, move a release earlier, or let any op read a product before its wait.
"""

from __future__ import annotations

from tkc.ir.core import Block, Module, Operation, Value, uses
from tkc.ir.types import TileType
from tkc.passes.rotate import pinned_kernels
from tkc.pins import Options
from tkc.target import Target

#: Hopper ops a wait may pass: they neither read nor write a shared tile an in-flight product
#: reads, nor meet other threads.
_PASSABLE = frozenset({"hopper.wgmma", "hopper.wgmma_wait", "hopper.mbarrier_wait", "hopper.stage",
                       "hopper.load",  # a load from global memory straight into registers
                       "hopper.smem_load"})  # a read: products only read shared memory too


def overlap_products(module: Module, options: Options, target: Target) -> None:
    if target.mma != "wgmma":
        return  # tcgen05 completes through mbarriers (lower-to-blackwell), not wgmma waits
    for kernel in pinned_kernels(module, options.overlap_products):
        copied = _copied_only(kernel)
        for block in _blocks(kernel):
            _sink_waits(block, copied)


def _blocks(op: Operation) -> list[Block]:
    return [b for inner in op.walk() for r in inner.regions for b in r.blocks]


def _passable(op: Operation) -> bool:
    if op.regions:
        # A branch of register work alone (attention's edge mask) runs under a product as any
        # register op does; one holding a product, a wait or a memory op stays where it is.
        return op.name == "tile.if" and all(_register_only(inner) for inner in op.walk() if inner is not op)
    if op.name in _PASSABLE:
        return True
    if op.name == "hopper.convert_layout":
        # Without a scratch tile each thread keeps its values (a product's bf16 result taken as
        # the next product's A fragments): register work.
        return not op.scratch
    return _register_only(op)


def _register_only(op: Operation) -> bool:
    return op.name == "tile.yield" or op.name.startswith("tile.") and not op.regions and op.has_trait("pure")


def _reads(op: Operation, values: set) -> bool:
    return any(x in values for inner in op.walk() for x in inner.operands)


#: Ops that write or hand over shared memory that a product may pass when every tile the
#: products in flight read is one only TMA writes (see ``_copied_only``).
_THREAD_MEMORY = frozenset({"hopper.smem_store", "hopper.fence_proxy_async", "hopper.tma_store_wait",
                            "hopper.barrier", "hopper.tma_store"})


def _copied_only(kernel: Operation) -> set[Value]:
    """The shared allocations only TMA copies write and only products read (a ring's stages, a
    tile loaded once): no thread stores into them anywhere in the kernel, so a product reading
    them can stay in flight across other threads' stores and barriers."""
    users = uses(kernel)

    def only_copies(v: Value) -> bool:
        for user in users.get(v, []):
            if user.name == "hopper.stage":
                if not only_copies(user.result):
                    return False
            elif user.name == "hopper.tma_load":
                if user.operands[1] is not v:
                    return False
            elif user.name != "hopper.wgmma" or user.acc is v:
                return False
        return True

    return {op.result for op in kernel.walk() if op.name == "hopper.smem_alloc" and only_copies(op.result)}


def _tiles_read(issue: Operation) -> set[Value]:
    """The allocations a product reads from shared memory (through a stage view; a shared
    operand of another origin stands for itself, and so is in no set of allocations)."""
    out = set()
    for x in (issue.a, issue.b):
        if not (isinstance(x.type, TileType) and x.type.space == "smem"):
            continue  # A from registers
        owner = getattr(x, "owner", None)
        while owner is not None and owner.name == "hopper.stage":
            x = owner.ring
            owner = getattr(x, "owner", None)
        out.add(x)
    return out


def _flight_reads_copies_only(ops: list[Operation], at: int, moving: Operation, copied: set[Value]) -> bool:
    """Whether every product that may be in flight at ``ops[at]`` (the moving wait's own
    included) reads only tiles in ``copied``.  ``wgmma.wait_group n`` leaves at most the ``n``
    youngest products in flight; products issued before the block count until a wait has left
    fewer in flight than the block has issued since."""
    issued: list[Operation] = []
    before_block = True
    for op in ops[:at]:
        if op.name == "hopper.wgmma":
            issued.append(op)
        elif op.name == "hopper.wgmma_wait" and op is not moving:
            n = op.pending
            before_block = before_block and len(issued) < n
            issued = issued[max(len(issued) - n, 0):] if n else []
    return not before_block and all(_tiles_read(x) <= copied for x in issued)


def _sink_waits(block: Block, copied: set[Value] = frozenset()) -> None:
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
        carried: list[Operation] = []  # stage releases that follow the wait down
        while end < len(ops) - 1 and not _reads(ops[end], result):
            op = ops[end]
            if op.name == "hopper.mbarrier_arrive":
                carried.append(ops.pop(end))
                continue
            memory = op.name in _THREAD_MEMORY and _flight_reads_copies_only(ops, end, wait, copied)
            if not (_passable(op) or memory) or carried and op.name == "hopper.mbarrier_wait" \
                    or op.name == "hopper.wgmma_wait" and op.pending == 0:  # that one waits for this product too
                break
            later += op.name == "hopper.wgmma"
            end += 1
        if end == start + 1 and not carried:
            continue
        ops.remove(wait)
        ops[end - 1:end - 1] = [wait, *carried]
        wait.attributes["pending"] = later
