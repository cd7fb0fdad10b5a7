"""FFT long convolution (issue 27): examples/fftconv.tk run by tkc.ops.fft_conv against a
float64 torch.fft reference in the interpreter (one kernel for 1k to 4k, three for 8k to 64k), the
emulator against the interpreter on each kernel with the real DFT matrices, ptxas without
spills for every configuration ``plan`` uses, and on a GPU against the same reference.

Tolerance: each path from input to output passes about six bf16 roundings (the DFT matrices,
the twiddled values, the filtered values, the inverse's operands and the output), each a
relative error of at most 2^-9 (0.2%, rms 0.11%); independent, they add to about 0.3% of the
output's rms, which the tests allow three times over (1%), and the largest error 2% of the
largest value (an output rounded to bf16 alone is 0.4% off)."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from device_checks import assert_no_spills, interpret_and_emulate, lowered, needs_ptxas, require_gpu
import tkc.ops.fftconv as fc
from tkc.compiler import compile_kernel
from tkc.errors import TkcUsageError
from tkc.kernel import interpret

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"

LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]


def _inputs(seed: int, B: int, H: int, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, N, generator=g).to(torch.bfloat16), torch.randn(H, N, generator=g) / N ** 0.5


def _close(got: torch.Tensor, u: torch.Tensor, k: torch.Tensor) -> None:
    want = fc.reference(u.double().cpu(), k.double().cpu())
    err = got.double().cpu() - want
    rms = want.pow(2).mean().sqrt().item()
    assert err.pow(2).mean().sqrt().item() <= 1e-2 * rms, f"rms error {err.pow(2).mean().sqrt():.4g}, rms {rms:.4g}"
    assert err.abs().max().item() <= 2e-2 * want.abs().max().item(), \
        f"max error {err.abs().max():.4g}, largest value {want.abs().max():.4g}"


@pytest.mark.parametrize("N,B,H,BB", [(1024, 3, 2, 2), (1024, 5, 1, 3), (2048, 2, 1, 8), (2048, 3, 2, None),
                                      (4096, 3, 2, 2), (16384, 1, 2, 1), (65536, 1, 1, 1)])
def test_interpreter_matches_torch_fft(N: int, B: int, H: int, BB: int | None) -> None:
    """B not a multiple of BB: the last program's rows past B read 0 and are not written (BB
    None: the plan's rows a program)."""
    u, k = _inputs(N + B, B, H, N)
    _close(fc.fft_conv(u, k, BB=BB), u, k)


def _row_close(got: torch.Tensor, u: torch.Tensor, k: torch.Tensor) -> None:
    """``_close`` for each row alone, at its own scale."""
    for b in range(u.shape[0]):
        _close(got[b:b + 1], u[b:b + 1], k)


@pytest.mark.parametrize("N", [1024, 4096, 8192])
@pytest.mark.parametrize("ratio", [100.0, 1e4])
def test_a_row_beside_one_of_another_scale_is_as_close_as_alone(N: int, ratio: float) -> None:
    """Each row of a pair enters at unit scale and leaves at its own: a row beside one 100 or
    10^4 times larger (without the scaling 20% and more off), or beside a row that is half
    zeros, meets the tolerance at its own size, as with ``pairs=False``; a row of zeros gives
    zeros exactly, beside a nonzero row too (B odd: the last row's partner is past B)."""
    u, k = _inputs(3, 5, 1, N)
    u[0] *= ratio
    u[3] /= ratio
    u[1, :, : N // 2] = 0
    u[2] = 0
    got = fc.fft_conv(u, k)
    _row_close(got, u, k)
    assert (got[2] == 0).all()
    # Rows whose squares over- or underflow f32 (values near 1e18, 1e-25) are scaled as well,
    # in either order in their pair (scales 2^200 apart: no ratio of the two is formed).
    extreme = u.clone()
    extreme[0] = extreme[3] = u[4] * 1e18
    extreme[1] = extreme[2] = u[4] * 1e-25
    _row_close(fc.fft_conv(extreme, k), extreme, k)
    _row_close(fc.fft_conv(u, k, pairs=False), u, k)
    # Without the scaling the pair rounds at its larger row's scale: row 1 beside row 0 is off.
    want = fc.reference(u.double(), k.double())[1]
    err = (fc.fft_conv(u, k, scale_rows=False)[1].double() - want).abs().max()
    assert err > 0.1 * want.abs().max()


def test_plans() -> None:
    assert fc.plan(1024) == fc.Plan(1024, 2048, N1=32, BB=8)
    assert fc.plan(2048) == fc.Plan(2048, 4096, N1=64, BB=2)
    assert fc.plan(4096) == fc.Plan(4096, 8192, N1=64, M2=128, BB=2)
    assert (fc.plan(8192).L, fc.plan(8192).P, fc.plan(8192).KP) == (16384, 16, 16)
    assert (fc.plan(65536).L, fc.plan(65536).P, fc.plan(65536).Q, fc.plan(65536).KP) == (131072, 64, 2048, 32)
    for bad in (512, 3000, 131072):
        with pytest.raises(TkcUsageError, match=f"has {bad} values a channel; it takes 1024 to 65536"):
            fc.plan(bad)


def test_a_filter_tensor_makes_its_constants_once() -> None:
    # Each call given a tensor filter computes its response, but the DFT matrices and twiddles
    # of its plan are made (and, on a GPU, copied over, waiting for the queue) once.
    k = torch.randn(4, 2048)
    first, again = fc.Filter.of(k), fc.Filter.of(torch.randn(6, 2048))
    assert all(again.consts[name] is t for name, t in first.consts.items())
    assert fc.Filter.of(torch.randn(4, 1024)).consts["f1"].shape != first.consts["f1"].shape  # its plan's own
    for name, t in fc.constants(first.plan).items():
        assert torch.equal(first.consts[name], t)


def test_arguments_it_does_not_take_are_tkc_errors() -> None:
    u, k = torch.randn(2, 4, 1024, dtype=torch.bfloat16), torch.randn(4, 1024)
    for call, said in ((lambda: fc.fft_conv(u[..., :512], k), "u has 512 values a row, the filter 1024"),
                       (lambda: fc.fft_conv(u[0], k), "u must have three dims"),
                       (lambda: fc.fft_conv(u, k, BB=0), "BB, the rows of a channel a program takes"),
                       (lambda: fc.fft_conv(u, k[:3]), "u has 4 channels, the filter 3"),
                       (lambda: fc.fft_conv(u.float(), k), "u is torch.float32"),
                       (lambda: fc.fft_conv(u, k.to("meta")), "u and k must be on one device, got cpu and meta")):
        with pytest.raises(TkcUsageError, match=said):
            call()
    with pytest.raises(TkcUsageError, match="scale_rows is True or False, got 1"):
        fc.fft_conv(u, k, scale_rows=1)
    with pytest.raises(TkcUsageError, match="k must be real"):
        fc.fft_conv(u, k.to(torch.complex64))


@pytest.mark.parametrize("N,B,H,pairs", [(1024, 3, 2, True), (1024, 2, 1, False), (8192, 1, 1, True)])
def test_gradients_match_float64_autograd(N: int, B: int, H: int, pairs: bool) -> None:
    """u's gradient through the kernels (dy read backwards; 8k: the three-kernel plan), k's
    through torch.fft, against autograd of the float64 reference."""
    u, k = _inputs(N + 7, B, H, N)
    c = torch.randn(B, H, N, generator=torch.Generator().manual_seed(N), dtype=torch.float64)
    ug, kg = u.clone().requires_grad_(), k.clone().requires_grad_()
    (fc.fft_conv(ug, kg, pairs=pairs).double() * c).sum().backward()
    ud, kd = u.double().requires_grad_(), k.double().requires_grad_()
    (fc.reference(ud, kd) * c).sum().backward()
    assert ug.grad.dtype == torch.bfloat16 and kg.grad.dtype == k.dtype
    for got, want in ((ug.grad, ud.grad), (kg.grad, kd.grad)):
        err = got.double() - want
        rms = want.pow(2).mean().sqrt().item()
        assert err.pow(2).mean().sqrt().item() <= 1e-2 * rms and err.abs().max() <= 2e-2 * want.abs().max()


def test_compiles_to_one_graph_with_gradients_as_eager() -> None:
    """Under torch.compile(fullgraph=True) fft_conv is the operator torch.ops.tkc.fft_conv (its
    fake implementation traces; its backward calls it again on dy read backwards): no graph
    break, outputs and gradients as the eager function's."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    def f(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return fc.fft_conv(u, k).float().square().sum()

    u, k = _inputs(3, 2, 2, 1024)
    torch._dynamo.reset()
    graphs = AotEagerAndRecordGraphs()
    compiled = torch.compile(f, fullgraph=True, backend=graphs)
    results = []
    for fn in (f, compiled):
        ug, kg = u.clone().requires_grad_(), k.clone().requires_grad_()
        loss = fn(ug, kg)
        loss.backward()
        results.append((loss, ug.grad, kg.grad))
    for eager, traced in zip(*results):
        torch.testing.assert_close(traced, eager)
    (bw,) = graphs.bw_graphs
    assert "tkc.fft_conv.default" in {str(n.target) for n in bw.graph.nodes if n.op == "call_function"}


def test_the_operator_passes_opcheck() -> None:
    u, k = _inputs(4, 2, 1, 1024)
    torch.library.opcheck(torch.ops.tkc.fft_conv.default, (u.requires_grad_(), k.requires_grad_(), None, True, True))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # the fake implementation refuses as a call does
        with pytest.raises(TkcUsageError, match="u has 1 channels, the filter 3"):
            torch.ops.tkc.fft_conv(torch.empty(2, 1, 1024, dtype=torch.bfloat16), torch.empty(3, 1024))
        with pytest.raises(TkcUsageError, match="1000 values a channel; it takes 1024 to 65536"):
            torch.ops.tkc.fft_conv(torch.empty(2, 1, 1000, dtype=torch.bfloat16), torch.empty(1, 1000))


def test_a_filter_object_takes_no_gradient_but_u_does() -> None:
    u, k = _inputs(1, 2, 1, 1024)
    ug = u.clone().requires_grad_()
    fc.fft_conv(ug, fc.Filter.of(k)).float().sum().backward()
    assert ug.grad is not None and ug.grad.shape == u.shape


def test_no_channels_give_an_empty_output() -> None:
    y = fc.fft_conv(torch.ones(1, 0, 1024, dtype=torch.bfloat16), torch.ones(0, 1024))
    assert y.shape == (1, 0, 1024)


def _configs() -> dict[str, tuple[str, dict]]:
    out = {}
    for N in LENGTHS:
        p = fc.plan(N)
        if not p.P:
            out[f"fftconv-N1={p.N1}-M2={p.M2}-BP={p.BB // 2}"] = ("fftconv", {"N1": p.N1, "M2": p.M2, "BP": p.BB // 2})
            continue
        out[f"fft_cols-P={p.P}-KP={p.KP}"] = ("fft_cols", {"P": p.P, "KP": p.KP})
        out[f"fft_rows-P={p.P}-Q1={p.Q1}"] = ("fft_rows", {"P": p.P, "Q1": p.Q1})
        out[f"ifft_cols-P={p.P}-KP={p.KP}"] = ("ifft_cols", {"P": p.P, "KP": p.KP})
    for BM, BN in ((16, 512), (1, 2048), (1, 4096)):
        out[f"row_norms-BM={BM}-BN={BN}"] = ("row_norms", {"BM": BM, "BN": BN})
    return out


CONFIGS = _configs()


def _compile(name: str, consts: dict, stop: str):
    extra = {"BB": 2} if name == "fft_rows" else {}
    return compile_kernel(EXAMPLES / "fftconv.tk", {**extra, **consts}, kernel=name, stop=stop, cache=False)


def _emulator_args(name: str, N: int) -> list:
    """The kernel's arguments for B = 3 (two programs of BB = 2 rows, or of one pair of rows, the
    second half empty; three pairs between the column kernels, the third past B), H = 1 and a
    row of N, with the real DFT matrices, twiddles and filter response; the rows' norms for rows
    100 times apart and a row of zeros."""
    p = fc.plan(N)
    u, k = _inputs(5, 3, 1, N)
    u[0] *= 100
    u[2] = 0
    norm = torch.linalg.vector_norm(u, dim=-1, dtype=torch.float32)
    c, kf = fc.constants(p), fc.response(k, p)
    if not p.P:
        R = p.N1 // 2
        args = [u.view(3, 1, R, p.M2), norm, kf, c["f1"], c["f2"], c["tw"],
                torch.zeros(3, 1, R, p.M2, dtype=torch.bfloat16)]
    else:
        R, Q = N // p.Q, p.Q
        z = torch.randn(3, 1, 2 * p.P, p.Q1, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        out = torch.zeros_like(z)
        args = {"fft_cols": [u.view(3, 1, R, Q), norm, c["fp"], c["tlc"], out.view(3, 1, 2, p.P, Q)],
                "fft_rows": [z, kf, c["fq"], c["f2"], c["tq"], c["tl"], out],
                "ifft_cols": [z.view(3, 1, 2, p.P, Q), norm, c["fp"],
                              torch.zeros(3, 1, R, Q, dtype=torch.bfloat16)]}[name]
    return [a.float().numpy().copy() for a in args]  # the interpreter's bf16: f32 arrays of bf16 values


@pytest.mark.parametrize("name,N,BP", [("fftconv", 1024, 1), ("fftconv", 1024, 2), ("fftconv", 2048, 1),
                                       ("fftconv", 4096, 1), ("fft_cols", 8192, 1), ("fft_rows", 8192, 1),
                                       ("ifft_cols", 8192, 2)])
def test_emulator_matches_interpreter(name: str, N: int, BP: int) -> None:
    """Each row at its own scale (rows 100 times apart and a row of zeros: _emulator_args);
    BP = 2: a loop over pairs, whose norms are read an iteration ahead, the second pair's
    partner past B."""
    p = fc.plan(N)
    if not p.P:
        consts = {"N1": p.N1, "M2": p.M2, "BP": BP}
    else:
        consts = {"P": p.P, "Q1": p.Q1} if name == "fft_rows" else {"P": p.P, "KP": p.KP, "BP": BP}
    tile_ir = _compile(name, consts, "tkir").kernel_op
    hopper = lowered(lambda stop: _compile(name, consts, stop)).kernel_op
    args = _emulator_args(name, N)
    want, got = interpret_and_emulate(tile_ir, hopper, args, 2)
    out = len(args) - 1
    # bf16 outputs summed in other orders: a rounding boundary apart, through later products
    for w, g in zip(want[out], got[out]):  # row by row, each at its own size
        np.testing.assert_allclose(g, w, rtol=2e-2, atol=2e-2 * np.abs(w).max())
        assert np.abs(g - w).mean() <= 1e-3 * np.abs(w).mean()


@pytest.mark.parametrize("BM,BN,R,N", [(16, 512, 19, 1000), (1, 2048, 3, 5000), (1, 4096, 2, 4096)])
def test_row_norms_emulated_agree_with_the_interpreter(BM: int, BN: int, R: int, N: int) -> None:
    """Each row's scale: the power of two at or below its L2 norm, for rows of values near
    1e18 and 1e-25 too (their squares over- and underflow f32), 0 for a row of zeros; rows past
    R and columns past N (a last block part past the row) read 0."""
    consts = {"BM": BM, "BN": BN}
    tile_ir = _compile("row_norms", consts, "tkir").kernel_op
    hopper = lowered(lambda stop: _compile("row_norms", consts, stop)).kernel_op
    u = torch.randn(R, N, generator=torch.Generator().manual_seed(R))
    u[0] *= 1e18
    u[1] *= 1e-25
    u[-1] = 0
    u = u.to(torch.bfloat16)
    args = [u.float().numpy(), np.zeros(R, np.float32)]
    want, got = interpret_and_emulate(tile_ir, hopper, args, 2)
    np.testing.assert_array_equal(got[1], want[1])
    norm = torch.linalg.vector_norm(u.double(), dim=-1).numpy()
    scale = want[1].astype(np.float64)
    assert scale[-1] == 0 and (np.frexp(scale[:-1])[0] == 0.5).all()  # powers of two
    assert ((norm[:-1] / scale[:-1] >= 0.99) & (norm[:-1] / scale[:-1] < 2.01)).all(), norm / scale


def test_row_norms_clamps_rows_past_the_normal_range() -> None:
    """Rows whose norm is a bf16 subnormal (their largest value's reciprocal overflows f32)
    take 2^-126, rows near bf16's largest value 2^126; none is NaN.  2048 values of 1e-39 make
    a normal norm (2^-125)."""
    u = torch.tensor([[1e-39] + [0.0] * 2047, [9.2e-41] + [0.0] * 2047, [1e-39] * 2048,
                      [3e38] * 2048]).to(torch.bfloat16)
    n = torch.zeros(4)
    interpret(fc.KERNELS["row_norms"], u, n, BM=1, BN=2048)
    assert n.tolist() == [2.0 ** -126, 2.0 ** -126, 2.0 ** -125, 2.0 ** 126]


@needs_ptxas
@pytest.mark.parametrize("config", list(CONFIGS))
def test_assembles_without_spills(config: str) -> None:
    name, consts = CONFIGS[config]
    assert_no_spills(compile_kernel(EXAMPLES / "fftconv.tk", consts, kernel=name, cache=False))


@pytest.mark.gpu
@pytest.mark.parametrize("N", LENGTHS)
def test_on_gpu_as_torch_fft(N: int) -> None:
    """B = 5 (the last row's partner past B): rows 100 times apart and a row of zeros, each
    close at its own size."""
    require_gpu()
    u, k = _inputs(7, 5, 3, N)
    u[0] *= 100
    u[2] = 0
    f = fc.Filter.of(k.cuda())
    got = fc.fft_conv(u.cuda(), f).cpu()
    _row_close(got, u, k)
    assert (got[2] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("N", [1024, 4096, 16384])
def test_gradients_on_gpu_match_float64_autograd(N: int) -> None:
    require_gpu()
    u, k = _inputs(N, 5, 3, N)
    c = torch.randn(5, 3, N, generator=torch.Generator().manual_seed(N), dtype=torch.float64)
    ug, kg = u.cuda().requires_grad_(), k.cuda().requires_grad_()
    (fc.fft_conv(ug, kg).double() * c.cuda()).sum().backward()
    ud, kd = u.double().requires_grad_(), k.double().requires_grad_()
    (fc.reference(ud, kd) * c).sum().backward()
    for got, want in ((ug.grad.cpu(), ud.grad), (kg.grad.cpu(), kd.grad)):
        err = got.double() - want
        rms = want.pow(2).mean().sqrt().item()
        assert err.pow(2).mean().sqrt().item() <= 1e-2 * rms and err.abs().max() <= 2e-2 * want.abs().max()
