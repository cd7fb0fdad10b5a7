"""Launching kernels in the interpreter: argument checks, grids, torch tensors, random inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tkc.dtypes import bf16, f8e5m2, round_to
from tkc.errors import Loc, TkcInterpretError, TkcLaunchError
from tkc.grid import launch_grid
from tkc.interpreter import interpret_module, random_args, run_kernel
from tkc.ir.core import Operation
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify

GEMM = (Path(__file__).parent / "kernels" / "gemm.tkir").read_text()

SIG_IR = """
tile.kernel @k {
^(%a: tensor<bf16[M, 16]>, %b: tensor<i32[M]>, %m: tensor<i1[N]>, %s: f32, %n: i32, %f: i1):
  %M = tile.dim %a {axis = 0} : i32
  %c16 = tile.constant {value = 16} : i32
  %g = tile.cdiv %M, %c16 : i32
  %g2 = tile.add %n, %n : i32
  tile.grid %g, %g2
  tile.return
}"""


def compile_ir(text: str):
    m = parse_module(text, "test.tkir")
    verify(m)
    return m.kernel()


def sig_args(M: int = 40, N: int = 3) -> list:
    return [np.zeros((M, 16), np.float32), np.zeros(M, np.int32), np.zeros(N, bool), 0.5, 2, True]


# --------------------------------------------------------------------- grid
def test_launch_grid_reads_only_shapes():
    kernel = compile_ir(SIG_IR)
    assert launch_grid(kernel, sig_args(M=40)) == (3, 4)
    assert launch_grid(kernel, sig_args(M=0)) == (0, 4)


def test_launch_grid_gemm():
    kernel = compile_ir(GEMM)
    args = random_args(kernel, {"M": 129, "N": 64, "K": 8})
    assert launch_grid(kernel, args) == (3, 1)


def test_no_grid_statement():
    kernel = compile_ir(SIG_IR.replace("  tile.grid %g, %g2\n", ""))
    with pytest.raises(TkcInterpretError, match=r"has no grid\(\.\.\.\) statement: write one in the kernel, or "
                                                r"pass the launch.s \(grid= from Python, --grid from tkc run\)"):
        launch_grid(kernel, sig_args())
    with pytest.raises(TkcInterpretError, match="grid= from Python"):
        run_kernel(kernel, sig_args())
    run_kernel(kernel, sig_args(), grid=(2,))  # fine with an explicit grid


@pytest.mark.parametrize("grid", [(), (1, 2, 3, 4), (-1,), (1.5,), "abc"])
def test_bad_grid(grid):
    kernel = compile_ir(SIG_IR)
    with pytest.raises(TkcLaunchError, match="grid must be 1 to 3 non-negative integers"):
        run_kernel(kernel, sig_args(), grid=grid)


# ------------------------------------------------------------ argument checks
@pytest.mark.parametrize("mutate,message", [
    (lambda a: a.pop(), r"kernel @k takes 6 arguments \(a, b, m, s, n, f\), got 5"),
    (lambda a: a.__setitem__(0, np.zeros(40, np.float32)),
     r"a: expected rank 2 for tensor<bf16\[M, 16\]>, got shape \(40,\)"),
    (lambda a: a.__setitem__(0, np.zeros((40, 16), np.float64)),
     r"a: expected a numpy array of dtype float32 \(holding bf16 values\), got float64"),
    (lambda a: a.__setitem__(1, np.zeros(40, np.int64)),
     r"b: expected a numpy array of dtype int32 \(holding i32 values\), got int64"),
    (lambda a: a.__setitem__(0, [[0.0] * 16] * 40),
     r"a: expected tensor<bf16\[M, 16\]> \(a numpy array or torch tensor\), got list"),
    (lambda a: a.__setitem__(0, np.zeros((40, 8), np.float32)), r"a: axis 1 must have size 16, got 8"),
    (lambda a: a.__setitem__(1, np.zeros(96, np.int32)), r"dim M is 40 from a \(axis 0\) but 96 from b \(axis 0\)"),
    (lambda a: a.__setitem__(3, "x"), "s: expected a scalar of type f32, got str 'x'"),
    (lambda a: a.__setitem__(3, True), "s: expected a scalar of type f32, got bool True"),
    (lambda a: a.__setitem__(4, 2.0), "n: expected a scalar of type i32, got float 2.0"),
    (lambda a: a.__setitem__(4, 2**31), "n: 2147483648 does not fit in i32"),
    (lambda a: a.__setitem__(5, 1), "f: expected a scalar of type bool, got int 1"),
    (lambda a: a.__setitem__(4, np.zeros(3, np.int32)), "n: expected a scalar of type i32, got ndarray$"),
])
def test_launch_errors(mutate, message):
    kernel = compile_ir(SIG_IR)
    args = sig_args()
    mutate(args)
    with pytest.raises(TkcLaunchError, match=message):
        run_kernel(kernel, args)
    with pytest.raises(TkcLaunchError, match=message):
        launch_grid(kernel, args)


def test_gemm_inconsistent_dims_message():
    kernel = compile_ir(GEMM)
    a = np.zeros((128, 32), np.float32)
    b = np.zeros((32, 64), np.float32)
    c = np.zeros((96, 64), np.float32)
    with pytest.raises(TkcLaunchError) as e:
        run_kernel(kernel, [a, b, c])
    assert e.value.message == "dim M is 128 from a (axis 0) but 96 from c (axis 0)"


def test_numpy_scalars_and_f16_arrays_accepted():
    kernel = compile_ir(SIG_IR)
    args = sig_args()
    args[3:] = [np.float64(0.25), np.int32(1), np.bool_(False)]
    assert launch_grid(kernel, args) == (3, 2)
    f16 = compile_ir(SIG_IR.replace("bf16[M, 16]", "f16[M, 16]"))
    args[0] = np.zeros((40, 16), np.float16)
    run_kernel(f16, args)


def test_inputs_are_rounded_on_entry_and_written_back():
    kernel = compile_ir("""
tile.kernel @k {
^(%x: tensor<bf16[16]>, %o: tensor<bf16[16]>):
  %c1 = tile.constant {value = 1} : i32
  tile.grid %c1
  %c0 = tile.constant {value = 0} : i32
  %a = tile.load %x, %c0 {box = [16]} : tile<16xbf16>
  tile.store %o, %a, %c0 {box = [16]}
  tile.return
}""")
    x = np.full(16, 1 + 2.0**-10, np.float32)  # not a bf16 value: reads as 1.0
    o = np.zeros(16, np.float32)
    run_kernel(kernel, [x, o])
    assert (o == 1.0).all()
    assert (x == 1 + 2.0**-10).all()  # an input the kernel does not store to is left alone
    # one array as the tensor read and the one written: refused (docs/language.md: a written
    # tensor must not overlap a read one), as a view into it is
    with pytest.raises(TkcLaunchError, match="'o' shares memory with 'x', which the kernel reads"):
        run_kernel(kernel, [o, o])
    big = np.zeros(24, np.float32)
    with pytest.raises(TkcLaunchError, match="'o' shares memory with 'x'"):
        run_kernel(kernel, [big[8:], big[:16]])
    run_kernel(kernel, [big[:8].repeat(2), big[8:]])  # separate memory: fine


def test_unknown_op_is_located_error():
    class Bogus(Operation):  # deliberately not registered: no interpreter rule either
        name = "test.bogus"

    kernel = compile_ir(SIG_IR)
    loc = Loc("bogus.tkir", 4, 2)
    body = kernel.regions[0].block
    body.insert(len(body.ops) - 1, Bogus([], [], loc=loc))
    with pytest.raises(TkcInterpretError, match=r"cannot run op 'test.bogus' \(in program \(0, 0\)\)") as e:
        run_kernel(kernel, sig_args())
    assert e.value.loc == loc


# --------------------------------------------------------------------- torch
def test_torch_bf16_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    kernel = compile_ir(GEMM)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(70, 40, generator=g).bfloat16()
    b = torch.randn(40, 80, generator=g).bfloat16()
    c = torch.zeros(70, 80, dtype=torch.bfloat16)
    run_kernel(kernel, [a, b, c])
    assert c.dtype == torch.bfloat16
    # Bit-identical to the same run on numpy storage arrays.
    an, bn, cn = a.float().numpy(), b.float().numpy(), np.zeros((70, 80), np.float32)
    run_kernel(kernel, [an, bn, cn])
    assert np.array_equal(c.float().numpy(), cn)
    torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=1e-2, atol=1e-2)


def test_torch_dtype_mismatch():
    torch = pytest.importorskip("torch")
    kernel = compile_ir(GEMM)
    a = torch.zeros(64, 32)
    b = torch.zeros(32, 64, dtype=torch.bfloat16)
    with pytest.raises(TkcLaunchError, match="a: expected a tensor of dtype bf16, got torch.float32"):
        run_kernel(kernel, [a, b, b.new_zeros(64, 64)])


# --------------------------------------------------------------- random_args
def test_random_args():
    kernel = compile_ir(SIG_IR.replace("bf16[M, 16]", "f8e5m2[M, 16]"))
    args = random_args(kernel, {"M": 33, "N": 5}, seed=7)
    a, b, m, s, n, f = args
    assert a.shape == (33, 16) and a.dtype == np.float32 and np.array_equal(round_to(a, f8e5m2), a)
    assert b.shape == (33,) and b.dtype == np.int32 and np.abs(b).max() <= 8
    assert m.shape == (5,) and m.dtype == bool
    assert isinstance(s, float) and 0.5 <= s <= 1.5
    assert isinstance(n, int) and 1 <= n <= 8
    assert isinstance(f, bool)
    again = random_args(kernel, {"M": 33, "N": 5}, seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(args, again))
    assert not np.array_equal(a, random_args(kernel, {"M": 33, "N": 5}, seed=8)[0])
    assert launch_grid(kernel, args) == (3, 2 * n)


def test_random_args_int_range():
    kernel = compile_ir(SIG_IR)
    b = random_args(kernel, {"M": 500, "N": 5}, int_range=(100, 101))[1]
    assert set(np.unique(b)) == {100, 101}
    assert random_args(kernel, {"M": 7, "N": 5}, int_range=(-(2**31), 2**31 - 1))[1].dtype == np.int32
    for bad in ((3, 2), (0, 2**31)):
        with pytest.raises(TkcLaunchError, match=r"integer range \[.*\] is empty or does not fit in i32"):
            random_args(kernel, {"M": 7, "N": 5}, int_range=bad)


def test_random_args_missing_dims():
    kernel = compile_ir(SIG_IR)
    with pytest.raises(TkcLaunchError, match=r"no size given for dim\(s\) M, N"):
        random_args(kernel, {})


def test_interpret_module():
    module = parse_module(GEMM)
    a, b, c = interpret_module(module, "gemm", dims={"M": 20, "N": 30, "K": 40})
    ref = round_to(a.astype(np.float64) @ b.astype(np.float64), bf16)
    np.testing.assert_allclose(c, ref, rtol=1e-2, atol=1e-2)


# ------------------------------------------------------------ read-only arrays
COPY_TK = """
@kernel
def copy(x: f32[N], y: bf16[N], z: f32[N], B: const = 16):
    grid(cdiv(N, B))
    i = program_id(0)
    t = x[i*B:(i+1)*B]
    y[i*B:(i+1)*B] = t.to(bf16)
    z[i*B:(i+1)*B] = t
"""


@pytest.mark.parametrize("out", ["y", "z"])  # bf16: written back; f32: would run in place
def test_read_only_output_is_a_launch_error(out: str):
    """A kernel storing to a read-only numpy array fails as a launch error naming the
    parameter, not with numpy's ValueError, and leaves the array as it was."""
    import tkc
    from tkc.frontend import compile_source

    kernel = compile_source(COPY_TK).kernel()
    args = {n: np.zeros(20, np.float32) for n in "xyz"}
    args["x"][:] = np.arange(20)
    args[out].flags.writeable = False
    with pytest.raises(TkcLaunchError, match=f"{out}: the kernel stores to it, but the numpy array is read-only"):
        tkc.interpret(kernel, *args.values())
    assert not args[out].any()
    args["x"].flags.writeable = False  # a read-only input is fine
    args[out] = np.zeros(20, np.float32)
    tkc.interpret(kernel, *args.values())
    assert np.array_equal(args["y"], args["x"]) and np.array_equal(args["z"], args["x"])



def test_a_grid_with_more_axes_than_the_kernels_is_refused() -> None:
    """A persistent GEMM's grid is one axis (its programs walk the tiles): a caller's (1, 2)
    would run every tile twice.  Refused before anything runs, in the emulator and the
    interpreter alike."""
    from tkc.compiler import compile_kernel
    from tkc.emulator.machine import emulate
    from tkc.errors import TkcLaunchError
    from tkc.interpreter import random_args, run_kernel

    src = Path(__file__).parents[2] / "examples" / "gemm.tk"
    hopper = compile_kernel(src, {"BM": 64, "BN": 64, "BK": 32, "persistent": True}, stop="hopper", cache=False)
    tile_ir = compile_kernel(src, {"BM": 64, "BN": 64, "BK": 32}, stop="tkir", cache=False).kernel_op
    args = random_args(tile_ir, {"M": 100, "N": 72, "K": 40}, 0)
    with pytest.raises(TkcLaunchError, match=r"grid \(1, 2\): kernel 'gemm' has a grid of 1 axis.*it is persistent"):
        emulate(hopper.kernel_op, args, grid=(1, 2))
    with pytest.raises(TkcLaunchError, match=r"grid \(1, 1, 2\): kernel 'gemm' has a grid of 2 axes"):
        run_kernel(tile_ir, args, grid=(1, 1, 2))
    run_kernel(tile_ir, args, grid=(2, 1, 1))  # trailing extents of 1 are fine
