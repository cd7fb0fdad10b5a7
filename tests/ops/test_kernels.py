"""Each kernel of the shipped operators is one file, in tkc/ops/kernels (package data; a wheel
carries a link's target), linked with examples/, so the examples' tests and benchmarks read
the same file the operators run."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "tkc" / "ops" / "kernels"


def test_each_shipped_kernel_is_one_file_linked_with_examples() -> None:
    shipped = sorted(p for p in KERNELS.iterdir() if p.suffix in (".tk", ".py") and p.name != "__init__.py")
    assert shipped
    for p in shipped:
        example = ROOT / "examples" / p.name
        assert p.is_symlink() != example.is_symlink(), f"{p.name}: one file and one link"
        assert p.resolve() == example.resolve(), p.name
