"""The ``tkc`` command: ``tkc opt``, ``tkc compile`` and ``tkc run``.

This module owns the command line only: parsing flags, reading and writing
files, and the error policy.  It calls the frontend, the pass manager and the
interpreter and holds none of their logic.

Error policy: a ``TkcError`` prints ``str(err)`` (location, source line and
caret) to stderr and exits 1; any other exception is an internal compiler
error, printed as one line, exit code 70 (``TKC_DEBUG=1`` shows the
traceback).  Click's own usage errors keep click's format and exit code 2.
"""

from __future__ import annotations

import math
import os
import sys
import textwrap
import traceback
from pathlib import Path
from typing import Any

import click
import numpy as np

import tkc
from tkc import dtypes, options
from tkc.errors import Loc, TkcError, TkcSyntaxError, TkcUsageError
from tkc.ir.core import Module, Operation
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.types import TensorType
from tkc.passes.manager import PassManager, PassOptions
from tkc.passes.pipeline import DEFAULT_PIPELINE
from tkc.runner import BACKENDS, UNTILED_DIM
from tkc.target import DEFAULT_TARGET, TARGETS

EXIT_ERROR = 1
EXIT_INTERNAL = 70  # EX_SOFTWARE
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a pipe closed early

# -o suffix -> the stage it holds, when --emit is not given (longest suffix first).
SUFFIX_STAGE = ((".hopper.tkir", "hopper"), (".tkir", "tkir"), (".ll", "llvm"), (".ptx", "ptx"),
                (".cubin", "cubin"))
STAGES = ("tkir", "hopper", "llvm", "ptx", "cubin")  # tkc.compiler.STAGES, without importing it early
INT_RANGE = (-8, 8)  # what ``tkc run`` draws i32/i64 tensors from unless --int-range says otherwise


def _debug() -> bool:
    try:
        return options.knobs().debug
    except TkcError:
        return False


class _TkcGroup(click.Group):
    """Applies the error policy to every subcommand."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:
            # The reader went away (``tkc run ... | head -1``): stop quietly, as other tools do.
            # Later writes to the closed stdout must not fail at interpreter exit either.
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until the process ends
            ctx.exit(EXIT_BROKEN_PIPE)
        except TkcError as e:
            if _debug():
                traceback.print_exception(e)
            click.echo(str(e), err=True)
            ctx.exit(EXIT_ERROR)
        except Exception as e:
            if _debug():
                raise
            click.echo(f"tkc: internal compiler error: {type(e).__name__}: {e} "
                       "(set TKC_DEBUG=1 for the traceback)", err=True)
            ctx.exit(EXIT_INTERNAL)


# ------------------------------------------------------------ flag parsing
def parse_value(text: str) -> int | float | bool:
    """A ``-D NAME=VALUE`` value: true/false, an int, else a float (ValueError if none)."""
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    try:
        return int(text)
    except ValueError:
        return float(text)  # ValueError here is reported by the caller


def _parse_defines(ctx: click.Context, param: click.Parameter, items: tuple[str, ...]) -> dict:
    out: dict[str, int | float | bool] = {}
    for item in items:
        name, eq, text = item.partition("=")
        if not eq or not name.isidentifier():
            raise click.BadParameter(f"'{item}' is not NAME=VALUE", ctx, param)
        try:
            value = parse_value(text.strip())
        except ValueError:
            raise click.BadParameter(f"'{item}': the value is not an int, a float, true or false",
                                     ctx, param) from None
        _once(out, name, value, ctx, param)
    return out


def _once(out: dict, name: str, value: object, ctx: click.Context, param: click.Parameter) -> None:
    """``out[name] = value``, refusing a name given twice with two values (the last would win)."""
    if name in out and (type(out[name]), out[name]) != (type(value), value):
        raise click.BadParameter(f"{name} is given twice ({out[name]} and {value}): give it once", ctx, param)
    out[name] = value


def _parse_dims(ctx: click.Context, param: click.Parameter, items: tuple[str, ...]) -> dict:
    out: dict[str, int] = {}
    for item in items:
        name, eq, text = item.partition("=")
        if not eq or not name.isidentifier() or not text.strip().isdigit() or int(text) < 1:
            raise click.BadParameter(f"'{item}' is not NAME=SIZE with a positive size", ctx, param)
        _once(out, name, int(text), ctx, param)
    return out


def _parse_scalars(ctx: click.Context, param: click.Parameter, items: tuple[str, ...]) -> dict:
    out: dict[str, int | float | bool] = {}
    for item in items:
        name, eq, text = item.partition("=")
        try:
            if not eq or not name.isidentifier():
                raise ValueError
            value = parse_value(text.strip())
        except ValueError:
            raise click.BadParameter(f"'{item}' is not NAME=VALUE with an int, a float, true or false",
                                     ctx, param) from None
        _once(out, name, value, ctx, param)
    return out


def _parse_int_range(ctx: click.Context, param: click.Parameter, text: str | None) -> tuple[int, int]:
    if text is None:
        return INT_RANGE
    parts = [p.strip() for p in text.split(",")]
    try:
        lo, hi = (int(p) for p in parts)
    except ValueError:
        raise click.BadParameter(f"'{text}' is not LO,HI (two integers, e.g. -8,8)", ctx, param) from None
    if not dtypes.i64.min <= lo <= hi <= dtypes.i64.max:
        raise click.BadParameter(f"'{text}': need LO <= HI, both in i64 [{dtypes.i64.min}, {dtypes.i64.max}]",
                                 ctx, param)
    return lo, hi


def _parse_grid(ctx: click.Context, param: click.Parameter, text: str | None) -> tuple | None:
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise click.BadParameter(f"'{text}' is not 1 to 3 positive sizes, e.g. 4,2", ctx, param)
    return tuple(int(p) for p in parts)


def _dump_flags(f: Any) -> Any:
    """The flags that control IR dumps and pass timing, shared by opt and compile."""
    f = click.option("--no-locs", is_flag=True, help="Print IR without loc(...) annotations.")(f)
    f = click.option("--pass-timing", is_flag=True, help="Print wall time per pass to stderr.")(f)
    f = click.option("--verify-each", is_flag=True,
                     help="Verify the IR after every pass as it runs (a failure names its pass without it too).")(f)
    f = click.option("--dump-dir", type=click.Path(file_okay=False, path_type=Path),
                     help="Write dumps as numbered files NN-<pass>.tkir here (default: after all).")(f)
    f = click.option("--dump-ir-after", multiple=True, metavar="PASS|all",
                     help="Print the IR after this pass (repeatable, or comma-separated).")(f)
    f = click.option("--dump-ir-before", multiple=True, metavar="PASS|all",
                     help="Print the IR before this pass (repeatable, or comma-separated).")(f)
    return f


def _pass_options(dump_ir_before: tuple[str, ...], dump_ir_after: tuple[str, ...],
                  dump_dir: Path | None, pass_timing: bool, no_locs: bool, verify_each: bool) -> PassOptions:
    def names(items: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n.strip() for item in items for n in item.split(",") if n.strip())

    flags = PassOptions(dump_before=names(dump_ir_before), dump_after=names(dump_ir_after),
                        dump_dir=dump_dir, timing=pass_timing, locs=not no_locs, verify_each=verify_each)
    return flags.with_knobs(options.knobs())


# ----------------------------------------------------------- file handling
def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TkcUsageError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _write_output(path: str, text: str) -> None:
    if path == "-":
        click.echo(text, nl=False)
        return
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise TkcUsageError(f"cannot write {path}: {e.strerror}") from None


def _is_ir(path: str) -> bool:
    """Whether ``path`` holds IR (a ``.tkir`` file or standard input), whose constants and pins
    were fixed when it was printed."""
    return path.endswith(".tkir") or path == "-"


def _load(path: str, consts: dict[str, int | float | bool]) -> Module:
    """A ``.tk`` source through the frontend, the ``@tkc.kernel`` functions of a ``.py`` file,
    or a ``.tkir`` file as tile IR."""
    if _is_ir(path):
        if consts:
            raise TkcUsageError(f"-D sets constants of .tk and .py sources; {path} is IR, whose constants and "
                                f"pins were fixed when it was made: compile the source with -D instead")
        module = parse_module(_read_text(path), path)
        if not any(op.name == "tile.kernel" for op in module.ops):
            raise TkcUsageError(f"{path} holds no kernel: IR files hold the tile.kernel ops that tkc opt or "
                                f"tkc compile printed")
        return module
    if path.endswith(".tk"):
        from tkc.frontend import compile_file

        return compile_file(path, consts)
    if path.endswith(".py"):
        return _load_python(path, consts)
    raise TkcUsageError(f"{path}: expected a .tk or .py source, or a .tkir file")


def _load_python(path: str, consts: dict[str, int | float | bool]) -> Module:
    """The ``@tkc.kernel`` functions of a Python file, each with the constants it declares
    (and the pins).  Importing the file runs its top level, as ``python`` would, but not
    what an ``if __name__ == "__main__":`` guards; kernel bodies never run."""
    import importlib.util

    from tkc.kernel import Kernel
    from tkc.pins import PINS

    spec = importlib.util.spec_from_file_location(f"tkc_cli_{Path(path).stem}", path)
    if spec is None or spec.loader is None:
        raise TkcUsageError(f"{path}: cannot import it as Python")
    module_obj = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module_obj)
    except TkcError:
        raise
    except SyntaxError as e:
        if e.lineno is None or (e.filename and Path(e.filename).resolve() != Path(path).resolve()):
            raise TkcUsageError(f"{e.filename or path}:{e.lineno}: {e.msg}: importing {path} failed") from None
        raise TkcSyntaxError(f"{e.msg} (importing {path} as Python)",
                             Loc(str(path), e.lineno, e.offset or 1, _read_text(path))) from None
    except Exception as e:  # noqa: BLE001 - whatever the file's top level raises, said as its error
        import traceback

        from tkc.frontend.lower import DTYPE_NAMES

        here = Path(path).resolve()
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == here]
        hint = ""
        if isinstance(e, NameError) and getattr(e, "name", None) in DTYPE_NAMES:
            # the annotations of an @tkc.kernel function evaluated as Python
            hint = ("; a kernel's annotations (f32[M, N]) are not Python: put `from __future__ import annotations` "
                    "at the top of the file")
        message = f"importing {path} raised {type(e).__name__}: {e}{hint}"
        if not frames:
            raise TkcUsageError(f"{path}: {message}") from None
        col = getattr(frames[-1], "colno", None)
        loc = Loc(str(path), frames[-1].lineno or 1, (col or 0) + 1, _read_text(path))
        raise TkcUsageError(message, loc) from None
    # the file's own kernels, not those it imports (tkc.ops' kernels, say)
    mine = Path(path).resolve()
    kernels = [v for v in vars(module_obj).values() if isinstance(v, Kernel) and Path(v.file).resolve() == mine]
    if not kernels:
        raise TkcUsageError(f"{path} defines no @tkc.kernel function")
    known = {n for k in kernels for n in k.params} | set(PINS)
    unknown = sorted(set(consts) - known)
    if unknown:
        raise TkcUsageError(f"unknown constant {', '.join(map(repr, unknown))} for the kernels of {path}")
    out = Module()
    for k in kernels:
        mine = {n: v for n, v in consts.items() if n in k.params or n in PINS}
        for op in list(k.lower(**mine).ops):
            op.parent.ops.remove(op)
            out.body.append(op)
    return out


def _only_kernel(module: Module, name: str | None, path: str) -> Module:
    """The module, or just the kernel ``name`` from it."""
    if name is None:
        return module
    kernels = [op for op in module.ops if op.name == "tile.kernel"]
    for k in kernels:
        if k.attributes.get("sym_name") == name:
            k.parent.ops.remove(k)
            return Module([k])
    names = ", ".join(str(k.attributes.get("sym_name")) for k in kernels) or "none"
    raise TkcUsageError(f"{path} has no kernel '{name}'; its kernels: {names}")


# ---------------------------------------------------------------- commands
@click.group(cls=_TkcGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(tkc.__version__, prog_name="tkc")
def cli() -> None:
    """tkc: a compiler from a small tile language to GPU kernels."""


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("-p", "--passes", default="", metavar="PASS,...",
              help="Comma-separated passes to run (none: parse, verify, print).")
@click.option("-o", "--output", default="-", metavar="OUT", help="Output file ('-': stdout).")
@click.option("--target", type=click.Choice(list(TARGETS)), default=None,
              help=f"The GPU the passes lower for (default {DEFAULT_TARGET.name}; the kernels' pins are "
                   f"checked against it when given).")
@_dump_flags
def opt(file: str, passes: str, output: str, target: str | None, dump_ir_before: tuple[str, ...],
        dump_ir_after: tuple[str, ...], dump_dir: Path | None, pass_timing: bool, no_locs: bool,
        verify_each: bool) -> None:
    """Run passes over tile IR (a .tkir file, or a .tk/.py source through the frontend) and
    print the result."""
    pm = PassManager(passes, _pass_options(dump_ir_before, dump_ir_after, dump_dir, pass_timing, no_locs, verify_each))
    module = _load(file, {})
    pm.run(module, target=TARGETS[target] if target else None)
    _write_output(output, print_module(module, locs=not no_locs))


@cli.command("pins")
def pins_command() -> None:
    """List the pins: the compile-time choices a kernel may fix with -D instead of leaving
    them to the passes."""
    import shutil
    import textwrap

    from tkc.pins import PINS

    width = min(shutil.get_terminal_size((100, 24)).columns, 100)
    for name, (kind, what, readers) in PINS.items():
        value = "true|false" if kind is bool else "N"
        click.echo(f"-D {name}={value}    (read by {readers})")
        click.echo(textwrap.fill(what[0].upper() + what[1:] + ".", width, initial_indent="    ",
                                 subsequent_indent="    "))


@cli.command("ops")
@click.option("--dialect", type=click.Choice(["tile", "hopper", "blackwell"]), default="tile", show_default=True,
              help="Which ops: the tile language's (what kernels are written in), the hopper dialect's or the "
                   "blackwell dialect's (sm_100a's tcgen05 and tensor memory).")
def ops_command(dialect: str) -> None:
    """List every op: for the tile language, how each is written, what it takes and does, and an example."""
    from tkc.ir.core import OPS
    from tkc.ir.dialects import elementwise as E
    from tkc.ir.dialects import blackwell, hopper  # noqa: F401  (registers the hopper and blackwell ops)

    if dialect == "tile":
        click.echo("Elementwise (scalars and tiles; operands of one dtype, broadcast like numpy):")
        for cls in E.ELEMENTWISE_OPS:
            kinds = "/".join(k for k in ("float", "int", "bool") if k in cls.KINDS)
            written = ", ".join(cls.SURFACE)
            click.echo(f"  {cls.name:<14} {written:<12} {kinds:<15} {cls.SUMMARY}")
            click.echo(f"  {'':<14} {'':<12} {'':<15} e.g. {cls.EXAMPLE}")
        click.echo("Reductions over one axis (axis=, keepdim=; also methods: x.sum(1)):")
        for kind, what in (("sum", "sum (floats accumulate in f32 or better)"), ("mean", "sum / extent, floats only"),
                           ("max", "largest, NaN propagating"), ("min", "smallest, NaN propagating")):
            click.echo(f"  tile.reduce    {kind:<12} {'float/int':<15} {what}")
        for kind, what in (("argmax", "i32 index of the largest, first on ties, NaN first"),
                           ("argmin", "i32 index of the smallest, first on ties, NaN first")):
            click.echo(f"  tile.arg_reduce {kind:<11} {'float/int':<15} {what}")
        click.echo("Scans along one axis (same shape; also methods: x.cumsum(1)):")
        for kind, what in (("cumsum", "inclusive prefix sum (floats accumulate in f32 or better)"),
                           ("cumprod", "inclusive prefix product")):
            click.echo(f"  tile.scan      {kind:<12} {'float/int':<15} {what}")
    names = sorted(n for n in OPS if n.startswith(dialect + ".") and not (
        dialect == "tile" and issubclass(OPS[n], E.ElementwiseOp)))
    click.echo("Other ops (how each is written, what it does, an example):" if dialect == "tile"
               else f"Ops of the {dialect} dialect:")
    for name in names:
        cls = OPS[name]
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        written = getattr(cls, "SURFACE", None) if dialect == "tile" else None
        click.echo(f"  {name:<22} {written}" if written else f"  {name}")
        for line in textwrap.wrap(doc, 96):
            click.echo(f"  {'':<22} {line}")
        if written and getattr(cls, "EXAMPLE", ""):
            click.echo(f"  {'':<22} e.g. {cls.EXAMPLE}")


@cli.command("compile")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", default="-", metavar="OUT", help="Output file ('-': stdout).")
@click.option("--emit", type=click.Choice(STAGES), default=None,
              help="The stage to write.  Default: from the -o suffix (.tkir, .hopper.tkir, .ll, .ptx, "
                   ".cubin), else tkir.")
@click.option("--pipeline", default=DEFAULT_PIPELINE, show_default=True, metavar="PASS,...",
              help="Passes to run on the tile IR.")
@click.option("--hopper-pipeline", default=None, metavar="PASS,...",
              help="Passes from tile IR to hopper IR (default: HOPPER_PIPELINE; '' for hopper-level input).")
@click.option("--kernel", metavar="NAME", help="Keep only this kernel.")
@click.option("-D", "consts", multiple=True, metavar="NAME=VALUE", callback=_parse_defines,
              help="Set a compile-time constant (int, float, true/false).")
@click.option("--target", type=click.Choice(list(TARGETS)), default=None,
              help=f"The GPU the backend stages compile for (default {DEFAULT_TARGET.name}, or the target a "
                   f"lowered IR file was made for).")
@click.option("--resource-usage", is_flag=True,
              help="Run ptxas and print registers, spills and shared memory per kernel to stderr.")
@_dump_flags
def compile_command(file: str, output: str, emit: str | None, pipeline: str, hopper_pipeline: str | None,
                    kernel: str | None, consts: dict, target: str | None, resource_usage: bool,
                    dump_ir_before: tuple[str, ...], dump_ir_after: tuple[str, ...], dump_dir: Path | None,
                    pass_timing: bool, no_locs: bool, verify_each: bool) -> None:
    """Compile a .tk kernel (or .tkir IR) and write the --emit stage."""
    emit = emit or _stage_of(output)
    opts = _pass_options(dump_ir_before, dump_ir_after, dump_dir, pass_timing, no_locs, verify_each)
    module = _only_kernel(_load(file, consts), kernel, file)
    if emit == "tkir" and not resource_usage:
        # Tile IR is target-independent and may hold several kernels: no backend involved.
        PassManager(pipeline, opts).run(module)
        _write_output(output, print_module(module, locs=not no_locs))
        return
    if emit == "cubin" and output == "-":
        raise TkcUsageError("--emit cubin writes a binary file; name it with -o FILE.cubin")
    from tkc.compiler import compile_kernel
    from tkc.passes.pipeline import laid_out_for

    target = target or laid_out_for(module.ops) or DEFAULT_TARGET.name
    # the default pipelines unless changed (None: IR the backend passes made skips them)
    pipeline = None if pipeline == DEFAULT_PIPELINE else pipeline
    compiled = compile_kernel(module, target=target, pipeline=pipeline, hopper_pipeline=hopper_pipeline,
                              stop="cubin" if resource_usage else emit,
                              ptxas=True if emit == "cubin" or resource_usage else None,
                              pass_options=opts, cache=False, file=file)
    for note in compiled.remarks:  # what a pass left undone and why, at its line
        click.echo(note, err=True)
    if resource_usage:
        _print_resources(compiled)
    out = compiled.asm[emit]
    if isinstance(out, bytes):
        try:
            Path(output).write_bytes(out)
        except OSError as e:
            raise TkcUsageError(f"cannot write {output}: {e.strerror}") from None
    else:
        _write_output(output, out)


def _stage_of(output: str) -> str:
    """The stage an output file name asks for; tkir for stdout and other suffixes."""
    return next((stage for suffix, stage in SUFFIX_STAGE if output.endswith(suffix)), "tkir")


def _print_resources(compiled: Any) -> None:
    r = compiled.resources
    if r is None:
        click.echo(f"ptxas reported nothing for kernel {compiled.name}", err=True)
    else:
        click.echo(f"{r.kernel}: {r.registers} registers, {r.spill_stores} B spill stores, {r.spill_loads} B "
                   f"spill loads, {compiled.smem_bytes} B dynamic shared memory + {r.smem} B static, "
                   f"{r.stack_frame} B stack frame ({compiled.target}, {compiled.threads} threads, "
                   f"{compiled.programs_per_sm} program{'' if compiled.programs_per_sm == 1 else 's'} an SM)",
                   err=True)
    for w in compiled.ptxas_warnings:
        click.echo(f"ptxas: {w}", err=True)
    _print_store_plan(compiled)


def _print_store_plan(compiled: Any) -> None:
    """Which loads the kernel's stores emit run by run and which rows stay packed
    (tkc/codegen/deferred.py): choices codegen makes that no IR dump shows."""
    from tkc.codegen.deferred import store_plan

    kernel = compiled.kernel_op
    plan = store_plan(kernel)

    def name(op: Any) -> str:
        if op.name != "hopper.async_read":
            return op.tensor.name_hint or "?"
        # A staged load's read (stage-loads): named by its ring, "<tensor>_staged".
        stage = getattr(op.src, "owner", None)
        ring = stage.operands[0] if stage is not None and stage.name == "hopper.stage" else op.src
        return (ring.name_hint or "?").removesuffix("_staged") + " (staged)"

    def tensors(ops: frozenset) -> str:
        return ", ".join(dict.fromkeys(name(op) for op in kernel.walk() if op in ops))

    parts = ([f"loaded by their stores, run by run: {tensors(plan.deferred)}"] if plan.deferred else []) + \
            ([f"kept packed until their stores: {tensors(plan.packed)}"] if plan.packed else [])
    if parts:
        click.echo(f"{compiled.name}: " + "; ".join(parts), err=True)


@cli.command("run")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="interpret: the numpy reference; emulate: the hopper IR on the CPU; gpu: the compiled "
                   "kernel.  Default: gpu when torch sees one, else interpret (TKC_INTERPRET=1: interpret).")
@click.option("--interpret", "interpret_flag", is_flag=True, help="Same as --backend interpret.")
@click.option("--check", is_flag=True,
              help="Also run the interpreter on the same inputs and compare every tensor; exit 1 on a mismatch.  "
                   "The interpreter is the reference: a check of it (the default without a GPU) runs the "
                   "emulator.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="gpu: time this many launches and print the median.")
@click.option("-D", "consts", multiple=True, metavar="NAME=VALUE", callback=_parse_defines,
              help="Set a compile-time constant (int, float, true/false).")
@click.option("--dim", "dims", multiple=True, metavar="NAME=SIZE", callback=_parse_dims,
              help=f"The size of a symbolic tensor dim.  Default: one tile and a tail ({UNTILED_DIM} where no "
                   "tile spans the dim).")
@click.option("--scalar", "scalars", multiple=True, metavar="NAME=VALUE", callback=_parse_scalars,
              help="The value of a runtime scalar argument (default: random; f32 in [0.5, 1.5], i32/i64 in [1, 8]).")
@click.option("--int-range", callback=_parse_int_range, metavar="LO,HI",
              help=f"The range integer tensors are drawn from, both ends included (default: "
                   f"{INT_RANGE[0]},{INT_RANGE[1]}).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--kernel", metavar="NAME", help="The kernel to run when the file has several (default: each in turn).")
@click.option("--grid", callback=_parse_grid, metavar="G0[,G1[,G2]]",
              help="Launch grid (default: the kernel's grid(...)); of a persistent kernel, the "
                   "programs that walk its tiles.")
@click.option("--target", type=click.Choice(list(TARGETS)), default=None,
              help=f"The GPU the emulate and gpu backends compile for (emulate: its lowered IR on the CPU; "
                   f"default {DEFAULT_TARGET.name}, or the target a lowered IR file was made for).")
@click.option("--ranks", type=click.IntRange(min=1), default=None, metavar="R",
              help="Run a multi-GPU kernel on R simulated ranks in the interpreter or the emulator (default 1 for "
                   "one), each on its own random inputs, its flags at zero; --seed also picks how the ranks' programs "
                   "interleave, and --check compares with the interpreter: in another order (after the interpreter) "
                   "or on the same inputs (after the emulator).  On GPUs, one process a rank: "
                   "torchrun --nproc-per-node R -m tkc run FILE --backend gpu [--check: against the interpreter].")
def run_command(file: str, backend: str | None, interpret_flag: bool, check: bool, repeat: int, consts: dict,
                dims: dict[str, int], scalars: dict[str, int | float | bool], int_range: tuple[int, int], seed: int,
                kernel: str | None, grid: tuple | None, target: str | None, ranks: int | None) -> None:
    """Compile a kernel, run it on random inputs and print output statistics."""
    args = (file, backend, interpret_flag, check, repeat, consts, dims, scalars, int_range, seed)
    if kernel is None:
        module = _load(file, consts)
        names = [str(op.attributes.get("sym_name")) for op in module.ops]
        if len(names) > 1:
            # A file of several kernels (a forward and its backward): each in turn, on its own
            # random inputs, with the --dim and --scalar values it has; exit 1 at the end if any
            # check failed.
            own = _own_dims_and_scalars(file, module, dims, scalars)
            failed = []
            for name in names:
                click.echo(f"== {name}")
                try:
                    _run_one(file, backend, interpret_flag, check, repeat, consts, *own[name], int_range, seed,
                             name, grid, target, ranks)
                except SystemExit as e:
                    if e.code:
                        failed.append(name)
            if failed:
                click.echo(f"{file}: checks failed for {', '.join(failed)}")
                raise SystemExit(1)
            return
    _run_one(*args, kernel, grid, target, ranks)


def _run_one(file: str, backend: str | None, interpret_flag: bool, check: bool, repeat: int, consts: dict,
             dims: dict[str, int], scalars: dict[str, int | float | bool], int_range: tuple[int, int], seed: int,
             kernel: str | None, grid: tuple | None, target: str | None, ranks: int | None) -> None:
    """``tkc run`` of one kernel of ``file`` (``kernel``: its name, None for the file's only one;
    ``target`` None: the one a lowered IR file names, else the default)."""
    from tkc import runner

    if interpret_flag and backend not in (None, "interpret"):
        raise TkcUsageError(f"--interpret contradicts --backend {backend}")
    chosen, why = ("interpret", None) if interpret_flag or backend else runner.default_backend()
    chosen = backend or chosen
    pm = PassManager(DEFAULT_PIPELINE, PassOptions().with_knobs(options.knobs()))
    module = _load(file, consts)
    pm.run(module)
    try:
        k = module.kernel(kernel)
    except KeyError:
        names = ", ".join(str(op.attributes.get("sym_name")) for op in module.ops)
        what = f"no kernel '{kernel}'" if kernel else "no kernels"
        raise TkcUsageError(f"{file} has {what} (kernels: {names or 'none'})") from None
    from tkc.passes.pipeline import is_lowered, laid_out_for

    target = target or laid_out_for([k]) or DEFAULT_TARGET.name
    if is_lowered(k):  # IR the backend passes made: the emulator or a GPU runs it, not the interpreter
        if check or interpret_flag or backend == "interpret":
            raise TkcUsageError(f"{file} is IR the backend passes lowered (hopper ops); the interpreter runs tile IR, "
                                f"so it cannot run or --check it: run it with --backend emulate or gpu, or pass "
                                f"the .tk source")
        if backend is None and chosen == "interpret":
            chosen, why = "emulate", "lowered IR: the emulator runs it on the CPU"
    world = _torchrun_ranks(k, backend, ranks, file)
    ranks = world or ranks
    sizes = _dim_sizes(k, dims)
    if ranks:  # a dim no tile spans (a rank's slot, a flag per program) holds every rank
        sizes = {n: max(s, ranks) if n not in dims and s == UNTILED_DIM else s for n, s in sizes.items()}
    _check_int_range(k, int_range)

    from tkc.interpreter import random_args

    args = random_args(k, sizes, seed, int_range)
    given = _set_scalars(k, args, scalars)
    from tkc.ir.dialects.tile import uses_ranks

    ranked = ranks is not None or uses_ranks(k)
    if ranked and not world and backend not in (None, "interpret", "emulate"):
        raise TkcUsageError(f"--backend {backend}: multi-GPU kernels run in the interpreter or the emulator for "
                            f"now (tkc run {file} --ranks R [--backend emulate])")
    runs_on = "gpu" if world else (backend or "interpret") if ranked else chosen
    picked = _schedule(k, args, grid, consts, runs_on, target, file)
    if picked:  # the kernel a Python call of these shapes runs
        module = _load(file, {**consts, **picked})
        pm.run(module)
        k = module.kernel(kernel)
        on = ", ".join(n if v is True else f"{n}={v}" for n, v in picked.items() if v is not False)
        if not world or int(os.environ.get("RANK", "0")) == 0:
            click.echo(f"schedule for these shapes: {on or 'no pins'} (tkc.schedule; -D NAME=VALUE pins one)")
    if world:
        _run_ranks_gpu(k, args, sizes, dims, given, int_range, seed, grid, check, repeat, target)
        return
    if ranked:
        _run_ranks(k, args, ranks or 1, sizes, dims, given, int_range, seed, grid, check, backend or "interpret",
                   target)
        return
    result = runner.run(k, args, chosen, grid=grid, check=check, repeat=repeat, seed=seed, target=target)
    ran = result.backend
    how = {"interpret": "interpreted in", "emulate": "emulated in",
           "gpu": f"median kernel time of {result.repeats} launches"}[ran]
    unit = f"{result.seconds * 1e6:.1f} us" if ran == "gpu" else f"{result.seconds * 1e3:.1f} ms"
    reasons = ([why] if why else []) + (["--check compares it with the interpreter"] if ran != chosen else [])
    because = f" ({'; '.join(reasons)})" if reasons else ""
    click.echo(f"kernel {result.kernel}: grid {result.grid}, seed {seed}, {ran}{because}: {how} {unit}")
    for line in _input_lines(k, sizes, dims, args, given, int_range):
        click.echo("  " + line)
    _print_outputs(result, f"{runner.EXECUTORS[ran]} against interpreter")


def _schedule(k: Any, args: list, grid: tuple | None, consts: dict, backend: str, target: str,
              file: str) -> dict[str, Any]:
    """The pins tkc.schedule picks for a run of ``k`` on ``args`` by ``backend`` (the lowered
    kernel runs them: the GPU, or the emulator as a GPU of DEFAULT_SMS SMs would), as a call
    from Python of these shapes gets them; {} for the interpreter, which pins do not change,
    and for IR, whose pins were fixed when it was printed."""
    from tkc import schedule
    from tkc.compiler import compile_kernel

    chooser = None if _is_ir(file) else schedule.chooser(k, set(consts), target)
    if chooser is None or backend == "interpret":
        return {}
    sms = schedule.device_sms() if backend == "gpu" else schedule.DEFAULT_SMS
    name = k.attributes["sym_name"]
    return chooser.pins(args, grid, sms, lambda pins: schedule.spill_free(
        lambda: compile_kernel(_only_kernel(_load(file, {**consts, **pins}), name, file), target=target)),
        lambda pins: _load(file, {**consts, **pins}).kernel(name))


def _print_outputs(result: Any, pair: str) -> None:
    """The compiler's remarks on the kernel that ran (stderr), each output's statistics, then
    each check of ``pair`` (exit 1 on a mismatch)."""
    for note in result.notes:
        click.echo(note, err=True)
    for name, t, value in result.outputs:
        click.echo("  " + _tensor_stats(name, t, value))
    if result.checked is not None:
        for m in result.checked:
            verdict = "ok" if m.bad == 0 else "MISMATCH"
            click.echo(f"  check {m.name}, {pair}: max abs error {m.max_abs_error:.4g}, "
                       f"{m.bad} of {m.total} outside tolerance: {verdict}")
        if not result.ok:
            raise SystemExit(1)


def _run_ranks(k: Operation, args: list[Any], ranks: int, sizes: dict[str, int], dims: dict[str, int],
               given: set[str], int_range: tuple[int, int], seed: int, grid: tuple | None, check: bool,
               backend: str, target: str) -> None:
    """``tkc run --ranks R``: rank r's tensors drawn with seed ``seed + 1000 * r`` (rank 0's are
    the single-rank inputs), the scalars rank 0's on every rank, flags at zero; in the
    interpreter or the emulator."""
    from tkc import runner
    from tkc.ranks import flag_params

    params = list(k.regions[0].block.args)
    flags = [params.index(p) for p in flag_params(k)]
    rank_args = [_rank_inputs(k, args, r, sizes, seed, int_range, flags) for r in range(ranks)]
    result = runner.run_ranks(k, rank_args, grid=grid, check=check, seed=seed, backend=backend, target=target)
    how = "interpret: interpreted" if backend == "interpret" else "emulate: emulated"
    _print_ranks_run(result, f"{ranks} rank{'s' if ranks > 1 else ''} of grid {result.grid}, seed {seed}, {how} in "
                             f"{result.seconds * 1e3:.1f} ms", (k, sizes, dims, args, given, int_range),
                     "start at zero", flags, f"interpreter with the programs in another order (seed {seed + 1})"
                     if backend == "interpret" else "emulator against interpreter")


def _print_ranks_run(result: Any, how: str, inputs: tuple, flags_are: str, flags: list[int], pair: str) -> None:
    """What a run of a multi-GPU kernel prints: ``how`` it ran, the inputs (``_input_lines``'
    arguments), the flags and the outputs with their checks of ``pair``."""
    click.echo(f"kernel {result.kernel}: {how}")
    for line in _input_lines(*inputs):
        click.echo("  " + line)
    if flags:
        params = inputs[0].regions[0].block.args
        click.echo(f"  flags ({flags_are}): {', '.join(_name(params[i]) for i in flags)}")
    _print_outputs(result, pair)


def _rank_inputs(k: Operation, args: list[Any], r: int, sizes: dict[str, int], seed: int,
                 int_range: tuple[int, int], flags: list[int]) -> list[Any]:
    """Rank ``r``'s inputs: its tensors drawn with seed ``seed + 1000 * r`` (rank 0's are
    ``args``), the scalars rank 0's, the flags (parameter indices) zero."""
    from tkc.interpreter import random_args

    mine = args if r == 0 else random_args(k, sizes, seed + 1000 * r, int_range)
    params = k.regions[0].block.args
    return [args[i] if not isinstance(p.type, TensorType) else np.zeros_like(mine[i]) if i in flags else mine[i]
            for i, p in enumerate(params)]


def _torchrun_ranks(k: Operation, backend: str | None, ranks: int | None, file: str) -> int | None:
    """How many GPUs run a multi-GPU kernel: torchrun's processes (``WORLD_SIZE``) for
    ``--backend gpu`` or no backend under torchrun; None for a run in the interpreter."""
    from tkc.ir.dialects.tile import uses_ranks

    if ranks is None and not uses_ranks(k) or backend not in (None, "gpu"):
        return None
    world = os.environ.get("WORLD_SIZE")
    if world is None:
        if backend == "gpu":
            raise TkcUsageError(f"--backend gpu: a multi-GPU kernel runs one process per GPU under torchrun: "
                                f"torchrun --nproc-per-node R -m tkc run {file} --backend gpu")
        return None
    if ranks is not None and ranks != int(world):
        raise TkcUsageError(f"--ranks {ranks}, but torchrun started {world} processes (one a rank)")
    return int(world)


def _run_ranks_gpu(k: Operation, args: list[Any], sizes: dict[str, int], dims: dict[str, int], given: set[str],
                   int_range: tuple[int, int], seed: int, grid: tuple | None, check: bool, repeat: int,
                   target: str) -> None:
    """``tkc run`` of a multi-GPU kernel under torchrun: every process a rank on its GPU, its
    inputs as ``--ranks`` draws them; rank 0 prints (every rank's outputs, with --check)."""
    from tkc import runner
    from tkc.ranks import flag_params

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"])
    params = list(k.regions[0].block.args)
    flags = [params.index(p) for p in flag_params(k)]
    mine = _rank_inputs(k, args, rank, sizes, seed, int_range, flags)
    try:
        result = runner.run_ranks_gpu(k, mine, flags, grid=grid, check=check, repeat=repeat, seed=seed, target=target)
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    if rank != 0:
        if not result.ok:
            raise SystemExit(1)
        return
    _print_ranks_run(result, f"{world} ranks (torchrun) of grid {result.grid}, seed {seed}, gpu: median kernel time "
                             f"of {result.repeats} launches {result.seconds * 1e6:.1f} us",
                     (k, sizes, dims, args, given, int_range), "zeroed before every launch", flags,
                     f"GPU against interpreter on {world} simulated ranks (seed {seed})")


def _own_dims_and_scalars(file: str, module: Module, dims: dict[str, int], scalars: dict[str, int | float | bool]
                          ) -> dict[str, tuple[dict[str, int], dict[str, int | float | bool]]]:
    """Per kernel of a file run in turn, the --dim and --scalar values it has (attn_train.tk's
    forward has KVH, its backward's first kernel not); one that no kernel of the file has is an
    error, which lists what each has."""
    from tkc import runner

    has = {str(k.attributes.get("sym_name")): (runner.dim_names(k), _scalar_names(k)) for k in module.ops}
    for i, (flag, given) in enumerate((("--dim", dims), ("--scalar", scalars))):
        extra = [n for n in given if not any(n in h[i] for h in has.values())]
        if extra:
            what = flag[2:]
            each = "; ".join(f"{k}: {', '.join(h[i]) or 'none'}" for k, h in has.items())
            raise TkcUsageError(f"{flag} {', '.join(extra)}: no kernel of {file} has a {what} {', '.join(extra)}; "
                                f"the {what}s of its kernels: {each}")
    return {k: ({n: v for n, v in dims.items() if n in d}, {n: v for n, v in scalars.items() if n in sc})
            for k, (d, sc) in has.items()}


def _scalar_names(kernel: Operation) -> list[str]:
    return [_name(a) for a in kernel.regions[0].block.args if not isinstance(a.type, TensorType)]


def _dim_sizes(kernel: Operation, dims: dict[str, int]) -> dict[str, int]:
    """The size of every symbolic dim of the kernel's tensors: ``dims``, else the default;
    none the kernel lacks, and none that makes the inputs too big to allocate."""
    from tkc import runner

    names = runner.dim_names(kernel)
    extra = [n for n in dims if n not in names]
    if extra:
        raise TkcUsageError(f"the kernel has no dim {', '.join(extra)}; its dims: {', '.join(names) or 'none'}")
    sizes = {**runner.default_dims(kernel), **dims}
    sizes = {n: sizes[n] for n in names}
    given = [f"--dim {n}={dims[n]}" for n in names if n in dims] or ["the default dims"]
    need, budget = runner.input_bytes(kernel, sizes), runner.input_budget()
    if need > budget:
        shown = ", ".join(f"{n}={s}" for n, s in sizes.items())
        raise TkcUsageError(f"{' '.join(given)}: the kernel's tensors would take {_size(need)} ({need:,} bytes) with "
                            f"{shown}; tkc run allocates at most {_size(budget)} here (a quarter of this "
                            f"machine's memory, at most {_size(runner.MAX_INPUT_BYTES)})")
    for n, s in sizes.items():
        if s > dtypes.i32.max:
            raise TkcUsageError(f"--dim {n}={s}: a kernel reads its dims as i32, at most {dtypes.i32.max}")
    return sizes


def _size(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _check_int_range(kernel: Operation, int_range: tuple[int, int]) -> None:
    """--int-range must fit every integer tensor it fills (i32 ones: the i32 range)."""
    lo, hi = int_range
    for a in kernel.regions[0].block.args:
        dt = a.type.dtype
        if isinstance(a.type, TensorType) and dt.is_int and not dt.min <= lo <= hi <= dt.max:
            raise TkcUsageError(f"--int-range {lo},{hi}: '{_name(a)}' is an {dt.name} tensor; give a range "
                                f"within [{dt.min}, {dt.max}]")


def _set_scalars(kernel: Operation, args: list[Any], scalars: dict[str, int | float | bool]) -> set[str]:
    """Put each --scalar value in ``args`` after checking it fits its parameter; the names set."""
    from tkc.errors import TkcLaunchError
    from tkc.signature import check_scalar

    params = {_name(a): (i, a.type.dtype) for i, a in enumerate(kernel.regions[0].block.args)
              if not isinstance(a.type, TensorType)}
    for name, value in scalars.items():
        if name not in params:
            raise TkcUsageError(f"--scalar {name}: the kernel has no scalar '{name}'; its scalars: "
                                f"{', '.join(map(str, params)) or 'none'}")
        i, dt = params[name]
        want = "true or false" if dt.is_bool else f"an integer in [{dt.min}, {dt.max}]" if dt.is_int else "a number"
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if dt.is_float and number and (isinstance(value, int) or math.isfinite(value)) and abs(value) > dt.max:
            raise TkcUsageError(f"--scalar {name}={_show(value)}: out of {dt.name}'s range "
                                f"(at most {dt.max:.4g} in magnitude)")
        try:
            check_scalar(name, dt, value)
        except TkcLaunchError:
            raise TkcUsageError(f"--scalar {name}={_show(value)}: '{name}' is an {dt.name} scalar; give {want}"
                                ) from None
        args[i] = value
    return set(scalars)


def _name(param: Any) -> str:
    return param.name_hint or f"arg{param.index}"  # as tkc.runner names outputs


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _input_lines(kernel: Operation, sizes: dict[str, int], dims: dict[str, int], args: list[Any],
                 given: set[str], int_range: tuple[int, int]) -> list[str]:
    """What the random inputs were drawn with: each dim's size, each scalar's value and the
    integers' range, and whether the user or a default chose it."""
    params = kernel.regions[0].block.args
    lines = []
    if sizes:
        lines.append("dims: " + ", ".join(f"{n}={s} ({'--dim' if n in dims else 'default'})"
                                          for n, s in sizes.items()))
    shown = [f"{_name(p)}={_show(a)} ({'--scalar' if _name(p) in given else 'random'})"
             for p, a in zip(params, args) if not isinstance(p.type, TensorType)]
    if shown:
        lines.append("scalars: " + ", ".join(shown))
    lo, hi = int_range
    if any(isinstance(p.type, TensorType) and p.type.dtype.is_int for p in params):
        origin = "default" if int_range == INT_RANGE else "--int-range"
        lines.append(f"integer tensors: uniform in [{lo}, {hi}] ({origin})")
    elif int_range != INT_RANGE:
        lines.append(f"integer tensors: none (--int-range {lo},{hi} unused)")
    return lines


def _tensor_stats(name: str, t: TensorType, value: np.ndarray) -> str:
    # pairs of FP4 values: the statistics of the values, not of the bytes
    x = (dtypes.unpack_fp4(value) if t.dtype.is_packed else value).astype(np.float64)
    nans = int(np.isnan(x).sum())
    finite = x[~np.isnan(x)]
    mean = f"{finite.mean():.6g}" if finite.size else "nan"
    absmax = f"{np.abs(finite).max():.6g}" if finite.size else "nan"
    shape = "x".join(str(s) for s in value.shape)
    return f"{name}: {t.dtype.name}[{shape}] mean {mean}, abs-max {absmax}, NaN {nans}"


def main() -> None:
    """The console script's entry point."""
    cli(prog_name="tkc")
