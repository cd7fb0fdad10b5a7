"""The peers a user picking a fast Hopper kernel would try, as contenders for the harness.

Owns: building each peer's forward attention and GEMM on given tensors, with everything that
is not the kernel's own work (imports, JIT compilation, layout copies, the first call) done
before the callable is handed out.  ``attention`` and ``gemm`` answer a dict from the peer's
column name to either a zero-argument callable that runs the peer once and returns its result
(attention in tkc's [B, H, N, D] layout, a view where the peer writes [B, N, H, D]; GEMM as
[M, N]) or a string saying why the peer cannot run here (its import error, a head dimension
it does not take, its compiler's error).  Never times anything and never raises: a peer
missing from the machine is a reason string, so importing this module needs none of them.

The peers and what is taken from each:
- FlashAttention-4 (pip ``flash-attn-4``, CuTe DSL): ``flash_attn.cute.flash_attn_func``,
  which on compute capability 9.x runs its SM90 forward (``flash_fwd_sm90``) with the tile
  sizes its own heuristic picks.  It reads [B, N, H, D]: contiguous copies are made once.
- TileLang (pip ``tilelang``): the wheel ships the compiler, not the examples, so the peer is
  TileLang's own published examples, fetched into ``$TKC_PEERS_DIR/tilelang_examples``
  (``examples/flash_attention/example_mha_fwd_bhsd.py`` with the one configuration its
  autotuner lists, block 128 x 128, 2 stages, 256 threads; ``examples/gemm/
  example_gemm_autotune.py`` with its sm_90 heuristic configuration, 128 x 256 x 64, 3
  stages, 256 threads, rasterized).  The attention example hard-codes fp16 and the scale
  1/sqrt(D): it is loaded with its one ``dtype = T.float16`` line read as bf16, and other
  scales are refused.  The GEMM example takes B as [N, K]: B is transposed once, outside.
- cuTile (pip ``cuda-tile``): NVIDIA's samples ``samples/AttentionFMHA.py`` (``cutile_fmha``,
  its default 128 x 128 tiles) and ``samples/MatMul.py`` (``cutile_matmul``, 128 x 256 x 64 for
  16-bit types), fetched into ``$TKC_PEERS_DIR/cutile_samples``.  Tile IR targets sm_90 from
  CUDA 13.3's ``tileiras`` on (pip ``nvidia-cuda-tileiras``, with ``ptxas`` and ``libnvvm`` of
  the same release); with an older one its compile error is the reason.

``$TKC_PEERS_DIR`` defaults to ``.peers`` at the repository root; a folder of installed
wheels, ``$TKC_PEERS_SITE`` (default ``.peers_site`` there), is added as a site directory when
it exists (its ``.pth`` files put the CUTLASS DSL's packages on the path).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import os
import site
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
PEERS = ("FlashAttention-4", "TileLang", "cuTile")
REASON_CHARS = 300

Peer = Callable[[], Any] | str


def peers_dir() -> Path:
    return Path(os.environ.get("TKC_PEERS_DIR", ROOT / ".peers"))


def _prepare() -> None:
    """The folder of installed peer wheels as a site directory (its .pth files run)."""
    path = Path(os.environ.get("TKC_PEERS_SITE", ROOT / ".peers_site"))
    if path.is_dir():
        site.addsitedir(str(path))


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split()) or repr(e)
    text = f"{type(e).__name__}: {text}"
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def _ready(build: Callable[..., Callable[[], Any]], *args: Any) -> Peer:
    """``build(*args)``'s callable after one call (the JIT compile), or why it failed."""
    try:
        run = build(*args)
        with contextlib.redirect_stdout(io.StringIO()):  # the peers' progress prints
            run()
        torch.cuda.synchronize()
        return run
    except Exception as e:  # noqa: BLE001 - whatever stops a peer is its reason
        return _reason(e)


_modules: dict[Path, Any] = {}


def _load(path: Path, replace: tuple[str, str] | None = None, extra_path: Path | None = None) -> Any:
    """The peer's source file as a module, loaded once; ``replace`` swaps one exact line-part
    (the copy is written to a temporary folder, so that tools reading the source see it)."""
    key = path if replace is None else path.with_suffix(f".{replace[1]}.py")
    if key in _modules:
        return _modules[key]
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (fetch the peer's examples there)")
    source = path
    if replace is not None:
        text = path.read_text()
        if text.count(replace[0]) != 1:
            raise RuntimeError(f"{path.name}: expected one '{replace[0]}' to read as '{replace[1]}'")
        source = Path(tempfile.mkdtemp(prefix="tkc-peer-")) / path.name
        source.write_text(text.replace(replace[0], replace[1]))
    name = f"_tkc_peer_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, source)
    module = importlib.util.module_from_spec(spec)
    # A sample's own helper package (cuTile's ``utils``) is found in ``extra_path``, not as
    # whatever module of that name is loaded already.
    saved = {}
    if extra_path is not None:
        sys.path.insert(0, str(extra_path))
        helpers = {p.name for p in extra_path.iterdir() if p.is_dir()}
        saved = {m: sys.modules.pop(m) for m in list(sys.modules) if m.split(".")[0] in helpers}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            spec.loader.exec_module(module)
    finally:
        if extra_path is not None:
            sys.path.remove(str(extra_path))
            sys.modules.update(saved)
    _modules[key] = module
    return module


# ------------------------------------------------------------------------------ attention

def _fa4_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float):
    from flash_attn.cute import flash_attn_func

    qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # FlashAttention's [B, N, H, D]

    def run():
        out = flash_attn_func(qs, ks, vs, softmax_scale=scale, causal=causal)
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
    return run


def _tilelang_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float):
    B, H, N, D = q.shape
    if not math.isclose(scale, 1 / math.sqrt(D), rel_tol=1e-6):
        raise ValueError(f"TileLang's example fixes the scale to 1/sqrt(D); asked for {scale:g}")
    if q.dtype != torch.bfloat16:
        raise ValueError(f"read as bf16; got {q.dtype}")
    import tilelang  # noqa: F401 - its import error is the reason

    example = _load(peers_dir() / "tilelang_examples" / "example_mha_fwd_bhsd.py",
                    ("dtype = T.float16", "dtype = T.bfloat16"))
    # The configuration its autotuner lists for this example (and its regression run uses).
    kernel = example.flashattn(B, H, N, N, D, causal, block_M=128, block_N=128, num_stages=2, threads=256)
    return lambda: kernel(q, k, v)


def _cutile_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float):
    import cuda.tile  # noqa: F401 - its import error is the reason

    folder = peers_dir() / "cutile_samples"
    sample = _load(folder / "AttentionFMHA.py", extra_path=folder)
    return lambda: sample.cutile_fmha(q, k, v, qk_scale=scale, causal=causal)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> dict[str, Peer]:
    """Each peer's forward attention of bf16 [B, H, N, D] ``q``, ``k``, ``v``: a callable
    returning the [B, H, N, D] output, or why it cannot run."""
    _prepare()
    builds = {"FlashAttention-4": _fa4_attention, "TileLang": _tilelang_attention,
              "cuTile": _cutile_attention}
    return {name: _ready(build, q, k, v, causal, scale) for name, build in builds.items()}


# ----------------------------------------------------------------------------------- GEMM

def _tilelang_gemm(a: torch.Tensor, b: torch.Tensor):
    import tilelang.language as T

    example = _load(peers_dir() / "tilelang_examples" / "example_gemm_autotune.py")
    M, K = a.shape
    N = b.shape[1]
    with contextlib.redirect_stdout(io.StringIO()):  # it prints the capability it read
        config = example.get_heuristic_config()
    kernel = example.matmul(M, N, K, **config, dtype=T.bfloat16)
    bt = b.t().contiguous()  # the example computes A @ B^T from B as [N, K]
    return lambda: kernel(a, bt)


def _cutile_gemm(a: torch.Tensor, b: torch.Tensor):
    import cuda.tile  # noqa: F401 - its import error is the reason

    folder = peers_dir() / "cutile_samples"
    sample = _load(folder / "MatMul.py", extra_path=folder)
    return lambda: sample.cutile_matmul(a, b)


def gemm(a: torch.Tensor, b: torch.Tensor) -> dict[str, Peer]:
    """Each peer's bf16 ``a @ b`` for row-major [M, K] ``a`` and [K, N] ``b``: a callable
    returning C [M, N], or why it cannot run.  FlashAttention-4 has no GEMM: no entry."""
    _prepare()
    return {"TileLang": _ready(_tilelang_gemm, a, b), "cuTile": _ready(_cutile_gemm, a, b)}
