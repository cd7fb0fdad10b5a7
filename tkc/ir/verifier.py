"""Checks a module against the IR's invariants.

Generic checks (from each op's declaration): operand/result counts, required
and known attributes with the declared python types, region counts,
terminators at the end of every block and nowhere else, and SSA dominance
(a value is used only after its definition, in its block or a nested one).
Then each op's own ``verify``, and for each kernel the hopper dialect's checks of
the kernel as a whole (``hopper.verify_kernel``: shared-memory placement, ring
and mbarrier use, tensor maps, register budgets).  The first violation raises
TkcVerifyError at the op's location.
"""

from __future__ import annotations

import re

from tkc.ir.core import OPS, Block, Module, Operation, Value
from tkc.ir.types import TileType


_IDENT = re.compile(r"[A-Za-z_][\w.$]*")
_KEY = re.compile(r"[A-Za-z_][\w.]*")  # an attribute-dict key: the parser's identifier token, no '$'


def verify(m: Module) -> None:
    import tkc.ir.dialects  # noqa: F401  (registers the op kinds)
    from tkc.ir.dialects.hopper import verify_kernel

    for op in m.ops:
        if not op.has_trait("isolated"):
            raise op.error("only kernels may appear at the top level of a module")
        _verify_op(op, [set()])
        if op.name == "tile.kernel":
            verify_kernel(op)


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
    for r in op.results:  # after the op's own checks, whose messages say more
        _check_type(op, r.type)


def _verify_block(block: Block, visible: list[set[Value]]) -> None:
    for a in block.args:
        _check_type(block.parent_op, a.type)
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


def _check_type(op: Operation, t: object) -> None:
    """Tiles have at least one axis, every extent positive (a scalar is not a 0-D tile)."""
    if isinstance(t, TileType) and (not t.shape or any(s < 1 for s in t.shape)):
        raise op.error(f"tile type {t} needs one or more positive extents")


def _printable(v: object) -> bool:
    """Whether an attribute value has a textual form (what printer.format_attr writes)."""
    if isinstance(v, (bool, int, float, str)):
        return True
    if isinstance(v, (list, tuple)):
        return all(_printable(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _KEY.fullmatch(k) and _printable(x) for k, x in v.items())
    return False


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
        if not _printable(val):
            raise op.error(f"attribute '{key}' = {val!r} has no textual form (numbers, bools, strings, "
                           "lists, and dicts keyed by identifiers)")
        if key == "sym_name" and not _IDENT.fullmatch(val):
            raise op.error(f"symbol name {val!r} is not an identifier")
    for key in spec:
        if not key.endswith("?") and key not in op.attributes:
            raise op.error(f"missing attribute '{key}'")


def _type_name(t: object) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return getattr(t, "__name__", str(t))
