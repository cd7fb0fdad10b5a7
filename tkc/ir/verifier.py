"""Checks a module against the IR's invariants.

Generic checks (from each op's declaration): operand/result counts, required
and known attributes with the declared python types, region counts,
terminators at the end of every block and nowhere else, and SSA dominance
(a value is used only after its definition, in its block or a nested one).
Then each op's own ``verify``.  The first violation raises TkcVerifyError at
the op's location.
"""

from __future__ import annotations

from tkc.ir.core import OPS, Block, Module, Operation, Value


def verify(m: Module) -> None:
    import tkc.ir.dialects  # noqa: F401  (registers the op kinds)

    for op in m.ops:
        _verify_op(op, [set()])


def _verify_op(op: Operation, visible: list[set[Value]]) -> None:
    cls = type(op)
    if OPS.get(op.name) is not cls:
        raise op.error("op kind is not registered")
    for v in op.operands:
        if not isinstance(v, Value):
            raise op.error(f"operand {v!r} is not an IR value")
        if not any(v in s for s in visible):
            raise op.error(f"operand {v.name_hint and '%' + v.name_hint or v} is used before "
                           "it is defined or outside its scope")
    op.operand_groups()  # raises on a wrong operand count
    _check_results(op)
    _check_attrs(op)
    if len(op.regions) != cls.REGIONS:
        raise op.error(f"expects {cls.REGIONS} regions, has {len(op.regions)}")
    for region in op.regions:
        if len(region.blocks) != 1:
            raise op.error("regions in tkc hold exactly one block")
        _verify_block(region.blocks[0], visible)
    op.verify()


def _verify_block(block: Block, visible: list[set[Value]]) -> None:
    scope: set[Value] = set(block.args)
    visible.append(scope)
    for i, op in enumerate(block.ops):
        if op.has_trait("terminator") and i != len(block.ops) - 1:
            raise op.error("terminator is not the last op of its block")
        if op.parent is not block:
            raise op.error("op's parent link is broken")
        _verify_op(op, visible)
        scope.update(op.results)
    parent = block.parent_op
    if parent is not None and (block.terminator is None):
        raise parent.error("a region's block must end with a terminator")
    visible.pop()


def _check_results(op: Operation) -> None:
    names = type(op).RESULTS
    if any(n.startswith("*") for n in names):
        if len(op.results) < len(names) - 1:
            raise op.error(f"expects at least {len(names) - 1} results, has {len(op.results)}")
    elif len(op.results) != len(names):
        raise op.error(f"expects {len(names)} results, has {len(op.results)}")


def _check_attrs(op: Operation) -> None:
    spec = type(op).ATTRS
    declared = {k.rstrip("?"): k for k in spec}
    for key, val in op.attributes.items():
        if key not in declared:
            raise op.error(f"unknown attribute '{key}'")
        want = spec[declared[key]]
        if want is float and isinstance(val, int) and not isinstance(val, bool):
            continue  # an int literal is a fine float attribute
        if want is not None and (not isinstance(val, want) or (want is int and isinstance(val, bool))):
            raise op.error(f"attribute '{key}' must be {_type_name(want)}, got {val!r}")
    for key in spec:
        if not key.endswith("?") and key not in op.attributes:
            raise op.error(f"missing attribute '{key}'")


def _type_name(t: object) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return getattr(t, "__name__", str(t))
