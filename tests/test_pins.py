"""Options: the pins declared once (type, default, description, readers), checked once, hashable."""

from __future__ import annotations

import dataclasses
import re

import pytest

from tkc.errors import Loc, TkcUsageError
from tkc.pins import PINS, Options, check_pins
from tkc.target import DEFAULT_TARGET


def test_every_pin_is_a_typed_field_with_its_default() -> None:
    fields = dataclasses.fields(Options)
    assert list(PINS) == [f.name for f in fields]
    for f in fields:
        kind = PINS[f.name][0]
        assert f.default is None or type(f.default) is kind, f.name
    o = Options()
    assert (o.stages, o.warp_specialize, o.ctas_per_sm, o.cluster, o.tma, o.prefetch) == (None, True, None, 1, True, 0)
    assert o.programs_per_sm == 1 and Options(ctas_per_sm=3).programs_per_sm == 3


def test_options_are_frozen_and_hashable() -> None:
    o = Options(stages=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.stages = 4  # type: ignore[misc]
    assert hash(o) == hash(Options(stages=3)) and o != Options()
    assert len({Options(), Options(), Options(pingpong=True)}) == 2


def test_from_consts_keeps_the_pins_only() -> None:
    o = Options.from_consts({"BM": 128, "stages": 2, "pingpong": True, "ctas_per_sm": 2})
    assert o == Options(stages=2, pingpong=True, ctas_per_sm=2)
    assert Options.from_consts(None) == Options.from_consts({}) == Options()


@pytest.mark.parametrize("consts,message", [
    ({"stages": 0}, "pin stages = 0: expected a positive integer"),
    ({"pingpong": 1}, "pin pingpong = 1: expected true or false"),
    ({"prefetch": -1}, "pin prefetch = -1: expected an integer >= 0"),
    ({"warps": True}, "pin warps = True: expected a positive integer"),
    ({"cluster": 3}, "pin cluster = 3: a cluster has 1, 2 or 4 programs"),
])
def test_from_consts_checks_every_value_at_the_kernel(consts: dict, message: str) -> None:
    loc = Loc("k.tk", 3, 1)
    with pytest.raises(TkcUsageError, match=message) as e:
        Options.from_consts(consts, loc)
    assert e.value.loc == loc


def test_cluster_sizes_are_the_targets() -> None:
    wide = dataclasses.replace(DEFAULT_TARGET, cluster_sizes=(1, 2, 4, 8))
    assert Options.from_consts({"cluster": 8}, target=wide).cluster == 8
    with pytest.raises(TkcUsageError, match="a cluster has 1, 2, 4 or 8 programs"):
        Options.from_consts({"cluster": 16}, target=wide)


@pytest.mark.parametrize("pin, value, said", [
    ("stages", 10**23, "at most 32 (a ring's stages each take shared memory)"),
    ("prefetch", 100_000, "at most 64 (each iteration ahead is unrolled before the loop)"),
    ("ctas_per_sm", 33, "at most 32 (an SM holds at most 32 programs)"),
    ("wait_timeout_ms", 2**64, "at most 3600000"),
    ("warps", 2048, "at most 32 (a program has at most 1024 threads)"),
])
def test_count_pins_have_a_ceiling(pin: str, value: int, said: str) -> None:
    # a huge prefetch unrolled for minutes, a huge stages crashed a pass, a huge timeout wrapped
    with pytest.raises(TkcUsageError, match=f"pin {pin} = {value}: {re.escape(said)}"):
        check_pins({pin: value})


def test_a_producer_budget_that_leaves_the_consumers_nothing_is_refused_naming_the_pin() -> None:
    # paged_decode declares ctas_per_sm = 2: a 256-register producer leaves its one consumer
    # warpgroup none (specialize-warps left IR whose setmaxnreg.inc would wait forever)
    from pathlib import Path

    from tkc.compiler import compile_kernel
    from tkc.errors import TkcCodegenError

    examples = Path(__file__).parents[1] / "examples"
    with pytest.raises(TkcUsageError, match=r"pin producer_regs = 256: with 1 consumer warpgroup and 2 programs an "
                                            r"SM the consumers would keep 0 registers a thread") as e:
        compile_kernel(examples / "paged_decode.tk", {"producer_regs": 256}, kernel="paged_decode", stop="hopper",
                       cache=False)
    assert e.value.loc is not None
    with pytest.raises(TkcCodegenError, match=r"the pin producer_regs = 256 leaves the consumers 120 registers a "
                                              r"thread.*give the producer fewer registers"):
        compile_kernel(examples / "gemm.tk", {"producer_regs": 256}, stop="llvm", cache=False)


def test_a_cluster_reduction_with_a_cluster_of_three_says_what_was_given() -> None:
    from tkc.compiler import compile_kernel
    from tkc.errors import TkcTypeError

    src = ("@kernel\ndef k(x: f32[M, N], y: f32[M, N]):\n    grid(cdiv(M, 64))\n    r = program_id(0) * 64\n"
           "    y[r:r+64, 0:64] = cluster_sum(x[r:r+64, 0:64])\n")
    with pytest.raises(TkcTypeError, match=r"declare or pass the pin cluster \(2 or 4\) \(cluster = 3 was given\)"):
        compile_kernel(src, {"cluster": 3}, stop="tkir", cache=False)


SCALE = """
@kernel
def scale(x: f32[N], y: f32[N], BN: const = 128):
    grid(cdiv(N, BN))
    c = program_id(0) * BN
    y[c:c+BN] = x[c:c+BN] * 2.0
"""
MM = """
@kernel
def mm(a: bf16[M, K], b: bf16[K, N], c: f32[M, N], BM: const = 128):
    grid(cdiv(M, BM))
    r = program_id(0) * BM
    c[r:r+BM, 0:64] = a[r:r+BM, 0:64] @ b[0:64, 0:64]
"""


@pytest.mark.parametrize("src, consts, said", [
    (SCALE, {"warps": 3}, "pin warps = 3: a program runs whole warpgroups: give a multiple of 4"),
    (SCALE, {"warps": 64}, "pin warps = 64: at most 32"),
    (MM, {"warps": 8}, "pin warps = 8: the pin sets the warps of kernels without products; this kernel's products "
                       "of 128 rows set its own"),
])
def test_the_interpreter_refuses_the_warps_no_compilation_takes(src: str, consts: dict, said: str) -> None:
    # the frontend checks them, so the tile IR the interpreter runs never has them
    from tkc.compiler import compile_kernel

    for stop in ("tkir", "ptx"):
        with pytest.raises(TkcUsageError, match=re.escape(said)):
            compile_kernel(src, consts, stop=stop, cache=False)
