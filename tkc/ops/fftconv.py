"""``fft_conv``: FFT long convolution through examples/fftconv.tk (tkc/ops/kernels links it),
and the host side its kernels need: the DFT matrices, twiddles and filter responses.

    y = tkc.ops.fft_conv(u, k)   # u bf16 [B, H, N], k [H, N]: y[b, h] = causal conv of u[b, h] with k[h]

``plan(N)`` says how a length is cut: N = 1k to 4k in one kernel (L = 2N = N1 * M2, 32 x 64,
64 x 64, 64 x 128; rows in pairs, one complex row each; from 2k one pair a program, where a
loop over two spills the twiddles and the filter it keeps in registers), N = 8k to 64k in
three (L = 2N = P * Q, Q = 1024 or 2048; rows in pairs too); each row of a pair at unit norm
(``row_norms`` first).  ``Filter`` holds a filter's
response, computed once (the kernels' layout, divided by L), and the constant tensors of its
length; CUDA tensors run on the GPU, CPU ones (and everything with TKC_INTERPRET=1) in the
interpreter.  ``fft_conv`` is a plain function launching its kernels in turn (a ``Filter``
keeps a filter's response between calls), with gradients from an ``autograd.Function`` (u's
through the same kernels, k's through torch.fft); under ``torch.compile`` it calls the
operator ``torch.ops.tkc.fft_conv`` instead, which computes the response each call and traces
(a fake implementation, the same gradients).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from tkc.errors import TkcUsageError
from tkc.kernel import interpret, load
from tkc.ops import checks
from tkc.ops.kernel_op import through_dispatcher
from tkc.ops.kernels import path

__all__ = ["Filter", "fft_conv", "plan", "reference"]

KERNELS = {name: load(path("fftconv.tk"), name)
           for name in ("fftconv", "fft_cols", "fft_rows", "ifft_cols", "row_norms")}


@dataclass(frozen=True)
class Plan:
    """How a row of N values is cut: ``L`` the DFT length; one kernel (``P`` = 0, L = N1 * M2) or
    three (L = P * Q, Q = Q1 * 64, R = N / Q rows of u, KP of them read); ``BB`` the rows of a
    channel a program takes unless the caller says (in pairs)."""

    N: int
    L: int
    N1: int = 0
    M2: int = 64
    P: int = 0
    Q1: int = 0
    BB: int = 8

    @property
    def Q(self) -> int:
        return self.Q1 * 64

    @property
    def KP(self) -> int:
        return max(16, self.N // self.Q)


def plan(N: int) -> Plan:
    if N == 1024:
        return Plan(N, 2 * N, N1=32)
    # One pair of rows a program (ptxas: 206 and 254 registers, no spills; a loop over two spills)
    if N == 2048:
        return Plan(N, 2 * N, N1=64, BB=2)
    if N == 4096:  # products of 128 rows on two warpgroups
        return Plan(N, 2 * N, N1=64, M2=128, BB=2)
    if N & (N - 1) or not 1024 <= N <= 65536:
        raise TkcUsageError(f"tkc.ops.fft_conv: the filter has {N} values a channel; it takes 1024 to 65536, a "
                            f"power of two (pad the sequence and the filter with zeros)")
    Q1 = 16 if N <= 16384 else 32
    return Plan(N, 2 * N, P=2 * N // (Q1 * 64), Q1=Q1)


def _dft(n: int) -> torch.Tensor:
    i = torch.arange(n, dtype=torch.float64)
    return torch.polar(torch.ones(n, n, dtype=torch.float64), -2 * math.pi * torch.outer(i, i) / n)


def _twiddle(rows: torch.Tensor, cols: torch.Tensor, L: int) -> torch.Tensor:
    """exp(-2 pi i r c / L) for every r of ``rows`` and c of ``cols`` (the product reduced mod L)."""
    e = torch.remainder(torch.outer(rows, cols), L).double()
    return torch.polar(torch.ones_like(e), -2 * math.pi * e / L)


def _planes(x: torch.Tensor, dtype: torch.dtype, negated: bool = False) -> torch.Tensor:
    """Real and imaginary parts stacked on a new axis (and -imag third with ``negated``)."""
    parts = [x.real, x.imag] + ([-x.imag] if negated else [])
    return torch.stack(parts, -3 if x.dim() >= 2 else 0).to(dtype)


def constants(p: Plan, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The DFT matrices (bf16) and twiddles (f32) the kernels of plan ``p`` read."""
    ar = torch.arange
    f2 = _planes(_dft(p.M2), torch.bfloat16, negated=True)  # M2 = 64 for the three kernels
    if not p.P:
        out = {"f1": _planes(_dft(p.N1), torch.bfloat16, negated=True), "f2": f2,
               "tw": _planes(_twiddle(ar(p.M2), ar(p.N1), p.L), torch.float32)}
    else:
        n2 = ar(p.Q1)[None, :] * 64 + ar(64)[:, None]          # [q2, q1] -> n2 = 64 q1 + q2
        tl = _twiddle(ar(p.P), n2.reshape(-1), p.L).reshape(p.P, 64, p.Q1)
        out = {"fp": _planes(_dft(p.P), torch.bfloat16, negated=True),
               "fq": _planes(_dft(p.Q1), torch.bfloat16, negated=True),
               "f2": f2, "tq": _planes(_twiddle(ar(64), ar(p.Q1), p.Q), torch.float32),
               "tl": torch.stack([tl.real, tl.imag]).float(),
               "tlc": _planes(_twiddle(ar(p.Q), ar(p.P), p.L), torch.float32)}
    return {k: v.to(device) for k, v in out.items()}


def response(k: torch.Tensor, p: Plan) -> torch.Tensor:
    """The filter k [H, N]'s DFT of length L divided by L, f32, in the order of the kernels:
    [H, 2, M2, N1] (one kernel: index k1 + N1 k2 at [k2, k1]) or [H, P, 2, 64, Q1] (three:
    index k1 + P (q1 + Q1 q2) at [k1, :, q2, q1])."""
    if k.shape[0]:
        kf = torch.fft.fft(k.double(), p.L) / p.L
    else:  # no channels (torch.fft refuses an empty batch)
        kf = torch.zeros(0, p.L, dtype=torch.complex128, device=k.device)
    if not p.P:
        return _planes(kf.reshape(-1, p.M2, p.N1), torch.float32)
    kf = kf.reshape(-1, 64, p.Q1, p.P).permute(0, 3, 1, 2)    # [H, k1, q2, q1]
    return torch.stack([kf.real, kf.imag], 2).float().contiguous()


@dataclass
class Filter:
    """A filter's response and the constants of its length, made once (FlashFFTConv's k_f)."""

    plan: Plan
    kf: torch.Tensor
    consts: dict[str, torch.Tensor]

    @classmethod
    def of(cls, k: torch.Tensor) -> Filter:
        p = filter_plan(k)
        return cls(p, response(k, p).to(k.device), _constants_on(p, k))


#: constants(plan, device), made once a plan and device: building the DFT matrices in float64
#: and copying them over took about a millisecond of every fft_conv call given a tensor filter.
_CONSTANTS: dict[tuple[Plan, torch.device], dict[str, torch.Tensor]] = {}


def _constants_on(p: Plan, k: torch.Tensor) -> dict[str, torch.Tensor]:
    """:func:`constants` of ``p`` on ``k``'s device, kept for later calls (the kernels only
    read them); made afresh for a tensor that is not a plain one (a fake tensor's are fake)."""
    if type(k) is not torch.Tensor:
        return constants(p, k.device)
    key = (p, k.device)
    c = _CONSTANTS.get(key)
    if c is None:
        c = _CONSTANTS[key] = constants(p, k.device)
    return c


def filter_plan(k: torch.Tensor) -> Plan:
    """The plan of a filter ``k`` [H, N] of real taps (what fft_conv takes of it)."""
    checks.rank("fft_conv", "k", k, "two dims [H, N]", hasattr(k, "dim") and k.dim() == 2)
    if k.is_complex():
        raise TkcUsageError(f"tkc.ops.fft_conv: k must be real (the filter's taps), got {k.dtype}")
    return plan(k.shape[-1])


def _run(name: str, *args: torch.Tensor, **consts: int) -> None:
    kernel = KERNELS[name]
    if args[0].is_cuda:  # (with TKC_INTERPRET=1 the kernel call interprets)
        kernel(*args, **consts)
    else:
        interpret(kernel, *args, **consts)


def _check(u: torch.Tensor, p: Plan, channels: int, BB: int) -> None:
    """What fft_conv takes of u, a filter of ``channels`` channels and plan ``p``, and ``BB``."""
    checks.dtype("fft_conv", torch.bfloat16, u=u)
    checks.rank("fft_conv", "u", u, "three dims [B, H, N]", u.dim() == 3)
    _, H, N = u.shape
    if N != p.N:
        raise TkcUsageError(f"tkc.ops.fft_conv: u has {N} values a row, the filter {p.N}: give them one length")
    if H != channels:
        raise TkcUsageError(f"tkc.ops.fft_conv: u has {H} channels, the filter {channels}")
    if isinstance(BB, bool) or not isinstance(BB, int) or BB < 1:
        raise TkcUsageError(f"tkc.ops.fft_conv: BB, the rows of a channel a program takes, is a positive int, "
                            f"got {BB!r}")


def launches(u: torch.Tensor, f: Filter, BB: int | None = None,
             scale_rows: bool = True) -> tuple[list[tuple[str, Callable[[], None]]], torch.Tensor]:
    """The launches of ``fft_conv(u, f)`` in order, as (name, call), and the output they
    write: each row's scale (``row_norms``, with ``scale_rows``), then the kernels.  ``BB``: the rows of
    a channel a program takes (None: the plan's)."""
    p, c = f.plan, f.consts
    BB = p.BB if BB is None else BB
    _check(u, p, f.kf.shape[0], BB)
    B, H, N = u.shape
    u = u.contiguous()
    y = torch.empty_like(u)
    BP = (BB + 1) // 2  # rows go in pairs, one complex row each: BB rounds up to an even count
    # The kernels take each row of a pair at unit scale (row_norms: a power of two near its
    # norm; 0, a row of zeros) and give its output back at its own; a scale of 1 leaves the rows
    # as they are.
    if scale_rows:
        norms = torch.empty(B, H, dtype=torch.float32, device=u.device)
        # 16 rows a program at 1k, else one (a plain sum of squares ran at 4.0-4.4 TB/s from 4k
        # on an H200, benchmarks/RESULTS.md)
        BM, BN = (16, 512) if N == 1024 else (1, min(N, 4096))
        first = [("row_norms", partial(_run, "row_norms", u.view(B * H, N), norms.view(B * H), BM=BM, BN=BN))]
    else:
        norms, first = torch.ones(B, H, dtype=torch.float32, device=u.device), []
    if not p.P:
        R = p.N1 // 2
        args = (u.view(B, H, R, p.M2), norms, f.kf, c["f1"], c["f2"], c["tw"], y.view(B, H, R, p.M2))
        return [*first, ("fftconv", partial(_run, "fftconv", *args, N1=p.N1, M2=p.M2, BP=BP))], y
    R, Q = N // p.Q, p.Q
    pairs = (B + 1) // 2
    z = torch.empty(pairs, H, 2, p.P, Q, dtype=torch.bfloat16, device=u.device)
    w = torch.empty_like(z)
    rows = (pairs, H, 2 * p.P, p.Q1, 64)
    return [*first,
            ("fft_cols", partial(_run, "fft_cols", u.view(B, H, R, Q), norms, c["fp"], c["tlc"], z,
                                 P=p.P, KP=p.KP, BP=BP)),
            ("fft_rows", partial(_run, "fft_rows", z.view(rows), f.kf, c["fq"], c["f2"], c["tq"], c["tl"],
                                 w.view(rows), P=p.P, Q1=p.Q1, BB=BB)),
            ("ifft_cols", partial(_run, "ifft_cols", w, norms, c["fp"], y.view(B, H, R, Q), P=p.P, KP=p.KP, BP=BP))], y


def fft_conv(u: torch.Tensor, k: torch.Tensor | Filter, BB: int | None = None, pairs: bool = True,
             scale_rows: bool = True) -> torch.Tensor:
    """y[b, h] = irfft(rfft(u[b, h], 2N) * rfft(k[h], 2N))[:N] for a bf16 u [B, H, N] and a
    filter k [H, N] (or its ``Filter``), bf16 out; ``BB`` rows of a channel a program (None:
    the plan's, 2 at 2k and 4k, else 8; rounded up to an even count: rows go in pairs; the row
    kernel of 8k-64k takes BB complex rows, each a pair).

    ``pairs``: rows go in pairs, each pair one complex row u[b] + i u[b + 1] (the filter is
    real, so its convolution is y[b] + i y[b + 1]): half the work.  ``scale_rows``: each row
    enters its pair at unit norm and leaves at its own size, so that the pair's bf16 roundings
    are at the scale of neither row alone; it costs a pass over u for the norms.  Without it a
    pair rounds at its larger row's scale: a row beside one 100 times larger is off by about
    20% of its own size, and a row of zeros beside a nonzero one gets noise; skip it only where
    the rows of each pair are of one size.  ``pairs=False`` gives every row a zero partner, at
    twice the work.

    Gradients: u's is the same convolution of dy read backwards (``flip(fft_conv(flip(dy),
    k))``: the kernels again, with the forward's filter response); k's (a tensor, not a
    ``Filter``) is the correlation of dy with u summed over the batch, through torch.fft in
    f32 (one transform of u and of dy, the product summed over the batch, one inverse a
    channel)."""
    if isinstance(u, torch.Tensor) and isinstance(k, torch.Tensor):
        checks.device("fft_conv", u=u, k=k)
    for name, flag in (("pairs", pairs), ("scale_rows", scale_rows)):
        if not isinstance(flag, bool):
            raise TkcUsageError(f"tkc.ops.fft_conv: {name} is True or False, got {flag!r}")
    if through_dispatcher():  # torch.compile, fake tensors: the operator, which traces
        if isinstance(k, Filter):
            raise TkcUsageError("tkc.ops.fft_conv under torch.compile takes the filter as a tensor [H, N], not a "
                                "Filter (its response is computed inside the traced operator)")
        return _fft_conv_op(u, k, BB, pairs, scale_rows)
    f = k if isinstance(k, Filter) else Filter.of(k.detach() if isinstance(k, torch.Tensor) else k)
    grads = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (u, k))
    if grads:
        return _FFTConv.apply(u, k if isinstance(k, torch.Tensor) else None, f, BB, pairs, scale_rows)
    return _convolve(u, f, BB, pairs, scale_rows)


def _convolve(u: torch.Tensor, f: Filter, BB: int | None, pairs: bool, scale_rows: bool) -> torch.Tensor:
    if not pairs and isinstance(u, torch.Tensor) and u.dim() == 3:
        alone = u.new_zeros((2 * u.shape[0], *u.shape[1:]))  # every row beside a zero one
        alone[0::2] = u
        return _convolve(alone, f, BB, True, False)[0::2].contiguous()
    calls, y = launches(u, f, BB, scale_rows)
    for _, call in calls:
        call()
    return y


class _FFTConv(torch.autograd.Function):
    """fft_conv with its gradients (see :func:`fft_conv`)."""

    @staticmethod
    def forward(ctx, u, k, f, BB, pairs, scale_rows):  # noqa: ANN001, ANN205 (autograd's signature)
        ctx.f, ctx.options = f, (BB, pairs, scale_rows)
        ctx.save_for_backward(u)
        return _convolve(u.detach(), f, BB, pairs, scale_rows)

    @staticmethod
    def backward(ctx, dy):  # noqa: ANN001, ANN205
        (u,) = ctx.saved_tensors
        du, dk = _gradients(ctx.needs_input_grad, u, dy, lambda g: _convolve(g, ctx.f, *ctx.options))
        return du, dk, None, None, None, None


def _gradients(needs: tuple, u: torch.Tensor, dy: torch.Tensor, convolve: Callable) -> tuple:
    """(du, dk) where ``needs`` asks: u's is ``convolve`` (the forward's convolution) of dy read
    backwards, read backwards again; k's :func:`_filter_gradient`."""
    du = convolve(dy.to(torch.bfloat16).flip(-1).contiguous()).flip(-1) if needs[0] else None
    return du, (_filter_gradient(u, dy) if needs[1] else None)


def _filter_gradient(u: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dk[h, j] = sum over b, t of dy[b, h, t] u[b, h, t - j]: the correlation of dy with u,
    summed over the batch in the frequency domain (f32; torch.fft)."""
    N = u.shape[-1]
    spectra = torch.fft.rfft(u.float(), 2 * N).conj() * torch.fft.rfft(dy.float(), 2 * N)
    return torch.fft.irfft(spectra.sum(0), 2 * N)[..., :N]


# The operator that torch.compile traces (the plain function above keeps a Filter's response
# between calls, which an operator cannot take): its fake implementation checks the arguments
# as a call does and makes the output; its gradients are the Function's, u's through the
# operator itself.
@torch.library.custom_op("tkc::fft_conv", mutates_args=())
def _fft_conv_op(u: torch.Tensor, k: torch.Tensor, BB: int | None = None, pairs: bool = True,
                 scale_rows: bool = True) -> torch.Tensor:
    return _convolve(u, Filter.of(k), BB, pairs, scale_rows)


@_fft_conv_op.register_fake
def _(u: torch.Tensor, k: torch.Tensor, BB: int | None = None, pairs: bool = True,
      scale_rows: bool = True) -> torch.Tensor:
    p = filter_plan(k)
    _check(u, p, k.shape[0], p.BB if BB is None else BB)
    return torch.empty_like(u, memory_format=torch.contiguous_format)


def _op_setup(ctx, inputs, output) -> None:  # noqa: ANN001
    u, k, *ctx.options = inputs
    ctx.save_for_backward(u, k)


def _op_backward(ctx, dy):  # noqa: ANN001, ANN202
    u, k = ctx.saved_tensors
    du, dk = _gradients(ctx.needs_input_grad, u, dy, lambda g: _fft_conv_op(g, k, *ctx.options))
    return du, dk, None, None, None


_fft_conv_op.register_autograd(_op_backward, setup_context=_op_setup)


def reference(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """torch.fft's causal convolution in the dtype of u (float64 for the tests)."""
    N = u.shape[-1]
    return torch.fft.irfft(torch.fft.rfft(u, 2 * N) * torch.fft.rfft(k.to(u.dtype), 2 * N), 2 * N)[..., :N]

