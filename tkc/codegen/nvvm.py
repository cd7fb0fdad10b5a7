"""NVVM building blocks over ``llvmlite.ir``: kernels, intrinsics, inline PTX.

Owns: how a kernel function is declared for NVPTX (``ptx_kernel`` and the
``"nvvm.*"`` attributes, PTX-FACTS §8 "Kernel marking"), the tensor-map
parameter (§8 "Tensor-map parameter"), the typed declarations of the NVVM
intrinsics tkc uses (§8), and the inline-asm builders for what LLVM has no
intrinsic for: ``wgmma.mma_async`` (§1, §8) and the accumulator pin.

Must not: choose a layout, a tile shape, a register budget or a pipeline
depth; it emits exactly what the caller asks for.  Nothing here runs LLVM.

Everything is built with ``llvmlite.ir``.  The two things ``llvmlite.ir``
cannot print (valued string function attributes such as
``"nvvm.maxntid"="384"``, and ``byval(<type>)`` + ``"nvvm.grid_constant"`` on
an opaque-pointer parameter) are handled by the two attribute-set subclasses
below, which only add text to the function's header.
"""

from __future__ import annotations

from collections.abc import Sequence

import llvmlite.ir as ir

from tkc.errors import TkcCodegenError
from tkc.registers import SETMAXNREG_MAX, SETMAXNREG_MIN, setmaxnreg_budget

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()
VOID = ir.VoidType()

#: The widest global access, in bytes (``ld.global.v4.b32``).
VECTOR_BYTES = 16

# NVPTX address spaces (PTX-FACTS §8 "Address spaces").
GENERIC, GLOBAL, SHARED, CONST, LOCAL, TMEM, SHARED_CLUSTER = 0, 1, 3, 4, 5, 6, 7


def ptr(addrspace: int = GENERIC) -> ir.PointerType:
    """An opaque pointer in ``addrspace``."""
    return ir.PointerType(addrspace=addrspace)


# --------------------------------------------------------------------------- kernels


class _KernelAttributes(ir.FunctionAttributes):
    """Function attributes plus LLVM string attributes (``"key"="value"``)."""

    def __init__(self) -> None:
        super().__init__()
        self.strings: dict[str, str] = {}

    def __bool__(self) -> bool:  # llvmlite prints attributes only when the set is truthy
        return bool(self.strings) or len(self) > 0

    def _to_list(self, ret_type: ir.Type) -> list[str]:
        return super()._to_list(ret_type) + [f'"{k}"="{v}"' for k, v in self.strings.items()]


class _TensorMapAttributes(ir.ArgumentAttributes):
    """``byval(%struct.CUtensorMap) align 64 "nvvm.grid_constant"`` (PTX-FACTS §3, §8).

    Without ``"nvvm.grid_constant"`` LLVM copies the map to local memory byte by
    byte, and TMA on a local address is invalid (ptx-examples/llvm/test6.py).
    """

    def __init__(self, struct: ir.Type) -> None:
        super().__init__()
        self.struct = struct
        self.align = 64

    def __bool__(self) -> bool:
        return True

    def _to_list(self, typ: ir.Type) -> list[str]:
        return [f"byval({self.struct})", *super()._to_list(typ), '"nvvm.grid_constant"']


class TensorMap:
    """Marks a kernel parameter as a host-encoded 128-byte ``CUtensorMap`` (``__grid_constant__``)."""

    def __repr__(self) -> str:
        return "TMAP"


TMAP = TensorMap()


def tensormap_type(module: ir.Module) -> ir.IdentifiedStructType:
    """``%struct.CUtensorMap = type { [16 x i64] }``: 128 bytes, the host struct's size."""
    ty = module.context.get_identified_type("struct.CUtensorMap")
    if ty.is_opaque:
        ty.set_body(ir.ArrayType(I64, 16))
    return ty


def _positive(name: str, value: int, hi: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (hi is not None and value > hi):
        bound = f" in [1, {hi}]" if hi else ""
        raise TkcCodegenError(f"kernel attribute {name}={value!r}: expected an integer{bound}")
    return value


def kernel(module: ir.Module, name: str, params: Sequence[ir.Type | TensorMap], *,
           maxntid: int | Sequence[int], minctasm: int | None = None, maxnreg: int | None = None,
           cluster_dim: Sequence[int] | None = None) -> ir.Function:
    """Define ``ptx_kernel void @name(params...)`` with NVVM attributes (PTX-FACTS §8).

    - ``maxntid`` → ``.maxntid`` (an int, or up to 3 dims).
    - ``minctasm`` → ``.minnctapersm``; ``maxnreg`` → ``.maxnreg``.
    - ``cluster_dim`` → ``.explicitcluster`` + ``.reqnctapercluster``.
    - a ``TMAP`` param becomes a grid-constant ``CUtensorMap`` passed by value.

    A kernel that uses ``setmaxnreg`` must give ``maxnreg``, or ``minctasm=1``
    with ``maxntid``; otherwise ptxas drops setmaxnreg with warning C7508 (§5).
    """
    dims = (maxntid,) if isinstance(maxntid, int) else tuple(maxntid)
    if not 1 <= len(dims) <= 3:
        raise TkcCodegenError(f"maxntid={maxntid!r}: expected 1 to 3 dims")
    total = 1
    for d in dims:
        total *= _positive("maxntid", d, 1024)
    _positive("maxntid (product)", total, 1024)
    types = [ptr() if isinstance(p, TensorMap) else p for p in params]
    fn = ir.Function(module, ir.FunctionType(VOID, types), name)
    fn.calling_convention = "ptx_kernel"
    attrs = _KernelAttributes()
    attrs.strings["nvvm.maxntid"] = ",".join(map(str, dims))
    if minctasm is not None:
        attrs.strings["nvvm.minctasm"] = str(_positive("minctasm", minctasm, 32))
    if maxnreg is not None:
        attrs.strings["nvvm.maxnreg"] = str(_positive("maxnreg", maxnreg, 255))
    if cluster_dim is not None:
        cdims = tuple(cluster_dim)
        if len(cdims) != 3:
            raise TkcCodegenError(f"cluster_dim={cluster_dim!r}: expected 3 dims")
        for d in cdims:
            _positive("cluster_dim", d, 16)
        attrs.strings["nvvm.cluster_dim"] = ",".join(map(str, cdims))
    fn.attributes = attrs
    for arg, p in zip(fn.args, params):
        if isinstance(p, TensorMap):
            arg.attributes = _TensorMapAttributes(tensormap_type(module))
    return fn


def shared(module: ir.Module, name: str, ty: ir.Type, align: int) -> ir.GlobalVariable:
    """A static shared-memory buffer: ``@name = internal addrspace(3) global ty undef, align A``.

    The caller picks the alignment (e.g. 1024 B for a 128B-swizzled TMA/wgmma tile, PTX-FACTS §3;
    8 B for an mbarrier, §4).
    """
    gv = ir.GlobalVariable(module, ty, name, addrspace=SHARED)
    gv.linkage = "internal"
    gv.align = align
    gv.initializer = ir.Constant(ty, ir.Undefined)
    return gv


# --------------------------------------------------------------------------- intrinsics


def _intrinsic_table() -> dict[str, tuple[ir.Type, tuple[ir.Type, ...]]]:
    """Signatures of the NVVM intrinsics tkc uses, keyed by name without ``llvm.nvvm.``.

    Every name is in LLVM 22's intrinsic table (PTX-FACTS §8).
    """
    p3, p7, p0 = ptr(SHARED), ptr(SHARED_CLUSTER), ptr()
    t: dict[str, tuple[ir.Type, tuple[ir.Type, ...]]] = {}
    # Special registers.
    for reg in ("tid", "ctaid", "ntid", "nctaid", "cluster.ctaid", "cluster.nctaid"):
        for axis in "xyz":
            t[f"read.ptx.sreg.{reg}.{axis}"] = (I32, ())
    for reg in ("laneid", "warpid", "nsmid", "cluster.ctarank", "cluster.nctarank"):
        t[f"read.ptx.sreg.{reg}"] = (I32, ())
    t["read.ptx.sreg.globaltimer"] = (I64, ())  # nanoseconds
    # mbarrier and fences (§4).
    t["mbarrier.init.shared"] = (VOID, (p3, I32))
    t["mbarrier.arrive.scope.cta.space.cta"] = (I64, (p3, I32))
    t["mbarrier.arrive.expect.tx.scope.cta.space.cta"] = (I64, (p3, I32))
    t["mbarrier.try.wait.parity.scope.cta.space.cta"] = (I1, (p3, I32))
    t["fence.mbarrier_init.release.cluster"] = (VOID, ())
    t["fence.proxy.async.shared_cta"] = (VOID, ())
    t["barrier.cta.sync.aligned.all"] = (VOID, (I32,))
    t["barrier.cta.sync.aligned.count"] = (VOID, (I32, I32))
    t["barrier.cta.arrive.aligned.count"] = (VOID, (I32, I32))
    # barrier.cluster: arrive (release by default) and wait (acquire by default).  Intrinsics,
    # not inline PTX: LLVM knows them convergent and never duplicates one into both arms of a
    # branch, which for an .aligned barrier would leave a warp split across two copies of it.
    t["barrier.cluster.arrive.aligned"] = (VOID, ())
    t["barrier.cluster.wait.aligned"] = (VOID, ())
    t["elect.sync"] = (ir.LiteralStructType([I32, I1]), (I32,))
    # setmaxnreg: an immediate multiple of 8 in [24, 256] (§5).
    t["setmaxnreg.inc.sync.aligned.u32"] = (VOID, (I32,))
    t["setmaxnreg.dec.sync.aligned.u32"] = (VOID, (I32,))
    # TMA (§3): coordinates innermost first, then multicast mask, cache hint and their enables.
    for d in range(1, 6):
        t[f"cp.async.bulk.tensor.g2s.tile.{d}d"] = (VOID, (p7, p3, p0, *[I32] * d, I16, I64, I1, I1))
        t[f"cp.async.bulk.tensor.s2g.tile.{d}d"] = (VOID, (p3, p0, *[I32] * d, I64, I1))
        t[f"cp.async.bulk.tensor.reduce.add.tile.{d}d"] = (VOID, (p3, p0, *[I32] * d, I64, I1))
    t["cp.async.bulk.commit.group"] = (VOID, ())
    t["cp.async.bulk.wait.group"] = (VOID, (I32,))
    t["cp.async.bulk.wait.group.read"] = (VOID, (I32,))
    t["prefetch.tensormap.p0"] = (VOID, (p0,))
    # ldmatrix / stmatrix m8n8 b16 (§6).
    for x in (1, 2, 4):
        ret = I32 if x == 1 else ir.LiteralStructType([I32] * x)
        for trans in ("", ".trans"):
            t[f"ldmatrix.sync.aligned.m8n8.x{x}{trans}.b16.p3"] = (ret, (p3,))
            t[f"stmatrix.sync.aligned.m8n8.x{x}{trans}.b16.p3"] = (VOID, (p3, *[I32] * x))
    # Warp shuffles (full mask; c = 31: butterfly within the whole warp).
    t["shfl.sync.bfly.f32"] = (F32, (I32, F32, I32, I32))
    t["shfl.sync.bfly.i32"] = (I32, (I32, I32, I32, I32))
    t["shfl.sync.idx.i32"] = (I32, (I32, I32, I32, I32))
    # Approximate math (PTX ISA accuracy tables; lower_elementwise.py says where each is used).
    t["ex2.approx.ftz.f"] = (F32, (F32,))
    t["lg2.approx.f"] = (F32, (F32,))
    t["rsqrt.approx.f"] = (F32, (F32,))
    t["tanh.approx.f32"] = (F32, (F32,))
    t["sin.approx.f"] = (F32, (F32,))
    t["cos.approx.f"] = (F32, (F32,))
    # The high half of a 32-bit product (a division by a loop-invariant divisor's reciprocal).
    t["mulhi.ui"] = (I32, (I32, I32))
    # wgmma bookkeeping; mma_async itself is inline asm (wgmma() below).
    t["wgmma.fence.sync.aligned"] = (VOID, ())
    t["wgmma.commit_group.sync.aligned"] = (VOID, ())
    t["wgmma.wait_group.sync.aligned"] = (VOID, (I64,))
    return t


INTRINSICS = _intrinsic_table()


def intrinsic(module: ir.Module, name: str) -> ir.Function:
    """The declaration of ``llvm.nvvm.<name>`` in ``module`` (declared on first use)."""
    full = f"llvm.nvvm.{name}"
    existing = module.globals.get(full)
    if existing is not None:
        return existing
    if name not in INTRINSICS:
        raise TkcCodegenError(f"unknown NVVM intrinsic {full!r} (not in tkc.codegen.nvvm.INTRINSICS)")
    ret, args = INTRINSICS[name]
    return ir.Function(module, ir.FunctionType(ret, args), full)


def call(builder: ir.IRBuilder, name: str, *args: ir.Value | int, result: str = "") -> ir.Instruction:
    """Call ``llvm.nvvm.<name>``; plain ints become constants of the parameter's type."""
    fn = intrinsic(builder.module, name)
    params = fn.ftype.args
    if len(args) != len(params):
        raise TkcCodegenError(f"llvm.nvvm.{name} takes {len(params)} arguments, got {len(args)}")
    vals = [ir.Constant(ty, a) if isinstance(a, int) else a for a, ty in zip(args, params)]
    return builder.call(fn, vals, name=result)


def asm(builder: ir.IRBuilder, text: str, constraints: str = "", args: Sequence[ir.Value] = (),
        ret: ir.Type | None = None) -> ir.Value:
    """Inline PTX with side effects (never moved or dropped): ``text`` over ``args`` by
    ``constraints``, returning ``ret`` (nothing by default)."""
    fty = ir.FunctionType(ret or VOID, [a.type for a in args])
    return builder.asm(fty, text, constraints, list(args), side_effect=True)


def sreg(builder: ir.IRBuilder, reg: str, result: str = "") -> ir.Instruction:
    """Read a special register: ``sreg(b, "tid.x")``, ``sreg(b, "laneid")``."""
    return call(builder, f"read.ptx.sreg.{reg}", result=result or reg.replace(".", "_"))


def setmaxnreg(builder: ir.IRBuilder, regs: int, inc: bool) -> ir.Instruction:
    """``setmaxnreg.{inc,dec}.sync.aligned.u32 regs`` (PTX-FACTS §5: immediate, multiple of 8, 24..256)."""
    if not setmaxnreg_budget(regs):
        raise TkcCodegenError(f"setmaxnreg {regs!r}: expected a multiple of 8 in [{SETMAXNREG_MIN}, {SETMAXNREG_MAX}]")
    return call(builder, f"setmaxnreg.{'inc' if inc else 'dec'}.sync.aligned.u32", regs)


# --------------------------------------------------------------------------- printf and trap


def printf(builder: ir.IRBuilder, text: str, *values: ir.Value) -> None:
    """CUDA's device printf (``vprintf``, which the driver provides): ``text`` a C format
    (a constant in global memory), ``values`` packed into a local buffer as printf expects."""
    module = builder.module
    data = bytearray(text.encode() + b"\0")
    ty = ir.ArrayType(I8, len(data))
    fmt = ir.GlobalVariable(module, ty, module.get_unique_name("printf.format"), addrspace=GLOBAL)
    fmt.global_constant, fmt.linkage, fmt.initializer = True, "internal", ir.Constant(ty, data)
    vprintf = module.globals.get("vprintf") or ir.Function(module, ir.FunctionType(I32, [ptr(), ptr()]), "vprintf")
    packed = ir.LiteralStructType([v.type for v in values])
    buf = builder.alloca(packed)
    for i, v in enumerate(values):
        builder.store(v, builder.gep(buf, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
    builder.call(vprintf, [builder.addrspacecast(fmt, ptr()), buf])


def trap(builder: ir.IRBuilder) -> None:
    """``trap``: the kernel stops and the launch fails."""
    fn = builder.module.globals.get("llvm.trap") or ir.Function(builder.module, ir.FunctionType(VOID, []),
                                                                "llvm.trap")
    builder.call(fn, [])


# --------------------------------------------------------------------------- wgmma (inline asm)

# PTX-FACTS §1: input type → K of the instruction; only 16-bit inputs have transpose operands.
_WGMMA_K = {"f16": 16, "bf16": 16, "e4m3": 32, "e5m2": 32}


def wgmma_asm(n: int, a_type: str = "bf16", b_type: str | None = None, *, a_regs: bool = False,
              scale_d: bool | None = True, trans_a: int = 0, trans_b: int = 0,
              neg_a: bool = False, neg_b: bool = False) -> tuple[str, str]:
    """The asm text and constraint string of one ``wgmma.mma_async`` m64nNk{16,32} with an f32 accumulator.

    Operands, in call order (PTX-FACTS §1, §8 recipe):
      ``$0..$(N/2-1)``  accumulator outputs (``=f``),
      A: one ``l`` descriptor (SS) or four ``r`` b32 registers (RS, ``a_regs``),
      B: one ``l`` descriptor,
      scale-d: an ``r`` i32 operand (non-zero ⇒ D += A·B) when ``scale_d`` is None,
      otherwise the immediate 1 (accumulate) or 0 (D = A·B),
      then the N/2 accumulator inputs tied to the outputs (``0``, ``1``, ...).
    ``~{memory}`` keeps LLVM from moving shared-memory accesses across it.
    """
    b_type = a_type if b_type is None else b_type
    if a_type not in _WGMMA_K or b_type not in _WGMMA_K or _WGMMA_K[a_type] != _WGMMA_K[b_type]:
        raise TkcCodegenError(f"wgmma {a_type}×{b_type}: expected f16×f16, bf16×bf16 or e4m3/e5m2 pairs")
    if _WGMMA_K[a_type] == 16 and a_type != b_type:
        raise TkcCodegenError(f"wgmma {a_type}×{b_type}: 16-bit inputs must have the same type")
    if not isinstance(n, int) or n % 8 or not 8 <= n <= 256:
        raise TkcCodegenError(f"wgmma N={n!r}: expected a multiple of 8 in [8, 256]")
    k = _WGMMA_K[a_type]
    fp8 = k == 32
    if fp8 and (trans_a or trans_b):
        raise TkcCodegenError("wgmma fp8 operands are K-major only (no transpose)")
    if trans_a not in (0, 1) or trans_b not in (0, 1) or (a_regs and trans_a):
        raise TkcCodegenError("wgmma transpose flags are 0 or 1, and an A in registers has none")
    nd = n // 2
    d = ", ".join(f"${i}" for i in range(nd))
    nxt = nd
    if a_regs:
        a = "{" + ", ".join(f"${nxt + j}" for j in range(4)) + "}"
        nxt += 4
        ins = ["r"] * 4
    else:
        a = f"${nxt}"
        nxt += 1
        ins = ["l"]
    b = f"${nxt}"
    nxt += 1
    ins.append("l")
    imm = [str(-1 if neg_a else 1), str(-1 if neg_b else 1)]
    if not fp8:
        imm += ([] if a_regs else [str(trans_a)]) + [str(trans_b)]
    op = f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{a_type}.{b_type}"
    if scale_d is None:
        ins.append("r")
        asm = (f"{{\\0A.reg .pred p;\\0Asetp.ne.b32 p, ${nxt}, 0;\\0A"
               f"{op} {{{d}}}, {a}, {b}, p, {', '.join(imm)};\\0A}}")
    else:
        asm = f"{op} {{{d}}}, {a}, {b}, {int(bool(scale_d))}, {', '.join(imm)};"
    cons = ",".join(["=f"] * nd + ins + [str(i) for i in range(nd)] + ["~{memory}"])
    return asm, cons


def wgmma(builder: ir.IRBuilder, acc: Sequence[ir.Value], a: ir.Value | Sequence[ir.Value], b_desc: ir.Value,
          *, a_type: str = "bf16", b_type: str | None = None, scale_d: bool | ir.Value = True,
          trans_a: int = 0, trans_b: int = 0) -> list[ir.Value]:
    """Issue one ``wgmma.mma_async`` and return the new accumulator values.

    ``acc``: the N/2 f32 accumulators (N = 2·len(acc)); ``a``: an i64 smem
    descriptor (SS) or four i32 registers (RS); ``b_desc``: an i64 descriptor;
    ``scale_d``: a Python bool (immediate) or an i32 value (non-zero ⇒ accumulate).
    The caller brackets it with ``wgmma.fence`` / ``commit_group`` / ``wait_group``
    (PTX-FACTS §1) and pins the results after the wait (:func:`pin`).
    """
    a_regs = not isinstance(a, ir.Value)
    a_vals = list(a) if a_regs else [a]
    if a_regs and len(a_vals) != 4:
        raise TkcCodegenError(f"wgmma with A in registers takes 4 i32 values, got {len(a_vals)}")
    dynamic = isinstance(scale_d, ir.Value)
    asm, cons = wgmma_asm(2 * len(acc), a_type, b_type, a_regs=a_regs, scale_d=None if dynamic else scale_d,
                          trans_a=trans_a, trans_b=trans_b)
    args = [*a_vals, b_desc, *([scale_d] if dynamic else []), *acc]
    ret = ir.LiteralStructType([F32] * len(acc))
    ftype = ir.FunctionType(ret, [v.type for v in args])
    res = builder.asm(ftype, asm, cons, args, side_effect=True, name="wgmma")
    return [builder.extract_value(res, i) for i in range(len(acc))]


def pin(builder: ir.IRBuilder, values: Sequence[ir.Value]) -> list[ir.Value]:
    """Pass each f32 through ``asm sideeffect "", "=f,0"`` (CUTLASS ``warpgroup_fence_operand``, §8).

    Keeps LLVM from reading or moving accumulators across the wgmma wait.
    """
    ftype = ir.FunctionType(F32, [F32])
    return [builder.asm(ftype, "", "=f,0", [v], side_effect=True) for v in values]


def opaque(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """``value`` through ``asm sideeffect "", "=r|l,0"``: the same register, but LLVM can no
    longer see where it came from, so nothing computed from it is hoisted above this point
    (out of a loop, or out of a branch that is rarely taken)."""
    width = value.type.width
    if width not in (32, 64):
        raise TkcCodegenError(f"opaque takes an i32 or i64, got {value.type}")
    ftype = ir.FunctionType(value.type, [value.type])
    return builder.asm(ftype, "", "=r,0" if width == 32 else "=l,0", [value], side_effect=True)


def opaque_all(builder: ir.IRBuilder, values: list[ir.Value]) -> list[ir.Value]:
    """:func:`opaque` for several i32 values at once (one empty asm statement, each output
    tied to its input)."""
    if len(values) == 1:
        return [opaque(builder, values[0])]
    if any(v.type.width != 32 for v in values):
        raise TkcCodegenError("opaque_all takes i32 values")
    n = len(values)
    ftype = ir.FunctionType(ir.LiteralStructType([values[0].type] * n), [v.type for v in values])
    cons = ",".join(["=r"] * n + [str(i) for i in range(n)])
    out = builder.asm(ftype, "", cons, values, side_effect=True)
    return [builder.extract_value(out, i) for i in range(n)]


def rolled(branch: ir.Instruction) -> None:
    """Mark the loop whose latch ends in ``branch`` ``llvm.loop.unroll.disable``: NVPTX lets
    LLVM unroll loops of unknown trip count by four, which for a loop written to keep code
    small (the edge path of a global access) undoes its point.  The loop id is a node whose
    first operand is itself, as LangRef asks, one per loop."""
    module = branch.function.module
    disable = module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")])
    node = ir.MDValue(module, [], name=str(len(module.metadata)))
    node.operands = (node, disable)
    branch.set_metadata("llvm.loop", node)
