"""A ring stage every consumer waited for and released without reading it (a tile read only
under an ``if``, a persistent tile whose K/V loop runs no iteration) is refilled without loss,
and a stage whose last reader is a loop is released by every thread: that loop may run no
iteration, and then nothing brings the warps together between their wait and the release."""

from __future__ import annotations

from pathlib import Path

import pytest

from tkc.compiler import compile_kernel
from tkc.interpreter import random_args
from tkc.runner import run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

READ_UNDER_IF = """@kernel
def under_if(q: bf16[M, 64], k: bf16[N, 64], o: f32[M, 64], BM: const = 128, BN: const = 64):
    grid(cdiv(M, BM))
    pm = program_id(0)
    qt = q[pm*BM:(pm+1)*BM, :]
    acc = zeros([BM, BN], f32)
    for j in range(cdiv(N, BN)):
        kt = k[j*BN:(j+1)*BN, :]
        if (j + pm) % 3 != 1:
            s = qt @ kt.T
            acc = maximum(acc, s)
        else:
            acc = acc * 0.5
    o[pm*BM:(pm+1)*BM, :] = acc
"""


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_a_tile_read_only_under_an_if_is_no_lost_data(target: str) -> None:
    kernel = compile_kernel(READ_UNDER_IF, stop="tkir", cache=False).kernel_op
    result = run(kernel, random_args(kernel, {"M": 1000, "N": 1000}, 0), "emulate", check=True, target=target)
    assert result.ok, result.checked


@pytest.mark.parametrize(("example", "name", "target"), [
    ("paged_decode.tk", "paged_decode", "sm_90a"),
    ("paged_decode.tk", "paged_decode", "sm_100a"),
    ("varlen_attn_train.tk", "varlen_attn_bwd", "sm_90a"),
])
def test_persistent_tiles_whose_inner_loop_runs_no_iteration(example: str, name: str, target: str) -> None:
    kernel = compile_kernel(EXAMPLES / example, {"persistent": True}, kernel=name, stop="tkir", cache=False).kernel_op
    from tkc.runner import default_dims

    result = run(kernel, random_args(kernel, default_dims(kernel), 0), "emulate", check=True, target=target)
    assert result.ok, result.checked


def test_a_stage_whose_last_reader_is_a_loop_is_released_by_every_thread() -> None:
    text = compile_kernel(EXAMPLES / "attn.tk", {"persistent": True}, stop="hopper", cache=False).asm["hopper"]
    # Q's ring in the tile loop (its own empty ring: the one ring of that loop), read in the K/V loop
    init = next(line for line in text.splitlines() if "hopper.mbarrier_init %empty " in line)
    assert "count = 256" in init, init  # two consumer warpgroups of 128 threads
    assert "{threads = true}" in text
