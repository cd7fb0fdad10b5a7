"""torch references of ThunderKittens' kernel set (rope.tk, layernorm_residual.tk, linear_attn.tk,
based.tk, mamba2_ssd.tk), shared by tests/examples/test_tk_kernels.py, test_linear_attn.py,
test_mamba2_ssd.py, benchmarks/tk_kernels.py and benchmarks/linear_attn.py (where they are the torch
eager peer).  Each computes in the dtype of its inputs: pass float32 for a reference."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [B, N, H, D] rotated by the angles of cos/sin [N, D/2]."""
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], -1).flatten(-2)
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def rope_tables(N: int, D: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [N, D/2] of Llama's angles n * 10000^(-2i/D), in bf16."""
    theta = 10000.0 ** (-torch.arange(0, D, 2, device=device).float() / D)
    angles = torch.arange(N, device=device).float()[:, None] * theta[None, :]
    return angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)


def dropout_mask(seed: int, M: int, N: int, p: float) -> torch.Tensor:
    """Which elements of the first M rows of an N-column tensor layernorm_residual.tk's dropout
    keeps: Philox's uniform of each element's flat index (the numbers tests/ir/test_philox.py
    checks)."""
    from tkc.ir.dialects.philox import uniform

    return torch.from_numpy(uniform(seed, np.arange(M * N, dtype=np.int64).reshape(M, N)) >= np.float32(p))


def dropped(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """x in f32 where ``keep``, scaled by 1/(1-p) (rounded to f32, as the kernels scale), else 0."""
    scale = float(np.float32(1.0) / (np.float32(1.0) - np.float32(p)))
    return torch.where(keep.to(x.device), x.float() * scale, 0.0)


def layernorm_residual(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, eps: float,
                       rms: bool, keep: torch.Tensor | None = None, p: float = 0.0) -> tuple[torch.Tensor, ...]:
    """h = x + res in the inputs' dtype (with ``keep``: dropped(x) + res rounded to x's dtype);
    y = LayerNorm(h) (RMSNorm: h * rstd * w) in f32; and the rows' mean (0 for RMSNorm) and
    rstd: (h, y, mean, rstd)."""
    h = x + res if keep is None else (dropped(x, keep, p) + res.float()).to(x.dtype)
    hf = h.float()
    mean = torch.zeros(hf.shape[0], device=hf.device) if rms else hf.mean(-1)
    rstd = torch.rsqrt((hf - mean[:, None]).pow(2).mean(-1) + eps)
    y = (hf - mean[:, None]) * rstd[:, None] * w.float()
    return h, (y if rms else y + bias.float()), mean, rstd


def layernorm_residual_bwd(dy: torch.Tensor, dh: torch.Tensor, h: torch.Tensor, w: torch.Tensor,
                           bias: torch.Tensor, eps: float, rms: bool) -> tuple[torch.Tensor, ...]:
    """(dres, dw, dbias) of layernorm_residual by autograd in float64, dh added to dres (the
    gradient of x too, without dropout; with it, ``dropped(dres, keep, p)``)."""
    hd = h.double().requires_grad_()
    wd, bd = w.double().requires_grad_(), bias.double().requires_grad_()
    if rms:
        y = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + eps) * wd
    else:
        y = torch.nn.functional.layer_norm(hd, hd.shape[-1:], wd, bd, eps)
    y.backward(dy.double())
    db = torch.zeros_like(bd) if rms else bd.grad
    return hd.grad + dh.double(), wd.grad, db


def decay_mask(slope: torch.Tensor, N: int) -> torch.Tensor:
    """[H, N, N]: gamma^(t - s) where s <= t, else 0, with gamma = exp(-|slope|) for each head."""
    t = torch.arange(N, device=slope.device, dtype=torch.float32)
    diff = t[:, None] - t[None, :]
    return torch.where(diff >= 0, torch.exp(-slope.abs().float()[:, None, None] * diff.clamp(min=0)), 0.0)


def linear_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
    """Decayed causal linear attention of q, k [B, H, N, DK] and v [B, H, N, DV], quadratic form:
    o_t = sum_{s <= t} gamma^(t - s) (q_t . k_s) v_s."""
    return ((q @ k.transpose(-1, -2)) * decay_mask(slope, q.shape[2]).to(q.dtype)) @ v


def based(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Based (unnormalized, causal) of q, k [B, H, N, 16] and v [B, H, N, DV], quadratic form:
    the scores 1 + x + x^2 / 2 of x = q . k / sqrt(16), masked."""
    x = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    N = q.shape[2]
    causal = torch.ones(N, N, dtype=torch.bool, device=q.device).tril()
    return torch.where(causal, 1 + x + 0.5 * x * x, 0.0) @ v


def _chunks(N: int, C: int, *ts: torch.Tensor) -> list[torch.Tensor]:
    """Each of ``ts`` [B, H, N, D], zero-padded to chunks: [B, H, N / C, C, D]."""
    pad = -N % C
    return [F.pad(t, (0, 0, 0, pad)).unflatten(2, (-1, C)) for t in ts]


def linear_attn_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slope: torch.Tensor,
                        C: int = 64) -> torch.Tensor:
    """:func:`linear_attn` in the chunked form, in memory linear in N (the torch peer at long N):
    the decay-masked product inside each chunk of C rows, the running state across them."""
    B, H, N, _ = q.shape
    qc, kc, vc = _chunks(N, C, q, k, v)
    lg = -slope.abs().float()[:, None]                               # [H, 1]: log gamma
    t = torch.arange(C, device=q.device, dtype=torch.float32)[None]  # [1, C]
    q_decay, k_decay = torch.exp(lg * (t + 1)), torch.exp(lg * (C - 1 - t))
    intra = ((qc @ kc.transpose(-1, -2)) * decay_mask(slope, C)[:, None].to(q.dtype)) @ vc
    kv = (kc * k_decay[:, None, :, None].to(q.dtype)).transpose(-1, -2) @ vc    # each chunk's state
    n = kv.shape[2]
    chunk_decay = torch.exp(lg * C)[:, :, None, None]                # [H, 1, 1, 1]
    states, s = [], torch.zeros_like(kv[:, :, 0], dtype=torch.float32)
    for j in range(n):  # the state before each chunk
        states.append(s)
        s = s * chunk_decay[:, 0] + kv[:, :, j].float()
    inter = (qc * q_decay[:, None, :, None].to(q.dtype)) @ torch.stack(states, 2).to(q.dtype)
    return (intra + inter).flatten(2, 3)[:, :, :N]


def based_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, C: int = 64) -> torch.Tensor:
    """:func:`based` in the chunked form, in memory linear in N: the masked Taylor scores inside
    each chunk, the states of order 0, 1 and 2 (the 256 products k_i k_j) across them."""
    B, H, N, D = q.shape
    qc, kc, vc = _chunks(N, C, q, k, v)
    scale = D ** -0.5
    x = (qc @ kc.transpose(-1, -2)) * scale
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    intra = torch.where(causal, 1 + x + 0.5 * x * x, 0.0) @ vc

    def phi(t: torch.Tensor) -> torch.Tensor:  # [.., C, D] -> [.., C, 1 + D + D * D]
        t2 = (t[..., :, None] * t[..., None, :]).flatten(-2)
        return torch.cat([torch.ones_like(t[..., :1]), t, t2], -1)

    kv = phi(kc).transpose(-1, -2) @ vc                              # each chunk's states
    before = torch.cumsum(kv, 2) - kv                                # the states before each chunk
    weights = torch.cat([torch.ones(1), torch.full((D,), scale), torch.full((D * D,), 0.5 * scale * scale)])
    inter = (phi(qc) * weights.to(q.device, q.dtype)) @ before
    return (intra + inter).flatten(2, 3)[:, :, :N]


def _segsum(x: torch.Tensor) -> torch.Tensor:
    """[..., L] -> [..., L, L]: sum_{s < u <= t} x_u where s <= t, else -inf (Mamba-2's segsum,
    summed along the masked axis rather than as a difference of cumsums, for accuracy)."""
    L = x.shape[-1]
    xs = x[..., None].expand(*x.shape, L)
    below = torch.ones(L, L, dtype=torch.bool, device=x.device).tril(-1)
    xs = torch.cumsum(xs.masked_fill(~below, 0), dim=-2)
    return xs.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=x.device).tril(), -torch.inf)


def ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
        h0: torch.Tensor | None = None, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba-2's SSD forward, the paper's ``ssd_minimal_discrete`` (chunked, every einsum as
    there) in the dtype of ``dt``: x [b, T, H, P], dt [b, T, H] (softplus'd), A [H] (< 0), B, C
    [b, T, G, N] shared by the H / G heads of a group, h0 [b, H, P, N]; (y [b, T, H, P], the final
    state [b, H, P, N]).  T is padded to chunks with dt = 0: no decay and nothing added."""
    f = dt.dtype
    _, T, H, _ = x.shape
    G = B.shape[2]
    pad = -T % chunk
    X = F.pad(x.to(f) * dt[..., None], (0, 0, 0, 0, 0, pad)).unflatten(1, (-1, chunk))  # [b, c, l, h, p]
    Bc, Cc = (F.pad(t.to(f), (0, 0, 0, 0, 0, pad)).repeat_interleave(H // G, 2).unflatten(1, (-1, chunk))
              for t in (B, C))
    Adt = F.pad(dt * A.to(f), (0, 0, 0, pad)).unflatten(1, (-1, chunk)).permute(0, 3, 1, 2)  # [b, h, c, l]
    A_cumsum = torch.cumsum(Adt, -1)
    L = torch.exp(_segsum(Adt))
    Y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Cc, Bc, L, X)
    decay_states = torch.exp(A_cumsum[..., -1:] - A_cumsum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bc, decay_states, X)
    init = torch.zeros_like(states[:, :1]) if h0 is None else h0.to(f)[:, None]
    states = torch.cat([init, states], 1)
    decay_chunk = torch.exp(_segsum(F.pad(A_cumsum[..., -1], (1, 0))))
    new_states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
    states, final = new_states[:, :-1], new_states[:, -1]
    Y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", Cc, states, torch.exp(A_cumsum))
    return (Y_diag + Y_off).flatten(1, 2)[:, :T], final


def ssd_recurrent(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                  h0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ssd` step by step: state_t = exp(dt_t A) state_(t-1) + dt_t x_t^T B_t, y_t =
    state_t C_t^T (the definition the chunked form must equal)."""
    b, T, H, P = x.shape
    r = H // B.shape[2]
    state = torch.zeros(b, H, P, B.shape[-1], dtype=dt.dtype) if h0 is None else h0.to(dt.dtype)
    ys = []
    for t in range(T):
        Bt, Ct = (m[:, t].to(dt.dtype).repeat_interleave(r, 1) for m in (B, C))   # [b, H, N]
        d = dt[:, t]
        xd = d[..., None] * x[:, t].to(dt.dtype)                                  # [b, H, P]
        state = torch.exp(d * A)[..., None, None] * state + xd[..., None] * Bt[:, :, None]
        ys.append((state * Ct[:, :, None]).sum(-1))
    return torch.stack(ys, 1), state
