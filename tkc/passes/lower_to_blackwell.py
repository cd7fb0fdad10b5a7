"""The ``lower-to-blackwell`` pass: a tcgen05 target's products move to tensor memory.

Runs on the IR that Hopper's passes made for a tcgen05 target (``select-layouts`` gave each
product a ``#tmem_acc`` accumulator, ``pipeline-loops`` a TMA ring, ``specialize-warps`` a
producer role), after them and before ``allocate-smem``.  Those passes still speak of
``hopper.wgmma``; here each accumulating product of a pipelined K loop becomes Blackwell's
protocol (docs/blackwell.md):

- the role that computes allocates the accumulator's tensor memory on entry
  (``blackwell.tmem_alloc``, a power of two of columns) and frees it on exit;
- ``hopper.wgmma`` and the role's wait for its tiles become ``blackwell.mma``, where the
  first warp waits and one thread issues, accumulating from the loop's second iteration on
  (the zero accumulator the loop carried disappears; ``dce`` drops it), followed by
  ``blackwell.commit`` onto the ring's ``empty`` stage: the stage is released when the
  tensor core has read it, by one arrival (the ring's count becomes 1);
- the warpgroups' ``wgmma_wait_group`` and their arrivals on ``empty`` go; behind the loop,
  the arrival that released the last stage becomes a wait for that same phase (the last
  commit has arrived once every MMA of the loop has completed), and the accumulator is read
  from tensor memory (``blackwell.tmem_load``) where ``hopper.wgmma_wait`` made it readable.

Must not: choose layouts, stages or roles (the passes before it do), or touch a kernel for a
target whose tensor cores are wgmma's.  What it does not handle is a located error.
"""

from __future__ import annotations

from tkc import dtypes
from tkc.errors import TkcUnsupportedError
from tkc.ir.builder import Builder
from tkc.ir.core import Module, Operation, Value, replace_all_uses, uses
from tkc.ir.dialects import blackwell, hopper, tile
from tkc.ir.types import MBARRIER, ScalarType
from tkc.pins import Options
from tkc.target import Target

I32 = ScalarType(dtypes.i32)
I1 = ScalarType(dtypes.i1)


def lower_to_blackwell(module: Module, options: Options, target: Target) -> None:
    if target.mma != "tcgen05":
        return
    for kernel in module.ops:
        if kernel.name == "tile.kernel":
            _Lowering(kernel, target).run()


def _unsupported(op: Operation, message: str) -> TkcUnsupportedError:
    return TkcUnsupportedError(f"tcgen05: {message}", op.loc)


def _owner(v: Value) -> Operation | None:
    return getattr(v, "owner", None)


def _is_zero(v: Value) -> bool:
    op = _owner(v)
    return op is not None and op.name == "tile.constant" and op.attributes.get("value") == 0


class _Lowering:
    def __init__(self, kernel: Operation, target: Target):
        self.kernel, self.target = kernel, target
        self.columns: dict[Operation, int] = {}  # tensor-memory columns allocated per role (or kernel)

    def run(self) -> None:
        products = [op for op in self.kernel.walk() if op.name == "hopper.wgmma"]
        for w in products:
            self._product(w)

    # --------------------------------------------------------------- one product
    def _product(self, w: Operation) -> None:
        users = uses(self.kernel)
        loop = w.parent.parent_op if w.parent else None
        if not hopper._smem(w.a.type):
            raise _unsupported(w, "A must be a shared tile (tcgen05 reads A from shared or tensor memory)")
        if loop is None or loop.name != "tile.for" or w.acc not in loop.regions[0].block.args[1:]:
            raise _unsupported(w, "a product outside a loop that accumulates it is not lowered to tcgen05 yet")
        body = loop.regions[0].block
        following = body.ops[body.ops.index(w) + 1:]
        if not following or following[0].name != "hopper.wgmma_wait_group":
            raise _unsupported(w, "the K loop must be pipelined (a TMA ring of stages >= 2) to be lowered to tcgen05")
        j = body.args.index(w.acc) - 1
        if not _is_zero(loop.operands[3 + j]) or users.get(w.acc, []) != [w] \
                or body.terminator.operands[j] is not w.result or users.get(w.result, []) != [body.terminator]:
            raise _unsupported(w, "only an accumulator that starts at zero and only accumulates products (acc += "
                                  "a @ b) is kept in tensor memory")
        ring, stage_ix = self._released_ring(w, body)
        wait = self._accumulator_wait(loop, j, users)
        container = hopper.enclosing_role(w) or self.kernel
        tmem = self._allocate(container, w)

        # The MMA, issued by one warp once its tiles have landed (the role's wait for them
        # goes: the other warps never look at the ring), and its commit onto their empty stage.
        ready = self._operands_wait(w, body)
        b = Builder.before(w)
        b.loc = w.loc
        first = b.value(tile.CmpOp, [body.args[0], loop.operands[0]], I1, {"pred": "ne"})
        m, n = w.acc.type.shape
        b.create(blackwell.MmaOp, [tmem, w.a, w.b, first, ready.barrier, ready.parity], [], {"m": m, "n": n})
        ready.erase()
        stage = b.value(hopper.StageOp, [ring, stage_ix], ring.type)
        b.create(blackwell.CommitOp, [stage])
        body.terminator.operands[j] = w.acc  # the loop no longer carries the accumulator
        w.erase()

        # Behind the loop: the MMA thread commits onto the accumulator's barrier (one phase a
        # run of the loop, so the epilogue waits every phase in turn), the role waits for it and
        # reads the accumulator.  The release of the last stage is the last commit's now.
        release = self._last_release(loop, ring)
        full = self._barrier(w)
        after = Builder(loop.parent, loop.parent.ops.index(loop) + 1, wait.loc)
        after.create(blackwell.CommitOp, [full])
        after.create(hopper.MBarrierWaitOp, [full, self._runs_parity(loop, after)])
        ran = after.value(tile.CmpOp, [loop.operands[1], loop.operands[0]], I1, {"pred": "gt"})
        acc = after.value(blackwell.TmemLoadOp, [tmem, ran], wait.result.type)
        acc.name_hint = wait.result.name_hint
        replace_all_uses(self.kernel, wait.result, acc)
        wait.erase()
        release.erase()
        self._one_arrival(ring)

    def _barrier(self, w: Operation) -> Value:
        """A new mbarrier of one arrival (the accumulator's commit), initialized with the others."""
        body = self.kernel.regions[0].block
        init = next((op for op in body.ops if op.name == "hopper.mbarrier_init"), None)
        if init is None:
            raise _unsupported(w, "no mbarriers are initialized before the roles")
        b = Builder.before(init)
        b.loc = w.loc
        bar = b.value(hopper.MBarrierAllocOp, [], MBARRIER, {"offset": -1})
        bar.name_hint = "acc_full"
        b.create(hopper.MBarrierInitOp, [bar], [], {"count": 1})
        return bar

    def _runs_parity(self, loop: Operation, b: Builder) -> Value:
        """The parity of the loop's current run: 0 when it runs once, else the position of the
        iteration of the loop around it (a persistent kernel's tile loop) & 1."""
        outer = loop.parent.parent_op
        if outer is None or outer.name in ("hopper.role", "tile.kernel"):
            return b.value(tile.ConstantOp, [], I32, {"value": 0})
        container = outer.parent.parent_op if outer.parent else None
        if outer.name != "tile.for" or container is None or container.name not in ("hopper.role", "tile.kernel"):
            raise _unsupported(loop, "a K loop nested deeper than one loop (a persistent kernel's tile loop) is not "
                                     "lowered to tcgen05 yet")
        iv, (lb, _, step) = outer.regions[0].block.args[0], outer.operands[:3]
        run = b.value(tile.FloorDivOp, [b.value(tile.SubOp, [iv, lb], I32), step], I32)
        return b.value(tile.AndOp, [run, b.value(tile.ConstantOp, [], I32, {"value": 1})], I32)

    def _operands_wait(self, w: Operation, body) -> Operation:
        """The wait on the full ring before the product: the only reader of its tiles."""
        waits = [op for op in body.ops[:body.ops.index(w)] if op.name == "hopper.mbarrier_wait"]
        if len(waits) != 1:
            raise _unsupported(w, "the K loop must wait once for its tiles (one TMA ring) to be lowered to tcgen05")
        return waits[0]

    def _released_ring(self, w: Operation, body) -> tuple[Value, Value]:
        """The empty ring the wgmma's stage is released on (pipeline-loops' ``wgmma_wait_group``
        and arrival after it, both removed) and the stage index of its tiles."""
        i = body.ops.index(w)
        release = next((op for op in body.ops[i + 2:] if op.name == "tile.if"), None)
        after = [body.ops[i + 1], release] if i + 1 < len(body.ops) else []
        if len(after) < 2 or after[0].name != "hopper.wgmma_wait_group" or release is None:
            raise _unsupported(w, "the K loop must be pipelined (a TMA ring of stages >= 2) to be lowered to tcgen05")
        arrives = [op for op in after[1].walk() if op.name == "hopper.mbarrier_arrive"]
        if len(arrives) != 1 or arrives[0].attributes.get("cluster"):
            raise _unsupported(w, "a stage released on several barriers, or across a cluster, is not lowered to "
                                  "tcgen05 yet")
        ring = _owner(arrives[0].barrier).operands[0]
        a_stage = _owner(w.a)
        if a_stage is None or a_stage.name != "hopper.stage":
            raise _unsupported(w, "A must be a stage of the loop's TMA ring")
        for op in after:
            op.erase()
        return ring, a_stage.operands[1]

    def _accumulator_wait(self, loop: Operation, j: int, users: dict) -> Operation:
        result = loop.results[j]
        waits = users.get(result, [])
        if len(waits) != 1 or waits[0].name != "hopper.wgmma_wait" or waits[0].pending != 0:
            raise _unsupported(loop, "the accumulator must be read once, after the loop")
        return waits[0]

    def _last_release(self, loop: Operation, ring: Value) -> Operation:
        """The op behind ``loop`` (a ``tile.if``) that releases the last stage on ``ring``."""
        ops = loop.parent.ops
        for op in ops[ops.index(loop) + 1:]:
            arrives = [x for x in op.walk() if x.name == "hopper.mbarrier_arrive"]
            if any(_owner(x.barrier) is not None and _owner(x.barrier).operands[0] is ring for x in arrives):
                return op
        raise _unsupported(loop, "no release of the loop's last stage follows it")

    def _one_arrival(self, ring: Value) -> None:
        """The ring's stages complete on one commit each."""
        for op in self.kernel.walk():
            if op.name == "hopper.mbarrier_init" and op.barrier is ring:
                op.attributes["count"] = 1
            if op.name == "hopper.mbarrier_arrive" and _owner(op.barrier) is not None \
                    and _owner(op.barrier).operands[0] is ring:
                raise _unsupported(op, "a ring stage released by both threads and tcgen05.commit")

    def _allocate(self, container: Operation, w: Operation) -> Value:
        """Tensor memory for the product's accumulator, allocated at the top of ``container``
        (a role, or the kernel) and freed before its end."""
        cols = blackwell.tmem_columns(w.acc.type.shape[1])
        used = self.columns.get(container, 0) + cols
        if used > self.target.tmem_columns:
            raise _unsupported(w, f"the accumulators need {used} tensor-memory columns, a CTA has "
                                  f"{self.target.tmem_columns}")
        self.columns[container] = used
        block = container.regions[0].block
        b = Builder(block, 0, w.loc)
        tmem = b.value(blackwell.TmemAllocOp, [], I32, {"cols": cols})
        tmem.name_hint = "tmem"
        e = Builder.before(block.terminator)
        e.loc = w.loc
        e.create(blackwell.TmemDeallocOp, [tmem], [], {"cols": cols})
        return tmem
