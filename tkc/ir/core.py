"""The IR core: values, operations, blocks, regions, modules, and op definitions.

An ``Operation`` is generic: a name, operands, result values, attributes,
regions and a source location.  Each op kind is declared once as a small
subclass (see ``tkc/ir/dialects/``) that states its operands, results,
attributes and traits and may add a ``verify``; the printer, parser and
verifier work on the generic form, so adding an op needs no edits elsewhere.
"""

from __future__ import annotations

from typing import Any, ClassVar
from collections.abc import Iterator

from tkc.errors import UNKNOWN, Loc, TkcVerifyError
from tkc.ir.types import Type


class Value:
    """An SSA value: the result of an op or an argument of a block."""

    __slots__ = ("type", "name_hint")

    def __init__(self, type: Type, name_hint: str | None = None):
        self.type = type
        self.name_hint = name_hint

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name_hint or '?'}: {self.type}>"


class OpResult(Value):
    __slots__ = ("owner", "index")

    def __init__(self, type: Type, owner: Operation, index: int, name_hint: str | None = None):
        super().__init__(type, name_hint)
        self.owner = owner
        self.index = index


class BlockArgument(Value):
    __slots__ = ("block", "index")

    def __init__(self, type: Type, block: Block, index: int, name_hint: str | None = None):
        super().__init__(type, name_hint)
        self.block = block
        self.index = index


# ------------------------------------------------------------------ op kinds
OPS: dict[str, type[Operation]] = {}


def register(cls: type[Operation]) -> type[Operation]:
    """Class decorator: make an op kind known to the parser and verifier."""
    if cls.name in OPS:
        raise ValueError(f"op {cls.name} registered twice")
    OPS[cls.name] = cls
    return cls


class Operation:
    """A generic operation; subclasses declare one op kind.

    Declarative fields of a subclass:
      ``name``      -- "dialect.op"
      ``OPERANDS``  -- operand names; one may start with '*' (variadic group)
      ``RESULTS``   -- result names; '*name' for a variadic result list
      ``ATTRS``     -- attribute name -> python type(s); names ending in '?' are optional
      ``REGIONS``   -- number of regions
      ``TRAITS``    -- e.g. {"pure", "terminator", "readonly", "commutative", "elementwise"}
    """

    name: ClassVar[str] = "builtin.unknown"
    OPERANDS: ClassVar[tuple[str, ...]] = ()
    RESULTS: ClassVar[tuple[str, ...]] = ()
    ATTRS: ClassVar[dict[str, Any]] = {}
    REGIONS: ClassVar[int] = 0
    TRAITS: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        operands: list[Value],
        result_types: list[Type],
        attributes: dict[str, Any] | None = None,
        regions: list[Region] | None = None,
        loc: Loc = UNKNOWN,
    ):
        self.operands: list[Value] = list(operands)
        self.results: list[OpResult] = [OpResult(t, self, i) for i, t in enumerate(result_types)]
        self.attributes: dict[str, Any] = dict(attributes or {})
        self.regions: list[Region] = list(regions or [])
        for r in self.regions:
            r.parent = self
        self.loc = loc
        self.parent: Block | None = None

    # -------------------------------------------------------------- structure
    @property
    def result(self) -> OpResult:
        if len(self.results) != 1:
            raise ValueError(f"{self.name} has {len(self.results)} results, not 1")
        return self.results[0]

    def operand_groups(self) -> dict[str, Value | list[Value]]:
        """Operands by their declared names; a variadic group maps to a list."""
        names = type(self).OPERANDS
        star = [i for i, n in enumerate(names) if n.startswith("*")]
        if not star:
            if len(self.operands) != len(names):
                raise TkcVerifyError(
                    f"'{self.name}' takes {len(names)} operands, got {len(self.operands)}", self.loc)
            return dict(zip(names, self.operands))
        s = star[0]
        n_after = len(names) - s - 1
        if len(self.operands) < len(names) - 1:
            raise TkcVerifyError(
                f"'{self.name}' takes at least {len(names) - 1} operands, got {len(self.operands)}",
                self.loc)
        out: dict[str, Value | list[Value]] = dict(zip(names[:s], self.operands[:s]))
        end = len(self.operands) - n_after
        out[names[s][1:]] = self.operands[s:end]
        out.update(zip(names[s + 1:], self.operands[end:]))
        return out

    def __getattr__(self, item: str) -> Any:
        # Named access to operands (``op.lhs``) and attributes (``op.axis``).
        # Only reached when normal lookup fails.
        cls = type(self)
        if item.startswith("_"):
            raise AttributeError(item)
        if item in cls.OPERANDS or f"*{item}" in cls.OPERANDS:
            return self.operand_groups()[item]
        attrs = self.__dict__.get("attributes", {})
        if item in attrs:
            return attrs[item]
        if item in cls.ATTRS or f"{item}?" in cls.ATTRS:
            return None
        raise AttributeError(f"'{cls.name}' has no operand or attribute '{item}'")

    def has_trait(self, trait: str) -> bool:
        return trait in type(self).TRAITS

    def walk(self) -> Iterator[Operation]:
        """This op and every op nested in its regions, pre-order.  Each block's ops are read
        as the walk reaches the block (an op the caller inserts into a block it has not
        reached yet is walked; one it erases from a block being walked still is).  A stack of
        blocks, not a generator an op deep: every pass and the verifier walk each kernel."""
        yield self
        stack = [_nested(self)]
        while stack:
            op = next(stack[-1], None)
            if op is None:
                stack.pop()
                continue
            yield op
            if op.regions:
                stack.append(_nested(op))

    def ancestors(self) -> Iterator[Operation]:
        """The ops whose regions hold this op, innermost first, up to the top-level op."""
        block = self.parent
        while block is not None and block.parent_op is not None:
            yield block.parent_op
            block = block.parent_op.parent

    def erase(self) -> None:
        assert self.parent is not None, "op is not in a block"
        self.parent.ops.remove(self)
        self.parent = None

    def verify(self) -> None:
        """Op-specific checks beyond the declared structure; raise TkcVerifyError."""

    def error(self, message: str) -> TkcVerifyError:
        return TkcVerifyError(f"'{self.name}': {message}", self.loc)

    def __repr__(self) -> str:
        return f"<op {self.name} at {self.loc}>"


class Block:
    """A list of ops with typed arguments; the last op of a region's block is
    its terminator when the parent op requires one."""

    def __init__(self, arg_types: list[Type] | None = None, arg_names: list[str | None] | None = None):
        names = arg_names or [None] * len(arg_types or [])
        self.args: list[BlockArgument] = [
            BlockArgument(t, self, i, n) for i, (t, n) in enumerate(zip(arg_types or [], names))]
        self.ops: list[Operation] = []
        self.parent: Region | None = None

    def add_arg(self, t: Type, name: str | None = None) -> BlockArgument:
        a = BlockArgument(t, self, len(self.args), name)
        self.args.append(a)
        return a

    def append(self, op: Operation) -> Operation:
        op.parent = self
        self.ops.append(op)
        return op

    def insert(self, index: int, op: Operation) -> Operation:
        op.parent = self
        self.ops.insert(index, op)
        return op

    @property
    def terminator(self) -> Operation | None:
        if self.ops and self.ops[-1].has_trait("terminator"):
            return self.ops[-1]
        return None

    @property
    def parent_op(self) -> Operation | None:
        return self.parent.parent if self.parent is not None else None


class Region:
    def __init__(self, blocks: list[Block] | None = None):
        self.blocks: list[Block] = []
        self.parent: Operation | None = None
        for b in blocks or []:
            self.add_block(b)

    def add_block(self, b: Block) -> Block:
        b.parent = self
        self.blocks.append(b)
        return b

    @property
    def block(self) -> Block:
        """The entry (and, in tkc, only) block."""
        return self.blocks[0]


class Module:
    """The top level: a block of kernels (``tile.kernel`` ops)."""

    def __init__(self, ops: list[Operation] | None = None):
        self.body = Block()
        for op in ops or []:
            self.body.append(op)

    @property
    def ops(self) -> list[Operation]:
        return self.body.ops

    def walk(self) -> Iterator[Operation]:
        for op in list(self.body.ops):
            yield from op.walk()

    def kernel(self, name: str | None = None) -> Operation:
        kernels = [op for op in self.ops if op.name == "tile.kernel"]
        if name is None:
            if len(kernels) != 1:
                raise KeyError(f"module has {len(kernels)} kernels; name one")
            return kernels[0]
        for k in kernels:
            if k.attributes.get("sym_name") == name:
                return k
        raise KeyError(name)


# ------------------------------------------------------------- use rewriting
def replace_all_uses(root: Module | Operation, old: Value, new: Value) -> None:
    """Make every operand under ``root`` that is ``old`` become ``new``."""
    ops = root.walk()
    for op in ops:
        op.operands = [new if v is old else v for v in op.operands]


def defined_inside(op: Operation) -> set[Value]:
    """Every value defined in ``op``'s regions: block arguments and results, however deeply
    nested (what a loop's body may not read for an op to be invariant in it)."""
    values: set[Value] = set()
    for inner in op.walk():
        if inner is not op:
            values.update(inner.results)
        for region in inner.regions:
            for block in region.blocks:
                values.update(block.args)
    return values


def uses(root: Module | Operation) -> dict[Value, list[Operation]]:
    """Every value used under ``root`` and the ops that use it."""
    out: dict[Value, list[Operation]] = {}
    for op in root.walk():
        for v in op.operands:
            out.setdefault(v, []).append(op)
    return out


def clone(op: Operation, mapping: dict[Value, Value]) -> Operation:
    """A deep copy of ``op`` (regions included), not inserted anywhere.  Operands found in
    ``mapping`` are replaced; the copy's results and block arguments are added to it, so
    cloning a sequence of ops in order keeps their uses connected."""
    new = type(op)([mapping.get(v, v) for v in op.operands], [r.type for r in op.results],
                   dict(op.attributes), loc=op.loc)
    for old_r, new_r in zip(op.results, new.results):
        new_r.name_hint = old_r.name_hint
        mapping[old_r] = new_r
    for region in op.regions:
        r = Region()
        for block in region.blocks:
            b = Block([a.type for a in block.args], [a.name_hint for a in block.args])
            mapping.update(zip(block.args, b.args))
            for inner in block.ops:
                b.append(clone(inner, mapping))
            r.add_block(b)
        new.regions.append(r)
        r.parent = new
    return new


def _nested(op: Operation) -> Iterator[Operation]:
    """The ops directly inside ``op``'s regions, block by block, each block's as it is reached."""
    for r in op.regions:
        for b in r.blocks:
            yield from list(b.ops)
