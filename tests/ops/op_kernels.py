# ruff: noqa: F821 - kernel bodies name tile-language builtins, which Python never sees
"""Small @tkc.kernel functions for the tests of tkc.ops.custom_op: one per parameter role."""

from __future__ import annotations

import tkc


@tkc.kernel
def axpy(x: f32[N], y: f32[N], out: f32[N], a: f32, BN: const = 32):
    grid(cdiv(N, BN))
    i = program_id(0) * BN
    out[i:i+BN] = a * x[i:i+BN] + y[i:i+BN]


@tkc.kernel
def axpy_inplace(x: f32[N], y: f32[N], a: f32, BN: const = 32):
    grid(cdiv(N, BN))
    i = program_id(0) * BN
    y[i:i+BN] = a * x[i:i+BN] + y[i:i+BN]


@tkc.kernel
def col_sums(x: f32[M, N], s: f32[N], BM: const = 16, BN: const = 32):
    grid(cdiv(M, BM), cdiv(N, BN))
    r = program_id(0) * BM
    c = program_id(1) * BN
    atomic_add(s[c:c+BN], x[r:r+BM, c:c+BN].sum(0))


@tkc.kernel
def scaled(x: f32[N], y: f32[N], BN: const = 32, negate: const = False, k: const = 2):
    grid(cdiv(N, BN))
    i = program_id(0) * BN
    if negate:
        y[i:i+BN] = -x[i:i+BN] * k
    else:
        y[i:i+BN] = x[i:i+BN] * k


@tkc.kernel
def fill(x: f32[N], y: f32[P], BN: const = 32):
    grid(cdiv(P, BN))
    i = program_id(0) * BN
    y[i:i+BN] = zeros([BN], f32)


@tkc.kernel
def padded(x: f32[N], y: f32[P], BN: const = 32):
    grid(cdiv(N, BN))
    i = program_id(0) * BN
    y[i:i+BN] = x[i:i+BN] * 2.0  # (only y's first N elements: P is larger)


@tkc.kernel
def split(y: f32[N], x: f32[N], z: f32[N], BN: const = 32):
    grid(cdiv(N, BN))
    i = program_id(0) * BN
    y[i:i+BN] = x[i:i+BN] * 2.0
    z[i:i+BN] = -x[i:i+BN]
