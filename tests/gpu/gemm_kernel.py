# ruff: noqa: F821 - the kernel body names tile-language builtins, which Python never sees
"""examples/gemm.tk as a @tkc.kernel, for the GPU tests of the decorator's launch path."""

from __future__ import annotations

import tkc


@tkc.kernel
def gemm(a: bf16[M, K], b: bf16[K, N], c: bf16[M, N], BM: const = 128, BN: const = 128, BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc.to(bf16)
