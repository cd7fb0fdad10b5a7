"""Inputs that once broke the examples, shared by the CPU tests (tests/examples/test_hard_rows.py)
and the GPU tests (tests/gpu/test_examples_gpu.py): rows with blocks of -inf columns (masked),
constant rows (zero variance), and huge or tiny magnitudes, each within what f32 computes in
torch's reference (LayerNorm's squares overflow f32 past about 1e19, in torch as in tkc).

Every builder takes a torch.Generator and makes its tensors on the generator's device, in
float32; the caller casts.  ``check`` compares against torch with NaN where torch has NaN
(a row of -inf has no softmax) and nowhere else.
"""

from __future__ import annotations

import torch

INF = float("inf")
BF16_NEAR_MAX = 3.3e38  # bf16's largest finite value is 3.39e38


def randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, device=g.device)


def softmax_rows(g: torch.Generator, N: int, BN: int) -> torch.Tensor:
    """Rows of ``N`` columns for a softmax over ``BN``-column blocks: the first block all -inf,
    every even block -inf (a split program's every block, for clusters of two), everything
    -inf but the last column or but the last block, a row of -inf (NaN, as torch gives),
    random -inf columns, magnitudes 1e30 and 1e-30, constant rows at 0, near bf16's max and
    its negative, and near-max values of both signs."""
    cols = torch.arange(N, device=g.device)
    rows = [randn(g, N) * 4 for _ in range(12)]
    rows[0][:BN] = -INF
    rows[1][(cols // BN) % 2 == 0] = -INF
    rows[2][:-1] = -INF
    rows[3][:(N - 1) // BN * BN] = -INF
    rows[4][:] = -INF
    rows[5][torch.rand(N, generator=g, device=g.device) < 0.5] = -INF
    rows[6] *= 1e30
    rows[7] *= 1e-30
    rows[8][:] = 0.0
    rows[9][:] = BF16_NEAR_MAX
    rows[10][:] = -BF16_NEAR_MAX
    rows[11] = torch.where(rows[11] > 0, BF16_NEAR_MAX, -BF16_NEAR_MAX)
    return torch.stack(rows)


def constant_rows(g: torch.Generator, count: int, N: int) -> torch.Tensor:
    """``count`` constant rows of magnitudes 1 to 10^4, either sign: E[x^2] - mean^2 came out
    below -eps in f32 for about one in eight at 3001 columns and one in twenty at 5000
    (NaN through rsqrt), in pairwise and per-thread-then-tree summation orders alike."""
    c = (10.0 ** (4 * torch.rand(count, 1, generator=g, device=g.device))) * torch.randn(
        count, 1, generator=g, device=g.device).sign()
    return c.expand(count, N).clone()


def norm_rows(g: torch.Generator, N: int) -> torch.Tensor:
    """Rows for LayerNorm and RMSNorm: 40 constant rows, zeros, a row of 1000 plus small
    deviations, one outlier in a row of zeros, magnitudes 1e15, 1e-15 and 1e-30, and a row
    whose first 16 columns are 1e4 and the rest small (the sums' shift far from the mean)."""
    extra = [randn(g, N) for _ in range(8)]
    extra[7][:16] = 1e4
    extra[0][:] = 0.0
    extra[1] = 1000.0 + 8.0 * extra[1]
    extra[2][:] = 0.0
    extra[2][N // 2] = 1e4
    extra[3] *= 1e15
    extra[4] *= 1e-15
    extra[5] *= 1e-30
    extra[6] = 1e15 + 0.0 * extra[6]
    return torch.cat([constant_rows(g, 40, N), torch.stack(extra)])


def attention_heads(g: torch.Generator, N: int, D: int) -> tuple[torch.Tensor, ...]:
    """q, k, v of shape [1, 4, N, D] and each head's scale of v: head 0 with scores in the
    thousands (one key takes all), head 1 with q at 1e-30 (every visible key alike), head 2
    with v at 1e30, head 3 with constant q and k of 100 (equal scores at 1e5 / sqrt(D))."""
    q, k, v = (randn(g, 1, 4, N, D) for _ in range(3))
    q[:, 0] *= 30
    k[:, 0] *= 30
    q[:, 1] *= 1e-30
    v[:, 2] *= 1e30
    q[:, 3] = 100.0
    k[:, 3] = 100.0
    return q, k, v, torch.tensor([1.0, 1.0, 1e30, 1.0], device=g.device)[None, :, None, None]


def gemm_operands(g: torch.Generator, M: int, N: int, K: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """a [M, K], b [K, N] at 1e-20 and each row's scale of a @ b: rows of a at 1e15 and
    1e-15 (products of 1e-35, still normal in f32), a row near bf16's max, a constant row."""
    a, b = randn(g, M, K), randn(g, K, N) * 1e-20
    scale = torch.full((M, 1), 1e-20, device=g.device)
    for row, s in ((0, 1e15), (1, 1e-15), (2, BF16_NEAR_MAX)):
        a[row] = a[row] * s if row < 2 else torch.where(a[row] > 0, s, -s)
        scale[row] *= s
    a[3] = 7.0
    return a, b, scale


def check(what: str, out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> None:
    """``out`` within ``atol + rtol * |ref|`` of ``ref``, NaN exactly where ``ref`` is NaN and
    infinities where it has them."""
    got, want = out.float().cpu(), ref.float().cpu()
    nan = torch.isnan(got) != torch.isnan(want)
    if nan.any():
        first = tuple(nan.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(nan.sum())} outputs NaN where torch has none or the reverse, the "
                             f"first at {first}: got {got[first].item()}, torch {want[first].item()}")
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"{what}: {m}")
