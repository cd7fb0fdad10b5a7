"""One loaded tile read by two products with opposite majors (``w.T`` as B of one, ``w`` as B
of the next; ``k`` as A and ``k.T`` as A): a single copy in shared memory, each wgmma reading
it through its own descriptor (``b_major`` / ``a_major`` on ``hopper.wgmma``), as attention's
backward reads Q and K; in a loop whose copies a producer role issues, the consumers store the
register operand behind barriers of their own (``hopper.sync``).  The emulator against the
interpreter, ptxas without spills, the verifier's refusals, and on a GPU the same as the
interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from device_checks import interpret_and_emulate, interpret_and_run_on_gpu, lowered

from tkc.compiler import compile_kernel
from tkc.errors import TkcVerifyError
from tkc.interpreter import random_args, run_kernel
from tkc.ir.core import Module
from tkc.ir.verifier import verify

# y = ((x W^T) W), and z = W^T (W x^T) (x: M x 64 blocks, W: 64 x 64), in a loop over
# x's blocks so that the ring and the roles read the shared W too.
SRC = """@kernel
def two(x: bf16[M, 64], w: bf16[N, 64], y: f32[M, 64], z: f32[64, M]):
    grid(1)
    wt = w[0:64, :]
    for i in range(cdiv(M, 64)):
        xt = x[i*64:(i+1)*64, :]
        y[i*64:(i+1)*64, :] = (xt @ wt.T).to(bf16) @ wt
        z[:, i*64:(i+1)*64] = wt.T @ (wt @ xt.T).to(bf16)
"""
DIMS = {"M": 150, "N": 64}


def _compile(stop: str):
    return compile_kernel(SRC, stop=stop, cache=False)


def test_interpreter_matches_numpy() -> None:
    kernel = _compile("tkir").kernel_op
    args = random_args(kernel, DIMS, 0)
    x, w = (np.asarray(a, np.float64) for a in args[:2])
    run_kernel(kernel, args)
    np.testing.assert_allclose(args[2], (x @ w.T) @ w, rtol=2e-2, atol=0.5)
    np.testing.assert_allclose(args[3], w.T @ (w @ x.T), rtol=2e-2, atol=0.5)


def test_one_copy_of_w_read_with_both_majors() -> None:
    hopper = _compile("hopper").kernel_op
    w_loads = [op for op in hopper.walk() if op.name == "hopper.tma_load" and op.tensor.name_hint == "w"]
    assert len(w_loads) == 1
    majors = [(op.attributes.get("a_major"), op.attributes.get("b_major")) for op in hopper.walk()
              if op.name == "hopper.wgmma"]
    assert (None, "mn") in majors and ("mn", None) in majors, majors
    # W^T's right operand is computed in registers and stored for wgmma in the loop: under a
    # producer role the stores' barriers are the consumers' own (hopper.sync), not the CTA's.
    roles = [op for op in hopper.walk() if op.name == "hopper.role"]
    assert [r.attributes["name"] for r in roles] == ["producer", "consumers"]
    inside = [op.name for op in roles[1].walk()]
    assert inside.count("hopper.sync") == 2 and "hopper.barrier" not in inside


def test_emulator_matches_interpreter_without_spills() -> None:
    tile_ir = _compile("tkir").kernel_op
    want, got = interpret_and_emulate(tile_ir, lowered(_compile).kernel_op, random_args(tile_ir, DIMS, 1), 1)
    for i in (2, 3):
        np.testing.assert_allclose(got[i], want[i], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("which, major, message", [
    ("a", "mn", "a_major is 'k' or 'mn' on a shared operand"),  # A in registers has no major
    ("b", "kn", "b_major is 'k' or 'mn' on a shared operand, got 'kn'"),
])
def test_the_verifier_refuses_a_major_it_cannot_read(which: str, major: str, message: str) -> None:
    kernel = compile_kernel(SRC, stop="hopper", cache=False).kernel_op
    reg_a = next(op for op in kernel.walk() if op.name == "hopper.wgmma" and op.a.type.space == "reg")
    reg_a.attributes[f"{which}_major"] = major
    with pytest.raises(TkcVerifyError, match=message):
        verify(Module([kernel]))


@pytest.mark.gpu
def test_on_gpu_as_in_the_interpreter() -> None:
    _, want, got = interpret_and_run_on_gpu(_compile, DIMS)
    # The first product's sums reach bf16 in another order on the GPU: an element a rounding
    # boundary apart moves its row of the second product by up to a bf16 ulp of its terms.
    for i in (2, 3):
        np.testing.assert_allclose(got[i], np.asarray(want[i], np.float64), rtol=1e-2, atol=0.5)
