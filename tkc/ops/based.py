"""``based``: Based linear attention (Taylor feature map, 16 features) through examples/based.tk
(tkc/ops/kernels links it).

    o = tkc.ops.based(q, k, v)   # q, k bf16 [B, H, N, 16], v bf16 [B, H, N, 64]: causal, unnormalized

A program walks one head's chunks in turn, so few heads of a long sequence leave SMs idle: the
sequence then goes in segments (``segments``), a program each, ``based_states`` writing what
each segment adds to the running states and ``based_split`` starting each segment from the sum
of those before it.  CUDA tensors run on the GPU, CPU ones (and everything with
TKC_INTERPRET=1) in the interpreter.  A plain function launching its kernels, forward only;
under ``torch.compile`` it calls the operator ``torch.ops.tkc.based``, which traces.
"""

from __future__ import annotations

import torch

from tkc.errors import TkcUsageError
from tkc.kernel import interpret, load
from tkc.ops import checks
from tkc.ops.kernel_op import through_dispatcher
from tkc.ops.kernels import path

__all__ = ["based", "segments_for"]

KERNELS = {name: load(path("based.tk"), name) for name in ("based", "based_states", "based_split")}
C = 64  # rows a chunk (the kernels' default)
#: Programs of ``based_split`` an SM holds (ptxas: 252 registers, 128 threads).
PROGRAMS_AN_SM = 2
#: The shortest segment: each segment adds the states of those before it (40 KB each) once.
MIN_SEGMENT = 1024
#: The most segments a head: segment p reads the p states before it, so the reads grow as the
#: square of the count (32: 496 reads of 40 KB a head).
MAX_SEGMENTS = 32


def segments_for(B: int, H: int, N: int, sms: int) -> int:
    """How many segments a head's N rows go in on a GPU of ``sms`` SMs: as many as fill the
    SMs' program slots that B * H heads leave empty, each at least MIN_SEGMENT rows, at most
    MAX_SEGMENTS."""
    return max(1, min((PROGRAMS_AN_SM * sms) // max(B * H, 1), N // MIN_SEGMENT, MAX_SEGMENTS))


def _run(name: str, *args: torch.Tensor, **consts: int) -> None:
    if args[0].is_cuda:  # (with TKC_INTERPRET=1 the kernel call interprets)
        KERNELS[name](*args, **consts)
    else:
        interpret(KERNELS[name], *args, **consts)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """What based takes of q, k and v (dtypes, devices, shapes)."""
    checks.dtype("based", torch.bfloat16, q=q, k=k, v=v)
    checks.device("based", q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.rank("based", name, t, "four dims [B, H, N, D]", t.dim() == 4)
    if q.shape != k.shape or q.shape[-1] != 16:
        raise TkcUsageError(f"tkc.ops.based: q and k must be [B, H, N, 16] alike, got {tuple(q.shape)} and "
                            f"{tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3] or v.shape[-1] != 64:
        raise TkcUsageError(f"tkc.ops.based: v must be [B, H, N, 64] beside q's {tuple(q.shape)}, got {tuple(v.shape)}")


def based(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: int | None = None) -> torch.Tensor:
    """o[b, h, t] = sum_{s <= t} (1 + x + x^2 / 2) v[b, h, s] with x = q[b, h, t] . k[b, h, s] / 4,
    bf16 out.  ``segments``: how many parts each head's rows go in (1: one program a head;
    None: :func:`segments_for` the GPU, 1 on a CPU).  Under ``torch.compile`` (and fake
    tensors) the operator ``torch.ops.tkc.based``, which traces."""
    _check(q, k, v)
    checks.no_gradient("based", q, k, v)
    if segments is not None and (isinstance(segments, bool) or not isinstance(segments, int) or segments < 1):
        raise TkcUsageError(f"tkc.ops.based: segments is a positive int, got {segments!r}")
    if through_dispatcher():
        return _based_op(q, k, v, segments)
    return _based(q, k, v, segments)


def _based(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: int | None) -> torch.Tensor:
    B, H, N, _ = q.shape
    if segments is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 0
        segments = segments_for(B, H, N, sms) if sms else 1
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(v)
    # Whole chunks a segment; the kernels make the same seg from N and P.
    seg = -(-N // (segments * C)) * C if N else C
    P = max(-(-N // seg) - 1, 0)  # segments before the last
    if P == 0:
        _run("based", q, k, v, o)
        return o
    s0 = torch.empty(B, H, P, 64, dtype=torch.float32, device=q.device)
    st = torch.empty(B, H, P, 64, 160, dtype=torch.float32, device=q.device)
    _run("based_states", k, v, s0, st)
    _run("based_split", q, k, v, o, s0, st)
    return o


# The operator torch.compile traces: the same kernels, a fake implementation from the same
# checks; no gradient (a traced call whose inputs need one is refused before tracing it).
@torch.library.custom_op("tkc::based", mutates_args=())
def _based_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: int | None = None) -> torch.Tensor:
    return _based(q, k, v, segments)


@_based_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: int | None = None) -> torch.Tensor:
    _check(q, k, v)
    return torch.empty_like(v, memory_format=torch.contiguous_format)
