"""GPU targets as values: what a target is, for the passes, codegen and the runtime alike.

Owns: the :class:`Target` record (an architecture's name, what LLVM and ptxas call it, and the
hardware facts the passes budget with: shared memory, registers, threads, the MMA shape and
dtypes, TMA, cluster sizes) and the table of targets tkc knows (:data:`TARGETS`).  The pass
manager and codegen receive one :class:`Target` as an argument; no pass names an architecture,
so a new GPU is a new row here plus the lowering of what it does differently.

Must not: build IR, run LLVM (``tkc.codegen.target`` holds the LLVM recipe) or ptxas, or choose
anything about a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from tkc.errors import TkcUsageError

TRIPLE = "nvptx64-nvidia-cuda"
# What LLVM 22's NVPTX target machine reports for nvptx64 (the same for every
# sm_*); tests check it against the target machine.
DATA_LAYOUT = "e-p6:32:32-i64:64-i128:128-i256:256-v16:16-v32:32-n16:32:64"
#: Bytes (and alignment) of a TMA tensor map (``CUtensorMap``) on every target with TMA: a
#: kernel parameter's size, and the stride of a ranked tensor's per-rank maps (docs/hopper.md §4).
TENSOR_MAP_BYTES = 128


@dataclass(frozen=True)
class Target:
    """One GPU target: what LLVM needs to emit its code, what ptxas needs to assemble it, and
    the hardware limits the passes and codegen plan within."""

    name: str  # what users type: "sm_90a"
    cpu: str  # LLVM NVPTX cpu
    ptx_feature: str  # LLVM feature string choosing the PTX ISA version
    ptx_version: str  # the `.version` it produces
    arch: str  # ptxas -arch=
    # Intrinsic name prefixes LLVM cannot lower for this cpu: using one is a
    # fatal LLVM error (PTX-FACTS §0 and §8), so emit_ptx refuses them first.
    forbidden_intrinsics: tuple[str, ...] = ()
    triple: str = TRIPLE
    data_layout: str = DATA_LAYOUT
    # Dynamic shared memory one block may opt into (cudaFuncAttributeMaxDynamicSharedMemorySize):
    # 227 KB on sm_90 and sm_100; allocate-smem refuses kernels that need more.
    max_smem_bytes: int = 232448
    # Shared memory of one SM, of which each resident block reserves 1 KB (228 KB, 1 KB).
    sm_smem_bytes: int = 233472
    smem_reserved_per_block: int = 1024
    # The register file of one SM (32-bit registers), dealt to a warp in units of
    # `register_unit` over `subpartitions` quarters; a thread holds at most `max_registers`.
    register_file: int = 65536
    max_registers: int = 255
    register_unit: int = 256
    subpartitions: int = 4
    # Threads: a warp, a warpgroup (the threads of one MMA), a CTA at most; what one SM holds.
    warp_size: int = 32
    warpgroup: int = 128
    max_threads: int = 1024
    max_warps_per_sm: int = 64
    max_ctas_per_sm: int = 32
    # The rows one warpgroup's MMA instruction computes, and the widths of the operands it
    # reads from shared memory (16-bit and 8-bit floats).
    mma_rows: int = 64
    mma_operand_bits: tuple[int, ...] = (8, 16)
    # The tensor-core instruction: "wgmma" (a warpgroup's registers hold the accumulator) or
    # "tcgen05" (one thread issues an ``mma_rows`` x N product into tensor memory, of
    # ``tmem_columns`` 32-bit columns per CTA, read back with tcgen05.ld).
    mma: str = "wgmma"
    tmem_columns: int = 0
    tma: bool = True  # tensor memory accelerator copies (and their multicast over a cluster)
    # The dialect of the IR its kernels are lowered through before codegen ("hopper": TMA,
    # mbarriers, wgmma; "blackwell": the same plus tensor memory and tcgen05, docs/blackwell.md).
    dialect: str = "hopper"
    cluster_sizes: tuple[int, ...] = (1, 2, 4)  # CTAs a cluster may have (portable, dividing the SMs' pairs)
    # Tile ops that have a decomposition (``ElementwiseOp.decompose``, a ``mean``) but that this
    # target's codegen renders directly, so the ``decompose`` pass leaves them (none on sm_90a).
    native_ops: tuple[str, ...] = ()
    # The compute capability its code runs on ("a" targets: that one exactly).
    capability: tuple[int, int] = (9, 0)

    def smem_per_program(self, ctas_per_sm: int = 1) -> int:
        """Dynamic shared memory a program may take so that ``ctas_per_sm`` fit on one SM."""
        if ctas_per_sm <= 1:
            return self.max_smem_bytes
        return min(self.max_smem_bytes, self.sm_smem_bytes // ctas_per_sm - self.smem_reserved_per_block)

    def programs_by_smem(self, smem_bytes: int) -> int:
        """Programs taking ``smem_bytes`` of shared memory (dynamic and static) one SM holds at
        once: the inverse of :meth:`smem_per_program`."""
        return self.sm_smem_bytes // (smem_bytes + self.smem_reserved_per_block)


# The PTX version per target: the minimum (PTX-FACTS §0: sm_90a needs 8.0, sm_100a 8.6), but
# 8.1 on sm_90a, where cluster reductions store with st.async (PTX ISA 8.1).
TARGETS: dict[str, Target] = {
    "sm_90a": Target("sm_90a", "sm_90a", "+ptx81", "8.1", "sm_90a", capability=(9, 0),
                     forbidden_intrinsics=("llvm.nvvm.tcgen05.",)),
    "sm_100a": Target("sm_100a", "sm_100a", "+ptx86", "8.6", "sm_100a", capability=(10, 0),
                      forbidden_intrinsics=("llvm.nvvm.wgmma.",), dialect="blackwell",
                      mma="tcgen05", mma_rows=128, tmem_columns=512, native_ops=("tile.dot_scaled",),
                      # 1 KB is static: the tensor-memory address slot, padded to the dynamic
                      # array's 1024-B alignment (tkc/codegen/lower_blackwell.py).
                      max_smem_bytes=232448 - 1024),
}

#: The target of a compilation that names none: Hopper.
DEFAULT_TARGET = TARGETS["sm_90a"]


def target(name: str | Target) -> Target:
    """The target called ``name``; a TkcUsageError listing the valid names otherwise."""
    if isinstance(name, Target):
        return name
    found = TARGETS.get(name) if isinstance(name, str) else None
    if found is None:
        raise TkcUsageError(f"unknown target {name!r}; valid targets: {', '.join(TARGETS)}")
    return found
