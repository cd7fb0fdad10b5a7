"""Deferred loads (tkc/codegen/deferred.py): which loads a store emits run by run, the order
of the accesses on the side by runs, and the registers it saves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tkc.codegen.deferred import LOOKAHEAD, store_plan
from tkc.codegen.lower import kernel_to_ptx
from tkc.codegen.ptxas import assemble
from tkc.frontend import compile_source
from tkc.ir.core import uses
from tkc.passes.manager import PassManager
from tkc.passes.pipeline import DEFAULT_PIPELINE, HOPPER_PIPELINE

from test_lower import _example


def _deferred_tensors(kernel) -> list[str]:
    """The parameter names of the deferred loads' tensors, in program order."""
    deferred = store_plan(kernel).deferred
    return [op.tensor.name_hint for op in kernel.walk() if op in deferred]


@pytest.mark.parametrize("name,consts,want", [
    # One-block branch: w and bias; two-sweep branch: w and bias again.  x stays eager.
    ("layernorm.tk", {}, ["w", "bias", "w", "bias"]),
    ("layernorm_split.tk", {}, ["w", "bias", "w", "bias"]),
    ("rmsnorm.py", {"BM": 1, "BN": 4096}, ["w"]),
    # 16 x 256 blocks: a thread's part of the weight row is one 16-byte run, which the store's
    # lookahead would issue before its first access anyway.
    ("rmsnorm.py", {}, []),
    # Nothing is broadcast into a store: softmax's row statistics are reductions, not loads.
    ("softmax.tk", {}, []),
    ("softmax_split.tk", {}, []),
    ("attn.tk", {"D": 64, "tma_store": False}, []),
    ("gemm.tk", {"tma_store": False}, []),
])
def test_the_examples_defer_their_weight_rows(name: str, consts: dict, want: list) -> None:
    assert _deferred_tensors(_example(name, consts).kernel()) == want


def _kernel(src: str, columns: int = 4096):
    m = compile_source(src.replace("C", str(columns)), "t.tk", {})
    PassManager(DEFAULT_PIPELINE).run(m)
    PassManager(HOPPER_PIPELINE).run(m)
    return m.kernel()


HEAD = "@kernel\ndef k(x: bf16[M, N], w: bf16[N], y: bf16[M, N], s: f32[M]):\n    grid(M)\n"
ROW = "    xt = x[r:r+1, 0:C].to(f32)\n    wt = w[0:C].to(f32)\n"


@pytest.mark.parametrize("body,want", [
    # Broadcast into the store and used nowhere else: deferred.
    ("    y[r:r+1, 0:C] = (xt * wt[None, :]).to(bf16)\n", ["w"]),
    # Also reduced: the whole row is needed before the store.
    ("    y[r:r+1, 0:C] = (xt * wt[None, :]).to(bf16)\n    s[r:r+1] = wt[None, :].sum(1)\n", []),
    # Feeds two stores: each would load it again.
    ("    y[r:r+1, 0:C] = (xt * wt[None, :]).to(bf16)\n    y[r+1:r+2, 0:C] = (xt + wt[None, :]).to(bf16)\n", []),
    # The kernel writes w: reading it later could see the kernel's own store.
    ("    y[r:r+1, 0:C] = (xt * wt[None, :]).to(bf16)\n    w[0:C] = wt.to(bf16)\n", []),
    # The store is inside a loop, the load outside: the load is not repeated per iteration.
    ("    for j in range(2):\n        y[r+j:r+j+1, 0:C] = (xt * wt[None, :]).to(bf16)\n", []),
])
def test_which_loads_are_deferred(body: str, want: list) -> None:
    src = HEAD + "    r = program_id(0)\n" + ROW + body
    assert _deferred_tensors(_kernel(src)) == want


def test_a_row_the_lookahead_covers_stays_eager() -> None:
    """256 columns over 128 threads: 16 B of w a thread, one run."""
    src = HEAD + "    r = program_id(0)\n" + ROW + "    y[r:r+1, 0:C] = (xt * wt[None, :]).to(bf16)\n"
    assert _deferred_tensors(_kernel(src, 256)) == []


def test_a_load_of_the_stored_tiles_shape_stays_eager() -> None:
    """x has the stored tile's shape: its loads stay all in flight together."""
    src = HEAD + "    r = program_id(0)\n    y[r:r+1, 0:C] = (x[r:r+1, 0:C].to(f32) * 2.0).to(bf16)\n"
    assert _deferred_tensors(_kernel(src)) == []


def _by_runs_accesses(ptx: str) -> list[list[str]]:
    """Per basic block holding a vector store: its global vector accesses in order, as
    'ld'/'st'."""
    out, cur = [], []
    for ln in ptx.splitlines():
        ln = ln.strip()
        if ln.endswith(":") or "bra" in ln.split():
            if "st" in cur:
                out.append(cur)
            cur = []
        else:  # each access predicated on its run: "{ ...; @p ld.global.v4... }"
            m = re.search(r"\b(ld|st)\.global(\.cs)?\.v4", ln)
            if m:
                cur.append(m.group(1))
    return out


def test_the_store_issues_the_weight_rows_a_few_runs_ahead() -> None:
    """layernorm.tk's 1 x 4096 block over 128 threads: 4 runs a thread.  The side by runs
    loads w's and bias's runs 0..LOOKAHEAD, then stores run 0, loads the next run's two
    and stores, ..., and stores the last runs with nothing more to load."""
    runs = 4
    want = []
    issued = 0
    for k in range(runs):
        while issued < min(runs, k + LOOKAHEAD + 1):
            want += ["ld", "ld"]
            issued += 1
        want.append("st")
    blocks = _by_runs_accesses(kernel_to_ptx(_example("layernorm.tk", {}).kernel()))
    assert want in blocks, blocks


@pytest.mark.parametrize("name,consts,most", [
    # ptxas at .minnctapersm 1.  With the whole rows of w and bias loaded before the first
    # multiply these took 128, 127 and 254 registers; deferred, with x packed, 80, 80 and 167.
    ("layernorm.tk", {}, 96),
    ("layernorm.tk", {"BN": 16384, "warps": 16}, 96),
    ("layernorm_split.tk", {"BN": 16384, "cluster": 4, "warps": 8}, 192),
])
def test_deferred_weight_rows_free_registers(ptxas: Path, name: str, consts: dict, most: int) -> None:
    kernel = _example(name, consts).kernel()
    usage = assemble(kernel_to_ptx(kernel), "sm_90a").kernels[kernel.attributes["sym_name"]]
    assert usage.spill_stores == 0 and usage.registers <= most, usage


def test_the_edge_side_reads_the_weight_rows_back_run_by_run(ptxas: Path) -> None:
    """layernorm_split.tk at 16k columns over 4 warps: x alone is 128 registers a thread.
    The edge side's deferred loads wait in local arrays and are read back run by run, so it
    needs no more registers than the side by runs: no spills (452 B of spills when the edge
    side loaded w and bias whole)."""
    kernel = _example("layernorm_split.tk", {"BN": 16384, "cluster": 4}).kernel()
    usage = assemble(kernel_to_ptx(kernel), "sm_90a").kernels["layernorm_split"]
    assert usage.spill_stores == 0 and usage.spill_loads == 0, usage


# --------------------------------------------------------------------------- packed tiles


def _packed_loads(kernel) -> list[str]:
    """The tensor names of the packed loads, in program order."""
    packed = store_plan(kernel).packed
    return [op.tensor.name_hint for op in kernel.walk() if op in packed]


@pytest.mark.parametrize("name,consts,want", [
    # The one-block branch's x feeds the statistics and the output; the two-sweep branch's
    # second read of x feeds only the output (a store's cone).  The first sweep's x feeds
    # only the statistics: unpacked once.
    ("layernorm.tk", {}, ["x", "x"]),
    ("layernorm_split.tk", {}, ["x", "x"]),
    # Softmax's x in one block feeds the max and the exponentials, which the sum and the store
    # both read: no use of it is in the store's cone.  The second sweep's x feeds the output
    # alone.
    ("softmax.tk", {}, ["x"]),
    ("softmax_split.tk", {}, ["x"]),
])
def test_which_tiles_stay_packed(name: str, consts: dict, want: list) -> None:
    assert _packed_loads(_example(name, consts).kernel()) == want


def test_store_cones_end_in_one_store() -> None:
    """The cone of layernorm.tk's one-block output: the ops from x - mean to the cast."""
    kernel = _example("layernorm.tk", {}).kernel()
    cones = store_plan(kernel).cones
    names = sorted(op.name for op in cones)
    assert "hopper.reduce" not in names and "tile.sub" in names and "tile.cast" in names
    users = uses(kernel)
    for op in cones:  # every use is another cone op or a store's value
        assert all(u in cones or (u.name == "hopper.store" and u.value is op.result)
                   for u in users.get(op.result, [])), op


def test_a_packed_row_block_fits_four_programs_an_sm(ptxas: Path) -> None:
    """layernorm_split.tk at 16k columns over 4 warps, registers capped for four programs an
    SM (128): x packed two values a register fits without spilling (594 B of spills when each
    value held an f32 register)."""
    kernel = _example("layernorm_split.tk", {"BN": 16384, "cluster": 4, "ctas_per_sm": 4}).kernel()
    usage = assemble(kernel_to_ptx(kernel), "sm_90a").kernels["layernorm_split"]
    assert usage.registers <= 128 and usage.spill_stores == 0 and usage.spill_loads == 0, usage
