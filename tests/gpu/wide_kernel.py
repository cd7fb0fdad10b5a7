# ruff: noqa: F821 - the kernel body names tile-language builtins, which Python never sees
"""A kernel without products whose 128 x 256 f32 tiles spill on the default four warps: the
compiler builds it again on eight (tkc.compiler._on_more_warps), which the GPU tests launch."""

from __future__ import annotations

import tkc


@tkc.kernel
def scaled(x: f32[M, N], y: f32[M, N], BM: const = 128, BN: const = 256):
    grid(cdiv(M, BM), cdiv(N, BN))
    r = program_id(0) * BM
    c = program_id(1) * BN
    t = x[r:r+BM, c:c+BN]
    y[r:r+BM, c:c+BN] = t * 2.0 + t.sum(1)[:, None]
