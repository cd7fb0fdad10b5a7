"""GPU targets, and LLVM IR → PTX through llvmlite's NVPTX backend.

Owns: the table of targets tkc can emit for (``TARGETS``), the one LLVM
target-machine recipe (PTX-FACTS §8 "Target machine recipe"), and the
translation of LLVM's parse/verify failures into tkc errors.

Must not: build IR (that is ``tkc.codegen.nvvm`` and the lowering), run ptxas
(``tkc.codegen.ptxas``), or choose anything about a kernel.  A bad
cpu/feature combination, or a wgmma/tcgen05 intrinsic on the wrong cpu, is an
LLVM *fatal* error that kills the Python process (PTX-FACTS §8), so every name
is checked against ``TARGETS`` and every module against its target's
forbidden intrinsics before LLVM sees them.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import llvmlite.binding as llvm
import llvmlite.ir as ir

from tkc.errors import TkcCodegenError, TkcUsageError

TRIPLE = "nvptx64-nvidia-cuda"
# What LLVM 22's NVPTX target machine reports for nvptx64 (the same for every
# sm_*); tests check it against the target machine.
DATA_LAYOUT = "e-p6:32:32-i64:64-i128:128-i256:256-v16:16-v32:32-n16:32:64"


@dataclass(frozen=True)
class Target:
    """One GPU target: what LLVM needs to emit PTX and what ptxas needs to assemble it."""

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
    "sm_90a": Target("sm_90a", "sm_90a", "+ptx81", "8.1", "sm_90a",
                     forbidden_intrinsics=("llvm.nvvm.tcgen05.",)),
    "sm_100a": Target("sm_100a", "sm_100a", "+ptx86", "8.6", "sm_100a",
                      forbidden_intrinsics=("llvm.nvvm.wgmma.",)),
}


def target(name: str | Target) -> Target:
    """The target called ``name``; a TkcUsageError listing the valid names otherwise."""
    if isinstance(name, Target):
        return name
    found = TARGETS.get(name) if isinstance(name, str) else None
    if found is None:
        raise TkcUsageError(f"unknown target {name!r}; valid targets: {', '.join(TARGETS)}")
    return found


_init_lock = threading.Lock()
_initialized = False
_machines: dict[tuple[str, int], llvm.TargetMachine] = {}


def _machine(t: Target, opt: int) -> llvm.TargetMachine:
    global _initialized
    with _init_lock:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True
        key = (t.name, opt)
        if key not in _machines:
            # Only ever called with a Target from TARGETS (validated cpu/feature pair).
            _machines[key] = llvm.Target.from_triple(t.triple).create_target_machine(
                cpu=t.cpu, features=t.ptx_feature, opt=opt)
        return _machines[key]


def emit_ptx(llvm_ir: str | ir.Module, tgt: str | Target = "sm_90a", opt: int = 3) -> str:
    """PTX text for an LLVM module (text or ``llvmlite.ir.Module``).

    Runs LLVM's default optimisation pipeline at level ``opt`` (0..3), then
    the NVPTX code generator.  LLVM parse or verify failures become a
    TkcCodegenError quoting the offending IR line.
    """
    t = target(tgt)
    if opt not in (0, 1, 2, 3):
        raise TkcUsageError(f"opt level {opt!r}: expected 0, 1, 2 or 3")
    text = str(llvm_ir)
    for prefix in t.forbidden_intrinsics:
        m = re.search(rf'@"?({re.escape(prefix)}[\w.]*)', text)  # llvmlite quotes names
        if m:
            raise TkcCodegenError(f"{m.group(1)} cannot be lowered for {t.name}; "
                                  f"it needs a different target")
    try:
        mod = llvm.parse_assembly(text)
    except RuntimeError as e:
        raise TkcCodegenError(_parse_error(str(e), text)) from None
    try:
        mod.verify()
    except RuntimeError as e:
        raise TkcCodegenError(f"LLVM IR does not verify: {str(e).strip()}") from None
    mod.triple = t.triple
    mod.data_layout = t.data_layout
    tm = _machine(t, opt)
    if opt > 0:
        pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=opt))
        pb.getModulePassManager().run(mod, pb)
    return tm.emit_assembly(mod)


_LOC = re.compile(r"<string>:(\d+):(\d+): error: (.*)")


def _parse_error(message: str, text: str) -> str:
    """'LLVM IR parse error at line L:C: reason' plus the IR line and a caret."""
    m = _LOC.search(message)
    if not m:
        return f"LLVM IR does not parse: {message.strip()}"
    line, col, reason = int(m.group(1)), int(m.group(2)), m.group(3)
    lines = text.splitlines()
    src = lines[line - 1] if 1 <= line <= len(lines) else ""
    caret = " " * max(col - 1, 0) + "^"
    return f"LLVM IR parse error at line {line}:{col}: {reason}\n{src}\n{caret}"
