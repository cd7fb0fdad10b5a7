"""The persistent pass: which kernels it takes, the grouped tile order, and that the
persistent kernel computes exactly what the original does (the interpreter runs both, with
CPU_SMS programs walking several tiles each)."""

from __future__ import annotations

import math
import re
import pathlib

import numpy as np
import pytest

from tkc.errors import TkcUnsupportedError
from tkc.frontend import compile_file, compile_source
from tkc.grid import launch_grid
from tkc.interpreter import random_args, run_kernel
from tkc.semantics import CPU_SMS
from tkc.ir.printer import print_module
from tkc.passes.manager import PassManager
from tkc.passes.pipeline import DEFAULT_PIPELINE

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def compiled(name: str, consts: dict, passes: str = "", source: str | None = None):
    m = compile_source(source, name, dict(consts)) if source else compile_file(str(EXAMPLES / name), consts)
    PassManager(DEFAULT_PIPELINE + ("," + passes if passes else "")).run(m)
    return m


@pytest.mark.parametrize("name,consts,dims", [
    ("gemm.tk", {"BM": 64, "BN": 64, "BK": 32}, {"M": 300, "N": 200, "K": 72}),   # 5 x 4 tiles
    ("gemm.tk", {"BM": 64, "BN": 64, "BK": 32}, {"M": 64, "N": 1100, "K": 40}),   # one tile row
    ("gemm.tk", {"BM": 64, "BN": 64, "BK": 32}, {"M": 1100, "N": 50, "K": 40}),   # one tile column
    ("gemm_fp8.tk", {"BM": 64, "BN": 64, "BK": 64}, {"M": 200, "N": 136, "K": 80}),
])
def test_same_results_in_fewer_programs(name, consts, dims):
    before = compiled(name, consts).kernel()
    after = compiled(name, consts, "persistent").kernel()
    assert "tile.num_sms" in print_module(compiled(name, consts, "persistent"))
    a, b = random_args(before, dims, 3), random_args(after, dims, 3)
    out = next(i for i, p in enumerate(after.regions[0].block.args) if p.name_hint == "c")
    b[out][...] = np.nan  # every element must be written by some program
    run_kernel(before, a)
    run_kernel(after, b)
    np.testing.assert_array_equal(a[out], b[out])
    tiles = math.prod(launch_grid(before, a))
    assert launch_grid(after, b) == (min(tiles, CPU_SMS),)
    assert launch_grid(after, b, sms=132) == (min(tiles, 132),)


def test_attention_is_not_gemm_shaped_but_can_be_pinned():
    assert "tile.num_sms" not in print_module(compiled("attn.tk", {}, "persistent"))
    src = (EXAMPLES / "attn.tk").read_text().replace("causal: const = False)",
                                                      "causal: const = False, persistent: const = True)")
    m = compiled("attn.tk", {}, "persistent", src)
    assert "tile.num_sms" in print_module(m)
    before = compiled("attn.tk", {"D": 64, "BM": 64, "BN": 64}).kernel()
    dims = {"B": 1, "H": 3, "N": 100}
    m2 = compiled("attn.tk", {"D": 64, "BM": 64, "BN": 64}, "persistent", src)
    a, b = random_args(before, dims, 1), random_args(m2.kernel(), dims, 1)
    run_kernel(before, a)
    run_kernel(m2.kernel(), b)
    np.testing.assert_array_equal(a[3], b[3])


def test_pinned_off():
    src = (EXAMPLES / "gemm.tk").read_text().replace("BK: const = 64)", "BK: const = 64, persistent: const = False)")
    assert "tile.num_sms" not in print_module(compiled("gemm.tk", {}, "persistent", src))


def test_pinned_on_a_grid_it_cannot_take():
    src = """@kernel
def k(x: f32[N], y: f32[N], persistent: const = True):
    grid(cdiv(N, 16), 1, 1)
    i = program_id(0)
    y[i*16:(i+1)*16] = x[i*16:(i+1)*16]
"""
    with pytest.raises(TkcUnsupportedError, match="persistent = True: a persistent kernel walks 1-D or 2-D grids"):
        compiled("k.tk", {}, "persistent", src)


def test_one_dimensional_grid():
    src = """@kernel
def k(x: f32[N], y: f32[N], persistent: const = True):
    grid(cdiv(N, 16))
    i = program_id(0)
    y[i*16:(i+1)*16] = x[i*16:(i+1)*16] * 2.0
"""
    before = compiled("k.tk", {}, "", src.replace(", persistent: const = True", "")).kernel()
    after = compiled("k.tk", {}, "persistent", src).kernel()
    a, b = random_args(before, {"N": 200}, 0), random_args(after, {"N": 200}, 0)
    b[1][...] = np.nan
    run_kernel(before, a)
    run_kernel(after, b)
    np.testing.assert_array_equal(a[1], b[1])


def test_one_dimensional_grid_reads_program_id_1_as_0():
    """In a 1-D grid, program_id(1) is 0 and num_programs(1) is 1, inside the tile loop too."""
    src = """@kernel
def k(x: f32[N, C], y: f32[N, C], persistent: const = True):
    grid(cdiv(N, 16))
    i = program_id(0)
    j = program_id(1) * 16 + (num_programs(1) - 1) * 16
    y[i*16:(i+1)*16, j:j+16] = x[i*16:(i+1)*16, j:j+16] + 1.0
"""
    before = compiled("k.tk", {}, "", src.replace(", persistent: const = True", "")).kernel()
    after = compiled("k.tk", {}, "persistent", src).kernel()
    a, b = random_args(before, {"N": 100, "C": 32}, 0), random_args(after, {"N": 100, "C": 32}, 0)
    a[1][...] = np.nan
    b[1][...] = np.nan
    run_kernel(before, a)
    run_kernel(after, b)
    np.testing.assert_array_equal(a[1], b[1])


def test_gemm_walks_tiles_in_groups_of_rows():
    text = print_module(compiled("gemm.tk", {}, "persistent"), locs=False)
    assert "%tile_row = tile.add" in text and "tile.constant {value = 8}" in text


def test_attention_walks_the_query_blocks_of_a_head_first():
    """K and V depend on program_id(1) only: axis 0 goes fastest, as in a launch of one program
    per tile, so the programs running together share one head's K and V in L2."""
    text = print_module(compiled("attn.tk", {"persistent": True}, "persistent"), locs=False)
    assert "%tile_row = tile.rem %t, %" in text and "%tile_col = tile.floordiv %t, %" in text


@pytest.mark.parametrize("per_sm", [1, 2])
def test_programs_fill_every_slot_of_an_sm(per_sm):
    consts = {"D": 64, "BM": 64, "BN": 64, "persistent": True, "ctas_per_sm": per_sm}
    before, after = compiled("attn.tk", consts).kernel(), compiled("attn.tk", consts, "persistent").kernel()
    a, b = random_args(before, {"B": 2, "H": 8, "N": 300}, 0), random_args(after, {"B": 2, "H": 8, "N": 300}, 0)
    b[3][...] = np.nan
    tiles = math.prod(launch_grid(before, a))
    assert launch_grid(after, b) == (min(tiles, CPU_SMS * per_sm),)
    run_kernel(before, a)
    run_kernel(after, b)
    np.testing.assert_array_equal(a[3], b[3])


# Over 4 programs (CPU_SMS): 5 query blocks (more than 4 / 2: row by row, heads fastest) in
# 10 / 15 / 60 tiles (2 rounds and 2 tiles, forward; 3 rounds and 3, backward; 15 rounds), and
# 2 query blocks (a head after another) in 30 / 12 tiles.
@pytest.mark.parametrize("B, H, N", [(1, 2, 300), (1, 3, 300), (3, 4, 300), (3, 5, 100), (2, 3, 128)])
def test_causal_attention_programs_take_tiles_in_a_snake(B, H, N):
    """Causal: the K/V loop's length grows with the query block (program_id(0)).  Rows go
    from the last; round k goes to programs forward when k is even, backward when odd, the
    last round partial."""
    consts = {"D": 64, "BM": 64, "BN": 64, "persistent": True, "causal": True}
    text = print_module(compiled("attn.tk", consts, "persistent"), locs=False)
    assert re.search(r"%tile_row = tile.sub %\w+, %", text) and re.search(r"%tile_col = tile.add %\w+, %", text)
    before, after = compiled("attn.tk", consts).kernel(), compiled("attn.tk", consts, "persistent").kernel()
    dims = {"B": B, "H": H, "N": N}
    a, b = random_args(before, dims, 2), random_args(after, dims, 2)
    b[3][...] = np.nan
    run_kernel(before, a)
    run_kernel(after, b)
    np.testing.assert_array_equal(a[3], b[3])



# ------------------------------------------------------------------ clusters
@pytest.mark.parametrize("cluster", [2, 4])
@pytest.mark.parametrize("dims", [{"M": 300, "N": 200, "K": 72},    # 5 tile rows: the last cluster's
                                  {"M": 1100, "N": 50, "K": 40},    # rows run past the grid
                                  {"M": 64, "N": 1100, "K": 40}])   # one tile row
def test_clusters_walk_cluster_tiles_and_compute_the_same(cluster, dims):
    """Programs c*n .. c*n + n - 1 take tile rows of one cluster tile, the same column; a row
    past the grid lies past the tensor and stores nothing (no element is stored twice: the
    interpreter refuses that as a race)."""
    consts = {"BM": 64, "BN": 64, "BK": 32}
    before = compiled("gemm.tk", consts).kernel()
    after = compiled("gemm.tk", {**consts, "cluster": cluster}, "persistent").kernel()
    a, b = random_args(before, dims, 4), random_args(after, dims, 4)
    b[2][...] = np.nan
    run_kernel(before, a)
    run_kernel(after, b)
    np.testing.assert_array_equal(a[2], b[2])
    rows, cols = -(-dims["M"] // 64), -(-dims["N"] // 64)
    cluster_tiles = -(-rows // cluster) * cols
    assert launch_grid(after, b, sms=132) == (cluster * min(cluster_tiles, 132 // cluster),)


def test_a_cluster_needs_a_gemm_shaped_kernel():
    src = (EXAMPLES / "attn.tk").read_text().replace("causal: const = False)",
                                                      "causal: const = False, persistent: const = True, "
                                                      "cluster: const = 2)")
    with pytest.raises(TkcUnsupportedError, match="cluster = 2: a cluster's programs share the copies of a "
                                                  "GEMM-shaped kernel"):
        compiled("attn.tk", {}, "persistent", src)


@pytest.mark.parametrize("value", [3, 8, 0])
def test_cluster_sizes(value):
    from tkc.errors import TkcUsageError

    with pytest.raises(TkcUsageError, match="cluster"):
        compiled("gemm.tk", {"cluster": value}, "persistent")


def test_tall_causal_columns_go_row_by_row(monkeypatch):
    """32 query blocks a head (ROW_WALK) on 80 programs: more than two columns a round, yet
    walked row by row (heaviest first everywhere); same result as a program per tile."""
    import tkc.semantics

    monkeypatch.setattr(tkc.semantics, "CPU_SMS", 80)
    consts = {"D": 64, "BM": 64, "BN": 64, "persistent": True, "causal": True}
    before, after = compiled("attn.tk", consts).kernel(), compiled("attn.tk", consts, "persistent").kernel()
    dims = {"B": 1, "H": 3, "N": 2048}
    a, b = random_args(before, dims, 3), random_args(after, dims, 3)
    b[3][...] = np.nan
    assert launch_grid(after, b) == (80,)
    run_kernel(before, a)
    run_kernel(after, b)
    np.testing.assert_array_equal(a[3], b[3])


# ------------------------------------------------------------------ longest first
#: A loop whose length depends on the row, either way (``rev``: the first rows longest), that
#: writes each program's trip count and its sum.
UNEVEN = """@kernel
def k(x: f32[R, C], n: i32[R, C], total: f32[R, C], rev: const = False):
    grid(R, C)
    i = program_id(0)
    c = program_id(1)
    trips = i + 1
    if rev:
        trips = R - i
    acc = 0.0
    for t in range(trips):
        acc = acc + x[i, c]
    n[i, c] = trips
    total[i, c] = acc
"""


@pytest.mark.parametrize("rev", [False, True])
@pytest.mark.parametrize("R, C, sms", [(16, 5, 40), (20, 3, 4), (17, 9, 132), (8, 3, 40)])
def test_longest_first_takes_every_tile_once(monkeypatch, rev, R, C, sms):
    """Groups of max(sms // R, 1) columns, the last group partial; every tile taken (R x C
    programs, none left unwritten: each once), whichever end of the rows runs the longer loop
    (the first: pinned, the grid's order starting each column longest first already), and with
    8 rows, which keep the grid's order."""
    import tkc.semantics

    monkeypatch.setattr(tkc.semantics, "CPU_SMS", sms)
    consts = {"rev": rev, "longest_first": True} if rev else {"rev": rev}
    m = compiled("k", consts, "persistent", UNEVEN)
    text = print_module(m, locs=False)
    assert "%tile_row, %tile_col = tile.if" in text
    before, after = compiled("k", consts, "", UNEVEN).kernel(), m.kernel()
    a, b = random_args(before, {"R": R, "C": C}, 4), random_args(after, {"R": R, "C": C}, 4)
    for args in (a, b):
        args[1][...], args[2][...] = -1, np.nan
    run_kernel(before, a)
    run_kernel(after, b)
    for i in (1, 2):
        np.testing.assert_array_equal(a[i], b[i])
    assert not np.isnan(b[2]).any()
    rows = np.arange(R)[:, None]
    np.testing.assert_array_equal(b[1], np.broadcast_to(R - rows if rev else rows + 1, (R, C)))


@pytest.mark.parametrize("R", [20, 8])
def test_longest_first_launch_order(R: int):
    """The remapped ids in launch order on 40 SMs: with 20 rows, 3 columns in groups of two
    columns and one, rows from the longer end, columns fastest within a group; with 8 rows (under
    LONGEST_FIRST_ROWS) the grid's own order."""
    from tkc.semantics import Program

    for rev, rows in ((False, list(range(R - 1, -1, -1))), (True, list(range(R)))):
        kernel = compiled("k", {"rev": rev, "longest_first": True}, "persistent", UNEVEN).kernel()
        body = kernel.regions[0].block
        order = next(op for op in body.ops if op.name == "tile.if" and len(op.results) == 2)
        got = []
        for pid in range(R * 3):
            env = {p: None for p in body.args}
            env.update(zip(body.args[:3], [np.zeros((R, 3), np.float32), np.zeros((R, 3), np.int32),
                                            np.zeros((R, 3), np.float32)]))  # (only their shapes are read)
            ctx = Program((pid % R, pid // R), (), env, sms=40)
            ctx.run(_up_to(body, order))
            got.append((int(ctx.env[order.results[0]]), int(ctx.env[order.results[1]])))
        if R >= 16:
            want = [(r, c) for r in rows for c in (0, 1)] + [(r, 2) for r in rows]
        else:
            want = [(r, c) for c in range(3) for r in range(R)]
        assert got == want


def _up_to(body, last):
    """A scratch block of ``body``'s ops up to ``last`` (they keep their real parent)."""
    from tkc.ir.core import Block

    block = Block()
    block.ops = body.ops[:body.ops.index(last) + 1]
    return block


@pytest.mark.parametrize("pins, runs", [({"longest_first": False}, False), ({"persistent": True}, False),
                                        ({}, True)])
def test_longest_first_only_one_program_a_tile_and_unpinned(pins, runs):
    text = print_module(compiled("attn.tk", {"causal": True, **pins}, "persistent"), locs=False)
    assert ("%tile_row, %tile_col = tile.if" in text) == runs
    assert "%tile_row, %tile_col = tile.if" not in print_module(compiled("attn.tk", {}, "persistent"), locs=False)


def test_longest_first_keeps_a_grid_whose_columns_start_longest_first():
    """The first rows run the longer loop (attention's backward): the grid's order already
    starts each column's longest programs first; reordered only where pinned."""
    assert "tile_row" not in print_module(compiled("k", {"rev": True}, "persistent", UNEVEN), locs=False)
    text = print_module(compiled("attn_train.tk", {"causal": True}, "persistent"), locs=False)
    bwd = text[text.index("tile.kernel @attn_bwd "):]
    fwd = text[text.index("tile.kernel @attn_fwd"):text.index("tile.kernel @attn_bwd_pre")]
    assert "tile_row" not in bwd and "%tile_row, %tile_col = tile.if" in fwd


@pytest.mark.parametrize("source, message", [
    (UNEVEN.replace("rev: const = False", "rev: const = False, longest_first: const = True").replace(
        "    total[i, c] = acc", "    wait(n[0, 0] == 1)\n    total[i, c] = acc"),
     "longest_first = True: a program waits for a flag another raises"),
    ("""@kernel
def k(x: f32[R, C], y: f32[R, C], longest_first: const = True):
    grid(R, C)
    y[program_id(0), program_id(1)] = x[program_id(0), program_id(1)]
""", "longest_first = True: no loop at the kernel's top level runs a number of iterations that depends on program_id"),
])
def test_longest_first_pinned_where_it_cannot_go(source, message):
    with pytest.raises(TkcUnsupportedError, match=message):
        compiled("k", {}, "persistent", source)


def test_longest_first_leaves_bounds_it_cannot_evaluate_alone():
    """A loop bound that divides by zero at the pass's probe sizes: the grid's order, no error."""
    src = UNEVEN.replace("    trips = i + 1\n", "    trips = (i + 1) // (R - 4096)\n")
    assert "tile_row" not in print_module(compiled("k", {}, "persistent", src), locs=False)
