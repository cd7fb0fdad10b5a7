"""Targets are values: the passes and codegen read the hardware from one, and name none."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from tkc.compiler import compile_kernel
from tkc.errors import TkcPassError
from tkc.target import DEFAULT_TARGET, TARGETS, target

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
#: What an architecture's name looks like: sm_90a, sm_100a, gfx942.
ARCH = re.compile(r"\b(sm_\d+a?|gfx\d+)\b")


def test_the_default_is_hopper() -> None:
    t = target("sm_90a")
    assert DEFAULT_TARGET is t and t.dialect == "hopper" and TARGETS["sm_100a"].dialect == "blackwell"
    assert (t.max_smem_bytes, t.register_file, t.max_registers, t.warpgroup, t.mma_rows) == (232448, 65536, 255,
                                                                                           128, 64)
    assert t.smem_per_program(2) == 115712 and t.programs_by_smem(115712) == 2
    assert hash(t) == hash(dataclasses.replace(t))


@pytest.mark.parametrize("path", sorted([*(ROOT / "tkc" / "passes").glob("*.py"),
                                         *(ROOT / "tkc" / "codegen").glob("*.py")]), ids=lambda p: p.name)
def test_no_pass_or_codegen_module_names_an_architecture(path: Path) -> None:
    """Strings in code (not comments or docstrings) never name a target: the pass or codegen
    reads what it needs from the Target it is given."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    named = [(node.lineno, node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
             and ARCH.search(node.value)]
    assert not named, f"{path.name} names an architecture: {named}"


def test_the_target_reaches_the_passes() -> None:
    """pipeline-loops sizes the ring and allocate-smem checks it against the target's shared
    memory: less of it, fewer stages, and an error naming what the target has."""
    full = compile_kernel(EXAMPLES / "gemm.tk", stop="hopper", cache=False)
    small = compile_kernel(EXAMPLES / "gemm.tk", stop="hopper", cache=False,
                           target=dataclasses.replace(DEFAULT_TARGET, max_smem_bytes=100 * 1024))
    assert small.smem_bytes < 100 * 1024 < full.smem_bytes
    with pytest.raises(TkcPassError, match="sm_90a has 40960"):
        compile_kernel(EXAMPLES / "gemm.tk", stop="hopper", cache=False,
                       target=dataclasses.replace(DEFAULT_TARGET, max_smem_bytes=40 * 1024))


def test_the_target_and_the_options_are_in_the_cache_key(tmp_path: Path) -> None:
    src = EXAMPLES / "gemm.tk"
    keys = {compile_kernel(src, stop="tkir", cache_dir=tmp_path).cache_key,
            compile_kernel(src, stop="tkir", cache_dir=tmp_path,
                           target=dataclasses.replace(DEFAULT_TARGET, register_file=32768)).cache_key,
            compile_kernel(src, {"stages": 2}, stop="tkir", cache_dir=tmp_path).cache_key}
    assert len(keys) == 3 and None not in keys
