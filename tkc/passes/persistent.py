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
  key blocks), the tiles of a column stay together (its K and V read once), rows from the
  last, and the programs take them in a snake: in round k program p takes tile
  ``k * P + p`` when k is even and ``k * P + P - 1 - p`` when it is odd.  Taking them in
  turn, program p would get rows p, p + 132, ... modulo the rows of a head: at 512 tokens (4
  query blocks, 132 programs) always the same row, the programs given the last rows four
  times the work of the others; in the snake, a heavy tile in one round pairs with a light
  one in the next.  Columns of more than P / 2 rows (a round holds less than two), or of
  ``ROW_WALK`` = 32 rows or more, go row by row instead, columns fastest, in the same snake
  (heaviest tiles first everywhere: with 16 columns of 64 rows on 132 programs each round
  shifts a column's rows by 4, and the busiest program got 1.54x the mean work).

Where programs stay one a tile (attention, whose persistent walk ``tkc.schedule`` picks only
for short or lopsided loops) and the loop runs longer the later the row, they are launched
**longest first** instead (the pin ``longest_first``, on by default from
``LONGEST_FIRST_ROWS`` rows): ``program_id(0/1)`` become the row and column of a group order,
groups of about an SM's count of programs, rows from the last.

Runs on tile IR, before ``select-layouts``: everything after the kernel's ``grid(...)`` moves
into the tile loop, ``program_id(0/1)`` become the tile's row and column and
``num_programs(0/1)`` the original grid's extents.  A ``barrier_all()`` that starts every
program (multi-GPU kernels: the ranks have reached the kernel) stays before the walk, and one
that ends every program (the ranks are done with each other's memory) after it: met once per
program rather than once per tile.

On by default for GEMM-shaped kernels: a 2-D grid, products in a loop, no load outside a
loop (attention loads its Q tile per program: not GEMM-shaped) and no ``wait`` (a tile waiting
for a flag a later tile of the same walk raises would never see it).  The kernel constant
``persistent`` pins it (``True`` on any kernel whose grid it can take, ``False`` off).

Must not: change which tiles are computed or what any tile computes.
"""

from __future__ import annotations

from tkc import dtypes
from tkc.errors import TkcError, TkcUnsupportedError
from tkc.ir.builder import Builder
from tkc.ir.core import Block, Module, Operation, Region, Value
from tkc.ir.dialects import tile
from tkc.ir.types import ScalarType
from tkc.passes.licm import licm
from tkc.pins import Options
from tkc.target import Target

I32 = ScalarType(dtypes.i32)
I1 = ScalarType(dtypes.i1)
GROUP_M = 8
#: Causal tiles are walked row by row, all columns at once, from this many rows a column.
ROW_WALK = 32
#: Rows a column from which programs one a tile launch longest first (``_longest_first``): on
#: an H200, causal attention forward 1.01-1.06x at D = 128 from 16 query blocks a head (2k
#: tokens); with fewer, written in the kernel, 0.96-1.02x (benchmarks/RESULTS.md, 2026-11-30).
LONGEST_FIRST_ROWS = 16
#: The size of every symbolic dim when the pass asks which end of the rows runs the longer loop.
PROBE_SIZE = 4096


def persistent(module: Module, options: Options, target: Target) -> None:
    for kernel in module.ops:
        if kernel.name == "tile.kernel":
            _persist(kernel, options)
    # What does not depend on the tile (sizes, loop bounds, constants) goes back out of the
    # tile loop: the ring's positions need loop bounds that are the same for every tile.
    licm(module, options, target)


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
    # A tile that waits for a flag another tile raises would, walked by one program, wait for a
    # tile that program only reaches later: a deadlock the launch of one program a tile has not.
    waits = any(op.name == "tile.wait" for op in kernel.walk())
    return len(grid.operands) == 2 and mma_in_loop and not load_outside and not waits and grid.parent is body


def _persist(kernel: Operation, options: Options) -> None:
    pin, cluster = options.persistent, options.cluster
    if tile.has_cluster_reductions(kernel):
        # Its programs are paired by program_id as written: walking tiles would pair others.
        if pin is True:
            raise TkcUnsupportedError("persistent = True: this kernel's cluster reductions combine the "
                                      "programs its program_id(0) pairs, which a tile walk would not keep",
                                      kernel.loc)
        return
    # A cluster's programs walk the tiles together: only a persistent kernel has them.
    needs = f"{options.cluster_pin}: a cluster's programs walk a persistent GEMM-shaped kernel's tiles together"
    if pin is False:
        if cluster > 1:
            raise TkcUnsupportedError(f"{needs}, and this one is pinned persistent = False", kernel.loc)
        _longest_first(kernel, options)
        return
    grid, why = _why_not(kernel)
    if why is not None:
        if pin is True or cluster > 1:
            raise TkcUnsupportedError(f"{'persistent = True' if pin is True else needs}: {why}", (grid or kernel).loc)
        _longest_first(kernel, options)
        return
    if pin is None and not _gemm_shaped(kernel, grid):
        if cluster > 1:
            raise TkcUnsupportedError(f"{needs} (a 2-D grid, products in a loop, no load outside one)", grid.loc)
        _longest_first(kernel, options)
        return
    if options.longest_first is True:
        raise TkcUnsupportedError("longest_first = True: this kernel's programs walk its tiles persistently (in "
                                  "an order of their own); pin persistent = False for one program a tile",
                                  grid.loc)
    streamed, bounded = _grid_axes(kernel)
    if cluster > 1 and not (len(grid.operands) == 2 and streamed >= {0, 1} and 0 not in bounded):
        raise TkcUnsupportedError(f"{options.cluster_pin}: a cluster's programs share the copies of a GEMM-shaped "
                                  f"kernel (a 2-D grid whose loops read along both axes, with bounds that do not "
                                  f"depend on axis 0)", grid.loc)
    atomic = next((op for op in kernel.walk() if tile.is_atomic(op)), None)
    if cluster > 1 and atomic is not None:
        # A cluster's programs past the last tile row still run the body (for the copies they
        # share): their stores fall outside the tensors, but an atomic would land.
        raise TkcUnsupportedError(f"{options.cluster_pin} with an atomic: the cluster's programs past the last "
                                  f"tile row would apply it too; use cluster = 1 here", atomic.loc)
    body = kernel.regions[0].block
    b = Builder(body, body.ops.index(grid), grid.loc)
    const = {v: b.value(tile.ConstantOp, [], I32, {"value": v}) for v in {0, 1, GROUP_M, cluster, ROW_WALK - 1}}
    gm = grid.operands[0]
    gn = grid.operands[1] if len(grid.operands) == 2 else const[1]
    # With a cluster, the tile walk goes over cluster rows (``cluster`` tile rows each) and
    # the grid is a whole number of clusters.
    rows = gm if cluster == 1 else b.value(tile.CdivOp, [gm, const[cluster]], I32)
    tiles = b.value(tile.MulOp, [rows, gn], I32)
    tiles.name_hint = "tiles"
    slots = b.value(tile.NumSmsOp, [], I32)
    per_sm = options.programs_per_sm
    if per_sm > 1:
        slots = b.value(tile.MulOp, [slots, b.value(tile.ConstantOp, [], I32, {"value": per_sm})], I32)
    if cluster == 1:
        programs = b.value(tile.MinimumOp, [tiles, slots], I32)
    else:
        clusters = b.value(tile.MinimumOp, [tiles, b.value(tile.FloorDivOp, [slots, const[cluster]], I32)], I32)
        programs = b.value(tile.MulOp, [clusters, const[cluster]], I32)
    grid.operands = [programs]

    moved = [op for op in body.ops[body.ops.index(grid) + 1:] if not op.has_trait("terminator")]
    barrier = _leading_barrier(moved)
    if barrier is not None:
        moved.remove(barrier)
        barrier.erase()
        body.insert(body.ops.index(grid) + 1, barrier)
    trailing = moved[-1] if moved and moved[-1].name == "tile.rank_barrier" else None
    if trailing is not None:
        moved.remove(trailing)  # stays after the walk (see below)
    after = Builder(body, body.ops.index(grid) + 1 + (barrier is not None), grid.loc)
    first = after.value(tile.ProgramIdOp, [], I32, {"axis": 0})
    step = after.value(tile.NumProgramsOp, [], I32, {"axis": 0})
    rank = None
    if cluster > 1:
        # Programs 2c and 2c + 1 (a cluster: consecutive CTAs along x) walk the same cluster
        # tiles; each takes its row of the cluster's rows.
        rank = after.value(tile.RemOp, [first, const[cluster]], I32)
        rank.name_hint = "cluster_rank"
        first = after.value(tile.FloorDivOp, [first, const[cluster]], I32)
        step = after.value(tile.FloorDivOp, [step, const[cluster]], I32)
    snake = gn is not const[1] and 0 in bounded
    loop_body = Block([I32], ["k" if snake else "t"])
    bounds = _snake_count(after, first, step, tiles, const) if snake else [first, tiles, step]
    loop = after.create(tile.ForOp, bounds, [], regions=[Region([loop_body])], loc=grid.loc)
    t = loop_body.args[0]
    lb = Builder(loop_body, 0, grid.loc)
    if gn is const[1]:
        pm, pn = t, const[0]  # a 1-D grid's program_id(1) is 0, its num_programs(1) is 1
    elif snake:
        # Round k, forward in even rounds and backward in odd ones: tile k * P + p or
        # k * P + P - 1 - p ...
        back = lb.value(tile.SubOp, [lb.value(tile.SubOp, [step, const[1]], I32),
                                     lb.value(tile.AddOp, [first, first], I32)], I32)
        odd = lb.value(tile.AndOp, [t, const[1]], I32)
        u = lb.value(tile.AddOp, [lb.value(tile.AddOp, [lb.value(tile.MulOp, [t, step], I32), first], I32),
                                  lb.value(tile.MulOp, [odd, back], I32)], I32)
        # ... of the columns one after another, rows from the last (a column's K and V read
        # once), or, when a column has more than P / 2 rows, rows from the last with the
        # columns fastest: a round then holds less than two columns, and program p's rows
        # would drift from round to round (at 16k tokens, 128 query blocks a head and 132
        # programs, counting K/V blocks: one program would get three times as many as
        # another).  Chosen at run time, as 0 or 1 times the difference.
        last = lb.value(tile.SubOp, [gm, const[1]], I32)
        col_row = lb.value(tile.RemOp, [u, gm], I32)
        col_col = lb.value(tile.FloorDivOp, [u, gm], I32)
        row_row = lb.value(tile.FloorDivOp, [u, gn], I32)
        row_col = lb.value(tile.RemOp, [u, gn], I32)
        # Row by row also from ROW_WALK rows a column: on an H200 the rows-first walk ran 1.01-1.48x
        # faster at 32 and 64 rows (D = 64 to 256, causal; at D = 256 and 64 rows the column
        # walk gave its busiest program 1.54x the mean work) and 0.94x at 16 rows, where reading
        # a column's K and V once from L2 wins (benchmarks/RESULTS.md, 2026-11-27).
        drift = lb.value(tile.SubOp, [lb.value(tile.AddOp, [gm, gm], I32), step], I32)
        tall = lb.value(tile.SubOp, [gm, const[ROW_WALK - 1]], I32)
        wide = lb.value(tile.MinimumOp, [lb.value(tile.MaximumOp, [
            lb.value(tile.MaximumOp, [drift, tall], I32), const[0]], I32), const[1]], I32)
        pm = lb.value(tile.SubOp, [last, lb.value(tile.AddOp, [col_row, lb.value(tile.MulOp, [
            wide, lb.value(tile.SubOp, [row_row, col_row], I32)], I32)], I32)], I32)
        pn = lb.value(tile.AddOp, [col_col, lb.value(tile.MulOp, [
            wide, lb.value(tile.SubOp, [row_col, col_col], I32)], I32)], I32)
        pm.name_hint, pn.name_hint = "tile_row", "tile_col"
    elif streamed <= {1}:
        pm, pn = lb.value(tile.RemOp, [t, gm], I32), lb.value(tile.FloorDivOp, [t, gm], I32)
        pm.name_hint, pn.name_hint = "tile_row", "tile_col"
    else:
        # Grouped order: GROUP_M tile rows at a time, down the rows then across the columns
        # (with a cluster: GROUP_M / cluster cluster rows).
        group_rows = const.get(GROUP_M // cluster) or lb.value(tile.ConstantOp, [], I32, {"value": GROUP_M // cluster})
        width = lb.value(tile.MulOp, [group_rows, gn], I32)
        group = lb.value(tile.FloorDivOp, [t, width], I32)
        first_row = lb.value(tile.MulOp, [group, group_rows], I32)
        in_group = lb.value(tile.MinimumOp, [lb.value(tile.SubOp, [rows, first_row], I32), group_rows], I32)
        within = lb.value(tile.RemOp, [t, width], I32)
        pm = lb.value(tile.AddOp, [first_row, lb.value(tile.RemOp, [within, in_group], I32)], I32)
        pn = lb.value(tile.FloorDivOp, [within, in_group], I32)
        if rank is not None:
            # The cluster's last rows may lie past the grid (an odd number of tile rows): such a
            # program still takes its part in the copies the cluster shares, its own copies
            # wholly past the tensor (they read zeros) and its stores writing nothing -- not a
            # repeat of the row above, which would be two programs storing one element.  Its
            # atomics would land, though, so a kernel with atomics is refused (above).
            pm = lb.value(tile.AddOp, [lb.value(tile.MulOp, [pm, const[cluster]], I32), rank], I32)
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
    if trailing is not None:
        # A barrier that ends every program orders only what comes after the kernel: met
        # once, after the program's last tile.
        trailing.erase()
        body.insert(body.ops.index(loop) + 1, trailing)


def _longest_first(kernel: Operation, options: Options) -> None:
    """Programs one a tile whose top-level loop runs longer the later their row
    (``program_id(0)``; causal attention's forward) launch longest first: in groups of
    ``g = max(num_sms() // rows, 1)`` columns (about one wave of programs, so those running at
    once read as few columns' data as in the grid's order), row by row from the last within a
    group.  Where the first rows run the longer loops (attention's backward) the grid's order
    already starts each column longest first: kept, unless pinned.  Grids of fewer than
    ``LONGEST_FIRST_ROWS`` rows keep their order (a run-time test)."""
    pin = options.longest_first
    if pin is False:
        return
    grid, why = _why_not(kernel)
    if why is None:
        why = _why_not_reorder(kernel, grid)
    end = None
    if why is None:
        body = kernel.regions[0].block
        loop = next((op for op in body.ops if op.name == "tile.for" and 0 in _axes_of(op.operands[:3])), None)
        if loop is None:
            why = "no loop at the kernel's top level runs a number of iterations that depends on program_id(0)"
        else:
            end = _longer_end(kernel, grid, loop)
            if end is None:
                why = "the loop's bounds read a tensor or a scalar argument (or run alike at both ends of the rows)"
    if why is not None:
        if pin is True:
            raise TkcUnsupportedError(f"longest_first = True: {why}", (grid or kernel).loc)
        return
    if end == "first" and pin is None:
        return  # each column's longest programs start first already
    b = Builder(body, body.ops.index(grid) + 1, grid.loc)
    c = {v: b.value(tile.ConstantOp, [], I32, {"value": v}) for v in (1, LONGEST_FIRST_ROWS)}
    p0 = b.value(tile.ProgramIdOp, [], I32, {"axis": 0})
    p1 = b.value(tile.ProgramIdOp, [], I32, {"axis": 1})
    gm, gn = grid.operands
    olds = [op for op in kernel.walk() if op.name == "tile.program_id" and op.result not in (p0, p1)]
    on = b.value(tile.CmpOp, [gm, c[LONGEST_FIRST_ROWS]], I1, {"pred": "ge"})
    then = Block()
    t = Builder(then, None, grid.loc)
    pid = t.value(tile.AddOp, [p0, t.value(tile.MulOp, [p1, gm], I32)], I32)
    g = t.value(tile.MaximumOp, [t.value(tile.FloorDivOp, [t.value(tile.NumSmsOp, [], I32), gm], I32), c[1]], I32)
    first = t.value(tile.MulOp, [t.value(tile.FloorDivOp, [pid, t.value(tile.MulOp, [g, gm], I32)], I32), g], I32)
    cols = t.value(tile.MinimumOp, [g, t.value(tile.SubOp, [gn, first], I32)], I32)
    within = t.value(tile.SubOp, [pid, t.value(tile.MulOp, [first, gm], I32)], I32)
    row = t.value(tile.FloorDivOp, [within, cols], I32)
    if end == "last":
        row = t.value(tile.SubOp, [t.value(tile.SubOp, [gm, c[1]], I32), row], I32)
    col = t.value(tile.AddOp, [first, t.value(tile.RemOp, [within, cols], I32)], I32)
    t.create(tile.YieldOp, [row, col])
    grid_order = Block()
    Builder(grid_order, None, grid.loc).create(tile.YieldOp, [p0, p1])
    order = tile.IfOp.of(on, then, grid_order, [I32, I32], loc=grid.loc)
    b.insert(order)
    order.results[0].name_hint, order.results[1].name_hint = "tile_row", "tile_col"
    ids = {0: order.results[0], 1: order.results[1]}
    for op in olds:
        _replace(kernel, op.result, ids[op.attributes["axis"]])
        op.erase()


def _longer_end(kernel: Operation, grid: Operation, loop: Operation) -> str | None:
    """``'last'`` or ``'first'``: the end of the rows whose programs run ``loop`` longer, for
    tensors of ``PROBE_SIZE`` along every symbolic dim; None where they run alike or the
    bounds cannot be evaluated without a launch (they read a tensor or a scalar argument)."""
    import numpy as np

    from tkc.grid import eval_slice, probe_env

    trips = []
    try:
        with np.errstate(all="ignore"):  # the probe's sizes are not the user's: no numpy warnings
            env = probe_env(kernel, PROBE_SIZE)
            eval_slice(kernel, grid.operands[:1], env, 0, None, "")
            rows = int(env[grid.operands[0]])
            for row in (0, rows - 1):
                at = probe_env(kernel, PROBE_SIZE)
                eval_slice(kernel, loop.operands[:3], at, 0, (row, 0), "")
                lo, hi, step = (int(at[v]) for v in loop.operands[:3])
                trips.append(max(0, -(-(hi - lo) // step)) if step > 0 else 0)
    except (TkcError, KeyError, ArithmeticError, ValueError):  # not evaluable without a launch
        return None
    return None if trips[0] == trips[1] else "last" if trips[1] > trips[0] else "first"


def _why_not_reorder(kernel: Operation, grid: Operation) -> str | None:
    """Why the programs of ``kernel`` must launch in the grid's order (None: they need not)."""
    if len(grid.operands) != 2 or grid.parent is not kernel.regions[0].block:
        return "it reorders the programs of a 2-D grid(...)"
    for op in kernel.walk():
        if op.name == "tile.wait":
            return "a program waits for a flag another raises: launched in another order, it could wait for one " \
                   "not yet running"
        if tile.is_atomic(op) and (op.results or (op.attributes.get("sem") or "relaxed") != "relaxed"):
            return "an atomic that returns a value or orders memory may hand out work in the grid's order"
    if tile.uses_ranks(kernel):
        return "a multi-GPU kernel's programs meet other ranks' in the grid's order"
    return None


def _axes_of(values) -> set[int]:
    """The grid axes (``program_id`` axes) ``values`` are computed from."""
    out: set[int] = set()
    stack, seen = list(values), set()
    while stack:
        v = stack.pop()
        op = getattr(v, "owner", None)
        if op is None or id(op) in seen:
            continue
        seen.add(id(op))
        if op.name == "tile.program_id":
            out.add(op.attributes["axis"])
        # an if's results are computed from what its branches read too (a kernel's own launch order)
        stack.extend(tile.outside_operands(op) if op.regions else op.operands)
    return out


def _leading_barrier(ops: list[Operation]) -> Operation | None:
    """A ``barrier_all()`` that every tile's program starts with (only scalar arithmetic before
    it): it orders nothing of a tile's own, only what the ranks did before the launch, so a
    program meets its peers once, before its first tile, not at every tile of its walk."""
    for op in ops:
        if op.name == "tile.rank_barrier":
            return op
        if not op.has_trait("pure") or op.regions or any(not isinstance(r.type, ScalarType) for r in op.results):
            return None
    return None


def _snake_count(b: Builder, p: Value, programs: Value, tiles: Value, const: dict[int, Value]) -> list[Value]:
    """Bounds (0, count, 1) of program ``p``'s loop over rounds in the snake order: every
    program takes one tile a full round; the last, partial round's ``r`` tiles go to programs
    ``0 .. r - 1`` when it runs forward (an even round), ``P - r .. P - 1`` when backward."""
    full = b.value(tile.FloorDivOp, [tiles, programs], I32)
    r = b.value(tile.RemOp, [tiles, programs], I32)

    def one_if_positive(x: Value) -> Value:
        return b.value(tile.MinimumOp, [b.value(tile.MaximumOp, [x, const[0]], I32), const[1]], I32)

    forward = one_if_positive(b.value(tile.SubOp, [r, p], I32))  # p < r
    backward = one_if_positive(b.value(tile.SubOp, [b.value(tile.AddOp, [p, r], I32),  # p >= P - r
                                                    b.value(tile.SubOp, [programs, const[1]], I32)], I32))
    odd = b.value(tile.AndOp, [full, const[1]], I32)
    extra = b.value(tile.AddOp, [forward, b.value(tile.MulOp, [odd, b.value(tile.SubOp, [backward, forward], I32)],
                                                  I32)], I32)
    count = b.value(tile.AddOp, [full, extra], I32)
    return [const[0], count, const[1]]


def _grid_axes(kernel: Operation) -> tuple[set[int], set[int]]:
    """The grid axes (``program_id`` axes) the offsets of loads inside loops depend on, and
    those the bounds of loops depend on."""
    streamed: set[int] = set()
    bounded: set[int] = set()
    for op in kernel.walk():
        if op.name == "tile.load" and any(p.name == "tile.for" for p in op.ancestors()):
            streamed |= _axes_of(op.offsets)
        elif op.name == "tile.for":
            bounded |= _axes_of(op.operands[:3])
    return streamed, bounded


def _replace(root: Operation, old: Value, new: Value) -> None:
    for op in root.walk():
        op.operands = [new if v is old else v for v in op.operands]
