"""The ``count-divisions`` pass: a loop's ``(i + c) // d`` and ``(i + c) % d``, where ``i`` is
its induction variable and ``d`` a divisor known only at run time, become a quotient and a
remainder the loop carries and steps (remainder + 1; at ``d`` it wraps to 0 and the quotient
grows by one).

A runtime division is about 30 instructions on the GPU (ten with codegen's reciprocal form),
the step five, and the warps that pay it are the ones doing the loop's real work: ring
attention's one loop over every rank's K/V blocks takes its rank and block from ``jj // nb``
and ``jj % nb`` on every iteration, in the consumer warpgroups (the edge mask, the wait for a
rank's first block) and in the producer (the copies' coordinates).

Runs on hopper IR after the passes that restructure loops (pipelining, specialization and the
rotations clone and re-index loop bodies, which a carried count would stop), before
``cse``/``dce``.  Only loops that hold no other loop and step by 1, whose trip count is not
capped by a constant (a ring's prologue) nor the divisor itself (``range(num_ranks())``: one
wrap at most), and only divisors defined outside the loop that are provably not negative
(built from sizes, ranks, program counts and non-negative constants): from the exact values at
the loop's first iteration, the step keeps Python's floor semantics (and the interpreter's 0
for a zero divisor).  Divisions by constants LLVM does well itself.

Must not: change any value an iteration computes.
"""

from __future__ import annotations

from tkc import dtypes
from tkc.ir.builder import Builder
from tkc.ir.core import Module, Operation, OpResult, Value, defined_inside, replace_all_uses
from tkc.ir.dialects import tile
from tkc.ir.types import ScalarType
from tkc.pins import Options
from tkc.target import Target

I32 = ScalarType(dtypes.i32)
I1 = ScalarType(dtypes.i1)

#: Ops whose i32 result is never negative.
_SIZES = ("tile.dim", "tile.num_ranks", "tile.num_programs", "tile.num_sms", "tile.program_id", "tile.rank")


def count_divisions(module: Module, options: Options, target: Target) -> None:
    for kernel in module.ops:
        if kernel.name != "tile.kernel":
            continue
        for loop in [op for op in kernel.walk() if op.name == "tile.for"]:
            if _counted_loop(loop):
                _count(kernel, loop)


def _counted_loop(loop: Operation) -> bool:
    """Innermost with a trip count not capped by a constant (``tile.innermost_uncapped``), a
    bound that is not a constant, step 1, and not a loop whose every thread holds accumulators
    (products outside a warp-specialized role), where two more registers cost more than the
    division: attention backward at D = 128 spilled."""
    if not tile.innermost_uncapped(loop) or tile.constant_value(loop.operands[1]) is not None:
        return False
    if any(op.name == "hopper.wgmma" for op in loop.walk()) \
            and not any(a.name == "hopper.role" for a in loop.ancestors()):
        return False
    return tile.constant_value(loop.operands[2]) == 1


def _nonnegative(v: Value, seen: dict[Value, bool] | None = None) -> bool:
    """Whether ``v`` (an i32 scalar) is never negative, from how it is computed (sizes wrap
    around nowhere a kernel's indices could not)."""
    seen = {} if seen is None else seen
    if v in seen:
        return seen[v]
    seen[v] = False
    out = False
    if isinstance(v, OpResult):
        op, xs = v.owner, v.owner.operands
        c = tile.constant_value(v)
        if c is not None:
            out = c >= 0
        elif op.name in _SIZES:
            out = True
        elif op.name in ("tile.add", "tile.mul", "tile.cdiv", "tile.floordiv", "tile.minimum"):
            out = all(_nonnegative(x, seen) for x in xs)
        elif op.name in ("tile.maximum", "tile.and"):
            out = any(_nonnegative(x, seen) for x in xs)
        elif op.name == "tile.rem":  # the divisor's sign (0 for a zero divisor)
            out = _nonnegative(xs[1], seen)
        elif op.name == "tile.select":
            out = all(_nonnegative(x, seen) for x in xs[1:])
    seen[v] = out
    return out


def _dividend(v: Value, iv: Value, inside: set[Value]) -> tuple[str, Value | None] | None:
    """``v`` as ``iv`` (("", None)), ``iv + c`` / ``c + iv`` (("add", c)) or ``iv - c``
    (("sub", c)) with ``c`` not in ``inside`` (defined outside the loop); else None."""
    if v is iv:
        return "", None
    if not isinstance(v, OpResult) or v.type != I32:
        return None
    op = v.owner
    if op.name == "tile.add":
        a, b = op.operands
        if a is iv and b not in inside:
            return "add", b
        if b is iv and a not in inside:
            return "add", a
    if op.name == "tile.sub" and op.operands[0] is iv and op.operands[1] not in inside:
        return "sub", op.operands[1]
    return None


def _count(kernel: Operation, loop: Operation) -> None:
    body = loop.regions[0].block
    iv = body.args[0]
    inside = defined_inside(loop)
    groups: dict[tuple, list[Operation]] = {}
    for op in loop.walk():
        if op.name not in ("tile.floordiv", "tile.rem") or op.result.type != I32:
            continue
        d = op.operands[1]
        if tile.constant_value(d) is not None or d in inside or not _nonnegative(d):
            continue
        if loop.operands[1] is d:
            # at most d iterations wrap once at most: a walk over the ranks inside a persistent
            # GEMM's tile loop paid more for the first quotient (a whole division a tile) than
            # for its divisions by a reciprocal (GEMM + all-reduce 0.965x on 2 x H200)
            continue
        form = _dividend(op.operands[0], iv, inside)
        if form is not None:
            groups.setdefault((*form, d), []).append(op)
    for (how, c, d), ops in groups.items():
        q, r = _carry(loop, how, c, d)
        for op in ops:
            replace_all_uses(kernel, op.result, q if op.name == "tile.floordiv" else r)
            op.erase()


def _carry(loop: Operation, how: str, c: Value | None, d: Value) -> tuple[Value, Value]:
    """The quotient and remainder of ``lb (+|-) c`` by ``d`` before the loop, carried and
    stepped at the end of each iteration; their block arguments."""
    b = Builder.before(loop)
    first = loop.operands[0]
    if how == "add":
        first = b.value(tile.AddOp, [first, c], I32)
    elif how == "sub":
        first = b.value(tile.SubOp, [first, c], I32)
    q0 = b.value(tile.FloorDivOp, [first, d], I32)
    r0 = b.value(tile.RemOp, [first, d], I32)
    zero = b.value(tile.ConstantOp, [], I32, {"value": 0})
    one = b.value(tile.ConstantOp, [], I32, {"value": 1})
    # a zero divisor: quotient and remainder stay 0 (the remainder wraps at once)
    grow = b.value(tile.SelectOp, [b.value(tile.CmpOp, [d, zero], I1, {"pred": "gt"}), one, zero], I32)
    body = loop.regions[0].block
    carried = []
    for v, name in ((q0, "q"), (r0, "r")):
        loop.operands.append(v)
        carried.append(body.add_arg(I32, name))
        loop.results.append(OpResult(I32, loop, len(loop.results), name))
    q, r = carried
    term = body.terminator
    s = Builder.before(term)
    r1 = s.value(tile.AddOp, [r, one], I32)
    wrap = s.value(tile.CmpOp, [r1, d], I1, {"pred": "ge"})
    term.operands.append(s.value(tile.AddOp, [q, s.value(tile.SelectOp, [wrap, grow, zero], I32)], I32))
    term.operands.append(s.value(tile.SelectOp, [wrap, zero, r1], I32))
    return q, r
