"""The ``persistent`` pass: one program per SM, each walking output tiles in grouped order.

A kernel launched with one program per output tile pays, for every tile, a CTA launch, a
pipeline fill and an epilogue nobody overlaps.  A persistent kernel launches
``min(tiles, SMs x ctas_per_sm)`` programs that loop over the tiles (program ``p`` takes
tiles ``p, p + programs, ...``); with a ring and a producer warpgroup, the producer starts the
next tile's copies while the consumers finish the current tile's epilogue.  The tile order is
chosen so that the programs running at one time reuse each other's data in L2:

- when the copies in loops read along both grid axes (a GEMM streams rows of A and columns of
  B), tiles are visited in groups of ``GROUP_M`` tile rows: consecutive tiles share rows of A
  and sweep columns of B;
- when they read along axis 1 only (attention streams K and V of one batch and head, the
  column of the grid), axis 0 goes fastest, the order a launch of one program per tile has:
  the programs running at one time share a head's K and V.  (Grouped order would spread them
  over ``132 / GROUP_M`` heads, whose K and V at 16k tokens do not fit in L2.)
- but when a loop's bounds depend on axis 0 (causal attention: query block i reads i + 1
  key blocks), tiles go in groups of ``G = cdiv(8 x programs, rows)`` columns (about eight
  rounds of tiles), in a group axis 1 fastest and axis 0 from its last index down.  Programs
  take tiles in turn, so with axis 0 fastest program p would get rows p, p + 132, ... modulo
  the rows of a head: at 512 tokens (4 query blocks) each program would always get the same
  row, and the programs given the last rows would do four times the work of the others.
  Row by row, the programs running at one time have loops of about the same length, the
  longest first; and the group bounds what they stream (at 512 tokens, all 512 heads' K and
  V row after row would be read from DRAM once a row).

Runs on tile IR, before ``select-layouts``: everything after the kernel's ``grid(...)`` moves
into the tile loop, ``program_id(0/1)`` become the tile's row and column and
``num_programs(0/1)`` the original grid's extents.

On by default for GEMM-shaped kernels: a 2-D grid, products in a loop, and no load outside a
loop (attention loads its Q tile per program: not GEMM-shaped).  The kernel constant
``persistent`` pins it (``True`` on any kernel whose grid it can take, ``False`` off).

Must not: change which tiles are computed or what any tile computes.
"""

from __future__ import annotations

from tkc import dtypes
from tkc.errors import TkcUnsupportedError
from tkc.ir.builder import Builder
from tkc.ir.core import Block, Module, Operation, Region, Value
from tkc.ir.dialects import tile
from tkc.ir.types import ScalarType
from tkc.passes.licm import licm
from tkc.pins import ctas_per_sm

I32 = ScalarType(dtypes.i32)
GROUP_M = 8
# Rounds of tiles (one tile a program) in a group of columns when rows differ in length: at 2
# or 4, programs crossing a group boundary in different phases got unequal work (causal
# attention at 16k tokens: 445 / 483 / 522 TFLOP/s at 2 / 4 / 8, 515 ungrouped), ungrouped
# streamed every head's K and V once a row (512 tokens: 203 against 206 at 8, 235 at 4).
GROUP_ROUNDS = 8


def persistent(module: Module) -> None:
    for kernel in module.ops:
        if kernel.name == "tile.kernel":
            _persist(kernel)
    # What does not depend on the tile (sizes, loop bounds, constants) goes back out of the
    # tile loop: the ring's positions need loop bounds that are the same for every tile.
    licm(module)


def _why_not(kernel: Operation) -> tuple[Operation | None, str | None]:
    """The kernel's grid op, and why the pass cannot take the kernel (None if it can)."""
    body = kernel.regions[0].block
    grids = [op for op in body.ops if op.name == "tile.grid"]
    if not grids:
        return None, "the kernel has no grid(...)"
    grid = grids[0]
    if len(grid.operands) > 2:
        return grid, "a persistent kernel walks 1-D or 2-D grids"
    after = body.ops[body.ops.index(grid) + 1:]
    for op in kernel.walk():
        if op.name in ("tile.program_id", "tile.num_programs") and op not in after:
            return grid, f"'{op.name}' before grid(...) or inside a loop or branch"
    return grid, None


def _gemm_shaped(kernel: Operation, grid: Operation) -> bool:
    body = kernel.regions[0].block
    mma_in_loop = any(op.name == "tile.mma" and any(p.name == "tile.for" for p in op.ancestors())
                      for op in kernel.walk())
    load_outside = any(op.name == "tile.load" and not any(p.name == "tile.for" for p in op.ancestors())
                       for op in kernel.walk())
    return len(grid.operands) == 2 and mma_in_loop and not load_outside and grid.parent is body


def _persist(kernel: Operation) -> None:
    pin = (kernel.attributes.get("consts") or {}).get("persistent")
    if pin is False:
        return
    grid, why = _why_not(kernel)
    if why is not None:
        if pin is True:
            raise TkcUnsupportedError(f"persistent = True: {why}", (grid or kernel).loc)
        return
    if pin is None and not _gemm_shaped(kernel, grid):
        return
    streamed, bounded = _grid_axes(kernel)
    body = kernel.regions[0].block
    b = Builder(body, body.ops.index(grid), grid.loc)
    const = {v: b.value(tile.ConstantOp, [], I32, {"value": v}) for v in (0, 1, GROUP_M)}
    gm = grid.operands[0]
    gn = grid.operands[1] if len(grid.operands) == 2 else const[1]
    tiles = b.value(tile.MulOp, [gm, gn], I32)
    tiles.name_hint = "tiles"
    slots = b.value(tile.NumSmsOp, [], I32)
    per_sm = ctas_per_sm(kernel.attributes.get("consts"))
    if per_sm > 1:
        slots = b.value(tile.MulOp, [slots, b.value(tile.ConstantOp, [], I32, {"value": per_sm})], I32)
    programs = b.value(tile.MinimumOp, [tiles, slots], I32)
    grid.operands = [programs]

    moved = [op for op in body.ops[body.ops.index(grid) + 1:] if not op.has_trait("terminator")]
    after = Builder(body, body.ops.index(grid) + 1, grid.loc)
    first = after.value(tile.ProgramIdOp, [], I32, {"axis": 0})
    step = after.value(tile.NumProgramsOp, [], I32, {"axis": 0})
    loop_body = Block([I32], ["t"])
    loop = after.create(tile.ForOp, [first, tiles, step], [], regions=[Region([loop_body])], loc=grid.loc)
    t = loop_body.args[0]
    lb = Builder(loop_body, 0, grid.loc)
    if gn is const[1]:
        pm, pn = t, const[0]  # a 1-D grid's program_id(1) is 0, its num_programs(1) is 1
    elif 0 in bounded:
        # Groups of G = cdiv(GROUP_ROUNDS * programs, rows) columns; in a group, rows from the
        # last, columns fastest.
        rounds = lb.value(tile.ConstantOp, [], I32, {"value": GROUP_ROUNDS})
        g = lb.value(tile.CdivOp, [lb.value(tile.MulOp, [programs, rounds], I32), gm], I32)
        width = lb.value(tile.MulOp, [g, gm], I32)
        first_col = lb.value(tile.MulOp, [lb.value(tile.FloorDivOp, [t, width], I32), g], I32)
        cols = lb.value(tile.MinimumOp, [lb.value(tile.SubOp, [gn, first_col], I32), g], I32)
        within = lb.value(tile.RemOp, [t, width], I32)
        last = lb.value(tile.SubOp, [gm, const[1]], I32)
        pm = lb.value(tile.SubOp, [last, lb.value(tile.FloorDivOp, [within, cols], I32)], I32)
        pn = lb.value(tile.AddOp, [first_col, lb.value(tile.RemOp, [within, cols], I32)], I32)
        pm.name_hint, pn.name_hint = "tile_row", "tile_col"
    elif streamed <= {1}:
        pm, pn = lb.value(tile.RemOp, [t, gm], I32), lb.value(tile.FloorDivOp, [t, gm], I32)
        pm.name_hint, pn.name_hint = "tile_row", "tile_col"
    else:
        # Grouped order: GROUP_M tile rows at a time, down the rows then across the columns.
        width = lb.value(tile.MulOp, [const[GROUP_M], gn], I32)
        group = lb.value(tile.FloorDivOp, [t, width], I32)
        first_row = lb.value(tile.MulOp, [group, const[GROUP_M]], I32)
        rows = lb.value(tile.MinimumOp, [lb.value(tile.SubOp, [gm, first_row], I32), const[GROUP_M]], I32)
        within = lb.value(tile.RemOp, [t, width], I32)
        pm = lb.value(tile.AddOp, [first_row, lb.value(tile.RemOp, [within, rows], I32)], I32)
        pn = lb.value(tile.FloorDivOp, [within, rows], I32)
        pm.name_hint, pn.name_hint = "tile_row", "tile_col"
    ids = {("tile.program_id", 0): pm, ("tile.program_id", 1): pn,
           ("tile.num_programs", 0): gm, ("tile.num_programs", 1): gn}
    for op in moved:
        op.erase()
        loop_body.append(op)
    for op in list(loop.walk()):
        key = (op.name, op.attributes.get("axis"))
        if key in ids and op.parent is loop_body:
            _replace(loop, op.result, ids[key])
            op.erase()
    Builder(loop_body, None, grid.loc).create(tile.YieldOp)


def _grid_axes(kernel: Operation) -> tuple[set[int], set[int]]:
    """The grid axes (``program_id`` axes) the offsets of loads inside loops depend on, and
    those the bounds of loops depend on."""
    memo: dict[Value, frozenset[int]] = {}

    def axes(v: Value) -> frozenset[int]:
        if v not in memo:
            op = getattr(v, "owner", None)
            memo[v] = frozenset()  # block arguments (loop variables) depend on no program id
            if op is not None:
                if op.name == "tile.program_id":
                    memo[v] = frozenset([op.attributes["axis"]])
                else:
                    memo[v] = frozenset().union(*(axes(x) for x in op.operands))
        return memo[v]

    streamed: set[int] = set()
    bounded: set[int] = set()
    for op in kernel.walk():
        if op.name == "tile.load" and any(p.name == "tile.for" for p in op.ancestors()):
            for x in op.offsets:
                streamed |= axes(x)
        elif op.name == "tile.for":
            for x in op.operands[:3]:
                bounded |= axes(x)
    return streamed, bounded


def _replace(root: Operation, old: Value, new: Value) -> None:
    for op in root.walk():
        op.operands = [new if v is old else v for v in op.operands]
