"""The launch grid of a kernel: the extents of its ``tile.grid`` for given arguments.

Every executor asks this one function how many programs a launch runs: the interpreter, the
emulator and the GPU runtime.  The grid's extents are computed by running only the ops they
depend on (tensor sizes, scalar arguments, constants, ``num_sms``) with the ops' meaning
(``tkc.semantics``); tensor contents are never read, so the tensors may live on a GPU.

Must not: run a program, touch a device, or convert a tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tkc import signature
from tkc.dtypes import DType, round_to
from tkc.errors import TkcInterpretError, TkcLaunchError
from tkc.ir.core import Block, BlockArgument, Module, Operation, OpResult, Value
from tkc.ir.dialects import tile
from tkc.ir.types import TensorType
from tkc.semantics import Program

__all__ = ["as_kernel", "check_args", "check_grid", "eval_grid", "eval_slice", "launch_grid", "param_name",
           "scalar_value", "shape_env"]


def as_kernel(kernel: Operation | Module) -> Operation:
    """The ``tile.kernel`` op of ``kernel`` (a module's one kernel), or a TkcLaunchError."""
    if isinstance(kernel, Module):
        kernel = kernel.kernel()
    if not isinstance(kernel, Operation) or kernel.name != "tile.kernel":
        raise TkcLaunchError(f"expected a 'tile.kernel' op, got {kernel!r}")
    return kernel


def param_name(arg: BlockArgument) -> str:
    """How errors name a parameter: its source name, else its position."""
    return arg.name_hint or f"argument {arg.index}"


def scalar_value(p: BlockArgument, dt: DType, x: Any) -> np.ndarray:
    """A scalar argument as a 0-d array of ``dt``, or a TkcLaunchError."""
    return round_to(signature.check_scalar(param_name(p), dt, x), dt)


def check_args(kernel: Operation, args: Sequence[Any]) -> None:
    """The arguments fit the kernel's signature (:func:`tkc.signature.bind`), or a TkcLaunchError."""
    signature.bind(kernel.sym_name, signature.kernel_params(kernel), args)


def _grid_op(kernel: Operation) -> Operation:
    for op in kernel.regions[0].block.ops:
        if op.name == "tile.grid":
            return op
    raise TkcInterpretError(f"kernel @{kernel.sym_name} has no grid(...) statement: write one in the kernel, "
                            f"or pass the launch's (grid= from Python, --grid from tkc run)", kernel.loc)


def eval_grid(kernel: Operation, env: dict[Value, Any], sms: int = 0) -> tuple[int, ...]:
    """Evaluate only the ops the grid extents depend on (in program order):
    other ops before ``tile.grid`` may read tensors, which need not exist here."""
    grid_op = _grid_op(kernel)
    eval_slice(kernel, grid_op.operands, env, sms, None, "grid extents must be computed from tensor sizes, "
               "scalar arguments and constants")
    grid = tuple(int(env[v]) for v in grid_op.operands)
    if any(g < 0 for g in grid):
        raise TkcInterpretError(f"grid extents are negative: {grid}", grid_op.loc)
    return grid


def eval_slice(kernel: Operation, values: Sequence[Value], env: dict[Value, Any], sms: int,
               pid: tuple[int, ...] | None, why: str) -> None:
    """Put ``values`` (of ``kernel``'s top-level block) into ``env`` by running only the ops
    they depend on, as program ``pid`` (None: ids are an error).  A value computed from a
    tensor's contents or by an op with regions (but an if of scalar arithmetic: a launch
    order's program ids) is a TkcInterpretError saying ``why``."""
    needed: set[Operation] = set()
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, OpResult) and v.owner not in needed:
            if tile.picks_scalars(v.owner):
                needed.add(v.owner)
                stack.extend(tile.outside_operands(v.owner))
                continue
            if v.owner.regions or v.owner.name in ("tile.load", "tile.store"):
                raise TkcInterpretError(why, v.owner.loc)
            needed.add(v.owner)
            stack.extend(v.owner.operands)
    ctx = Program(pid, (), env, sms=sms)
    block = Block()  # a scratch block holding the slice; ops keep their real parent
    block.ops = [op for op in kernel.regions[0].block.ops if op in needed]
    ctx.run(block)


class _Shape:
    """Stands in for a tensor while computing the grid: only its shape is read."""

    def __init__(self, shape: Sequence[int]):
        self.shape = tuple(shape)


def probe_env(kernel: Operation, size: int) -> dict[Value, Any]:
    """The kernel's tensor parameters as shapes with every symbolic dim ``size`` (scalar
    arguments left out: a slice that reads one does not evaluate): sizes a pass evaluates a
    kernel's arithmetic with where no launch says."""
    return {p: _Shape([d if isinstance(d, int) else size for d in p.type.dims])
            for p in kernel.regions[0].block.args if isinstance(p.type, TensorType)}


def launch_grid(kernel: Operation | Module, args: Sequence[Any], sms: int = 0) -> tuple[int, ...]:
    """The grid a launch of ``kernel`` with ``args`` uses: the extents of its
    ``tile.grid`` op.  Tensor contents are never read (they may live on a GPU).
    ``sms``: the device's SM count, for grids sized by ``tile.num_sms`` (default
    ``CPU_SMS``)."""
    kernel = as_kernel(kernel)
    check_args(kernel, args)
    env = shape_env(kernel, args)
    with np.errstate(all="ignore"):
        return eval_grid(kernel, env, sms)


def shape_env(kernel: Operation, args: Sequence[Any]) -> dict[Value, Any]:
    """The kernel's parameters bound to ``args`` as far as sizes go: a tensor stands for its
    shape alone (its contents are never read), a scalar is its value."""
    return {p: _Shape(x.shape) if isinstance(p.type, TensorType) else scalar_value(p, p.type.dtype, x)
            for p, x in zip(kernel.regions[0].block.args, args)}


def check_grid(grid: Any, kernel: Operation | Module | None = None) -> tuple[int, ...]:
    """A caller's grid as a tuple: 1 to 3 non-negative integers, and (given the ``kernel``) no
    axis past those of the kernel's own ``grid(...)`` longer than 1: the programs along it would
    all have program_id 0 there and redo the same work, as a persistent kernel's walk (its grid
    one axis, the programs walking its tiles) would on a caller's two-axis grid."""
    if isinstance(grid, (int, np.integer)):
        grid = (grid,)
    ok = isinstance(grid, (tuple, list)) and 1 <= len(grid) <= 3 and all(
        isinstance(g, (int, np.integer)) and not isinstance(g, bool) and g >= 0 for g in grid)
    if not ok:
        raise TkcLaunchError(f"grid must be 1 to 3 non-negative integers, got {grid!r}")
    grid = tuple(int(g) for g in grid)
    if kernel is not None:
        k = as_kernel(kernel)
        own = next((op for op in k.regions[0].block.ops if op.name == "tile.grid"), None)
        axes = len(own.operands) if own is not None else 3
        if any(g != 1 for g in grid[axes:]):
            walks = any(op.name == "tile.num_sms" for op in k.walk())
            what = ("it is persistent: give one extent, the programs that walk its tiles, or compile with "
                    "persistent=false for one program a tile") if walks and axes == 1 else \
                f"give {axes} extent{'s' if axes > 1 else ''}"
            raise TkcLaunchError(f"grid {grid}: kernel '{k.attributes.get('sym_name')}' has a grid of {axes} "
                                 f"ax{'es' if axes > 1 else 'is'}, whose programs would repeat each other's work "
                                 f"along the others; {what}")
    return grid


