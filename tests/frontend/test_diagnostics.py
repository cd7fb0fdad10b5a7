"""The diagnostics corpus: every file in ``bad/`` is a kernel with one mistake.

Its first line says what the compiler must report::

    # ERROR: <line>:<col>: <substring of the message>

and an optional second line ``# CONSTS: NAME=value, ...`` gives the ``-D``
constants to compile with.  Each file must fail with a located ``TkcError``
(never another exception) whose caret points at exactly that line and column.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tkc.errors import TkcError
from tkc.frontend import compile_file

BAD = Path(__file__).with_name("bad")
FILES = sorted(BAD.glob("*.tk"))
HEADER = re.compile(r"# ERROR: (\d+):(\d+): (.+)")
CONSTS = re.compile(r"# CONSTS: (.+)")

# a few of the corpus run through the command line too
CLI_FILES = [
    "syntax_missing_colon.tk",
    "name_unknown_did_you_mean.tk",
    "matmul_shape_mismatch.tk",
    "unsupported_while.tk",
    "store_f32_into_bf16.tk",
]


def _value(text: str) -> object:
    text = text.strip()
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return float(text)


def expectation(path: Path) -> tuple[int, int, str, dict[str, object]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    m = HEADER.fullmatch(lines[0].rstrip())
    assert m, f"{path.name}: the first line must be '# ERROR: <line>:<col>: <message>'"
    consts: dict[str, object] = {}
    c = CONSTS.fullmatch(lines[1].rstrip()) if len(lines) > 1 else None
    if c:
        for item in c.group(1).split(","):
            name, _, value = item.partition("=")
            consts[name.strip()] = _value(value)
    return int(m.group(1)), int(m.group(2)), m.group(3).strip(), consts


def test_corpus_is_big_enough():
    assert len(FILES) >= 45


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_diagnostic(path: Path):
    line, col, message, consts = expectation(path)
    try:
        compile_file(str(path), consts or None)
    except TkcError as e:
        err = e
    else:
        pytest.fail(f"{path.name} compiled without an error; expected {line}:{col}: {message}")
    # any other exception propagates and fails the test with its traceback
    assert err.loc is not None, f"unlocated {type(err).__name__}: {err}"
    assert err.loc.file == str(path)
    assert (err.loc.line, err.loc.col) == (line, col), f"wrong location:\n{err}"
    assert message in err.message, f"wrong message:\n{err}"

    text = str(err)
    source_line = path.read_text(encoding="utf-8").splitlines()[line - 1]
    out = text.splitlines()
    assert out[0].startswith(f"{path}:{line}:{col}: error: "), text
    assert len(out) == 3, text
    assert out[1] == source_line.rstrip("\n"), text
    caret = out[2]
    assert caret.rstrip().endswith("^") and len(caret) == col, f"caret not under column {col}:\n{text}"
    assert caret[:-1].strip() == "", text


@pytest.mark.parametrize("name", CLI_FILES)
def test_cli_reports_diagnostic(name: str):
    pytest.importorskip("tkc.cli")
    path = BAD / name
    line, col, message, _ = expectation(path)
    launcher = "import sys; from tkc.cli import main; sys.exit(main())"  # what the 'tkc' script runs
    proc = subprocess.run([sys.executable, "-c", launcher, "compile", str(path)],
                          capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert f"{path}:{line}:{col}:" in proc.stderr, output
    assert message in proc.stderr, output
    assert "Traceback" not in output, output


# ------------------------------------------------------------------ regressions
# Bugs the corpus found that show up as wrong code rather than as a wrong error.

def _ops(source: str) -> list:
    from tkc.frontend import compile_source

    return list(compile_source(source, "t.tk").walk())


def test_slice_argument_uses_the_callers_names():
    # the helper's own 'i' must not leak into the slice written by the caller
    ops = _ops("""\
def pick(t, i):
    return t

@kernel
def k(x: f32[M, N], y: f32[M, N], BM: const = 64):
    grid(1)
    i = program_id(0)
    y[i*BM:(i+1)*BM, 0:64] = pick(x[i*BM:(i+1)*BM, 0:64], 5)
""")
    load = next(op for op in ops if op.name == "tile.load")
    row = load.operands[1].owner
    assert row.name == "tile.mul"
    assert {o.owner.name for o in row.operands} == {"tile.program_id", "tile.constant"}


def test_invert_of_an_int_constant_is_bitwise():
    ops = _ops("""\
@kernel
def k(y: i32[N]):
    grid(1)
    y[0] = ~5
""")
    assert [op.attributes["value"] for op in ops if op.name == "tile.constant"][-1] == -6


@pytest.mark.parametrize("then, orelse, use", [("1", "2.0", "a"), ("2.0", "1", "a"),
                                               ("(1, 2)", "(1, 2)", "a[0]")])
def test_runtime_if_merges_constants(then: str, orelse: str, use: str):
    # int/float constants merge as f32 whichever branch has the float; equal tuples stay usable
    _ops(f"""\
@kernel
def k(y: f32[N], flag: i32):
    grid(1)
    if flag != 0:
        a = {then}
    else:
        a = {orelse}
    y[0] = {use} * 1.0
""")


@pytest.mark.parametrize("expr", ["ones([16], bool)", "zeros([16, 16], bool)", "max(t, axis=1)",
                                  "min(t, keepdim=True, axis=0)"])
def test_documented_builtin_forms_compile(expr: str):
    # these used to fail with 'constant 1 mixed with i1 values' / "max() has no argument 'axis'"
    _ops(f"""\
@kernel
def k(x: f32[M, N]):
    grid(1)
    t = x[0:16, 0:16]
    a = {expr}
""")


def test_a_python_variable_in_a_kernel_says_the_kernel_does_not_see_it(tmp_path: Path) -> None:
    import importlib.util

    import numpy as np

    import tkc
    from tkc.errors import TkcNameError

    path = tmp_path / "kernel_with_a_global.py"
    path.write_text("from __future__ import annotations\nimport tkc\nSCALE = 3.0\n\n\n@tkc.kernel\n"
                    "def k(x: f32[N], y: f32[N], BN: const = 64):\n    grid(cdiv(N, BN))\n    i = program_id(0)\n"
                    "    y[i*BN:(i+1)*BN] = x[i*BN:(i+1)*BN] * SCALE\n")
    spec = importlib.util.spec_from_file_location("kernel_with_a_global", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(TkcNameError) as e:
        tkc.interpret(module.k, np.zeros(64, np.float32), np.zeros(64, np.float32))
    assert "name 'SCALE' is not defined in the kernel: an @tkc.kernel function sees none of Python's names" \
        in e.value.message
    assert (e.value.loc.line, e.value.loc.col) == (10, 43)


def test_a_kernel_with_quoted_annotations_runs(tmp_path: Path) -> None:
    """Under @tkc.kernel a string annotation is the type it holds (it was refused: "cannot read
    the type of parameter 'x'"), with no `from __future__ import annotations` needed."""
    import importlib.util

    import torch

    import tkc

    path = tmp_path / "quoted.py"
    path.write_text("import tkc\n\n\n@tkc.kernel\n"
                    "def k(x: \"f32[N]\", y: 'f32[N]', s: \"f32\", BN: \"const\" = 64):\n"
                    "    grid(cdiv(N, BN))\n    i = program_id(0)\n"
                    "    y[i*BN:(i+1)*BN] = x[i*BN:(i+1)*BN] * s\n")
    spec = importlib.util.spec_from_file_location("quoted", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x, y = torch.randn(70), torch.zeros(70)
    tkc.interpret(module.k, x, y, 3.0)
    torch.testing.assert_close(y, x * 3.0)
