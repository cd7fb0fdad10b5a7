"""``cluster_max`` / ``cluster_min`` / ``cluster_sum``: the frontend's checks, and the
interpreter's meaning (the programs of a cluster combine their tiles, in rank order) on
small kernels, including programs that disagree about reaching a reduction."""

from __future__ import annotations

import numpy as np
import pytest

from tkc.errors import TkcInterpretError, TkcLaunchError, TkcTypeError
from tkc.frontend import compile_source
from tkc.interpreter import run_kernel

PARTS = """@kernel
def parts(x: f32[M, 16], y: f32[M, 16], cluster: const = 4):
    grid(M)
    p = program_id(0)
    t = x[p:p+1, 0:16]
    y[p:p+1, 0:16] = (cluster_max(t) + cluster_sum(t) * 1000.0) - cluster_min(t)
"""


def test_combines_the_programs_of_each_cluster():
    k = compile_source(PARTS, "parts.tk").kernel()
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    y = np.full_like(x, np.nan)
    run_kernel(k, [x, y])
    for c in range(2):
        rows = x[4 * c:4 * c + 4]
        total = ((rows[0] + rows[1]) + rows[2]) + rows[3]  # rank order, f32
        want = (rows.max(0) + total * np.float32(1000)) - rows.min(0)
        np.testing.assert_array_equal(y[4 * c:4 * c + 4], np.broadcast_to(want, (4, 16)))


def test_the_pin_passed_without_a_declaration():
    # -D cluster=4 (or consts={"cluster": 4}) is the pin itself: the kernel need not declare it.
    k = compile_source(PARTS.replace(", cluster: const = 4", ""), "parts.tk", {"cluster": 4}).kernel()
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    y = np.full_like(x, np.nan)
    run_kernel(k, [x, y])
    total = ((x[0] + x[1]) + x[2]) + x[3]
    np.testing.assert_array_equal(y, np.broadcast_to((x.max(0) + total * np.float32(1000)) - x.min(0), (4, 16)))


def test_grid_of_part_clusters():
    k = compile_source(PARTS, "parts.tk").kernel()
    with pytest.raises(TkcLaunchError, match="multiple of 4"):
        run_kernel(k, [np.zeros((6, 16), np.float32), np.zeros((6, 16), np.float32)])


def test_programs_that_do_not_all_reach_a_reduction():
    src = """@kernel
def k(x: f32[M, 16], y: f32[M, 16], cluster: const = 2):
    grid(M)
    p = program_id(0)
    t = x[p:p+1, 0:16]
    if p % 2 == 0:
        t = cluster_sum(t)
    y[p:p+1, 0:16] = t
"""
    k = compile_source(src, "k.tk").kernel()
    with pytest.raises(TkcInterpretError, match=r"programs \[\(0,\)\] reach this cluster reduction \(its first "
                                                 r"time\) while programs \[\(1,\)\] of their cluster do not"):
        run_kernel(k, [np.zeros((2, 16), np.float32), np.zeros((2, 16), np.float32)])


@pytest.mark.parametrize("src,message", [
    ("def k(x: f32[M, 16], y: f32[M, 16]):\n    grid(M)\n    y[0:1, 0:16] = cluster_sum(x[0:1, 0:16])\n",
     "declare or pass the pin cluster"),
    ("def k(x: bf16[M, 16], y: bf16[M, 16], cluster: const = 2):\n    grid(M)\n"
     "    y[0:1, 0:16] = cluster_sum(x[0:1, 0:16])\n", "combines an f32 tile"),
    ("def k(x: f32[M, 16], y: f32[M, 16], cluster: const = 2):\n    grid(M)\n    s = cluster_max(1.0)\n",
     "combines an f32 tile"),
])
def test_frontend_errors(src, message):
    with pytest.raises(TkcTypeError, match=message):
        compile_source("@kernel\n" + src, "k.tk")
