"""Multi-GPU kernels (issue 28) beside NCCL + cuBLAS and PyTorch's symmetric-memory operators.

    torchrun --nproc-per-node 2 benchmarks/multi_gpu.py [--quick] [--check] [--no-record]
                                                        [--only allgather_gemm,gemm_reducescatter,...]
                                                        [--also DIR] [--consts NAME=VALUE,...]...

One process a GPU; every rank runs every contender in the same order.  Each timed call starts
with every rank in step (CUDA synchronize, then a barrier) and is timed with CUDA events; a
call's time is the slowest rank's, a contender's the median of its calls, the contenders taking
turns (``tkc.runtime.timing.interleaved_medians``: clock drift costs each alike).  No L2 flush: the
operands are hundreds of MB.  Rank 0 prints the markdown table, appends it to
benchmarks/RESULTS.md (unless ``--no-record``) and draws benchmarks/plot_multi_gpu.png.

Shapes are a Llama-70B MLP under tensor parallelism over R ranks (8192 tokens, hidden 8192,
FFN 28672), and a smaller one (2048 tokens, 4096, 14336); ``--quick`` runs the smaller only.

* ``allgather_gemm`` (column-sharded up projection): every rank holds tokens/R rows of the
  activations [tokens/R, hidden] and its FFN/R columns of the weights; out = all_gather(a) @ b,
  [tokens, FFN/R].  tkc: examples/allgather_gemm.tk (a in its slot of the symmetric buffer
  the kernel gathers into, where the layer before would have written it; its flags zeroed
  before every call, in the timing); NCCL + cuBLAS:
  ``all_gather_into_tensor`` then ``torch.matmul``; symm_mem fused:
  ``torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, group)``.  2 tokens hidden FFN/R FLOPs.
* ``gemm_reducescatter`` (row-sharded down projection): a [tokens, FFN/R], b [FFN/R, hidden];
  out = reduce_scatter(a @ b), [tokens/R, hidden].  tkc: examples/gemm_reducescatter.tk (bf16
  partials added into their owner's out by TMA, as the other two reduce bf16; out zeroed before
  every call, in the timing: a caller pays it); NCCL + cuBLAS: matmul then
  ``reduce_scatter_tensor``; symm_mem fused: ``fused_matmul_reduce_scatter(a, b, "sum", 0,
  group)``.
* ``gemm_allreduce``: the same product, all-reduced: out [tokens, hidden] on every rank.  tkc:
  examples/gemm_allreduce.tk (its flags and this rank's chunk of out zeroed before every call,
  in the timing); NCCL + cuBLAS: matmul then ``all_reduce``; symm_mem two-shot:
  matmul into symmetric memory then ``torch.ops.symm_mem.two_shot_all_reduce_`` (no multicast).
* ``ring_attn``: examples/ring_attn.tk over R ranks of N tokens each (every rank's queries
  against every rank's keys) against NCCL's all-gather of K and V then SDPA on the gathered keys,
  and attn.tk on one GPU over its own N tokens run R times (the same work a rank does: the rate
  ring attention should stay within 10% of).
* ``moe_dispatch``: an expert-parallel MoE layer's dispatch + expert GEMMs, top-1 routing drawn
  uniformly, every rank's tokens sorted by expert before the call: examples/moe_dispatch.tk
  (the rank's own rows copied by every program, then the others pushed once into their expert's
  rank by a few programs while the rest multiply the own rows; the grouped GEMM from local
  memory, source by source as the rows arrive; 64-row tiles where experts get under 128 rows a
  source) against
  the NCCL sequence a MoE layer runs (rows gathered into send order, ``all_to_all_single``, rows
  regrouped by local expert, ``torch._grouped_mm``), with the split sizes known ahead (the
  peer's counts exchange and host sync are not timed: it is favoured), and that grouped GEMM
  alone on rows already in place (the rate with no communication).  FLOPs: the mean rank's, 2
  tokens D F.
* ``collectives``: all-gather and reduce-scatter of 16 MB to 1 GB (the gathered or reduced
  tensor's size): examples/allgather.tk and reducescatter.tk against NCCL, bus bandwidth as
  nccl-tests counts it ((R - 1) / R of that size over the time), 10 calls back to back a
  timing as nccl-tests runs them (the other groups: one call a timing).

``--check``: every contender once at the smaller shape, against float32 torch on the same
inputs (relative error of the whole output); exit status 1 if one is off.
``--timeline``: after each row, one call of each contender under PyTorch's profiler on every
rank (benchmarks/timeline.py): a lane per (contender, rank) in benchmarks/timeline_multi_gpu.png
(``_4`` etc. beyond two ranks), and in RESULTS.md each call's length and its slowest rank's
time by kind of kernel (tkc, cuBLAS, NCCL, ...) and idle between kernels.
``--also DIR`` (repeatable): the all-gather + GEMM, GEMM + reduce-scatter, GEMM + all-reduce,
ring attention and MoE dispatch examples of DIR too (other versions of them, such as edited
copies), as contenders ``tkc DIR`` timed in turns with the rest.  ``--consts NAME=VALUE,...``
(repeatable): each version of those with these compile-time constants (or pins) too, as
contender ``tkc [DIR] NAME=VALUE,...`` (a sweep of a tuning constant; a kernel without one of
the names leaves that contender out).
NVLink multicast stays off (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``, set before anything starts).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"] + [str(ROOT / "benchmarks")]

from tkc.runtime.ranks import init_process_group, no_multicast  # noqa: E402

no_multicast()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tkc  # noqa: E402
from tkc.cli import parse_value  # noqa: E402
from tkc.pins import PINS  # noqa: E402
from tkc.runtime.timing import interleaved_medians  # noqa: E402

GROUPS = ["allgather_gemm", "gemm_reducescatter", "gemm_allreduce", "ring_attn", "moe_dispatch", "collectives"]
#: (name, tokens, hidden, FFN): the whole layer; each rank holds 1/R of it.
SHAPES = [("Llama-70B", 8192, 8192, 28672), ("small", 2048, 4096, 14336)]
#: MoE layers: (name, tokens a rank, D, F, experts in all); experts are split evenly over the ranks.
MOE_SHAPES = [("Mixtral-8x7B experts", 4096, 4096, 14336, 8), ("64 fine-grained experts", 4096, 2048, 1408, 64)]
COLLECTIVE_BYTES = [16 << 20, 64 << 20, 256 << 20, 1 << 30]
#: the collectives are timed this many calls back to back (timed's ``calls``)
COLLECTIVE_CALLS = 10
EXAMPLES = ROOT / "examples"
BF16 = torch.bfloat16
#: --also: folders whose fused GEMMs (allgather_gemm.tk ...) and ring_attn.tk run beside examples/'s
ALSO: list[Path] = []
#: --consts: sets of compile-time constants (or pins) every version of those runs with too
CONSTS: list[str] = []


def timed(fn: Callable[[], Any], runs: int, warmup: int = 3, calls: int = 1) -> float:
    """Seconds per call of ``fn`` on every rank: ``calls`` calls back to back after every rank
    is in step, the slowest rank's time of each such window over ``calls``, the median of
    ``runs``.  (The host lets the ranks go up to hundreds of µs apart, which the first call's
    waits absorb: more than a collective of 16 MB takes; back to back, as nccl-tests times, the
    skew is paid once a window.)"""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        dist.barrier()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3 / calls)
    slowest = torch.tensor(times, device="cuda")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest.median())


def in_turns(contenders: dict[str, Callable[[], Any]], runs: int, rounds: int = 3,
             calls: int = 1) -> dict[str, float | None]:
    """:func:`timed` of each contender over ``rounds`` rounds, taking turns; None for one that
    failed (every rank's failure is the same: they run the same code)."""
    failed: dict[str, str] = {}

    def timer(name: str) -> Callable[[], float]:
        def run() -> float:
            if name in failed:
                return float("nan")
            try:
                return timed(contenders[name], max(runs // rounds, 5), calls=calls)
            except Exception as e:  # a peer torch lacks, a shape it refuses: the row says so
                failed[name] = f"{type(e).__name__}: {e}"
                return float("nan")
        return run

    medians = interleaved_medians([timer(n) for n in contenders], rounds)
    for name, why in failed.items():
        say(f"  {name} failed: {why.splitlines()[0][:300]}")
    return {n: None if n in failed else m for n, m in zip(contenders, medians)}


def say(text: str) -> None:
    if dist.get_rank() == 0:
        print(text, flush=True)


def randn(*shape: int, dtype: torch.dtype = BF16, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def variants(example: str) -> dict[str, tuple[tkc.Kernel, dict[str, Any]]]:
    """The tkc contenders of a fused GEMM, each a kernel and its constants: ``tkc``
    (examples/) and ``tkc DIR`` for each --also folder holding the example, each also as
    ``... NAME=VALUE,...`` for each --consts whose names the kernel takes (or are pins)."""
    kernels = {"tkc": tkc.load(EXAMPLES / example)}
    kernels.update({f"tkc {d.name}": tkc.load(d / example) for d in ALSO if (d / example).exists()})
    out: dict[str, tuple[tkc.Kernel, dict[str, Any]]] = {}
    for name, k in kernels.items():
        out[name] = (k, {})
        for text in CONSTS:
            consts = {c: parse_value(v) for c, _, v in (item.partition("=") for item in text.split(","))}
            if set(consts) <= set(k.params) | set(PINS):
                out[f"{name} {text}"] = (k, consts)
    return out


def symmetric(x: torch.Tensor) -> torch.Tensor:
    return tkc.symmetric_empty(tuple(x.shape), x.dtype).copy_(x)


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm().clamp_min(1e-30))


# ------------------------------------------------------------------ the groups
def allgather_gemm(tokens: int, hidden: int, ffn: int) -> tuple[dict, dict, float]:
    """Contenders, their outputs (after a call) against the reference, and the FLOPs of a call."""
    R, group = dist.get_world_size(), dist.group.WORLD.group_name
    M, K, N = tokens // R, hidden, ffn // R
    a, b = randn(M, K), randn(K, N, scale=K ** -0.5)
    ag = tkc.symmetric_zeros((R, M, K), BF16)  # every rank's rows, pushed by their owners
    ready = tkc.symmetric_zeros((R, -(-M // 128)), torch.int32)  # a flag a tile row (BM = 128)
    gathered, c2 = torch.empty(R * M, K, dtype=BF16, device="cuda"), torch.empty(R * M, N, dtype=BF16, device="cuda")
    fused: list[Any] = [None]

    def unfused() -> None:
        dist.all_gather_into_tensor(gathered, a)
        torch.matmul(gathered, b, out=c2)

    def symm_mem() -> None:
        fused[0] = torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, group)[1][0]

    ag[dist.get_rank()] = a  # the shard in its own slot (a layer before would write it there)
    dist.all_gather_into_tensor(gathered, a)  # real operands for the GEMM alone from its first call

    ours, outputs = {}, {}
    for name, (k, consts) in variants("allgather_gemm.tk").items():
        c = torch.empty(R, M, N, dtype=BF16, device="cuda")

        def call(k: tkc.Kernel = k, c: torch.Tensor = c, consts: dict = consts) -> None:
            ready.zero_()  # before a launch that starts with barrier_all(): no peer signals into it earlier
            k(b, c, ag, ready, **consts)

        ours[name], outputs[name] = call, lambda c=c: c.reshape(R * M, N)
    contenders = {**ours, "NCCL+cuBLAS": unfused, "symm_mem fused": symm_mem, **gemm_alone(gathered, b, c2)}
    outputs.update({"NCCL+cuBLAS": lambda: c2, "symm_mem fused": lambda: fused[0]})

    def reference() -> torch.Tensor:
        dist.all_gather_into_tensor(gathered, a)
        return gathered.float() @ b.float()

    return contenders, {"outputs": outputs, "reference": reference}, 2.0 * R * M * K * N


def gemm_alone(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> dict[str, Callable[[], Any]]:
    """The rank's product with no communication, by cuBLAS and by examples/gemm.tk: rates to
    compare, not the same output; the fused kernel's time beyond them is the communication it
    leaves exposed."""
    gemm = tkc.load(EXAMPLES / "gemm.tk")
    return {"cuBLAS alone, no communication": lambda: torch.matmul(a, b, out=c),
            "tkc gemm.tk alone": lambda: gemm(a, b, c)}


def _partial_products(tokens: int, hidden: int, ffn: int) -> tuple[torch.Tensor, torch.Tensor]:
    R = dist.get_world_size()
    K = ffn // R
    return randn(tokens, K), randn(K, hidden, scale=K ** -0.5)


def gemm_reducescatter(tokens: int, hidden: int, ffn: int) -> tuple[dict, dict, float]:
    R, rank, group = dist.get_world_size(), dist.get_rank(), dist.group.WORLD.group_name
    a, b = _partial_products(tokens, hidden, ffn)
    M, K, N, MS = tokens, a.shape[1], hidden, tokens // R
    full, out2 = torch.empty(M, N, dtype=BF16, device="cuda"), torch.empty(MS, N, dtype=BF16, device="cuda")
    fused: list[Any] = [None]
    ours, outputs = {}, {}
    for name, (k, consts) in variants("gemm_reducescatter.tk").items():
        out = tkc.symmetric_empty((MS, N), BF16)

        def call(k: tkc.Kernel = k, out: torch.Tensor = out, consts: dict = consts) -> None:
            out.zero_()  # the kernel adds into out
            k(a, b, out, **consts)

        ours[name], outputs[name] = call, lambda out=out: out

    def unfused() -> None:
        torch.matmul(a, b, out=full)
        dist.reduce_scatter_tensor(out2, full)

    def symm_mem() -> None:
        fused[0] = torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, group)

    def reference() -> torch.Tensor:
        total = a.float() @ b.float()
        dist.all_reduce(total)
        return total[rank * MS:(rank + 1) * MS]

    contenders = {**ours, "NCCL+cuBLAS": unfused, "symm_mem fused": symm_mem, **gemm_alone(a, b, full)}
    outputs.update({"NCCL+cuBLAS": lambda: out2, "symm_mem fused": lambda: fused[0]})
    return contenders, {"outputs": outputs, "reference": reference}, 2.0 * M * K * N


def gemm_allreduce(tokens: int, hidden: int, ffn: int) -> tuple[dict, dict, float]:
    R, rank, group = dist.get_world_size(), dist.get_rank(), dist.group.WORLD.group_name
    a, b = _partial_products(tokens, hidden, ffn)
    M, K, N, MS = tokens, a.shape[1], hidden, tokens // R
    BM, BN = 128, 256
    out = tkc.symmetric_empty((R, MS, N), BF16)
    flags = tkc.symmetric_zeros((2, R, -(-MS // BM), -(-N // BN)), torch.int32)
    full = torch.empty(M, N, dtype=BF16, device="cuda")
    full_sym = tkc.symmetric_empty((M, N), BF16)
    tkcs: dict[str, Callable[[], Any]] = {}
    for name, (k, consts) in variants("gemm_allreduce.tk").items():
        def call(k: tkc.Kernel = k, consts: dict = consts) -> None:
            flags.zero_()
            out[rank].zero_()  # the kernel adds into this rank's chunk, then sends it to every rank
            k(a, b, out, flags, **consts)
        tkcs[name] = call

    def unfused() -> None:
        torch.matmul(a, b, out=full)
        dist.all_reduce(full)

    def two_shot() -> None:
        torch.matmul(a, b, out=full_sym)
        torch.ops.symm_mem.two_shot_all_reduce_(full_sym, "sum", group)

    def reference() -> torch.Tensor:
        total = a.float() @ b.float()
        dist.all_reduce(total)
        return total

    contenders = {**tkcs, "NCCL+cuBLAS": unfused, "symm_mem two-shot": two_shot, **gemm_alone(a, b, full)}
    outputs = {**{name: lambda: out.reshape(M, N) for name in tkcs}, "NCCL+cuBLAS": lambda: full,
               "symm_mem two-shot": lambda: full_sym}
    return contenders, {"outputs": outputs, "reference": reference}, 2.0 * M * K * N


def collectives(nbytes: int) -> tuple[dict[str, Callable[[], Any]], dict[str, Callable[[], Any]],
                                      dict[str, tuple[Callable[[], Any], Callable[[], Any]]]]:
    """All-gather and reduce-scatter of ``nbytes`` (the gathered or reduced whole): tkc's
    examples/allgather.tk and reducescatter.tk against NCCL, as two contests, and for each
    (tkc's result, NCCL's result) once both have run."""
    R = dist.get_world_size()
    N = 8192
    M = nbytes // 2 // N // R  # rows of a shard
    whole, shard = randn(R * M, N), randn(M, N)
    gathered, scattered, ours = torch.empty_like(whole), torch.empty_like(shard), torch.empty_like(shard)
    out = tkc.symmetric_empty((R, M, N), BF16)
    stage = tkc.symmetric_empty((R, M, N), BF16)
    BM, BN = 64, 256  # reducescatter.tk's tiles: one arrival counter per tile
    arrived = tkc.symmetric_zeros((-(-M // BM), -(-N // BN)), torch.int32)
    ag, rs = tkc.load(EXAMPLES / "allgather.tk"), tkc.load(EXAMPLES / "reducescatter.tk")

    def scatter() -> None:
        arrived.zero_()
        rs(whole, ours, stage, arrived)

    return ({"tkc": lambda: ag(shard, out), "NCCL": lambda: dist.all_gather_into_tensor(gathered, shard)},
            {"tkc": scatter, "NCCL": lambda: dist.reduce_scatter_tensor(scattered, whole)},
            {"all-gather": (lambda: out.reshape(R * M, N), lambda: gathered),
             "reduce-scatter": (lambda: ours, lambda: scattered)})


def ring_attn(B: int, H: int, N: int, D: int) -> tuple[dict, dict, float]:
    """Ring attention over R ranks of N tokens each: examples/ring_attn.tk against NCCL's
    all-gather of K and V then SDPA (flash) on the gathered keys, and attn.tk on one GPU over
    its own N tokens (the rate to stay within 10% of)."""
    import torch.nn.functional as F

    R, rank = dist.get_world_size(), dist.get_rank()
    scale = D ** -0.5
    q, k, v = randn(B, H, N, D), randn(B, H, N, D), randn(B, H, N, D)
    o, o1 = torch.empty_like(q), torch.empty_like(q)
    kg, vg = tkc.symmetric_zeros((R, B, H, N, D), BF16), tkc.symmetric_zeros((R, B, H, N, D), BF16)
    ready = tkc.symmetric_zeros((R,), torch.int32)
    attn = tkc.load(EXAMPLES / "attn.tk")
    keys, values = torch.empty(R, B, H, N, D, dtype=BF16, device="cuda"), torch.empty(R, B, H, N, D, dtype=BF16,
                                                                                         device="cuda")
    sdpa: list[Any] = [None]

    kg[rank].copy_(k)  # for a version that takes this rank's K/V in its own slot (no k, v parameters)
    vg[rank].copy_(v)

    def ours(ring: tkc.Kernel, consts: dict[str, Any]) -> Callable[[], None]:
        slot = "k" not in ring.params

        def call() -> None:
            ready.zero_()
            if slot:
                ring(q, o, kg, vg, ready, scale, **consts)
            else:
                ring(q, k, v, o, kg, vg, ready, scale, **consts)
        return call

    def unfused() -> None:
        dist.all_gather_into_tensor(keys, k)
        dist.all_gather_into_tensor(values, v)
        kk, vv = (x.permute(1, 2, 0, 3, 4).reshape(B, H, R * N, D) for x in (keys, values))
        sdpa[0] = F.scaled_dot_product_attention(q, kk, vv, scale=scale)

    def reference() -> torch.Tensor:
        unfused()
        return sdpa[0].float()

    rings = {name: ours(kernel, consts) for name, (kernel, consts) in variants("ring_attn.tk").items()}
    contenders = {**rings, "NCCL+SDPA": unfused, "tkc attn.tk, 1 GPU, N keys (x R)": lambda: [
        attn(q, k, v, o1, scale) for _ in range(R)]}
    # the variants share o: each one's output is read right after its own call
    outputs = {**{name: (lambda: o) for name in rings}, "NCCL+SDPA": lambda: sdpa[0]}
    return contenders, {"outputs": outputs, "reference": reference}, 4.0 * B * H * N * (R * N) * D


def moe_dispatch(T: int, D: int, F: int, experts: int, tiles: dict[str, int] | None = None
                 ) -> tuple[dict, dict, float]:
    """examples/moe_dispatch.tk against all_to_all_single + torch._grouped_mm on the same
    routing (``T`` tokens a rank, one of ``experts`` each, ``experts / R`` a rank); ``tiles``:
    the kernel's constants (default: the example's, 64-row tiles for experts of few rows)."""
    R, rank = dist.get_world_size(), dist.get_rank()
    EL = experts // R
    x, w = randn(T, D), randn(EL, D, F, scale=D ** -0.5)
    ids = torch.randint(0, experts, (T,), device="cuda")
    order = torch.argsort(ids, stable=True).to(torch.int32)
    counts = torch.bincount(ids, minlength=experts)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
    every = [torch.empty_like(offsets) for _ in range(R)]
    dist.all_gather(every, offsets)
    off = torch.stack(every).tolist()  # off[src][e]: where expert e's rows start on rank src
    recv, arrived = tkc.symmetric_empty((R, T, D), BF16), tkc.symmetric_zeros((R,), torch.int32)
    sym_offsets = symmetric(offsets)
    if tiles is None:
        tiles = {"BT": 64} if T // experts < 128 else {}  # rows an expert gets from a source
    ours, ys = {}, {}
    for name, (k, consts) in variants("moe_dispatch.tk").items():
        y = ys[name] = torch.empty(R, T, F, dtype=BF16, device="cuda")

        def call(k: tkc.Kernel = k, y: torch.Tensor = y, consts: dict = consts) -> None:
            arrived.zero_()  # before a launch that starts with barrier_all(): no peer counts into it earlier
            k(x, order, sym_offsets, w, y, recv, arrived, **{**tiles, **consts})

        ours[name] = call

    # The NCCL sequence: send rows in expert order (so in destination-rank order), receive them
    # grouped by source, regroup them by local expert, one grouped GEMM.
    send_splits = [off[rank][(d + 1) * EL] - off[rank][d * EL] for d in range(R)]
    recv_splits = [off[s][(rank + 1) * EL] - off[s][rank * EL] for s in range(R)]
    regroup, places, ends = [], [], []  # recv row of each grouped row; its (src, place) in y
    base = [sum(recv_splits[:s]) for s in range(R)]
    for el in range(EL):
        e = rank * EL + el
        for s in range(R):
            n = off[s][e + 1] - off[s][e]
            regroup.append(torch.arange(n) + base[s] + off[s][e] - off[s][rank * EL])
            places.append(torch.arange(n) + s * T + off[s][e])
        ends.append(sum(len(r) for r in regroup))
    regroup_idx, place_idx = torch.cat(regroup).cuda(), torch.cat(places).cuda()
    group_ends = torch.tensor(ends, dtype=torch.int32, device="cuda")
    order_long = order.long()
    received = torch.empty(sum(recv_splits), D, dtype=BF16, device="cuda")
    grouped: list[Any] = [None, None]

    def unfused() -> None:
        send = x.index_select(0, order_long)
        dist.all_to_all_single(received, send, recv_splits, send_splits)
        grouped[0] = received.index_select(0, regroup_idx)
        grouped[1] = torch._grouped_mm(grouped[0], w, offs=group_ends)

    def reference() -> torch.Tensor:
        unfused()
        rows, out, start = grouped[0].float(), [], 0
        for el, end in enumerate(ends):
            out.append(rows[start:end] @ w[el].float())
            start = end
        return torch.cat(out)

    unfused()  # the grouped rows for the GEMM alone from its first call
    alone = grouped[0].clone()
    contenders = {**ours, "NCCL all-to-all + grouped GEMM": unfused,
                  # the rank's expert GEMMs with no communication: the rate to compare with
                  "grouped GEMM alone, no communication": lambda: torch._grouped_mm(alone, w, offs=group_ends)}
    outputs = {**{name: (lambda y=y: y.reshape(R * T, F).index_select(0, place_idx)) for name, y in ys.items()},
               "NCCL all-to-all + grouped GEMM": lambda: grouped[1]}
    return contenders, {"outputs": outputs, "reference": reference}, 2.0 * T * D * F


GEMMS = {"allgather_gemm": allgather_gemm, "gemm_reducescatter": gemm_reducescatter,
         "gemm_allreduce": gemm_allreduce}
#: ring attention: (name, B, H, N tokens a rank, D)
RING_SHAPES = [("16k tokens a rank", 1, 16, 16384, 128), ("4k tokens a rank", 1, 16, 4096, 128)]


# ------------------------------------------------------------------ main
def check(only: list[str]) -> bool:
    """Every contender once at the smaller shape against float32 torch; True when all agree."""
    _, tokens, hidden, ffn = SHAPES[-1]
    ok = True
    cases = [(name, lambda name=name: GEMMS[name](tokens, hidden, ffn)) for name in only if name in GEMMS]
    if "ring_attn" in only:
        cases.append(("ring_attn", lambda: ring_attn(1, 2, 1000, 128)))
    if "moe_dispatch" in only:
        cases.append(("moe_dispatch", lambda: moe_dispatch(1000, 256, 384, 2 * dist.get_world_size())))
    if "collectives" in only:
        gather, scatter, results = collectives(COLLECTIVE_BYTES[0])
        for what, contest in (("all-gather", gather), ("reduce-scatter", scatter)):
            for fn in contest.values():
                fn()
            torch.cuda.synchronize()
            ours, nccl = results[what][0](), results[what][1]()
            worst = torch.tensor([rel_error(ours, nccl.float())], device="cuda")
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            good = float(worst) < 1e-2
            ok &= good
            say(f"check collectives {what}: relative error against NCCL {float(worst):.3g} (worst rank): "
                f"{'ok' if good else 'MISMATCH'}")
    for name, make in cases:
        contenders, out, _ = make()
        want = out["reference"]()
        for who, fn in contenders.items():
            if who not in out["outputs"]:
                continue  # a rate to compare with, not the same output
            try:
                fn()
                torch.cuda.synchronize()
                err = rel_error(out["outputs"][who](), want)
            except Exception as e:  # reported, and the check fails
                say(f"  {name} {who}: failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
                err = float("inf")
            worst = torch.tensor([err], device="cuda")
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            good = float(worst) < 2e-2
            ok &= good
            say(f"check {name} {who}: relative error {float(worst):.3g} (worst rank): {'ok' if good else 'MISMATCH'}")
    return ok


def main() -> None:
    from harness import group_args

    def more(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--check", action="store_true", help="check every contender's result and stop")
        ap.add_argument("--also", action="append", default=[], metavar="DIR",
                        help="time DIR's versions of the multi-GPU examples beside examples/'s")
        ap.add_argument("--consts", action="append", default=[], metavar="NAME=VALUE,...",
                        help="time every version of those with these constants too")
        ap.add_argument("--calls", type=int, default=1, metavar="N",
                        help="time N calls back to back in every row but the collectives' (default 1: each call "
                             "after the ranks are in step)")
        ap.add_argument("--timeline", action="store_true",
                        help="after each row, one call of each contender under the profiler: a timeline of "
                             "every rank's kernels (benchmarks/timeline_multi_gpu*.png) and their times by kind")

    args, only = group_args("multi_gpu.py", GROUPS, quick="the smaller shape only, fewer runs", more=more)
    ALSO.extend(Path(d).resolve() for d in args.also)
    CONSTS.extend(args.consts)
    rank, world = init_process_group()
    torch.manual_seed(1234 + rank)
    try:
        if args.check:
            ok = check(only)
            raise SystemExit(0 if ok else 1)
        rows, timelines = run(only, args.quick, world, args.timeline, args.calls)
        if rank == 0:
            report(rows, timelines, args, only, world)
    finally:
        dist.destroy_process_group()


def run(only: list[str], quick: bool, world: int, profiled: bool,
        calls: int = 1) -> tuple[list[Any], list[tuple[str, dict]]]:
    """The table's rows and, with ``profiled``, each row's timeline (rank 0's; empty elsewhere)."""
    from harness import Row
    from timeline import capture

    runs = 10 if quick else 30
    rows, timelines = [], []

    def profile(title: str, contenders: dict[str, Callable[[], Any]]) -> None:
        if profiled:
            spans = capture(contenders)
            if spans is not None:
                timelines.append((title, spans))

    def timed_row(group: str, problem: str, make: Callable[[], tuple[dict, dict, float]]) -> None:
        say(f"{group} {problem} ...")
        contenders, _, flops = make()
        seconds = in_turns(contenders, runs, calls=calls)
        rows.append(Row(group, problem, "TFLOP/s", {n: flops / s / 1e12 if s else None for n, s in seconds.items()}))
        profile(f"{group}, {problem}", contenders)
        torch.cuda.empty_cache()

    for name in [g for g in only if g in GEMMS]:
        for shape, tokens, hidden, ffn in SHAPES[-1:] if quick else SHAPES:
            timed_row(name, f"{shape}: {tokens} tokens x {hidden} x {ffn}, /{world}",
                      lambda: GEMMS[name](tokens, hidden, ffn))
    if "ring_attn" in only:
        for _shape, B, H, N, D in RING_SHAPES[-1:] if quick else RING_SHAPES:
            timed_row("ring_attn", f"{world} x {N} tokens, B={B} H={H} D={D}", lambda: ring_attn(B, H, N, D))
    if "moe_dispatch" in only:
        for shape, T, D, F, experts in MOE_SHAPES[-1:] if quick else MOE_SHAPES:
            timed_row("moe_dispatch", f"{shape}: {T} tokens a rank, D={D} F={F}, {experts} experts over {world} ranks",
                      lambda: moe_dispatch(T, D, F, experts))
    if "collectives" in only:
        for nbytes in COLLECTIVE_BYTES[:2] if quick else COLLECTIVE_BYTES:
            say(f"collectives {nbytes >> 20} MiB ...")
            gather, scatter, _ = collectives(nbytes)
            for what, contest in (("all-gather", gather), ("reduce-scatter", scatter)):
                seconds = in_turns(contest, runs, calls=COLLECTIVE_CALLS)
                # the bus bandwidth nccl-tests reports: (R - 1) / R of the whole over the time
                rows.append(Row(f"collectives: {what}", f"{nbytes >> 20} MiB", "GB/s (bus)",
                                {n: nbytes * (world - 1) / world / s / 1e9 if s else None for n, s in seconds.items()}))
                profile(f"collectives: {what}, {nbytes >> 20} MiB", contest)
            torch.cuda.empty_cache()
    return rows, timelines


def report(rows: list[Any], timelines: list[tuple[str, dict]], args: argparse.Namespace, only: list[str],
           world: int) -> None:
    from harness import append_results, plot, table
    from timeline import draw, summary

    print(table(rows))
    suffix = "" if world == 2 else f"_{world}"
    where = ""
    if timelines:
        drawn = draw(timelines, ROOT / "benchmarks" / f"timeline_multi_gpu{suffix}.png")
        where = ("\n\n**Timelines** (one call of each contender under PyTorch's profiler, every rank; µs"
                 + (f"; drawn in benchmarks/timeline_multi_gpu{suffix}.png" if drawn else "") + "):\n\n"
                 + "\n".join(f"{title}\n{summary(spans)}\n" for title, spans in timelines))
        print(where)
    if args.no_record:
        return
    command = f"torchrun --nproc-per-node {world} benchmarks/multi_gpu.py" + (" --quick" if args.quick else "") + (
        f" --only {args.only}" if len(only) < len(GROUPS) else "") + "".join(f" --also {d}" for d in args.also) + (
        "".join(f" --consts {c}" for c in args.consts)) + (" --timeline" if args.timeline else "") + (
        f" --calls {args.calls}" if args.calls != 1 else "")
    append_results(ROOT / "benchmarks" / "RESULTS.md", command, rows,
                   f"{world} GPUs, one process each; NVLink multicast off.  A call's time is the slowest rank's."
                   + where)
    name = f"plot_multi_gpu{suffix}.png"
    if plot(rows, list(dict.fromkeys(r.group for r in rows)), ROOT / "benchmarks" / name):
        print(f"plot: benchmarks/{name}")


if __name__ == "__main__":
    main()
