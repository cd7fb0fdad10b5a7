"""The textual form of the IR: one op per line, regions in braces.

    %r = tile.add %x, %y : tile<64x64xf32> loc("k.tk":3:9)

Results, op name, an optional ``@symbol``, operands, an attribute dict,
result types, the location, then regions.  Operand types are not printed:
they are the types of the values named.  ``parser.py`` reads exactly this.
"""

from __future__ import annotations

import json
import math
import re

from tkc.errors import Loc
from tkc.ir.core import Block, Module, Operation, Value

# Every name the namer makes must match this too: a clash on a numeric hint "0" makes "0_1".
_NAME_OK = re.compile(r"[A-Za-z_][\w.]*|\d+(?:_\d+)*")


def format_attr(v: object) -> str:
    """One attribute value: bool, int, float, str, list or dict of those."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {format_attr(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot print attribute value {v!r}")


def format_loc(loc: Loc) -> str:
    return f"loc({json.dumps(loc.file)}:{loc.line}:{loc.col})"


class _Namer:
    """Gives every value a unique, stable name within one top-level op.  A
    value keeps its hint when it is free, so parsed names print unchanged."""

    def __init__(self) -> None:
        self.names: dict[Value, str] = {}
        self.taken: set[str] = set()
        self.counter = 0
        # The suffix each hint's next search starts from: every smaller one is taken (names
        # are never freed), so the first free name is found without retrying them all.
        self.suffix: dict[str, int] = {}

    def __call__(self, v: Value) -> str:
        if v in self.names:
            return self.names[v]
        hint = v.name_hint if v.name_hint and _NAME_OK.fullmatch(v.name_hint) else None
        if hint is None:
            while str(self.counter) in self.taken:
                self.counter += 1
            name = str(self.counter)
        else:
            k = self.suffix.get(hint, 0)
            name = hint if k == 0 else f"{hint}_{k}"
            while name in self.taken:
                k += 1
                name = f"{hint}_{k}"
            self.suffix[hint] = k
        self.taken.add(name)
        self.names[v] = name
        return name

    def ref(self, v: Value) -> str:
        # A use of a value never defined in the printed scope still prints,
        # so a broken module can be shown in an error message.
        return "%" + (self.names.get(v) or f"<undefined {v.name_hint or id(v)}>")


def print_module(m: Module, locs: bool = True) -> str:
    return "".join(print_op(op, locs=locs) for op in m.ops)


def print_op(op: Operation, indent: int = 0, locs: bool = True, namer: _Namer | None = None) -> str:
    namer = namer or _Namer()
    lines: list[str] = []
    _print(op, indent, locs, namer, lines)
    return "\n".join(lines) + "\n"


def _print(op: Operation, indent: int, locs: bool, namer: _Namer, out: list[str]) -> None:
    pad = "  " * indent
    text = ""
    if op.results:
        text += ", ".join("%" + namer(r) for r in op.results) + " = "
    text += op.name
    attrs = dict(op.attributes)
    sym = attrs.pop("sym_name", None)
    if sym is not None:
        text += f" @{sym}"
    if op.operands:
        text += " " + ", ".join(namer.ref(v) for v in op.operands)
    if attrs:
        text += " " + format_attr(attrs)
    if op.results:
        text += " : " + ", ".join(str(r.type) for r in op.results)
    if locs:
        text += " " + format_loc(op.loc)
    if not op.regions:
        out.append(pad + text)
        return
    for region in op.regions:
        text += " {"
        out.append(pad + text)
        for block in region.blocks:
            _print_block(block, indent, locs, namer, out)
        text = "}"
    out.append(pad + "}")


def _print_block(block: Block, indent: int, locs: bool, namer: _Namer, out: list[str]) -> None:
    if block.args:
        args = ", ".join(f"%{namer(a)}: {a.type}" for a in block.args)
        out.append("  " * indent + f"^({args}):")
    for op in block.ops:
        _print(op, indent + 1, locs, namer, out)
