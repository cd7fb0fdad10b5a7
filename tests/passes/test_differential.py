"""Passes never change what a kernel computes: every kernel under
tests/passes/ gives bit-identical outputs in the interpreter before and after
its test's passes and after the default pipeline, on random inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tkc.ir.core import Module
from tkc.ir.parser import parse_module
from tkc.ir.types import ScalarType
from tkc.passes.manager import PassManager
from tkc.passes.pipeline import DEFAULT_PIPELINE

interpreter = pytest.importorskip("tkc.interpreter")

HERE = Path(__file__).parent
RUN = "// RUN: tkc opt %s -p "
# Sizes with tails: none is a multiple of the 16/32/64 tiles the kernels use.
DIMS = {"M": 100, "N": 72, "K": 70, "B": 2, "H": 2}
SEEDS = (0, 1)


def _cases() -> list[tuple[Path, str]]:
    out = []
    for p in sorted(HERE.rglob("*.tkir")):
        text = p.read_text()
        first = text.splitlines()[0]
        # Hopper-level cases do not run in the interpreter; the hopper passes are checked
        # differentially on the examples instead (interpret == emulate, tests/emulator).
        if first.startswith(RUN) and "hopper." not in text:
            passes = first[len(RUN):].split()[0]
            out.append((p, passes))
            if passes != DEFAULT_PIPELINE:
                out.append((p, DEFAULT_PIPELINE))
    return out


def _run(module: Module, name: str, seed: int) -> list:
    kernel = module.kernel(name)
    dims = {d: DIMS.get(d, 37) for a in kernel.regions[0].block.args
            for d in getattr(a.type, "dims", ()) if isinstance(d, str)}
    args = interpreter.random_args(kernel, dims, seed)
    for i, a in enumerate(kernel.regions[0].block.args):
        # random i32 scalars are positive; odd seeds take the other branches
        if isinstance(a.type, ScalarType) and a.type.dtype.is_int and seed % 2:
            args[i] = -args[i]
    ops = [op.name for op in kernel.walk()]
    # A kernel without program ids computes the same in every program: one program, since two
    # storing the same elements would be a write-write race (tkc/races.py).
    grid = (2,) if "tile.program_id" in ops else (1,)
    interpreter.run_kernel(kernel, args, grid=None if "tile.grid" in ops else grid)
    return args


def _same(a: object, b: object) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind != "f":
        return np.array_equal(a, b)
    both_nan = np.isnan(a) & np.isnan(b)
    bits_equal = a.view(np.uint32) == b.view(np.uint32)  # tells -0.0 from 0.0
    return bool(np.all(both_nan | bits_equal))


@pytest.mark.parametrize("path,passes", _cases(),
                         ids=lambda x: str(x.relative_to(HERE)) if isinstance(x, Path) else x)
def test_passes_keep_outputs(path: Path, passes: str) -> None:
    text = path.read_text()
    before = parse_module(text, str(path))
    after = parse_module(text, str(path))
    PassManager(passes).run(after)
    for op in before.ops:
        name = op.attributes["sym_name"]
        for seed in SEEDS:
            want, got = _run(before, name, seed), _run(after, name, seed)
            for param, w, g in zip(before.kernel(name).regions[0].block.args, want, got):
                if isinstance(param.type, ScalarType):
                    continue  # inputs only
                assert _same(w, g), f"@{name} seed {seed}: {param.name_hint} differs after {passes}"
