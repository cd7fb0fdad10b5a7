"""FFT long convolution (issue 27): examples/fftconv.tk (through tkc.ops.fft_conv: one
kernel for N = 1k and 2k, three for 4k to 64k) beside torch.fft in fp32 (rfft, the product with the
filter's precomputed rfft, irfft) eager and under ``torch.compile``, at FlashFFTConv's shapes
(B = 64, H = 768; fewer rows at 64k).  Every contender gets its filter's response made once
beforehand (tkc's ``Filter``, torch's ``rfft(k, 2N)``) and returns bf16 [B, H, N].  Each row
timed in turns with its peers on one GPU (cold L2, harness.py).

    python benchmarks/fftconv.py [--quick] [--no-record]
    python benchmarks/fftconv.py --breakdown     # each kernel's time at BB = 8, 32 rows a program

Appends the table to benchmarks/RESULTS.md (unless --no-record or --breakdown).  Microseconds a
call.  Needs a CUDA GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/ goes after the standard library, whose profile module torch.compile imports
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"] + [str(ROOT / "benchmarks")]

import torch  # noqa: E402

from harness import Row, append_results, gpu_time, group_args, in_turns, run_command, table  # noqa: E402
from tk_kernels import checked  # noqa: E402

import tkc.ops.fftconv as fc  # noqa: E402



def torch_fftconv(u: torch.Tensor, kf: torch.Tensor, N: int) -> torch.Tensor:
    """FlashFFTConv's torch reference: fp32 rfft of the padded row, times the filter's, irfft."""
    return torch.fft.irfft(torch.fft.rfft(u.float(), 2 * N) * kf, 2 * N)[..., :N].to(u.dtype)


def fftconv_rows(shapes: list[tuple[int, int, int]], runs: int) -> list[Row]:
    rows = []
    compiled = torch.compile(torch_fftconv)
    for B, H, N in shapes:
        p = fc.plan(N)
        how = "1 kernel" if not p.P else f"3 kernels, L={p.L // 1024}k"
        row = Row("fftconv", f"B={B} H={H} N={N} bf16 ({how})", "us")
        u = torch.randn(B, H, N, device="cuda").to(torch.bfloat16)
        k = torch.randn(H, N, device="cuda") / N ** 0.5
        f = fc.Filter.of(k)
        kf = torch.fft.rfft(k, 2 * N)
        y = fc.fft_conv(u, f)
        if not checked(row, y, torch_fftconv(u, kf, N), 2e-2):
            rows.append(row)
            continue
        compiled(u, kf, N)

        def ours(u=u, f=f):
            return fc.fft_conv(u, f)

        def eager(u=u, kf=kf, N=N):
            return torch_fftconv(u, kf, N)

        def inductor(u=u, kf=kf, N=N):
            return compiled(u, kf, N)

        t = in_turns({"tkc": ours, "torch.fft fp32": eager, "torch.compile": inductor}, runs)
        row.values = {n: s * 1e6 for n, s in t.items()}
        rows.append(row)
        print(f"  {row.problem}: {row.values}", flush=True)
        del u, y
        torch.cuda.empty_cache()
    return rows


def breakdown(shapes: list[tuple[int, int, int]]) -> None:
    """Each kernel of fft_conv alone (its own launches, cold L2) at two rows-a-program counts."""
    for B, H, N in shapes:
        u = torch.randn(B, H, N, device="cuda").to(torch.bfloat16)
        f = fc.Filter.of(torch.randn(H, N, device="cuda") / N ** 0.5)
        for BB in (8, 32):
            calls, _ = fc.launches(u, f, BB)
            times = {name: gpu_time(call, 10).median_s * 1e6 for name, call in calls}
            total = gpu_time(lambda: fc.fft_conv(u, f, BB), 10).median_s * 1e6
            print(f"  B={B} H={H} N={N} BB={BB}: fft_conv {total:.0f} us = "
                  + ", ".join(f"{n} {t:.0f}" for n, t in times.items()), flush=True)


def main() -> None:
    if "--breakdown" in sys.argv:
        breakdown([(64, 768, 1024), (64, 768, 4096), (64, 768, 16384)])
        return
    args, only = group_args("fftconv.py", ["fftconv"])
    runs = 15 if args.quick else 30
    shapes = [(64, 768, 4096)] if args.quick else \
        [(64, 768, 1024), (64, 768, 2048), (64, 768, 4096), (64, 768, 16384), (8, 768, 65536)]
    rows = fftconv_rows(shapes, runs)
    print(table(rows))
    if not args.no_record:
        append_results(ROOT / "benchmarks" / "RESULTS.md", run_command("fftconv.py", args.quick, args.only,
                                                                        ["fftconv"]), rows)


if __name__ == "__main__":
    main()
