"""The machine code of a kernel's loops: how many SASS instructions of each kind an iteration runs.

    python benchmarks/sass_loops.py examples/rows_bwd.tk --kernel layernorm_bwd -D BN=4096 -D ROWS=32 -D warps=4
    python benchmarks/sass_loops.py examples/rows_bwd.tk --kernel layernorm_bwd_block -D BN=4096 -D ROWS=32 -D warps=4

Compiles the kernel to a cubin (ptxas), disassembles it with ``nvdisasm`` and prints, for each
loop (a backward branch to a label), its instructions by opcode and the share that runs on the
uniform datapath (``U*`` opcodes: scalar work that every thread of a warp shares, off the vector
pipes).  Two kernels whose PTX differs little can differ here: beside its sweep path,
layernorm_bwd's one-block loop did its addresses and counters on the vector pipes (41 uniform
instructions an iteration against 161 alone) and ran 0.90x as fast (benchmarks/RESULTS.md).
Runs on a CPU-only machine.  ``nvdisasm`` comes with the CUDA toolkit or the
``nvidia-cuda-nvdisasm`` wheel; the script looks on PATH, in /usr/local/cuda/bin and in that
wheel's install.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

LABEL = re.compile(r"^\s*(\.L_x_\d+):")
BRANCH = re.compile(r"\bBRA\b[^`]*`?\(?(\.L_x_\d+)")
OPCODE = re.compile(r"\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*)")


def find_nvdisasm() -> str | None:
    found = shutil.which("nvdisasm") or next(
        (str(p) for p in [Path("/usr/local/cuda/bin/nvdisasm")] if p.exists()), None)
    if found:
        return found
    try:
        import nvidia  # the wheels' namespace package
    except ImportError:
        return None
    for root in nvidia.__path__:
        for p in sorted(Path(root).glob("*/bin/nvdisasm")):
            return str(p)
    return None


def loops(sass: str) -> list[tuple[int, int, collections.Counter]]:
    """``(first line, last line, opcode counts)`` of each loop of ``nvdisasm -c`` output: the
    lines from a label to a later branch back to it (predicated or not), outer loops included."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := LABEL.match(line))}
    out = []
    for i, line in enumerate(lines):
        m = BRANCH.search(line)
        if m and labels.get(m.group(1), i) < i:
            start = labels[m.group(1)]
            ops = collections.Counter(m.group(1) for body in lines[start:i + 1] if (m := OPCODE.search(body)))
            out.append((start, i, ops))
    return out


def describe(ops: collections.Counter) -> str:
    total = sum(ops.values())
    uniform = sum(n for op, n in ops.items() if op.startswith("U"))
    top = ", ".join(f"{op} {n}" for op, n in ops.most_common(12))
    return f"{total} instructions, {uniform} uniform: {top}"


def main() -> None:
    from tkc.cli import parse_value
    from tkc.compiler import compile_kernel

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--kernel", default=None)
    ap.add_argument("-D", dest="consts", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--target", default="sm_90a")
    ap.add_argument("--min", type=int, default=100, help="leave out loops of fewer instructions (default 100)")
    args = ap.parse_args()
    tool = find_nvdisasm()
    if tool is None:
        sys.exit("sass_loops.py: no nvdisasm (install the CUDA toolkit or `pip install nvidia-cuda-nvdisasm`)")
    consts = {name: parse_value(value) for name, _, value in (item.partition("=") for item in args.consts)}
    c = compile_kernel(args.file, consts, kernel=args.kernel, target=args.target, cache=False)
    print(f"{c.name}: {c.resources}, {c.programs_per_sm} programs an SM")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"])
        f.flush()
        sass = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    for start, end, ops in loops(sass):
        if sum(ops.values()) >= args.min:
            print(f"  loop at SASS lines {start}-{end}: {describe(ops)}")


if __name__ == "__main__":
    main()
