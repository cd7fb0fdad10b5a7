"""The ``canonicalize`` pass: fold constants and simplify, to a fixpoint.

Each rewrite is a small function ``pattern(op, rw) -> bool`` that either
leaves the IR alone and returns False, or rewrites ``op`` and returns True.
The driver offers every op to every pattern until a whole round changes
nothing.  A rewrite never changes what the kernel computes, bit for bit, as
the interpreter runs it: a constant fold asks the ops' semantics
(``tkc.semantics.evaluate``) what the op computes, so an op's meaning has one
home.  Left alone: libm functions (numpy's vector and scalar paths may differ
in the last bit), float sums (summation order), and answers the target chooses
for itself (integer division by zero, max/min of NaN or of two zeros), each
as its op's declaration says (``FOLDS``, ``target_defined``).
New ops take the location of the op they replace.

Ops that become unused (the constants a fold consumed, say) are left for
``dce``; merging equal constants is ``cse``'s job.
"""

from __future__ import annotations

import math
from collections.abc import Callable


from tkc import dtypes
from tkc.dtypes import DType
from tkc.ir.builder import Builder
from tkc.ir.core import Block, Module, Operation, OpResult, Value
from tkc.ir.dialects import tile
from tkc.semantics import evaluate
from tkc.ir.types import element_dtype

Scalar = int | float | bool
Pattern = Callable[[Operation, "Rewrites"], bool]

# No pattern set should need more rounds than this; more means two patterns
# undo each other, which is a bug in this file.
_MAX_ROUNDS = 1000


def canonicalize(module: Module, *_: object) -> None:
    """Apply every pattern to every op until nothing changes."""
    for kernel in module.ops:
        for _ in range(_MAX_ROUNDS):
            if not _round(kernel):
                break
        else:
            raise RuntimeError(f"canonicalize did not converge on {kernel!r}")


def _round(kernel: Operation) -> bool:
    rw = Rewrites(kernel)
    changed = False
    for op in list(kernel.walk()):
        if op is kernel or not _attached(op, kernel):
            continue
        rw.apply(op)
        for pattern in PATTERNS.get(op.name, ()):
            if pattern(op, rw):
                changed = True
                break
    rw.flush()
    return changed


class Rewrites:
    """The values a round has replaced, applied to each op's operands as the round reaches it.

    SSA puts every use after its definition, so a replacement only has to reach the ops the
    round has not visited yet: recording it and renaming operands on the way costs one pass
    over the kernel per round, where rewriting every use at once would cost one per fold (a
    kernel of 10,000 folds took minutes).  :meth:`flush` renames everywhere, for a pattern
    that counts uses and at the end of the round."""

    def __init__(self, kernel: Operation):
        self.kernel = kernel
        self.renamed: dict[Value, Value] = {}
        self.emptied: dict[int, Block] = {}  # blocks whose lists the flush brings up to date
        self.before: dict[int, list[Operation]] = {}  # ops to put before an op (by id) at the flush

    def resolve(self, v: Value) -> Value:
        while v in self.renamed:
            v = self.renamed[v]
        return v

    def apply(self, op: Operation) -> None:
        if self.renamed and any(v in self.renamed for v in op.operands):
            op.operands = [self.resolve(v) for v in op.operands]

    def replace(self, op: Operation, new: list[Value]) -> None:
        """``op``'s results become ``new``; ``op`` is erased."""
        for old, value in zip(op.results, new):
            if old is not value:
                self.renamed[old] = value
        # Detached now (so it reads as erased), taken out of its block's list at the flush: one
        # pass over the block instead of a search of it per erased op.
        self.emptied[id(op.parent)] = op.parent
        op.parent = None

    def insert_before(self, op: Operation, new: Operation) -> Operation:
        """``new`` in ``op``'s block, right before it (listed there at the flush)."""
        new.parent = op.parent
        self.emptied[id(op.parent)] = op.parent
        self.before.setdefault(id(op), []).append(new)
        return new

    def flush(self) -> None:
        for block in self.emptied.values():
            ops: list[Operation] = []
            for o in block.ops:
                ops += self.before.get(id(o), ())
                if o.parent is block:
                    ops.append(o)
            block.ops[:] = ops
        self.emptied.clear()
        self.before.clear()
        if self.renamed:
            for op in self.kernel.walk():
                self.apply(op)
            self.renamed.clear()

    def use_count(self, v: Value) -> int:
        self.flush()
        return sum(1 for op in self.kernel.walk() for x in op.operands if x is v)


def _attached(op: Operation, root: Operation) -> bool:
    """Whether ``op`` is still inside ``root`` (an earlier rewrite may have
    erased it or the op whose region holds it)."""
    while op is not root:
        block = op.parent
        if block is None or block.parent is None or block.parent.parent is None:
            return False
        op = block.parent.parent
    return True


# ------------------------------------------------------------------ helpers
def _scalar(x: object, dt: DType) -> Scalar:
    """``x`` rounded to ``dt``, as a plain Python bool, int or float."""
    return dtypes.round_to(x, dt).item()


def _replace(op: Operation, new: list[Value], rw: Rewrites) -> None:
    rw.replace(op, new)


def _replace_by_constant(op: Operation, value: Scalar, rw: Rewrites) -> None:
    t = op.result.type
    new = rw.insert_before(op, tile.ConstantOp([], [t], {"value": _scalar(value, t.dtype)}, loc=op.loc)).result
    new.name_hint = op.result.name_hint  # the printer keeps the user's name
    _replace(op, [new], rw)


def _is(v: Value, want: float, signed_zero: bool = False) -> bool:
    """Whether ``v`` is a constant equal to ``want`` (and, for floats with
    ``signed_zero``, of the same sign, since x + 0.0 is not x when x is -0.0)."""
    c = tile.constant_value(v)
    if c is None or isinstance(c, bool) or c != want:
        return False
    return not (signed_zero and isinstance(c, float) and math.copysign(1, c) != math.copysign(1, want))


# --------------------------------------------------------- constant folding
def fold_elementwise(op: Operation, rw: Rewrites) -> bool:
    """An elementwise op (or a compare or cast) whose operands are all
    constants becomes the constant the interpreter computes for it."""
    vals = [tile.constant_value(v) for v in op.operands]
    if any(v is None for v in vals) or (isinstance(op, tile.ElementwiseOp) and op.target_defined(vals)):
        return False
    args = [dtypes.round_to(x, element_dtype(v.type)) for x, v in zip(vals, op.operands)]
    _replace_by_constant(op, evaluate(op, args).item(), rw)
    return True


def fold_shape_of_constant(op: Operation, rw: Rewrites) -> bool:
    """splat / broadcast / expand_dims / transpose of a constant, and max/min
    reductions of one, are a constant of the result type.  (A sum is not
    folded: its rounding depends on the interpreter's summation order.)"""
    c = tile.constant_value(op.operands[0])
    if c is None or (op.name == "tile.reduce" and op.attributes["kind"] == "sum"):
        return False
    _replace_by_constant(op, c, rw)
    return True


# ------------------------------------------------------------ identities
def fold_unit_scan(op: Operation, rw: Rewrites) -> bool:
    """A scan along an axis of extent 1 is its operand."""
    if op.x.type.shape[op.axis] != 1:
        return False
    _replace(op, [op.x], rw)
    return True


def fold_add_zero(op: Operation, rw: Rewrites) -> bool:
    """x + 0 and 0 + x.  For floats only -0.0 is an identity (-0.0 + 0.0 is +0.0)."""
    dt = element_dtype(op.result.type)
    zero = -0.0 if dt.is_float else 0
    for x, z in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
        if _is(z, zero, signed_zero=True):
            _replace(op, [x], rw)
            return True
    return False


def fold_sub_zero(op: Operation, rw: Rewrites) -> bool:
    """x - 0 (x - 0.0 is x for every float, -0.0 included)."""
    if _is(op.rhs, 0, signed_zero=True):
        _replace(op, [op.lhs], rw)
        return True
    return False


def fold_mul_one_or_zero(op: Operation, rw: Rewrites) -> bool:
    """x * 1 and 1 * x; x * 0 and 0 * x for integers only (for floats
    inf * 0 is NaN and -x * 0 is -0.0)."""
    is_int = element_dtype(op.result.type).is_int
    for x, k in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
        if _is(k, 1):
            _replace(op, [x], rw)
            return True
        if is_int and _is(k, 0):
            _replace(op, [k], rw)
            return True
    return False


def fold_div_one(op: Operation, rw: Rewrites) -> bool:
    """x // 1 and x / 1.0."""
    if _is(op.rhs, 1):
        _replace(op, [op.lhs], rw)
        return True
    return False


def fold_noop_conversion(op: Operation, rw: Rewrites) -> bool:
    """A cast or broadcast to the operand's own type."""
    if op.operands[0].type == op.result.type:
        _replace(op, [op.operands[0]], rw)
        return True
    return False


def fold_double_transpose(op: Operation, rw: Rewrites) -> bool:
    inner = op.x
    if isinstance(inner, OpResult) and inner.owner.name == "tile.transpose":
        _replace(op, [inner.owner.x], rw)
        return True
    return False


def fold_select(op: Operation, rw: Rewrites) -> bool:
    """select with a constant condition, or with equal branches."""
    c = tile.constant_value(op.cond)
    if c is not None:
        _replace(op, [op.a if c else op.b], rw)
        return True
    if op.a is op.b:
        _replace(op, [op.a], rw)
        return True
    return False


def fold_accumulate_mma(op: Operation, rw: Rewrites) -> bool:
    """add(acc, mma(a, b, 0)) -> mma(a, b, acc), when the add is the mma's
    only use: this is how ``acc += a @ b`` becomes an accumulating mma (and
    ``acc += dot_scaled(...)`` an accumulating ``tile.dot_scaled``).

    Exact when the interpreter computes mma as ``acc + a @ b`` in f32: both
    sides are then acc + P.  (The one exception is a zero product
    P = -0.0 with acc = -0.0, where 0.0 + P gives +0.0 first; the GPU's
    accumulating wgmma behaves like the rewritten form.)"""
    for acc, m in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
        if not (isinstance(m, OpResult) and tile.is_product(m.owner)):
            continue
        mma = m.owner
        if not _is(mma.acc, 0) or _use_count(rw, m) != 1 or acc.type != m.type:
            continue
        new = Builder.before(op).value(type(mma), [*mma.operands[:-1], acc], m.type, loc=op.loc)
        new.name_hint = op.result.name_hint
        _replace(op, [new], rw)
        mma.erase()
        return True
    return False


def _use_count(rw: Rewrites, v: Value) -> int:
    return rw.use_count(v)


# ------------------------------------------------------------ control flow
def _inline(op: Operation, block: Block, rw: Rewrites) -> None:
    """``block``'s ops (but its terminator) move before ``op``, whose results become the
    values the terminator yields."""
    term = block.terminator
    dest = op.parent
    at = dest.ops.index(op)
    for inner in [x for x in block.ops if x is not term]:
        block.ops.remove(inner)
        dest.insert(at, inner)
        at += 1
    _replace(op, list(term.operands), rw)


def fold_constant_if(op: Operation, rw: Rewrites) -> bool:
    """``tile.if`` on a constant: the taken branch's ops move before the if,
    and its results become the yielded values."""
    c = tile.constant_value(op.cond)
    if c is None:
        return False
    rw.flush()  # the branch's ops move: the round's pending edits land first
    _inline(op, op.regions[0 if c else 1].block, rw)
    return True


def _constant_bounds(op: Operation) -> tuple[int, int, int] | None:
    """A ``tile.for``'s lower bound, upper bound and positive step where all are constants."""
    bounds = tile.constant_value(op.lb), tile.constant_value(op.ub), tile.constant_value(op.step)
    return None if None in bounds or bounds[2] <= 0 else bounds


def fold_zero_trip_for(op: Operation, rw: Rewrites) -> bool:
    """A ``tile.for`` whose constant bounds give no iteration yields its inits."""
    bounds = _constant_bounds(op)
    if bounds is None or bounds[0] < bounds[1]:
        return False
    _replace(op, list(op.init), rw)
    return True


def fold_one_trip_for(op: Operation, rw: Rewrites) -> bool:
    """A ``tile.for`` whose constant bounds give one iteration is its body, run once with the
    induction variable at the lower bound and the carried values at their inits.  A loop
    keeps what it defines before it live across every iteration, so the body alone frees
    registers (``range(BB)`` at ``BB = 1``: fftconv.tk at 4k fits only so)."""
    bounds = _constant_bounds(op)
    if bounds is None or not bounds[0] < bounds[1] <= bounds[0] + bounds[2]:
        return False
    rw.flush()  # the body's ops move: the round's pending edits land first
    block = op.regions[0].block
    iv, *carried = block.args
    rw.renamed[iv] = op.lb
    rw.renamed.update(zip(carried, op.init))
    _inline(op, block, rw)
    return True


# ------------------------------------------------------------ the table
# An elementwise op folds where its declaration allows (``FOLDS``: not exp, log, tanh... whose
# numpy scalar and vector paths may differ in the last bit, so a fold on one element might not
# equal the interpreter's answer on a whole tile).
_ELEMENTWISE = [cls.name for cls in tile.ELEMENTWISE_OPS if cls.FOLDS] + ["tile.cmp", "tile.cast"]

#: Op name -> the patterns tried on it, in order.
PATTERNS: dict[str, list[Pattern]] = {name: [fold_elementwise] for name in _ELEMENTWISE}
PATTERNS["tile.add"] += [fold_add_zero, fold_accumulate_mma]
PATTERNS["tile.sub"] += [fold_sub_zero]
PATTERNS["tile.mul"] += [fold_mul_one_or_zero]
PATTERNS["tile.floordiv"] += [fold_div_one]
PATTERNS["tile.div"] += [fold_div_one]
PATTERNS["tile.cast"] += [fold_noop_conversion]
for _name in ("tile.splat", "tile.broadcast", "tile.expand_dims", "tile.transpose", "tile.reduce", "tile.reshape"):
    PATTERNS[_name] = [fold_shape_of_constant]
PATTERNS["tile.broadcast"] += [fold_noop_conversion]
PATTERNS["tile.transpose"] += [fold_double_transpose]
PATTERNS["tile.select"] = [fold_select]
PATTERNS["tile.if"] = [fold_constant_if]
PATTERNS["tile.for"] = [fold_zero_trip_for, fold_one_trip_for]
PATTERNS["tile.scan"] = [fold_unit_scan]
