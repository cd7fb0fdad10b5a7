"""How much hiding gemm.tk's epilogue could gain: the kernel timed beside copies of its own
PTX with parts of the epilogue cut out, and cuBLAS, in turns.

    python benchmarks/gemm_epilogue_bound.py                       # the harness's GEMM shapes
    python benchmarks/gemm_epilogue_bound.py --shape 8192x8192x1024 -D BN=128

Variants (the cut kernels' outputs are wrong; only their time means something):

- ``as compiled``: the kernel tkc emits;
- ``no read waits``: without the waits, between an epilogue's 64-column slices, for the TMA
  store two slices back to have read its shared tile (what more staging buffers would save);
- ``one slice``: of each tile's epilogue only its first ``stmatrix`` and first TMA store
  are left (no waits): what a perfectly overlapped epilogue would cost at most, the stores
  of C to memory included.  Every wgmma stays (each writes the registers the kept slice
  reads), so the main loop is the kernel's own.

Also prints the name of the cuBLAS kernel torch.matmul ran.  Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tkc.compiler import Compiled  # noqa: E402

READ_WAIT = re.compile(r"^\s*cp\.async\.bulk\.wait_group\.read\s+[1-9]\d*;")
STMATRIX = re.compile(r"^\s*stmatrix\.")
TMA_STORE = re.compile(r"^\s*cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta\.")

SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (4096, 4096, 1024), (2048, 2048, 2048))


def without_read_waits(ptx: str) -> str:
    """``ptx`` without the waits for all but the latest TMA stores to have read shared memory."""
    return "\n".join(line for line in ptx.split("\n") if not READ_WAIT.match(line))


def one_slice(ptx: str) -> str:
    """``ptx`` with only its first ``stmatrix`` and first TMA store, and no partial read waits."""
    kept: list[str] = []
    seen = {STMATRIX: 0, TMA_STORE: 0}
    for line in without_read_waits(ptx).split("\n"):
        hit = next((p for p in seen if p.match(line)), None)
        if hit is not None:
            seen[hit] += 1
            if seen[hit] > 1:
                continue
        kept.append(line)
    return "\n".join(kept)


def variants(compiled: Compiled) -> dict[str, Compiled]:
    """The kernel as compiled and its cut copies (PTX only: the driver assembles it)."""
    ptx = compiled.asm["ptx"]
    if not any(READ_WAIT.match(line) for line in ptx.split("\n")):
        raise SystemExit("this gemm.tk has no partial TMA store waits: nothing to cut (tma_store=False?)")

    def with_ptx(text: str) -> Compiled:
        asm = {k: v for k, v in compiled.asm.items() if k != "cubin"}
        return dataclasses.replace(compiled, asm={**asm, "ptx": text})

    return {"as compiled": compiled, "no read waits": with_ptx(without_read_waits(ptx)),
            "one slice": with_ptx(one_slice(ptx))}


def main() -> None:
    import torch
    from harness import in_turns

    from tkc.compiler import compile_kernel
    from tkc.runtime.launch import launch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", default=[], metavar="MxNxK")
    ap.add_argument("-D", dest="consts", action="append", default=[], metavar="NAME=VALUE",
                    help="a pin or constant of examples/gemm.tk (int or true/false)")
    ap.add_argument("--runs", type=int, default=45)
    args = ap.parse_args()
    consts: dict[str, object] = {}
    for item in args.consts:
        name, value = item.split("=", 1)
        consts[name] = {"true": True, "false": False}.get(value.lower(), None)
        if consts[name] is None:
            consts[name] = int(value)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shape] or SHAPES
    kernels = variants(compile_kernel(HERE.parent / "examples" / "gemm.tk", consts))
    print(f"{'M x N x K':>16}  " + "  ".join(f"{n:>13}" for n in [*kernels, "cuBLAS"]) + "   (TFLOP/s)")
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ b.float()
        c.fill_(float("nan"))
        launch(kernels["as compiled"], [a, b, c])
        err = (c.float() - ref).abs().max().item()
        if not err <= 1e-2 * ref.abs().max().item():
            raise SystemExit(f"{m}x{n}x{k}: gemm.tk's result is wrong (max error {err:.3g})")
        fns = {name: (lambda v=v: launch(v, [a, b, c])) for name, v in kernels.items()}
        fns["cuBLAS"] = lambda: torch.matmul(a, b, out=c)
        t = in_turns(fns, args.runs)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            torch.matmul(a, b, out=c)
            torch.cuda.synchronize()
        names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                        and "memset" not in e.name.lower()})
        flops = 2 * m * n * k
        print(f"{f'{m}x{n}x{k}':>16}  " + "  ".join(f"{flops / s / 1e12:>13.1f}" for s in t.values())
              + f"   cuBLAS: {', '.join(names)}", flush=True)


if __name__ == "__main__":
    main()
