"""i64 (torch's default index dtype) end to end: i64 tensors and scalars as inputs, scalar and
tile loads of them, i64 arithmetic, comparisons and casts, reductions, and i64 values as slice
offsets, indices and loop bounds (clamped to the i32 range, docs/language.md).  The
interpreter matches torch, the emulator matches the interpreter on the compiled kernels,
ptxas takes them without spills, and on a GPU they match the interpreter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from device_checks import needs_ptxas, require_gpu

from tkc.compiler import compile_kernel
from tkc.dtypes import bf16, round_to
from tkc.emulator.machine import emulate
from tkc.interpreter import run_kernel
from tkc.ir.core import Module
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify

# Elementwise i64 arithmetic, comparisons and casts (values far past 2**32, products wrap).
ARITH = """@kernel
def arith(a: i64[N], b: i64[N], s: i64, o: i64[N], q: i64[N], c: i32[N], f: f32[N], h: bf16[N],
          m: bool[N], BN: const = 128):
    grid(cdiv(N, BN))
    p = program_id(0)
    x = a[p*BN:(p+1)*BN]
    y = b[p*BN:(p+1)*BN]
    d = y | 1
    o[p*BN:(p+1)*BN] = x * y + s - abs(y) + maximum(x, y) - minimum(x, -y) ^ (x & 255)
    q[p*BN:(p+1)*BN] = x // d + (x % d) * 3 + cdiv(x, d) + (x << (y & 63)) + (x >> (y & 63)) + ~x
    c[p*BN:(p+1)*BN] = x.to(i32) + (x > y).to(i32)
    f[p*BN:(p+1)*BN] = x.to(f32) + (y * 1000).to(f32)
    h[p*BN:(p+1)*BN] = x.to(bf16)
    m[p*BN:(p+1)*BN] = (x <= y) | (x == 5)
"""
# Rows picked by i64 ids (embedding): an id before, past or far past the table reads zeros.
GATHER = """@kernel
def gather(x: f32[V, D], ids: i64[B], y: f32[B, D], BD: const = 64):
    grid(B, cdiv(D, BD))
    b, j = program_id(0), program_id(1)
    y[b, j*BD:(j+1)*BD] = x[ids[b], j*BD:(j+1)*BD]
"""
# The lens[b] rows of x from starts[b] summed: i64 offsets, an i64 loop bound and condition.
SEGMENT = """@kernel
def segment(x: f32[M, D], starts: i64[B], lens: i64[B], y: f32[B, D], BD: const = 64):
    grid(B)
    b = program_id(0)
    s = starts[b]
    n = lens[b]
    acc = zeros([BD], f32)
    for j in range(n):
        acc += x[s + j.to(i64), 0:BD]
    if n > 0:
        y[b, 0:BD] = acc
"""
# A slice at an i64 scalar offset (2**33 lies past every tensor: zeros, not a wrapped index).
SHIFTED = """@kernel
def shifted(x: f32[N], off: i64, y: f32[N], BN: const = 128):
    grid(cdiv(N, BN))
    p = program_id(0)
    o = off + (p * BN).to(i64)
    y[p*BN:(p+1)*BN] = x[o:o + BN]
"""
# 2-D i64 register tiles with reductions along both axes (shuffles and shared memory of i64),
# and a layout conversion of an i64 tile (the sum's slice layout meets a loaded row's).
REDUCE = """@kernel
def reduce(a: i64[M, N], bias: i64[M], rows: i64[M], cols: i64[N], t: i64[M, N], BM: const = 64,
           BN: const = 64):
    grid(cdiv(N, BN))
    pn = program_id(0)
    x = a[0:BM, pn*BN:(pn+1)*BN]
    cols[pn*BN:(pn+1)*BN] = max(x, axis=0) - min(x, axis=0)
    t[0:BM, pn*BN:(pn+1)*BN] = x * 3 + arange(0, BN).to(i64)[None, :]
    if pn == 0:
        rows[0:BM] = sum(x, axis=1) + bias[0:BM]
"""

# A warp-specialized GEMM whose K loop runs to an i64 scalar: producer and consumer warpgroups
# both compute the bound (blocks past K read zeros; the last block is whole up to K).
GEMM_LEN = """@kernel
def gemm_len(a: bf16[M, K], b: bf16[K, N], c: f32[M, N], kk: i64, BM: const = 128, BN: const = 128,
             BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm, pn = program_id(0), program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(kk, BK)):
        acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc
"""

RNG_WIDE = 2**40


def _args(name: str, seed: int) -> list:
    rng = np.random.default_rng(seed)

    def wide(*shape: int) -> np.ndarray:
        return rng.integers(-RNG_WIDE, RNG_WIDE, shape, dtype=np.int64)

    if name == "arith":
        n = 200
        b = wide(n)
        b[:8] = [0, -1, 5, 63, 64, -64, 2**62, -(2**63)]
        return [wide(n), b, 2**35 + 7, *(np.zeros(n, np.int64) for _ in range(2)), np.zeros(n, np.int32),
                np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, bool)]
    if name == "gather":
        v, d = 37, 150
        ids = rng.integers(0, v, 9).astype(np.int64)
        ids[:5] = [-1, v, 2**32 + 1, -(2**32) + 2, v - 1]  # wrapped to i32 these would be rows 1 and 2
        return [rng.standard_normal((v, d)).astype(np.float32), ids, np.zeros((9, d), np.float32)]
    if name == "segment":
        m, d, b = 40, 64, 7
        starts = rng.integers(-3, m, b).astype(np.int64)
        starts[0] = 2**33  # every row out of bounds
        lens = rng.integers(0, 6, b).astype(np.int64)
        return [rng.standard_normal((m, d)).astype(np.float32), starts, lens, np.zeros((b, d), np.float32)]
    if name == "shifted":
        return [rng.standard_normal(300).astype(np.float32), int(rng.choice([5, -7, 2**33, -(2**33)])),
                np.zeros(300, np.float32)]
    if name == "gemm_len":
        m, n, k = 130, 136, 200
        a, b = (round_to(rng.standard_normal(shape), bf16) for shape in ((m, k), (k, n)))
        return [a, b, np.zeros((m, n), np.float32), int(rng.choice([70, 100, 300]))]
    m, n = 64, 150
    return [wide(m, n), wide(m), np.zeros(m, np.int64), np.zeros(n, np.int64), np.zeros((m, n), np.int64)]


CASES = {"arith": ARITH, "gather": GATHER, "segment": SEGMENT, "shifted": SHIFTED, "reduce": REDUCE,
         "gemm_len": GEMM_LEN}


def _torch_reference(name: str, args: list) -> list:
    """The outputs torch computes from the inputs of ``args`` (int64 wraps like i64)."""
    t = [torch.from_numpy(np.array(a)) if isinstance(a, np.ndarray) else a for a in args]
    if name == "arith":
        x, y, s = t[0], t[1], t[2]
        d = y | 1
        floor = lambda u, v: torch.div(u, v, rounding_mode="floor")  # noqa: E731
        k = y & 63
        o = x * y + s - y.abs() + torch.maximum(x, y) - torch.minimum(x, -y) ^ (x & 255)
        q = floor(x, d) + torch.remainder(x, d) * 3 - floor(-x, d) + (x << k) + (x >> k) + ~x
        c = x.to(torch.int32) + (x > y).to(torch.int32)
        f = x.float() + (y * 1000).float()
        h = x.to(torch.bfloat16).float()
        m = (x <= y) | (x == 5)
        return [x, y, s, o, q, c, f, h, m]
    if name == "gather":
        x, ids = t[0], t[1]
        ok = (ids >= 0) & (ids < x.shape[0])
        return [x, ids, torch.where(ok[:, None], x[ids.clamp(0, x.shape[0] - 1)], 0.0)]
    if name == "segment":
        x, starts, lens = t[0], t[1], t[2]
        y = torch.zeros(len(starts), x.shape[1])
        for b in range(len(starts)):
            rows = [r for r in range(int(starts[b]), int(starts[b] + lens[b])) if 0 <= r < x.shape[0]]
            if int(lens[b]) > 0:
                y[b] = x[rows].sum(0) if rows else 0.0
        return [x, starts, lens, y]
    if name == "shifted":
        x, off = t[0], t[1]
        i = torch.arange(len(x)) + off
        ok = (i >= 0) & (i < len(x))
        return [x, off, torch.where(ok, x[i.clamp(0, len(x) - 1)], 0.0)]
    if name == "gemm_len":
        a, b, kk = t[0], t[1], t[3]
        cut = min(-(-kk // 64) * 64, a.shape[1])
        return [a, b, a[:, :cut] @ b[:cut], kk]
    a, bias = t[0], t[1]
    cols = torch.arange(a.shape[1])[None, :] % 64  # arange(0, BN) in each block of columns
    return [a, bias, a[:, :64].sum(1) + bias, a.max(0).values - a.min(0).values, a * 3 + cols]


def _same(got: list, want: list, atol: float = 1e-5) -> None:
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w.astype(np.float32), rtol=1e-6, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_matches_torch(name: str, seed: int) -> None:
    args = _args(name, seed)
    want = _torch_reference(name, args)
    run_kernel(compile_kernel(CASES[name], stop="tkir", cache=False).kernel_op, args)
    # A product sums in another order than torch's (2**-10: |c| is about 10 here).
    _same(args, [w.numpy() if isinstance(w, torch.Tensor) else w for w in want],
          atol=2**-10 if name == "gemm_len" else 1e-5)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CASES))
def test_emulator_matches_interpreter(name: str, seed: int) -> None:
    src = CASES[name]
    want, got = _args(name, seed), _args(name, seed)
    run_kernel(compile_kernel(src, stop="tkir", cache=False).kernel_op, want)
    emulate(compile_kernel(src, stop="hopper", cache=False).kernel_op, got, seed=seed)
    _same(got, want, atol=1e-4 if name == "gemm_len" else 1e-6)  # wgmma's k16 steps: another order


def test_an_i64_index_is_clamped_not_wrapped() -> None:
    ir = compile_kernel(GATHER, stop="tkir", cache=False).kernel_op.regions[0].block
    names = [op.name for op in ir.ops]
    # ids[b] is an i64 load; the row index is max/min against the i32 range, then cast.
    i = names.index("tile.cast")
    assert names[i - 2:i + 1] == ["tile.maximum", "tile.minimum", "tile.cast"]
    x = np.arange(4 * 64, dtype=np.float32).reshape(4, 64)
    y = np.full((3, 64), np.nan, np.float32)
    run_kernel(compile_kernel(GATHER, stop="tkir", cache=False).kernel_op,
               [x, np.array([2**32 + 1, 2, -(2**32) + 3], np.int64), y])
    np.testing.assert_array_equal(y, np.stack([np.zeros(64), x[2], np.zeros(64)]))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_on_gpu_as_in_the_interpreter(name: str) -> None:
    """What ``tkc run --check`` does on a GPU: the launch's outputs against the interpreter's
    (integers exactly)."""
    require_gpu()
    from tkc import runner

    kernel = compile_kernel(CASES[name], stop="tkir", cache=False).kernel_op
    result = runner.run(kernel, _args(name, 5), "gpu", check=True)
    assert result.ok, [m for m in result.checked if m.bad]


def _convert_i64() -> Module:
    """tests/emulator/kernels/convert.tkir on i64 elements: a blocked tile to the accumulator
    layout and back through a shared scratch tile of 8-byte elements."""
    text = (Path(__file__).parent / "kernels" / "convert.tkir").read_text()
    text = text.replace("xf32", "xi64").replace("f32[", "i64[").replace("smem_bytes = 32768", "smem_bytes = 65536")
    module = parse_module(text, "convert_i64.tkir")
    verify(module)
    return module


def test_a_layout_conversion_of_i64_moves_eight_byte_elements() -> None:
    x = np.random.default_rng(3).integers(-(2**62), 2**62, (100, 60), dtype=np.int64)
    y, z = np.zeros_like(x), np.zeros_like(x)
    emulate(_convert_i64().kernel(), [x, y, z])
    np.testing.assert_array_equal(z, x)
    np.testing.assert_array_equal(y, x)


@needs_ptxas
@pytest.mark.parametrize("name", [*CASES, "convert"])
def test_assembles_without_spills(name: str) -> None:
    if name == "convert":  # hopper IR already
        c = compile_kernel(_convert_i64(), pipeline="", hopper_pipeline="", stop="cubin", cache=False)
    else:
        c = compile_kernel(CASES[name], stop="cubin", cache=False)
    assert (c.resources.spill_stores, c.resources.spill_loads) == (0, 0), c.resources
