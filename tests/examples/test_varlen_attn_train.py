"""examples/varlen_attn_train.tk -- attention forward with the log-sum-exp, the backward's pre-pass
and its dK/dV/dQ kernel over packed sequences of ragged lengths (empty, one token, not tile
multiples), grouped-query heads -- against a float64 torch reference of each sequence on its
own in the interpreter (causal and not, H/KVH = 1, 2 and 4, both forms of dQ's product), the
emulator against the interpreter, ptxas without spills, and on a GPU against the reference."""

from __future__ import annotations

import pathlib

import pytest
import torch

from device_checks import assert_atomics_close, assert_no_spills, launch_tensors, needs_ptxas, require_gpu
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.interpreter import run_kernel
from tkc.ops.varlen_attention import _padded_rows
from varlen_reference import assert_gradients_close, packed, ragged_lengths, reference

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "varlen_attn_train.tk"
KERNELS = ("varlen_attn_fwd", "varlen_attn_bwd_pre", "varlen_attn_bwd")
#: Small tiles for the CPU: 64-row blocks everywhere (dQ's product K^T dS^T, D == BN).
SMALL = {"varlen_attn_fwd": {"BM": 64, "BN": 64}, "varlen_attn_bwd": {"BM": 64, "BN": 64}}
#: dQ's product dS^T.T K (D != BN, BM == BN).
SQUARE = {**SMALL, "varlen_attn_bwd": {"BM": 128, "BN": 128}}


def _consts(kernel: str, D: int, causal: bool, tiles: dict) -> dict:
    consts = {"D": D, **tiles.get(kernel, {})}
    return consts if kernel == "varlen_attn_bwd_pre" else {**consts, "causal": causal}


def rows_at(cu: torch.Tensor) -> list[int]:
    """Each sequence's first row of lse and delta ([H, T + 128 S]): the kernels' ``rows_at``."""
    return [(int(c) + 128 * s) // 128 * 128 for s, c in enumerate(cu.tolist())]


def unpadded(x: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """lse or delta ``[H, T + 128 S]`` as ``[H, T]``: each sequence's rows at its tokens."""
    out = torch.full((x.shape[0], int(cu[-1])), float("nan"), dtype=x.dtype, device=x.device)
    for first, a, b in zip(rows_at(cu), cu.tolist(), cu[1:].tolist()):
        out[:, a:b] = x[:, first:first + b - a]
    return out


def run_all(run, q, k, v, do, cu, scale: float, unpad: bool = True):
    """The three kernels through ``run(kernel, args)`` (which runs one in place), outputs poisoned
    first (dq zeroed, as its caller must): o, lse, delta ([H, T], from their padded rows, unless
    ``unpad`` is False), dq, dk, dv."""
    (T, H, D), KVH = q.shape, k.shape[1]
    longest = int((cu[1:] - cu[:-1]).max())
    TL = _padded_rows({"T": T, "S1": cu.shape[0]})  # as tkc.ops.varlen_attention sizes it
    o = torch.full((T, H, D), float("nan")).bfloat16()
    lse, delta = torch.full((H, TL), float("nan")), torch.full((H, TL), float("nan"))
    dq = torch.zeros(T, H, D)
    dk, dv = (torch.full((T, KVH, D), float("nan")).bfloat16() for _ in range(2))
    o, lse = run("varlen_attn_fwd", [q, k, v, o, lse, cu, scale, longest])[3:5]
    delta = run("varlen_attn_bwd_pre", [o, do, delta, cu, longest])[2]
    dq, dk, dv = run("varlen_attn_bwd", [q, k, v, do, lse, delta, dq, dk, dv, cu, scale, longest])[6:9]
    if unpad:
        lse, delta = unpadded(lse, cu), unpadded(delta, cu)
    return o, lse, delta, dq, dk, dv


def check(got, want, do) -> None:
    o, lse, delta, dq, dk, dv = got
    wo, wl, wq, wk, wv = want
    torch.testing.assert_close(o.double(), wo, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse.double(), wl, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(delta, (o.float() * do.float()).sum(-1).T, rtol=1e-4, atol=1e-4)
    assert_gradients_close((dq, dk, dv), (wq, wk, wv))


def _compiled(D: int, causal: bool, tiles: dict, stop: str | None = None) -> dict:
    """Each kernel for ``D`` and ``causal`` (``tiles``: constants per kernel) compiled to ``stop``,
    or, when None, to a cubin a launch takes (through the disk cache)."""
    uncached = {} if stop is None else {"stop": stop, "cache": False}
    return {n: compile_kernel(EXAMPLE, _consts(n, D, causal, tiles), kernel=n, **uncached) for n in KERNELS}


def _interpreted(D: int, causal: bool, tiles: dict):
    kernels = {n: c.kernel_op for n, c in _compiled(D, causal, tiles, "tkir").items()}

    def run(name, args):
        run_kernel(kernels[name], args)
        return args
    return run


@pytest.mark.parametrize("seed, count, longest, H, KVH, D, causal, tiles", [
    (0, 6, 150, 4, 2, 64, False, SMALL),     # GQA; empty, one-token, tails, several blocks
    (1, 6, 150, 4, 1, 64, True, SMALL),      # MQA, causal: blocks below the diagonal, tails
    (2, 5, 200, 2, 2, 64, True, SQUARE),     # H == KVH, dQ as dS^T.T K
    (3, 4, 130, 2, 1, 64, False, SQUARE),
    (4, 4, 200, 2, 1, 128, True, {}),        # the default tiles: 64 query rows against 128 keys
    (5, 4, 140, 4, 2, 128, False, {}),
])
def test_interpreter_matches_torch(seed, count, longest, H, KVH, D, causal, tiles) -> None:
    lengths = ragged_lengths(seed, count, longest)
    q, k, v, do, cu = packed(seed, lengths, H, KVH, D)
    scale = D ** -0.5
    got = run_all(_interpreted(D, causal, tiles), q, k, v, do, cu, scale)
    check(got, reference(q, k, v, do, cu, causal, scale), do)


@pytest.mark.parametrize("causal", [False, True])
def test_tokens_of_other_sequences_do_not_leak(causal: bool) -> None:
    """A block that runs past the first sequence's end reads the second's rows (not zeros),
    which its masks must drop: the first sequence's outputs and gradients are bit for bit the
    same whatever the second holds."""
    q, k, v, do, cu = packed(6, [50, 90], 2, 1, 64)
    runs = []
    for wild in (False, True):
        if wild:
            for t in (q, k, v, do):
                t[50:] = t[50:] * 8 + 100
        got = run_all(_interpreted(64, causal, SMALL), q, k, v, do, cu, 0.125)
        runs.append([got[1][:, :50], *(t[:50] for t in got if t.shape[0] == q.shape[0])])
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    want = reference(q[:50], k[:50], v[:50], do[:50], cu[:2], causal, 0.125)
    assert_gradients_close(runs[1][-3:], want[2:])


@pytest.mark.parametrize("name, D, causal, tiles", [
    ("varlen_attn_fwd", 64, True, SMALL), ("varlen_attn_bwd_pre", 64, False, SMALL),
    ("varlen_attn_bwd", 64, False, SMALL), ("varlen_attn_bwd", 64, True, SMALL),
    ("varlen_attn_bwd", 64, True, SQUARE), ("varlen_attn_bwd", 128, False, {}),
    ("varlen_attn_bwd", 128, True, {}),
])
def test_emulator_matches_interpreter(name: str, D: int, causal: bool, tiles: dict) -> None:
    H, KVH = 4, 2
    q, k, v, do, cu = packed(3, [1, 0, 70, 64, 5], H, KVH, D)
    T = q.shape[0]
    g = torch.Generator().manual_seed(4)
    o = torch.randn(T, H, D, generator=g).bfloat16()
    TL = _padded_rows({"T": T, "S1": cu.shape[0]})
    lse = torch.randn(H, TL, generator=g) + 4
    delta = torch.randn(H, TL, generator=g)
    if name == "varlen_attn_bwd":
        # The forward's lse and the pre-pass's delta, as the backward gets them: with random
        # ones, P = exp(S - lse) runs past 1 and dQ's sums cancel, so that the order of the
        # atomic adds moves them by more than the check allows.
        _, lse, delta, *_ = run_all(_interpreted(D, causal, tiles), q, k, v, do, cu, D ** -0.5, unpad=False)
    zeros = torch.zeros(T, KVH, D).bfloat16()
    args = {"varlen_attn_fwd": [q, k, v, o, lse, cu, D ** -0.5, 70], "varlen_attn_bwd_pre": [o, do, delta, cu, 70],
            "varlen_attn_bwd": [q, k, v, do, lse, delta, torch.zeros(T, H, D), zeros, zeros.clone(), cu,
                                D ** -0.5, 70]}[name]
    outs = {"varlen_attn_fwd": (3, 4), "varlen_attn_bwd_pre": (2,), "varlen_attn_bwd": (6, 7, 8)}[name]
    consts = _consts(name, D, causal, tiles)
    want = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    run_kernel(compile_kernel(EXAMPLE, consts, stop="tkir", cache=False, kernel=name).kernel_op, want)
    hopper = compile_kernel(EXAMPLE, consts, stop="hopper", cache=False, kernel=name).kernel_op
    ops = {op.name for op in hopper.walk()}
    # The passes schedule them as attn_train.tk's: the forward's loads in a producer warpgroup
    # and a ring, the backward's Q and dO through a ring with every warpgroup computing.
    assert ("hopper.stage" in ops) == (name != "varlen_attn_bwd_pre")
    assert ("hopper.role" in ops) == (name == "varlen_attn_fwd")
    emulate(hopper, args, seed=5)
    # dQ sums dS K, dS rounded to bf16: another order of the sums moves it by a bf16 ulp of dS
    assert_atomics_close(args, want, outs, f32=2**-8 if name == "varlen_attn_bwd" else 1e-4)


@needs_ptxas
@pytest.mark.parametrize("D, causal", [(64, False), (64, True), (128, False), (128, True)])
def test_assembles_without_spills(D: int, causal: bool) -> None:
    for c in _compiled(D, causal, {}, "cubin").values():
        assert_no_spills(c)


@pytest.mark.gpu
@pytest.mark.parametrize("H, KVH, lengths", [(8, 2, [1, 0, 129, 300, 64, 517]), (4, 4, [1000, 3, 255]),
                                             (8, 1, [2049, 0, 700, 1])])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_on_gpu_as_torch(H: int, KVH: int, lengths: list[int], D: int, causal: bool) -> None:
    require_gpu()
    kernels = _compiled(D, causal, {})

    def run(name, args):
        return launch_tensors(kernels[name], args)

    q, k, v, do, cu = packed(7, lengths, H, KVH, D)
    scale = D ** -0.5
    got = run_all(run, q, k, v, do, cu, scale)
    want = reference(*(t.cuda() for t in (q, k, v, do, cu)), causal, scale)
    check(got, [w.cpu() for w in want], do)
