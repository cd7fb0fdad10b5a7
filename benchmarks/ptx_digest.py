"""The PTX of every configuration the benchmark harness compiles, as one digest per line.

    python benchmarks/ptx_digest.py > before.txt      # on one commit
    python benchmarks/ptx_digest.py > after.txt       # on another
    diff before.txt after.txt                         # empty: every harness kernel unchanged

A refactoring of the compiler must leave this output unchanged (or explain each line that
moves and measure it on a GPU).  Runs on a CPU-only machine: it compiles to PTX (ptxas runs
where one is found, since a kernel without products takes its programs an SM from ptxas's
register count), never launches, and never reads or writes the disk cache.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tkc.compiler import compile_kernel  # noqa: E402

EXAMPLES = HERE.parent / "examples"


def configurations() -> list[tuple[str, dict]]:
    """(example, constants) for every kernel the harness may compile, in a fixed order."""
    # run.py imports torch for its timing; its schedule tables are plain data.
    from run import ATTN_CONFIGS, GEMM_CONFIGS, attn_configs, norm_configs, split_configs

    out = [("gemm.tk", c) for c in GEMM_CONFIGS]
    out += [("attn.tk", c) for D in ATTN_CONFIGS for causal in (False, True) for c in attn_configs(D, causal)]
    for op in ("softmax", "layernorm"):
        for n in (4096, 16384, 65536):
            out += [(f"{op}.tk", c) for c in norm_configs(op, n)]
            out += [(f"{op}_split.tk", c) for c in split_configs(n)]
    seen, unique = set(), []
    for example, consts in out:
        key = (example, json.dumps(consts, sort_keys=True))
        if key not in seen:
            seen.add(key)
            unique.append((example, consts))
    return unique


def main() -> None:
    for example, consts in configurations():
        ptx = compile_kernel(EXAMPLES / example, consts, stop="ptx", cache=False).asm["ptx"]
        digest = hashlib.sha256(ptx.encode()).hexdigest()[:16]
        print(f"{digest}  {example} {json.dumps(consts, sort_keys=True)}", flush=True)


if __name__ == "__main__":
    main()
