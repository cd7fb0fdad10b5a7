"""``tkc compile EXAMPLE --dump-ir-after=all`` shows the IR after each pass of the
default pipeline, and every dump -- on stderr or as numbered files -- parses back
into IR that verifies and prints identically."""

from __future__ import annotations

import pathlib
import re

import pytest
from click.testing import CliRunner

from tkc.cli import cli
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify
from tkc.passes.pipeline import DEFAULT_PIPELINE

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[2] / "examples").glob("*.tk"))
PASSES = DEFAULT_PIPELINE.split(",")
HEADER = re.compile(r"^// -----// IR Dump After (\S+) .*$", re.M)


def reparses(text: str, name: str) -> None:
    m = parse_module(text, name)
    verify(m)
    assert print_module(m) == print_module(parse_module(print_module(m)))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_dump_after_all_on_stderr(example: pathlib.Path) -> None:
    r = CliRunner().invoke(cli, ["compile", str(example), "--dump-ir-after=all", "-o", "-"])
    assert r.exit_code == 0, r.stderr
    assert HEADER.findall(r.stderr) == PASSES
    dumps = HEADER.split(r.stderr)[2::2]
    for name, text in zip(PASSES, dumps):
        reparses(text, f"{example.name} after {name}")
    assert dumps[-1].strip() == r.stdout.strip()  # the last dump is what compile printed


# The files are the stderr dumps above, written by one mechanism whatever the example: three
# examples by default, every one with --slow.
@pytest.mark.parametrize("example", [pytest.param(p, marks=() if p.name in ("gemm.tk", "attn_train.tk", "fftconv.tk")
                                                  else pytest.mark.slow) for p in EXAMPLES], ids=lambda p: p.name)
def test_dump_dir_files(example: pathlib.Path, tmp_path: pathlib.Path) -> None:
    r = CliRunner().invoke(cli, ["compile", str(example), "--dump-dir", str(tmp_path), "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.stderr
    files = sorted(p.name for p in tmp_path.glob("*.tkir"))
    assert files == ["00-input.tkir"] + [f"{i:02d}-{p}.tkir" for i, p in enumerate(PASSES, 1)]
    for f in files:
        reparses((tmp_path / f).read_text(), f)
