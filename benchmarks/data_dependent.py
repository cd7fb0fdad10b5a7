"""The kernels that read indices and combine across programs, beside what a PyTorch user runs.

    python benchmarks/data_dependent.py [--quick] [--no-record] [--only varlen_attn,...]

Rows (each timed in turns with its peers on the same GPU, cold L2, benchmarks/harness.py):

* ``cross_entropy``: examples/cross_entropy.tk on bf16 logits (tokens x vocabulary) with
  int64 labels, the mean into one f32 through an atomic add (zeroed inside the timing); peers
  ``F.cross_entropy`` on the same bf16 logits and labels, eager and under ``torch.compile``.
  Reported as time (us) and the logits' bandwidth (GB/s).
* ``embedding``: examples/embedding.tk; peers ``F.embedding`` and a copy of the same bytes
  (``out.copy_(table[:N])``: what the gather may at best approach).  GB/s of rows read+written.
* ``paged_decode``: examples/paged_decode.tk (both kernels) at batch 64, 64 query heads over 8
  KV heads, D 128, pages of 64 and 16 tokens (TMA copies) and of 8 (gathered rows) in a
  shuffled block table; peer SDPA with ``enable_gqa``
  on the same K/V gathered into contiguous tensors beforehand (the gather not timed).  GB/s
  of K and V read (the HBM bandwidth bound).
* ``varlen_attn``: examples/varlen_attn.tk on 16 sequences of 512-4096 tokens, 16 heads, D 128,
  causal and not, beside attn.tk on 16 equal sequences of the same total tokens and SDPA on the
  padded batch with a mask (counted by the useful FLOPs).  TFLOP/s.
* ``splitk_gemm``: examples/splitk_gemm.tk (f32 output zeroed before, inside the timing; SPLIT
  chosen to give about two programs an SM; partial tiles added by TMA reductions, and by
  ``red.global`` from the threads with the pin ``tma_store=False``) on a
  small M x N with a long K; peer ``torch.matmul`` of the bf16 operands (cuBLAS picks its own
  split).  TFLOP/s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.append(str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from harness import Row, in_turns, report  # noqa: E402

from tkc.compiler import compile_kernel  # noqa: E402
from tkc.runtime.launch import launch  # noqa: E402

EXAMPLES = ROOT / "examples"


def cross_entropy_rows(shapes: list[tuple[int, int]], runs: int) -> list[Row]:
    k = compile_kernel(EXAMPLES / "cross_entropy.tk", {})
    compiled_ce = torch.compile(lambda x, y: F.cross_entropy(x, y))
    rows = []
    for B, V in shapes:
        logits = torch.randn(B, V, device="cuda", dtype=torch.bfloat16)
        labels64 = torch.randint(0, V, (B,), device="cuda")
        loss = torch.zeros(1, device="cuda")

        def ours():
            loss.zero_()
            launch(k, [logits, labels64, loss])

        ours()
        want = F.cross_entropy(logits.float(), labels64)
        torch.cuda.synchronize()
        err = abs(loss.item() - want.item())
        assert err < 1e-3 * max(1.0, abs(want.item())), (B, V, loss.item(), want.item())
        compiled_ce(logits, labels64)  # compile outside the timing
        t = in_turns({"tkc": ours, "torch eager": lambda: F.cross_entropy(logits, labels64),
                      "torch.compile": lambda: compiled_ce(logits, labels64)}, runs)
        nbytes = logits.numel() * 2
        rows.append(Row("cross_entropy", f"{B}x{V} bf16", "us", {n: s * 1e6 for n, s in t.items()},
                        notes=f"tkc reads the logits at {nbytes / t['tkc'] / 1e9:.0f} GB/s; "
                              f"|loss - torch| = {err:.2e}"))
    return rows


def embedding_rows(shapes: list[tuple[int, int, int]], runs: int) -> list[Row]:
    rows = []
    for N, V, D in shapes:
        # Blocks of up to 2048 columns, and short rows several to a program (best of BD 512-2048
        # and ROWS 1-8 on an H200: 2048/1 at D=4096, 1024/8 at D=1024).
        k = compile_kernel(EXAMPLES / "embedding.tk", {"BD": min(D, 2048), "ROWS": max(1, min(8, 8192 // D))})
        table_ = torch.randn(V, D, device="cuda", dtype=torch.bfloat16)
        ids = torch.randint(0, V, (N,), device="cuda", dtype=torch.int32)
        ids64 = ids.long()
        out = torch.empty(N, D, device="cuda", dtype=torch.bfloat16)
        copy_out = torch.empty(min(N, V), D, device="cuda", dtype=torch.bfloat16)
        launch(k, [ids, table_, out])
        torch.cuda.synchronize()
        assert torch.equal(out, F.embedding(ids64, table_))
        t = in_turns({"tkc": lambda: launch(k, [ids, table_, out]),
                      "F.embedding": lambda: F.embedding(ids64, table_),
                      "copy": lambda: copy_out.copy_(table_[:min(N, V)])}, runs)
        moved = {"tkc": 2 * N * D * 2, "F.embedding": 2 * N * D * 2, "copy": 2 * min(N, V) * D * 2}
        rows.append(Row("embedding", f"{N} ids, {V}x{D} bf16", "GB/s",
                        {n: moved[n] / s / 1e9 for n, s in t.items()}))
    return rows


def splitk_rows(shapes: list[tuple[int, int, int]], runs: int) -> list[Row]:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for M, N, K in shapes:
        # SPLIT fills the GPU: about two programs an SM, each at least four K blocks.
        tiles = -(-M // 128) * -(-N // 128)
        split = max(1, min(-(-K // 64) // 4, round(2 * sms / tiles)))
        # The partial tiles go out by TMA reductions; the pin tma_store=False adds them by threads.
        kernels = {pin: compile_kernel(EXAMPLES / "splitk_gemm.tk", {"SPLIT": split, "tma_store": pin})
                   for pin in (True, False)}
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(M, N, device="cuda")

        def ours(pin: bool = True):
            c.zero_()
            launch(kernels[pin], [a, b, c])

        for pin in (False, True):
            ours(pin)
            torch.cuda.synchronize()
            torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-1)
        t = in_turns({"tkc": ours, "tkc, red.global (tma_store=False)": lambda: ours(False),
                      "torch.matmul": lambda: torch.matmul(a, b)}, runs)
        rows.append(Row("splitk_gemm", f"{M}x{N}x{K} bf16, SPLIT={split}", "TFLOP/s",
                        {n: 2 * M * N * K / s / 1e12 for n, s in t.items()}))
    return rows


def paged_decode_rows(lengths: list[int], runs: int, B: int = 64, KVH: int = 8, G: int = 8, D: int = 128,
                     P: int = 16, splits: int = 16) -> list[Row]:
    decode = compile_kernel(EXAMPLES / "paged_decode.tk", {"D": D, "P": P, "G": G, "SPLITS": splits},
                            kernel="paged_decode")
    combine = compile_kernel(EXAMPLES / "paged_decode.tk", {"D": D, "SPLITS": splits}, kernel="combine")
    rows = []
    for L in lengths:
        HQ, pages = KVH * G, L // P
        q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(B * pages, P, KVH, D, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        table = torch.randperm(B * pages, device="cuda", dtype=torch.int32).reshape(B, pages)
        lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
        part_o = torch.empty(B, HQ, splits, D, device="cuda")
        part_ml = torch.empty(B, HQ, splits, 2, device="cuda")
        out = torch.empty(B, HQ, D, device="cuda", dtype=torch.bfloat16)
        scale = D ** -0.5

        def ours():
            launch(decode, [q, kc.view(-1, KVH, D), vc.view(-1, KVH, D), table, lens, part_o, part_ml, scale])
            launch(combine, [part_o, part_ml, out])

        # The peer's K/V gathered into contiguous [B, KVH, L, D] outside the timing.
        k = kc[table.long()].reshape(B, L, KVH, D).transpose(1, 2).contiguous()
        v = vc[table.long()].reshape(B, L, KVH, D).transpose(1, 2).contiguous()
        qs = q[:, :, None, :]

        def sdpa():
            return F.scaled_dot_product_attention(qs, k, v, scale=scale, enable_gqa=True)

        ours()
        torch.testing.assert_close(out.float(), sdpa()[:, :, 0].float(), rtol=2e-2, atol=2e-2)
        t = in_turns({"tkc": ours, "SDPA (gathered K/V)": sdpa}, runs)
        nbytes = 2 * B * L * KVH * D * 2
        rows.append(Row("paged_decode", f"batch {B}, {L} tokens, {HQ}/{KVH} heads, D {D}, pages of {P}", "GB/s",
                        {n: nbytes / s / 1e9 for n, s in t.items()}))
    return rows


def varlen_rows(runs: int, H: int = 16, D: int = 128, seqs: int = 16, causal_modes=(False, True)) -> list[Row]:
    """Varlen attention on ``seqs`` sequences of 512-4096 tokens (seeded), beside attn.tk on a
    batch of as many equal sequences of the same total tokens, and SDPA on the padded batch."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(512, 4097, (seqs,), generator=g).tolist()
    total, L = sum(lengths), sum(lengths) // seqs
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(H, total, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    qb, kb, vb = (torch.randn(seqs, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ob = torch.empty_like(qb)
    qp, kp, vp = (torch.zeros(seqs, H, max(lengths), D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for s, n in enumerate(lengths):
        a = int(cu[s])
        qp[s, :, :n], kp[s, :, :n], vp[s, :, :n] = q[:, a:a + n], k[:, a:a + n], v[:, a:a + n]
    valid = torch.arange(max(lengths), device="cuda")[None, :] < torch.tensor(lengths, device="cuda")[:, None]
    scale = D ** -0.5
    rows = []
    for causal in causal_modes:
        var = compile_kernel(EXAMPLES / "varlen_attn.tk", {"D": D, "causal": causal})
        att = compile_kernel(EXAMPLES / "attn.tk", {"D": D, "causal": causal})
        mask = valid[:, None, None, :]
        if causal:
            mask = mask & torch.ones(max(lengths), max(lengths), dtype=torch.bool, device="cuda").tril()
        launch(var, [q, k, v, o, cu, scale, max(lengths)])
        s0 = lengths[0]
        ref = F.scaled_dot_product_attention(q[None, :, :s0], k[None, :, :s0], v[None, :, :s0], is_causal=causal)
        torch.testing.assert_close(o[:, :s0].float(), ref[0].float(), rtol=2e-2, atol=2e-2)
        t = in_turns({"tkc": lambda: launch(var, [q, k, v, o, cu, scale, max(lengths)]),
                      "tkc attn.tk (equal lengths)": lambda: launch(att, [qb, kb, vb, ob, scale]),
                      "SDPA padded + mask": lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)}, runs)
        per = 0.5 if causal else 1.0
        flops = {"tkc": sum(4 * n * n * D * H * per for n in lengths),
                 "tkc attn.tk (equal lengths)": seqs * 4 * L * L * D * H * per,
                 "SDPA padded + mask": sum(4 * n * n * D * H * per for n in lengths)}  # useful work only
        rows.append(Row("varlen_attn", f"{seqs} sequences of 512-4096 ({total} tokens), {H} heads, D {D}"
                        + (", causal" if causal else ""), "TFLOP/s", {n: flops[n] / s / 1e12 for n, s in t.items()},
                        notes="attn.tk: the same total tokens as equal sequences; SDPA counted by its useful work"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one small shape per kernel")
    ap.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    ap.add_argument("--only", default="cross_entropy,embedding,splitk_gemm,paged_decode,varlen_attn",
                    help="comma-separated kernels")
    args = ap.parse_args()
    only = set(args.only.split(","))
    runs = 30 if args.quick else 60
    ce = [(4096, 32768)] if args.quick else [(4096, 32768), (32768, 131072), (8192, 262144)]
    emb = [(8192, 32000, 4096)] if args.quick else [(8192, 32000, 4096), (32768, 128256, 4096), (65536, 50304, 1024)]
    sk = [(512, 512, 16384)] if args.quick else [(256, 256, 32768), (512, 512, 16384), (1024, 1024, 8192)]
    pd = [4096] if args.quick else [4096, 16384, 32768]
    groups = {"cross_entropy": lambda: cross_entropy_rows(ce, runs), "embedding": lambda: embedding_rows(emb, runs),
              "splitk_gemm": lambda: splitk_rows(sk, runs),
              "paged_decode": lambda: [r for P in (64, 16, 8) for r in paged_decode_rows(pd, runs, P=P)],
              "varlen_attn": lambda: varlen_rows(runs, causal_modes=(False,) if args.quick else (False, True))}
    report("data_dependent.py", args, list(groups), [r for name, rows_of in groups.items() if name in only
                                                     for r in rows_of()])


if __name__ == "__main__":
    main()
