"""The residual LayerNorm/RMSNorm backward (examples/layernorm_residual_bwd.tk) with its rows
copied ahead into shared memory (the pin ``stage_loads``, 2 in the example) and without,
beside the copy bandwidth.

    python benchmarks/norm_backward.py                 # no dropout and dropout, three shapes
    python benchmarks/norm_backward.py --quick         # 16384 x 4096 only
    python benchmarks/norm_backward.py --only ragged   # rows of 3000-5000, blocks past their end

Each configuration's outputs are checked against the float64 torch reference of
tests/examples/tk_reference.py before it is timed; the configurations and the copy are timed
in turns (``harness.in_turns``: L2 cleared before each call, median round).  GB/s count what
the kernel must move: dy, dh, h read and dx written (and dres, with dropout).  The peers a
user would otherwise call are in ``benchmarks/tk_kernels.py --only norm``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.append(str(ROOT / "tests" / "examples"))

from harness import Row, in_turns, run_groups  # noqa: E402
import tk_reference as ref  # noqa: E402
from tk_kernels import checked  # noqa: E402

from tkc.compiler import compile_kernel  # noqa: E402
from tkc.runtime.launch import launch  # noqa: E402

EXAMPLE = ROOT / "examples" / "layernorm_residual_bwd.tk"
EPS, SEED, P = 1e-5, 1234, 0.1


def rows(shapes: list[tuple[int, int]], runs: int, dropout: bool) -> list[Row]:
    out = []
    for M, N in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        dy, dh, h = (torch.randn(M, N, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
        w, bias = (torch.randn(N, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
        dx, dres = (torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        dw, db = torch.zeros(N, device="cuda"), torch.zeros(N, device="cuda")
        src, dst = torch.randn(M, N, device="cuda").to(torch.bfloat16), torch.empty(M, N, device="cuda",
                                                                                      dtype=torch.bfloat16)
        p = P if dropout else 0.0
        for rms in (False, True):
            hf = h.double()
            mean = torch.zeros(M, device="cuda", dtype=torch.float64) if rms else hf.mean(-1)
            rstd = torch.rsqrt((hf - mean[:, None]).pow(2).mean(-1) + EPS)
            mean, rstd = mean.float(), rstd.float()
            want_dres, want_dw, want_db = ref.layernorm_residual_bwd(dy, dh, h, w, bias, EPS, rms)
            name = ("dropout + " if dropout else "") + ("RMSNorm" if rms else "LayerNorm")
            row = Row("norm_backward", f"{name} backward, {M}x{N} bf16" + (f", p={p}" if dropout else "")
                      + (f", BN={block(N)}" if block(N) != N else ""), "GB/s")
            contenders = {}
            for label, consts in (("tkc", {}), ("tkc, stage_loads=0", {"stage_loads": 0})):
                k = compile_kernel(EXAMPLE, {"BN": block(N), "rms": rms, "dropout": dropout, **consts})
                args = [dy, dh, h, w, mean, rstd, dx, dres, dw, db, SEED, p]

                def call(k=k, args=args) -> None:
                    dw.zero_()
                    db.zero_()
                    launch(k, args)

                call()
                ok = checked(row, dw, want_dw, 1e-2) and checked(row, db, want_db, 1e-2) and (
                    checked(row, dres, want_dres, 2e-2) if dropout else checked(row, dx, want_dres, 2e-2))
                if not ok:
                    row.notes = f"{label}: {row.notes}"
                    break
                contenders[label] = call
            if row.notes:
                out.append(row)
                continue
            contenders["copy"] = lambda: dst.copy_(src)
            t = in_turns(contenders, runs)
            moved = (5 if dropout else 4) * M * N * 2
            row.values = {n: (2 * M * N * 2 if n == "copy" else moved) / s / 1e9 for n, s in t.items()}
            out.append(row)
            print(f"  {row.problem}: {row.values}", flush=True)
    return out


def block(N: int) -> int:
    """The one-block width a row of N takes: N rounded up to 512, so that a row that is not a
    power of two reads past its end (copied in bounds, the rest zero-filled)."""
    return -(-N // 512) * 512


RAGGED = [(16384, 3000), (16384, 4000), (16384, 5000)]
GROUPS = {"plain": lambda s, r: rows(s, r, False), "dropout": lambda s, r: rows(s, r, True),
          "ragged": lambda s, r: rows(RAGGED[:1] if len(s) == 1 else RAGGED, r, False)}


def main() -> None:
    run_groups("norm_backward.py", GROUPS, [(16384, 4096), (8192, 8192), (4096, 4096)], [(16384, 4096)])


if __name__ == "__main__":
    main()
