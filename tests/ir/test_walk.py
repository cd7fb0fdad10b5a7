"""``Operation.walk``: pre-order over nested regions, each block's ops read as the walk reaches
the block (what passes that edit the IR while they walk it rely on)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tkc.frontend import compile_source
from tkc.ir.core import Operation

ATTN = Path(__file__).resolve().parents[2] / "examples" / "attn.tk"


def _recursive(op: Operation) -> Iterator[Operation]:
    yield op
    for r in op.regions:
        for b in r.blocks:
            for o in list(b.ops):
                yield from _recursive(o)


def _kernel() -> Operation:
    return compile_source(ATTN.read_text(), str(ATTN)).kernel()


def test_walk_is_pre_order_over_every_nested_op() -> None:
    k = _kernel()
    walked = list(k.walk())
    assert walked == list(_recursive(k))
    assert any(op.regions for op in walked[1:])  # nested regions were walked into (a loop's body)
    assert len(walked) == len(set(map(id, walked)))


def test_a_block_is_read_when_the_walk_reaches_it() -> None:
    k = _kernel()
    body = k.regions[0].block
    loop = next(op for op in body.ops if op.regions)
    inner = loop.regions[0].blocks[0]
    last = body.ops[-1]
    seen = []
    for op in k.walk():
        seen.append(op)
        if op is body.ops[0]:
            body.ops.remove(last)  # the kernel's body was read: its last op is still walked
            marker = inner.ops[0]
            inner.ops.append(marker)  # the loop's body is not read yet: its new entry is walked
    assert last in seen
    assert sum(op is marker for op in seen) == 2
