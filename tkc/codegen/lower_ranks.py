"""Multi-GPU kernels: the rank parameters, peers' copies, flag waits and rank barriers.

Owns the PTX side of docs/hopper.md §4 "Ranks": the parameters a multi-GPU kernel takes
beyond its own (``rank``, ``num_ranks``, one ``peers`` address array per ``@ ranks`` tensor,
the barrier pads), ``tile.peer`` (rank ``r``'s address of a tensor, a trap for a rank out of
range), ``tile.wait`` (one thread spins on an acquiring load of a local flag, then the
program's threads meet) and ``tile.rank_barrier`` (per-program counters on every rank's pad),
and what a releasing atomic on one element does first (:func:`before_release`): the
program's TMA stores complete and its threads meet, so the release covers every write the
program made before it.

Orderings are at ``.sys`` scope (peers' GPUs see them): ``ld.acquire.sys``, and a rank
barrier's ``fence.acq_rel.sys`` before its relaxed adds to every rank's pad.  A spin gives up
after the pin ``wait_timeout_ms`` (2 minutes when unset: a peer that never signals is a failed
launch, not a hang of every rank; with the pin set the wait also prints its line, rank and
flag first).

Must not: choose which threads or roles run an op (the passes put waits and barriers into
every role that needs them), or lay anything out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import llvmlite.ir as ir

from tkc.codegen import nvvm
from tkc.codegen.lower_elementwise import ICMP
from tkc.codegen.lower_global import _global_element
from tkc.codegen.lower_values import const_i32
from tkc.codegen.lowerer import Lowerer, TensorArg
from tkc.codegen.nvvm import I32, I64
from tkc.errors import TkcCodegenError
from tkc.ir.core import Operation
from tkc.ir.dialects import tile
from tkc.ir.dialects.hopper import barrier_roles
from tkc.ir.types import TensorType
from tkc.target import TENSOR_MAP_BYTES

__all__ = ["ACQUIRE_MAP", "HANDLERS", "acquire_maps", "acquired", "before_release", "bind_params", "param_types",
           "system_scope", "tensor_map"]

#: How long a wait across ranks spins when the pin ``wait_timeout_ms`` is not set: long enough
#: for a peer that reaches its launch late (compiling its kernel, loading data), since a trap
#: ends the CUDA context.
DEFAULT_TIMEOUT_MS = 120_000


def param_types(kernel: Operation) -> list[ir.Type]:
    """The parameters of item 2 of docs/hopper.md §4 (none for a kernel of one GPU)."""
    if not tile.uses_ranks(kernel):
        return []
    g = nvvm.ptr(nvvm.GLOBAL)
    return [I32, I32, *[g] * len(tile.ranked_params(kernel)), *([g] if tile.has_rank_barrier(kernel) else [])]


def bind_params(lw: Lowerer, kernel: Operation, it: Iterator[ir.Argument]) -> None:
    """Name the rank parameters and keep them on ``lw``; the local copy of every ``@ ranks``
    tensor is rank ``rank``'s."""
    if not tile.uses_ranks(kernel):
        return
    lw.rank, lw.num_ranks = next(it), next(it)
    lw.rank.name, lw.num_ranks.name = "rank", "num_ranks"
    args = kernel.regions[0].block.args
    for i in tile.ranked_params(kernel):
        p = lw.peers[i] = next(it)
        p.name = f"{args[i].name_hint or f'arg{i}'}.peers"
        local: TensorArg = lw.get(args[i])
        lw.set(args[i], TensorArg(local.ptr, local.sizes, local.strides, local.type, lw.rank))
    if tile.has_rank_barrier(kernel):
        lw.pads = next(it)
        lw.pads.name = "pads"


def system_scope(op: Operation) -> bool:
    """Whether an atomic's ordering reaches other GPUs: its tensor is ``@ ranks``."""
    t = op.tensor.type
    return isinstance(t, TensorType) and t.ranks


def _rank(lw: Lowerer, op: Operation) -> None:
    lw.set(op.result, lw.rank if op.name == "tile.rank" else lw.num_ranks)


def _peer(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    base: TensorArg = lw.get(op.tensor)
    r = lw.get(op.rank)
    bad = b.icmp_unsigned(">=", r, lw.num_ranks)  # a negative rank too (unsigned)
    lw.if_then(bad, lambda: _fail(lw, op, "x.on(r) with r = %d, but the launch has %d ranks", r, lw.num_ranks),
               "peer.bad")
    slot = b.gep(lw.peers[op.tensor.index], [b.zext(r, I64)], source_etype=I64)
    addr = b.load(slot, typ=I64, name="peer.addr")
    ptr = b.inttoptr(addr, nvvm.ptr(nvvm.GLOBAL), name=f"{op.tensor.name_hint or 'tensor'}.on")
    lw.set(op.result, TensorArg(ptr, base.sizes, base.strides, base.type, r))


def _fail(lw: Lowerer, op: Operation, what: str, *values: ir.Value) -> None:
    """Stop the kernel; with the debugging pin ``wait_timeout_ms`` set, first print ``what``
    (a C format over ``values``) with the op's line.  Without the pin the stop is a bare
    ``trap``: printf is a call, and the registers live across it (a product's accumulator
    around a wait) would spill on every path, not only this cold one.  A producer narrowed to
    a few warps never prints (its 24-40 registers hold no printf buffer); the consumers, which
    run the same waits, do."""
    narrowed = lw.role is not None and lw.role.attributes.get("warps")
    if lw.options.wait_timeout_ms and not narrowed:
        where = str(op.loc).replace("%", "%%") if op.loc is not None else "<unknown>"
        nvvm.printf(lw.b, f"tkc: {where}: {what}\n", *values)
    nvvm.trap(lw.b)


def _first(lw: Lowerer) -> ir.Value:
    return lw.b.icmp_unsigned("==", lw.tid, const_i32(0))


def _load_acquire(lw: Lowerer, addr: ir.Value) -> ir.Value:
    return nvvm.asm(lw.b, "ld.acquire.sys.global.b32 $0, [$1];", "=r,l,~{memory}", [addr], I32)


def _spin(lw: Lowerer, op: Operation, passed: Callable[[], ir.Value], what: str, *values: ir.Value) -> None:
    """Loop until ``passed()`` (built inside the loop) is true, sleeping a little between
    tries; after the timeout print ``what`` and stop the kernel."""
    b = lw.b
    limit = (lw.options.wait_timeout_ms or DEFAULT_TIMEOUT_MS) * 1_000_000
    start = nvvm.call(b, "read.ptx.sreg.globaltimer")
    spin = lw.fn.append_basic_block("rank.spin")
    nap = lw.fn.append_basic_block("rank.nap")
    late = lw.fn.append_basic_block("rank.late")
    done = lw.fn.append_basic_block("rank.done")
    b.branch(spin)
    b.position_at_end(spin)
    b.cbranch(passed(), done, nap)
    b.position_at_end(nap)
    nvvm.asm(lw.b, "nanosleep.u32 64;")
    waited = b.sub(nvvm.call(b, "read.ptx.sreg.globaltimer"), start)
    b.cbranch(b.icmp_unsigned(">", waited, ir.Constant(I64, limit)), late, spin)
    b.position_at_end(late)
    _fail(lw, op, f"{what} (still waiting after {limit // 1_000_000} ms: wait_timeout_ms)", *values)
    b.branch(done)
    b.position_at_end(done)


def _proxy_fence(lw: Lowerer) -> None:
    """Order generic-proxy accesses with TMA's (the async proxy) in global memory: after an
    acquire, later TMA copies see what it made visible; before a release, the TMA stores the
    release covers are seen by generic reads."""
    nvvm.asm(lw.b, "fence.proxy.async.global;", "~{memory}")


def _wait(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    flag: TensorArg = lw.get(op.tensor)
    e = _global_element(lw, op, flag, [lw.get(v) for v in op.offsets], ())
    want = lw.get(op.value)
    pred = ICMP[op.pred]  # a wait compares as tile.cmp does on integers

    def one() -> None:
        lw.if_then(b.not_(e.ok), lambda: _fail(lw, op, "wait() on a flag outside its tensor"), "wait.bad")
        def passed() -> ir.Value:
            return b.icmp_signed(pred, _load_acquire(lw, e.addr), want)

        _spin(lw, op, passed, f"rank %d: wait() for a flag {op.pred} %d", lw.rank, want)
        _proxy_fence(lw)

    lw.if_then(_first(lw), one, "wait")
    lw.sync()


def before_release(lw: Lowerer) -> None:
    """What a releasing atomic on one element (or a barrier) needs first: thread 0's TMA
    stores complete (it issued them) and are fenced for the generic proxy, then the
    program's threads meet, so the release by thread 0 covers every thread's writes."""
    if any(op.name == "hopper.tma_store" for op in lw.kernel.walk()):
        def drain() -> None:
            nvvm.call(lw.b, "cp.async.bulk.wait.group", 0)
            _proxy_fence(lw)

        lw.if_then(_first(lw), drain, "release.drain")
    lw.sync()


def acquired(lw: Lowerer) -> None:
    """After an acquiring atomic on a ``@ ranks`` tensor (its issuing thread): later TMA copies
    see what it acquired, as after a wait."""
    _proxy_fence(lw)


def _program(lw: Lowerer) -> ir.Value:
    """The program's linear index in the grid (x fastest)."""
    b = lw.b
    x, y, z = (nvvm.sreg(b, f"ctaid.{a}") for a in "xyz")
    nx, ny = nvvm.sreg(b, "nctaid.x"), nvvm.sreg(b, "nctaid.y")
    return b.add(x, b.mul(nx, b.add(y, b.mul(ny, z))))


def _rank_barrier(lw: Lowerer, op: Operation) -> None:
    """docs/hopper.md §4 "Ranks": add 1 to slot (program, rank) of every rank's pad, wait for
    every slot (program, r) of the own pad to reach the target; roles of one program each add
    once, so the target is the next multiple of the role count."""
    b = lw.b
    if lw.pads is None:
        raise TkcCodegenError("a rank barrier needs the kernel's barrier pads (docs/hopper.md §4)", op.loc)
    before_release(lw)
    roles = const_i32(barrier_roles(lw.kernel))
    me, n = lw.rank, lw.num_ranks

    def pad(r: ir.Value) -> ir.Value:
        return b.load(b.gep(lw.pads, [b.zext(r, I64)], source_etype=I64), typ=I64)

    def slot(base: ir.Value, program: ir.Value, r: ir.Value) -> ir.Value:
        index = b.zext(b.add(b.mul(program, n), r), I64)
        return b.add(base, b.mul(index, ir.Constant(I64, 4)))

    def one() -> None:
        program = _program(lw)
        own = pad(me)
        # One release for every rank's count: a fence, then relaxed adds (each a release pattern
        # with it, as a red.release.sys each would be, which is a fence per rank).
        nvvm.asm(b, "fence.acq_rel.sys;", "~{memory}")
        old = nvvm.asm(b, "atom.relaxed.sys.global.add.u32 $0, [$1], 1;", "=r,l,~{memory}",
                       [slot(own, program, me)], I32)
        target = b.mul(b.add(b.udiv(old, roles), const_i32(1)), roles)
        _each_rank(lw, n, lambda r: lw.if_then(
            b.icmp_unsigned("!=", r, me),
            lambda: nvvm.asm(b, "red.relaxed.sys.global.add.u32 [$0], 1;", "l,~{memory}",
                             [slot(pad(r), program, me)]), "barrier.add"))

        def wait_for(r: ir.Value) -> None:
            addr = slot(own, program, r)
            _spin(lw, op, lambda: b.icmp_signed(">=", b.sub(_load_acquire(lw, addr), target), const_i32(0)),
                  "rank %d: barrier_all() waits for rank %d", me, r)

        _each_rank(lw, n, wait_for)
        _proxy_fence(lw)

    lw.if_then(_first(lw), one, "barrier")
    lw.sync()


def _each_rank(lw: Lowerer, n: ir.Value, body: Callable[[ir.Value], None]) -> None:
    """A loop over ranks 0 .. n-1 (a run-time count) running ``body(r)``."""
    b = lw.b
    pre = b.block
    head = lw.fn.append_basic_block("ranks.loop")
    done = lw.fn.append_basic_block("ranks.done")
    b.cbranch(b.icmp_unsigned(">", n, const_i32(0)), head, done)
    b.position_at_end(head)
    r = b.phi(I32, name="r")
    r.add_incoming(const_i32(0), pre)
    body(r)
    nxt = b.add(r, const_i32(1))
    r.add_incoming(nxt, b.block)
    b.cbranch(b.icmp_unsigned("<", nxt, n), head, done)
    b.position_at_end(done)


#: What makes a map written by the host visible to the tensormap proxy (PTX ISA 8.3).
ACQUIRE_MAP = "fence.proxy.tensormap::generic.acquire.sys [$0], 128;"


def acquire_maps(lw: Lowerer) -> None:
    """At the kernel's start: the per-rank tensor maps are in global memory, copied there from
    the host before the launch, so every thread that may issue a TMA copy (thread 0 of each
    warpgroup: a role's copies are its first thread's) acquires every rank's map of every ranked
    entry for the tensormap proxy before its first copy (``fence.proxy.tensormap::generic``,
    the CUDA programming guide's rule for maps copied with cudaMemcpy; PTX ISA 8.3, which
    ``tkc.codegen.target.emit_ptx`` asks for when a kernel uses it).  Maps passed as
    parameters need none."""
    ranked = [m for m in lw.tmaps if not (isinstance(m.type, ir.PointerType) and m.type.addrspace == nvvm.GENERIC)]
    if not ranked:
        return
    b = lw.b
    leader = b.icmp_unsigned("==", b.urem(lw.tid, const_i32(lw.target.warpgroup)), const_i32(0))

    def each(m: ir.Value) -> None:
        base = b.ptrtoint(m, I64)
        _each_rank(lw, lw.num_ranks, lambda r: nvvm.asm(
            b, ACQUIRE_MAP, "l,~{memory}", [b.add(base, b.mul(b.zext(r, I64), ir.Constant(I64, TENSOR_MAP_BYTES)))]))

    lw.if_then(leader, lambda: [each(m) for m in ranked], "maps.acquire")


def tensor_map(lw: Lowerer, op: Operation, param: ir.Value) -> ir.Value:
    """The tensor map a TMA copy of ``op.tensor`` uses: the parameter itself, or for a ranked
    tensor's array of per-rank maps, the map of the rank the copy reaches."""
    if isinstance(param.type, ir.PointerType) and param.type.addrspace == nvvm.GENERIC:
        return param
    b = lw.b
    r = lw.get(op.tensor).rank
    at = b.add(b.ptrtoint(param, I64), b.mul(b.zext(r, I64), ir.Constant(I64, TENSOR_MAP_BYTES)))
    return b.inttoptr(at, nvvm.ptr())


HANDLERS = {
    "tile.rank": _rank,
    "tile.num_ranks": _rank,
    "tile.peer": _peer,
    "tile.wait": _wait,
    "tile.rank_barrier": _rank_barrier,
}
