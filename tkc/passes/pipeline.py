"""The pass registry and the default pipelines, as data.

This module only names things: which function runs for each pass name, and
which passes run by default, in order.  It does not run passes (that is
``manager.py``) and holds no pass logic (one file per pass next to it).
Read it top to bottom to see what ``tkc compile`` does to a kernel.
"""

from __future__ import annotations

from collections.abc import Callable

from tkc.ir.core import Module
from tkc.passes.allocate_smem import allocate_smem
from tkc.passes.canonicalize import canonicalize
from tkc.passes.cse import cse
from tkc.passes.dce import dce
from tkc.passes.licm import licm

#: Every pass by its pipeline name.  A pass mutates the module in place and
#: raises a TkcError when the input is outside what it handles.
PASSES: dict[str, Callable[[Module], None]] = {
    # --- target-independent cleanups on tile IR
    "canonicalize": canonicalize,  # fold constants, simplify identities, acc += a @ b
    "licm": licm,                  # hoist loop-invariant pure ops out of tile.for
    "cse": cse,                    # merge identical pure ops
    "dce": dce,                    # drop pure/readonly ops (and loop results) nobody uses
    "allocate-smem": allocate_smem,  # byte offsets of shared tiles and mbarriers, smem_bytes
    # --- later stages go here, in the order they run, each in its own file:
    #   infer-bounds, select-layouts, pipeline-loops, specialize-warps,
    #   lower-to-hopper, allocate-smem (and lower-to-blackwell for sm_100a).
}

#: What ``tkc compile`` and ``tkc run`` run on tile IR by default.  Once the
#: Hopper backend lands this grows into the sm_90a pipeline:
#: cleanups, then select-layouts, lower-to-hopper, allocate-smem.
DEFAULT_PIPELINE = "canonicalize,licm,cse,dce"
