"""tkc.ops.rms_norm, layer_norm and softmax in training, as a user calls them: the backward
alone (``torch.autograd.grad`` of each operator's output) and forward + backward, beside torch
eager (``F.rms_norm``, ``F.layer_norm``, ``torch.softmax``), ``torch.compile`` of the same,
liger-kernel's autograd functions where liger-kernel imports, and a copy; in the backward
rows, tkc's kernels alone too (launched on tensors made once: the GPU's share, without the
host work of autograd and of the operator).

    python benchmarks/rows_backward.py                  # every group, four shapes
    python benchmarks/rows_backward.py --quick          # 16384 x 4096 only
    python benchmarks/rows_backward.py --only tiles     # the backward kernels alone by ROWS and warps
                                                        # (rows in one block)

Every contender's gradients are checked against torch's in fp32 before it is timed; the
contenders are timed in turns (``harness.in_turns``: L2 cleared before each call, median
round).  GB/s count what the pass must move: the backward reads dy and x (softmax: y) and
writes dx, 3 M N 2 bytes (the weight's gradient, N values, left out); forward + backward
5 M N 2 bytes; the copy reads and writes M N 2 bytes each.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import Row, host_time, in_turns, run_groups  # noqa: E402

import tkc.ops  # noqa: E402
from tkc.compiler import compile_kernel  # noqa: E402
from tkc.ops.kernels import path  # noqa: E402
from tkc.ops.rows import ONE_BLOCK, backward_tiles, one_block_tiles, softmax_block, wgrad_split  # noqa: E402
from tkc.runtime.launch import launch  # noqa: E402

EPS = 1e-5
SHAPES = [(16384, 4096), (8192, 8192), (32768, 2048), (4096, 4096), (4096, 12288)]


def liger(op: str, n: int) -> Callable | None:
    """liger-kernel's autograd function for ``op`` as a function of (x, w, b), where it imports.
    Its RMSNorm runs out of place: in place, it writes dx over the incoming gradient, which
    every contender here shares."""
    try:
        if op == "rms_norm":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction as f
            return lambda x, w, b: f.apply(x, w, EPS, 0.0, "llama", False)
        if op == "layer_norm":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction as f
            return lambda x, w, b: f.apply(x, w, b, EPS)
        from liger_kernel.ops.softmax import LigerSoftmaxFunction as f
        return lambda x, w, b: f.apply(x)
    except Exception:  # not installed, or its Triton does not load here
        return None


def functions(op: str, n: int) -> dict[str, Callable]:
    """Each contender as a function of (x, w, b)."""
    torch_fn = {"rms_norm": lambda x, w, b: F.rms_norm(x, (n,), w, EPS),
                "layer_norm": lambda x, w, b: F.layer_norm(x, (n,), w, b, EPS),
                "softmax": lambda x, w, b: torch.softmax(x, -1)}[op]
    tkc_fn = {"rms_norm": lambda x, w, b: tkc.ops.rms_norm(x, w, EPS),
              "layer_norm": lambda x, w, b: tkc.ops.layer_norm(x, w, b, EPS),
              "softmax": lambda x, w, b: tkc.ops.softmax(x)}[op]
    out = {"tkc": tkc_fn, "torch": torch_fn, "torch.compile": torch.compile(torch_fn)}
    lg = liger(op, n)
    if lg is not None:
        out["liger-kernel"] = lg
    return out


def training_rows(shapes: list[tuple[int, int]], runs: int, direction: str) -> list[Row]:
    import torch._functorch.config as functorch_config

    # The backward graphs run again at every timed call (retain_graph=True), which a compiled
    # backward that donates its saved buffers refuses.
    functorch_config.donated_buffer = False
    rows = []
    for M, N in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(M, N, device="cuda", generator=g) + 1.0).to(torch.bfloat16)
        dy = torch.randn(M, N, device="cuda", generator=g).to(torch.bfloat16)
        w, b = (torch.randn(N, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
        src, dst = torch.randn(M, N, device="cuda").to(torch.bfloat16), torch.empty(M, N, device="cuda",
                                                                                      dtype=torch.bfloat16)
        for op in ("rms_norm", "layer_norm", "softmax"):
            row = Row(f"rows {direction}", f"{op} {direction}, {M}x{N} bf16", "GB/s")
            fns = functions(op, N)
            used = {"rms_norm": 2, "layer_norm": 3, "softmax": 1}[op]
            f32 = [t.float().requires_grad_() for t in (x, w, b)]
            want = torch.autograd.grad(fns["torch"](*f32), f32[:used], dy.float())
            contenders = {}
            for name, fn in fns.items():
                leaves = [t.clone().requires_grad_() for t in (x, w, b)]
                ins = leaves[:used]
                if direction == "backward":
                    y = fn(*leaves)

                    def call(y=y, ins=ins) -> tuple:
                        return torch.autograd.grad(y, ins, dy, retain_graph=True)
                else:
                    def call(fn=fn, leaves=leaves, ins=ins) -> tuple:
                        return torch.autograd.grad(fn(*leaves), ins, dy)
                got = call()
                bad = [i for i, (a, e) in enumerate(zip(got, want))
                       if not ((a.float() - e).abs().max() <= 3e-2 * e.abs().max() + 1e-3)]
                if bad:
                    row.notes += f"{name}: gradient {bad} differs from torch's fp32; "
                    continue
                contenders[name] = call
            if direction == "backward" and not row.notes:
                contenders["tkc kernels alone"] = kernels_alone(op, dy, x, w)
            contenders["copy"] = lambda: dst.copy_(src)
            t = in_turns(contenders, runs)
            moved = (3 if direction == "backward" else 5) * M * N * 2
            row.values = {n: (2 * M * N * 2 if n == "copy" else moved) / s / 1e9 for n, s in t.items()}
            if direction == "backward":  # where the time goes when the rows are few
                row.notes += "host us a call: " + ", ".join(f"{n} {host_time(contenders[n], 100) * 1e6:.0f}"
                                                            for n in ("tkc", "torch") if n in contenders)
            rows.append(row)
            print(f"  {row.problem}: " + ", ".join(f"{n} {v:.0f}" for n, v in row.values.items()) + f" {row.notes}",
                  flush=True)
    return rows


def kernels_alone(op: str, dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Callable[[], None]:
    """The backward kernels tkc.ops runs for ``op``, launched on tensors made once: the GPU's
    share of the operator's backward, without autograd's or the operator's host work."""
    M, N = x.shape
    kernel = {"rms_norm": "rmsnorm_bwd", "layer_norm": "layernorm_bwd", "softmax": "softmax_bwd"}[op]
    if op == "softmax":
        k = compile_kernel(path("rows_bwd.tk"), {"BN": softmax_block(N)}, kernel=kernel)
        y, dx = torch.softmax(x.float(), -1).to(x.dtype), torch.empty_like(x)
        return lambda: launch(k, [dy, y, dx])
    tiles = backward_tiles(M, N)
    consts = dict(tiles)
    if op == "layer_norm" and one_block_tiles(M, N) is not None:  # as tkc.ops: rows of exactly one block
        kernel, consts = "layernorm_bwd_block", one_block_tiles(M, N)
    k = compile_kernel(path("rows_bwd.tk"), consts, kernel=kernel)
    dx, dw, db = torch.empty_like(x), torch.zeros(N, device="cuda"), torch.zeros(N, device="cuda")
    mean, rstd = torch.empty(M, device="cuda"), torch.empty(M, device="cuda")
    args = [dy, x, w, dx, dw] + ([rstd] if op == "rms_norm" else [db, mean, rstd]) + [EPS]
    launches = [(k, args)]
    if not tiles["wgrad"]:
        wk = compile_kernel(path("rows_bwd.tk"), {}, kernel=kernel.replace("_bwd", "_wgrad"))  # (never _block)
        split = wgrad_split(M, N)
        launches.append((wk, [dy, x, rstd, dw, split] if op == "rms_norm" else [dy, x, mean, rstd, dw, db, split]))

    def run() -> None:
        dw.zero_()
        db.zero_()
        for kk, a in launches:
            launch(kk, a)

    return run


def tile_rows(shapes: list[tuple[int, int]], runs: int) -> list[Row]:
    """The norms' backward kernels alone at ROWS 8/16/32 and 4/8 warps, beside the tiles tkc.ops
    picks (``backward_tiles``), for rows in one block."""
    rows = []
    for M, N in shapes:
        if N > ONE_BLOCK:
            continue
        x = (torch.randn(M, N, device="cuda") + 1.0).to(torch.bfloat16)
        dy = torch.randn(M, N, device="cuda").to(torch.bfloat16)
        w = torch.randn(N, device="cuda").to(torch.bfloat16)
        dx = torch.empty_like(x)
        dw, db = torch.zeros(N, device="cuda"), torch.zeros(N, device="cuda")
        mean, rstd = torch.empty(M, device="cuda"), torch.empty(M, device="cuda")
        picked = backward_tiles(M, N)
        # LayerNorm's kernel as tkc.ops picks it: rows of exactly one block take layernorm_bwd_block
        for kernel in ("rmsnorm_bwd", "layernorm_bwd_block" if one_block_tiles(M, N) else "layernorm_bwd"):
            row = Row("rows backward tiles", f"{kernel} {M}x{N} (tkc.ops picks ROWS={picked['ROWS']}, "
                      f"BN={picked['BN']}, {picked['warps']} warps)", "GB/s")
            args = [dy, x, w, dx, dw] + ([db, mean, rstd] if kernel.startswith("layernorm") else [rstd]) + [EPS]
            contenders = {}
            for rows_, warps in ((8, 8), (16, 8), (32, 8), (16, 4), (32, 4)):
                k = compile_kernel(path("rows_bwd.tk"), {"BN": picked["BN"], "ROWS": rows_, "warps": warps},
                                   kernel=kernel)
                ours = (rows_, warps) == (picked["ROWS"], picked["warps"])
                label = "tkc" if ours else f"ROWS={rows_} warps={warps}"

                def call(k=k) -> None:
                    dw.zero_()
                    db.zero_()
                    launch(k, args)

                contenders[label] = call
            t = in_turns(contenders, runs)
            row.values = {n: 3 * M * N * 2 / s / 1e9 for n, s in t.items()}
            rows.append(row)
            print(f"  {row.problem}: " + ", ".join(f"{n} {v:.0f}" for n, v in row.values.items()), flush=True)
    return rows


GROUPS = {"backward": lambda s, r: training_rows(s, r, "backward"),
          "training": lambda s, r: training_rows(s, r, "forward + backward"),
          "tiles": tile_rows}


def main() -> None:
    run_groups("rows_backward.py", GROUPS, SHAPES, SHAPES[:1])


if __name__ == "__main__":
    main()
