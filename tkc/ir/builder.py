"""Creates ops at an insertion point, the way every pass and the frontend do."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any
from collections.abc import Iterator

from tkc.errors import UNKNOWN, Loc
from tkc.ir.core import Block, Operation, Region, Value
from tkc.ir.types import Type


class Builder:
    """Appends (or inserts) new ops into a block.  ``loc`` is the default
    location for ops created without one."""

    def __init__(self, block: Block | None = None, index: int | None = None, loc: Loc = UNKNOWN):
        self.block = block
        self.index = index
        self.loc = loc

    @classmethod
    def before(cls, op: Operation) -> Builder:
        return cls(op.parent, op.parent.ops.index(op), op.loc)

    def insert(self, op: Operation) -> Operation:
        assert self.block is not None, "builder has no insertion block"
        if self.index is None:
            self.block.append(op)
        else:
            self.block.insert(self.index, op)
            self.index += 1
        return op

    def create(
        self,
        cls: type[Operation],
        operands: list[Value] | tuple = (),
        result_types: list[Type] | tuple = (),
        attrs: dict[str, Any] | None = None,
        regions: list[Region] | None = None,
        loc: Loc | None = None,
    ) -> Operation:
        return self.insert(cls(list(operands), list(result_types), attrs, regions, loc or self.loc))

    def value(self, cls: type[Operation], operands: list[Value] | tuple, result_type: Type,
              attrs: dict[str, Any] | None = None, loc: Loc | None = None) -> Value:
        """Create a single-result op and return its result."""
        return self.create(cls, operands, [result_type], attrs, loc=loc).result

    @contextmanager
    def at_end(self, block: Block) -> Iterator[Builder]:
        """Temporarily build at the end of ``block`` (e.g. a loop body)."""
        saved = (self.block, self.index)
        self.block, self.index = block, None
        try:
            yield self
        finally:
            self.block, self.index = saved
