"""``@tkc.kernel``: kernels written as Python functions, called with tensors.

The decorator reads the function's source and parses it with the same grammar
as ``.tk`` files; the body is never executed as Python.  :func:`load` makes the same
callable kernel of a ``@kernel`` function of a ``.tk`` file.  Each distinct set of
compile-time constants is compiled once and kept, through ``tkc.compiler``: to tile
IR for the interpreter (:meth:`Kernel.compile`), and to PTX/cubin for the GPU
(:meth:`Kernel.specialize`, backed by the disk cache).  A call runs
the kernel in the reference interpreter when asked to (``TKC_INTERPRET=1`` or
``tkc.interpret``), else on the GPU through ``tkc.runtime.launch``.

Must not: compile or launch by itself (it calls the compiler and the runtime),
or hold GPU state beyond the compiled specializations.
"""

from __future__ import annotations

import functools
import inspect
import os
import textwrap
from collections.abc import Callable
from typing import Any

from tkc.errors import (Loc, TkcError, TkcLaunchError, TkcSyntaxError, TkcTmaStrideError, TkcUsageError,
                        kernel_choice_error)
from tkc.ir.core import Module, Operation
from tkc.ir.printer import print_module
from tkc.options import interpret_requested
from tkc.target import DEFAULT_TARGET


_runtime: Any = None  # tkc.runtime.launch, bound by the first GPU call


def consts_key(consts: dict[str, Any]) -> tuple:
    """The key of a set of constants in the in-process caches: each value with its type, since
    1, 1.0 and True are equal (and hash alike) in Python but not to the compiler (a bool pin
    takes True, not 1; a float constant folds differently), as the disk cache keeps them apart."""
    return tuple(sorted((n, type(v), v) for n, v in consts.items()))


@functools.cache
def _launch() -> Callable[..., Any]:
    """``tkc.runtime.launch.launch``, imported on the first GPU call: importing tkc loads no
    driver layer, and a bare checkout maps ``tkc.runtime`` only after ``import tkc``."""
    global _runtime
    from tkc.runtime import launch

    _runtime = launch
    return launch.launch


class Kernel:
    """A compiled-on-demand tile kernel.

    ``k(*tensors, grid=None, **consts)`` launches it (CUDA torch tensors; the
    interpreter with ``TKC_INTERPRET=1``); ``k.compile(**consts)`` returns its
    tile IR module after the default pipeline; ``k.ir(**consts)`` the IR text;
    ``k.specialize(**consts)`` the GPU compilation (:class:`tkc.compiler.Compiled`)
    and ``k.asm(**consts)`` its stage texts.
    """

    #: The GPU target of calls and ``asm``; assign another to a kernel to change it.
    target = DEFAULT_TARGET.name

    def __init__(self, fn: Callable[..., Any]):
        if not callable(fn) or not hasattr(fn, "__code__"):
            raise TkcUsageError(f"@tkc.kernel decorates a Python function, got {type(fn).__name__}")
        try:
            lines, first_line = inspect.getsourcelines(fn)
            self.file = inspect.getsourcefile(fn) or "<unknown>"
        except (OSError, TypeError) as e:
            raise TkcUsageError(f"@tkc.kernel needs the source of '{fn.__name__}': {e}") from None
        self.fn = fn
        self.name = fn.__name__
        self.source = textwrap.dedent("".join(lines))
        self._text = "".join(lines)  # as in the file, so locations match its columns
        self.first_line = first_line
        self._compiled: dict[tuple, Module] = {}
        self._specialized: dict[tuple, Any] = {}
        self._schedules: dict[tuple, Any] = {}  # (target, consts key) -> tkc.schedule.Chooser or None
        # (target, consts key) -> compilations a launch fell back to where TMA could not take a
        # tensor's strides (tma_vectors off, or tma off): tried, by their plans, before the
        # failing compilation is tried again.
        self._fallbacks: dict[tuple, list] = {}
        from tkc.frontend.parser import parse

        # Parse now so a syntax error shows at import time, like Python's own.
        self._tree = parse("".join(lines), self.file, first_line=first_line)
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__
        self._python_function = True  # the source is one function; False: a .tk file's kernel `name`

    @classmethod
    def from_file(cls, path: str | os.PathLike, name: str | None = None) -> Kernel:
        """The ``@kernel`` function ``name`` of a ``.tk`` file (the file's only kernel when
        ``name`` is None), callable like a ``@tkc.kernel``.  The file is read once, here."""
        from tkc.frontend import ast
        from tkc.frontend.lower import _is_kernel_decorator
        from tkc.frontend.parser import parse

        try:
            file = os.fspath(path)
        except TypeError:
            raise TkcUsageError(f"tkc.load takes the path of a .tk file (a str or a Path), got "
                                f"{type(path).__name__}") from None
        try:
            with open(file, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise TkcUsageError(f"cannot read {file}: {e.strerror}") from None
        tree = parse(text, file)
        funcs = [s for s in tree.body if isinstance(s, ast.FunctionDef)
                 and any(_is_kernel_decorator(d) for d in s.decorators)]
        chosen = [f for f in funcs if name is None or f.name == name]
        if not funcs:
            raise TkcSyntaxError("no kernel found: mark a function with @kernel", Loc(file, 1, 1, text))
        if len(chosen) != 1:
            raise kernel_choice_error(file, name, [f.name for f in funcs])
        self = cls.__new__(cls)
        self.fn, self.name, self.file, self.first_line = None, chosen[0].name, file, 1
        self.source = self._text = text
        self._compiled, self._specialized, self._schedules, self._fallbacks = {}, {}, {}, {}
        self._tree, self._def = tree, chosen[0]
        self.__doc__, self.__name__ = None, self.name
        self._python_function = False
        return self

    def __repr__(self) -> str:
        return f"<tkc.kernel {self.name} from {self.file}:{self.first_line}>"

    def lower(self, **consts: Any) -> Module:
        """A fresh module holding the kernel as the frontend emits it (no pass has run)."""
        from tkc.frontend.lower import lower_module

        return lower_module(self._tree, consts, python_function=self._python_function, only=self.name)

    @property
    def params(self) -> list[str]:
        """The kernel's parameter names, in order (tensors, scalars and constants)."""
        return [p.name for p in self._function().params]

    def _function(self) -> Any:
        """The kernel's function in the parsed source."""
        return self._tree.body[0] if self._python_function else self._def

    @functools.cached_property
    def arguments(self) -> tuple[str, ...]:
        """The names of the parameters a call passes (tensors and scalars: not constants), in order."""
        from tkc.frontend.lower import is_const_annotation

        return tuple(p.name for p in self._function().params if not is_const_annotation(p.annotation))

    def bind(self, args: tuple | list, consts: dict[str, Any]) -> tuple[tuple | list, dict[str, Any]]:
        """``args`` with the arguments ``consts`` names by keyword (``k(x, y=y)``) put in their
        places, and the constants left; a name given twice, or a keyword past a missing
        argument, is an error here rather than a constant nobody reads."""
        if not any(n in consts for n in self.arguments):
            return args, consts
        consts = dict(consts)
        given = list(args)
        for i, name in enumerate(self.arguments):
            if name in consts:
                if i < len(given):
                    raise TkcLaunchError(f"kernel @{self.name} got two values for argument '{name}' (by position "
                                         f"and by keyword)")
                if i > len(given):
                    missing = self.arguments[len(given)]
                    from tkc.pins import PINS

                    # a misspelt keyword (yy= for y=) is what usually leaves an argument missing
                    stray = [n for n in consts if n not in self.params and n not in PINS]
                    also = f" ('{stray[0]}' is no parameter of it)" if stray else ""
                    raise TkcLaunchError(f"kernel @{self.name}: argument '{missing}' is missing before '{name}'{also}")
                given.append(consts.pop(name))
        return given, consts

    def compile(self, pipeline: str | None = None, **consts: Any) -> Module:
        """The kernel's tile IR for these constants, after ``pipeline`` (default: the default
        pipeline), through :func:`tkc.compiler.compile_kernel`'s tile stage.  Cached per
        (pipeline, constants) in this process; the module keeps its source locations."""
        key = (pipeline, consts_key(consts))
        module = self._compiled.get(key)
        if module is None:
            from tkc.compiler import compile_kernel

            compiled = compile_kernel(self._text, consts, pipeline=pipeline, stop="tkir", cache=False,
                                      file=self.file, first_line=self.first_line, **self._which())
            module = self._compiled[key] = Module([compiled.kernel_op])
        return module

    def ir(self, pipeline: str | None = None, locs: bool = False, **consts: Any) -> str:
        return print_module(self.compile(pipeline, **consts), locs=locs)

    def kernel_op(self, **consts: Any) -> Operation:
        return self.compile(**consts).kernel(self.name)

    def specialize(self, **consts: Any) -> Any:
        """The kernel compiled for ``self.target`` with these constants, as a
        :class:`tkc.compiler.Compiled` (PTX, and a cubin when ptxas is found).  Compiled once
        per (target, constants) in this process and kept in the disk cache across
        processes.  Dtypes need no key of their own: the annotations fix them."""
        key = (self.target, consts_key(consts))
        compiled = self._specialized.get(key)
        if compiled is None:
            from tkc.compiler import compile_kernel

            compiled = self._specialized[key] = compile_kernel(self._text, consts, target=self.target,
                                                               file=self.file, first_line=self.first_line,
                                                               **self._which())
        return compiled

    def _which(self) -> dict[str, Any]:
        """How ``compile_kernel`` finds this kernel in ``self._text``."""
        if self._python_function:
            return {"python_function": True}
        return {"kernel": self.name}

    def asm(self, **consts: Any) -> dict[str, Any]:
        """Every stage of the GPU compilation for these constants: ``tkir``, ``hopper``,
        ``llvm``, ``ptx`` (text) and ``cubin`` (bytes, when ptxas ran)."""
        return self.specialize(**consts).asm

    def __call__(self, *args: Any, grid: Any = None, **consts: Any) -> None:
        if consts:
            args, consts = self.bind(args, consts)
        self.call(args, consts, consts_key(consts) if consts else (), grid)

    def call(self, args: tuple | list, consts: dict[str, Any], key: tuple, grid: Any = None) -> None:
        """``self(*args, grid=grid, **consts)`` for a caller that calls it again and again with
        the same constants and keeps ``key``, ``consts_key(consts)`` (a
        ``tkc.ops`` operator): a launch like an earlier one costs a few dict lookups here
        before the runtime's plan."""
        if interpret_requested():
            interpret(self, *args, grid=grid, **consts)
            return
        # The pins tkc.schedule picks for these shapes where the caller set none (pins never
        # change what a kernel computes, so the interpreter above needs none).  A plan of the
        # last launch's compilation fits only arguments of its shapes, whose pick it is.
        schedule = self._schedules.get((self.target, key), _UNKNOWN)
        if schedule is _UNKNOWN:
            schedule = self._chooser(consts, key)
        if schedule is not None:
            last = schedule.last
            if last is not None and _runtime is not None and _runtime.launch_planned(last, args, grid) is not None:
                return
            consts, key = self._scheduled(schedule, args, grid, consts, key)
        compiled = self._specialized.get((self.target, key))
        # The plan of an earlier launch like this one, if any (_runtime is bound by the first).
        if compiled is not None and _runtime is not None and _runtime.launch_planned(compiled, args, grid) is not None:
            if schedule is not None:
                schedule.last = compiled
            return
        # A launch like an earlier one that TMA's strides sent to a fallback (attention
        # backward's lse with N not a multiple of 4): its plan, without the refusal again.
        for fallback in self._fallbacks.get((self.target, key), ()):
            if _runtime is not None and _runtime.launch_planned(fallback, args, grid) is not None:
                return
        if not _any_cuda(args):
            raise TkcLaunchError(f"'{self.name}' runs on a GPU and takes CUDA torch tensors, got none; set "
                                 "TKC_INTERPRET=1 (or call tkc.interpret) to run it in the interpreter on the CPU")
        try:
            try:
                compiled = self.specialize(**consts)
            except TkcError:
                if schedule is None or not (picked := schedule.chosen(consts)):
                    raise
                # a schedule the passes refuse for this kernel: the caller's own, from now on
                consts = {c: v for c, v in consts.items() if c not in picked}
                schedule.picked[schedule.key(args, grid)] = (consts, consts_key(consts))
                compiled = self.specialize(**consts)
            _launch()(compiled, args, grid=grid)
        except TkcTmaStrideError as e:
            refused = e
            fallbacks = self._fallbacks.setdefault((self.target, key), [])
            # The pin as the caller set it, or as the kernel's own default has it (attn_train.tk
            # turns it on at D = 64 and at D = 128 without a mask).
            vectors = consts["tma_vectors"] if "tma_vectors" in consts else \
                (self.specialize(**consts).kernel_op.attributes.get("consts") or {}).get("tma_vectors")
            if vectors:
                # A vector's tensor (lse: f32[B, H, N], N not a multiple of 4): loaded per
                # thread again, the tiles still by TMA.
                consts = {**consts, "tma_vectors": False}
                try:
                    fallback = self.specialize(**consts)
                    _launch()(fallback, args, grid=grid)
                    if all(f is not fallback for f in fallbacks):
                        fallbacks.append(fallback)
                    return
                except TkcTmaStrideError as again:
                    refused = again  # a tile's strides too: that is what the caller must change
            if "tma" in consts:
                raise refused from None  # the caller chose; do not second-guess it
            # Strides TMA cannot take (a row of 130 bf16 values): the same kernel with its
            # operands loaded by every thread instead (slower, any stride).
            fallback = self.specialize(**consts, tma=False)
            _launch()(fallback, args, grid=grid)
            if all(f is not fallback for f in fallbacks):
                fallbacks.append(fallback)
            return
        if schedule is not None:
            schedule.last = compiled

    def compiled_for(self, args: tuple | list, key: tuple, grid: Any = None) -> Any:
        """The compilation a GPU call with constants ``key`` (``consts_key(consts)``)
        on ``args`` launched, with the pins tkc.schedule added; None before such a call."""
        schedule = self._schedules.get((self.target, key))
        if schedule is not None:
            picked = schedule.picked.get(schedule.key(args, grid))
            if picked is None:
                return None
            key = picked[1]
        return self._specialized.get((self.target, key))

    def pins(self, *args: Any, grid: Any = None, **consts: Any) -> dict[str, Any]:
        """The pins a call ``self(*args, grid=grid, **consts)`` on the GPU adds to ``consts``
        (tkc.schedule's choice for these shapes; {} when its schedule does not depend on them)."""
        if consts:
            args, consts = self.bind(args, consts)
        key = consts_key(consts)
        schedule = self._schedules.get((self.target, key), _UNKNOWN)
        if schedule is _UNKNOWN:
            schedule = self._chooser(consts, key)
        if schedule is None:
            return {}
        chosen, _ = self._scheduled(schedule, args, grid, consts, key)
        return {c: v for c, v in chosen.items() if c not in consts}

    def _clean(self, consts: dict[str, Any]) -> bool:
        """Whether the kernel compiles with ``consts`` without spilling (tkc.schedule.spill_free)."""
        from tkc.schedule import spill_free

        return spill_free(lambda: self.specialize(**consts))

    def _chooser(self, consts: dict[str, Any], key: tuple) -> Any:
        """The shape-dependent schedule of this kernel with ``consts`` (tkc.schedule), or None,
        kept under ``key`` for the calls after."""
        from tkc import schedule

        chosen = schedule.chooser(self.kernel_op(**consts), set(consts), self.target)
        self._schedules[self.target, key] = chosen
        return chosen

    def _scheduled(self, schedule: Any, args: tuple | list, grid: Any, consts: dict[str, Any],
                   key: tuple) -> tuple[dict[str, Any], tuple]:
        """``consts`` and their key with the pins ``schedule`` picks for these arguments' shapes,
        picked once per shape."""
        shapes = schedule.key(args, grid)
        picked = schedule.picked.get(shapes)
        if picked is None:
            from tkc.schedule import device_sms

            chosen = {**consts, **schedule.pins(args, grid, device_sms(), lambda pins: self._clean({**consts, **pins}),
                                                lambda pins: self.kernel_op(**consts, **pins))}
            picked = schedule.picked[shapes] = (chosen, consts_key(chosen))
        return picked


_UNKNOWN = object()  # a Kernel._schedules entry not looked for yet


def _any_cuda(args: tuple | list) -> bool:
    # A plain loop: this runs on every call, and a generator expression costs more.
    for a in args:
        if getattr(a, "is_cuda", False):
            return True
    return False


def kernel(fn: Callable[..., Any]) -> Kernel:
    """Decorator: make ``fn`` a tile kernel.  Put ``from __future__ import
    annotations`` at the top of the module so annotations like ``bf16[M, K]``
    are not evaluated by Python."""
    return Kernel(fn)


def load(path: str | os.PathLike, name: str | None = None) -> Kernel:
    """The kernel ``name`` of a ``.tk`` file (its only kernel by default), called like a
    ``@tkc.kernel``: ``gemm = tkc.load("gemm.tk"); gemm(a, b, c)``."""
    if isinstance(path, (str, os.PathLike)) and os.fspath(path).endswith(".py"):
        raise TkcUsageError(f"tkc.load reads .tk files; {os.fspath(path)} is Python, whose @tkc.kernel functions "
                            f"are kernels already: import it")
    return Kernel.from_file(path, name)


def interpret(k: Kernel | Module | Operation, /, *args: Any, grid: Any = None, **consts: Any) -> None:
    """Run a kernel in the reference interpreter, writing outputs in place.

    ``args`` are numpy arrays or torch tensors (CPU or CUDA: CUDA tensors are
    copied to the host and back).  ``grid`` defaults to the kernel's own
    ``grid(...)``; ``consts`` specialize a ``@tkc.kernel``.
    """
    from tkc.interpreter import run_kernel

    if isinstance(k, Kernel) and consts:
        args, consts = k.bind(args, consts)
    op = _kernel_op(k, consts, "tkc.interpret")
    host = [_to_host(a) for a in args]
    try:
        run_kernel(op, host, grid)
    finally:
        for a, h in zip(args, host):
            if h is not a:
                a.copy_(h)


def interpret_ranks(k: Kernel | Module | Operation, rank_args: list[list[Any]], /, *, grid: Any = None,
                    seed: int = 0, sms: int = 0, **consts: Any) -> None:
    """Run a multi-GPU kernel on ``len(rank_args)`` simulated ranks in the interpreter, rank
    ``r`` on the arguments ``rank_args[r]`` (numpy arrays or CPU torch tensors), writing every
    rank's outputs in place.  ``seed`` picks how the programs of all ranks interleave
    (``tkc/ranks.py``); protocol errors (deadlocks, data races across ranks) are
    ``TkcInterpretError`` naming the ranks, programs and lines.  ``sms``: what ``num_sms()``
    reads (a GPU's SM count; default: a few, so resident programs each walk several tiles)."""
    from tkc.interpreter import run_ranks

    run_ranks(_kernel_op(k, consts, "tkc.interpret_ranks"), rank_args, grid, seed, sms)


def _kernel_op(k: Kernel | Module | Operation, consts: dict[str, Any], what: str) -> Operation:
    """The kernel op to interpret: a ``@tkc.kernel`` specialized with ``consts``, or the kernel of tile IR."""
    if isinstance(k, Kernel):
        return k.kernel_op(**consts)
    if consts:
        raise TkcUsageError("constants are fixed once a module is compiled; pass them to the compiler")
    if isinstance(k, Module):
        return k.kernel()
    if isinstance(k, Operation):
        return k
    raise TkcUsageError(f"{what} takes a @tkc.kernel, a Module or a kernel op, got {type(k).__name__}")


def _to_host(x: Any) -> Any:
    """A CPU copy of a CUDA torch tensor; anything else as it is."""
    if type(x).__module__.startswith("torch") and getattr(x, "is_cuda", False):
        return x.detach().cpu()
    return x

