"""LLVM IR → PTX through llvmlite's NVPTX backend, for a :class:`tkc.target.Target`.

Owns: the one LLVM target-machine recipe (PTX-FACTS §8 "Target machine recipe"), the later
PTX ISA a module's inline PTX may need, and the translation of LLVM's parse/verify failures
into tkc errors.  The targets themselves (what
LLVM calls each one, its PTX version, its forbidden intrinsics) are ``tkc.target.TARGETS``.

Must not: build IR (that is ``tkc.codegen.nvvm`` and the lowering), run ptxas
(``tkc.codegen.ptxas``), or choose anything about a kernel.  A bad
cpu/feature combination, or a wgmma/tcgen05 intrinsic on the wrong cpu, is an
LLVM *fatal* error that kills the Python process (PTX-FACTS §8), so every name
is checked against ``TARGETS`` and every module against its target's
forbidden intrinsics before LLVM sees them.
"""

from __future__ import annotations

import dataclasses
import re
import threading

import llvmlite.binding as llvm
import llvmlite.ir as ir

from tkc.errors import TkcCodegenError, TkcUsageError
from tkc.target import DEFAULT_TARGET, Target, target

_init_lock = threading.Lock()
_initialized = False
_machines: dict[tuple[str, str, int], llvm.TargetMachine] = {}

#: Inline PTX that needs a later PTX ISA than a target's own: (text in the module, the version,
#: LLVM's feature for it).  Only a module that uses it gets the later ``.version``.
_LATER_PTX = (("fence.proxy.tensormap::generic", "8.3", "+ptx83"), ("kind::mxf4nvf4", "8.7", "+ptx87"))


def _version_for(t: Target, text: str) -> Target:
    """``t``, or ``t`` with the PTX ISA the inline PTX of ``text`` needs (``_LATER_PTX``)."""
    for piece, version, feature in _LATER_PTX:
        if piece in text and tuple(map(int, version.split("."))) > tuple(map(int, t.ptx_version.split("."))):
            t = dataclasses.replace(t, ptx_feature=feature, ptx_version=version)
    return t


def _machine(t: Target, opt: int) -> llvm.TargetMachine:
    global _initialized
    with _init_lock:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True
        key = (t.name, t.ptx_feature, opt)
        if key not in _machines:
            # Only ever called with a Target from TARGETS (validated cpu/feature pair).
            _machines[key] = llvm.Target.from_triple(t.triple).create_target_machine(
                cpu=t.cpu, features=t.ptx_feature, opt=opt)
        return _machines[key]


def emit_ptx(llvm_ir: str | ir.Module, tgt: str | Target = DEFAULT_TARGET, opt: int = 3) -> str:
    """PTX text for an LLVM module (text or ``llvmlite.ir.Module``).

    Runs LLVM's default optimisation pipeline at level ``opt`` (0..3), then
    the NVPTX code generator.  LLVM parse or verify failures become a
    TkcCodegenError quoting the offending IR line.
    """
    t = target(tgt)
    if opt not in (0, 1, 2, 3):
        raise TkcUsageError(f"opt level {opt!r}: expected 0, 1, 2 or 3")
    text = str(llvm_ir)
    t = _version_for(t, text)
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
