"""``tkc.runner``: the default sizes of a kernel's dims, the memory its inputs take, and a
check that always compares two executors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tkc import dtypes, runner
from tkc.frontend import compile_file
from tkc.interpreter import random_args
from tkc.ir.core import Operation
from tkc.ir.types import TensorType
from tkc.passes.manager import PassManager
from tkc.passes.pipeline import DEFAULT_PIPELINE

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def kernel_of(name: str) -> Operation:
    module = compile_file(str(EXAMPLES / name))
    PassManager(DEFAULT_PIPELINE).run(module)
    return module.kernel()


@pytest.mark.parametrize("boxes, size", [
    ({128}, 192),       # one tile and half a tile
    ({128, 64}, 160),   # 192 would be three 64-tiles
    ({4096}, 6144),
    ({16}, 24),         # no multiple of 16 is a tail of a 16-tile
    ({2}, 3),
    (set(), runner.UNTILED_DIM),
])
def test_a_tile_and_a_tail(boxes: set[int], size: int) -> None:
    assert runner._tile_and_tail(boxes) == size


@pytest.mark.parametrize("example, dims", [
    ("attn.tk", {"B": 3, "H": 3, "N": 192}),
    ("gemm.tk", {"M": 192, "K": 96, "N": 384}),
    ("softmax.tk", {"M": 3, "N": 6144}),
])
def test_default_dims_are_a_tile_and_a_tail(example: str, dims: dict[str, int]) -> None:
    assert runner.default_dims(kernel_of(example)) == dims


def test_input_bytes_counts_the_storage_form() -> None:
    k = kernel_of("gemm.tk")  # bf16 tensors live in float32 arrays
    assert runner.input_bytes(k, {"M": 192, "K": 96, "N": 384}) == 4 * (192 * 96 + 96 * 384 + 192 * 384)
    assert 0 < runner.input_budget() <= runner.MAX_INPUT_BYTES


def test_a_check_of_the_interpreter_runs_the_emulator() -> None:
    k = kernel_of("softmax.tk")
    args = random_args(k, {"M": 2, "N": 6144})
    result = runner.run(k, args, "interpret", check=True)
    assert result.backend == "emulate" and result.ok
    assert [m.name for m in result.checked] == ["x", "y"]


def test_a_check_fails_when_the_emulator_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check compares two executors: an emulator whose output is off by 0.25 fails it."""
    import tkc.emulator

    real = tkc.emulator.emulate

    def off(kernel: Operation, args: list, **kw: object) -> None:
        real(kernel, args, **kw)
        args[1] += np.float32(0.25)

    monkeypatch.setattr(tkc.emulator, "emulate", off)
    k = kernel_of("softmax.tk")
    result = runner.run(k, random_args(k, {"M": 2, "N": 6144}), "interpret", check=True)
    assert not result.ok
    y = result.checked[1]
    assert y.name == "y" and y.bad == y.total == 2 * 6144


def test_a_kernel_that_rounds_through_fp8_is_compared_within_fp8_ulps() -> None:
    """attn_fp8.tk rounds P to e4m3: its bf16 output is compared within e4m3's ulps; attention
    in bf16 keeps bf16's, and f32 outputs of kernels with bf16 casts keep f32's."""
    from tkc import dtypes
    from tkc.compiler import compile_kernel
    from tkc.runner import narrowest_cast, tolerance

    examples = Path(__file__).resolve().parents[1] / "examples"

    def kernel(name: str, **k):
        return compile_kernel(examples / name, stop="tkir", cache=False, **k).kernel_op

    fp8 = narrowest_cast(kernel("attn_fp8.tk"))
    assert fp8 == 8
    assert tolerance(dtypes.bf16, fp8) == (2**-3, 2**-3)
    assert tolerance(dtypes.bf16, fp8, scale=4.0) == (0.25, 2**-3)  # an e4m3 ulp of the largest output
    assert tolerance(dtypes.f32, fp8, scale=4.0) == (1e-4, 1e-4)
    assert tolerance(dtypes.bf16, narrowest_cast(kernel("attn.tk")), scale=4.0) == (2**-6, 2**-6)
    assert tolerance(dtypes.f32, narrowest_cast(kernel("attn_train.tk", kernel="attn_bwd"))) == (1e-4, 1e-4)


def test_partials_rounded_and_read_back_are_compared_within_an_ulp_of_the_largest_output() -> None:
    """layernorm_residual.tk rounds the residual sum to bf16 into its output and normalizes what
    it reads back: a last-bit difference before the rounding is an ulp of a term, larger than the
    result's own ulps where terms cancel.  Copies into a buffer (allgather_gemm.tk) round nothing
    and keep bf16's tolerance; sums added atomically (gemm_reducescatter.tk) are the next test's."""
    from tkc import dtypes
    from tkc.compiler import compile_kernel
    from tkc.runner import narrowest_staged, tolerance

    examples = Path(__file__).resolve().parents[1] / "examples"

    def staged(name: str) -> int:
        return narrowest_staged(compile_kernel(examples / name, stop="tkir", cache=False).kernel_op)

    assert staged("layernorm_residual.tk") == 16
    for name in ("gemm_reducescatter.tk", "gemm_allreduce.tk", "allgather_gemm.tk", "moe_dispatch.tk", "gemm.tk"):
        assert staged(name) == 32, name
    assert tolerance(dtypes.bf16, 16, scale=8.0, staged_bits=16) == (2**-4, 2**-6)  # two bf16 ulps of 8
    assert tolerance(dtypes.bf16, 16, scale=1.0, staged_bits=16) == (2**-6, 2**-6)
    assert tolerance(dtypes.f32, 16, scale=8.0, staged_bits=16) == (1e-4, 1e-4)
    assert tolerance(dtypes.bf16, 16, scale=8.0) == (2**-6, 2**-6)


def test_sums_of_atomic_adds_are_compared_within_f32_ulps_of_the_largest_output() -> None:
    """attention backward adds each block's dQ atomically from every key block's program, in an
    order each executor picks: on random inputs the terms (up to 1e21) cancel, and the emulator's
    dQ differs from the interpreter's by ulps of a term (1.8e13), which an element-wise f32
    tolerance called a mismatch; within 16 f32 ulps of the largest output it is not, and a
    dQ off by more is still caught."""
    from tkc import dtypes
    from tkc.compiler import compile_kernel
    from tkc.runner import atomic_sums, default_dims, tolerance

    consts = {"D": 64, "BM": 64, "BN": 64}
    k = compile_kernel(EXAMPLES / "attn_train.tk", consts, stop="tkir", cache=False, kernel="attn_bwd").kernel_op
    assert atomic_sums(k) == {"dq"}
    assert tolerance(dtypes.f32, 16, scale=2.0**40, summed=True) == (2.0**21, 1e-4)
    assert tolerance(dtypes.f32, 16, scale=1.0, summed=True) == (1e-4, 1e-4)
    # bf16 sums of atomic adds (a reduce-scatter adding into its peers): each addition rounds the
    # running sum, so within two bf16 ulps of the largest output
    assert tolerance(dtypes.bf16, 16, scale=2.0**40, summed=True) == (2.0**34, 2**-6)
    assert tolerance(dtypes.bf16, 16, scale=1.0, summed=True) == (2**-6, 2**-6)
    rs = compile_kernel(EXAMPLES / "gemm_reducescatter.tk", stop="tkir", cache=False).kernel_op
    assert atomic_sums(rs) == {"out"}
    args = random_args(k, default_dims(k))  # several key blocks add to each dQ block
    result = runner.run(k, args, "interpret", check=True)
    dq = next(m for m in result.checked if m.name == "dq")
    assert result.ok and dq.bad == 0 and dq.max_abs_error > 1e6, dq
    want = next(out for name, _, out in result.outputs if name == "dq").astype(np.float64)
    t = next(p.type for p in k.regions[0].block.args if p.name_hint == "dq")
    off = want.copy()
    off.flat[7] += 1e-4 * np.abs(want).max()  # an error of a 10,000th of the largest value
    assert runner._compare("dq", t, off, want, runner.rounding(k)._replace(rounded_operands=False)).bad == 1


def test_outputs_of_products_of_rounded_values_are_compared_within_bf16_ulps_of_the_largest() -> None:
    """A kernel that multiplies values it rounded to bf16 (attention backward's P and dS, an FFT's
    stages) moves every term of such a product by a bf16 ulp when an executor's last f32 bit
    differs before the rounding: where terms cancel, outputs agree to 2**-6 of the largest value,
    not element by element.  `tkc run FILE --check` of attn_train.tk and fftconv.tk (every
    kernel, default constants) failed on that and passes now; a GEMM, whose products read
    loaded values, keeps the element-wise tolerance."""
    from tkc import dtypes
    from tkc.compiler import compile_kernel
    from tkc.runner import multiplies_rounded, tolerance

    def k(name: str, kernel: str | None = None):
        return compile_kernel(EXAMPLES / name, {}, stop="tkir", cache=False, kernel=kernel).kernel_op

    assert multiplies_rounded(k("attn_train.tk", "attn_bwd")) and multiplies_rounded(k("fftconv.tk", "fft_rows"))
    assert not multiplies_rounded(k("gemm.tk")) and not multiplies_rounded(k("softmax.tk"))
    assert tolerance(dtypes.bf16, 16, scale=64.0, rounded_operands=True) == (1.0, 2**-6)
    assert tolerance(dtypes.f32, 16, scale=64.0, rounded_operands=True) == (1.0, 1e-4)
    assert tolerance(dtypes.f32, 32, scale=64.0, rounded_operands=True) == (1e-4, 1e-4)  # nothing rounded
    for name, kernel in (("attn_train.tk", "attn_bwd"), ("fftconv.tk", "fft_rows")):
        kern = k(name, kernel)
        result = runner.run(kern, random_args(kern, runner.default_dims(kern)), "interpret", check=True)
        assert result.ok, [m for m in result.checked if m.bad]


def test_the_same_infinity_on_both_sides_is_no_mismatch() -> None:
    # inf - inf is NaN: equal infinities (a log-sum-exp of a masked row) must compare equal,
    # and an infinity against a finite value, another infinity or NaN must not.
    t = TensorType(dtypes.f32, (4,))
    want = np.array([np.inf, -np.inf, 1.0, np.nan], np.float32)
    assert runner._compare("y", t, want.copy(), want).bad == 0
    for got in ([np.inf, np.inf, 1.0, np.nan], [np.inf, -np.inf, np.inf, np.nan], [np.nan, -np.inf, 1.0, np.nan],
                [np.inf, -np.inf, 1.0, 0.0]):
        assert runner._compare("y", t, np.array(got, np.float32), want).bad == 1


def test_a_check_reports_the_kernels_own_race_in_the_interpreters_words() -> None:
    """With --check the reference runs before the emulator: a kernel's own mistake (two
    programs storing one element) is the interpreter's error, not the emulator's (which names
    its CTAs, roles and hopper ops)."""
    from tkc.compiler import compile_kernel
    from tkc.errors import TkcError
    from tkc.interpreter import random_args
    from tkc.runner import run

    src = "@kernel\ndef s(a: f32[M, N], c: f32[M, N]):\n    grid(2)\n    c[0:64, 0:64] = a[0:64, 0:64]\n"
    kernel = compile_kernel(src, {}, stop="tkir", cache=False).kernel_op
    with pytest.raises(TkcError) as e:
        run(kernel, random_args(kernel, {"M": 64, "N": 64}, 0), "emulate", check=True)
    assert e.value.message.startswith("write-write race on element [0, 0] of 'c'"), e.value.message
    assert "hopper." not in e.value.message and "CTA" not in e.value.message
