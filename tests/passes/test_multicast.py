"""The multicast pass: which copies a cluster shares, what it does to the ring protocol, and
what it refuses.  (The emulator runs its output: tests/emulator/test_machine_cluster.py.)"""

from __future__ import annotations

import pathlib

import pytest

from tkc.compiler import compile_kernel
from tkc.errors import TkcUnsupportedError

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def hopper(consts: dict) -> str:
    return compile_kernel(EXAMPLES / "gemm.tk", consts, stop="hopper", cache=False).asm["hopper"]


def test_shares_the_copies_that_are_the_same_in_the_cluster():
    text = hopper({"cluster": 2})
    loads = [line for line in text.splitlines() if "hopper.tma_load" in line]
    assert {("%a," in line, "multicast = 2" in line) for line in loads} == {(True, False), (False, True)}
    arrives = [line for line in text.splitlines() if "hopper.mbarrier_arrive" in line]
    assert arrives and all("{cluster = true}" in line for line in arrives)
    assert "hopper.mbarrier_init %empty {count = 4}" in text  # 2 consumers x 2 CTAs
    assert "hopper.mbarrier_init %a_b_full {count = 1}" in text  # each CTA's own producer
    assert text.count("hopper.cluster_barrier") == 2 and "hopper.barrier {id = 0}" not in text


def test_four_ctas_share_a_copy_four_ways():
    text = hopper({"cluster": 4})
    assert "multicast = 4" in text and "{count = 8}" in text and "cluster = 4, smem_bytes" in text


def test_without_a_cluster_nothing_changes():
    text = hopper({})
    assert "multicast" not in text and "cluster" not in text


def test_refused_without_a_producer():
    with pytest.raises(TkcUnsupportedError, match="producer warpgroup"):
        hopper({"cluster": 2, "warp_specialize": False})


def test_refused_where_persistent_did_not_pair_the_programs():
    with pytest.raises(TkcUnsupportedError, match="grid of whole clusters"):
        compile_kernel(EXAMPLES / "gemm.tk", {"cluster": 2}, stop="hopper", cache=False,
                       hopper_pipeline="select-layouts,lower-to-hopper,pipeline-loops,specialize-warps,multicast")


@pytest.mark.parametrize("example,consts,message", [
    ("softmax.tk", {}, "persistent GEMM-shaped kernel's tiles together"),
    ("attn.tk", {}, "persistent GEMM-shaped kernel's tiles together"),
    ("attn.tk", {"persistent": True}, "share the copies of a GEMM-shaped kernel"),
    ("gemm.tk", {"persistent": False}, "pinned persistent = False"),
])
def test_kernels_a_cluster_cannot_take(example, consts, message):
    with pytest.raises(TkcUnsupportedError, match=message):
        compile_kernel(EXAMPLES / example, {**consts, "cluster": 2}, stop="hopper", cache=False)
