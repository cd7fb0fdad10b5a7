"""Narrow tiles: tile axes of 2, 4 or 8 elements (beside 1 and multiples of 16), as a
block-scaled product's scales need (``sa[r:r+BM, k*4:(k+1)*4]``, one E8M0 byte per 32 values
along K).  Loads and stores (columns or rows narrow, tails masked), casts, broadcasts against
wide tiles, reshapes between [128, 4], [512], [512, 1] and [4, 128], reductions along either
axis, constructors, 1-D tiles, transposes, atomics, gathers, masked and stepped accesses,
scans and arg reductions, loops with and without products (an MXFP8 GEMM written in plain tile
code, an MX-quantizing epilogue), for f8e8m0, f8e4m3, bf16, f32 and i32: the interpreter
against numpy where a reference is short, the emulator of the lowered sm_90a and sm_100a code
against the interpreter on shapes with tails, ptxas without spills (where ptxas is found).
Products still refuse operands whose extents are not multiples of 16, at their line."""

from __future__ import annotations

import re

import numpy as np
import pytest
from device_checks import assert_refused, interpret_and_emulate, lowered

from tkc.compiler import compile_kernel
from tkc.errors import TkcTypeError
from tkc.interpreter import random_args, run_kernel

DTYPES = ["f8e8m0", "f8e4m3", "bf16", "f32", "i32"]
ACC = {"f8e8m0": "f32", "f8e4m3": "f32", "bf16": "f32", "f32": "f32", "i32": "i32"}

# ---------------------------------------------------------------- kernels
COPY = """@kernel
def cp(x: {dt}[M, N], y: {dt}[M, N], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM), cdiv(N, W))
    i = program_id(0)
    j = program_id(1)
    y[i*BM:(i+1)*BM, j*W:(j+1)*W] = x[i*BM:(i+1)*BM, j*W:(j+1)*W]
"""
COPY_ROWS = """@kernel
def cpr(x: {dt}[M, N], y: {dt}[M, N], BN: const = 128, W: const = 4):
    grid(cdiv(M, W), cdiv(N, BN))
    i = program_id(0)
    j = program_id(1)
    y[i*W:(i+1)*W, j*BN:(j+1)*BN] = x[i*W:(i+1)*W, j*BN:(j+1)*BN]
"""
CAST = """@kernel
def cast(x: {dt}[M, N], y: f32[M, N], z: {dt}[M, N], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM), cdiv(N, W))
    i = program_id(0)
    j = program_id(1)
    t = x[i*BM:(i+1)*BM, j*W:(j+1)*W].to(f32)
    y[i*BM:(i+1)*BM, j*W:(j+1)*W] = t * 2.0 + 1.0
    z[i*BM:(i+1)*BM, j*W:(j+1)*W] = (t * 0.5).to({dt})
"""
# MXFP8 dequantization with W scales a row of a block (W * 32 values).
DEQUANT = """@kernel
def dq(q: f8e4m3[M, K], s: f8e8m0[M, KS], x: f32[M, K], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM), cdiv(K, W * 32))
    i = program_id(0)
    j = program_id(1)
    qt = q[i*BM:(i+1)*BM, j*W*32:(j+1)*W*32].to(f32).reshape(BM * W, 32)
    st = s[i*BM:(i+1)*BM, j*W:(j+1)*W].to(f32).reshape(BM * W)
    x[i*BM:(i+1)*BM, j*W*32:(j+1)*W*32] = (qt * st[:, None]).reshape(BM, W * 32)
"""
# MXFP8 quantization storing a [BM, W] tile of scales.
QUANT = """@kernel
def mq(x: bf16[M, K], q: f8e4m3[M, K], s: f8e8m0[M, KS], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM), cdiv(K, W * 32))
    i = program_id(0)
    j = program_id(1)
    xt = x[i*BM:(i+1)*BM, j*W*32:(j+1)*W*32].to(f32).reshape(BM * W, 32)
    amax = abs(xt).max(1)
    scale = exp2(floor(log2(amax)) - 8.0).to(f8e8m0)
    qt = (xt * (1.0 / scale.to(f32))[:, None]).to(f8e4m3)
    q[i*BM:(i+1)*BM, j*W*32:(j+1)*W*32] = qt.reshape(BM, W * 32)
    s[i*BM:(i+1)*BM, j*W:(j+1)*W] = scale.reshape(BM, W)
"""
REDUCE = """@kernel
def red(x: {dt}[M, N], rs: {dt}[M], rm: {dt}[M], cs: {acc}[R, N], cm: {dt}[R, N], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM), cdiv(N, W))
    i = program_id(0)
    j = program_id(1)
    t = x[i*BM:(i+1)*BM, j*W:(j+1)*W]
    tf = t.to({acc})
    rs[i*BM:(i+1)*BM] = tf.sum(1).to({dt})
    rm[i*BM:(i+1)*BM] = t.max(1)
    cs[i, j*W:(j+1)*W] = tf.sum(0)
    cm[i, j*W:(j+1)*W] = t.max(0)
"""
REDUCE_KEEP = """@kernel
def redk(x: {dt}[M, N], rs: {acc}[M, P], cs: {acc}[R, N], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM), cdiv(N, W))
    i = program_id(0)
    j = program_id(1)
    t = x[i*BM:(i+1)*BM, j*W:(j+1)*W].to({acc})
    rs[i*BM:(i+1)*BM, j:j+1] = t.sum(1)[:, None]
    cs[i:i+1, j*W:(j+1)*W] = t.sum(0)[None, :]
"""
ROWS_REDUCE = """@kernel
def nr(x: {dt}[M, N], rs: {acc}[M], cs: {acc}[R, N], BN: const = 128, W: const = 4):
    grid(cdiv(M, W))
    i = program_id(0)
    t = x[i*W:(i+1)*W, 0:BN].to({acc})
    rs[i*W:(i+1)*W] = t.sum(1)
    cs[i, 0:BN] = t.max(0)
"""
# Fewer elements than threads: a [BR, W] tile, every value held by several threads.
SMALL = """@kernel
def sm(x: {dt}[M, N], y: {dt}[M, N], rs: {acc}[M, C], cs: {acc}[R, N], BR: const = 4, W: const = 4):
    grid(cdiv(M, BR), cdiv(N, W))
    i = program_id(0)
    j = program_id(1)
    t = x[i*BR:(i+1)*BR, j*W:(j+1)*W]
    y[i*BR:(i+1)*BR, j*W:(j+1)*W] = t
    tf = t.to({acc})
    rs[i*BR:(i+1)*BR, j] = tf.sum(1)
    cs[i, j*W:(j+1)*W] = tf.sum(0)
"""
CTOR = """@kernel
def ctor(x: {dt}[M, N], y: {dt}[M, N], z: i32[M, N], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM), cdiv(N, W))
    i = program_id(0)
    j = program_id(1)
    t = x[i*BM:(i+1)*BM, j*W:(j+1)*W]
    zz = zeros([BM, W], {dt})
    cols = arange(W) + j * W
    rows = arange(BM) + i * BM
    keep = (cols[None, :] % 2 == 0) & (rows[:, None] % 3 != 0)
    y[i*BM:(i+1)*BM, j*W:(j+1)*W] = where(keep, t, zz + ones([BM, W], {dt}))
    z[i*BM:(i+1)*BM, j*W:(j+1)*W] = rows[:, None] * 100 + cols[None, :] + full([BM, W], 7, i32)
"""
ONE_D = """@kernel
def od(x: {dt}[L], y: {dt}[L], s: {acc}[P], W: const = 8):
    grid(cdiv(L, W))
    i = program_id(0)
    t = x[i*W:(i+1)*W]
    y[i*W:(i+1)*W] = (t.to({acc}) * 2).to({dt})
    s[i] = t.to({acc}).sum(0)
"""
BCAST = """@kernel
def bc(x: {dt}[M, N], v: {dt}[M, K], y: f32[M, K], BM: const = 128, W: const = 4, BN: const = 32):
    grid(cdiv(M, BM))
    i = program_id(0)
    t = x[i*BM:(i+1)*BM, 0:W].to(f32)
    w = v[i*BM:(i+1)*BM, 0:BN].to(f32)
    y[i*BM:(i+1)*BM, 0:BN] = w * t.max(1)[:, None] + t.sum(1)[:, None]
"""
VEC_BCAST = """@kernel
def vb(x: {dt}[M, N], v: {dt}[N], y: {acc}[M, N], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM), cdiv(N, W))
    i = program_id(0)
    j = program_id(1)
    t = x[i*BM:(i+1)*BM, j*W:(j+1)*W].to({acc})
    vv = v[j*W:(j+1)*W].to({acc})
    y[i*BM:(i+1)*BM, j*W:(j+1)*W] = t * vv[None, :] + vv[None, :]
"""
TRANSPOSE = """@kernel
def tr(x: {dt}[M, N], y: {dt}[N, M], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM), cdiv(N, W))
    i = program_id(0)
    j = program_id(1)
    y[j*W:(j+1)*W, i*BM:(i+1)*BM] = x[i*BM:(i+1)*BM, j*W:(j+1)*W].T
"""
MIX_LAYOUTS = """@kernel
def ml(x: {dt}[M, N], u: {dt}[N, M], y: {acc}[M, N], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM))
    i = program_id(0)
    t = x[i*BM:(i+1)*BM, 0:W].to({acc})
    v = u[0:W, i*BM:(i+1)*BM].to({acc})
    y[i*BM:(i+1)*BM, 0:W] = t + v.T
"""
RESHAPE = """@kernel
def rsh(x: {dt}[M, N], y: {dt}[T], z: {dt}[T, P], u: {dt}[Q, C], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM))
    i = program_id(0)
    t = x[i*BM:(i+1)*BM, 0:W]
    y[i*BM*W:(i+1)*BM*W] = t.reshape(BM * W)
    z[i*BM*W:(i+1)*BM*W, 0:1] = t.reshape(BM * W, 1)
    u[i*(BM*W//16):(i+1)*(BM*W//16), 0:16] = t.reshape(BM * W // 16, 16)
"""
RESHAPE_BACK = """@kernel
def rshb(y: {dt}[T], x: {dt}[M, N], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM))
    i = program_id(0)
    x[i*BM:(i+1)*BM, 0:W] = y[i*BM*W:(i+1)*BM*W].reshape(BM, W)
"""
RESHAPE_CHAIN = """@kernel
def rc(x: {dt}[M, N], y: {dt}[M, N], z: {dt}[R, C], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM))
    i = program_id(0)
    t = x[i*BM:(i+1)*BM, 0:W]
    f = t.reshape(BM * W)
    y[i*BM:(i+1)*BM, 0:W] = f.reshape(BM * W, 1).reshape(BM, W)
    z[i*W:(i+1)*W, 0:BM] = f.reshape(W, BM)
"""
ATOMICS = """@kernel
def aa(x: {dt}[M, N], y: {dt}[R, N], BM: const = 32, W: const = 4):
    grid(cdiv(M, BM), cdiv(N, W))
    i = program_id(0)
    j = program_id(1)
    t = x[i*BM:(i+1)*BM, j*W:(j+1)*W]
    atomic_add(y[0:BM, j*W:(j+1)*W], t)
    atomic_max(y[BM:2*BM, j*W:(j+1)*W], t)
"""
GATHER_ROWS = """@kernel
def gr(x: {dt}[M, N], idx: i32[L], y: {dt}[L, N], BM: const = 128, W: const = 4):
    grid(cdiv(L, BM), cdiv(N, W))
    i = program_id(0)
    j = program_id(1)
    ids = idx[i*BM:(i+1)*BM]
    y[i*BM:(i+1)*BM, j*W:(j+1)*W] = x[ids, j*W:(j+1)*W]
"""
GATHER_COLS = """@kernel
def gc(x: {dt}[M, N], perm: i32[P], y: {dt}[M, P], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM), cdiv(P, W))
    i = program_id(0)
    j = program_id(1)
    pp = perm[j*W:(j+1)*W]
    y[i*BM:(i+1)*BM, j*W:(j+1)*W] = x[i*BM:(i+1)*BM, pp]
"""
MASKED_STORE = """@kernel
def ms(x: {dt}[M, N], y: {dt}[M, N], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM), cdiv(N, W))
    i = program_id(0)
    j = program_id(1)
    cols = arange(W)
    store(y[i*BM:(i+1)*BM, j*W:(j+1)*W], x[i*BM:(i+1)*BM, j*W:(j+1)*W], mask=(cols % 2 == 0)[None, :])
"""
STEPPED = """@kernel
def st(x: {dt}[M, N], y: {dt}[M, P], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM))
    i = program_id(0)
    ev = x[i*BM:(i+1)*BM, 0:2*W:2]
    od = x[i*BM:(i+1)*BM, 1:2*W:2]
    y[i*BM:(i+1)*BM, 0:W] = ev
    y[i*BM:(i+1)*BM, W:2*W] = od
"""
COLS_LOOP = """@kernel
def cl(x: {dt}[M, K], y: {acc}[M, N], W: const = 4, BM: const = 128):
    grid(cdiv(M, BM))
    i = program_id(0)
    s = zeros([BM, W], {acc})
    for k in range(cdiv(K, W)):
        s += x[i*BM:(i+1)*BM, k*W:(k+1)*W].to({acc})
    y[i*BM:(i+1)*BM, 0:W] = s
"""
ROWS_LOOP = """@kernel
def rl(x: {dt}[M, K], y: {acc}[M, N], W: const = 4, BN: const = 128):
    grid(cdiv(M, W))
    i = program_id(0)
    s = zeros([W, BN], {acc})
    for k in range(cdiv(K, BN)):
        s += x[i*W:(i+1)*W, k*BN:(k+1)*BN].to({acc})
    y[i*W:(i+1)*W, 0:BN] = s
"""
INDEX = """@kernel
def ic(x: {dt}[M, N], y: {dt}[M, C], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM))
    i = program_id(0)
    t = x[i*BM:(i+1)*BM, 0:W]
    y[i*BM:(i+1)*BM, 0] = t[:, W - 1]
    y[i*BM:(i+1)*BM, 1] = t[:, 0]
    y[i*BM:(i+1)*BM, 2] = t[:, -1]
"""
ARGMAX = """@kernel
def am(x: {dt}[M, N], y: i32[M], z: i32[R, N], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM))
    i = program_id(0)
    t = x[i*BM:(i+1)*BM, 0:W]
    y[i*BM:(i+1)*BM] = t.argmax(1)
    z[i, 0:W] = t.argmin(0)
"""
CUMSUM = """@kernel
def cs(x: {dt}[M, N], y: {acc}[M, N], z: {acc}[M, N], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM))
    i = program_id(0)
    t = x[i*BM:(i+1)*BM, 0:W].to({acc})
    y[i*BM:(i+1)*BM, 0:W] = t.cumsum(1)
    z[i*BM:(i+1)*BM, 0:W] = t.cumsum(0)
"""
SOFTMAX = """@kernel
def smx(x: {dt}[M, N], y: f32[M, N], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM))
    i = program_id(0)
    t = load(x[i*BM:(i+1)*BM, 0:W], other=-inf).to(f32)
    e = exp(t - t.max(1)[:, None])
    y[i*BM:(i+1)*BM, 0:W] = e / e.sum(1)[:, None]
"""
THREE_D = """@kernel
def td(x: {dt}[B, M, N], y: {dt}[B, N, M], BM: const = 64, W: const = 4):
    grid(B, cdiv(M, BM))
    b = program_id(0)
    i = program_id(1)
    y[b, 0:W, i*BM:(i+1)*BM] = x[b, i*BM:(i+1)*BM, 0:W].T
"""
RAND = """@kernel
def rn(x: {dt}[M, N], y: f32[M, N], seed: i32, BM: const = 128, W: const = 4):
    grid(cdiv(M, BM))
    i = program_id(0)
    rows = arange(BM) + i * BM
    cols = arange(W)
    r = rand(seed, rows[:, None] * W + cols[None, :])
    y[i*BM:(i+1)*BM, 0:W] = where(r > 0.5, x[i*BM:(i+1)*BM, 0:W].to(f32), r)
"""
BOOL = """@kernel
def bt(x: {dt}[M, N], y: bool[M, N], z: i32[M], BM: const = 128, W: const = 4):
    grid(cdiv(M, BM))
    i = program_id(0)
    t = x[i*BM:(i+1)*BM, 0:W] > x[i*BM:(i+1)*BM, W:2*W]
    y[i*BM:(i+1)*BM, 0:W] = t
    z[i*BM:(i+1)*BM] = t.to(i32).sum(1)
"""
# A block-scaled (MXFP8) GEMM in plain tile code: the scales of BK // 32 blocks a row are a
# [BM, BK // 32] tile (2, 4 or 8 wide), applied in registers before a bf16 product.
GEMM_MX = """@kernel
def gemm_mx(a: f8e4m3[M, K], sa: f8e8m0[M, KS], b: f8e4m3[N, K], sb: f8e8m0[N, KS],
            c: bf16[M, N], BM: const = 128, BN: const = 128, BK: const = 128):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        at = a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK].to(f32).reshape(BM * (BK // 32), 32)
        ast = sa[pm*BM:(pm+1)*BM, k*(BK//32):(k+1)*(BK//32)].to(f32).reshape(BM * (BK // 32))
        bt = b[pn*BN:(pn+1)*BN, k*BK:(k+1)*BK].to(f32).reshape(BN * (BK // 32), 32)
        bst = sb[pn*BN:(pn+1)*BN, k*(BK//32):(k+1)*(BK//32)].to(f32).reshape(BN * (BK // 32))
        ad = (at * ast[:, None]).reshape(BM, BK).to(bf16)
        bd = (bt * bst[:, None]).reshape(BN, BK).to(bf16)
        acc += ad @ bd.T
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc.to(bf16)
"""
# A GEMM whose epilogue quantizes its result to MXFP8: a [BM, BN // 32] tile of scales.
GEMM_MX_OUT = """@kernel
def gemm_mxout(a: bf16[M, K], b: bf16[N, K], q: f8e4m3[M, N], s: f8e8m0[M, NS],
               BM: const = 128, BN: const = 128, BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[pn*BN:(pn+1)*BN, k*BK:(k+1)*BK].T
    blocks = acc.reshape(BM * (BN // 32), 32)
    scale = exp2(floor(log2(abs(blocks).max(1))) - 8.0).to(f8e8m0)
    qt = (blocks * (1.0 / scale.to(f32))[:, None]).to(f8e4m3)
    q[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = qt.reshape(BM, BN)
    s[pm*BM:(pm+1)*BM, pn*(BN//32):(pn+1)*(BN//32)] = scale.reshape(BM, BN // 32)
"""
# A narrow tile loaded in the loop of a product: the accumulator rescaled by a row max.
SCALE_IN_GEMM = """@kernel
def sg(a: bf16[M, K], b: bf16[N, K], s: {dt}[M, KS], c: f32[M, N],
       BM: const = 128, BN: const = 128, BK: const = 64, W: const = 4):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        st = s[pm*BM:(pm+1)*BM, k*W:(k+1)*W].to(f32)
        acc = acc * st.max(1)[:, None] + a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[pn*BN:(pn+1)*BN, k*BK:(k+1)*BK].T
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc
"""
VEC_IN_GEMM = """@kernel
def vg(a: bf16[M, K], b: bf16[N, K], v: {dt}[KS], c: f32[M, N],
       BM: const = 128, BN: const = 128, BK: const = 64, W: const = 4):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    t = 0.0
    for k in range(cdiv(K, BK)):
        acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[pn*BN:(pn+1)*BN, k*BK:(k+1)*BK].T
        t += v[k*W:(k+1)*W].to(f32).sum(0)
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc * t
"""

GEMM_DIMS = {"M": 200, "N": 136, "K": 384, "KS": 12}
LOOP_GEMM_DIMS = {"M": 200, "N": 136, "K": 320, "KS": 20}


def _case(src: str, dt: str, W: int, dims: dict, **consts) -> tuple[str, dict, dict]:
    return src.format(dt=dt, acc=ACC[dt]), {"W": W, **consts}, dims


def _cases() -> dict[str, tuple[str, dict, dict, bool]]:
    """name -> (source, constants, dims, slow)."""
    c: dict[str, tuple] = {}

    def add(name: str, case: tuple, slow: bool = False) -> None:
        c[name] = (*case, slow)

    for dt in DTYPES:
        for W in (2, 4, 8):
            add(f"copy_{dt}_w{W}", _case(COPY, dt, W, {"M": 200, "N": 22}))
            add(f"copy_rows_{dt}_w{W}", _case(COPY_ROWS, dt, W, {"M": 21, "N": 200}), slow=W != 4)
            if dt != "i32":
                add(f"cast_{dt}_w{W}", _case(CAST, dt, W, {"M": 200, "N": 22}), slow=W != 4)
            add(f"reduce_{dt}_w{W}", _case(REDUCE, dt, W, {"M": 200, "N": W, "R": 2}), slow=W == 4)
            add(f"transpose_{dt}_w{W}", _case(TRANSPOSE, dt, W, {"M": 200, "N": 12}), slow=W != 4)
            add(f"reshape_{dt}_w{W}", _case(RESHAPE, dt, W, {"M": 256, "N": 4, "T": 1024, "P": 1, "Q": 64,
                                                                "C": 16}), slow=W != 4)
            add(f"ctor_{dt}_w{W}", _case(CTOR, dt, W, {"M": 200, "N": 12}), slow=W != 8)
            add(f"bcast_{dt}_w{W}", _case(BCAST, dt, W, {"M": 200, "N": W, "K": 32}), slow=W != 2)
            add(f"one_d_{dt}_w{W}", _case(ONE_D, dt, W, {"L": 21, "P": 3}), slow=W != 8)
    for W in (2, 4, 8):
        add(f"dequant_w{W}", (DEQUANT, {"W": W}, {"M": 200, "K": 416, "KS": 13}))
        add(f"quant_w{W}", (QUANT, {"W": W}, {"M": 200, "K": 416, "KS": 13}))
        add(f"reshape_chain_w{W}", _case(RESHAPE_CHAIN, "f32", W, {"M": 256, "N": 8, "R": 8, "C": 128}))
        add(f"mix_layouts_w{W}", _case(MIX_LAYOUTS, "bf16", W, {"M": 200, "N": 8}))
    add("reduce_keep_f32_w4", _case(REDUCE_KEEP, "f32", 4, {"M": 200, "N": 12, "P": 3, "R": 2}))
    add("reduce_keep_i32_w8", _case(REDUCE_KEEP, "i32", 8, {"M": 200, "N": 16, "P": 2, "R": 2}))
    add("rows_reduce_f8e8m0_w4", _case(ROWS_REDUCE, "f8e8m0", 4, {"M": 10, "N": 100, "R": 5}))
    add("rows_reduce_f32_w8", _case(ROWS_REDUCE, "f32", 8, {"M": 10, "N": 100, "R": 5}))
    add("small_f32_2x4", _case(SMALL, "f32", 4, {"M": 9, "N": 10, "C": 5, "R": 9}, BR=2))
    add("small_i32_8x2", _case(SMALL, "i32", 2, {"M": 9, "N": 10, "C": 5, "R": 9}, BR=8))
    add("small_bf16_4x8", _case(SMALL, "bf16", 8, {"M": 9, "N": 10, "C": 5, "R": 9}, BR=4))
    add("vec_bcast_bf16_w4", _case(VEC_BCAST, "bf16", 4, {"M": 200, "N": 10}))
    add("reshape_back_f8e8m0_w4", _case(RESHAPE_BACK, "f8e8m0", 4, {"M": 200, "N": 4, "T": 800}))
    add("reshape_back_i32_w8", _case(RESHAPE_BACK, "i32", 8, {"M": 200, "N": 8, "T": 1600}))
    add("atomics_f32_w4", _case(ATOMICS, "f32", 4, {"M": 100, "N": 10, "R": 64}))
    add("atomics_i32_w2", _case(ATOMICS, "i32", 2, {"M": 100, "N": 10, "R": 64}))
    add("gather_rows_f8e8m0_w4", _case(GATHER_ROWS, "f8e8m0", 4, {"M": 50, "N": 10, "L": 150}))
    add("gather_rows_bf16_w8", _case(GATHER_ROWS, "bf16", 8, {"M": 50, "N": 10, "L": 150}))
    add("gather_cols_f32_w2", _case(GATHER_COLS, "f32", 2, {"M": 150, "N": 10, "P": 6}))
    add("gather_cols_i32_w4", _case(GATHER_COLS, "i32", 4, {"M": 150, "N": 10, "P": 6}))
    add("masked_store_f8e8m0_w8", _case(MASKED_STORE, "f8e8m0", 8, {"M": 200, "N": 10}))
    add("masked_store_f32_w2", _case(MASKED_STORE, "f32", 2, {"M": 200, "N": 10}))
    add("stepped_bf16_w4", _case(STEPPED, "bf16", 4, {"M": 200, "N": 16, "P": 16}))
    add("stepped_f8e4m3_w8", _case(STEPPED, "f8e4m3", 8, {"M": 200, "N": 16, "P": 16}))
    add("cols_loop_f8e8m0_w4", _case(COLS_LOOP, "f8e8m0", 4, {"M": 200, "K": 30, "N": 8}))
    add("cols_loop_f8e8m0_w4_staged", _case(COLS_LOOP, "f8e8m0", 4, {"M": 200, "K": 30, "N": 8}, stage_loads=1))
    add("cols_loop_f32_w2_staged", _case(COLS_LOOP, "f32", 2, {"M": 200, "K": 30, "N": 8}, stage_loads=2))
    add("rows_loop_f32_w4_prefetch", _case(ROWS_LOOP, "f32", 4, {"M": 10, "K": 300, "N": 128}, prefetch=1))
    add("rows_loop_i32_w2", _case(ROWS_LOOP, "i32", 2, {"M": 10, "K": 300, "N": 128}))
    add("index_bf16_w4", _case(INDEX, "bf16", 4, {"M": 200, "N": 8, "C": 3}))
    add("index_f8e8m0_w2", _case(INDEX, "f8e8m0", 2, {"M": 200, "N": 8, "C": 3}))
    add("argmax_f32_w8", _case(ARGMAX, "f32", 8, {"M": 200, "N": 8, "R": 2}))
    add("argmax_i32_w2", _case(ARGMAX, "i32", 2, {"M": 200, "N": 8, "R": 2}))
    add("cumsum_f32_w4", _case(CUMSUM, "f32", 4, {"M": 200, "N": 8}))
    add("cumsum_i32_w8", _case(CUMSUM, "i32", 8, {"M": 200, "N": 8}))
    add("softmax_bf16_w4", _case(SOFTMAX, "bf16", 4, {"M": 200, "N": 3}))
    add("softmax_f32_w8", _case(SOFTMAX, "f32", 8, {"M": 200, "N": 5}))
    add("three_d_f8e8m0_w4", _case(THREE_D, "f8e8m0", 4, {"B": 3, "M": 100, "N": 6}))
    add("three_d_f32_w2", _case(THREE_D, "f32", 2, {"B": 3, "M": 100, "N": 6}))
    add("rand_f32_w4", _case(RAND, "f32", 4, {"M": 200, "N": 8}))
    add("bool_bf16_w4", _case(BOOL, "bf16", 4, {"M": 200, "N": 16}))
    add("bool_i32_w8", _case(BOOL, "i32", 8, {"M": 200, "N": 16}))
    # Products beside narrow tiles (BK = 64: scales 2 wide; 128 with staged loads: 4 wide).
    add("gemm_mx_bk64", (GEMM_MX, {"BK": 64}, GEMM_DIMS))
    add("gemm_mx_bk64_not_persistent", (GEMM_MX, {"BK": 64, "persistent": False}, GEMM_DIMS), slow=True)
    add("gemm_mx_bk64_staged", (GEMM_MX, {"BK": 64, "stage_loads": 2}, GEMM_DIMS), slow=True)
    add("gemm_mx_bk128_staged", (GEMM_MX, {"BK": 128, "stage_loads": 1}, GEMM_DIMS))
    add("gemm_mx_bk256_64x64_staged", (GEMM_MX, {"BK": 256, "BM": 64, "BN": 64, "stage_loads": 1}, GEMM_DIMS),
        slow=True)
    add("gemm_mx_out_bn64", (GEMM_MX_OUT, {"BN": 64}, {"M": 200, "N": 320, "K": 128, "NS": 10}))
    add("gemm_mx_out_bn256", (GEMM_MX_OUT, {"BN": 256}, {"M": 200, "N": 320, "K": 128, "NS": 10}), slow=True)
    add("scale_in_gemm_f8e8m0_w4", _case(SCALE_IN_GEMM, "f8e8m0", 4, LOOP_GEMM_DIMS))
    add("scale_in_gemm_f32_w2", _case(SCALE_IN_GEMM, "f32", 2, LOOP_GEMM_DIMS), slow=True)
    add("vec_in_gemm_f32_w4_tma_vectors", _case(VEC_IN_GEMM, "f32", 4, LOOP_GEMM_DIMS, tma_vectors=True), slow=True)
    return c


CASES = _cases()
TARGETS = ["sm_90a", "sm_100a"]


def _param(name: str, *rest):
    slow = CASES[name][3]
    return pytest.param(name, *rest, marks=[pytest.mark.slow] if slow else [], id="-".join([name, *map(str, rest)]))


def _compile(name: str, stop: str, target: str = "sm_90a"):
    src, consts, *_ = CASES[name]
    return compile_kernel(src, consts=consts, stop=stop, target=target, cache=False)


def _tolerance(name: str) -> float:
    """Sums in another order (reductions, scans, softmax) and wgmma's adds: a few f32 ulps of
    the outputs' scale; bf16 results of products may then round one bf16 ulp apart."""
    if "gemm" in name:
        return 1e-2
    if any(k in name for k in ("reduce", "small", "cumsum", "softmax", "loop", "one_d", "bcast", "atomics",
                               "rows_reduce")):
        return 1e-5
    return 0.0


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", [_param(n) for n in CASES])
def test_emulator_matches_interpreter_without_spills(name: str, target: str) -> None:
    tile_ir = _compile(name, "tkir").kernel_op
    args = random_args(tile_ir, CASES[name][2], 3)
    want, got = interpret_and_emulate(tile_ir, lowered(lambda stop: _compile(name, stop, target)).kernel_op,
                                      args, 3)
    tol = _tolerance(name)
    changed = False
    for a, g, w in zip(args, got, want):
        if isinstance(w, np.ndarray):
            changed |= not np.array_equal(np.asarray(a), np.asarray(w), equal_nan=True)
            np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=tol,
                                       atol=tol * max(1.0, float(np.nanmax(np.abs(np.asarray(w, np.float64))))
                                                      if w.size else 1.0))
    assert changed, "the interpreter wrote no output: the comparison would prove nothing"


# ---------------------------------------------------------------- the interpreter against numpy
def _pad(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    out = np.zeros((rows, cols))
    out[:x.shape[0], :x.shape[1]] = x
    return out


def _ref_copy(a: list) -> dict[int, np.ndarray]:
    return {1: a[0]}


def _ref_cast(a: list) -> dict[int, np.ndarray]:
    return {1: a[0] * 2 + 1}


def _ref_dequant(a: list) -> dict[int, np.ndarray]:
    q, s = a[0], a[1]
    M, K = q.shape
    return {2: (q.reshape(M, K // 32, 32) * s[:, :, None]).reshape(M, K)}


def _ref_reduce_rows(a: list) -> dict[int, np.ndarray]:  # reduce_*: N == W, one column block
    x = a[0]
    pad = _pad(x, 256, x.shape[1])
    return {1: x.sum(1), 2: x.max(1), 3: pad.reshape(2, 128, -1).sum(1), 4: pad.reshape(2, 128, -1).max(1)}


def _ref_transpose(a: list) -> dict[int, np.ndarray]:
    return {1: a[0].T}


def _ref_reshape(a: list) -> dict[int, np.ndarray]:  # reshape_*: M = 256, N = W = 4
    x = a[0]
    return {1: x.reshape(-1), 2: x.reshape(-1, 1), 3: x.reshape(-1, 16)}


def _ref_gemm_mx(a: list) -> dict[int, np.ndarray]:
    A, SA, B, SB = a[:4]
    M, K = A.shape
    ad = (A.reshape(M, K // 32, 32) * SA[:, :, None]).reshape(M, K)
    bd = (B.reshape(B.shape[0], K // 32, 32) * SB[:, :, None]).reshape(B.shape[0], K)
    return {4: ad @ bd.T}


REFERENCES = {
    "copy_f8e8m0_w4": (_ref_copy, 0), "copy_bf16_w2": (_ref_copy, 0), "copy_i32_w8": (_ref_copy, 0),
    "copy_rows_f8e4m3_w4": (_ref_copy, 0),
    "cast_f8e8m0_w4": (_ref_cast, 0), "cast_f32_w4": (_ref_cast, 1e-6),
    "dequant_w2": (_ref_dequant, 0), "dequant_w4": (_ref_dequant, 0), "dequant_w8": (_ref_dequant, 0),
    "reduce_f32_w2": (_ref_reduce_rows, 1e-6), "reduce_i32_w8": (_ref_reduce_rows, 0),
    "transpose_f8e8m0_w4": (_ref_transpose, 0), "transpose_i32_w4": (_ref_transpose, 0),
    "reshape_f32_w4": (_ref_reshape, 0), "reshape_f8e8m0_w4": (_ref_reshape, 0),
    "gemm_mx_bk64": (_ref_gemm_mx, 1e-2), "gemm_mx_bk128_staged": (_ref_gemm_mx, 1e-2),
}


@pytest.mark.parametrize("name", [_param(n) for n in REFERENCES])
def test_interpreter_matches_numpy(name: str) -> None:
    tile_ir = _compile(name, "tkir").kernel_op
    args = random_args(tile_ir, CASES[name][2], 4)
    ins = [np.asarray(a, np.float64) if isinstance(a, np.ndarray) else a for a in args]
    run_kernel(tile_ir, args)
    ref, tol = REFERENCES[name]
    for i, want in ref(ins).items():
        got = np.asarray(args[i], np.float64)
        np.testing.assert_allclose(got, want.reshape(got.shape), rtol=tol, atol=tol * max(1.0, np.abs(want).max()))


def test_scale_tiles_are_loaded_by_the_threads_not_by_tma() -> None:
    """A [128, 4] tile of E8M0 scales is a 4-byte run a row (narrower than a TMA box's 16
    bytes): each thread loads its part into registers, and no tensor map names sa or sb
    (parameters 1 and 3; c, parameter 4, is stored by TMA)."""
    text = _compile("gemm_mx_bk128_staged", "hopper").asm["hopper"]
    assert "hopper.load %sa, " in text and "hopper.load %sb, " in text
    assert text.count("{box = [128, 4]} : tile<128x4xf8e8m0, reg") == 2
    maps = re.search(r"tma_maps = \[(.*?)\], smem_bytes", text.splitlines()[0]).group(1)
    assert re.findall(r"\[(\d+), \[", maps) == ["4"], maps


# ---------------------------------------------------------------- refusals
MMA = """@kernel
def mm(a: bf16[M, K], b: bf16[K, N], c: f32[M, N], W: const = 8):
    grid(cdiv(M, 64))
    i = program_id(0)
    c[i*64:(i+1)*64, 0:64] = {expr}
"""


@pytest.mark.parametrize("W", [2, 4, 8])
@pytest.mark.parametrize("expr, column, shape", [
    ("a[i*64:(i+1)*64, 0:W] @ b[0:W, 0:64]", 30, "64xW"),
    ("a[i*64:(i+1)*64, 0:64] @ b[0:64, 0:W]", 30, "64xW"),
    ("a[i*64:(i+1)*64, 0:W].to(f32) @ b[0:W, 0:64].to(f32)", 30, "64xW"),
    ("a[i*64:(i+1)*64, 0:W] @ a[0:64, 0:W].T", 30, "64xW"),
])
def test_products_refuse_narrow_operands_at_their_line(W: int, expr: str, column: int, shape: str) -> None:
    with pytest.raises(TkcTypeError, match=r"matmul operands need extents that are multiples of 16, got "
                       + r"tile<" + shape.replace("W", str(W))) as e:
        compile_kernel(MMA.format(expr=expr), consts={"W": W}, stop="tkir", cache=False)
    assert e.value.loc is not None and (e.value.loc.line, e.value.loc.col) == (5, column), e.value


@pytest.mark.parametrize("W", [3, 6, 12, 24])
def test_other_extents_are_still_refused(W: int) -> None:
    assert_refused(COPY.format(dt="f32"), TkcTypeError, f"extent {W} on axis 1 is not 1, 2, 4, 8 or a multiple of 16",
                   6, consts={"W": W}, stop="tkir")


def test_a_narrow_slice_of_a_register_tile_is_refused() -> None:
    src = BCAST.format(dt="f32").replace("t.sum(1)[:, None]", "t[:, 0:2]")
    assert_refused(src, TkcTypeError, "a slice of a tile keeps a multiple of 16 elements of an axis, got 2", 7,
                   consts={"W": 4}, stop="tkir")
