"""The ``order-memory`` pass: a loop body's global-memory traffic starts as early as its
inputs allow, so products on the tensor cores hide it.

Two moves in each ``tile.for`` body that holds a product (``tile.mma``), on tile IR before
select-layouts (lower-to-hopper keeps the order):

- **loads up**: a ``tile.load`` after the body's first product, whose tile is no product's
  operand (those are TMA copies, whose order pipeline-loops reads), moves up to just before
  that product (and the pure ops computing only its operands, which become shared-memory
  views), when its operands are defined there and nothing between writes memory: a row vector
  the work after a later product needs (attention backward's delta) is then in flight during
  the first product instead of after it.
- **outputs before accumulations**: a product whose result only goes to global memory (pure
  ops into one ``tile.atomic`` or ``tile.store``) moves, with those ops, above an accumulation
  ``acc += a @ b`` right before it whose result only the next iteration reads and that it does
  not read.  The accumulation then runs while the atomic adds or stores drain: attention
  backward's dQ before ``dK += dS^T Q`` measured 1.04-1.16x faster on an H200 than the other
  order (benchmarks/RESULTS.md), and this pass makes either order of the statements give it.

Must not: move a load above a store or an atomic, or an op above the definition of anything it
reads; move a product's operand tile, or anything but such loads and output chains.
"""

from __future__ import annotations

from tkc.ir.core import Block, Module, Operation, Value


def order_memory(module: Module, *_: object) -> None:
    for top in module.ops:
        for loop in [op for op in top.walk() if op.name == "tile.for"]:
            body = loop.regions[0].block
            if any(op.name == "tile.mma" for op in body.ops):
                _loads_up(body)
                _outputs_before_accumulations(body)


def _pure(op: Operation) -> bool:
    return not op.regions and op.has_trait("pure")


def _passable(op: Operation) -> bool:
    """Whether a load may move above ``op``: it writes no memory (an ``if`` whose branches only
    compute, as attention's edge mask)."""
    return all(inner.has_trait("pure") or inner.has_trait("readonly") or inner.has_trait("terminator")
               or inner is op and op.name == "tile.if" for inner in op.walk())


def _defined_before(values: list[Value], block: Block, index: int) -> bool:
    """Whether each of ``values`` is defined outside ``block`` or by one of its first
    ``index`` ops."""
    early = {r for op in block.ops[:index] for r in op.results}
    inside = {r for op in block.ops for r in op.results}
    return all(v not in inside or v in early for v in values)


def _feeds_only(op: Operation, target: Operation, users: dict[Value, list[Operation]]) -> bool:
    return all(u is target for r in op.results for u in users.get(r, []))


def _users(block: Block) -> dict[Value, list[Operation]]:
    out: dict[Value, list[Operation]] = {}
    for op in block.ops:
        for inner in op.walk():
            for v in inner.operands:
                out.setdefault(v, []).append(op)
    return out


def _loads_up(block: Block) -> None:
    ops = block.ops
    first = next(i for i, op in enumerate(ops) if op.name == "tile.mma")
    users = _users(block)
    # The first product's operand views (Q^T of K Q^T) go with it.
    while first > 0 and _pure(ops[first - 1]) and _feeds_only(ops[first - 1], ops[first], users):
        first -= 1
    for load in [op for op in ops[first + 1:] if op.name == "tile.load" and not _product_operand(op, users)]:
        at = ops.index(load)
        between = ops[first:at]
        if not all(_passable(op) for op in between):
            continue
        if not _defined_before(list(load.operands), block, first):
            continue
        ops.remove(load)
        ops.insert(first, load)
        first += 1


def _product_operand(load: Operation, users: dict[Value, list[Operation]]) -> bool:
    """Whether ``load``'s tile is a product's operand (itself or transposed): select-layouts
    copies such tiles by TMA, and pipeline-loops groups their copies by their order."""
    for user in users.get(load.result, []):
        if user.name == "tile.mma" or (user.name == "tile.transpose"
                                       and any(u.name == "tile.mma" for u in users.get(user.result, []))):
            return True
    return False


def _outputs_before_accumulations(block: Block) -> None:
    ops = block.ops
    users = _users(block)
    carried = set(block.args)
    for out in [op for op in ops if op.name in ("tile.atomic", "tile.store")]:
        chain = _chain(out, block, users)
        start = ops.index(chain[0])
        if start == 0 or not any(op.name == "tile.mma" for op in chain):
            continue
        acc = ops[start - 1]
        if acc.name != "tile.mma" or acc.acc not in carried \
                or not all(u.has_trait("terminator") for u in users.get(acc.result, [])):
            continue
        if any(acc.result in op.operands for op in chain):
            continue
        for op in chain:
            ops.remove(op)
        at = ops.index(acc)
        for k, op in enumerate(chain):
            ops.insert(at + k, op)


def _chain(out: Operation, block: Block, users: dict[Value, list[Operation]]) -> list[Operation]:
    """``out`` and the pure ops right before it in ``block`` that compute only what it (or
    another op of the chain) reads, in order."""
    ops = block.ops
    chain = [out]
    i = ops.index(out)
    while i > 0:
        prev = ops[i - 1]
        if not (_pure(prev) and all(u in chain for r in prev.results for u in users.get(r, []))
                and prev.results):
            break
        chain.insert(0, prev)
        i -= 1
    return chain
