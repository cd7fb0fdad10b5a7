"""The compiler's own schedule: pins chosen from the kernel and the shapes of a launch.

A kernel called without schedule pins (``@tkc.kernel``, ``tkc.load``, ``tkc.ops``, ``tkc run``)
gets the pins this module picks for the shape class of its arguments, so that a user who
writes a new kernel runs the schedule the harness would have found by search.  The choice
is made at launch, where the shapes are known, and compiled once per shape class (a few per
kernel); the pins it sets show in the kernel's ``consts`` like any other.  ``tkc compile``
without shapes compiles the unpinned schedule.

The model (docs/schedule.md has the derivation; the data is
benchmarks/data/schedule_sweep_h200.json, every schedule of the harness's search timed on
every harness shape).  It reasons about a program's loop: how many iterations it makes
(``trips``, evaluated from the shapes for the first and the last program) and how many
programs share the SMs.

- **Attention-shaped loops** (two products an iteration, the second's operand computed from
  the first's result; a tile loaded once per program before the loop):
  - ``defer_last``: the second product of iteration j runs during iteration j + 1's register
    work.  A schedule with it was the fastest or within 3% of it on all 36 attention rows,
    whatever the head dim and length.  FP8 attention too, since its P crosses the loop as the
    e4m3 words P V reads (1.03-1.11x on an H200; it ran 6-11% slower while P crossed as f32).
  - ``persistent`` when a program's loop is short: a program pays a pipeline fill and an
    epilogue nobody overlaps, about one to two iterations' worth; the persistent walk hides
    them behind the next tile's loop but costs a few percent an iteration.  In the sweep,
    persistent programs won on every row of at most ``SHORT_LOOP`` iterations on average and
    lost on every row of 16 and more without a causal mask.  Not where the second product
    takes 8-bit operands: a persistent walk keeps FP8 attention's V transposed by the
    consumers (transpose-in-producer needs the loop on its own), 0.88-0.98x at 1k tokens.
  - ``outer_stages = 1`` with ``persistent`` on a long loop (a causal tail): the per-tile Q in
    one stage, whose address then stays put through the loop (a second stage pays on short
    loops only).
  - ``persistent`` also when trip counts differ between programs (a causal mask) and the
    longest program is a large share of an SM's work (``TAIL``): programs launched one per tile
    leave the last, longest ones running alone, and the persistent walk pairs heavy tiles
    with light ones.  The share is 0.26 for D = 256 causal rows (1,024 tiles of up to 2 x
    their mean length on 132 SMs; persistent won at 4 of 6 lengths in the sweep, and 8k since
    the persistent pass walks tall columns row by row) and 0.13 for D = 128
    (2,048 tiles; it lost from 2k tokens).
  - a constant declared ``choose(...)`` (``BM: const = choose(128, 192)``) and left open by the
    caller, in a long loop walked one program a tile: the largest candidate that compiles
    without spilling.  More rows a K/V block mean fewer loads a product; 192-row tiles were in
    the fastest schedule of every D = 64 row from 2k tokens, and do not fit at D = 128 or 256.
    A candidate that shortens the loop itself (attn.tk's 192-key blocks at D = 128) only where
    the loop keeps ``LONG_LOOP`` iterations with it: causal from 8k tokens, 1.02-1.05x; at
    2k-4k it cost 1-6%.
  - ``tma_store = False`` in a long loop walked one program a tile, every program as long,
    whose stored tiles have rows of at most ``NARROW_ROW`` bytes (D = 64): the output stored
    from registers ran 1.01-1.08x faster (a measured rule: the loop is the same either way);
    not for FP8 attention, where the TMA store ran 1.03x faster.
- **An attention-shaped loop in a walk of the program's own** (a loop over tiles the kernel
  writes itself, such as ring attention's ``grid(num_sms())`` programs, multi-GPU kernels
  among them): ``defer_last`` only; the grid and the walk are the kernel's.  Ring attention
  on 4 H200s: 1.06x at 4 x 16k tokens, 1.05x at 4 x 4k.
- **Other kernels** (GEMMs among them): no pins; the passes' own defaults were within 2% of
  the fastest schedule on every GEMM row of the sweep.

Owns: which pins a launch gets when its caller sets none.  Must not: change what a kernel
computes (pins never do), or override a pin the caller set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from tkc.errors import TkcError
from tkc.grid import check_args, check_grid, eval_grid, eval_slice, shape_env
from tkc.ir.core import Operation, OpResult, Value
from tkc.ir.types import TensorType
from tkc.pins import PINS as ALL_PINS
from tkc.target import DEFAULT_TARGET

#: Average iterations a program's loop makes at or below which persistent programs pay.
SHORT_LOOP = 8
#: Average iterations below which a larger tile that shortens the loop (a key block of 192
#: rows instead of 128) is not taken: its longer fill and drain then cost more than its fewer
#: loads save (benchmarks/RESULTS.md, 2026-11-28).
LONG_LOOP = 16
#: The longest program's share of one SM's work above which a loop whose trip counts differ
#: between programs is walked by persistent programs.
TAIL = 0.2
#: The widest row (bytes) of the tiles a kernel stores after its loop for which one-program-a-tile
#: attention stores them from registers rather than by TMA.
NARROW_ROW = 128
#: The target whose timings the model is fitted to.
FITTED_TARGET = "sm_90a"
#: The SMs assumed where no GPU says (an H100 SXM's or an H200's count).
DEFAULT_SMS = 132

__all__ = ["DEFAULT_SMS", "FITTED_TARGET", "LONG_LOOP", "NARROW_ROW", "SHORT_LOOP", "TAIL", "Chooser", "chooser",
           "device_sms", "spill_free"]


class Chooser:
    """The shape-dependent schedule of one kernel: :meth:`pins` for a launch's arguments."""

    #: The pins this module may set.
    PINS = ("defer_last", "persistent", "tma_store")

    def __init__(self, kernel: Operation, loop: Operation, given: set[str], walked: bool = False):
        self.kernel, self.loop, self.given = kernel, loop, given
        #: the second product multiplies 8-bit operands (FP8 attention's P V)
        self.eight_bit = _second_product_eight_bit(loop)
        #: the loop sits in a walk over tiles the kernel writes itself: defer_last only
        self.walked = walked
        #: constants declared ``choose(...)`` that the caller left open -> their candidates
        self.choices: dict[str, list[int]] = {} if walked else {
            n: list(c) for n, c in kernel.attributes.get("choices", {}).items() if n not in given}
        # what this schedule may set
        self.picks = ("defer_last",) if walked else (*self.PINS, "outer_stages", *self.choices)
        #: :meth:`key` of a launch's arguments -> (the constants it runs with, their sorted items):
        #: the caller keeps it (``tkc.kernel.Kernel``), so a launch like an earlier one picks nothing.
        self.picked: dict[tuple, tuple[dict[str, Any], tuple]] = {}
        self.last: Any = None  # the compilation the caller launched last (its plans fit only its shapes)

    def _defers(self) -> bool:
        return "defer_last" not in self.given and "issue_ahead" not in self.given

    def chosen(self, consts: dict[str, Any]) -> dict[str, Any]:
        """The pins of ``consts`` this schedule set (not the caller)."""
        return {c: v for c, v in consts.items() if c in self.picks and c not in self.given}

    @staticmethod
    def key(args: Sequence[Any], grid: Any) -> tuple:
        """What the pins of a launch depend on: the arguments' shapes (a scalar's value), the grid."""
        return tuple(getattr(a, "shape", a) for a in args), tuple(grid) if isinstance(grid, list) else grid

    def trips(self, env: dict[Value, Any], pid: tuple[int, ...], sms: int) -> int:
        """Iterations of the loop for program ``pid``."""
        env = dict(env)
        bounds = self.loop.operands[:3]
        eval_slice(self.kernel, bounds, env, sms, pid, "the loop's bounds read a tensor")
        lo, hi, step = (int(env[v]) for v in bounds)
        return max(0, -(-(hi - lo) // step)) if step > 0 else 0

    def pins(self, args: Sequence[Any], grid: Sequence[int] | None, sms: int,
             clean: Callable[[dict[str, Any]], bool] | None = None,
             relowered: Callable[[dict[str, Any]], Operation] | None = None) -> dict[str, Any]:
        """The pins (and ``choose(...)`` constants) for a launch on ``args`` (``grid``: the
        caller's, else the kernel's) on a GPU of ``sms`` SMs; {} where the shapes do not say (a
        bound read from a tensor).  A caller's grid is one program per tile: no persistent
        programs then.  ``clean(pins)``: whether the kernel with these pins compiles without
        spilling (a larger tile is picked only then; None: no larger tile).  ``relowered(pins)``:
        the kernel's tile IR with them, whose loop says whether a larger tile shortens it (a
        key block), taken then only where the loop stays ``LONG_LOOP`` long (None: not asked)."""
        grid_given = grid
        try:
            check_args(self.kernel, args)  # a bad call picks nothing: the launch says what is wrong
            if self.walked:
                return {"defer_last": True} if self._defers() else {}
            tiles, first, last = self._ends(args, grid, sms)
        except TkcError:
            return {}
        if not tiles:
            return {}
        pins: dict[str, Any] = {}
        if self._defers():
            pins["defer_last"] = True
        mean, longest = (first + last) / 2, max(first, last)
        if "persistent" not in self.given and grid_given is None:  # a caller's grid counts tiles
            slots = sms * int(self.kernel.attributes["consts"].get("ctas_per_sm") or 1)
            tail = first != last and longest * slots > TAIL * tiles * mean
            # Not for a short loop whose second product is 8-bit: the persistent walk keeps
            # transpose-in-producer from taking FP8 attention's transposing copy of V off the
            # consumers (1k tokens: 0.88-0.98x one program a tile on an H200).
            pins["persistent"] = (mean <= SHORT_LOOP and not self.eight_bit) or tail
        if pins.get("persistent") and mean > SHORT_LOOP and "outer_stages" not in self.given:
            # A long loop walked persistently (a causal tail): the per-tile Q tile in one stage.
            # Its second stage lands the next tile's Q during this tile's loop, which pays on
            # short loops (512-1k tokens: 1.06-1.16x), but the stage's address then changes
            # from tile to tile and the loop's descriptor arithmetic leaves the uniform
            # datapath: 0.93-0.99x from 2k tokens (D = 128 and 64; benchmarks/RESULTS.md).
            pins["outer_stages"] = 1
        if mean > SHORT_LOOP and not pins.get("persistent") and first == last and "tma_store" not in self.given \
                and _narrow_output(self.kernel) and not self.eight_bit:
            # One program a tile, every one as long, rows of at most NARROW_ROW bytes stored:
            # from registers (D = 64 without a mask, 2k-16k tokens: 1.01-1.08x in two sweeps;
            # with a mask's uneven programs 0.95-1.00x, and rows of 256 bytes or more 0.83-0.99x;
            # FP8 attention at D = 64 in 192-row tiles 0.97x, so not where P V is 8-bit).
            pins["tma_store"] = False
        if mean > SHORT_LOOP and not pins.get("persistent") and clean is not None:
            # A long loop, one program a tile: the largest tile that compiles without spilling
            # (more rows a K/V block, fewer loads a product; 192-row tiles at D = 64: 1.12-1.28x).
            # A tile that shortens the loop itself (192-key blocks) pays only where the loop
            # stays long with it: causal D = 128 at 8k-16k tokens 1.02-1.05x, at 2k-4k 0.94-0.99x.
            for name, options in self.choices.items():
                for size in sorted((o for o in options if o > options[0]), reverse=True):
                    trial = {**pins, name: size}
                    if relowered is not None and (loop := _attention_loop(other := relowered(trial))) is not None:
                        try:
                            _, first_with, last_with = Chooser(other, loop, self.given)._ends(args, grid_given, sms)
                        except TkcError:
                            first_with = last_with = mean  # (it does not say: as long as before)
                        shorter = (first_with + last_with) / 2
                        if shorter < mean and shorter < LONG_LOOP:
                            continue
                    if clean(trial):
                        pins[name] = size
                        break
        return pins

    def _ends(self, args: Sequence[Any], grid: Sequence[int] | None, sms: int) -> tuple[int, int, int]:
        """The tiles of a launch on ``args`` (``grid``: the caller's, else the kernel's) and the
        loop's iterations in its first and last programs (0, 0 without tiles); a TkcError where
        the shapes do not say (a bound read from a tensor)."""
        env = shape_env(self.kernel, args)
        grid = check_grid(grid) if grid is not None else eval_grid(self.kernel, dict(env), sms)
        if not math.prod(grid):
            return 0, 0, 0
        return (math.prod(grid), self.trips(env, tuple(0 for _ in grid), sms),
                self.trips(env, tuple(g - 1 for g in grid), sms))


def device_sms() -> int:
    """The SMs of torch's current CUDA device, else ``DEFAULT_SMS``."""
    import torch

    if not torch.cuda.is_available():
        return DEFAULT_SMS
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def spill_free(build: Callable[[], Any]) -> bool:
    """Whether ``build()`` (a compilation to cubin) succeeds without ptxas spilling or
    serializing its products; False where the compiler refuses it or ptxas did not run."""
    try:
        built = build()
    except TkcError:
        return False
    # ptxas's C7512 (wgmma serialized for want of registers) costs more than a spill would
    return built.resources is not None and not built.resources.spills \
        and not any("C7512" in w for w in built.ptxas_warnings)


def chooser(kernel: Operation, given: set[str], target: str = DEFAULT_TARGET.name) -> Chooser | None:
    """The shape-dependent schedule of ``kernel`` (tile IR, before the passes) for ``target``
    when the caller set the pins in ``given``; None when its schedule does not depend on
    shapes.  The model is fitted to sm_90a (an H200): other targets get no pins.  A pin the
    kernel declares as a parameter (``defer_last: const = False``) is given as much as one the
    caller sets: either is in the kernel's constants."""
    given = given | {n for n in kernel.attributes.get("consts") or {} if n in ALL_PINS}
    open_choices = set(kernel.attributes.get("choices", {})) - given
    ranks = any(isinstance(p.type, TensorType) and p.type.ranks for p in kernel.regions[0].block.args)
    if target != FITTED_TARGET or set(Chooser.PINS) <= given and not open_choices:
        return None
    loop = None if ranks else _attention_loop(kernel)  # a multi-GPU kernel's grid is its own
    if loop is not None:
        return Chooser(kernel, loop, given)
    walked = _walked_attention_loop(kernel)
    return Chooser(kernel, walked, given, walked=True) if walked is not None else None


def _attention_loop(kernel: Operation) -> Operation | None:
    """The kernel's top-level loop when it is attention-shaped: two products an iteration, the
    second's first operand computed from the first's result, and a tile loaded before it."""
    ops = kernel.regions[0].block.ops
    loops = [op for op in ops if op.name == "tile.for"]
    if len(loops) != 1 or not any(op.name == "tile.load" for op in ops[:ops.index(loops[0])]):
        return None
    return loops[0] if _attention_shaped(loops[0]) else None


def _walked_attention_loop(kernel: Operation) -> Operation | None:
    """The kernel's one attention-shaped loop when it sits in a loop at the top level (a walk
    over tiles the programs take themselves), a tile loaded before it in its own block."""
    found = [op for top in kernel.regions[0].block.ops if top.name == "tile.for"
             for op in top.walk() if op is not top and op.name == "tile.for" and _attention_shaped(op)]
    if len(found) != 1:
        return None
    ops = found[0].parent.ops
    return found[0] if any(op.name == "tile.load" for op in ops[:ops.index(found[0])]) else None


def _narrow_output(kernel: Operation) -> bool:
    """Whether every tile the kernel stores at its top level (after its loop) has rows of at most
    ``NARROW_ROW`` bytes, and it stores one."""
    stores = [op for op in kernel.regions[0].block.ops if op.name == "tile.store"]
    return bool(stores) and all(op.box[-1] * op.value.type.dtype.bits // 8 <= NARROW_ROW for op in stores)


def _attention_shaped(loop: Operation) -> bool:
    """Two products an iteration, the second's first operand computed from the first's result."""
    products = [op for op in _body_ops(loop) if op.name == "tile.mma"]
    return len(products) == 2 and _depends_on(products[1].operands[0], products[0])


def _second_product_eight_bit(loop: Operation) -> bool:
    """Whether the loop's second product takes an 8-bit operand (FP8 attention's P V)."""
    products = [op for op in _body_ops(loop) if op.name == "tile.mma"]
    return len(products) == 2 and any(v.type.dtype.bits == 8 for v in products[1].operands[:2])


def _body_ops(loop: Operation) -> list[Operation]:
    """The ops of ``loop``'s body and of the ifs in it (not of nested loops)."""
    out: list[Operation] = []
    stack = [loop.regions[0].block]
    while stack:
        for op in stack.pop().ops:
            out.append(op)
            if op.name != "tile.for":
                stack.extend(r.block for r in op.regions)
    return out


def _depends_on(value: Value, op: Operation) -> bool:
    """Whether ``value`` is computed from ``op``'s result (through ops in the same loop)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if not isinstance(v, OpResult) or id(v.owner) in seen:
            continue
        if v.owner is op:
            return True
        seen.add(id(v.owner))
        stack.extend(v.owner.operands)
        for r in v.owner.regions:  # an if's yielded values
            for inner in r.block.ops:
                if inner.name == "tile.yield":
                    stack.extend(inner.operands)
    return False
