"""The compiler driver: one kernel from source to PTX and cubin, through the disk cache.

Owns: the stages, declared in order as data (``_STAGES``: frontend → tile pipeline →
``HOPPER_PIPELINE`` → codegen → NVPTX → ptxas) with the names of their texts
(``Compiled.asm`` keys, :data:`STAGES`), the :class:`Compiled` record (a plain result:
what the runtime keeps between launches lives in ``tkc.runtime.launch``) and its cache
entry, the cache key (compiler version, source, constants, target, options), building the
kernel's :class:`tkc.pins.Options` once (from its ``consts``) and handing them with the
:class:`tkc.target.Target` to the passes and codegen, and IR dumps:
they are captured while the passes run, stored in the cache entry and replayed on a cache
hit, so ``TKC_DUMP_IR`` shows the same thing whether or not the kernel was compiled this
time.

Must not: hold pass or codegen logic (``tkc.passes``, ``tkc.codegen``), read
``os.environ`` (knobs come through ``tkc.options``), or touch the GPU
(``tkc.runtime.launch`` launches a :class:`Compiled`).  The Hopper passes and codegen are
imported when a stage needs them, so tile-IR work never loads llvmlite.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import hashlib
import io
import json
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from tkc import options as tkc_options
from tkc.errors import TkcRemark, TkcUnsupportedError, TkcUsageError, kernel_choice_error, remarks
from tkc.ir.core import Module, Operation
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.passes.manager import PassManager, PassOptions
from tkc.passes.pipeline import after, level
from tkc.pins import PINS, Options
from tkc.signature import Param, kernel_params
from tkc.target import DEFAULT_TARGET, Target, target as lookup_target

__all__ = ["STAGES", "Compiled", "RankAbi", "compile_kernel", "compiler_version"]

#: The dialects tkc lowers to and emits code from; a target of another stops at tile IR.
_LOWERED_DIALECTS = ("hopper", "blackwell")
_ENTRY = "compiled.json"
_CUBIN = "kernel.cubin"


class RankAbi(NamedTuple):
    """A multi-GPU kernel's launch contract (docs/hopper.md §4): ``tensors``, the indices of
    its ``@ ranks`` tensor parameters (one ``peers`` array each); ``barrier``, how many roles of
    a program meet at each of its barriers (0: it takes no barrier pads; kernels share a pad
    only with kernels of the same count, whose counters then stay multiples of it); ``maps``,
    the ``tma_maps`` entries passed as arrays of per-rank maps; ``waits``, whether a program
    may wait for another (the grid must then be resident)."""

    tensors: tuple[int, ...]
    barrier: int
    maps: tuple[int, ...]
    waits: bool


@dataclass
class Compiled:
    """One compiled kernel: every stage's text and what a launch needs.

    ``asm`` maps stage names (:data:`STAGES`) to text (bytes for ``cubin``); only the stages
    that ran are present.  ``threads``, ``smem_bytes`` and ``tma_maps`` are the hopper
    kernel's attributes (docs/hopper.md §4; None / [] before the hopper stage), ``resources``
    is ptxas's report for the kernel when ptxas ran.
    """

    name: str
    target: str
    asm: dict[str, Any]
    resources: Any = None  # tkc.codegen.ptxas.ResourceUsage
    ptxas_warnings: tuple[str, ...] = ()
    remarks: tuple[str, ...] = ()  # the passes' notes on what they left undone and why (tkc.errors.TkcRemark)
    cache_key: str | None = None
    cache_hit: bool = False
    _dumps: dict[str, Any] = field(default_factory=dict, repr=False)
    _kernel_op: Operation | None = field(default=None, repr=False)

    @property
    def kernel_op(self) -> Operation:
        """The ``tile.kernel`` op of the last IR stage (parsed from its text, once)."""
        if self._kernel_op is None:
            stage = "hopper" if "hopper" in self.asm else "tkir"
            self._kernel_op = parse_module(self.asm[stage], f"<{self.name}.{stage}>").kernel(self.name)
        return self._kernel_op

    @property
    def threads(self) -> int | None:
        return self.kernel_op.attributes.get("threads")

    @property
    def smem_bytes(self) -> int | None:
        return self.kernel_op.attributes.get("smem_bytes")

    @property
    def programs_per_sm(self) -> int | None:
        """CTAs of this kernel one SM holds at once, from ptxas's registers and the shared
        memory (None when ptxas did not run)."""
        if self.resources is None or self.threads is None:
            return None
        from tkc.codegen.occupancy import resident

        smem = (self.smem_bytes or 0) + self.resources.smem
        return resident(self.resources.registers, self.threads, smem, lookup_target(self.target))

    @property
    def tma_maps(self) -> list:
        return list(self.kernel_op.attributes.get("tma_maps") or [])

    @property
    def ranks(self) -> RankAbi | None:
        """What a multi-GPU launch passes beyond the parameters (docs/hopper.md §4, item 2),
        None for a kernel of one GPU."""
        from tkc.ir.dialects.hopper import barrier_roles
        from tkc.ir.dialects.tile import has_rank_barrier, ranked_params, uses_ranks

        op = self.kernel_op
        if not uses_ranks(op):
            return None
        ranked = tuple(ranked_params(op))
        maps = tuple(n for n, (i, _, _) in enumerate(self.tma_maps) if i in ranked)
        return RankAbi(ranked, barrier_roles(op) if has_rank_barrier(op) else 0, maps,
                       any(o.name in ("tile.wait", "tile.rank_barrier") for o in op.walk()))

    @property
    def params(self) -> list[Param]:
        """The kernel's parameters as ``tkc.signature`` sees them (name, IR type)."""
        return kernel_params(self.kernel_op)

    @classmethod
    def from_asm(cls, asm: Mapping[str, Any], target: str = DEFAULT_TARGET.name, name: str | None = None,
                 resources: Any = None) -> Compiled:
        """A Compiled from stage texts alone, e.g. files written by ``tkc compile``: the
        ``hopper`` text (the kernel's attributes and parameters) and a ``cubin`` or ``ptx``."""
        if "hopper" not in asm:
            raise TkcUsageError("a launchable kernel needs its hopper IR (tkc compile --emit hopper), "
                                "which carries threads, smem_bytes and tma_maps")
        module = parse_module(asm["hopper"], "<hopper>")
        op = module.kernel(name)
        return cls(op.attributes["sym_name"], target, dict(asm), resources, _kernel_op=op)

    # ------------------------------------------------------------ cache entry
    def _entry(self) -> bytes:
        texts = {k: v for k, v in self.asm.items() if k != "cubin"}
        res = dataclasses.asdict(self.resources) if self.resources is not None else None
        return json.dumps({"name": self.name, "target": self.target, "asm": texts, "cubin": "cubin" in self.asm,
                           "resources": res, "ptxas_warnings": list(self.ptxas_warnings), "remarks": list(self.remarks),
                           "dumps": self._dumps}).encode()

    @classmethod
    def _from_entry(cls, data: bytes, cubin: bytes | None, key: str) -> Compiled | None:
        try:
            return cls._parse_entry(data, cubin, key)
        except (ValueError, KeyError, TypeError):
            return None  # an entry this version cannot read (not JSON, other fields): a miss

    @classmethod
    def _parse_entry(cls, data: bytes, cubin: bytes | None, key: str) -> Compiled | None:
        from tkc.codegen.ptxas import ResourceUsage

        d = json.loads(data)
        asm = dict(d["asm"])
        if d["cubin"]:
            if cubin is None:
                return None  # half an entry (the cubin was lost): a miss
            asm["cubin"] = cubin
        res = d["resources"]
        if res is not None:
            res = ResourceUsage(**{**res, "lines": tuple(res["lines"])})
        return cls(d["name"], d["target"], asm, res, tuple(d["ptxas_warnings"]), tuple(d["remarks"]), key,
                   True, d["dumps"])


def forget_kept() -> None:
    """Drop what this process keeps between compilations (the parser's trees of the texts it
    read last, ptxas's results for the PTX it assembled last), so that the next compilation of
    a text runs every stage as its first did: what a cold-compile time measures.  The disk
    cache (``TKC_CACHE_DIR``) is not touched."""
    from tkc.codegen import ptxas
    from tkc.frontend import parser

    with parser._LOCK:
        parser._TREES.clear()
    with ptxas._ASSEMBLED_LOCK:
        ptxas._ASSEMBLED.clear()


# ------------------------------------------------------------------ version
@functools.lru_cache(maxsize=1)
def compiler_version() -> str:
    """tkc's version plus a hash of its own source files and llvmlite's version: editing the
    compiler invalidates cached kernels even when ``__version__`` stays the same."""
    import llvmlite

    import tkc

    root = Path(tkc.__file__).parent
    h = hashlib.sha256()
    for p in sorted([*root.rglob("*.py"), *root.rglob("*.lark")]):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return f"{tkc.__version__}+{h.hexdigest()[:16]}+llvmlite-{llvmlite.__version__}"


@functools.lru_cache(maxsize=8)
def _ptxas_identity(path: str, mtime: float) -> str:
    from tkc.codegen.ptxas import ptxas_version

    return f"{path} {ptxas_version(Path(path))}"


# ------------------------------------------------------------------- dumps
@dataclass
class _Dumps:
    """What the pass managers printed (IR dumps, timing) and the dump files they wrote, in
    order, so they can be shown again on a cache hit."""

    stream: str = ""
    files: list[tuple[str, str]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"stream": self.stream, "files": self.files}


def _replay(stream: str, files: list[tuple[str, str]] | list[list[str]], opts: PassOptions) -> None:
    if stream:
        out = opts.stream or sys.stderr
        out.write(stream)
        out.flush()
    if files and opts.dump_dir is not None:
        try:
            opts.dump_dir.mkdir(parents=True, exist_ok=True)
            for name, text in files:
                (opts.dump_dir / name).write_text(text)
        except OSError as e:
            raise TkcUsageError(f"cannot write IR dumps to {opts.dump_dir}: {e.strerror}") from None


def _run_passes(module: Module, pipeline: str, opts: PassOptions, dumps: _Dumps, options: Options,
                target: Target) -> None:
    """Run ``pipeline`` with ``options`` for ``target``, its dumps captured into ``dumps`` and
    shown right away (also when a pass fails).  Dump files of a later pipeline continue the
    numbering."""
    buf = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="tkc-dumps-") as tmp:
        run_opts = dataclasses.replace(opts, stream=buf, dump_dir=Path(tmp) if opts.dump_dir else None)
        try:
            PassManager(pipeline, run_opts).run(module, options, target)
        finally:
            new: list[tuple[str, str]] = []
            for p in sorted(Path(tmp).iterdir()):
                if dumps.files and p.name.startswith("00-"):
                    continue  # the previous pipeline's last dump is this one's input
                n = len(dumps.files) + len(new)
                new.append((f"{n:02d}-{p.name.split('-', 1)[1]}" if dumps.files else p.name, p.read_text()))
            dumps.stream += buf.getvalue()
            dumps.files += new
            _replay(buf.getvalue(), new, opts)


# ------------------------------------------------------------------ driver
def _source_text(source: str | Path | Module | Operation) -> str:
    if isinstance(source, Path):
        try:
            return source.read_text(encoding="utf-8")
        except OSError as e:
            raise TkcUsageError(f"cannot read {source}: {e.strerror}") from None
    if isinstance(source, str):
        return source
    if isinstance(source, Module):
        return print_module(source)
    if isinstance(source, Operation) and source.name == "tile.kernel":
        from tkc.ir.printer import print_op

        return print_op(source) + "\n"
    raise TkcUsageError(f"compile_kernel takes kernel source, a Path, a Module or a tile.kernel op, "
                        f"got {type(source).__name__}")


def _frontend(source: str | Path | Module | Operation, text: str, consts: Mapping[str, Any], file: str,
              first_line: int, python_function: bool, kernel: str | None = None) -> Module:
    if isinstance(source, (Module, Operation)):
        if consts:
            raise TkcUsageError("constants are fixed once a kernel is tile IR; pass them to the frontend")
        return parse_module(text, file)  # a copy: the passes must not edit the caller's module
    from tkc.frontend import compile_source

    return compile_source(text, file, dict(consts), first_line=first_line, python_function=python_function,
                          kernel=kernel)


def _one_kernel(module: Module, name: str | None, file: str) -> Operation:
    kernels = [op for op in module.ops if op.name == "tile.kernel"]
    chosen = [k for k in kernels if name is None or k.attributes.get("sym_name") == name]
    if len(chosen) != 1:
        raise kernel_choice_error(file, name, [str(k.attributes.get("sym_name")) for k in kernels])
    for k in kernels:
        if k is not chosen[0]:
            k.erase()  # the passes and codegen see only the kernel being compiled
    return chosen[0]


# ------------------------------------------------------------------ stages
@dataclass
class _Build:
    """One kernel on its way through the stages: what every stage reads (the request) and
    what the stages before it made (the module, edited in place by the passes; the texts)."""

    module: Module
    name: str
    target: Target
    options: Options
    pipeline: str
    hopper_pipeline: str
    opt_level: int
    ptxas: Path | None  # the ptxas to run, or None: no cubin, no occupancy choice
    opts: PassOptions
    dumps: _Dumps
    asm: dict[str, Any] = field(default_factory=dict)
    assembled: Any = None  # ptxas's result for asm["ptx"] (tkc.codegen.ptxas.Assembled), once it ran


def _tile_ir(b: _Build) -> str:
    """The tile pipeline (``DEFAULT_PIPELINE`` unless replaced) on the frontend's module."""
    _run_passes(b.module, b.pipeline, b.opts, b.dumps, b.options, b.target)
    return print_module(b.module, locs=b.opts.locs)


def _hopper_ir(b: _Build) -> str:
    """``HOPPER_PIPELINE`` (unless replaced): tile IR to hopper IR."""
    _run_passes(b.module, b.hopper_pipeline, b.opts, b.dumps, b.options, b.target)
    return print_module(b.module, locs=b.opts.locs)


def _llvm_ir(b: _Build) -> str:
    """Codegen: the hopper kernel as LLVM IR (llvmlite)."""
    from tkc.codegen.lower import kernel_to_llvm

    return str(kernel_to_llvm(b.module.kernel(b.name), b.target, b.options))


def _ptx(b: _Build) -> str:
    """LLVM's NVPTX backend.  For a kernel whose programs an SM no pass budgets for
    (:func:`tkc.codegen.occupancy.applies`) and whose grid is not one program an SM, ptxas
    then says how many fit without spilling; the PTX, and the LLVM IR beside it, ask for that
    many (``.minnctapersm``)."""
    from tkc.codegen import occupancy
    from tkc.codegen.ptxas import assemble
    from tkc.codegen.target import emit_ptx

    ptx = emit_ptx(b.asm["llvm"], b.target, opt=b.opt_level)  # the text: printed once
    op = b.module.kernel(b.name)
    if b.ptxas is None or not occupancy.applies(op, b.options) or occupancy.one_program_an_sm(op):
        return ptx
    threads, smem = op.attributes["threads"], op.attributes.get("smem_bytes") or 0
    ctas, ptx, b.assembled = occupancy.most_programs(ptx, b.name, threads, smem, b.target,
                                                     lambda text: assemble(text, b.target))
    if ctas is not None:
        b.asm["llvm"] = occupancy.with_min_ctas(b.asm["llvm"], ctas, "llvm")
    return ptx


def _cubin(b: _Build) -> bytes | None:
    """ptxas on the PTX (its result from the ptx stage when that ran it); None without ptxas."""
    if b.ptxas is None:
        return None
    if b.assembled is None:
        from tkc.codegen.ptxas import assemble

        b.assembled = assemble(b.asm["ptx"], b.target)
    return b.assembled.cubin


#: The driver, as data: each stage in order, with the ``Compiled.asm`` text it adds.  A
#: compilation runs the stages up to the one asked for; a stage that returns None adds nothing
#: (no ptxas, no cubin).
_STAGES: tuple[tuple[str, Callable[[_Build], Any]], ...] = (
    ("tkir", _tile_ir),      # frontend's tile IR -> tile pipeline
    ("hopper", _hopper_ir),  # -> HOPPER_PIPELINE -> hopper IR
    ("llvm", _llvm_ir),      # -> codegen -> LLVM IR
    ("ptx", _ptx),           # -> NVPTX -> PTX (and ptxas's choice of programs an SM)
    ("cubin", _cubin),       # -> ptxas -> cubin
)
#: Every stage's output, in pipeline order: tile IR after the tile pipeline, hopper IR
#: after HOPPER_PIPELINE, LLVM IR, PTX text, and the cubin (bytes) from ptxas.
STAGES = tuple(name for name, _ in _STAGES)


def _collector_paused(fn: Callable[..., Compiled]) -> Callable[..., Compiled]:
    """``fn`` with Python's cyclic garbage collector off while it runs (and back as it was).

    A compilation makes a few hundred thousand IR and llvmlite objects, many of them in cycles
    (an op and its block), which start collections of every object the process holds (torch's
    too) on the way: 15-20% of the time every example took to compile up to ptxas.  What the
    compilation leaves is collected after it, once."""

    @functools.wraps(fn)
    def paused(*args: Any, **kwargs: Any) -> Compiled:
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()

    return paused


@_collector_paused
def compile_kernel(source: str | Path | Module | Operation, consts: Mapping[str, Any] | None = None, *,
                   target: str | Target = DEFAULT_TARGET, pipeline: str | None = None,
                   hopper_pipeline: str | None = None, kernel: str | None = None, stop: str = "cubin",
                   ptxas: bool | None = None,
                   opt_level: int = 3, pass_options: PassOptions | None = None, cache: bool = True,
                   cache_dir: str | Path | None = None, file: str | None = None, first_line: int = 1,
                   python_function: bool = False) -> Compiled:
    """Compile one kernel through every stage up to ``stop`` (one of :data:`STAGES`).

    ``source``: ``.tk`` source text, a ``Path`` to a ``.tk`` file (or a one-line string naming
    one), or tile IR (a Module or a ``tile.kernel`` op, copied, never edited).  ``consts`` specialize the source;
    ``kernel`` picks one of several kernels.  ``pipeline`` replaces the tile pipeline
    (``DEFAULT_PIPELINE``) and ``hopper_pipeline`` ``HOPPER_PIPELINE`` (``""`` for input
    that is already hopper IR).  ``ptxas``: True runs it (an error when there is none),
    False never, None when one is found; it runs when ``stop`` is ``"cubin"`` or ``"ptx"`` (where
    it decides, for a kernel without products, how many programs an SM the PTX asks for).
    ``pass_options`` control dumps and timing (default: the ``TKC_DUMP_*`` knobs).
    ``cache`` reads and writes the disk cache (``TKC_CACHE_DIR``, or ``cache_dir``); pass
    timing always compiles afresh, since a cache hit times nothing.
    """
    from tkc.codegen.target import target as lookup_target
    from tkc.passes.pipeline import DEFAULT_PIPELINE, backend_pipeline

    if stop not in STAGES:
        raise TkcUsageError(f"unknown stage {stop!r}; stages: {', '.join(STAGES)}")
    past_tkir = STAGES.index(stop) > 0
    tgt_value = lookup_target(target)
    tgt = tgt_value.name
    if past_tkir and tgt_value.dialect not in _LOWERED_DIALECTS:
        dialect = tgt_value.dialect
        raise TkcUsageError(f"target {tgt}: tkc has no {dialect.capitalize()} lowering yet (lower-to-{dialect} "
                            f"and its codegen); only --emit tkir works for {tgt}")
    consts = dict(consts or {})
    if isinstance(source, str) and "\n" not in source and source.strip().endswith(".tk"):
        source = Path(source.strip())  # a file's name, not source text (which has lines)
    file = file or (str(source) if isinstance(source, Path) else "<string>")
    opts = pass_options if pass_options is not None else PassOptions().with_knobs(tkc_options.knobs())
    pipeline_request, hopper_request = pipeline, hopper_pipeline
    pipeline = DEFAULT_PIPELINE if pipeline is None else pipeline
    if past_tkir and hopper_pipeline is None:
        hopper_pipeline = backend_pipeline(tgt_value)
    # ptxas runs for a cubin, and for PTX when one is found (not refused): a kernel without
    # products gets its programs an SM from what ptxas makes of it (tkc.codegen.occupancy).
    ptxas_path = _resolve_ptxas(ptxas) if stop == "cubin" or (stop == "ptx" and ptxas is not False) else None
    text = _source_text(source)

    key = None
    if cache and not opts.timing:
        from tkc.runtime import cache as disk

        # The pins with their declared defaults (checked once the frontend has the kernel's
        # location for an error) and every fact of the target.
        requested = {**dataclasses.asdict(Options()), **{n: v for n, v in consts.items() if n in PINS}}
        key = disk.key(compiler_version(), text, consts, tgt, {
            "options": requested, "target": dataclasses.asdict(tgt_value),
            "pipeline": pipeline, "hopper_pipeline": hopper_pipeline, "kernel": kernel, "stop": stop,
            "opt_level": opt_level, "ptxas": _ptxas_identity(str(ptxas_path), ptxas_path.stat().st_mtime)
            if ptxas_path else None, "file": file, "first_line": first_line, "python_function": python_function,
            # what is dumped (not where): a different request compiles again and records its dumps
            "dumps": [list(opts.dump_before), list(opts.dump_after), opts.dump_dir is not None, opts.locs]})
        entry = disk.get(key, _ENTRY, cache_dir)
        if entry is not None:
            hit = Compiled._from_entry(entry, disk.get(key, _CUBIN, cache_dir), key)
            if hit is not None:
                _replay(hit._dumps.get("stream", ""), hit._dumps.get("files", []), opts)
                return hit

    module = _frontend(source, text, consts, file, first_line, python_function, kernel)
    chosen = _one_kernel(module, kernel, file)
    name = chosen.attributes["sym_name"]
    at = level(chosen)
    lowered = at == "lowered"  # IR a backend pass left (a .hopper.tkir dump): its warps are set
    if pipeline_request is None and hopper_request is None and at != "tile":
        # a dump goes on where it was made: lowered IR to codegen, a select-layouts dump through
        # the backend passes after that one
        pipeline, hopper_pipeline = "", "" if lowered else after(hopper_pipeline or "", "select-layouts")
    # Tile IR is the same for every target: its pins are checked against one only past it.
    options = Options.from_consts(chosen.attributes.get("consts"), chosen.loc, None if stop == "tkir" else tgt_value)
    b = _Build(module, name, tgt_value, options, pipeline, hopper_pipeline or "", opt_level, ptxas_path, opts,
               _Dumps())
    with remarks() as notes:
        for stage, run in _STAGES[: STAGES.index(stop) + 1]:
            out = run(b)
            if out is not None:
                b.asm[stage] = out
    result = Compiled(name, tgt, b.asm, remarks=tuple(str(n) for n in notes), cache_key=key,
                      _dumps=b.dumps.as_json(), _kernel_op=module.kernel(name))  # the op a pass left
    if b.assembled is not None:
        result.resources = b.assembled.kernels.get(name)
        result.ptxas_warnings = tuple(b.assembled.warnings)
        shown = opts.timing or opts.dump_before or opts.dump_after or opts.dump_dir  # of this compilation
        if hopper_request is None and not lowered and not shown and result.resources is not None \
                and result.resources.spills:

            def pinned(pin: str, value: int) -> Compiled:
                again = _frontend(source, text, consts, file, first_line, python_function, kernel)
                op = _one_kernel(again, kernel, file)
                op.attributes["consts"] = {**(op.attributes.get("consts") or {}), pin: value}
                return compile_kernel(again, target=target, pipeline=pipeline, stop=stop, ptxas=ptxas,
                                      opt_level=opt_level, pass_options=opts, cache=False, file=file)

            wider = _on_more_warps(b, result, chosen.loc, pinned) or _on_more_consumers(b, result, chosen.loc, pinned)
            if wider is not None:
                wider.cache_key = key
                result = wider

    if key is not None:
        from tkc.runtime import cache as disk

        # The cubin first: the JSON entry is what marks the whole entry as present.
        if "cubin" not in result.asm or disk.put(key, _CUBIN, result.asm["cubin"], cache_dir):
            disk.put(key, _ENTRY, result._entry(), cache_dir)
    return result


#: The warps a kernel without products is compiled on again when ptxas spills its registers on
#: the default four (``_on_more_warps``), in order.
MORE_WARPS = (8, 16)


def _on_more_warps(b: _Build, first: Compiled, loc: Any,
                   compile_on: Callable[[str, int], Compiled]) -> Compiled | None:
    """A kernel without products runs one warpgroup unless the pin ``warps`` says otherwise; its
    tiles then spread over 128 threads, and one of 128 x 256 f32 values (256 a thread) spills
    however ptxas packs it.  Where ptxas spills such a kernel on the default warps, it is
    compiled again on :data:`MORE_WARPS` (:func:`_least_spills`; None: the kernel's warps are
    not the pass's to choose: products, TMA copies or warp roles set them)."""
    from tkc.codegen import occupancy

    kernel = b.module.kernel(b.name)
    # A tcgen05 product's rows set the warps as a wgmma's do (the frontend refuses the pin
    # beside either); blackwell.mma is not among occupancy's budgeted ops, so it is named here:
    # a product whose operands the threads load (no TMA copy, no roles) would be retried.
    if b.options.warps is not None or not occupancy.applies(kernel, b.options) \
            or any(op.name == "blackwell.mma" for op in kernel.walk()):
        return None
    counts = [w for w in MORE_WARPS if w * b.target.warp_size <= b.target.max_threads]
    return _least_spills(first, counts, lambda w: compile_on("warps", w), lambda w, still: (
        f"kernel '{b.name}' spills {first.resources.spill_stores} B of registers on 4 warps (its tiles' values "
        f"spread over 128 threads); compiled on {w} warps instead{still} (-D warps=N chooses)"), loc)


def _on_more_consumers(b: _Build, first: Compiled, loc: Any,
                       compile_on: Callable[[str, int], Compiled]) -> Compiled | None:
    """On a tcgen05 target a product's accumulator is read by as few epilogue warpgroups as its
    columns need (select-layouts: 128 columns a thread), so an epilogue that keeps more beside
    it (a column softmax, an f32 bias row, a second tile) can spill where two warpgroups would
    not.  Where ptxas spills such a kernel, it is compiled again on more epilogue warpgroups
    than it has, up to 4 (the pin ``consumers``; counts its widths do not split into are
    skipped), as :func:`_least_spills` keeps, where that spills at most half as much (None:
    not a tcgen05 kernel with 128-row accumulators, or ``consumers`` pinned)."""
    from tkc.ir.layouts import TmemAccumulator

    kernel = b.module.kernel(b.name)
    if b.target.mma != "tcgen05" or b.options.consumers is not None:
        return None
    read_by = [op.result.type.layout.warpgroups for op in kernel.walk() if op.name == "blackwell.tmem_load"
               and isinstance(op.result.type.layout, TmemAccumulator)]
    if not read_by:
        return None  # (64-row products: one warpgroup reads them, whatever the pin says)

    def on(count: int) -> Compiled | None:
        try:
            return compile_on("consumers", count)
        except (TkcUnsupportedError, TkcUsageError):
            return None  # a count the products' widths do not split into, or the registers do not fit

    best = _least_spills(first, [n for n in (2, 3, 4) if n > max(read_by)], on, lambda n, still: (
        f"kernel '{b.name}' spills {first.resources.spill_stores} B of registers beside its products' "
        f"accumulators; read on {n} epilogue warpgroups instead{still} (-D consumers=N chooses)"), loc)
    # More warpgroups also leave each thread fewer registers (65536 over the CTA): a build that
    # still spills more than half as much is no clear gain (gemm_fp8_scaled's per-row scales:
    # 164 B on two, 160 B on four).
    if best is not None and 2 * _spilled(best) > _spilled(first):
        return None
    return best


def _least_spills(first: Compiled, values: Sequence[int], compile_on: Callable[[int], Compiled | None],
                  why: Callable[[int, str], str], loc: Any) -> Compiled | None:
    """``first`` (which spills) compiled again on each of ``values`` in turn until one does not
    spill: the one that spills least, with a remark saying so, where it spills less than
    ``first`` (None: none did)."""
    best, best_value = first, None
    for value in values:
        again = compile_on(value)
        if again is not None and again.resources is not None and _spilled(again) < _spilled(best):
            best, best_value = again, value
            if not _spilled(again):
                break
    if best is first:
        return None
    still = f", where it spills {best.resources.spill_stores} B" if _spilled(best) else ", where it does not"
    best.remarks = (*best.remarks, str(TkcRemark(why(best_value, still), loc)))
    return best


def _spilled(c: Compiled) -> int:
    """The bytes ptxas spills and reloads in ``c``."""
    return c.resources.spill_stores + c.resources.spill_loads


def _resolve_ptxas(wanted: bool | None) -> Path | None:
    if wanted is False:
        return None
    from tkc.codegen.ptxas import find_ptxas, require_ptxas

    return require_ptxas() if wanted else find_ptxas()
