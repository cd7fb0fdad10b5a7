# ruff: noqa: F821 - the kernel body names tile-language builtins, which Python never sees
"""Scalar divisions in a loop by a divisor computed outside it, for the GPU test of their
lowering through the divisor's reciprocal (tkc/codegen/lower_elementwise.py): Python's floor
semantics for every sign, divisors 1 and 0 (which gives 0), numerators up to INT32_MIN."""

from __future__ import annotations

import tkc


@tkc.kernel
def divided(xs: i32[T], ds: i32[P], q: i32[P, T], r: i32[P, T], c: i32[P, T]):
    grid(P)
    p = program_id(0)
    d = ds[p]
    for t in range(T):
        x = xs[t]
        q[p, t] = x // d
        r[p, t] = x % d
        c[p, t] = cdiv(x, d)
