"""One contract between the interpreter and the GPU: every kernel the interpreter runs either
compiles for sm_90a, and then the emulator of what it compiles to computes what the
interpreter does, or is refused with a located message in the language's own words.

The corpus (tests/contract/*.tk) holds kernels that once fell between the two: a crash in a
pass, a refusal in layout words, a compile that never ended.  A file whose first line is
``# refused: <regex>`` must be refused with that message; every other file and every example
must compile and agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from device_checks import CONTRACT_CONSTS as SMALL
from device_checks import HAVE_PTXAS, assert_no_spills, kernel_names
from tkc.compiler import compile_kernel
from tkc.errors import TkcError
from tkc.interpreter import random_args, run_kernel
from tkc.ir.dialects.tile import uses_ranks
from tkc.runner import default_dims, run

ROOT = Path(__file__).resolve().parents[1]
CORPUS = sorted((ROOT / "tests" / "contract").glob("*.tk"))
EXAMPLES = sorted((ROOT / "examples").glob("*.tk"))
#: Words of the compiler's insides that a refusal must not show a user.
INSIDE_WORDS = re.compile(r"pass '|#blocked|#slice|#wgmma|#smem|Traceback|Error:|hopper\.|tile\.")
#: Dims the defaults would make too large for a CPU, or that must agree with the int range.
DIMS = {"paged_decode.tk": {"B": 2, "HQ": 16, "KVH": 2, "NT": 144, "MAXP": 9},
        # One block of keys: each dQ element is added to by one program (the random lse and
        # scale give terms near 2^60, whose sum the order of several programs' adds would move).
        "attn_train.tk": {"N": 48},
        # fft_rows's programs each run eight 64-point transforms in the emulator: 27 take 8 s.
        "fftconv.tk": {"B": 1, "H": 2, "PP": 2}}


def _expected_refusal(path: Path) -> str | None:
    first = path.read_text().splitlines()[0]
    return first.split(":", 1)[1].strip() if first.startswith("# refused:") else None


def _kernels(path: Path) -> list[tuple[Path, str]]:
    return [(path, k) for k in kernel_names(path)]


def test_the_kernels_listed_at_collection_are_the_compilers() -> None:
    """The parametrizations read each file's kernels off its ``@kernel`` lines: a kernel that
    list missed would go untested without a word."""
    from tkc.frontend import compile_file

    for path in CORPUS + EXAMPLES:
        assert kernel_names(path) == [k.sym_name for k in compile_file(str(path), SMALL.get(path.name, {})).ops], path


@pytest.mark.parametrize("path, kernel", [pk for p in CORPUS + EXAMPLES for pk in _kernels(p)],
                         ids=lambda x: x.name if isinstance(x, Path) else x)
def test_interpreted_kernels_compile_and_agree_or_are_refused_in_words(path: Path, kernel: str) -> None:
    consts = SMALL.get(path.name, {})
    tile_ir = compile_kernel(path, consts, stop="tkir", cache=False, kernel=kernel).kernel_op
    dims = default_dims(tile_ir)
    dims.update({d: n for d, n in DIMS.get(path.name, {}).items() if d in dims})
    args = random_args(tile_ir, dims, 0, (0, 8))
    want = [a.copy() if hasattr(a, "copy") else a for a in args]
    multi_gpu = uses_ranks(tile_ir)
    if not multi_gpu:  # random flags and shapes break a multi-GPU protocol: tests/ranks runs those
        run_kernel(tile_ir, want)  # the interpreter accepts it
    refusal = _expected_refusal(path)
    try:
        # A cubin where ptxas is found (and then no spills), else PTX: what CI without ptxas reaches.
        c = compile_kernel(path, consts, stop=("cubin" if HAVE_PTXAS else "ptx") if refusal is None else "hopper",
                           cache=False, kernel=kernel)
    except TkcError as e:
        assert refusal is not None, f"{path.name} is refused: {e}"
        assert re.search(refusal, e.message), e.message
        assert e.loc is not None and e.loc.line > 0, f"no location: {e}"
        assert not INSIDE_WORDS.search(e.message), f"the compiler's insides in a user's message: {e.message}"
        return
    assert refusal is None, f"{path.name} compiles, but should be refused with {refusal!r}"
    if HAVE_PTXAS:
        assert_no_spills(c)
    if multi_gpu:
        return  # the emulator runs a multi-GPU kernel on R ranks: tests/ranks
    # (The check's tolerance knows outputs of products of bf16-rounded values: tkc.runner.tolerance.)
    result = run(tile_ir, args, "emulate", check=True)
    bad = [m for m in result.checked if m.bad]
    assert not bad, f"emulator and interpreter differ: {bad}"
