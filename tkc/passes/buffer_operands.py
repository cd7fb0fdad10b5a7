"""The ``buffer-operands`` pass: a loop's product whose shared operands the threads write every
iteration (a tile dequantized in registers, ``dot_scaled`` on sm_90a) stays in flight while
the next iteration computes its operands.

Runs on hopper IR after ``merge-barriers`` (which recognises a product's completion by its
``hopper.wgmma_wait`` only, and has merged the operands' writes under one pair of barriers).
Before, the body is

    barrier; smem_store(x, A); smem_store(y, B); fence; barrier
    acc' = wgmma(A, B, acc); wait(acc', pending = 0); yield acc'

and the product runs alone: the next iteration's loads, conversions and multiplies wait for
it.  After, ``A`` and ``B`` have two buffers each, iteration ``i`` writing buffer ``i % 2``
(``hopper.stage``), and the wait becomes ``wgmma_wait_group 1``: iteration ``i``'s product is
still running while iteration ``i + 1`` computes; only the product of ``i - 1`` must be done.
The accumulator is waited for behind the loop.

Why two buffers suffice: iteration ``i`` writes buffer ``i % 2`` after its first barrier, which
every thread reaches only after its own ``wgmma_wait_group 1`` of iteration ``i - 1``, so the
product of ``i - 2`` (the last reader of that buffer) is complete in every warpgroup.  The
accumulator chains from one wgmma to the next in flight, as a pipelined GEMM's does.

Applies to a ``tile.for`` body with one ``hopper.wgmma`` that accumulates into a carried value
nothing else in the body reads, whose waited result is only yielded back as that value, whose
shared operands are each written by ``hopper.smem_store`` in this body only (no TMA ring:
``pipeline-loops`` keeps those products in flight itself), behind a barrier, where the second
buffers fit in shared memory beside every other allocation; on targets whose products are wgmma
(tcgen05 products complete through their own commits).  Elsewhere the loop stays as it is.

Must not: change what any thread computes, or let a store reach a buffer a product in flight
still reads (the emulator refuses that: ``SharedMemory.begin_read``).
"""

from __future__ import annotations

from tkc import dtypes
from tkc.ir.builder import Builder
from tkc.ir.core import Module, Operation, Value, replace_all_uses, uses
from tkc.ir.dialects import hopper, tile
from tkc.ir.types import ScalarType, TileType
from tkc.passes.allocate_smem import allocated_bytes, size_and_align
from tkc.pins import Options
from tkc.target import Target

I32 = ScalarType(dtypes.i32)
BUFFERS = 2


def buffer_operands(module: Module, options: Options, target: Target) -> None:
    if target.mma != "wgmma":
        return
    for kernel in module.ops:
        if kernel.name != "tile.kernel":
            continue
        for loop in [op for op in kernel.walk() if op.name == "tile.for"]:
            _rewrite(kernel, loop, options, target)


def _owner(v: Value) -> Operation | None:
    return getattr(v, "owner", None)


def _rewrite(kernel: Operation, loop: Operation, options: Options, target: Target) -> None:
    body = loop.regions[0].block
    products = [op for op in body.ops if op.name == "hopper.wgmma"]
    if len(products) != 1 or any(op.name == "hopper.wgmma" for op in loop.walk() if op.parent is not body):
        return
    mma = products[0]
    used = uses(kernel)
    waits = [u for u in used.get(mma.result, []) if u.name == "hopper.wgmma_wait"]
    if len(waits) != 1 or len(used[mma.result]) != 1 or waits[0].pending != 0:
        return
    wait = waits[0]
    term = body.terminator
    carried = [i for i, y in enumerate(term.operands) if y is wait.result]
    if len(carried) != 1 or used.get(wait.result) != [term] or mma.acc is not body.args[1 + carried[0]]:
        return
    if used.get(mma.acc, []) != [mma]:
        return  # (the loop reads the accumulator: it must be the previous product's, complete)
    # Its shared operands: tiles allocated at the top and written by smem_store here only.
    allocs = []
    for v in (mma.a, mma.b):
        alloc = _owner(v)
        if not isinstance(v.type, TileType) or v.type.space != "smem":
            continue
        if alloc is None or alloc.name != "hopper.smem_alloc" or alloc.attributes.get("stages", 1) != 1:
            return
        writers = [u for u in used.get(v, []) if u is not mma]
        if not writers or any(u.name != "hopper.smem_store" or u.parent is not body or u.dst is not v
                              for u in writers):
            return
        first = min(body.ops.index(u) for u in writers)
        if not any(op.name == "hopper.barrier" for op in body.ops[:first]):
            return  # (lower-to-hopper's barrier ahead of the stores, which the argument above needs)
        if alloc not in allocs:
            allocs.append(alloc)
    if not allocs:
        return
    top = kernel.regions[0].block
    placed = [op for op in top.ops if op.name in ("hopper.smem_alloc", "hopper.mbarrier_alloc")]
    taken = allocated_bytes(placed)
    extra = sum((BUFFERS - 1) * size_and_align(a)[0] for a in allocs)
    if taken + extra > target.smem_per_program(options.programs_per_sm):
        return

    # The buffer of this iteration: (iv - lb) / step % 2.
    b = Builder(body, 0, loop.loc)
    k = b.value(tile.SubOp, [body.args[0], loop.lb], I32)
    step = tile.int_constant(loop.step)
    if step != 1:
        k = b.value(tile.FloorDivOp, [k, loop.step], I32)
    two = b.value(tile.ConstantOp, [], I32, {"value": BUFFERS})
    which = b.value(tile.RemOp, [k, two], I32)
    for alloc in allocs:
        alloc.attributes["stages"] = BUFFERS
        buf = alloc.result
        stage = b.value(hopper.StageOp, [buf, which], buf.type)
        for op in body.ops:
            if op is not stage.owner:
                op.operands = [stage if x is buf else x for x in op.operands]
    # The product of this iteration stays in flight; the loop's result is waited for behind it.
    Builder.before(wait).create(hopper.WgmmaWaitGroupOp, attrs={"pending": 1}, loc=wait.loc)
    term.operands[carried[0]] = mma.result
    wait.erase()
    res = loop.results[carried[0]]
    after = Builder(loop.parent, loop.parent.ops.index(loop) + 1, loop.loc)
    done = after.value(hopper.WgmmaWaitOp, [res], res.type, {"pending": 0})
    replace_all_uses(kernel, res, done)
    done.owner.operands[0] = res
