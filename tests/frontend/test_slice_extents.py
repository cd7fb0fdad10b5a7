"""A slice's extent is proven constant when ``stop - start`` folds to a number: the frontend
tracks integer scalars as affine forms, and a pure sub-expression written twice
(``(i % 4)*BN:(i % 4 + 1)*BN``) is one term of them, as if it had been named first.  Each form
compiles and the emulator agrees with the interpreter; a slice whose extent is runtime, or
whose computed start the stop does not visibly repeat, is refused at the slice."""

from __future__ import annotations

import numpy as np
import pytest
from device_checks import assert_refused, interpret_and_emulate, lowered

from tkc.compiler import compile_kernel
from tkc.errors import TkcTypeError
from tkc.interpreter import random_args

SRC = """@kernel
def k(x: f32[N], y: f32[N], ids: i32[N], BN: const = 64):
    grid(cdiv(N, BN))
    i = program_id(0)
    y[i*BN:(i+1)*BN] = x[{slice}]
"""

REPEATED = [
    "(i % 4)*BN:(i % 4 + 1)*BN",
    "program_id(0)*BN:(program_id(0)+1)*BN",
    "min(i, 3)*BN:(min(i, 3)+1)*BN",
    "cdiv(i, 2)*BN:(cdiv(i, 2)+1)*BN",
    "num_programs(0)*BN:num_programs(0)*BN+BN",
    "(i*BN)//2:(i*BN)//2+BN",
    "i % 4 * BN:i % 4 * BN + BN",
]


@pytest.mark.parametrize("index", REPEATED)
def test_a_repeated_start_has_a_constant_extent(index: str) -> None:
    src = SRC.format(slice=index)
    tile_ir = compile_kernel(src, stop="tkir", cache=False).kernel_op
    hopper = lowered(lambda stop: compile_kernel(src, stop=stop, cache=False)).kernel_op
    want, got = interpret_and_emulate(tile_ir, hopper, random_args(tile_ir, {"N": 300}, 3), 3)
    np.testing.assert_array_equal(got[1], want[1])
    assert np.any(want[1] != 0) or "num_programs" in index  # that one reads past the end: zeros


@pytest.mark.parametrize("index, message", [
    ("0:i", "slice on axis 0 of 'x' spans a runtime extent"),
    ("i:i+ids[0]", "slice on axis 0 of 'x' spans a runtime extent"),
    # two loads of ids[0] need not agree (a store may come between): named, it is one value
    ("ids[0]*BN:(ids[0]+1)*BN", r"cannot prove that the slice on axis 0 of 'x' has a compile-time constant "
                                r"extent \(stop - start\); name the start first so both bounds use it: "
                                r"g = \.\.\.; x\[g\*BN:\(g\+1\)\*BN\]"),
])
def test_an_extent_not_proven_constant_is_refused(index: str, message: str) -> None:
    assert_refused(SRC.format(slice=index), TkcTypeError, message, 5, stop="tkir")


def test_a_named_load_is_one_start() -> None:
    src = SRC.replace("    y[", "    g = ids[0]\n    y[").format(slice="g*BN:(g+1)*BN")
    compile_kernel(src, stop="tkir", cache=False)
