"""merge-reductions: which cross-warp reductions share one round trip, which stay alone.
What the norms' backward computes after it is checked against the interpreter in the emulator
(tests/examples/test_rows_bwd.py, test_layernorm_residual_bwd.py) and on the GPU."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.ir.core import Operation
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify
from tkc.passes.manager import PassManager
from tkc.passes.pipeline import HOPPER_PIPELINE

ROOT = pathlib.Path(__file__).resolve().parents[2]
GRID = ROOT / "tests" / "emulator" / "kernels" / "reduce_grid.tkir"


def _row_loop(path: pathlib.Path, kernel: str, consts: dict, pipeline: str | None = None,
              target: str = "sm_90a") -> list[Operation]:
    kw = {"hopper_pipeline": pipeline} if pipeline else {}
    k = compile_kernel(path, consts, stop="hopper", cache=False, kernel=kernel, target=target, **kw).kernel_op
    loop = next(op for op in k.walk() if op.name == "tile.for")
    return loop.regions[0].block.ops


def _exchanges(ops: list[Operation]) -> list[int]:
    """The parts of each cross-warp round trip, in order (1 for a lone hopper.reduce)."""
    return [len(op.results) if op.name == "hopper.reduce_group" else 1 for op in ops
            if op.name == "hopper.reduce_group" or (op.name == "hopper.reduce" and op.warp_xor)]


NORMS = [("layernorm_bwd", [2, 2]), ("rmsnorm_bwd", [2])]


@pytest.mark.parametrize("kernel, want", NORMS)
@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_a_norm_backward_row_meets_once_a_group(kernel: str, want: list[int], target: str) -> None:
    """LayerNorm: the sums of x and of g, then of d * d and g * d (each pair needs only what the
    row already has); RMSNorm: the sums of x * x and g * x at once."""
    ops = _row_loop(ROOT / "examples" / "rows_bwd.tk", kernel, {"BN": 1024, "warps": 4}, target=target)
    assert _exchanges(ops) == want


def test_without_the_pass_each_reduction_meets_on_its_own() -> None:
    ops = _row_loop(ROOT / "examples" / "rows_bwd.tk", "layernorm_bwd", {"BN": 1024, "warps": 4},
                    HOPPER_PIPELINE.replace("merge-reductions,", ""))
    assert _exchanges(ops) == [1, 1, 1, 1]


def test_the_residual_norm_backward_takes_its_two_row_sums_at_once() -> None:
    ops = _row_loop(ROOT / "examples" / "layernorm_residual_bwd.tk", "layernorm_residual_bwd", {"BN": 1024})
    assert _exchanges(ops) == [2]


def test_a_reduction_of_a_value_made_from_another_waits_for_it() -> None:
    source = '''
@kernel
def centred(x: f32[M, N], out: f32[M], BN: const = 1024, warps: const = 4):
    grid(M)
    r = program_id(0)
    xt = x[r:r+1, 0:BN]
    d = xt - (xt.sum(1) / 1024.0)[:, None]
    out[r:r+1] = (d * d).sum(1) + xt.max(1)
'''
    k = compile_kernel(source, {}, stop="hopper", cache=False).kernel_op
    ops = k.regions[0].block.ops
    # the sum and the max at once; the sum of squares needs the sum's result
    assert _exchanges(ops) == [2, 1]


def _grid(text: str) -> str:
    m = parse_module(text)
    PassManager("merge-reductions").run(m)
    verify(m)
    return print_module(m, locs=False)


def test_the_pure_ops_a_reduction_needs_move_up_to_the_group() -> None:
    layout = "#blocked<64x64, vec=2, lanes=8x4, warps=2x4>"
    square = (f"  %sq = tile.mul %xm, %xm : tile<64x64xf32, reg, {layout}>\n"
              f"  %q = hopper.reduce %sq, %s2 {{kind = \"max\", axis = 1, shuffle_xor = [1, 2], warp_xor = [1, 2]}} "
              f": tile<64xf32, reg, #slice<{layout}, axis=1>>\n")
    scratch = "  %s2 = hopper.smem_alloc {offset = 4096} : tile<8x64xf32, smem, #smem<8x64xf32, k, sw0>>\n"
    text = GRID.read_text().replace("  hopper.store %cs", square + "  hopper.store %cs", 1)
    text = text.replace("  %x0 = hopper.load", scratch + "  %x0 = hopper.load", 1)
    text = text.replace("smem_bytes = 4096", "smem_bytes = 6144")
    out = _grid(text)
    assert out.count("hopper.reduce_group") == 1 and "hopper.reduce %" not in out
    assert out.index("tile.mul %xm, %xm") < out.index("hopper.reduce_group")
    assert 'kinds = ["sum", "max", "max"]' in out


def test_a_reduction_whose_operand_is_loaded_between_stays_alone() -> None:
    """A load is not pure: it does not move up past the first reduction, nor does what needs it."""
    lines = GRID.read_text().splitlines(keepends=True)
    xm = next(i for i, line in enumerate(lines) if line.startswith("  %xm = hopper.load"))
    c = next(i for i, line in enumerate(lines) if line.startswith("  %c = hopper.reduce"))
    lines.insert(c, lines.pop(xm))  # %xm loaded after %c's reduction
    out = _grid("".join(lines))
    assert "hopper.reduce_group" not in out and out.count("hopper.reduce %") == 2


def test_a_reduction_moved_up_in_a_slice_is_not_grouped_with_what_it_feeds() -> None:
    """The row maxima share the column sums' scratch tile (so they cannot join them); the total
    of the maxima needs them: the maxima move up as its slice, the total joins the column sums,
    and the maxima, now above the group, stay alone (joining would feed the group its own result)."""
    text = GRID.read_text().replace("%r = hopper.reduce %xm, %s1", "%r = hopper.reduce %xm, %s0")
    text = text.replace("  hopper.store %cs", "  %t = hopper.reduce %r, %s1 {kind = \"sum\", axis = 0, shuffle_xor = "
                        "[4, 8, 16], warp_xor = [4]} : f32\n  hopper.store %cs", 1)
    out = _grid(text)
    assert out.index("hopper.reduce %xm, %s0") < out.index("hopper.reduce_group %x0, %r, %s0, %s1")


@pytest.mark.parametrize("seed", range(2))
def test_the_merged_grid_kernel_computes_what_the_two_did(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((60, 50)).astype(np.float32)
    got = []
    for passes in ("", "merge-reductions"):
        m = parse_module(GRID.read_text())
        if passes:
            PassManager(passes).run(m)
            assert "hopper.reduce_group" in print_module(m)
        cs, rm = np.full(50, np.nan, np.float32), np.full(60, np.nan, np.float32)
        emulate(m, [x, cs, rm], seed=seed)
        got.append((cs, rm))
    np.testing.assert_array_equal(got[0][0], got[1][0])
    np.testing.assert_array_equal(got[0][1], got[1][1])
