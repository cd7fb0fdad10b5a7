"""Runs a pipeline of named passes over a module, and makes every step visible.

The ``PassManager`` owns what happens *around* passes: looking their names up
in ``pipeline.PASSES``, verifying the IR (the input and the result; after each pass with
``verify_each``, or when anything fails: see below), dumping the IR before
or after any or all of them (to a stream, or as numbered ``.tkir`` files that
``tkc opt`` reads back), timing them, and turning a failing pass into a
``TkcPassError`` with a reproducer file.  A pass that refuses the kernel (what it asks for is
unsupported, too big, or a bad pin) is not a failure: its located error goes to the user as
it is.  Every pass is called as ``pass(module, options, target)``: the kernel's pins
(:class:`tkc.pins.Options`, built from its ``consts`` once, before the first pass, unless the
caller gives them) and the :class:`tkc.target.Target` compiled for.  It holds no pass logic,
and it reads no environment variables: callers merge ``tkc.options.knobs()`` into a
``PassOptions`` (see ``PassOptions.with_knobs``).

A failure is always put on the pass that caused it, with that pass's input as the
reproducer, without verifying or printing the IR between passes on the way (over every
example, the 26 verifications and prints a kernel took were 2.5 s of tkc's 8.7 s of Python
before LLVM): the passes are deterministic, so when one fails, or the result does not verify,
the pipeline is run again from the printed input, verifying after each pass, up to the
failure.  An earlier pass that left invalid IR is then the failing one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TextIO

from tkc.errors import TkcError, TkcPassError, TkcUnsupportedError, TkcUsageError, TkcVerifyError
from tkc.ir.core import Module, Operation
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify
from tkc.options import Knobs
from tkc.passes.pipeline import PASSES, TAKES, PassFn, laid_out_for, level
from tkc.pins import Options
from tkc.target import DEFAULT_TARGET, TARGETS, Target


@dataclass(frozen=True)
class PassOptions:
    """What to show while a pipeline runs.

    ``dump_before`` / ``dump_after`` name passes (or ``"all"``).  Dumps go to
    ``stream`` (stderr when None), or, with ``dump_dir``, to numbered files
    ``00-input.tkir``, ``01-<pass>.tkir``, ... (``NN-before-<pass>.tkir`` for
    dumps before a pass); a ``dump_dir`` with no pass named dumps after every
    pass.  ``timing`` prints a table of wall time per pass to ``stream``.
    ``reproducer_dir`` is where a failing pass leaves its input (None: nowhere).
    ``verify_each`` verifies after every pass as it runs (a failure finds its pass without
    it too, by running the pipeline again; this shows a pass's invalid IR in a dump right
    after it).
    """

    dump_before: tuple[str, ...] = ()
    dump_after: tuple[str, ...] = ()
    dump_dir: Path | None = None
    stream: TextIO | None = None
    timing: bool = False
    locs: bool = True
    reproducer_dir: Path | None = Path("tkc-reproducers")
    verify_each: bool = False

    def with_knobs(self, knobs: Knobs) -> PassOptions:
        """These options plus the environment's ``TKC_DUMP_IR`` (dump after
        those passes) and ``TKC_DUMP_DIR`` (where, unless already set)."""
        after = self.dump_after + tuple(n for n in knobs.dump_ir if n not in self.dump_after)
        return replace(self, dump_after=after, dump_dir=self.dump_dir or knobs.dump_dir)


class PassManager:
    """Runs ``pipeline`` (``"canonicalize,cse,dce"`` or a list of names).

    ``registry`` maps names to passes; by default ``pipeline.PASSES``, looked
    up when the manager is created.  Unknown names raise TkcUsageError.
    """

    def __init__(self, pipeline: str | Sequence[str], options: PassOptions | None = None,
                 registry: Mapping[str, PassFn] | None = None):
        self.registry = dict(PASSES if registry is None else registry)
        self.options = options or PassOptions()
        names = pipeline.split(",") if isinstance(pipeline, str) else list(pipeline)
        self.names = [n.strip() for n in names if n.strip()]
        self._check_names(self.names, "pass")
        self._check_names(self.options.dump_before + self.options.dump_after, "pass to dump", allow_all=True)

    @property
    def pipeline(self) -> str:
        return ",".join(self.names)

    def _check_names(self, names: Sequence[str], what: str, allow_all: bool = False) -> None:
        for n in names:
            if n not in self.registry and not (allow_all and n == "all"):
                known = ", ".join(sorted(self.registry)) or "(none)"
                raise TkcUsageError(f"unknown {what} '{n}'; known passes: {known}")

    # ------------------------------------------------------------------ run
    def run(self, module: Module, options: Options | None = None, target: Target | None = None) -> None:
        """Verify ``module``, then run each pass on it in place with ``options`` (default: the
        pins of the module's kernels) and ``target`` (None: the target-independent passes, given
        the default target, and pins not checked against a target), and verify the result.  A
        failure (a pass that crashes, or IR that does not verify) raises TkcPassError naming the
        pass that caused it, the reason and the reproducer file."""
        opts = self.options
        stream = opts.stream or sys.stderr
        dumper = _Dumper(opts, stream)
        times: list[tuple[str, float]] = []
        t = time.perf_counter()
        verify(module)  # a broken input is not the first pass's fault
        verify_time = time.perf_counter() - t
        _check_target(module, target)
        made_for = laid_out_for(module.ops)  # (a name the verifier found among TARGETS)
        target = target or (TARGETS[made_for] if made_for else DEFAULT_TARGET)
        # what a failure runs the pipeline again from (_Replay), before any pass edits it
        start = _Replay(self, print_module(module), options, target)
        groups = _groups(module, options, target)
        dumper.input(module)

        for index, name in enumerate(self.names, 1):
            if _selected(opts.dump_before, name):
                dumper.dump(module, "Before", name, index)
            _check_level(name, module)
            t = time.perf_counter()
            try:
                for group_options, kernels in groups:
                    _run_on(self.registry[name], module, kernels, group_options, target)
            except (TkcUnsupportedError, TkcUsageError, TkcPassError):
                raise  # the kernel asks for what the pass cannot do: the message says so, at its line
            except TkcError as e:
                raise start.failure(index, _describe(e)) from e
            except Exception as e:  # a crash in a pass still deserves a reproducer
                raise start.failure(index, f"{type(e).__name__}: {e}") from e
            times.append((name, time.perf_counter() - t))
            if opts.verify_each or index == len(self.names):
                t = time.perf_counter()
                try:
                    verify(module)
                except TkcVerifyError as e:
                    raise start.failure(index, "it left invalid IR: " + _describe(e)) from e
                verify_time += time.perf_counter() - t
            if _selected(opts.dump_after, name) or (opts.dump_dir and not opts.dump_before
                                                     and not opts.dump_after):
                dumper.dump(module, "After", name, index)

        if opts.timing:
            _print_timing(times, verify_time, stream)

    def _failure(self, name: str, index: int, reason: str, before_text: str | None,
                 target: Target) -> TkcPassError:
        message = f"pass '{name}' failed: {reason}"
        path = None
        if before_text is not None and self.options.reproducer_dir is not None:
            try:
                path = _write_reproducer(self.options.reproducer_dir, name, index, self.pipeline,
                                         reason, before_text, target)
            except OSError as e:
                message += f"\n  (could not write a reproducer: {e})"
        if path is not None:
            message += f"\n  reproducer: {path}\n  rerun with: {_rerun(path, name, target)}"
        err = TkcPassError(message)
        err.pass_name = name
        err.reproducer = path
        return err


def _groups(module: Module, options: Options | None, target: Target) -> list[tuple[Options, list[Operation] | None]]:
    """Each set of kernels the passes run on with its :class:`Options`: ``options`` for the
    whole module, or the kernels grouped by their own pins."""
    return [(options, None)] if options is not None else _kernel_groups(module, target)


class _Replay:
    """A failure's pass and reproducer, found by running the pipeline again.

    ``text`` is the pipeline's input as printed before the first pass.  A failure at pass
    ``index`` parses it, runs the passes before ``index`` verifying after each (an earlier one
    that leaves invalid IR is the failure then), and keeps the IR that went into the failing
    pass as its reproducer."""

    def __init__(self, manager: PassManager, text: str, options: Options | None, target: Target):
        self.manager, self.text, self.options, self.target = manager, text, options, target

    def failure(self, index: int, reason: str) -> TkcPassError:
        """The error for pass ``index`` (1-based) failing with ``reason`` (a crash, or, for the
        last pass, IR that does not verify), or for an earlier pass whose IR does not verify."""
        names = self.manager.names
        before: str | None = None
        note = ""
        try:
            module = parse_module(self.text, "<pipeline input>")
            groups = _groups(module, self.options, self.target)
            for j, name in enumerate(names[:index], 1):
                before = print_module(module)
                if j == index:
                    break
                for group_options, kernels in groups:
                    _run_on(self.manager.registry[name], module, kernels, group_options, self.target)
                try:
                    verify(module)
                except TkcVerifyError as e:
                    index, reason = j, "it left invalid IR: " + _describe(e)
                    break
        except Exception as e:  # the pipeline did not run the same way again
            before, note = None, f"\n  (could not rebuild the failing pass's input: {type(e).__name__}: {e})"
        return self.manager._failure(names[index - 1], index, reason + note, before, self.target)


#: Each level of :data:`tkc.passes.pipeline.TAKES`: where a pass taking it runs, and a kernel
#: at it, in a refusal's words.
_RUNS = {"tile": "on tile IR whose tiles have no layouts yet", "laid-out": "after select-layouts",
         "lowered": "after lower-to-hopper, on hopper IR"}
_IS = {"tile": "tile IR (the tiles have no layouts yet)", "laid-out": "tile IR with its layouts selected",
       "lowered": "hopper IR already"}


def _check_level(name: str, module: Module) -> None:
    """Refuse, at the kernel's line, a kernel at a level pass ``name`` does not take (a dump
    given to ``tkc opt -p``, a pipeline in the wrong order)."""
    wants = TAKES.get(name)
    for op in module.ops:
        at = level(op) if wants is not None and op.name == "tile.kernel" else wants
        if at == wants:
            continue
        if name == "lower-to-hopper" and at == "lowered":
            raise TkcUsageError(f"{name} runs once: this kernel is hopper IR already", op.loc)
        raise TkcUsageError(f"{name} runs {_RUNS[wants]}: this kernel is {_IS[at]}", op.loc)


def _check_target(module: Module, target: Target | None) -> None:
    """Refuse, at its line, a kernel laid out for another target than the one compiled for:
    its layouts and products are that GPU's (a sm_90a dump compiled with --target sm_100a)."""
    for op in module.ops:
        was = op.attributes.get("target") if op.name == "tile.kernel" else None
        if target is not None and was is not None and was != target.name:
            raise TkcUsageError(f"this kernel was lowered for {was} (its layouts and products are that GPU's), not "
                                f"{target.name}: compile its source or tile IR with --target {target.name}", op.loc)


def _kernel_groups(module: Module, target: Target | None) -> list[tuple[Options, list[Operation] | None]]:
    """The module's kernels grouped by their pins (checked): each group's passes run with its
    own :class:`Options`.  One group (``None``: the whole module) when every kernel pins alike."""
    groups: dict[Options, list[Operation]] = {}
    for op in module.ops:
        if op.name == "tile.kernel":
            groups.setdefault(Options.from_consts(op.attributes.get("consts"), op.loc, target), []).append(op)
    if len(groups) <= 1:
        return [(next(iter(groups), Options()), None)]
    return list(groups.items())


def _run_on(fn: PassFn, module: Module, kernels: list[Operation] | None, options: Options, target: Target) -> None:
    """``fn`` on ``module``, or on only ``kernels`` of it (moved into a module of their own for
    the pass and back to their places after, as whatever ops the pass left in their stead)."""
    if kernels is None:
        fn(module, options, target)
        return
    before = list(module.ops)
    part = Module()
    for k in kernels:
        part.body.append(k)
    try:
        fn(part, options, target)
    finally:
        left = iter(list(part.ops))
        module.body.ops[:] = []
        for op in before:
            mine = next(left, None) if op in kernels else op
            if mine is not None:
                module.body.append(mine)
        for op in left:  # a pass that made more ops than it was given
            module.body.append(op)


def _selected(names: Sequence[str], pass_name: str) -> bool:
    return "all" in names or pass_name in names


def _describe(e: TkcError) -> str:
    """An error's message with its position, on one line (no source snippet)."""
    if e.loc is not None and e.loc.line:
        return f"{e.loc}: {e.message}"
    return e.message


# ------------------------------------------------------------------ dumps
class _Dumper:
    """Writes IR dumps: a header and the module to a stream, or numbered
    files in a directory.  Every dump is valid ``.tkir`` (headers are
    ``//`` comments), so any of them can be fed to ``tkc opt``."""

    def __init__(self, opts: PassOptions, stream: TextIO):
        self.opts, self.stream = opts, stream
        self.count = 0

    def input(self, module: Module) -> None:
        if self.opts.dump_dir is not None:
            self._write("00-input.tkir", "// IR Dump of the input", module)

    def dump(self, module: Module, when: str, name: str, index: int) -> None:
        header = f"// -----// IR Dump {when} {name} ({index}) //----- //"
        if self.opts.dump_dir is None:
            self.stream.write(f"{header}\n{print_module(module, locs=self.opts.locs)}\n")
            self.stream.flush()
            return
        self.count += 1
        stem = name if when == "After" else f"before-{name}"
        self._write(f"{self.count:02d}-{stem}.tkir", header, module)

    def _write(self, filename: str, header: str, module: Module) -> None:
        path = self.opts.dump_dir / filename
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{header}\n{print_module(module, locs=self.opts.locs)}")
        except OSError as e:
            raise TkcUsageError(f"cannot write the IR dump {path}: {e.strerror}") from None


# -------------------------------------------------------------- reproducers
def _rerun(path: Path, name: str, target: Target) -> str:
    """The command that runs pass ``name`` on the reproducer ``path`` for ``target`` again (the
    target named unless it is the default: the passes lower differently for each)."""
    on = "" if target == DEFAULT_TARGET else f" --target {target.name}"
    return f"tkc opt {path} -p {name}{on}"


def _write_reproducer(directory: Path, name: str, index: int, pipeline: str, reason: str,
                      ir_text: str, target: Target) -> Path:
    """The IR that went into the failing pass, with how to rerun it."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    path = directory / f"{stamp}-{name}.tkir"
    n = 1
    while path.exists():
        path = directory / f"{stamp}-{n}-{name}.tkir"
        n += 1
    lines = [
        f"// reproduce: {_rerun(path, name, target)}",
        f"// pipeline: {pipeline} (pass {index}, '{name}', failed; target {target.name})",
        *(f"// error: {line}" for line in reason.splitlines()),
    ]
    path.write_text("\n".join(lines) + "\n" + ir_text)
    return path


# ------------------------------------------------------------------ timing
def _print_timing(times: list[tuple[str, float]], verify_time: float, stream: TextIO) -> None:
    rows = [*times, ("(verify)", verify_time)]
    total = sum(t for _, t in rows) or 1e-12
    out = ["===-- tkc pass timing --===", f"{'wall ms':>10}  {'share':>6}  pass"]
    for name, t in rows:
        out.append(f"{t * 1e3:10.3f}  {t / total:6.1%}  {name}")
    out.append(f"{total * 1e3:10.3f}  {1:6.1%}  total")
    stream.write("\n".join(out) + "\n")
    stream.flush()
