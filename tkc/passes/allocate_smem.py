"""``allocate-smem``: byte offsets for shared tiles and mbarriers, and the kernel's ``smem_bytes``.

Owns: the live range of every ``hopper.smem_alloc`` / ``hopper.mbarrier_alloc`` and the
placement that lets allocations whose ranges do not overlap share bytes; the ``offset``
attribute of those ops (docs/hopper.md section 3) and the kernel attribute ``smem_bytes``
(section 4); the error when a kernel needs more shared memory than the target has.

Must not: choose layouts or sizes (a tile's bytes and alignment are its ``SharedLayout``'s,
an mbarrier is 8 B), move, add or remove ops, or touch anything but those attributes.

Live ranges are positions in a pre-order walk of the kernel body, computed conservatively:

* a range runs from the first to the last use of the value *or of anything that carries it*:
  a loop's iter_arg/result or an if's result it flows into, any op result that is itself a
  shared tile (a view of the same bytes), and the result of a ``hopper.wgmma`` reading it
  (wgmma reads shared memory asynchronously until the ``hopper.wgmma_wait`` that uses that
  result, so the bytes stay live until then);
* a ``hopper.tma_load`` writes its destination asynchronously until the phase of its
  mbarrier completes, so its destination lives as long as that mbarrier;
* a use inside a ``tile.for`` that does not also contain the alloc covers the whole loop
  (the next iteration uses the value again), and so does a value carried as an iter_arg;
* a ring (``stages`` = S) is one allocation of ``S * stride`` bytes, used through
  ``hopper.stage``: a use of any stage is a use of the ring, so the range covers every stage;
* a use inside a ``hopper.role`` counts like a use inside any region, so a value two roles
  use is live from the first role to the last.  Roles run concurrently (the role's
  warpgroups run its body while the others go on to the roles after it), so positions do not
  order them in time; what makes this safe is the sharing rule below: bytes are shared only
  across a top-level ``hopper.barrier``, which every warpgroup reaches only after finishing
  the roles before it, and roles sit at the top level, so allocations used by roles with no
  barrier between them never share.  (Widening a role's uses to the barriers around it would
  change nothing but the fence rule, and wrongly: a fence after the role, executed by the
  role's threads after their accesses, is exactly the one that counts.)

Disjoint ranges are not enough to share bytes: other threads may still be reading the old
tile when one thread writes the new one.  Two shared tiles share bytes only when a
``hopper.barrier`` at the top level of the kernel body lies between their ranges (so every
thread has finished with the first before any touches the second) and, when one is reached
through the async proxy (TMA, wgmma) and the other through the generic proxy, a top-level
``hopper.fence_proxy_async`` lies between the first range and that barrier.  An mbarrier
never shares bytes (PTX needs ``mbarrier.inval`` before its bytes are repurposed), and nor
do the slots of a ``hopper.cluster_reduce``, which the cluster's other CTAs write.

Allocations that already have an offset (``>= 0``: hand-placed, the override) keep it; the
others are placed first-fit, largest first, at the lowest aligned offset that overlaps no
allocation they may not share with.  The result is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from tkc.errors import TkcPassError
from tkc.ir.core import BlockArgument, Module, Operation, Value
from tkc.ir.dialects import hopper
from tkc.ir.types import TileType
from tkc.pins import Options
from tkc.target import Target

ALLOC_OPS = ("hopper.smem_alloc", "hopper.mbarrier_alloc")
MBARRIER_BYTES = hopper.MBarrierAllocOp.stride
MBARRIER_ALIGN = 8
# Operand slots read or written through the async proxy: (op name, operand index).
_ASYNC_OPERANDS = {("hopper.tma_load", 1), ("hopper.wgmma", 0), ("hopper.wgmma", 1)}


@dataclass
class _Alloc:
    op: Operation
    size: int
    align: int
    start: int
    end: int
    proxies: frozenset[str]  # "async" and/or "generic": how the bytes are reached
    offset: int = -1

    @property
    def name(self) -> str:
        hint = self.op.result.name_hint
        return f"%{hint}" if hint else f"the allocation at {self.op.loc}"

    cluster_wide: bool = False  # written by the cluster's other CTAs (hopper.cluster_reduce slots)

    @property
    def is_barrier(self) -> bool:
        return self.op.name == "hopper.mbarrier_alloc"

    def overlaps_in_space(self, offset: int, size: int) -> bool:
        return self.offset < offset + size and offset < self.offset + self.size


class _Positions:
    """Pre-order numbering of a kernel's ops: ``pos[op]`` and ``end[op]`` (the last
    position inside ``op``'s regions, or ``pos[op]`` for an op without regions), and where
    the CTA-wide barriers and proxy fences of the kernel's top level are."""

    def __init__(self, kernel: Operation):
        self.pos: dict[Operation, int] = {}
        self.end: dict[Operation, int] = {}
        self._number(kernel)
        top = kernel.regions[0].block.ops
        self.barriers = [self.pos[op] for op in top if op.name == "hopper.barrier"]
        self.fences = [self.pos[op] for op in top if op.name == "hopper.fence_proxy_async"]

    def _number(self, op: Operation) -> None:
        self.pos[op] = len(self.pos)
        for region in op.regions:
            for block in region.blocks:
                for inner in block.ops:
                    self._number(inner)
        self.end[op] = len(self.pos) - 1

    def contains(self, outer: Operation, op: Operation) -> bool:
        return self.pos[outer] <= self.pos[op] <= self.end[outer]

    def separated(self, first: _Alloc, second: _Alloc) -> bool:
        """Whether every thread is done with ``first`` before any thread touches ``second``."""
        if first.end >= second.start:
            return False
        syncs = [b for b in self.barriers if first.end < b < second.start]
        if not syncs:
            return False
        if len(first.proxies | second.proxies) < 2:
            return True
        return any(first.end < f < max(syncs) for f in self.fences)


def _may_share(a: _Alloc, b: _Alloc, pos: _Positions) -> bool:
    # A CTA's barriers order its own threads, not its peers' writes into its cluster slots.
    if a.is_barrier or b.is_barrier or a.cluster_wide or b.cluster_wide:
        return False
    return pos.separated(a, b) or pos.separated(b, a)


def _is_smem(v: Value) -> bool:
    return isinstance(v.type, TileType) and v.type.space == "smem"


def _carriers(v: Value, users: dict[Value, list[Operation]]) -> Iterator[Value]:
    """Values that hold ``v``'s bytes (or keep them in use) once ``v`` flows into them."""
    for user in users.get(v, []):
        if user.name == "tile.for":
            # operands: lb, ub, step, inits...; init i is iter_arg i + 1 and result i.
            body = user.regions[0].block
            for i, operand in enumerate(user.operands[3:]):
                if operand is v:
                    yield body.args[i + 1]
                    yield user.results[i]
        elif user.name == "tile.yield":
            parent = user.parent.parent_op if user.parent is not None else None
            for i, operand in enumerate(user.operands):
                if operand is not v or parent is None:
                    continue
                yield parent.results[i]
                if parent.name == "tile.for":
                    yield parent.regions[0].block.args[i + 1]
        elif user.name == "hopper.wgmma":
            yield user.result  # the read is in flight until the wgmma_wait that uses it
        elif user.name == "hopper.stage":
            yield user.result  # one stage of a ring (a tile or an mbarrier) is the ring's bytes
        else:
            yield from (r for r in user.results if _is_smem(r))


def _live_range(alloc: Operation, pos: _Positions, users: dict[Value, list[Operation]],
                barrier_end: dict[Value, int]) -> tuple[int, int, frozenset[str], set[Value]]:
    """(first, last) position at which ``alloc``'s bytes are in use, the proxies used, and
    every value that carries them (a barrier's stages, for the TMA copies completing on them)."""
    points: list[int] = []
    proxies: set[str] = set()
    seen: set[Value] = set()
    stack: list[Value] = [alloc.result]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if isinstance(v, BlockArgument) and v.block.parent_op is not None:
            loop = v.block.parent_op  # carried around the back edge: live over the whole loop
            points += [pos.pos[loop], pos.end[loop]]
        for user in users.get(v, []):
            lo, hi = pos.pos[user], pos.end[user]
            for outer in user.ancestors():
                if outer.name == "tile.for" and not pos.contains(outer, alloc):
                    lo, hi = min(lo, pos.pos[outer]), max(hi, pos.end[outer])
            for i, operand in enumerate(user.operands):
                if operand is v and user.name not in ("tile.for", "tile.yield", "tile.if", "hopper.stage"):
                    proxies.add("async" if (user.name, i) in _ASYNC_OPERANDS else "generic")
            if user.name == "hopper.tma_load" and user.operands[1] is v:
                hi = max(hi, barrier_end.get(user.operands[2], hi))
            points += [lo, hi]
        stack.extend(_carriers(v, users))
    if not points:  # never used: it still gets bytes, for as long as the alloc itself
        points = [pos.pos[alloc]]
    return min(points), max(points), frozenset(proxies), seen


def allocated_bytes(allocs) -> int:
    """Shared memory ``allocs`` (``hopper.smem_alloc``/``mbarrier_alloc`` ops) take side by side,
    each rounded up to its alignment (allocate-smem may share bytes between some; this does not
    count on it): what a pass that adds an allocation checks its room against."""
    return sum(-(-size // align) * align for size, align in map(size_and_align, allocs))


def size_and_align(op: Operation) -> tuple[int, int]:
    """Bytes and alignment of an allocation; a ring of S stages takes S strides (the op's
    ``stride``: a tile's size rounded up to its alignment, 8 B for a barrier)."""
    return op.nbytes, MBARRIER_ALIGN if op.name == "hopper.mbarrier_alloc" else op.result.type.layout.alignment


def _describe(a: _Alloc) -> str:
    """``the tiles of 'b' 262144 B (4 stages of a 512x256 bf16 tile)``: what a kernel author can map
    back to a slice of the source (its tensor's name, or the line that stages a tile) and its
    constants."""
    stages = a.op.attributes.get("stages", 1)
    t = a.op.result.type
    tile = f"a {'x'.join(map(str, t.shape))} {t.dtype.name} tile" if isinstance(t, TileType) else str(t)
    return f"{_source_name(a)} {a.size} B ({f'{stages} stages of ' if stages > 1 else ''}{tile})"


def _source_name(a: _Alloc) -> str:
    """The allocation in the source's words: the copies of a tensor (``%k_smem``: "the tiles of 'k'"),
    the staging of a store (``%c_out0``: "the store of c"), else where a tile is staged."""
    hint = a.op.result.name_hint or ""
    for suffix, words in (("_smem", "the tiles of '{}'"), ("_out", "the store of '{}'")):
        base, _, rest = hint.rpartition(suffix)
        if base and base[0].isalpha() and (rest == "" or rest.isdigit()):
            return words.format(base)
    loc = a.op.loc
    source = loc is not None and loc.line and not str(loc.file).endswith(".tkir")  # (IR input: its names)
    return f"a tile staged at line {loc.line}" if source else a.name


def _allocate_kernel(kernel: Operation, options: Options, target: Target) -> None:
    capacity = target.smem_per_program(options.programs_per_sm)
    pos = _Positions(kernel)
    users: dict[Value, list[Operation]] = {}
    alloc_ops: list[Operation] = []
    for op in kernel.walk():
        for v in op.operands:
            users.setdefault(v, []).append(op)
        if op.name in ALLOC_OPS:
            alloc_ops.append(op)

    # Barriers first: a TMA destination lives as long as the barrier its copy completes on.
    barrier_end: dict[Value, int] = {}
    allocs: list[_Alloc] = []
    for op in sorted(alloc_ops, key=lambda o: o.name != "hopper.mbarrier_alloc"):
        start, end, proxies, carriers = _live_range(op, pos, users, barrier_end)
        if op.name == "hopper.mbarrier_alloc":
            barrier_end.update(dict.fromkeys(carriers, end))
        size, align = size_and_align(op)
        allocs.append(_Alloc(op, size, align, start, end, proxies, op.attributes.get("offset", -1),
                             any(u.name == "hopper.cluster_reduce" for u in users.get(op.result, ()))))

    placed = sorted((a for a in allocs if a.offset >= 0), key=lambda a: pos.pos[a.op])
    for i, a in enumerate(placed):
        for b in placed[:i]:
            if a.overlaps_in_space(b.offset, b.size) and not _may_share(a, b, pos):
                raise TkcPassError(f"{a.name} (offset {a.offset}, {a.size} B) overlaps {b.name} (offset "
                                   f"{b.offset}, {b.size} B), which may still be in use", a.op.loc)
    todo = sorted((a for a in allocs if a.offset < 0), key=lambda a: (-a.size, -a.align, pos.pos[a.op]))
    for a in todo:
        a.offset = _first_fit(a, [b for b in placed if not _may_share(a, b, pos)])
        placed.append(a)

    total = max((a.offset + a.size for a in allocs), default=0)
    if total > capacity:
        shown = sorted(allocs, key=lambda a: (-a.size, pos.pos[a.op]))
        parts = [_describe(a) for a in shown if not a.is_barrier]
        barriers = sum(a.size // MBARRIER_BYTES for a in shown if a.is_barrier)  # a ring counts its stages
        if barriers:
            parts.append(f"{barriers} mbarrier{'s' if barriers > 1 else ''} {MBARRIER_BYTES * barriers} B")
        ctas = options.programs_per_sm
        room = f"{target.name} has {capacity}" + (f" for each of {ctas} programs on an SM (ctas_per_sm)"
                                                  if ctas > 1 else "")
        # At the largest tile's source line where it has one (the slice its copies fill).
        loc = next((a.op.loc for a in shown if not a.is_barrier and a.op.loc is not None and a.op.loc.line),
                   kernel.loc)
        fewer = [" or fewer stages (-D stages=2)"] if any(a.op.attributes.get("stages", 1) > 1
                                                          for a in shown if not a.is_barrier) else []
        if ctas > 1:
            fewer.append(f" or fewer programs an SM (-D ctas_per_sm={ctas - 1})")
        raise TkcPassError(f"kernel '{kernel.attributes.get('sym_name')}' needs {total} B of shared memory, "
                           f"{room}: " + ", ".join(parts) + "; use smaller tiles (the constants that size them)"
                           + "".join(fewer), loc)
    for a in allocs:
        a.op.attributes["offset"] = a.offset
    kernel.attributes["smem_bytes"] = total


def _first_fit(a: _Alloc, busy: list[_Alloc]) -> int:
    """The lowest offset aligned for ``a`` that overlaps none of ``busy``: 0 or the aligned
    end of some busy allocation (the lowest free offset is always one of those)."""
    candidates = sorted({0, *(-(-(b.offset + b.size) // a.align) * a.align for b in busy)})
    return next(c for c in candidates if not any(b.overlaps_in_space(c, a.size) for b in busy))


def allocate_smem(module: Module, options: Options, target: Target) -> None:
    """Give every shared tile and mbarrier of every kernel its byte offset and set the
    kernel's ``smem_bytes``; raise a located TkcPassError when it does not fit in what
    ``target`` gives each of ``options.programs_per_sm`` programs."""
    for op in module.ops:
        if op.name == "tile.kernel":
            _allocate_kernel(op, options, target)
