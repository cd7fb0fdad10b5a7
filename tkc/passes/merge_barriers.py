"""The ``merge-barriers`` pass: CTA-wide barriers in a loop body that another one already
orders are dropped, so the warpgroups meet fewer times an iteration.

Runs on hopper IR after every pass that moves waits (``overlap-products``), on kernels whose
products are wgmma (completion is the ``hopper.wgmma_wait`` on a product's result): on every
loop of a kernel whose threads all compute (no ``hopper.role``), where a meeting is the CTA's
(``hopper.barrier``), and on every loop inside a role, where it is the role's own barrier
(``hopper.sync``: every thread that runs the loop, and no other, meets there; the producer's
copies into the ring do not touch the tiles below).  Only ops at the top level of a
``tile.for`` body count, so each runs once an iteration.  Two rewrites:

* **A store wait rides an earlier barrier.**  A ``hopper.tma_store_wait`` (thread 0 waits for
  its bulk copies to have read their tiles, then every thread meets) with a
  ``hopper.barrier`` before it in the body and no ``hopper.tma_store`` between them: thread 0
  waits right before that barrier instead (``sync = false``: no meeting of its own), which
  waits for the same copies, and every thread that wrote the tiles after the old wait still
  writes them after the barrier.  Attention backward: dQ's staging tile, last read by the
  previous iteration's TMA reduction, waits at the barrier that publishes dS^T.
* **A write's leading barrier, when the readers already met.**  The barrier lower-to-hopper
  puts before a loop's write of a shared tile that wgmma reads (so that the previous
  iteration's products are done with it) goes where every wgmma reading the tile is waited for
  at the top level, no other op uses the tile, and between each wait and the write, going
  round the loop, some other op makes every thread meet (a ``hopper.barrier``, a
  ``hopper.tma_store`` or a ``hopper.tma_store_wait`` with its meeting): each warpgroup waits
  for its own products before that meeting, and every thread passes the meeting before the
  write.  Attention backward: dS^T's tile, read by dQ's product, whose result every
  warpgroup waits for before the barrier that publishes dQ's staging tile.

Attention backward (examples/attn_train.tk) meets twice an iteration instead of four times,
with a producer warpgroup (its consumers' barrier) or without.

Must not: change what any thread computes, or drop a barrier that orders anything else
(only the two patterns above; anything unrecognised stays).
"""

from __future__ import annotations

from tkc.ir.core import Block, Module, Operation, uses
from tkc.ir.dialects import hopper
from tkc.pins import Options
from tkc.target import Target

def merge_barriers(module: Module, options: Options, target: Target) -> None:
    if target.mma != "wgmma":
        return
    for kernel in module.ops:
        if kernel.name != "tile.kernel":
            continue
        roles = any(op.name == "hopper.role" for op in kernel.walk())
        for loop in [op for op in kernel.walk() if op.name == "tile.for"]:
            in_role = any(a.name == "hopper.role" for a in loop.ancestors())
            if roles and not in_role:
                continue  # every warpgroup runs it, each role's threads by their own barrier
            body = loop.regions[0].block
            _ride_earlier_barrier(body, in_role)
            _drop_write_barriers(kernel, body, in_role)


def _barrier(op: Operation, in_role: bool) -> bool:
    """Whether ``op`` is the barrier of every thread that runs the loop: the role's own inside
    a role (codegen: a named barrier over the role's threads), else the CTA's."""
    if in_role:
        return op.name == "hopper.sync"
    return op.name == "hopper.barrier" and op.attributes.get("id", 0) == 0


def _meets(op: Operation, in_role: bool) -> bool:
    """Whether every thread that runs the loop has met once ``op`` ran: its barrier, a TMA
    store (the threads meet before thread 0 issues it), a store wait that meets."""
    if op.name == "hopper.tma_store_wait":
        return op.attributes.get("sync", True)
    return op.name == "hopper.tma_store" or _barrier(op, in_role)


def _ride_earlier_barrier(body: Block, in_role: bool) -> None:
    for wait in [op for op in body.ops if op.name == "hopper.tma_store_wait" and op.attributes.get("sync", True)]:
        at = body.ops.index(wait)
        before = None
        for i in range(at - 1, -1, -1):
            op = body.ops[i]
            if op.name == "hopper.tma_store" or any(x.name == "hopper.tma_store" for x in op.walk()):
                break
            if _barrier(op, in_role):
                before = i
                break
        if before is None:
            continue
        wait.erase()
        body.insert(before, hopper.TmaStoreWaitOp([], [], {"pending": wait.pending, "sync": False}, loc=wait.loc))


def _drop_write_barriers(kernel: Operation, body: Block, in_role: bool) -> None:
    users = uses(kernel)
    for i in range(len(body.ops) - 1):
        bar, write = body.ops[i], body.ops[i + 1]
        if not (_barrier(bar, in_role) and write.name == "hopper.smem_store"):
            continue
        dst = write.operands[1]
        readers = [u for u in users.get(dst, []) if u is not write]
        if not readers or any(r.name != "hopper.wgmma" or r.parent is not body for r in readers):
            continue
        waits = [w for r in readers for w in users.get(r.result, []) if w.name == "hopper.wgmma_wait"]
        if len(waits) != len(readers) or any(w.parent is not body for w in waits):
            continue
        n = len(body.ops)
        if all(_met_between(body, body.ops.index(w), i, n, in_role) for w in waits):
            bar.erase()
            return _drop_write_barriers(kernel, body, in_role)  # indices shifted: look again


def _met_between(body: Block, start: int, end: int, n: int, in_role: bool) -> bool:
    """Whether an op after position ``start`` and before ``end``, going round the loop body of
    ``n`` ops, makes every thread meet (``end`` itself, the barrier in question, excluded)."""
    j = (start + 1) % n
    while j != end:
        if _meets(body.ops[j], in_role):
            return True
        j = (j + 1) % n
    return False
