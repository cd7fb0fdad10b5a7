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
  (the accumulator the loop carried disappears: a zero one ``dce`` drops, another start is
  added where the sum is read behind the loop, ``tmem_load``'s addend), followed by
  ``blackwell.commit`` onto the ring's ``empty`` stage: the stage is released when the
  tensor core has read it, by one arrival (the ring's count becomes 1);
- a loop of several such products (SwiGLU's gate and up, RoPE's two halves), each waited for
  at once on Hopper, issues them in order from the one thread, and its arrivals on the rings'
  ``empty`` stages become commits (each arrives once every MMA issued before it is done);
- the warpgroups' ``wgmma_wait_group`` and their arrivals on ``empty`` go; behind the loop,
  the arrival that released the last stage becomes a wait for that same phase (the last
  commit has arrived once every MMA of the loop has completed), and the accumulator is read
  from tensor memory (``blackwell.tmem_load``) where ``hopper.wgmma_wait`` made it readable;
- a product read at once (attention's, the 64-row kernels', a register accumulator a loop
  carries) is an MMA into columns of its own, a commit onto a barrier of its own, the role's
  wait and ``tmem_load`` in place, added to its register accumulator; the role's waits for its
  operands' copies move into the MMA; a role barrier keeps the warps together where the loop
  has none, and guards columns products share once the 512 are spent;
- each wait for a commit takes its parity from a count threaded through every loop and ``if``
  around it (``tkc/passes/phases.py``), and a K loop that a loop around it runs again (a
  persistent tile loop) gets a role barrier before it unless its epilogue meets already;
- under ``cluster`` (the ``multicast`` pass) a stage filled in every CTA is freed by a commit
  that arrives on every CTA's ``empty`` barrier;
- a block-scaled product (``hopper.wgmma`` with ``scales``, the threads' ``#scales`` tiles)
  gets tensor-memory columns for the scale factors after the accumulators and a
  ``blackwell.copy_scales`` of each before its MMA, which names their columns (``scales``);
  the threads store the scales every iteration, so it is always a product read at once.

Products of 64 rows (M = 64) are read as ``#wgmma_acc`` tiles (``select-layouts``); nothing
here depends on the row count but the MMA's ``m``.

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
from tkc.passes.phases import Waits, thread_phases
from tkc.pins import Options
from tkc.target import Target

I32 = ScalarType(dtypes.i32)
I1 = ScalarType(dtypes.i1)


def lower_to_blackwell(module: Module, options: Options, target: Target) -> None:
    if target.mma != "tcgen05":
        return
    for kernel in module.ops:
        if kernel.name == "tile.kernel":
            _refuse_pins(kernel, options, target)
            _Lowering(kernel, target).run()


#: Pins whose schedule is wgmma's (turns between warpgroups, products issued an iteration early
#: or waited for in pieces) or whose tiles tcgen05 cannot read (per-thread loads), named in the
#: refusal instead of the lowering's own words at the product.
_HOPPER_ONLY_PINS = (
    ("pingpong", True, "its turns order two warpgroups' wgmma groups, and one thread issues every tcgen05.mma"),
    ("issue_ahead", True, "it issues a wgmma an iteration early; tcgen05's products are issued by one thread "
                          "as their tiles land"),
    ("tma", False, "the tcgen05 lowering takes its operands from shared tiles TMA fills; per-thread loads of "
                   "them are not lowered for it yet"),
)


def _refuse_pins(kernel: Operation, options: Options, target: Target) -> None:
    product = next((op for op in kernel.walk() if op.name == "hopper.wgmma"), None)
    if product is None:
        return
    for name, value, why in _HOPPER_ONLY_PINS:
        if getattr(options, name) == value:
            raise TkcUnsupportedError(f"the pin {name} = {str(value).lower()} is for wgmma targets: {why}; drop it "
                                      f"for {target.name}", product.loc)


def behind_reads(block, start: int, loc) -> Builder | None:
    """A builder behind the point of ``block`` where every warp of its role has read tensor
    memory: the first meeting (``hopper.role_meets``) after the last op from index ``start`` on
    that holds a ``blackwell.tmem_load`` (a load under an ``if`` counts as the ``if``), a new
    role barrier where none follows.  None where no op from ``start`` on reads tensor memory."""
    reads = [i for i, op in enumerate(block.ops) if i >= start
             and any(inner.name == blackwell.TmemLoadOp.name for inner in op.walk())]
    if not reads:
        return None
    meeting = next((op for op in block.ops[reads[-1] + 1:] if hopper.role_meets(op)), None)
    if meeting is None:
        meeting = Builder(block, reads[-1] + 1, loc).create(hopper.SyncOp)
    return Builder(block, block.ops.index(meeting) + 1, loc)


def _unsupported(op: Operation, message: str) -> TkcUnsupportedError:
    return TkcUnsupportedError(f"tcgen05: {message}", op.loc)


def _owner(v: Value) -> Operation | None:
    return getattr(v, "owner", None)


def _kernel_of(op: Operation) -> Operation:
    while op.name != "tile.kernel":
        op = op.parent.parent_op
    return op


def _in_block(op: Operation, block) -> Operation | None:
    """The op of ``block`` that holds ``op`` (``op`` itself, or the op whose region it is in)."""
    while op is not None and op.parent is not block:
        op = op.parent.parent_op if op.parent else None
    return op


def _stage_of(bar: Value, ring: Value) -> bool:
    """Whether the barrier ``bar`` is a stage of the barrier ring ``ring``."""
    op = _owner(bar)
    return op is not None and op.name == "hopper.stage" and op.operands[0] is ring


def _is_constant(v: Value, value: object) -> bool:
    op = _owner(v)
    return op is not None and op.name == "tile.constant" and op.attributes.get("value") == value


def _is_zero(v: Value) -> bool:
    return _is_constant(v, 0)


class _Lowering:
    def __init__(self, kernel: Operation, target: Target):
        self.kernel, self.target = kernel, target
        # Per role (or kernel): its one tcgen05.alloc, the dealloc and the columns its products use.
        self.allocs: dict[Operation, tuple[Operation, Operation, int]] = {}
        # Per role (or kernel): the columns of each product read at once, [first, width, its MMAs]
        # (several MMAs: products that share the columns once the budget is spent).
        self.at_once: dict[Operation, list[list]] = {}
        # The role's waits for the accumulators' commits, their parities threaded at the end.
        self.waits: dict[Operation, Waits] = {}
        self.consts: dict[int, Value] = {}
        # The first column of each tensor-memory address made here (a block-scaled MMA names
        # where its scale factors are from its accumulator's address).
        self.column_of: dict[Value, int] = {}

    def run(self) -> None:
        products = [op for op in self.kernel.walk() if op.name == "hopper.wgmma"]
        lowered: set[Operation] = set()
        for w in products:
            if w in lowered:
                continue
            if (together := self._accumulated_together(w)) is not None:
                self._products(together)
                lowered.update(together)
            elif self._waited_at_once(w):
                self._product_at_once(w)
            else:
                self._product(w)
        for alloc, dealloc, used in self.allocs.values():
            alloc.attributes["cols"] = dealloc.attributes["cols"] = blackwell.tmem_columns(used)
        # Each commit is waited for once, in the committing role's program order: the parity of a
        # wait is the count of earlier ones, however the loops around it run (MoE's expert loop
        # in its rank loop, ring attention's blocks in its rank loop, a tile loop's if).
        for container in dict.fromkeys(hopper.enclosing_role(w) or self.kernel for w in self.waits):
            thread_phases(container.regions[0].block, self.waits, self._const)

    # ---------------------------------------------- a product waited for at once
    @staticmethod
    def _waited_at_once(w: Operation) -> bool:
        """Whether ``w`` is read right away (``wgmma_wait {pending = 0}`` next): attention's two
        products, S = Q K^T and O = O alpha + P V, and an accumulator a loop carries that is
        not a K loop's (Based's states, ``a2 + vt.T @ k2``, added to in registers; attention
        backward's dV and dK, summed in tensor memory)."""
        ops = w.parent.ops
        i = ops.index(w)
        return (i + 1 < len(ops) and ops[i + 1].name == "hopper.wgmma_wait"
                and ops[i + 1].pending == 0 and uses(_kernel_of(w)).get(w.result, []) == [ops[i + 1]])

    def _product_at_once(self, w: Operation) -> None:
        """One product computed and read in place: the MMA into its own tensor-memory columns
        (not accumulating), its commit onto a barrier of its own, the role's wait for that
        barrier and ``tmem_load``; a register accumulator the product adds to (O alpha) is
        added to the loaded product in registers.  The operands' waits and releases stay the
        role's, as on Hopper (the release follows the wait for the MMA, so the tensor core has
        read the stage); the role's wait for the operands moves into ``blackwell.mma``."""
        if not (hopper._smem(w.a.type) and hopper._smem(w.b.type)):
            raise _unsupported(w, "A and B must be shared tiles (select-layouts stages a register A)")
        wait = w.parent.ops[w.parent.ops.index(w) + 1]
        ready = self._operands_ready(w)
        container = hopper.enclosing_role(w) or self.kernel
        loop = w.parent.parent_op
        j = self._carried_sum(w, loop, uses(self.kernel)) if loop is not None and loop.name == "tile.for" else None
        # The columns and the barrier first: they insert ops at the top of the role (or the
        # kernel), which may be this product's own block, so the builder takes its place after.
        if j is None:
            tmem, columns = self._columns_at_once(container, w)
        else:
            # acc += a @ b over the loop, from zero: accumulated in columns of its own, read
            # once behind the loop (attention backward's dV and dK: no registers in the loop).
            tmem, columns = self._allocate(container, w), None
        scales = self._scale_columns(container, w)
        full = self._barrier(w)
        b = Builder.before(w)
        b.loc = w.loc
        if j is None:
            accumulate = b.value(tile.ConstantOp, [], I1, {"value": False})
        else:
            accumulate = b.value(tile.CmpOp, [loop.regions[0].block.args[0], loop.operands[0]], I1,
                                 {"pred": "ne"})
        mma = self._mma(b, w, tmem, accumulate, ready, scales)
        b.create(blackwell.CommitOp, [full])
        # The role waits every iteration all the same: its operands' tiles are reused behind it.
        self._wait(b, full)
        if j is None:
            yes = b.value(tile.ConstantOp, [], I1, {"value": True})
            # A register accumulator the product adds to (O alpha) is added chunk by chunk.
            addend = [] if _is_zero(w.acc) else [w.acc]
            acc = b.value(blackwell.TmemLoadOp, [tmem, yes, *addend], wait.result.type)
            acc.name_hint = wait.result.name_hint
            replace_all_uses(self.kernel, wait.result, acc)
        else:
            loop.regions[0].block.terminator.operands[j] = w.acc  # the loop no longer carries it
            after = Builder(loop.parent, loop.parent.ops.index(loop) + 1, w.loc)
            ran = after.value(tile.CmpOp, [loop.operands[1], loop.operands[0]], I1, {"pred": "gt"})
            self._load_behind(loop, j, tmem, w, after, ran)
            self._meet_before_rerun(loop, [tmem])
        wait.erase()
        w.erase()
        for op in ready:
            op.erase()  # only the MMA warp waits for the tiles (docs/blackwell.md §4)
        rerun = self._unfenced_rerun(mma)
        if columns is None:
            if rerun:
                self._sync_before(mma)  # the warps wait for its barrier every iteration
            return
        columns[2].append(mma)
        for sharer in columns[2]:
            if len(columns[2]) > 1 or rerun:
                self._sync_before(sharer)

    @staticmethod
    def _unfenced_rerun(w: Operation) -> bool:
        """Whether the product ``w``, read at once in a loop, would be issued again into its
        columns with no role barrier since every warp's ``tcgen05.ld`` of them in the
        iteration before.  One thread issues, each warp loads on its own: with nothing to meet
        at in the loop (FFT conv's column passes, whose tiles come from the same warpgroup's
        TMA), the MMA warp could overwrite columns a warp has not read yet, and run phases of
        the rings ahead of the other warps.  Such a product gets a role barrier before it
        (the loads end in ``tcgen05.fence::before_thread_sync``, the MMA starts with
        ``::after_thread_sync``)."""
        container = hopper.enclosing_role(w) or _kernel_of(w)
        if not any(p.name == "tile.for" for p in w.ancestors() if container in p.ancestors()):
            return False  # issued once
        # under an ``if`` in the loop too (taken on some iterations): its block must meet
        return not any(op.name == hopper.SyncOp.name for op in w.parent.ops)

    def _operands_ready(self, w: Operation) -> list[Operation]:
        """The role's waits for the TMA copies of ``w``'s B and A in ``w``'s block before it
        (B's first).  An operand without one was waited for earlier in the role's program
        order (before its loop, or moved into an earlier MMA of the one issuing thread), or is
        a tile the role stored itself (``hopper.to_smem``: behind a role barrier)."""
        ops = w.parent.ops
        found: list[Operation] = []
        for v in (w.b, w.a):
            stage = _owner(v)
            if stage is None or stage.name != "hopper.stage":
                continue
            for op in reversed(ops[:ops.index(w)]):
                if op.name == "hopper.mbarrier_wait" and _owner(op.barrier) is not None \
                        and _owner(op.barrier).name == "hopper.stage" \
                        and _owner(op.barrier).operands[1] is stage.operands[1]:
                    if op not in found and self._ring_of(op, stage):
                        found.append(op)
                        break
        return found

    @staticmethod
    def _ring_of(wait: Operation, stage: Operation) -> bool:
        """Whether ``wait`` (on a stage of a full ring) is the wait for the TMA copies into the
        tile ring ``stage`` indexes: a ``tma_load`` into that ring completes on that barrier ring."""
        bars = _owner(wait.barrier).operands[0]
        kernel = _kernel_of(wait)
        for op in kernel.walk():
            if op.name == "hopper.tma_load" and _owner(op.dst) is not None and _owner(op.dst).name == "hopper.stage" \
                    and _owner(op.dst).operands[0] is stage.operands[0]:
                return _owner(op.barrier) is not None and _owner(op.barrier).operands[0] is bars
        return False

    def _mma(self, b: Builder, w: Operation, tmem: Value, accumulate: Value, ready: list[Operation],
             scales: list[tuple[Value, int]]) -> Operation:
        """``blackwell.mma`` of the product ``w`` into ``tmem``, waiting for ``ready``'s phases;
        a block-scaled one behind the copies of its scale factors to ``scales``' columns (the
        same thread issues both, in that order)."""
        m, n = w.acc.type.shape
        waits = [x for op in ready for x in (op.barrier, op.parity)]
        attrs = {"m": m, "n": n, **{k: v for k, v in w.attributes.items() if k in ("a_major", "b_major")}}
        for (at, _), v in zip(scales, w.scales):
            b.create(blackwell.CopyScalesOp, [at, v])
        if scales:
            attrs["scales"] = [col - self.column_of[tmem] for _, col in scales]
            vec = blackwell.scale_vec(w.a.type.dtype, w.scales[0].type.dtype)
            if vec != 1:  # FP4 pairs: kind::mxf4nvf4, two (MXFP4) or four (NVFP4) scales a K step
                attrs["scale_vec"] = vec
        return b.create(blackwell.MmaOp, [tmem, w.a, w.b, accumulate, *waits], [], attrs)

    def _scale_columns(self, container: Operation, w: Operation) -> list[tuple[Value, int]]:
        """Columns of their own for a block-scaled product's scale factors, A's then B's (the
        address and first column of each); none for another product.  Made before the MMA's
        builder: they insert ops at the top of the role."""
        out = []
        for v in w.scales:
            at = self._allocate(container, w, blackwell.scale_columns(v.type.layout))
            out.append((at, self.column_of[at]))
        return out

    @staticmethod
    def _sync_before(mma: Operation) -> None:
        """A role barrier right before ``mma`` (its accumulate flag's constant aside)."""
        ops = mma.parent.ops
        i = ops.index(mma)
        while i > 0 and ops[i - 1].name == "tile.constant":
            i -= 1
        if i == 0 or ops[i - 1].name != hopper.SyncOp.name:
            Builder(mma.parent, i, mma.loc).create(hopper.SyncOp, [])

    def _columns_at_once(self, container: Operation, w: Operation) -> tuple[Value, list]:
        """Columns of their own for a product read at once, while the budget lasts; then the
        columns of an earlier such product at least as wide.  Sharers each get a role barrier
        before their MMA: a product's load is right behind its MMA, so every warp has read
        the columns before any other product is issued into them."""
        n = -(-w.acc.type.shape[1] // 32) * 32
        held = self.allocs.get(container)
        ranges = self.at_once.setdefault(container, [])
        if blackwell.tmem_columns((held[2] if held else 0) + n) > self.target.tmem_columns:
            shared = min((r for r in ranges if r[1] >= n), key=lambda r: len(r[2]), default=None)
            if shared is not None:
                alloc = held[0]
                b = Builder(alloc.parent, alloc.parent.ops.index(alloc) + 1, w.loc)
                at = b.value(tile.ConstantOp, [], I32, {"value": shared[0]})
                tmem = b.value(tile.AddOp, [alloc.result, at], I32)
                self.column_of[tmem] = shared[0]
                return tmem, shared
        first = held[2] if held else 0
        tmem = self._allocate(container, w)
        ranges.append([first, n, []])
        return tmem, ranges[-1]

    # ------------------------------------------- several products of one loop
    def _accumulated_together(self, w: Operation) -> list[Operation] | None:
        """The products of ``w``'s loop when there are several and each is ``acc_j += a @ b``
        on a loop-carried accumulator that starts at zero, waited for at once (``wgmma_wait
        {pending = 0}`` next) and only yielded: SwiGLU's and RoPE's K loops.  Else None (the
        one-product path says what it does not take)."""
        loop = w.parent.parent_op if w.parent else None
        if loop is None or loop.name != "tile.for":
            return None
        body = loop.regions[0].block
        products = [op for op in body.ops if op.name == "hopper.wgmma"]
        if len(products) < 2 or any(op.name == "hopper.wgmma" for p in body.ops if p.regions for op in p.walk()):
            return None
        if any(op.name == blackwell.MmaOp.name for op in loop.walk()):
            # Products read at once are in the loop too (attention backward's S^T, dP^T and
            # dQ^T, lowered before dV and dK when those come last): not a K loop, whose
            # products only accumulate; each of these is a product of its own.
            return None
        users = uses(self.kernel)
        if any(self._carried_sum(p, loop, users) is None or not (hopper._smem(p.a.type) and hopper._smem(p.b.type))
               or p.scales for p in products):
            # (block-scaled ones: the threads store their scales every iteration, so each is
            # waited for before the next one's stores, a product read at once)
            return None
        last = body.ops.index(products[-1])
        if not any(op.name == "hopper.mbarrier_arrive" and _owner(op.barrier) is not None
                   and _owner(op.barrier).name == "hopper.stage" for op in body.ops[last + 1:]):
            return None  # no ring (stages = 1): each is a sum read at once, kept in tensor memory
        return products

    @staticmethod
    def _carried_sum(p: Operation, loop: Operation, users: dict) -> int | None:
        """The position among ``loop``'s carried values of ``acc_j`` when the product ``p`` is
        ``acc_j += a @ b`` waited for at once (``wgmma_wait {pending = 0}`` next), ``acc_j``
        starting at zero and only yielded; else None."""
        body = loop.regions[0].block
        i = body.ops.index(p)
        wait = body.ops[i + 1] if i + 1 < len(body.ops) else None
        if p.acc not in body.args[1:] or wait is None or wait.name != "hopper.wgmma_wait" or wait.pending:
            return None
        j = body.args.index(p.acc) - 1
        if not _is_zero(loop.operands[3 + j]) or users.get(p.acc, []) != [p] \
                or body.terminator.operands[j] is not wait.result or users.get(wait.result, []) != [body.terminator]:
            return None
        return j

    def _products(self, products: list[Operation]) -> None:
        """Several accumulating products of one loop (:meth:`_accumulated_together`): each
        becomes an MMA into its own tensor-memory columns, issued by the one thread after
        its B's copy has landed (accumulating from the loop's second iteration on); the
        role's arrivals on the rings' ``empty`` stages behind them become commits by that
        thread, so a stage is released once the tensor core has read it.  Behind the loop,
        one commit onto the accumulators' barrier, the role's wait for it, and a
        ``tmem_load`` of each."""
        loop = products[0].parent.parent_op
        body = loop.regions[0].block
        container = hopper.enclosing_role(products[0]) or self.kernel
        loaded: list[tuple[int, Value, Operation]] = []
        for w in products:
            ready = self._operands_ready(w)
            wait = body.ops[body.ops.index(w) + 1]
            j = body.args.index(w.acc) - 1
            tmem = self._allocate(container, w)
            self._accumulating_mma(w, loop, tmem, ready)
            body.terminator.operands[j] = w.acc  # the loop no longer carries the accumulator
            wait.erase()
            w.erase()
            loaded.append((j, tmem, w))
        last = max(i for i, op in enumerate(body.ops) if op.name == blackwell.MmaOp.name)
        rings = []
        for op in list(body.ops[last + 1:]):
            if op.name == "hopper.mbarrier_arrive" \
                    and _owner(op.barrier) is not None and _owner(op.barrier).name == "hopper.stage":
                Builder.before(op).create(blackwell.CommitOp, [op.barrier], [], self._commit_attrs(op))
                rings.append(_owner(op.barrier).operands[0])
                op.erase()
        if not rings:
            raise _unsupported(products[0], "the loop's products release no TMA ring stage behind them")
        self._refills_together(body)

        after = Builder(loop.parent, loop.parent.ops.index(loop) + 1, products[-1].loc)
        full = self._barrier(products[-1])
        after.create(blackwell.CommitOp, [full])
        self._wait(after, full)
        ran = after.value(tile.CmpOp, [loop.operands[1], loop.operands[0]], I1, {"pred": "gt"})
        for j, tmem, w in loaded:
            self._load_behind(loop, j, tmem, w, after, ran)
        for ring in rings:
            self._one_arrival(ring)
        self._meet_before_rerun(loop, [tmem for _, tmem, _ in loaded])

    def _load_behind(self, loop: Operation, j: int, tmem: Value, w: Operation, after: Builder, ran: Value) -> None:
        """``loop``'s result ``j`` (the sum ``w`` accumulated at ``tmem``) read from tensor
        memory where it is first used, not right behind the loop: registers hold one
        accumulator while the epilogue works on another (SwiGLU's sigmoid of the gate spilled
        with both loaded).  Zeros where the loop ran no iteration (``ran`` false)."""
        block = loop.parent
        first_use = min((block.ops.index(top) for u in uses(self.kernel).get(loop.results[j], [])
                         if (top := _in_block(u, block)) is not None), default=None)
        at = after if first_use is None else Builder(block, first_use, w.loc)
        acc = at.value(blackwell.TmemLoadOp, [tmem, ran], w.acc.type)
        acc.name_hint = w.acc.name_hint
        replace_all_uses(self.kernel, loop.results[j], acc)

    # --------------------------------------------------------------- one product
    def _product(self, w: Operation) -> None:
        users = uses(self.kernel)
        loop = w.parent.parent_op if w.parent else None
        if w.scales:
            raise _unsupported(w, "a block-scaled product is waited for where it is issued (the threads store its "
                                  "scales every iteration); this one is pipelined, which is not lowered yet")
        if not hopper._smem(w.a.type):
            raise _unsupported(w, "A must be a shared tile (tcgen05 reads A from shared or tensor memory)")
        if loop is None or loop.name != "tile.for" or w.acc not in loop.regions[0].block.args[1:]:
            raise _unsupported(w, "a product outside a loop that accumulates it is not lowered to tcgen05 yet")
        body = loop.regions[0].block
        following = body.ops[body.ops.index(w) + 1:]
        if not following or following[0].name != "hopper.wgmma_wait_group":
            n = sum(op.name == "hopper.wgmma" for op in body.ops)
            why = (f"this loop accumulates {n} products" if n > 1 else
                   "this product's tiles are not copied a few iterations ahead (a TMA ring of 2 or more stages: "
                   "the note at the loop says why, e.g. two stages not fitting in shared memory, where smaller "
                   "tiles or fewer programs an SM make room)")
            raise _unsupported(w, f"one product a loop is lowered, accumulating over tiles copied ahead as gemm.tk "
                                  f"does; {why}: not yet on this target (it compiles for Hopper)")
        j = body.args.index(w.acc) - 1
        # The sum starts at zero in tensor memory; a value the accumulator starts from (a bias
        # row, a loop's sum before this one, an outer loop's carried sum) is added as it is read
        # behind the loop.
        start = loop.operands[3 + j]
        addend = [] if _is_zero(start) else [start]
        if users.get(w.acc, []) != [w] or body.terminator.operands[j] is not w.result \
                or users.get(w.result, []) != [body.terminator]:
            raise _unsupported(w, "only an accumulator that only accumulates products (acc += a @ b) is kept in "
                                  "tensor memory; this one is also read or changed in the loop")
        ring, stage_ix, shared = self._released_ring(w, body)
        wait = self._accumulator_wait(loop, j, users)
        container = hopper.enclosing_role(w) or self.kernel
        tmem = self._allocate(container, w)

        # The MMA, issued by one warp once its tiles have landed (the role's wait for them
        # goes: the other warps never look at the ring), and its commit onto their empty stage.
        ready = self._operands_wait(w, body)
        b = self._accumulating_mma(w, loop, tmem, [ready])
        stage = b.value(hopper.StageOp, [ring, stage_ix], ring.type)
        b.create(blackwell.CommitOp, [stage], [], {"cluster": True} if shared else {})
        self._refills_together(body)
        body.terminator.operands[j] = w.acc  # the loop no longer carries the accumulator
        w.erase()

        # Behind the loop: the MMA thread commits onto the accumulator's barrier (one phase a
        # run of the loop, so the epilogue waits every phase in turn), the role waits for it and
        # reads the accumulator.  The release of the last stage is the last commit's now.
        release = self._last_release(loop, ring)
        full = self._barrier(w)
        after = Builder(loop.parent, loop.parent.ops.index(loop) + 1, wait.loc)
        after.create(blackwell.CommitOp, [full])
        self._wait(after, full)
        ran = after.value(tile.CmpOp, [loop.operands[1], loop.operands[0]], I1, {"pred": "gt"})
        acc = after.value(blackwell.TmemLoadOp, [tmem, ran, *addend], wait.result.type)
        acc.name_hint = wait.result.name_hint
        replace_all_uses(self.kernel, wait.result, acc)
        wait.erase()
        release.erase()
        self._one_arrival(ring)
        self._meet_before_rerun(loop, [tmem])

    @staticmethod
    def _refills_together(body) -> None:
        """A role barrier before the first MMA of a K loop whose role refills its own ring (a
        kernel without a producer warpgroup: ``warp_specialize = false``, or too little shared
        memory for one).  Only the MMA warp waits for the tiles, and the stage frees on the
        commit alone, so the other warps, which wait for the freed stage before each refill,
        would otherwise fall behind the MMA warp by more than a round of the ring."""
        if any(x.name == "hopper.tma_load" for op in body.ops for x in op.walk()):
            _Lowering._sync_before(next(op for op in body.ops if op.name == blackwell.MmaOp.name))

    def _meet_before_rerun(self, loop: Operation, tmems: list[Value]) -> None:
        """A role barrier before ``loop`` (whose sums in ``tmems`` are read behind it) where a
        loop around it in the role runs it again (a persistent kernel's tile loop) and the role
        does not meet between those reads and the loop's next run.  One thread issues the next
        run's first MMA into the columns each warp reads on its own: without a meeting it
        overwrites a tile's sums before a slower warp (or warpgroup) has loaded them.  A TMA
        store's epilogue meets already (its barrier before the copy)."""
        container = hopper.enclosing_role(loop) or self.kernel
        if not any(p.name == "tile.for" for p in loop.ancestors() if container in p.ancestors()):
            return
        block = loop.parent
        loads = [i for i, op in enumerate(block.ops)
                 if any(x.name == blackwell.TmemLoadOp.name and x.operands[0] in tmems for x in op.walk())]
        last = max(loads, default=block.ops.index(loop))
        between = block.ops[last + 1:]
        if block.parent_op.name == "tile.for":  # and, in the next iteration, the ops before the loop
            between = between + block.ops[:block.ops.index(loop)]
        if any(hopper.role_meets(op) for op in between):
            return
        Builder.before(loop).create(hopper.SyncOp, [])

    def _accumulating_mma(self, w: Operation, loop: Operation, tmem: Value, ready: list[Operation]) -> Builder:
        """``blackwell.mma`` in place of the loop's product ``w`` into ``tmem``, accumulating from
        the loop's second iteration on, with the role's wait ``ready`` for its tiles moved into
        it (erased); the builder stands behind the MMA."""
        body = loop.regions[0].block
        scales = self._scale_columns(hopper.enclosing_role(w) or self.kernel, w)
        b = Builder.before(w)
        b.loc = w.loc
        first = b.value(tile.CmpOp, [body.args[0], loop.operands[0]], I1, {"pred": "ne"})
        self._mma(b, w, tmem, first, ready, scales)
        for op in ready:
            op.erase()
        return b

    def _barrier(self, w: Operation) -> Value:
        """A new mbarrier of one arrival (the accumulator's commit), initialized with the others,
        or first, with its fence and barrier, in a kernel that has none (no TMA copy)."""
        body = self.kernel.regions[0].block
        init = next((op for op in body.ops if op.name == "hopper.mbarrier_init"), None)
        fresh = init is None  # no TMA copy (operands computed, or loaded with other=): this one is first
        if fresh:
            init = next(op for op in body.ops if op.name not in ("tile.constant", "hopper.smem_alloc"))
        b = Builder.before(init)
        b.loc = w.loc
        bar = b.value(hopper.MBarrierAllocOp, [], MBARRIER, {"offset": -1})
        bar.name_hint = "acc_full"
        b.create(hopper.MBarrierInitOp, [bar], [], {"count": 1})
        if fresh:  # as lower-to-hopper initializes its barriers: seen by the async proxy, then by every thread
            b.create(hopper.FenceMBarrierInitOp)
            b.create(hopper.BarrierOp, attrs={"id": 0})
        return bar

    def _wait(self, b: Builder, full: Value) -> None:
        """The role's wait for the next phase of ``full`` (one commit, one wait), its parity
        threaded through the loops and ``if``s around it once every product is lowered."""
        wait = b.create(hopper.MBarrierWaitOp, [full, full])  # the parity: set by thread_phases
        self.waits[wait] = Waits(full, 1, 2)

    def _const(self, value: int) -> Value:
        if value not in self.consts:
            body = self.kernel.regions[0].block
            self.consts[value] = Builder(body, 0, self.kernel.loc).value(tile.ConstantOp, [], I32, {"value": value})
        return self.consts[value]

    def _operands_wait(self, w: Operation, body) -> Operation:
        """The wait on the full ring before the product: the only reader of its tiles."""
        waits = [op for op in body.ops[:body.ops.index(w)] if op.name == "hopper.mbarrier_wait"]
        if len(waits) != 1:
            raise _unsupported(w, "the K loop must wait once for its tiles (one TMA ring) to be lowered to tcgen05")
        return waits[0]

    def _released_ring(self, w: Operation, body) -> tuple[Value, Value, bool]:
        """The empty ring the wgmma's stage is released on (pipeline-loops' ``wgmma_wait_group``
        and arrival after it, both removed), the stage index of its tiles, and whether the
        release arrives on every CTA of the cluster (``multicast``: its copies fill every CTA's
        stage, so each CTA's commit releases the stage in all of them)."""
        i = body.ops.index(w)
        release = next((op for op in body.ops[i + 2:] if op.name == "tile.if"), None)
        after = [body.ops[i + 1], release] if i + 1 < len(body.ops) else []
        if len(after) < 2 or after[0].name != "hopper.wgmma_wait_group" or release is None:
            raise _unsupported(w, "the K loop must be pipelined (a TMA ring of stages >= 2) to be lowered to tcgen05")
        arrives = [op for op in after[1].walk() if op.name == "hopper.mbarrier_arrive"]
        if len(arrives) != 1:
            raise _unsupported(w, "a stage released on several barriers is not lowered to tcgen05 yet")
        ring = _owner(arrives[0].barrier).operands[0]
        a_stage = _owner(w.a)
        if a_stage is None or a_stage.name != "hopper.stage":
            raise _unsupported(w, "A must be a stage of the loop's TMA ring")
        shared = bool(arrives[0].attributes.get("cluster"))
        for op in after:
            op.erase()
        return ring, a_stage.operands[1], shared

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

    @staticmethod
    def _commit_attrs(arrive: Operation) -> dict:
        """The commit replacing the role's ``arrive`` on a ring stage: on every CTA of the
        cluster where the arrival was (a stage ``multicast`` fills in every CTA)."""
        return {"cluster": True} if arrive.attributes.get("cluster") else {}

    def _one_arrival(self, ring: Value) -> None:
        """The ring's stages complete on one commit each: one a CTA of the cluster where the
        commits arrive on every CTA's stage."""
        shared = any(op.name == blackwell.CommitOp.name and op.attributes.get("cluster")
                     and _stage_of(op.barrier, ring) for op in self.kernel.walk())
        for op in self.kernel.walk():
            if op.name == "hopper.mbarrier_init" and op.barrier is ring:
                op.attributes["count"] = self.kernel.attributes.get("cluster", 1) if shared else 1
            if op.name == "hopper.mbarrier_arrive" and _stage_of(op.barrier, ring):
                raise _unsupported(op, "a ring stage released by both threads and tcgen05.commit")

    def _allocate(self, container: Operation, w: Operation, n: int | None = None) -> Value:
        """Tensor-memory columns for the product's accumulator (or ``n`` columns: its scale
        factors): the next ones of the one allocation at the top of ``container`` (a role, or
        the kernel), freed before its end (a CTA allocates once: the first allocation
        relinquishes the permit)."""
        n = -(-w.acc.type.shape[1] // 32) * 32 if n is None else n
        held = self.allocs.get(container)
        used = (held[2] if held else 0) + n
        if blackwell.tmem_columns(used) > self.target.tmem_columns:
            raise _unsupported(w, f"the accumulators need {used} tensor-memory columns, a CTA has "
                                  f"{self.target.tmem_columns}")
        if held is None:
            block = container.regions[0].block
            b = Builder(block, 0, w.loc)
            alloc = b.create(blackwell.TmemAllocOp, [], [I32], {"cols": blackwell.tmem_columns(used)})
            alloc.result.name_hint = "tmem"
            e = Builder.before(block.terminator)
            e.loc = w.loc
            dealloc = e.create(blackwell.TmemDeallocOp, [alloc.result], [], {"cols": blackwell.tmem_columns(used)})
            self.allocs[container] = (alloc, dealloc, used)
            self.column_of[alloc.result] = 0
            return alloc.result
        alloc, dealloc, before = held
        self.allocs[container] = (alloc, dealloc, used)
        b = Builder(alloc.parent, alloc.parent.ops.index(alloc) + 1, w.loc)
        at = b.value(tile.AddOp, [alloc.result, b.value(tile.ConstantOp, [], I32, {"value": before})], I32)
        self.column_of[at] = before
        return at
