"""examples/attn_train.tk -- attention forward with the log-sum-exp, the backward's pre-pass and
its dK/dV/dQ kernel, grouped-query heads -- against an fp32 torch autograd reference in the
interpreter (lengths that are not tile multiples, causal and not, H/KVH = 1, 2 and 4, both
forms of dQ's product), the emulator against the interpreter, ptxas without spills at the
default tiles, rows whose scores are all far below zero (no NaN), and on a GPU against torch."""

from __future__ import annotations

import pathlib

import pytest
import torch

from device_checks import assert_atomics_close, assert_no_spills, launch_tensors, needs_ptxas, require_gpu
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.interpreter import run_kernel

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "attn_train.tk"
KERNELS = ("attn_fwd", "attn_bwd_pre", "attn_bwd")
#: Small tiles for the CPU: 64-row blocks everywhere (dQ's product K^T dS^T, D == BN).
SMALL = {"attn_fwd": {"BM": 64, "BN": 64}, "attn_bwd_pre": {"BM": 64}, "attn_bwd": {"BM": 64, "BN": 64}}
#: dQ's product dS^T.T K (D != BN, BM == BN).
SQUARE = {**SMALL, "attn_bwd": {"BM": 128, "BN": 128}}


def _consts(kernel: str, D: int, causal: bool, tiles: dict) -> dict:
    consts = {"D": D, **tiles.get(kernel, {})}
    return consts if kernel == "attn_bwd_pre" else {**consts, "causal": causal}


def reference(q, k, v, do, causal: bool, scale: float):
    """O, lse and the gradients of q, k, v in fp32 (kv heads repeated over their groups)."""
    q, k, v = (x.float().requires_grad_() for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(g, 1).transpose(-1, -2) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.softmax(s, -1) @ v.repeat_interleave(g, 1)
    o.backward(do.float())
    return o.detach(), torch.logsumexp(s, -1).detach(), q.grad, k.grad, v.grad


def inputs(seed: int, B: int, H: int, KVH: int, N: int, D: int, scale_q: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    q = (scale_q * torch.randn(B, H, N, D, generator=g)).bfloat16()
    k, v = (torch.randn(B, KVH, N, D, generator=g).bfloat16() for _ in range(2))
    do = torch.randn(B, H, N, D, generator=g).bfloat16()
    return q, k, v, do


def run_all(run, q, k, v, do, scale: float):
    """The three kernels through ``run(kernel, args)`` (which runs one in place), outputs poisoned
    first (dq too: attn_bwd_pre zeroes it): o, lse, delta, dq, dk, dv."""
    B, H, N, D = q.shape
    KVH = k.shape[1]
    o = torch.full((B, H, N, D), float("nan")).bfloat16()
    lse, delta = torch.full((B, H, N), float("nan")), torch.full((B, H, N), float("nan"))
    dq = torch.full((B, H, N, D), float("nan"))
    dk, dv = (torch.full((B, KVH, N, D), float("nan")).bfloat16() for _ in range(2))
    o, lse = run("attn_fwd", [q, k, v, o, lse, scale])[3:5]
    delta, dq = run("attn_bwd_pre", [o, do, delta, dq])[2:4]
    dq, dk, dv = run("attn_bwd", [q, k, v, do, lse, delta, dq, dk, dv, scale])[6:9]
    return o, lse, delta, dq, dk, dv


def check(got, want, do) -> None:
    o, lse, delta, dq, dk, dv = got
    wo, wl, wq, wk, wv = want
    torch.testing.assert_close(o.float(), wo, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse, wl, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(delta, (o.float() * do.float()).sum(-1), rtol=1e-4, atol=1e-4)
    for g, w in ((dq, wq), (dk, wk), (dv, wv)):
        # bf16 operands (P, dS, dO) with fp32 accumulation: a few bf16 ulps of the largest.
        torch.testing.assert_close(g.float(), w, rtol=2e-2, atol=2e-2 * max(1.0, w.abs().max().item()))


def _interpreted(D: int, causal: bool, tiles: dict):
    kernels = {n: compile_kernel(EXAMPLE, _consts(n, D, causal, tiles), stop="tkir", cache=False,
                                 kernel=n).kernel_op for n in KERNELS}

    def run(name, args):
        run_kernel(kernels[name], args)
        return args
    return run


@pytest.mark.parametrize("B, H, KVH, N, D, causal, tiles", [
    (2, 4, 2, 80, 64, False, SMALL),     # GQA, one block and a tail
    (1, 4, 1, 200, 64, True, SMALL),     # MQA, causal, blocks below the diagonal and a tail
    (1, 2, 2, 200, 64, True, SQUARE),    # H == KVH, dQ as dS^T.T K
    (1, 4, 2, 150, 32, False, SMALL),    # D != BN: dS^T.T K on 64-row blocks
    (1, 2, 1, 130, 64, False, SQUARE),
    (1, 2, 1, 200, 128, True, {}),       # the default tiles: 64 query rows against 128 keys
])
def test_interpreter_matches_torch(B, H, KVH, N, D, causal, tiles) -> None:
    q, k, v, do = inputs(0, B, H, KVH, N, D)
    scale = D ** -0.5
    got = run_all(_interpreted(D, causal, tiles), q, k, v, do, scale)
    check(got, reference(q, k, v, do, causal, scale), do)


@pytest.mark.parametrize("causal", [False, True])
def test_scores_far_below_zero_give_no_nan(causal: bool) -> None:
    """Every score about -1000: lse is too, and 2^-lse for a key past N would overflow (it is
    masked); a block of rows past N reads lse 0 (its P is 1, its dS 0)."""
    B, H, KVH, N, D = 1, 2, 1, 80, 64
    q = torch.full((B, H, N, D), 4.0).bfloat16()
    k = torch.full((B, KVH, N, D), -4.0).bfloat16()
    v = torch.randn(B, KVH, N, D, generator=torch.Generator().manual_seed(1)).bfloat16()
    do = torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(2)).bfloat16()
    got = run_all(_interpreted(D, causal, SMALL), q, k, v, do, 1.0)
    for t in got:
        assert torch.isfinite(t.float()).all()
    want = reference(q, k, v, do, causal, 1.0)
    torch.testing.assert_close(got[0].float(), want[0], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4)
    for g, w in zip(got[3:], want[2:]):
        # Equal scores: dQ and dK are sums of dS that cancel exactly, left with dS's bf16 rounding.
        torch.testing.assert_close(g.float(), w, rtol=0, atol=0.1)


@pytest.mark.parametrize("name, consts", [("attn_bwd", {"longest_first": True}), ("attn_fwd", {"defer_last": True})])
def test_longest_first_emulated(monkeypatch, name: str, consts: dict) -> None:
    """Causal programs launched longest first (the persistent pass's longest_first, from 16
    blocks a head; pinned for the backward, whose grid order starts each head longest first),
    emulated against the interpreter's grid order: on 40 SMs, groups of two heads and a last
    one of one; every block written once."""
    import tkc.semantics

    monkeypatch.setattr(tkc.semantics, "CPU_SMS", 40)  # (the interpreter and the emulator read it)
    B, H, KVH, N, D = 1, 3, 3, 976, 64
    q, k, v, do = inputs(7, B, H, KVH, N, D)
    g = torch.Generator().manual_seed(8)
    lse = torch.randn(B, H, N, generator=g) + 4
    delta = torch.randn(B, H, N, generator=g)
    if name == "attn_bwd":
        poisoned = torch.full((B, KVH, N, D), float("nan")).bfloat16()  # every block must be written
        args = [q, k, v, do, lse, delta, torch.zeros(B, H, N, D), poisoned, poisoned.clone(), D ** -0.5]
        outs = (6, 7, 8)
    else:
        args, outs = [q, k, v, torch.full((B, H, N, D), float("nan")).bfloat16(), lse, D ** -0.5], (3, 4)
    consts = {**_consts(name, D, True, SMALL), **consts}
    want = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    run_kernel(compile_kernel(EXAMPLE, consts, stop="tkir", cache=False, kernel=name).kernel_op, want)
    hopper = compile_kernel(EXAMPLE, consts, stop="hopper", cache=False, kernel=name).kernel_op
    assert any(r.name_hint == "tile_row" for op in hopper.walk() for r in op.results)
    assert ("hopper.role" in [op.name for op in hopper.walk()]) == (name == "attn_fwd")
    emulate(hopper, args, seed=9)
    assert_atomics_close(args, want, outs)
    assert all(torch.isfinite(args[i].float()).all() for i in outs)


#: attn_bwd with a producer warpgroup issuing the copies (the default at D=128).
ROLES = {**SMALL, "attn_bwd": {"BM": 64, "BN": 64, "warp_specialize": True}}


#: attn_bwd with each product waited for where its result is needed (overlap_products).
OVERLAP = {**SMALL, "attn_bwd": {"BM": 64, "BN": 64, "overlap_products": True}}
OVERLAP_ROLES = {**SMALL, "attn_bwd": {**ROLES["attn_bwd"], "overlap_products": True}}


@pytest.mark.parametrize("name, D, causal, tiles", [
    ("attn_fwd", 64, True, SMALL), ("attn_bwd_pre", 64, False, SMALL),
    ("attn_bwd", 64, False, SMALL), ("attn_bwd", 64, True, SMALL), ("attn_bwd", 64, True, ROLES),
    ("attn_bwd", 64, True, SQUARE), ("attn_bwd", 128, False, {}), ("attn_bwd", 64, True, OVERLAP),
    ("attn_bwd", 64, False, OVERLAP_ROLES), ("attn_bwd", 128, True, {"attn_bwd": {"overlap_products": True}}),
    ("attn_bwd", 128, False, {"attn_bwd": {"warp_specialize": False}}),
])
def test_emulator_matches_interpreter(name: str, D: int, causal: bool, tiles: dict) -> None:
    B, H, KVH, N = 1, 4, 2, 80
    q, k, v, do = inputs(3, B, H, KVH, N, D)
    g = torch.Generator().manual_seed(4)
    o = torch.randn(B, H, N, D, generator=g).bfloat16()
    lse = torch.randn(B, H, N, generator=g) + 4
    delta = torch.randn(B, H, N, generator=g)
    zeros = torch.zeros(B, KVH, N, D).bfloat16()
    args = {"attn_fwd": [q, k, v, o, lse, D ** -0.5], "attn_bwd_pre": [o, do, delta, torch.full((B, H, N, D), 7.0)],
            "attn_bwd": [q, k, v, do, lse, delta, torch.zeros(B, H, N, D), zeros, zeros.clone(), D ** -0.5]}[name]
    outs = {"attn_fwd": (3, 4), "attn_bwd_pre": (2, 3), "attn_bwd": (6, 7, 8)}[name]
    consts = _consts(name, D, causal, tiles)
    want = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    run_kernel(compile_kernel(EXAMPLE, consts, stop="tkir", cache=False, kernel=name).kernel_op, want)
    hopper = compile_kernel(EXAMPLE, consts, stop="hopper", cache=False, kernel=name).kernel_op
    if name == "attn_bwd":
        # Q and dO come through a ring; with a producer role, the consumers store dS^T for
        # wgmma behind barriers of their own.
        ops = [op.name for op in hopper.walk()]
        roles = hopper.attributes["consts"]["warp_specialize"]
        assert "hopper.stage" in ops and ("hopper.role" in ops) == roles and ("hopper.sync" in ops) == roles
    emulate(hopper, args, seed=5)
    assert_atomics_close(args, want, outs)


@pytest.mark.parametrize("D, causal, tiles", [(64, True, SMALL), (128, False, {})])
def test_backward_emulated_on_sm_100a(D: int, causal: bool, tiles: dict) -> None:
    """sm_100a: the backward's products are read at once from tensor memory (64-row products
    with BM = BN = 64, 128-row ones by default) and added to the register accumulators dV, dK
    and dQ's share (tests/blackwell)."""
    B, H, KVH, N = 1, 4, 2, 80
    q, k, v, do = inputs(3, B, H, KVH, N, D)
    g = torch.Generator().manual_seed(4)
    torch.randn(B, H, N, D, generator=g)  # O's draw in test_emulator_matches_interpreter: the same inputs
    lse, delta = torch.randn(B, H, N, generator=g) + 4, torch.randn(B, H, N, generator=g)
    zeros = torch.zeros(B, KVH, N, D).bfloat16()
    args = [q, k, v, do, lse, delta, torch.zeros(B, H, N, D), zeros, zeros.clone(), D ** -0.5]
    consts = _consts("attn_bwd", D, causal, tiles)
    want = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    run_kernel(compile_kernel(EXAMPLE, consts, stop="tkir", cache=False, kernel="attn_bwd").kernel_op, want)
    c = compile_kernel(EXAMPLE, consts, stop="hopper", cache=False, kernel="attn_bwd", target="sm_100a")
    assert "blackwell.mma" in c.asm["hopper"]
    emulate(c.kernel_op, args, seed=5)
    assert_atomics_close(args, want, (6, 7, 8))


@needs_ptxas
@pytest.mark.parametrize("name, D, causal", [(n, D, c) for n in KERNELS for D in (64, 128)
                                             for c in ((False,) if n == "attn_bwd_pre" else (False, True))])
def test_assembles_without_spills(name: str, D: int, causal: bool) -> None:
    c = compile_kernel(EXAMPLE, _consts(name, D, causal, {}), stop="cubin", cache=False, kernel=name)
    assert_no_spills(c)


@pytest.mark.gpu
# 2100 tokens: 17 blocks a head, so causal programs launch longest first (groups of 7 heads on
# 132 SMs: 7, 7 and 2 query heads, 4 kv heads in one group).
@pytest.mark.parametrize("B, H, KVH, N", [(2, 8, 2, 300), (1, 4, 4, 256), (1, 8, 1, 1000), (2, 8, 4, 2100)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_on_gpu_as_torch(B: int, H: int, KVH: int, N: int, D: int, causal: bool) -> None:
    require_gpu()
    kernels = {n: compile_kernel(EXAMPLE, _consts(n, D, causal, {}), kernel=n) for n in KERNELS}

    def run(name, args):
        return launch_tensors(kernels[name], args)

    q, k, v, do = inputs(7, B, H, KVH, N, D)
    scale = D ** -0.5
    got = run_all(run, q, k, v, do, scale)
    check(got, reference(q, k, v, do, causal, scale), do)


@pytest.mark.parametrize("by_tma", [True, False])
@pytest.mark.parametrize("D, causal", [(64, False), (64, True), (128, False), (128, True)])
def test_dq_goes_out_before_dk_accumulates(D: int, causal: bool, by_tma: bool) -> None:
    """The order of attn_bwd's loop body that measured 1.04-1.16x faster on an H200
    (benchmarks/RESULTS.md): lse and delta loaded before the first product (by TMA instead,
    the default pin tma_vectors: read from shared memory where used), dQ's atomic adds issued
    before dK's product (the body's last), so they drain while it runs."""
    consts = {**_consts("attn_bwd", D, causal, {}), **({} if by_tma else {"tma_vectors": False})}
    hopper = compile_kernel(EXAMPLE, consts, stop="hopper", cache=False, kernel="attn_bwd").kernel_op
    loop = next(op for op in hopper.walk() if op.name == "tile.for"
                and any(x.name == "hopper.wgmma" for x in op.regions[0].block.ops))
    ops = loop.regions[0].block.ops
    products = [i for i, op in enumerate(ops) if op.name == "hopper.wgmma"]
    loads = [i for i, op in enumerate(ops) if op.name == ("hopper.smem_load" if by_tma else "hopper.load")]
    adds = [i for i, op in enumerate(ops) if op.name == "tile.atomic"
            or (op.name == "hopper.tma_store" and op.attributes.get("reduce") == "add")]
    assert len(products) == 5 and len(loads) == 2 and len(adds) >= 1
    # dQ's block goes out as a TMA reduction from shared memory (transposed at D=128).
    assert all(ops[i].name == "hopper.tma_store" for i in adds)
    if by_tma:  # each read where it is used: behind the scores' product, before dK's
        assert products[0] < min(loads) and max(loads) < products[-1]
    else:
        assert max(loads) < products[0]
    assert products[-2] < min(adds) and max(adds) < products[-1]
    assert ops[products[-1]].acc is loop.regions[0].block.args[2]  # dK's accumulator
