"""Runs every ``.tkir`` under tests/passes/ whose first line is
``// RUN: tkc opt %s <flags>`` through the CLI and matches the output against
the file's CHECK comments (see tests/filecheck.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from filecheck import check

from tkc.cli import cli
from tkc.ir.parser import parse_module
from tkc.ir.verifier import verify

HERE = Path(__file__).parent
RUN = "// RUN: tkc "


def _cases() -> list[Path]:
    return sorted(p for p in HERE.rglob("*.tkir") if p.read_text().startswith(RUN))


@pytest.mark.parametrize("path", _cases(), ids=lambda p: str(p.relative_to(HERE)))
def test_case(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # reproducers, if any, land in the scratch dir
    text = path.read_text()
    args = [str(path) if a == "%s" else a for a in shlex.split(text.splitlines()[0][len(RUN):])]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    check(result.stdout, text, str(path.relative_to(HERE)))
    verify(parse_module(result.stdout, "<output>"))  # what a pass prints reads back


def test_there_are_cases() -> None:
    assert len(_cases()) >= 10
