"""``tkc run --backend gpu`` under torchrun on a machine without GPUs, for
tests/ranks/test_torchrun_cpu.py: the process group is gloo, CUDA calls do nothing, tensors
stay on the CPU and the "kernel" is torch's all-gather (over gloo) then matmul, standing in
for examples/allgather_gemm.tk.  What runs for real is everything around the launch: each
rank's inputs, the flags, the launches and their timing loop, rank 0's gathering of every
rank's inputs and outputs, the interpreter's reference, the comparison every rank receives,
what rank 0 prints and the exit status.  ``FAKE_WRONG=1`` makes rank 1's result wrong."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

from tkc import cli, compiler
from tkc.runtime import launch, ranks


def init_process_group() -> tuple[int, int]:
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


class Event:
    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: Event) -> float:
        return 1.0


def fake_launch(compiled, args, grid=None):  # all_gather(ag[rank]) into ag, ag[src] @ b into c, row flags raised
    b, c, ag, ready = args
    world = dist.get_world_size()
    a = ag[dist.get_rank()].clone()
    shards = [torch.empty_like(a) for _ in range(world)]
    dist.all_gather(shards, a)
    for src, s in enumerate(shards):
        ag[src] = s
        c[src] = (s.float() @ b.float()).to(c.dtype)
    for src in range(world):  # the flag of every tile row (BM = 32 on the command line) of every peer
        if src != dist.get_rank():
            ready[src, :-(-a.shape[0] // 32)] = 1
    if os.environ.get("FAKE_WRONG") and dist.get_rank() == 1:
        c[0, 0, 0] += 100
    return (2, 2)


empty_like = torch.empty_like
ranks.init_process_group = init_process_group
ranks.symmetric_empty = lambda shape, dtype: torch.empty(shape, dtype=dtype)
launch.launch = fake_launch
compiler.compile_kernel = lambda kernel, target: SimpleNamespace(kernel_op=kernel)
torch.cuda.synchronize = lambda *a: None
torch.cuda.Event = lambda enable_timing: Event()
torch.empty_like = lambda t, device=None: empty_like(t)

if __name__ == "__main__":
    sys.argv[0] = "tkc"
    cli.main()
