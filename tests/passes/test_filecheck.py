"""The tiny FileCheck used by the pass tests catches what it should."""

from __future__ import annotations

import pytest
from filecheck import check

OUT = "a = 1\nb = 2\nc = 3\n"


@pytest.mark.parametrize("checks", [
    "// CHECK: a = 1\n// CHECK: c = 3",
    "// CHECK: a = 1\n// CHECK-NEXT: b = 2\n// CHECK-NEXT: c",
    "// CHECK: a\n// CHECK-NOT: x\n// CHECK: c",
    "// CHECK: b\n// CHECK-NOT: a",
    "// CHECK: = 1\n// CHECK: = 2",
])
def test_passes(checks: str) -> None:
    check(OUT, checks)


@pytest.mark.parametrize("checks,why", [
    ("// CHECK: c = 3\n// CHECK: a = 1", "'a = 1' not found"),
    ("// CHECK: a = 1\n// CHECK-NEXT: c = 3", "not on the next line"),
    ("// CHECK: a\n// CHECK-NOT: b\n// CHECK: c", "CHECK-NOT: 'b' found"),
    ("// CHECK: b\n// CHECK-NOT: c", "CHECK-NOT: 'c' found"),
    ("no directives here", "no CHECK directives"),
])
def test_fails(checks: str, why: str) -> None:
    with pytest.raises(AssertionError, match=why):
        check(OUT, checks)
