"""IR types: scalars, global tensor views and tiles.

Types are immutable and compared by value.  Their ``str`` is their textual IR
form; ``tkc/ir/parser.py`` reads the same form back.  A tile's layout is an
attribute object owned by whichever pass chose it; the type only carries it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tkc.dtypes import DType


class Type:
    """Base class of every IR type."""


@dataclass(frozen=True)
class ScalarType(Type):
    dtype: DType

    def __str__(self) -> str:
        return self.dtype.name


@dataclass(frozen=True)
class TensorType(Type):
    """A global-memory tensor passed to a kernel.  Each dim is a symbolic name
    (a runtime size; equal names must agree at launch) or an int (fixed).  ``ranks``: the
    tensor exists on every rank of a multi-GPU launch, with the same shape, and programs
    may read and write peers' copies (``x: bf16[M, K] @ ranks``; docs/language.md)."""

    dtype: DType
    dims: tuple[str | int, ...]
    ranks: bool = False

    @property
    def rank(self) -> int:
        return len(self.dims)

    def __str__(self) -> str:
        on = " @ranks" if self.ranks else ""
        return f"tensor<{self.dtype.name}[{', '.join(str(d) for d in self.dims)}]{on}>"


@dataclass(frozen=True)
class TileType(Type):
    """A tile: a compile-time shape of elements of one dtype.

    ``space`` is where the tile lives once a pass decides it ("reg", "smem");
    ``layout`` is a layout attribute chosen by a pass.  Both are None in the
    target-independent tile IR produced by the frontend."""

    shape: tuple[int, ...]
    dtype: DType
    space: str | None = None
    layout: object | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def with_dtype(self, dtype: DType) -> TileType:
        return TileType(self.shape, dtype, self.space, self.layout)

    def with_shape(self, shape: tuple[int, ...]) -> TileType:
        return TileType(tuple(shape), self.dtype, self.space, self.layout)

    def __str__(self) -> str:
        extras = "".join(f", {x}" for x in (self.space, self.layout) if x is not None)
        return f"tile<{'x'.join(str(s) for s in self.shape)}x{self.dtype.name}{extras}>"


@dataclass(frozen=True)
class MBarrierType(Type):
    """A shared-memory mbarrier (hopper IR; docs/hopper.md)."""

    def __str__(self) -> str:
        return "mbarrier"


MBARRIER = MBarrierType()


def element_dtype(t: Type) -> DType:
    """The element dtype of a scalar or tile type."""
    if isinstance(t, (ScalarType, TileType, TensorType)):
        return t.dtype
    raise TypeError(f"{t} has no element type")


def with_element(t: Type, dtype: DType) -> Type:
    """The same scalar/tile type with another element dtype."""
    if isinstance(t, ScalarType):
        return ScalarType(dtype)
    if isinstance(t, TileType):
        return t.with_dtype(dtype)
    raise TypeError(f"{t} has no element type")


def shape_of(t: Type) -> tuple[int, ...]:
    """A tile's shape; () for a scalar."""
    return t.shape if isinstance(t, TileType) else ()


# Layout attributes print as ``#name<...>`` inside a tile type.  A pass that
# introduces a layout kind registers how to read it back, so the parser never
# needs to know the kinds: name -> function(text inside the brackets) -> layout.
LAYOUT_PARSERS: dict[str, object] = {}
