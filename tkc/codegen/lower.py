"""Hopper-level tile IR to LLVM IR for NVPTX: one ``tile.kernel`` to one ``ptx_kernel``.

Owns: the kernel ABI of docs/hopper.md §4 (parameters, ``.maxntid`` with ``.minnctapersm 1``
so ptxas knows the entry register budget that ``setmaxnreg`` moves from, the dynamic shared
array), the per-thread lowering of the ops of docs/hopper.md §3, the thread index and
barriers as a warpgroup role sees them, and the structure around them (``tile.for`` as an
SSA loop whose phis carry every value of every tile, ``tile.if`` as branches with phis).
Elementwise ops are in ``lower_elementwise.py``, global loads and stores in ``lower_global.py``,
the ``hopper.*`` ops in ``lower_hopper.py``, the state they all share (:class:`Lowerer`) in
``lowerer.py``, value representation and thread symbols in ``lower_values.py``; this module
sits above them all and none of them imports it.  The kernel's pins (:class:`tkc.pins.Options`)
and :class:`tkc.target.Target` come in as arguments.

Must not: choose a layout, a shared offset, a tile shape or a pipeline depth.  Codegen never
chooses a layout; it reads the one on the type (``thread_coords`` on a run-time thread
symbol plus ``reg_coords``), and every shared offset is the one ``allocate-smem`` wrote.
Unsupported IR is a :class:`TkcCodegenError` at the op's location, never a traceback.

Numerics follow the ops' semantics (``tkc/semantics.py``); the few places that use an
approximate PTX instruction are listed in ``lower_elementwise.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import llvmlite.ir as ir

from tkc.codegen import nvvm
from tkc.codegen.deferred import store_plan
from tkc.codegen.lower_atomic import HANDLERS as ATOMIC
from tkc.codegen.lower_elementwise import HANDLERS as ELEMENTWISE
from tkc.codegen.lower_blackwell import HANDLERS as BLACKWELL
from tkc.codegen.lower_hopper import HANDLERS as HOPPER
from tkc.codegen.lower_rand import HANDLERS as RAND
from tkc.codegen import lower_ranks
from tkc.codegen.lower_values import (Lowered, const_i32, pack_fp8x4, pack_words, packs_in_fours, packs_in_pairs,
                                      round_to, unpack_fp8x4, unpack_pair)
from tkc.codegen.lowerer import Handler, Lowerer, TensorArg
from tkc.codegen.nvvm import F32, I8, I32, I64, TMAP
from tkc.codegen.target import emit_ptx
from tkc.dtypes import DType
from tkc.errors import TkcCodegenError
from tkc.ir.core import Operation
from tkc.ir.layouts import WgmmaOperandA8
from tkc.ir.types import ScalarType, TensorType, TileType, Type
from tkc.pins import Options
from tkc.registers import WGMMA_EXTRA_REGISTERS, entry_registers
from tkc.target import DEFAULT_TARGET, TARGETS, Target, target as lookup_target

__all__ = ["kernel_to_llvm", "kernel_to_ptx"]


def _check_accumulators_fit(kernel: Operation, entry: int, ctas: int, producer_regs: int | None = None) -> None:
    """Refuse, at the product, a wgmma accumulator that takes every register its thread has
    (the role's ``setmaxnreg`` budget, else the entry budget), or that leaves ptxas fewer than
    it needs for the instruction within the entry budget: ptxas would stop with C7602.  A
    pinned ``producer_regs`` is named where it takes the consumers' registers."""
    why = f"ctas_per_sm = {ctas} leaves" if ctas > 1 else "there are"
    fix = "fewer programs per SM, or a narrower tile"
    if producer_regs:
        why = f"the pin producer_regs = {producer_regs} leaves the consumers"
        fix = "give the producer fewer registers, or a narrower tile"
    for op in kernel.walk():
        if op.name != "hopper.wgmma":
            continue
        role = next((a for a in op.ancestors() if a.name == "hopper.role"), None)
        budget = role.attributes.get("regs") or entry if role is not None else entry
        need = getattr(op.result.type.layout, "regs", 0)
        if need >= budget:
            raise TkcCodegenError(f"{why} {budget} registers a thread, and this product's accumulator alone "
                                  f"takes {need}: {fix}", op.loc)
        if need + WGMMA_EXTRA_REGISTERS > entry:
            raise TkcCodegenError(f"{why} {entry} registers a thread at kernel entry, and ptxas compiles this "
                                  f"product within them: its {need}-register accumulator needs "
                                  f"{need + WGMMA_EXTRA_REGISTERS}; {fix}", op.loc)


# --------------------------------------------------------------------------- structure


def _packed(t: Type) -> tuple[DType, int] | None:
    """The dtype of a bf16/f16 or fp8 register tile and the values a b32 holds (2 or 4): such a
    tile crosses control-flow edges (loop-carried values, if results) as packed b32s.  Its f32
    register form through a phi would cost a rounding and a widening per value, and two or four
    times the registers (FP8 attention's P, deferred to the next iteration's P V: decoded and
    encoded again, 1.2x the kernel's instructions)."""
    if not isinstance(t, TileType):
        return None
    per = 2 if packs_in_pairs(t.dtype) else 4 if packs_in_fours(t.dtype) else 0
    if per and t.layout.regs % per == 0:
        return t.dtype, per
    return None


def _flat(b: ir.IRBuilder, t: Type, x: Lowered) -> list[ir.Value]:
    """The LLVM values that carry ``x`` (of type ``t``) across a control-flow edge."""
    if not isinstance(x, list):
        return [x]
    packed = _packed(t)
    if packed is None:
        return list(x)
    dt, per = packed
    if per == 4:
        return [pack_fp8x4(b, [x[i] for i in group], dt) for group in _fp8_words(t)]
    return pack_words(b, x, dt)


def _fp8_words(t: TileType) -> list[list[int]]:
    """The values of an fp8 register tile each b32 carries, byte 0 first: a wgmma A operand's
    in the order its product packs them (so the b32s reach it as they are), else four in a row."""
    lay = t.layout
    if isinstance(lay, WgmmaOperandA8):
        return [reg for s in range(lay.slices) for k in range(lay.k_steps) for reg in lay.step_values(k, s)]
    return [list(range(i, i + 4)) for i in range(0, lay.regs, 4)]


def _unflat(b: ir.IRBuilder, t: Type, vals: list[ir.Value]) -> tuple[Lowered, list[ir.Value]]:
    """Take the values of one ``t`` off the front of ``vals`` (as :func:`_flat` made them)."""
    if isinstance(t, TileType):
        packed = _packed(t)
        if packed is None:
            n = t.layout.regs
            return vals[:n], vals[n:]
        dt, per = packed
        n = t.layout.regs // per
        if per == 2:
            return [h for w in vals[:n] for h in unpack_pair(b, w, dt)], vals[n:]
        out: list = [None] * t.layout.regs
        for group, w in zip(_fp8_words(t), vals[:n]):
            for i, v in zip(group, unpack_fp8x4(b, w, dt)):
                out[i] = v
        return out, vals[n:]
    return vals[0], vals[1:]


def _check_carried(op: Operation, t: Type) -> None:
    if not (isinstance(t, ScalarType) or (isinstance(t, TileType) and t.space == "reg" and t.layout is not None)):
        raise TkcCodegenError(f"'{op.name}' carries {t}: only scalars and register tiles can be carried", op.loc)


def _in_flight(op: Operation) -> list[bool]:
    """Per carried value of a ``tile.for``: does the body yield a ``hopper.wgmma`` result
    (an accumulator still being written by the tensor cores)?"""
    yields = [o for o in op.body.ops if o.name == "tile.yield"]
    vals = yields[-1].operands if yields else []
    return [getattr(getattr(v, "owner", None), "name", None) == "hopper.wgmma" for v in vals]


def _loop_phis(b: ir.IRBuilder, lb: ir.Value, pre: ir.Block, flat_init: list[ir.Value]
               ) -> tuple[ir.Instruction, list[ir.Instruction]]:
    """The induction variable's and the carried values' phis, entered from ``pre``."""
    iv = b.phi(I32, name="iv")
    iv.add_incoming(lb, pre)
    phis = []
    for v in flat_init:
        p = b.phi(v.type)
        p.add_incoming(v, pre)
        phis.append(p)
    return iv, phis


def _loop_body(lw: Lowerer, op: Operation, iv: ir.Instruction, phis: list[ir.Instruction], types: list[Type],
               step: ir.Value) -> tuple[list[Lowered], ir.Value]:
    """Lower the body of ``op`` at the builder's position with its block arguments bound to the
    phis, and close the back edge: the phis get the yielded values and ``iv + step`` from the
    block the body ends in.  Returns the yielded values and ``iv + step``."""
    b = lw.b
    args = op.body.args
    lw.set(args[0], iv)
    rest = list(phis)
    for a, t in zip(args[1:], types):
        x, rest = _unflat(b, t, rest)
        lw.set(a, x)
    yielded = lw.block(op.body) or []
    latch = b.block
    nxt = b.add(iv, step, name="iv.next")
    iv.add_incoming(nxt, latch)
    for p, v in zip(phis, [v for x, t in zip(yielded, types) for v in _flat(b, t, x)]):
        p.add_incoming(v, latch)
    return yielded, nxt


def _for(lw: Lowerer, op: Operation) -> None:
    g = op.operand_groups()
    b = lw.b
    lb, ub, step = lw.get(g["lb"]), lw.get(g["ub"]), lw.get(g["step"])
    inits = [lw.get(v) for v in g["init"]]
    types = [r.type for r in op.results]
    for t in types:
        _check_carried(op, t)
    if any(_in_flight(op)):
        _for_in_flight(lw, op, lb, ub, step, inits, types)
        return
    flat_init = [v for x, t in zip(inits, types) for v in _flat(b, t, x)]
    pre = b.block
    header = lw.fn.append_basic_block("for.header")
    body = lw.fn.append_basic_block("for.body")
    exit_ = lw.fn.append_basic_block("for.exit")
    b.branch(header)
    b.position_at_end(header)
    iv, phis = _loop_phis(b, lb, pre, flat_init)
    b.cbranch(b.icmp_signed("<", iv, ub), body, exit_)
    b.position_at_end(body)
    _loop_body(lw, op, iv, phis, types, step)
    b.branch(header)
    b.position_at_end(exit_)
    rest = list(phis)
    for r, t in zip(op.results, types):
        x, rest = _unflat(b, t, rest)
        lw.set(r, x)


def _for_in_flight(lw: Lowerer, op: Operation, lb: ir.Value, ub: ir.Value, step: ir.Value,
                   inits: list[Lowered], types: list[Type]) -> None:
    """A loop whose wgmma accumulator stays in flight across iterations (pipeline-loops),
    built guarded and bottom-tested, with ``wgmma.wait_group 0`` on the way out of the loop:

        pre:   lb < ub ? body : skip
        body:  phis; ...; iv + step < ub ? body : drain
        drain: wgmma.wait_group 0, the accumulators pinned
        exit:  phis of (drain: the loop's values, skip: the initial ones)

    With the top-tested loop, the zero-trip path (initial accumulator values) and the
    in-flight accumulators meet before the ``hopper.wgmma_wait`` behind the loop, and ptxas
    serializes every wgmma of the kernel (C7514/C7515: registers of a wgmma in flight
    defined or read by other instructions).  Waiting at the exit edge instead is the same
    wait the IR makes next (that one then finds nothing pending)."""
    b = lw.b
    flat_init = [v for x, t in zip(inits, types) for v in _flat(b, t, x)]
    pre = b.block
    body = lw.fn.append_basic_block("for.body")
    drain = lw.fn.append_basic_block("for.drain")
    skip = lw.fn.append_basic_block("for.skip")
    exit_ = lw.fn.append_basic_block("for.exit")
    b.cbranch(b.icmp_signed("<", lb, ub), body, skip)
    b.position_at_end(body)
    iv, phis = _loop_phis(b, lb, pre, flat_init)
    yielded, nxt = _loop_body(lw, op, iv, phis, types, step)
    b.cbranch(b.icmp_signed("<", nxt, ub), body, drain)
    b.position_at_end(drain)
    nvvm.call(b, "wgmma.wait_group.sync.aligned", 0)
    out = []
    for x, t, flight in zip(yielded, types, _in_flight(op)):
        out += nvvm.pin(b, x) if flight else _flat(b, t, x)
    b.branch(exit_)
    b.position_at_end(skip)
    b.branch(exit_)
    b.position_at_end(exit_)
    merged = []
    for v, init in zip(out, flat_init):
        p = b.phi(v.type)
        p.add_incoming(v, drain)
        p.add_incoming(init, skip)
        merged.append(p)
    for r, t in zip(op.results, types):
        x, merged = _unflat(b, t, merged)
        lw.set(r, x)


def _if(lw: Lowerer, op: Operation) -> None:
    b = lw.b
    types = [r.type for r in op.results]
    for t in types:
        _check_carried(op, t)
    then = lw.fn.append_basic_block("if.then")
    else_ = lw.fn.append_basic_block("if.else")
    merge = lw.fn.append_basic_block("if.end")
    b.cbranch(lw.get(op.cond), then, else_)
    incoming = []
    for region, blk in zip(op.regions, (then, else_)):
        b.position_at_end(blk)
        vals = [v for x, t in zip(lw.block(region.block) or [], types) for v in _flat(b, t, x)]
        incoming.append((vals, b.block))
        b.branch(merge)
    b.position_at_end(merge)
    flat = []
    for k in range(len(incoming[0][0])):
        p = b.phi(incoming[0][0][k].type)
        for vals, blk in incoming:
            p.add_incoming(vals[k], blk)
        flat.append(p)
    for r, t in zip(op.results, types):
        x, flat = _unflat(b, t, flat)
        lw.set(r, x)


def _sreg(reg: str) -> Handler:
    def lower(lw: Lowerer, op: Operation) -> None:
        lw.set(op.result, nvvm.sreg(lw.b, f"{reg}.{'xyz'[op.axis]}"))
    return lower


def _dim(lw: Lowerer, op: Operation) -> None:
    lw.set(op.result, lw.get(op.tensor).sizes[op.axis])


STRUCTURE: dict[str, Handler] = {
    "tile.for": _for,
    "tile.if": _if,
    "tile.grid": lambda lw, op: None,  # evaluated on the host (docs/hopper.md §4)
    # Only a persistent kernel's grid(...) reads it, and the grid is evaluated on the host:
    # the kernel walks tiles by num_programs, the grid it was launched with.
    "tile.num_sms": lambda lw, op: lw.set(op.result, nvvm.sreg(lw.b, "nsmid")),
    "tile.program_id": _sreg("ctaid"),
    "tile.num_programs": _sreg("nctaid"),
    "tile.dim": _dim,
}


# --------------------------------------------------------------------------- the kernel


def _param_types(kernel: Operation) -> list[ir.Type | nvvm.TensorMap]:
    out: list[ir.Type | nvvm.TensorMap] = []
    for a in kernel.body.args:
        t = a.type
        if isinstance(t, TensorType):
            out += [nvvm.ptr(nvvm.GLOBAL), *[I32] * t.rank, *[I64] * t.rank]
        elif t.dtype.is_float:
            out.append(F32)  # other float dtypes travel as f32 and are rounded here (§4)
        else:
            out.append(I64 if t.dtype.bits == 64 else I32)  # i32 (i64), and i1 as 0/1
    # A ranked tensor's maps are an array of per-rank maps in global memory (§4, item 3).
    args = kernel.body.args
    maps = [nvvm.ptr(nvvm.GLOBAL) if args[i].type.ranks else TMAP
            for i, _, _ in kernel.attributes.get("tma_maps") or []]
    return out + lower_ranks.param_types(kernel) + maps


def _bind_params(lw: Lowerer, kernel: Operation, args: Sequence[ir.Argument]) -> None:
    it = iter(args)
    for a in kernel.body.args:
        t = a.type
        name = a.name_hint or f"arg{a.index}"
        if isinstance(t, TensorType):
            p = next(it)
            p.name = name
            sizes = tuple(next(it) for _ in range(t.rank))
            strides = tuple(next(it) for _ in range(t.rank))
            for k, (s, st) in enumerate(zip(sizes, strides)):
                s.name, st.name = f"{name}.size{k}", f"{name}.stride{k}"
            lw.set(a, TensorArg(p, sizes, strides, t))
            continue
        p = next(it)
        p.name = name
        if t.dtype.is_bool:
            lw.set(a, lw.b.icmp_unsigned("!=", p, const_i32(0)))
        elif t.dtype.is_float:
            lw.set(a, round_to(lw.b, p, t.dtype))
        else:
            lw.set(a, p)
    lower_ranks.bind_params(lw, kernel, it)
    for k, p in enumerate(it):
        p.name = f"tmap{k}"


def _kernel_attr(kernel: Operation, name: str) -> Any:
    v = kernel.attributes.get(name)
    if v is None:
        raise TkcCodegenError(f"kernel @{kernel.attributes.get('sym_name')} has no '{name}' attribute: "
                              f"codegen takes hopper-level IR (after allocate-smem)", kernel.loc)
    return v


def kernel_to_llvm(kernel: Operation, target: str | Target = DEFAULT_TARGET,
                   options: Options | None = None) -> ir.Module:
    """A hopper-level ``tile.kernel`` (after allocate-smem) as an LLVM module holding one
    ``ptx_kernel`` named after it, with the parameters of docs/hopper.md §4, for ``target``
    with the pins ``options`` (default: the kernel's own, from its ``consts``)."""
    if not isinstance(kernel, Operation) or kernel.name != "tile.kernel":
        raise TkcCodegenError(f"expected a 'tile.kernel' op, got {kernel!r}")
    t = lookup_target(target)
    if t.dialect not in ("hopper", "blackwell"):
        hoppers = ", ".join(n for n, x in TARGETS.items() if x.dialect in ("hopper", "blackwell"))
        raise TkcCodegenError(f"hopper-level IR is lowered for {hoppers} only, not {t.name}", kernel.loc)
    if t.mma != "tcgen05":
        tc = next((op for op in kernel.walk() if op.name.startswith("blackwell.")), None)
        if tc is not None:
            raise TkcCodegenError(f"'{tc.name}' is a tcgen05 op; {t.name} has no tensor memory", tc.loc)
    if options is None:
        options = Options.from_consts(kernel.attributes.get("consts"), kernel.loc, t)
    name = kernel.attributes["sym_name"]
    threads = _kernel_attr(kernel, "threads")
    smem_bytes = _kernel_attr(kernel, "smem_bytes")
    if not isinstance(threads, int) or threads <= 0 or threads % t.warpgroup or threads > t.max_threads:
        raise TkcCodegenError(f"threads = {threads!r}: expected a multiple of {t.warpgroup} up to {t.max_threads}",
                              kernel.loc)
    module = ir.Module(name=name)
    # The .ll text names its target, so llc/opt can read it alone (emit_ptx sets the same).
    module.triple, module.data_layout = t.triple, t.data_layout
    ctas = options.programs_per_sm
    _check_accumulators_fit(kernel, entry_registers(threads, ctas, t), ctas, options.producer_regs)
    cluster = kernel.attributes.get("cluster") or 1
    fn = nvvm.kernel(module, name, _param_types(kernel), maxntid=threads, minctasm=ctas,
                     cluster_dim=(cluster, 1, 1) if cluster > 1 else None)
    smem = None
    if smem_bytes:
        # One dynamic shared array; every offset of allocate-smem is from its base (§4).
        smem = ir.GlobalVariable(module, ir.ArrayType(I8, 0), "smem", addrspace=nvvm.SHARED)
        smem.linkage = "external"
        smem.align = 1024
        # An opaque pointer (llvmlite types it by default): element pointers off it then take
        # loads and stores of any type, as LLVM's own opaque pointers do.
        smem.type = nvvm.ptr(nvvm.SHARED)
    n_maps = len(kernel.attributes.get("tma_maps") or [])
    handlers = {**ELEMENTWISE, **RAND, **HOPPER, **BLACKWELL, **ATOMIC, **lower_ranks.HANDLERS, **STRUCTURE}
    lw = Lowerer(kernel, fn, threads, smem, fn.args[len(fn.args) - n_maps:], handlers, store_plan(kernel), options, t)
    _bind_params(lw, kernel, fn.args)
    if lw.tmaps:
        # A copy fetches its tensor map's 128 bytes the first time it is used; thread 0 asks for
        # them now, so the fetch overlaps the barriers' setup instead of the first copy.
        first = lw.b.icmp_unsigned("==", lw.tid, const_i32(0))
        lw.if_then(first, lambda: [nvvm.call(lw.b, "prefetch.tensormap.p0", m) for m in lw.tmaps
                                   if m.type.addrspace == nvvm.GENERIC], "prefetch")
        lower_ranks.acquire_maps(lw)
    lw.block(kernel.body)
    lw.b.ret_void()
    return module


def kernel_to_ptx(kernel: Operation, target: str | Target = DEFAULT_TARGET, options: Options | None = None) -> str:
    """PTX for a hopper-level kernel: :func:`kernel_to_llvm` through ``emit_ptx``."""
    return emit_ptx(kernel_to_llvm(kernel, target, options), target)

