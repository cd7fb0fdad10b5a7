"""The ``defer-last`` pass: a loop's last product is issued in the next iteration, right after
that iteration's first product, so the tensor cores compute it while the warpgroup works in
registers (FlashAttention-3's ordering: P_(j-1) V_(j-1) runs during the softmax of S_j).

Runs on hopper IR after ``specialize-warps`` (and ``issue-ahead``), under the pin
``defer_last = true``.  A ``tile.for`` with step 1 in a consumer role (a producer role issues
the copies) qualifies when its body holds exactly two ``hopper.wgmma``:

- W1, the first, waited for once in the body (U1);
- W2, the last, reading a ring stage, waited for right there (U2) with the wait's result only
  yielded, as the carried accumulator A; what follows U2 in the body only releases ring
  stages (``mbarrier_arrive``) and computes stage numbers from the induction variable;
- A is read in the body after W1 is issued (attention's ``acc * alpha``), and W2 reads no
  carried value directly (its accumulator is computed from A, its other register operand P
  from the rest of the body).

W2's register operands (P and ``acc * alpha``) become carried values instead of A, and the
loop becomes

    if lb < ub:
        the body for lb up to W2's operands                (W1 issued and waited)
        for j in [lb + 1, ub): carry (..., P, acc')
            W1(j) issued; W2(P, V_(j-1), acc') issued       one turn for both under pingpong
            wait for W1 (pending 1: W2 stays in flight)
            the body up to its first read of A
            A = wait for W2; release stage j - 1            (U2 and what followed it)
            the rest of the body, up to W2's next operands
        W2 for ub - 1, its wait and release
    else: the initial values

Waits and releases stay paired with their stages.  W2's stage is released one iteration
later than before (W1's, on a ring of its own, right after W1's wait): a ring of two stages
still works (the producer fills stage j while the consumers hold j - 1) but then runs one
stage less ahead, which on an H100 ate the whole gain while K and V still shared one
``empty`` ring (attention at D=128 gained 10% with three stages, nothing with two;
benchmarks/RESULTS.md), and a loop on a ring of one stage is left alone.  With pingpong
the turn around W2 goes: the prologue keeps W1's turn, each iteration issues W1 and W2 in one
turn, and the last W2 takes its own, so both warpgroups still take the same number of turns
in the same order.  The pin cannot be combined with ``issue_ahead``, which moves the same
loop's first product the other way.

A kernel the pin leaves wholly as it is gets a remark at each consumer loop with products of
its own, saying which of the above it misses (``tkc compile`` prints it as a note): with the
pin ``transpose_in_producer = false`` FP8 attention's P V reads V as the consumers transposed
it into one shared tile, rewritten every iteration, and with V^T given its P goes through
shared memory, so neither qualifies.

Must not: change what any iteration computes.
"""

from __future__ import annotations

from dataclasses import dataclass

from tkc.errors import TkcUnsupportedError, remark
from tkc.ir.core import Block, Module, Operation, Region, Value, clone
from tkc.ir.dialects import tile
from tkc.ir.types import TileType
from tkc.passes.rotate import I32, pinned_kernels, replace_guarded, turn_around
from tkc.pins import Options
from tkc.target import Target


def defer_last(module: Module, options: Options, target: Target) -> None:
    for kernel in pinned_kernels(module, options.defer_last):
        if options.issue_ahead:
            raise TkcUnsupportedError("defer_last = true and issue_ahead = true move the same loop's products "
                                      "in opposite directions; pin one of them", kernel.loc)
        left: list[tuple[Operation, str]] = []
        rotated = False
        for loop in [op for op in kernel.walk() if op.name == "tile.for"]:
            plan = _plan(loop)
            if isinstance(plan, _Plan):
                _rotate(loop, plan)
                rotated = True
            elif plan is not None:
                left.append((loop, plan))
        if not rotated:
            # A pin that changes nothing says so, at each loop it could have changed.
            for loop, why in left:
                remark(f"defer_last = true leaves this loop as it is: {why}", loop.loc)
            if not left:
                remark("defer_last = true changes nothing here: no loop of the consumer warpgroups issues "
                       "products", kernel.loc)


@dataclass
class _Plan:
    """What moves where."""

    w1: Operation  # the first product, and its wait
    u1: Operation
    w2: Operation  # the last product, and its wait
    u2: Operation
    turns_w1: tuple[Operation, ...]  # W1's turn wait and pass (pingpong), else ()
    moved: list[Operation]  # W2's ring waits, turn, W2, U2 and the releases after it, in body order
    recompute: list[Operation]  # the induction-variable ops those read, cloned per iteration served
    operands: list[Value]  # W2's register operands computed in the body: carried in the new loop
    k: int  # A's index among the carried values
    acc: Value  # A, the carried block argument
    first_use: Operation  # the first top-level op reading A


def _owner(v: Value) -> Operation | None:
    return getattr(v, "owner", None)


def _plan(loop: Operation) -> _Plan | str | None:
    """What moves where, or why the loop stays as it is (None: a loop without products of its
    own, such as a persistent kernel's tile loop around its K loop, or one of the producer's)."""
    body: Block = loop.regions[0].block
    ops = body.ops
    inner = list(loop.walk())[1:]
    products = [op for op in inner if op.name == "hopper.wgmma"]
    producer = any(a.name == "hopper.role" and a.attributes.get("name") == "producer" for a in loop.ancestors())
    if producer or not any(w.parent is body for w in products):
        return None
    if any(op.name in ("hopper.tma_load", "hopper.expect_tx") for op in inner) or not any(
            a.name == "hopper.role" for a in loop.ancestors()):
        # Releasing a stage later could stall copies the loop issues itself.
        return "the loop issues its own copies (no producer warpgroup)"
    if tile.constant_value(loop.step) != 1:
        return "its step is not 1"
    if len(products) != 2 or any(w.parent is not body for w in products):
        return (f"it issues {len(products)} product{'s' if len(products) != 1 else ''}; the pin moves the "
                f"second of a loop's two, outside any branch, behind the next iteration's first")
    w1, w2 = products
    iv, carried = body.args[0], list(body.args[1:])
    users = {w: [o for o in inner if w.result in o.operands] for w in products}
    if any(len(u) != 1 or u[0].name != "hopper.wgmma_wait" or u[0].parent is not body for u in users.values()):
        return "its products are not each waited for once in the loop's body"
    u1, u2 = users[w1][0], users[w2][0]
    term = body.terminator
    if term is None or [o for o in inner if u2.result in o.operands] != [term] or \
            list(term.operands).count(u2.result) != 1:
        return "the second product's sum is read in the iteration, not only carried to the next"
    k = list(term.operands).index(u2.result)
    acc = carried[k]
    if not any(_owner(v) is not None and _owner(v).name == "hopper.stage" for v in w2.operands):
        # Not reading a ring: no stage to hold for an iteration more.
        return ("the second product reads no ring stage, only shared tiles rewritten every iteration (such as "
                "FP8 attention's V, transposed in shared memory by the consumers), which a product issued an "
                "iteration late would read after the next iteration's rewrite")
    if any((_ring_stages(op) or 2) < 2 for op in inner if op.name == "hopper.stage"):
        return "a ring has one stage, which cannot hold the previous block while the next one lands"
    turns_w1, turns_w2 = turn_around(ops, w1), turn_around(ops, w2)
    if turns_w1 is None or turns_w2 is None:
        return "its products' turns (pingpong) are not each right around its product"
    i1, iu1, i2, iu2 = (ops.index(op) for op in (w1, u1, w2, u2))
    if not i1 < iu1 < i2:
        return "its first product is not waited for before the second is issued"

    defined = {r for op in inner for r in op.results} | set(body.args)
    iv_only = _iv_only(ops, iv, defined)

    def of_iv(v: Value) -> bool:
        return v is iv or v not in defined or _owner(v) in iv_only

    # U2 and what follows it: releases of ring stages and the stage numbers they need.
    after = [op for op in ops[iu2 + 1:] if op is not term]
    if any(op.regions or not (op in iv_only or op.name == "hopper.mbarrier_arrive" and all(map(of_iv, op.operands)))
           for op in after) or any(_owner(v) in after for v in term.operands):
        return "more than the release of ring stages follows the second product's wait"
    # The ring waits between U1 and W2 (W2's operands' stages) move with W2.
    ring_waits = [op for op in ops[iu1 + 1:i2] if op.name == "hopper.mbarrier_wait" and all(map(of_iv, op.operands))]
    moved = sorted({*ring_waits, *turns_w2, w2, u2, *after}, key=ops.index)

    # W2's operands: from outside the loop, recomputed from the induction variable, or carried.
    operands: list[Value] = []
    for v in w2.operands:
        if v in carried:  # a chain of products: pipeline-loops' business
            return "the second product reads a value the loop carries as it is (a chain of sums)"
        if not of_iv(v) and v not in operands:
            operands.append(v)
    recompute = _closure([v for op in moved for v in op.operands if v not in operands], iv_only - set(moved), ops)

    # A is first read after W1 is issued.
    rest = [op for op in ops if op not in moved and op is not term]
    first_use = next((op for op in rest if any(acc in o.operands for o in op.walk())), None)
    if first_use is None or rest.index(first_use) < rest.index(w1):
        return "the second product's sum is read before the first product is issued"
    # Nothing else reads shared memory, which the moved ring waits might guard.
    for op in rest:
        if op is w1 or op.name == "hopper.stage":
            continue
        if any(isinstance(v.type, TileType) and v.type.space == "smem" for o in op.walk() for v in o.operands):
            return ("the iteration reads or writes a shared tile outside its products (a register operand "
                    "staged through shared memory for the second product, such as P, would be rewritten by the "
                    "next iteration before a product issued an iteration late reads it)")
    return _Plan(w1=w1, u1=u1, w2=w2, u2=u2, turns_w1=turns_w1, moved=moved, recompute=recompute,
                 operands=operands, k=k, acc=acc, first_use=first_use)


def _ring_stages(stage: Operation) -> int | None:
    ring = _owner(stage.operands[0])
    return None if ring is None else ring.attributes.get("stages")


def _iv_only(ops: list[Operation], iv: Value, defined: set[Value]) -> set[Operation]:
    """The body's pure top-level ops computed from the induction variable and values defined
    outside the loop only (stage numbers, phases, ring stages)."""
    out: set[Operation] = set()
    for op in ops:
        if not op.regions and op.has_trait("pure") and \
                all(v is iv or v not in defined or _owner(v) in out for v in op.operands):
            out.add(op)
    return out


def _closure(seeds: list[Value], iv_only: set[Operation], ops: list[Operation]) -> list[Operation]:
    """The induction-variable ops ``seeds`` are computed by, in body order."""
    need: set[Operation] = set()
    work = [_owner(v) for v in seeds]
    while work:
        op = work.pop()
        if op is None or op in need or op not in iv_only:
            continue
        need.add(op)
        work += [_owner(v) for v in op.operands]
    return [op for op in ops if op in need]


def _rotate(loop: Operation, p: _Plan) -> None:
    body: Block = loop.regions[0].block
    g = loop.operand_groups()
    lb, ub, step, inits = g["lb"], g["ub"], g["step"], list(g["init"])
    iv, carried = body.args[0], list(body.args[1:])
    term = body.terminator
    rest = [op for op in body.ops if op not in p.moved and op is not term]
    kept = [i for i in range(len(carried)) if i != p.k]
    loc = loop.loc

    def scalar(into: Block, cls: type[Operation], operands: list[Value], attrs: dict | None = None) -> Value:
        return into.append(cls(operands, [I32], attrs, loc=loc)).result

    def emit_moved(into: Block, at: Value, ops: list[Operation], mapping: dict[Value, Value]) -> None:
        """``ops`` of the moved part for iteration ``at``, after the stage numbers they need;
        ``mapping`` gives W2's register operands (or W2 itself, for its wait) and gets the
        clones."""
        mapping[iv] = at
        for op in [*p.recompute, *ops]:
            into.append(clone(op, mapping))

    issue_w2 = [op for op in p.moved if op.name == "hopper.mbarrier_wait"]
    release = p.moved[p.moved.index(p.u2):]
    anchor = p.turns_w1[0] if p.turns_w1 else p.w1

    def emit_rest(into: Block, mapping: dict[Value, Value], w2_at: Value | None = None,
                  w2_regs: list[Value] = ()) -> None:
        """The body but the moved part, into ``into``; with ``w2_at``, W2 for that iteration
        (its register operands ``w2_regs``) issued right after W1 in W1's turn, and A read from
        its wait."""
        w2_map: dict[Value, Value] = dict(zip(p.operands, w2_regs))
        for op in rest:
            if w2_at is not None and op is anchor:
                emit_moved(into, w2_at, issue_w2, w2_map)
            if w2_at is not None and op is p.first_use:
                done = {p.w2.result: w2_map[p.w2.result]}
                emit_moved(into, w2_at, release, done)
                mapping[p.acc] = done[p.u2.result]
            new = into.append(clone(op, mapping))
            if w2_at is not None and op is p.w1:
                into.append(clone(p.w2, w2_map))
            if w2_at is not None and op is p.u1:
                new.attributes["pending"] = 1  # W2, issued after W1, stays in flight

    # The first iteration, up to W2's operands.
    then = Block()
    first: dict[Value, Value] = {iv: lb, **dict(zip(carried, inits))}
    emit_rest(then, first)
    one = scalar(then, tile.ConstantOp, [], {"value": 1})
    start = scalar(then, tile.AddOp, [lb, one])
    # The steady state: W1(j) with W2(j - 1) behind it.
    types = [carried[i].type for i in kept] + [v.type for v in p.operands]
    steady_body = Block([iv.type, *types], [iv.name_hint, *[carried[i].name_hint for i in kept],
                                            *[v.name_hint for v in p.operands]])
    j, *args = steady_body.args
    mapping: dict[Value, Value] = {iv: j, **{carried[i]: a for i, a in zip(kept, args)}}
    prev = scalar(steady_body, tile.SubOp, [j, one])
    emit_rest(steady_body, mapping, prev, args[len(kept):])
    yielded = [mapping.get(v, v) for v in term.operands]
    steady_body.append(tile.YieldOp([yielded[i] for i in kept] + [mapping.get(v, v) for v in p.operands],
                                    [], loc=loc))
    start_values = [first.get(term.operands[i], term.operands[i]) for i in kept] + \
        [first.get(v, v) for v in p.operands]
    steady = tile.ForOp([start, ub, step, *start_values], types, loc=loc)
    steady.regions.append(Region([steady_body]))
    steady.regions[0].parent = steady
    then.append(steady)
    # The last iteration's W2, its wait and releases.
    last = scalar(then, tile.SubOp, [ub, one])
    out = dict(zip(p.operands, steady.results[len(kept):]))
    emit_moved(then, last, p.moved, out)
    results = list(steady.results[:len(kept)])
    results.insert(p.k, out[p.u2.result])
    then.append(tile.YieldOp(results, [], loc=loc))
    replace_guarded(loop, then)
