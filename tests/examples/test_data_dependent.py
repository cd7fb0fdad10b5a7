"""The examples that read indices and combine across programs -- cross_entropy.tk (labels read
by index, the batch mean through an atomic), embedding.tk (rows gathered by ids) and
splitk_gemm.tk (partial products added atomically) -- against torch in the interpreter, the
emulator against the interpreter, ptxas without spills, and on a GPU against torch.  Shapes
have tails on every axis; ids and labels include values outside the table."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from device_checks import assert_no_spills, launch_tensors, needs_ptxas, require_gpu
from tkc.compiler import compile_kernel
from tkc.emulator.machine import emulate
from tkc.interpreter import run_kernel

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
SMALL = {"cross_entropy.tk": {"BV": 1024}, "embedding.tk": {"BD": 256, "ROWS": 3},
         "splitk_gemm.tk": {"BM": 64, "BN": 64, "BK": 64, "SPLIT": 3}}


def _inputs(name: str, seed: int, device: str = "cpu") -> tuple[list[torch.Tensor], torch.Tensor]:
    """The example's arguments and torch's answer for its output."""
    g = torch.Generator().manual_seed(seed)
    if name == "cross_entropy.tk":
        B, V = 7, 2500
        logits = (3 * torch.randn(B, V, generator=g)).to(torch.bfloat16)
        labels = torch.randint(0, V, (B,), generator=g)  # int64, as torch's
        labels[0] = V - 1  # the last column, in the tail block
        want = F.cross_entropy(logits.float(), labels).reshape(1)
        return [logits, labels, torch.zeros(1)], want
    if name == "embedding.tk":
        N, V, D = 11, 20, 600
        ids = torch.randint(-1, V + 1, (N,), generator=g, dtype=torch.int32)  # -1 and V: outside
        table = torch.randn(V, D, generator=g).to(torch.bfloat16)
        inside = (ids >= 0) & (ids < V)
        want = torch.where(inside[:, None], F.embedding(ids.clamp(0, V - 1).long(), table), 0)
        return [ids, table, torch.full((N, D), float("nan")).to(torch.bfloat16)], want
    M, N, K = 150, 136, 712
    a = torch.randn(M, K, generator=g).to(torch.bfloat16)
    b = torch.randn(K, N, generator=g).to(torch.bfloat16)
    c = torch.randn(M, N, generator=g)
    return [a, b, c], c + a.float() @ b.float()


def _tol(name: str) -> dict:
    return {"cross_entropy.tk": dict(rtol=1e-4, atol=1e-4), "embedding.tk": dict(rtol=0, atol=0),
            "splitk_gemm.tk": dict(rtol=1e-4, atol=2e-3)}[name]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(SMALL))
def test_interpreter_matches_torch(name: str, seed: int) -> None:
    k = compile_kernel(EXAMPLES / name, SMALL[name], stop="tkir", cache=False).kernel_op
    args, want = _inputs(name, seed)
    run_kernel(k, args)
    out = args[2]
    torch.testing.assert_close(out.float(), want.float(), **_tol(name))


@pytest.mark.parametrize("name", list(SMALL))
def test_emulator_matches_interpreter(name: str) -> None:
    tile_ir = compile_kernel(EXAMPLES / name, SMALL[name], stop="tkir", cache=False).kernel_op
    hopper = compile_kernel(EXAMPLES / name, SMALL[name], stop="hopper", cache=False).kernel_op
    args, _ = _inputs(name, 3)
    want = [a.clone() for a in args]
    run_kernel(tile_ir, want)
    emulate(hopper, args, seed=3)
    torch.testing.assert_close(args[2].float(), want[2].float(), rtol=1e-5, atol=1e-4)


def test_a_constant_row_and_huge_logits() -> None:
    """exp never sees -inf - (-inf) nor overflows: rows of one value (any label gives log V)
    and logits near bf16's largest."""
    k = compile_kernel(EXAMPLES / "cross_entropy.tk", SMALL["cross_entropy.tk"], stop="tkir", cache=False).kernel_op
    for fill in (0.0, 3.0e38, -3.0e38):
        logits = torch.full((3, 2100), fill).to(torch.bfloat16)
        labels = torch.tensor([0, 1000, 2099])
        loss = torch.zeros(1)
        run_kernel(k, [logits, labels, loss])
        assert np.isclose(loss.item(), np.log(2100), rtol=1e-5), (fill, loss.item())


@needs_ptxas
@pytest.mark.parametrize("consts", [{}, "small"])
@pytest.mark.parametrize("name", list(SMALL))
def test_assembles_without_spills(name: str, consts) -> None:
    c = compile_kernel(EXAMPLES / name, SMALL[name] if consts == "small" else {}, stop="cubin", cache=False)
    assert_no_spills(c)


@pytest.mark.gpu
@pytest.mark.parametrize("consts", [{}, "small"])
@pytest.mark.parametrize("name", list(SMALL))
def test_on_gpu_as_torch(name: str, consts) -> None:
    require_gpu()
    c = compile_kernel(EXAMPLES / name, SMALL[name] if consts == "small" else {})
    args, want = _inputs(name, 7)
    torch.testing.assert_close(launch_tensors(c, args)[2].float(), want.float(), **_tol(name))


# ------------------------------------------------------------------ paged_decode.tk
def _paged(seed: int, D: int = 64, P: int = 16):
    """Arguments of both kernels and torch's attention of each head over its sequence: GQA with
    8 query heads a KV head, lengths 1, a page's worth, and lengths ending inside a page (a
    sequence of length 0 has nothing to attend to: its output is undefined, as in torch).  Pages
    of 16 or 64 tokens are TMA copies (a step a page, or a page of steps); pages of 8 are
    gathered row by row."""
    g = torch.Generator().manual_seed(seed)
    B, KVH, G = 4, 2, 8
    MAXP = max(8, -(-128 // P))
    NP = max(40, B * MAXP)
    HQ = KVH * G
    lens = torch.tensor([1, 16, 37, 123], dtype=torch.int32)
    q = torch.randn(B, HQ, D, generator=g).bfloat16()
    kc = torch.randn(NP, P, KVH, D, generator=g).bfloat16()
    vc = torch.randn(NP, P, KVH, D, generator=g).bfloat16()
    table = torch.randperm(NP, generator=g)[:B * MAXP].reshape(B, MAXP).int()
    scale = D ** -0.5
    want = torch.zeros(B, HQ, D)
    for b in range(B):
        n = int(lens[b])
        pages = table[b, :-(-n // P)].long()
        K = kc[pages].reshape(-1, KVH, D)[:n].float()
        V = vc[pages].reshape(-1, KVH, D)[:n].float()
        for h in range(HQ):
            want[b, h] = torch.softmax(K[:, h // G] @ q[b, h].float() * scale, 0) @ V[:, h // G]
    return (q, kc.reshape(-1, KVH, D), vc.reshape(-1, KVH, D), table, lens, scale), want


def _paged_run(run_kernels, D: int = 64, P: int = 16, splits: int = 16):
    (q, kc, vc, table, lens, scale), want = _paged(0, D, P)
    B, HQ = q.shape[:2]
    part_o, part_ml = torch.zeros(B, HQ, splits, D), torch.zeros(B, HQ, splits, 2)
    out = torch.full((B, HQ, D), float("nan")).bfloat16()
    run_kernels([q, kc, vc, table, lens, part_o, part_ml, scale], [part_o, part_ml, out])
    return out, want


@pytest.mark.parametrize("D, P, splits", [(64, 16, 16), (128, 16, 16), (64, 64, 16), (64, 64, 4), (64, 8, 16)])
def test_paged_decode_interpreter_matches_torch(D: int, P: int, splits: int) -> None:
    consts = {"D": D, "P": P, "SPLITS": splits}

    def run(decode_args, combine_args):
        for name, args in (("paged_decode", decode_args), ("combine", combine_args)):
            run_kernel(compile_kernel(EXAMPLES / "paged_decode.tk", consts, stop="tkir", cache=False,
                                      kernel=name).kernel_op, args)

    out, want = _paged_run(run, D, P, splits)
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("P", [8, 16, 64])
def test_paged_decode_emulator_matches_interpreter(P: int) -> None:
    consts = {"D": 64, "P": P}
    (q, kc, vc, table, lens, scale), _ = _paged(1, P=P)
    B, HQ, D = q.shape
    outs = []
    for stage in ("tkir", "hopper"):
        part_o, part_ml = torch.zeros(B, HQ, 16, D), torch.zeros(B, HQ, 16, 2)
        out = torch.zeros(B, HQ, D).bfloat16()
        for name, args in (("paged_decode", [q, kc, vc, table, lens, part_o, part_ml, scale]),
                           ("combine", [part_o, part_ml, out])):
            k = compile_kernel(EXAMPLES / "paged_decode.tk", consts, stop=stage, cache=False, kernel=name).kernel_op
            (run_kernel if stage == "tkir" else emulate)(k, args)
        outs.append((part_o, part_ml, out))
    for w, g in zip(*outs):
        # bf16 out: the two sum the splits in other orders, a rounding boundary apart at most
        tol = 8e-3 if g.dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(g.float(), w.float(), rtol=tol, atol=tol)


@needs_ptxas
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("kernel, P", [("paged_decode", 8), ("paged_decode", 16), ("paged_decode", 64),
                                       ("combine", 16)])
def test_paged_decode_assembles_without_spills(kernel: str, D: int, P: int) -> None:
    c = compile_kernel(EXAMPLES / "paged_decode.tk", {"D": D, "P": P}, stop="cubin", cache=False, kernel=kernel)
    assert_no_spills(c)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("P", [8, 16, 64, 256])
def test_paged_decode_on_gpu_as_torch(D: int, P: int) -> None:
    require_gpu()
    kernels = {name: compile_kernel(EXAMPLES / "paged_decode.tk", {"D": D, "P": P}, kernel=name)
               for name in ("paged_decode", "combine")}

    def run(decode_args, combine_args):
        part_o, part_ml = launch_tensors(kernels["paged_decode"], decode_args)[5:7]
        combine_args[2].copy_(launch_tensors(kernels["combine"], [part_o, part_ml, combine_args[2]])[2])

    out, want = _paged_run(run, D, P)
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)


# ------------------------------------------------------------------ varlen_attn.tk
VARLEN_SMALL = {"D": 64, "BM": 64, "BN": 64}


def _varlen(seed: int, lengths: list[int], causal: bool, H: int = 2, D: int = 64):
    """q, k, v packed [H, total, D], cu_seqlens, the output poisoned, and torch's attention of
    each sequence on its own."""
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
    T = int(cu[-1])
    q, k, v = (torch.randn(H, T, D, generator=g).bfloat16() for _ in range(3))
    want = torch.zeros(H, T, D)
    for s in range(len(lengths)):
        a, b = int(cu[s]), int(cu[s + 1])
        want[:, a:b] = F.scaled_dot_product_attention(q[None, :, a:b].float(), k[None, :, a:b].float(),
                                                      v[None, :, a:b].float(), is_causal=causal)[0]
    o = torch.full((H, T, D), float("nan")).bfloat16()
    return [q, k, v, o, cu, D ** -0.5, max(lengths)], want


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_attention_interpreter_matches_torch(causal: bool) -> None:
    k = compile_kernel(EXAMPLES / "varlen_attn.tk", {**VARLEN_SMALL, "causal": causal}, stop="tkir",
                       cache=False).kernel_op
    args, want = _varlen(0, [1, 129, 64, 70, 150], causal)
    run_kernel(k, args)
    torch.testing.assert_close(args[3].float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_attention_emulator_matches_interpreter(causal: bool) -> None:
    consts = {**VARLEN_SMALL, "causal": causal}
    args, _ = _varlen(1, [1, 70, 64], causal)
    want = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    run_kernel(compile_kernel(EXAMPLES / "varlen_attn.tk", consts, stop="tkir", cache=False).kernel_op, want)
    emulate(compile_kernel(EXAMPLES / "varlen_attn.tk", consts, stop="hopper", cache=False).kernel_op, args)
    torch.testing.assert_close(args[3].float(), want[3].float(), rtol=1e-2, atol=1e-2)


@needs_ptxas
@pytest.mark.parametrize("consts", [{}, {"causal": True}, VARLEN_SMALL])
def test_varlen_attention_assembles_without_spills(consts: dict) -> None:
    c = compile_kernel(EXAMPLES / "varlen_attn.tk", consts, stop="cubin", cache=False)
    assert_no_spills(c)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_varlen_attention_on_gpu_as_torch(D: int, causal: bool) -> None:
    require_gpu()
    c = compile_kernel(EXAMPLES / "varlen_attn.tk", {"D": D, "causal": causal})
    args, want = _varlen(2, [1, 129, 300, 64, 517], causal, D=D)
    torch.testing.assert_close(launch_tensors(c, args)[3].float(), want, rtol=2e-2, atol=2e-2)
