"""A tiny FileCheck: ordered substring patterns, written as comments in a test file.

Directives (one per line, anywhere in the file, usually in ``//`` comments):

    CHECK: text        -- ``text`` occurs after the previous match
    CHECK-NEXT: text   -- ``text`` occurs on the line right after the previous match
    CHECK-NOT: text    -- ``text`` does not occur between the previous match and
                          the next positive match (or the end of the output)

Matching is plain substring search (surrounding whitespace of a pattern is
ignored).  ``check`` raises AssertionError saying which directive failed and
where in the output it looked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DIRECTIVE = re.compile(r"\b(CHECK(?:-NEXT|-NOT)?):(.*)$")


@dataclass(frozen=True)
class Directive:
    kind: str  # "CHECK", "CHECK-NEXT" or "CHECK-NOT"
    pattern: str
    line: int  # 1-based line in the test file


def directives(test_text: str) -> list[Directive]:
    out = []
    for n, line in enumerate(test_text.splitlines(), 1):
        m = _DIRECTIVE.search(line)
        if m:
            out.append(Directive(m.group(1), m.group(2).strip(), n))
    return out


def check(output: str, test_text: str, test_name: str = "<test>") -> None:
    """Match ``output`` against the directives in ``test_text``."""
    ds = directives(test_text)
    if not ds:
        raise AssertionError(f"{test_name}: no CHECK directives")
    pos = 0
    nots: list[Directive] = []

    def fail(d: Directive, why: str, at: int) -> AssertionError:
        context = output[at:at + 400]
        return AssertionError(f"{test_name}:{d.line}: {d.kind}: {d.pattern!r} {why}\n"
                              f"--- output from there ---\n{context}\n--- full output ---\n{output}")

    def check_nots(start: int, end: int) -> None:
        for d in nots:
            hit = output.find(d.pattern, start, end)
            if hit >= 0:
                raise fail(d, "found", hit)
        nots.clear()

    for d in ds:
        if d.kind == "CHECK-NOT":
            nots.append(d)
            continue
        if d.kind == "CHECK":
            hit = output.find(d.pattern, pos)
            if hit < 0:
                raise fail(d, "not found", pos)
        else:
            nl = output.find("\n", pos)
            start = len(output) if nl < 0 else nl + 1
            end = output.find("\n", start)
            end = len(output) if end < 0 else end
            hit = output.find(d.pattern, start, end)
            if hit < 0:
                raise fail(d, "not on the next line", start)
        check_nots(pos, hit)
        pos = hit + len(d.pattern)
    check_nots(pos, len(output))
