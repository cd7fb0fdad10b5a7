"""``tkc.autotune``: time a kernel under a few constant/pin settings and keep the fastest.

    best = tkc.autotune(gemm, [a, b, c], [{"BN": 128}, {"BN": 256}, {"BN": 128, "stages": 3}])
    gemm(a, b, c, **best.consts)

Each configuration is compiled (once, through the usual caches) and checked to launch; then
they are timed in turns with ``tkc.runtime.timing`` on the arguments given (which it
overwrites: pass scratch outputs).  A configuration the compiler refuses (too much shared memory, an unsupported
tile) is reported and skipped, not fatal.  Results are kept in the disk cache
(``TKC_CACHE_DIR``) keyed by the compiler version, the kernel source, the configurations,
the arguments' shapes, strides and dtypes, and the GPU's name, so a second call with the
same key times nothing.  Progress goes to stderr: a line per configuration as it compiles,
then one with every time.

Owns: the search over configurations and its cache entry.  Must not: choose configurations
(the caller lists them), or time differently from the rest of tkc.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tkc.errors import TkcError, TkcUsageError
from tkc.target import DEFAULT_TARGET

_ENTRY = "autotune.json"


@dataclass
class AutotuneResult:
    consts: dict[str, Any]  # the fastest configuration
    seconds: float  # its median kernel time
    timings: list[tuple[dict[str, Any], float | None, str]] = field(default_factory=list)  # config, s, why not
    cache_hit: bool = False


def _compile(kernel: Any, consts: Mapping[str, Any], target: str, args: Sequence[Any]) -> Any:
    from tkc.compiler import compile_kernel
    from tkc.kernel import Kernel

    if isinstance(kernel, Kernel):
        # With the pins a call with these constants adds for these shapes (tkc.schedule), so
        # the build timed is the one ``kernel(*args, **best.consts)`` then launches.
        return kernel.specialize(**consts, **kernel.pins(*args, **consts))  # for kernel.target
    return compile_kernel(Path(kernel), dict(consts), target=target)


def _source(kernel: Any) -> str:
    """What the kernel is: its source, with its name (a .tk file may hold several kernels
    taking the same arguments, each tuned on its own)."""
    from tkc.kernel import Kernel

    if isinstance(kernel, Kernel):
        return f"{kernel.name}\n{kernel.source}"
    return Path(kernel).read_text()


def _signature(args: Sequence[Any]) -> list:
    out: list = []
    for x in args:
        if hasattr(x, "shape") and hasattr(x, "stride"):
            out.append([list(x.shape), list(x.stride()), str(x.dtype)])
        else:
            out.append(repr(x))
    return out


def _label(consts: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in consts.items()) or "defaults"


def autotune(kernel: Any, args: Sequence[Any], configs: Sequence[Mapping[str, Any]], *, runs: int = 20,
             rounds: int = 5, flush_bytes: int = 0, cache: bool = True,
             progress: TextIO | None = sys.stderr) -> AutotuneResult:
    """Time ``kernel`` (a ``@tkc.kernel`` or a ``.tk`` path) on ``args`` under each of
    ``configs`` (constants and pins); return the fastest.

    The configurations alternate call by call, ``runs * rounds`` timed calls each, after
    ``WARMUP_S`` of alternating calls (``tkc.runtime.timing.alternating_times``); each one's
    median call.  ``flush_bytes``: clear a buffer that large before every timed
    call, so each starts with a cold L2, as a benchmark that flushes would time it."""
    import torch

    from tkc.compiler import compiler_version
    from tkc.runtime import cache as disk
    from tkc.runtime.launch import launch
    from tkc.runtime.timing import WARMUP_S, alternating_times

    from tkc.kernel import Kernel

    configs = [dict(c) for c in configs]
    if not configs:
        raise TkcUsageError("tkc.autotune needs at least one configuration")
    if not isinstance(kernel, (Kernel, str, Path)):
        raise TkcUsageError(f"tkc.autotune takes a @tkc.kernel or a .tk path, got {type(kernel).__name__}")
    if runs < 1 or rounds < 1:
        raise TkcUsageError(f"tkc.autotune needs runs >= 1 and rounds >= 1, got runs={runs}, rounds={rounds}")
    if not torch.cuda.is_available():
        raise TkcUsageError("tkc.autotune times kernels on a GPU; torch sees none")
    device = torch.cuda.get_device_name(torch.cuda.current_device())
    target = getattr(kernel, "target", DEFAULT_TARGET.name)  # a @tkc.kernel's own, else the default
    key = disk.key(compiler_version(), _source(kernel), {"configs": configs}, target,
                   {"args": _signature(args), "device": device, "runs": runs, "rounds": rounds,
                    "flush_bytes": flush_bytes}) if cache else None
    if key is not None and (hit := disk.get(key, _ENTRY)) is not None:
        try:
            saved = json.loads(hit)
            return AutotuneResult(saved["consts"], saved["seconds"], [tuple(t) for t in saved["timings"]], True)
        except (ValueError, KeyError, TypeError):
            pass  # an entry this version cannot read: time again and replace it
    name = getattr(kernel, "name", Path(str(kernel)).stem)
    timings: list[tuple[dict[str, Any], float | None, str]] = []
    runnable: list[tuple[int, Any]] = []  # (index into timings, compiled kernel)
    for n, consts in enumerate(configs, 1):
        label = _label(consts)
        try:
            compiled = _compile(kernel, consts, target, args)
            launch(compiled, args)  # fails here, not in the middle of the timing rounds
            runnable.append((len(timings), compiled))
            timings.append((consts, None, ""))
            line = "compiled"
        except TkcError as e:
            timings.append((consts, None, e.message.splitlines()[0]))
            line = f"skipped: {e.message.splitlines()[0]}"
        if progress is not None:
            print(f"autotune {name} [{n}/{len(configs)}] {label}: {line}", file=progress, flush=True)
    # The configurations alternate call by call: each runs at the clock all of them hold the
    # GPU at, not the one the configuration before it left (a power-capped GPU's clock follows
    # the last second of work; benchmarks/RESULTS.md, 2026-11-27).
    calls = alternating_times([lambda c=c: launch(c, args) for _, c in runnable], runs * rounds, flush_bytes,
                              WARMUP_S)
    for (i, _), times in zip(runnable, calls):
        timings[i] = (timings[i][0], statistics.median(times), "")
    if progress is not None and runnable:
        print(f"autotune {name}: " + ", ".join(
            f"{_label(timings[i][0])} {timings[i][1] * 1e6:.1f} us" for i, _ in runnable), file=progress, flush=True)
    timed = [t for t in timings if t[1] is not None]
    if not timed:
        raise TkcUsageError(f"tkc.autotune: no configuration of {name} compiled and ran:\n"
                            + "\n".join(f"  {t[0]}: {t[2]}" for t in timings))
    best = min(timed, key=lambda t: t[1])
    result = AutotuneResult(best[0], best[1], timings)
    if key is not None:
        disk.put(key, _ENTRY, json.dumps({"consts": result.consts, "seconds": result.seconds,
                                          "timings": [list(t) for t in timings]}).encode())
    return result
