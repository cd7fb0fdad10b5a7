"""The shipped operators' kernels have one home, tkc/ops/kernels (package data), and
examples/ links to each, so the examples' tests and benchmarks read the same file."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "tkc" / "ops" / "kernels"


def test_examples_link_to_the_shipped_kernels() -> None:
    shipped = sorted(p for p in KERNELS.iterdir() if p.suffix in (".tk", ".py") and p.name != "__init__.py")
    assert shipped
    for p in shipped:
        link = ROOT / "examples" / p.name
        assert link.is_symlink() and link.resolve() == p.resolve(), link
