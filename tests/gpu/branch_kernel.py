# ruff: noqa: F821 - the kernel body names tile-language builtins, which Python never sees
"""A bf16 tile that one branch of an ``if`` replaces: the tile crosses the branches' merge as
packed b32 pairs (tkc/codegen/lower.py), which the GPU tests check on both paths."""

from __future__ import annotations

import tkc


@tkc.kernel
def maybe_double(x: bf16[M, N], y: bf16[M, N], flag: i32, BM: const = 64, BN: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    r = program_id(0) * BM
    c = program_id(1) * BN
    t = x[r:r+BM, c:c+BN]
    if flag > 0:
        t = (t * 2.0).to(bf16)
    y[r:r+BM, c:c+BN] = t
