"""Finding and running ptxas: PTX → cubin, and the ``-v`` resource report.

Owns: the ptxas search order (:func:`find_ptxas`), running ptxas in a
temporary directory, parsing its ``-v`` report into :class:`ResourceUsage`
per kernel, and turning ptxas failures into a TkcCodegenError that quotes
ptxas and the offending PTX line.

Must not: change the PTX, pick ptxas flags that alter code (no ``-O``,
``-maxrregcount``: register budgets live in the PTX as ``.maxnreg``,
PTX-FACTS §5), or touch the GPU.  ``TKC_PTXAS`` is read through
``tkc.options``; ``PATH`` and ``CUDA_HOME`` are the system's own variables and
are read here, from the same mapping.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sysconfig
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tkc import options
from tkc.target import DEFAULT_TARGET, Target, target
from tkc.errors import TkcCodegenError, TkcUsageError

CUDA_DEFAULT = Path("/usr/local/cuda/bin")
# Where the `nvidia-cuda-nvcc` wheels put ptxas inside site-packages (PTX-FACTS §9):
# CUDA 13 wheels (`nvidia-cuda-nvcc`) and CUDA 12 wheels (`nvidia-cuda-nvcc-cu12`).
WHEEL_PTXAS = ("nvidia/cu13/bin/ptxas", "nvidia/cuda_nvcc/bin/ptxas")
HOW_TO_GET = ("install one with `pip install nvidia-cuda-nvcc` or a CUDA toolkit, "
              "or point TKC_PTXAS at a ptxas binary")


def _site_dirs() -> list[Path]:
    """This interpreter's site-packages directories (venv first), without duplicates."""
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # some embedded interpreters lack it
        pass
    dirs.append(site.getusersitepackages())
    return list(dict.fromkeys(Path(d) for d in dirs))


def _candidates(env: Mapping[str, str]) -> list[tuple[str, Path | None]]:
    """(where, path) in search order; ``path`` None when that place has no ptxas."""
    out: list[tuple[str, Path | None]] = []
    which = shutil.which("ptxas", path=env.get("PATH", ""))
    out.append(("PATH", Path(which) if which else None))
    home = env.get("CUDA_HOME")
    if home:
        out.append((f"$CUDA_HOME/bin ({home}/bin)", Path(home) / "bin" / "ptxas"))
    else:
        out.append(("$CUDA_HOME/bin (CUDA_HOME unset)", None))
    out.append((str(CUDA_DEFAULT), CUDA_DEFAULT / "ptxas"))
    for d in _site_dirs():
        for rel in WHEEL_PTXAS:
            out.append((str(d / rel), d / rel))
    return out


def _executable(p: Path | None) -> bool:
    return p is not None and p.is_file() and os.access(p, os.X_OK)


def searched(env: Mapping[str, str] | None = None) -> list[str]:
    """The places :func:`find_ptxas` looks, in order (for messages)."""
    env = os.environ if env is None else env
    return ["TKC_PTXAS", *(where for where, _ in _candidates(env))]


def find_ptxas(env: Mapping[str, str] | None = None) -> Path | None:
    """The ptxas tkc uses, or None when there is none.

    Order: ``TKC_PTXAS``; ``PATH``; ``$CUDA_HOME/bin``; ``/usr/local/cuda/bin``;
    the ``nvidia-cuda-nvcc`` wheels in site-packages (``nvidia/cu13/bin``, then
    ``nvidia/cuda_nvcc/bin``).  A ``TKC_PTXAS`` that is not an executable file
    is a TkcUsageError rather than a silent fall-through.
    """
    env = os.environ if env is None else env
    chosen = options.knobs(env).ptxas
    if chosen is not None:
        if not _executable(chosen):
            raise TkcUsageError(f"TKC_PTXAS={str(chosen)!r} is not an executable file")
        return chosen
    for _, path in _candidates(env):
        if _executable(path):
            return path
    return None


def require_ptxas(env: Mapping[str, str] | None = None) -> Path:
    """:func:`find_ptxas`, or a TkcUsageError naming the places searched and how to get one."""
    found = find_ptxas(env)
    if found is None:
        places = "\n  ".join(searched(env))
        raise TkcUsageError(f"no ptxas found; searched:\n  {places}\n{HOW_TO_GET}")
    return found


def ptxas_version(ptxas: Path) -> str:
    """``13.0.88`` style version of a ptxas binary (from ``--version``)."""
    r = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True, timeout=60)
    m = re.search(r"V(\d+\.\d+\.\d+)", r.stdout)
    return m.group(1) if m else "unknown"


@dataclass(frozen=True)
class ResourceUsage:
    """What ``ptxas -v`` reports for one kernel (bytes unless named otherwise)."""

    kernel: str
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    smem: int = 0
    stack_frame: int = 0
    barriers: int = 0
    lines: tuple[str, ...] = ()  # ptxas's own lines for this kernel

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)

    def __str__(self) -> str:
        return (f"{self.kernel}: {self.registers} registers, {self.smem} B smem, {self.stack_frame} B stack, "
                f"{self.spill_stores} B spill stores, {self.spill_loads} B spill loads")


@dataclass(frozen=True)
class Assembled:
    """A cubin and what ptxas said while making it."""

    cubin: bytes
    arch: str
    ptxas: Path
    log: str  # everything ptxas printed
    kernels: dict[str, ResourceUsage] = field(default_factory=dict)
    # ptxas's info/warning lines with a C-code, e.g. "(C7508) ... 'setmaxnreg' ignored" (PTX-FACTS §1, §5),
    # and plain warnings; ptxas prints some of these before any kernel, so they are not per kernel.
    warnings: tuple[str, ...] = ()


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_FIELDS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "barriers": re.compile(r"used (\d+) barriers"),
    "smem": re.compile(r"(\d+) bytes smem"),
    "stack_frame": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
}
_CODE = re.compile(r"\(C\d{4}\)|warning", re.IGNORECASE)


def parse_usage(log: str) -> tuple[dict[str, ResourceUsage], tuple[str, ...]]:
    """Per-kernel usage and the C-code/warning lines from a ``ptxas -v`` log."""
    kernels: dict[str, ResourceUsage] = {}
    current: str | None = None
    lines: dict[str, list[str]] = {}
    warnings = tuple(ln.strip() for ln in log.splitlines() if _CODE.search(ln))
    for ln in log.splitlines():
        m = _ENTRY.search(ln)
        if m:
            current = m.group(1)
            lines[current] = []
        if current is not None and ln.strip():
            lines[current].append(ln.strip())
    for name, ls in lines.items():
        text = "\n".join(ls)
        values = {k: int(m.group(1)) for k, rx in _FIELDS.items() if (m := rx.search(text))}
        kernels[name] = ResourceUsage(name, lines=tuple(ls), **values)
    return kernels, warnings


_ERROR_LINE = re.compile(r"^ptxas [^,]*, line (\d+); (error|warning)\s*:\s*(.*)$")


def _ptxas_error(log: str, ptx: str, limit: int = 12) -> str:
    """ptxas's complaint, first lines only, each error followed by the PTX line it names."""
    ptx_lines = ptx.splitlines()
    out: list[str] = []
    for ln in log.strip().splitlines()[:limit]:
        m = _ERROR_LINE.match(ln)
        if m:
            n = int(m.group(1))
            out.append(f"PTX line {n}: {m.group(2)}: {m.group(3)}")
            if 1 <= n <= len(ptx_lines):
                out.append(f"    {ptx_lines[n - 1].strip()}")
        else:
            out.append(ln)
    more = len(log.strip().splitlines()) - limit
    if more > 0:
        out.append(f"... ({more} more lines)")
    return "\n".join(out)


def assemble(ptx: str, arch: str | Target = DEFAULT_TARGET, verbose: bool = True,
             env: Mapping[str, str] | None = None, timeout: float = 600) -> Assembled:
    """Run ``ptxas -arch=ARCH [-v]`` on ``ptx`` and return the cubin and its resource report.
    The same text for the same ptxas and arch again returns the earlier result (ptxas is
    deterministic; the occupancy search and a kernel compiled at several stops ask again)."""
    t = target(arch)
    exe = require_ptxas(env)
    key = (str(exe), t.arch, verbose, ptx)
    with _ASSEMBLED_LOCK:
        done = _ASSEMBLED.get(key)
        if done is not None:
            _ASSEMBLED.move_to_end(key)
            return done
    done = _run_ptxas(ptx, t, exe, verbose, timeout)  # outside the lock: the occupancy search runs several
    with _ASSEMBLED_LOCK:
        _ASSEMBLED[key] = done
        if len(_ASSEMBLED) > 32:
            _ASSEMBLED.popitem(last=False)
    return done


#: The last results of :func:`assemble` in this process, by (ptxas, arch, -v, text).
_ASSEMBLED: OrderedDict[tuple[str, str, bool, str], Assembled] = OrderedDict()
_ASSEMBLED_LOCK = threading.Lock()


def _run_ptxas(ptx: str, t: Target, exe: Path, verbose: bool, timeout: float) -> Assembled:
    with tempfile.TemporaryDirectory(prefix="tkc-ptxas-") as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx)
        cmd = [str(exe), f"-arch={t.arch}", *(["-v"] if verbose else []), str(src), "-o", str(out)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except OSError as e:
            raise TkcUsageError(f"cannot run ptxas at {exe}: {e.strerror or e}") from None
        except subprocess.TimeoutExpired:
            raise TkcCodegenError(f"ptxas ({exe}) did not finish within {timeout:g} s") from None
        log = (r.stderr + r.stdout).replace(str(src), "kernel.ptx")
        if r.returncode != 0 or not out.exists():
            raise TkcCodegenError(f"ptxas -arch={t.arch} rejected the PTX:\n{_ptxas_error(log, ptx)}")
        cubin = out.read_bytes()
    kernels, warnings = parse_usage(log) if verbose else ({}, tuple(
        ln.strip() for ln in log.splitlines() if _CODE.search(ln)))
    return Assembled(cubin, t.arch, exe, log, kernels, warnings)
