"""One rank of a multi-GPU example called from Python, for tests/ranks/test_gpu_ranks.py:
``torchrun --nproc-per-node R tests/ranks/torchrun_worker.py EXAMPLE``.

Every rank makes every rank's inputs from the rank's seed (so each can compute the torch
reference of its own outputs), allocates its tensors ``@ ranks`` with ``tkc.symmetric_empty``,
calls the kernel as ``tkc.load(...)(...)`` twice (the second launch reuses the kept plan and
the barrier pads' counters) and compares with torch; exit status 1 on a mismatch.
``different_grids``: ranks launching a kernel with barriers with different grids are refused
on every rank, and the next launches run.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

import tkc
from tkc.errors import TkcError
from tkc.runtime.ranks import init_process_group

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _bf16(seed: int, *shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16)


def _symmetric(host: torch.Tensor) -> torch.Tensor:
    return tkc.symmetric_empty(tuple(host.shape), host.dtype).copy_(host)


def _close(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), atol=0.1, rtol=2e-2, equal_nan=True,
                               msg=lambda m: f"rank {dist.get_rank()}: {name}: {m}")


def moe_dispatch(rank: int, world: int) -> None:
    """Real routing (each rank's tokens sorted by expert; rank 0 sends every token to expert 0,
    so segments are long and empty), tails in T, D and F."""
    k = tkc.load(EXAMPLES / "moe_dispatch.tk")
    T, D, F, EL = 200, 160, 160, 2
    experts = world * EL

    def inputs(r: int):
        g = torch.Generator().manual_seed(100 + r)
        ids = torch.zeros(T, dtype=torch.int64) if r == 0 else torch.randint(0, experts, (T,), generator=g)
        order = torch.argsort(ids, stable=True).to(torch.int32)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.bincount(ids, minlength=experts).cumsum(0)])
        return _bf16(r, T, D), ids, order, offsets.to(torch.int32), _bf16(1000 + r, EL, D, F)

    x, ids, order, offsets, w = inputs(rank)
    arrived = tkc.symmetric_zeros((world,), torch.int32)
    args = [x.cuda(), order.cuda(), _symmetric(offsets), w.cuda(),
            torch.full((world, T, F), float("nan"), dtype=torch.bfloat16, device="cuda"),
            tkc.symmetric_empty((world, T, D), torch.bfloat16), arrived]
    for _ in range(2):
        arrived.zero_()  # safe before a launch that starts with barrier_all()
        k(*args)
    torch.cuda.synchronize()
    want = torch.full((world, T, F), float("nan"))
    for src in range(world):
        xs, ids_s, order_s, _, _ = inputs(src)
        experts_at = ids_s[order_s.long()]  # the expert of each place
        mine = experts_at // EL == rank
        rows = xs[order_s.long()].float()
        for el in range(EL):
            at = mine & (experts_at % EL == el)
            want[src, at] = rows[at] @ w[el].float()
    _close("y", args[4], want)


def allgather_gemm(rank: int, world: int) -> None:
    """The column-sharded GEMM against torch's all_gather_into_tensor then matmul."""
    k = tkc.load(EXAMPLES / "allgather_gemm.tk")
    M, K, N = 200, 136, 320
    a, b = _bf16(rank, M, K).cuda(), _bf16(1000 + rank, K, N).cuda()
    c = torch.full((world, M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    ready = tkc.symmetric_zeros((world, -(-M // 128)), torch.int32)
    ag = tkc.symmetric_zeros((world, M, K), torch.bfloat16)
    ag[rank] = a  # the shard in its own slot; the kernel fills the others
    args = [b, c, ag, ready]
    for _ in range(2):
        ready.zero_()  # safe before a launch that starts with barrier_all(): no peer signals into it before
        k(*args)
    gathered = torch.empty(world * M, K, dtype=torch.bfloat16, device="cuda")
    dist.all_gather_into_tensor(gathered, a)
    _close("c", c.reshape(world * M, N), gathered.float() @ b.float())


SHIFT = """
@kernel
def shift(x: f32[N] @ ranks, y: f32[N], BN: const = 64):
    grid(cdiv(N, BN))
    i = program_id(0)
    barrier_all()
    y[i*BN:(i+1)*BN] = x.on((rank() + 1) % num_ranks())[i*BN:(i+1)*BN]
    barrier_all()
"""


def different_grids(rank: int, world: int) -> None:
    """Rank 1 launches a kernel with barriers over more elements than rank 0 (views of one
    symmetric buffer): every rank is refused before the GPU, naming the grids; then launches
    with one grid run, the barrier pads still in step."""
    path = Path(tempfile.mkdtemp()) / "shift.tk"
    path.write_text(SHIFT)
    k = tkc.load(path)
    x = tkc.symmetric_zeros((600,), torch.float32)
    x.copy_(torch.arange(600, dtype=torch.float32, device="cuda") + 1000 * rank)
    y = torch.zeros(600, device="cuda")
    n = 300 if rank == 0 else 600
    try:
        k(x[:n], y[:n])
    except TkcError as e:
        assert "the grids differ: rank 0: (5,), rank 1: (10,)" in str(e), str(e)
    else:
        raise AssertionError(f"rank {rank}: a launch with another grid than its peer's was not refused")
    for _ in range(3):
        k(x, y)
    _close("y", y, torch.arange(600, dtype=torch.float32) + 1000 * ((rank + 1) % world))


def main() -> None:
    rank, world = init_process_group()
    {"moe_dispatch": moe_dispatch, "allgather_gemm": allgather_gemm,
     "different_grids": different_grids}[sys.argv[1]](rank, world)
    dist.barrier()
    if rank == 0:
        print(f"{sys.argv[1]}: ok on {world} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
