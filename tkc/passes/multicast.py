"""The ``multicast`` pass: the CTAs of a cluster read the copies they share once.

With the pin ``cluster = N`` (2 or 4), ``persistent`` has the N programs of a cluster (N
consecutive CTAs along x) walk the same cluster tiles, each its own row of them: in a GEMM
they read different rows of A and the same columns of B.  This pass, on warp-specialized
hopper IR, makes each such shared copy one read from L2 instead of N:

- a producer's ``hopper.tma_load`` whose coordinates, destination stage and barrier stage are
  the same in every CTA of the cluster (they depend on no program id but through the
  cluster's index, ``program_id // N``) gets ``multicast = N``: each CTA copies 1/N of the
  tile's TMA boxes into every CTA's shared memory, and each CTA still receives the whole tile
  on its own full barrier (``expect_tx`` unchanged);
- a stage of such a copy may be refilled only once every CTA's consumers have released it,
  since the refill writes into all of them: the ring whose stage the producer waits for
  before the copy (its empty ring) counts N times the arrivals, and each consumer release
  (``hopper.mbarrier_arrive``) arrives on every CTA's barrier (``cluster``);
- the kernel gets ``cluster = N`` (codegen emits ``.reqnctapercluster``); the barrier after
  the mbarriers' initialization becomes a ``hopper.cluster_barrier`` (a peer's copies and
  arrivals may reach them from then on), and another one ends the kernel (no CTA exits while
  a peer may still write its shared memory or arrive on its barriers).

A copy whose coordinates differ across the cluster (a GEMM's A tiles) stays a CTA's own.
Runs after ``specialize-warps`` (the copies must sit in a producer role) and the passes that
move consumer work (``issue-ahead``, ``defer-last``), before ``allocate-smem``.

Must not: change what any CTA's shared tiles hold when its consumers read them.
"""

from __future__ import annotations

from tkc.errors import TkcUnsupportedError
from tkc.ir.core import BlockArgument, Module, Operation, Value
from tkc.ir.builder import Builder
from tkc.ir.dialects import hopper, tile
from tkc.pins import Options
from tkc.target import Target


def multicast(module: Module, options: Options, target: Target) -> None:
    if options.cluster == 1:
        return
    for kernel in module.ops:
        if kernel.name == "tile.kernel" and not tile.has_cluster_reductions(kernel):
            _share(kernel, options.cluster, options.cluster_pin)


def _share(kernel: Operation, n: int, pin: str) -> None:
    grid = next((op for op in kernel.regions[0].block.ops if op.name == "tile.grid"), None)
    size = getattr(grid.operands[0], "owner", None) if grid is not None and len(grid.operands) == 1 else None
    if size is None or size.name != "tile.mul" or not any(_multiple_of(v, n) for v in size.operands):
        raise TkcUnsupportedError(f"{pin}: expected the 1-D grid of whole clusters that persistent "
                                  f"gives a kernel whose programs walk cluster tiles (run persistent first)",
                                  (grid or kernel).loc)
    same = _SameInCluster(n)
    loads = [op for op in kernel.walk() if op.name == "hopper.tma_load"]
    producers = [op for op in loads if _role_name(op) == "producer"]
    if not producers:
        raise TkcUnsupportedError(f"{pin}: the cluster's CTAs share copies issued by a producer "
                                  f"warpgroup, and this kernel has none (warp_specialize = false, or no ring)",
                                  kernel.loc)
    # A vector's copy (pin tma_vectors) is one TMA box, read by every thread: not shared.
    shared = [op for op in producers if all(same(v) for v in op.operands[1:]) and _same_path(op, same)
              and not hopper.is_vector_box(op.box, op.dst.type.layout)]
    if not shared:
        raise TkcUnsupportedError(f"{pin}: no copy is the same in every CTA of a cluster (each reads "
                                  f"along the cluster's rows)", kernel.loc)
    empties: dict[Operation, None] = {}
    for op in shared:
        op.attributes["multicast"] = n
        empties[_empty_ring(op)] = None
    for ring in empties:
        for user in kernel.walk():
            if user.name == "hopper.mbarrier_init" and user.operands[0] is ring.result:
                user.attributes["count"] *= n
            elif user.name == "hopper.mbarrier_arrive" and _ring_of(user.operands[0]) is ring:
                user.attributes["cluster"] = True
    kernel.attributes["cluster"] = n
    body = kernel.regions[0].block
    fence = next((op for op in body.ops if op.name == "hopper.fence_mbarrier_init"), None)
    after = body.ops[body.ops.index(fence) + 1] if fence is not None else None
    if after is None or after.name != "hopper.barrier":
        raise TkcUnsupportedError(f"{pin}: expected the CTA barrier after the mbarriers' "
                                  f"initialization", kernel.loc)
    Builder(body, body.ops.index(after), after.loc).create(hopper.ClusterBarrierOp)
    after.erase()
    ret = body.terminator
    Builder(body, body.ops.index(ret), ret.loc).create(hopper.ClusterBarrierOp)


def _role_name(op: Operation) -> str | None:
    role = hopper.enclosing_role(op)
    return role.attributes["name"] if role is not None else None


def _ring_of(v: Value) -> Operation | None:
    """The ``hopper.mbarrier_alloc`` ring behind a ``hopper.stage`` of it."""
    owner = getattr(v, "owner", None)
    if owner is None or owner.name != "hopper.stage":
        return None
    ring = getattr(owner.operands[0], "owner", None)
    return ring if ring is not None and ring.name == "hopper.mbarrier_alloc" else None


def _empty_ring(load: Operation) -> Operation:
    """The ring whose stage the producer waits for before ``load``: the one whose stages the
    consumers release."""
    block = load.parent
    for op in reversed(block.ops[:block.ops.index(load)]):
        if op.name == "hopper.mbarrier_wait":
            ring = _ring_of(op.operands[0])
            if ring is not None:
                return ring
    raise TkcUnsupportedError("a shared copy must follow the producer's wait for a free stage "
                              "(an empty ring, from pipeline-loops)", load.loc)


def _same_path(op: Operation, same: _SameInCluster) -> bool:
    """Whether every CTA of the cluster reaches ``op`` as often as the others: the loops and
    branches around it have the same bounds and conditions in all of them."""
    for p in op.ancestors():
        if p.name in ("tile.for", "tile.if") and not all(same(v) for v in p.operands[:3]):
            return False
    return True


class _SameInCluster:
    """Whether a scalar is the same in every CTA of a cluster of ``n`` (CTAs ``n c .. n c +
    n - 1`` along x): everything is but ``program_id(0)``, and what is computed from it, except
    through ``program_id(0) // m`` with ``m`` a multiple of ``n`` (the cluster's index)."""

    def __init__(self, n: int):
        self.n = n
        self.memo: dict[Value, bool] = {}

    def __call__(self, v: Value) -> bool:
        if v not in self.memo:
            self.memo[v] = True  # (a cycle through loop-carried values is decided below)
            self.memo[v] = self._decide(v)
        return self.memo[v]

    def _decide(self, v: Value) -> bool:
        if isinstance(v, BlockArgument):
            loop = v.block.parent_op
            if loop is None or loop.name == "tile.kernel":
                return True  # kernel parameters
            if loop.name == "tile.for" and v.index == 0:
                return all(self(x) for x in loop.operands[:3])
            return False  # loop-carried values: not followed
        op = v.owner
        if op.name == "tile.program_id":
            return op.attributes["axis"] != 0
        if op.name == "tile.floordiv" and _pid0(op.operands[0]) and _multiple_of(op.operands[1], self.n):
            return True
        if op.name in ("tile.for", "tile.if"):
            return False
        return all(self(x) for x in op.operands)


def _pid0(v: Value) -> bool:
    owner = getattr(v, "owner", None)
    return owner is not None and owner.name == "tile.program_id" and owner.attributes["axis"] == 0


def _multiple_of(v: Value, n: int) -> bool:
    value = tile.constant_value(v)
    return isinstance(value, int) and not isinstance(value, bool) and value > 0 and value % n == 0
