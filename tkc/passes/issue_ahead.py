"""The ``issue-ahead`` pass: a loop's first product, when it reads nothing the loop carries,
is issued one iteration early, so the tensor cores compute it while the warpgroup works in
registers on the current one (FlashAttention-3's intra-warpgroup overlap: S_(j+1) =
Q K_(j+1)^T runs during the softmax of S_j).

Runs on hopper IR after ``pipeline-loops`` and ``specialize-warps``, under the pin
``issue_ahead = true``.  A ``tile.for`` with step 1 in a consumer role (a producer role
issues its copies) qualifies when its body holds a ``hopper.wgmma`` W reading a ring stage,
whose operands, and the ring waits before it in the body, depend only on the induction
variable and on values defined outside the loop (attention's ``S = Q K^T``: Q, the ring
stage of K, a zero accumulator), none of them a shared tile the loop stores into (a register
tile staged for W, as Mamba-2's state: W(j + 1) would read it before iteration j wrote it),
whose one use is a ``hopper.wgmma_wait`` in the body, and
when the loop yields no product still in flight.  The loop becomes

    if lb < ub:
        issue W(lb)                      with the ring waits it needs
        for j in [lb, ub - 1): carry (..., W in flight)
            s = wgmma_wait(W carried)
            issue W(j + 1)               its ring waits move with it
            the rest of the body, on s
        the last iteration, ub - 1: s = wgmma_wait(W carried); the rest of the body
    else: the initial values

Waiting for the next stage one iteration early is safe with a ring of two or more stages
(the producer fills stage j + 1 while the consumers hold stage j), and the next stage is
released no earlier than before: its release still follows the iteration that reads it.

With ``pingpong = true`` the consumers' turn around W (``specialize-warps`` brackets every
product with a turn ``wait`` and ``pass``) moves with it: each warpgroup still takes one turn
a product, in the same order as the other (S of the first block; then S of block j + 1 and
P V of block j in each iteration), so the turns stay paired.  The turns then tie the two
warpgroups' iterations together (neither issues its P V before the other has issued its next
S), which on an H100 cost more than the overlap gained on most attention shapes
(benchmarks/RESULTS.md).  A turn anywhere else in the loop leaves it as it is.

Must not: change what any iteration computes.
"""

from __future__ import annotations

from tkc.ir.core import Block, Module, Operation, Region, Value, clone
from tkc.ir.dialects import hopper, tile
from tkc.ir.types import ScalarType
from tkc.passes.rotate import I32, pinned_kernels, replace_guarded, turn_around
from tkc.pins import Options
from tkc.target import Target


def issue_ahead(module: Module, options: Options, target: Target) -> None:
    for kernel in pinned_kernels(module, options.issue_ahead):
        for loop in [op for op in kernel.walk() if op.name == "tile.for"]:
            plan = _plan(loop)
            if plan is not None:
                _rotate(loop, *plan)


def _plan(loop: Operation) -> tuple[list[Operation], Operation, Operation] | None:
    """(the ops that issue W, in body order: W, its ring waits and what they compute from the
    induction variable; W; W's wait), or None when the loop does not qualify."""
    if tile.constant_value(loop.step) != 1:
        return None
    body: Block = loop.regions[0].block
    ops = body.ops
    inner = list(loop.walk())
    if any(op.name in ("hopper.tma_load", "hopper.expect_tx") for op in inner) or not any(
            a.name == "hopper.role" for a in loop.ancestors()):
        return None  # the loop issues its own copies: the next stage's may not be under way yet
    yielded = body.terminator.operands if body.terminator else []
    if any(getattr(getattr(v, "owner", None), "name", None) == "hopper.wgmma" for v in yielded):
        return None  # a product in flight across iterations already (pipeline-loops' GEMM)
    iv, carried = body.args[0], set(body.args[1:])
    for w in (op for op in ops if op.name == "hopper.wgmma"):
        users = [o for o in inner if w.result in o.operands]
        if len(users) != 1 or users[0].name != "hopper.wgmma_wait" or users[0].parent is not body:
            continue
        if not any(getattr(getattr(v, "owner", None), "name", None) == "hopper.stage" for v in w.operands):
            continue  # not reading a ring: nothing ahead to overlap with
        if any(_written_in(v, inner, w) for v in w.operands):
            continue  # a shared tile the loop writes (a register tile staged for W): W(j + 1) reads it first
        seeds = [op for op in ops[:ops.index(w)] if op.name == "hopper.mbarrier_wait"] + [w]
        issue = _closure(seeds, body, iv, carried)
        turn = turn_around(ops, w)
        if issue is not None and turn is not None:
            return [op for op in ops if op in issue or op in turn], w, users[0]
    return None


def _written_in(v: Value, ops: list[Operation], w: Operation) -> bool:
    """Whether ``v``, a shared tile that is not a ring's stage, is an operand of an op of the
    loop other than products (``ops``: the loop's ops, nested ones too): a store into it, so
    its contents change from one iteration to the next though ``v`` itself does not.  (A ring's
    stages are the producer's to fill, and W's ring waits move with it.)"""
    owner = getattr(v, "owner", None)
    if not (getattr(v.type, "space", None) == "smem" and (owner is None or owner.name != "hopper.stage")):
        return False
    return any(v in op.operands and op is not w and op.name != "hopper.wgmma" for op in ops)


def _closure(seeds: list[Operation], body: Block, iv: Value, carried: set[Value]) -> set[Operation] | None:
    """``seeds`` and the body ops they read from, if all of them are pure (or ring waits, or
    the product itself) and none reads a carried value; else None."""
    need: set[Operation] = set()
    work = list(seeds)
    while work:
        op = work.pop()
        if op in need:
            continue
        if op.regions or not (op.has_trait("pure") or op.name in ("hopper.mbarrier_wait", "hopper.wgmma")):
            return None
        need.add(op)
        for v in op.operands:
            if v in carried:
                return None
            owner = getattr(v, "owner", None)
            if owner is not None and owner.parent is body:
                work.append(owner)
    return need


def _rotate(loop: Operation, issue: list[Operation], w: Operation, wait: Operation) -> None:
    body: Block = loop.regions[0].block
    g = loop.operand_groups()
    lb, ub, step, inits = g["lb"], g["ub"], g["step"], list(g["init"])
    iv, carried = body.args[0], list(body.args[1:])
    rest = [op for op in body.ops if op is not wait and op is not w and not op.has_trait("terminator")
            and not (op in issue and op.name in ("hopper.mbarrier_wait", "hopper.turn"))]
    result_types = [r.type for r in loop.results]
    loc = loop.loc

    def emit_issue(into: Block, at: Value) -> Value:
        """The issuing ops for induction variable ``at``, appended to ``into``; W's result."""
        mapping: dict[Value, Value] = {iv: at}
        for op in issue:
            into.append(clone(op, mapping))
        return mapping[w.result]

    def emit_rest(into: Block, at: Value, args: list[Value], s: Value) -> list[Value]:
        """The rest of the body for induction variable ``at``, carried values ``args`` and W's
        waited result ``s``, appended to ``into``; the values it yields."""
        mapping: dict[Value, Value] = {iv: at, wait.result: s, **dict(zip(carried, args))}
        for op in rest:
            into.append(clone(op, mapping))
        return [mapping.get(v, v) for v in body.terminator.operands]

    def wait_for(into: Block, v: Value) -> Value:
        op = into.append(hopper.WgmmaWaitOp([v], [wait.result.type], dict(wait.attributes), loc=wait.loc))
        return op.result

    def scalar(into: Block, cls: type[Operation], operands: list[Value], t: ScalarType = I32,
               attrs: dict | None = None) -> Value:
        return into.append(cls(operands, [t], attrs, loc=loc)).result

    then = Block()
    first = emit_issue(then, lb)
    one = scalar(then, tile.ConstantOp, [], attrs={"value": 1})
    last = scalar(then, tile.SubOp, [ub, one])
    # The steady state: wait for this iteration's product, issue the next one, do the rest.
    inner = Block([iv.type, *[c.type for c in carried], w.result.type],
                  [iv.name_hint, *[c.name_hint for c in carried], "ahead"])
    j, *args, ahead = inner.args
    s = wait_for(inner, ahead)
    nxt = emit_issue(inner, scalar(inner, tile.AddOp, [j, one]))
    inner.append(tile.YieldOp([*emit_rest(inner, j, list(args), s), nxt], [], loc=loc))
    steady = tile.ForOp([lb, last, step, *inits, first], [*result_types, w.result.type], loc=loc)
    steady.regions.append(Region([inner]))
    steady.regions[0].parent = steady
    then.append(steady)
    # The last iteration: its product was issued by the one before (or before the loop).
    s_last = wait_for(then, steady.results[-1])
    then.append(tile.YieldOp(emit_rest(then, last, list(steady.results[:-1]), s_last), [], loc=loc))
    replace_guarded(loop, then)
