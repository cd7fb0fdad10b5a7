# ruff: noqa: F821 - the kernel body names tile-language builtins, which Python never sees
"""A copy shifted by (DR, DC), for the GPU tests of the element path at a tensor's edges:
every tile reads from DC columns back (negative offsets in the first tiles, and an offset
that is not a multiple of the vector width, so every run takes the element path)."""

from __future__ import annotations

import tkc


@tkc.kernel
def shifted(x: bf16[M, N], y: bf16[M, N], BM: const = 16, BN: const = 64, DR: const = 3, DC: const = 5):
    grid(cdiv(M, BM), cdiv(N, BN))
    r = program_id(0) * BM
    c = program_id(1) * BN
    y[r:r+BM, c:c+BN] = load(x[r-DR:r-DR+BM, c-DC:c-DC+BN], other=7.0)
