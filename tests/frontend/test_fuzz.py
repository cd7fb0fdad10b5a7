"""No tracebacks: mutants of the example kernels either compile or fail with a
located TkcError.

Each mutant is an example from ``examples/*.tk`` with one to three small
edits: a token, line or character deleted, a line duplicated, two tokens
swapped, a name replaced by another name of the file, a number replaced, an
indentation changed, an operator replaced.  Any other exception -- or a
TkcError without a location, or one that says the frontend built invalid IR --
is a frontend bug, and the failure prints the mutant.
"""

from __future__ import annotations

import random
import re
import traceback
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkc.errors import TkcError, TkcUsageError, TkcVerifyError
from tkc.frontend import compile_source

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.tk"))
SOURCES = {p.name: p.read_text(encoding="utf-8") for p in EXAMPLES}
FILE = "<mutant>"

TOKEN = re.compile(r"""
    (?P<name>[A-Za-z_]\w*)
  | (?P<number>\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?)
  | (?P<op>\*\*=?|//=?|<=|>=|==|!=|[-+*/%@&|^]=|[-+*/%@&|^~<>=])
  | (?P<punct>[()\[\]:,.])
""", re.VERBOSE)
NUMBERS = ["0", "1", "17", "-3", "1.5"]
OPERATORS = ["+", "-", "*", "/", "//", "%", "@", "**", "<", "<=", ">", ">=", "==", "!=",
             "&", "|", "^", "=", "+=", "-=", "*=", "@=", ".", ","]
KINDS = ["delete_token", "delete_line", "delete_char", "duplicate_line", "swap_tokens",
         "replace_name", "replace_number", "indent", "replace_operator"]
# edits that usually keep the text parseable come up more often, so that most
# mutants reach the type checker rather than stopping in the parser
WEIGHTED = KINDS + ["swap_tokens", "duplicate_line"] + ["replace_name", "replace_number", "replace_operator"] * 3


def _tokens(src: str, group: str | None = None) -> list[re.Match]:
    """Code tokens (comments skipped), optionally only those of one group."""
    out = []
    for line_match in re.finditer(r"[^\n]*", src):
        line = line_match.group()
        code_end = line.find("#")
        code_end = len(line) if code_end < 0 else code_end
        for m in TOKEN.finditer(line, 0, code_end):
            if group is None or m.lastgroup == group:
                out.append((line_match.start() + m.start(), line_match.start() + m.end(), m.group(),
                            m.lastgroup))
    return out


def mutate(src: str, kind: str, rng: random.Random) -> str:
    """One edit of ``src``; returns ``src`` unchanged when the edit has nothing to act on."""
    lines = src.split("\n")
    if kind in ("delete_line", "duplicate_line", "indent"):
        i = rng.randrange(len(lines))
        if kind == "delete_line":
            del lines[i]
        elif kind == "duplicate_line":
            lines.insert(i, lines[i])
        else:
            line = lines[i]
            stripped = line.lstrip(" ")
            depth = len(line) - len(stripped)
            new = rng.choice([0, 1, 2, depth - 4, depth + 4, depth + 1, depth - 1])
            lines[i] = " " * max(new, 0) + stripped if rng.random() < 0.9 else "\t" + stripped
        return "\n".join(lines)
    if kind == "delete_char":
        if not src:
            return src
        i = rng.randrange(len(src))
        return src[:i] + src[i + 1:]
    group = {"replace_name": "name", "replace_number": "number", "replace_operator": "op"}.get(kind)
    toks = _tokens(src, group)
    if kind == "replace_operator":
        toks += _tokens(src, "punct")
    if not toks:
        return src
    a, b, text, _ = rng.choice(toks)
    if kind == "delete_token":
        return src[:a] + src[b:]
    if kind == "swap_tokens":
        c, d, other, _ = rng.choice(toks)
        if (c, d) == (a, b):
            return src
        (a, b, text), (c, d, other) = sorted([(a, b, text), (c, d, other)])
        return src[:a] + other + src[b:c] + text + src[d:]
    if kind == "replace_name":
        names = sorted({t for _, _, t, _ in toks})
        return src[:a] + rng.choice(names) + src[b:]
    if kind == "replace_number":
        return src[:a] + rng.choice(NUMBERS) + src[b:]
    return src[:a] + rng.choice(OPERATORS) + src[b:]


def check(mutant: str, what: str) -> None:
    """Compile ``mutant``: success or a located TkcError; anything else fails with the mutant."""
    try:
        compile_source(mutant, FILE)
    except TkcVerifyError as e:  # the frontend handed the verifier bad IR
        pytest.fail(f"{what}: the frontend built invalid IR: {e}\n--- mutant ---\n{mutant}")
    except TkcUsageError:
        return  # a usage error may be unlocated
    except TkcError as e:
        lines = mutant.splitlines() + [""]  # an error at the end of the text may sit just past it
        if e.loc is None or e.loc.file != FILE or not 1 <= e.loc.line <= len(lines) \
                or not 1 <= e.loc.col <= len(lines[e.loc.line - 1]) + 1:
            pytest.fail(f"{what}: {type(e).__name__} without a proper location ({e.loc!r}): "
                        f"{e.message}\n--- mutant ---\n{mutant}")
        str(e)  # rendering must not fail either
    except Exception:
        pytest.fail(f"{what}: not a TkcError:\n{traceback.format_exc()}--- mutant ---\n{mutant}")


def make_mutant(name: str, edits: list[tuple[str, int]]) -> str:
    src = SOURCES[name]
    for kind, seed in edits:
        src = mutate(src, kind, random.Random(seed))
    return src


def test_examples_compile():
    assert SOURCES, "no examples found"
    for name, src in SOURCES.items():
        compile_source(src, name)


def test_fixed_seed_batch():
    rng = random.Random(20240611)
    names = sorted(SOURCES)
    for i in range(300):
        name = names[i % len(names)]
        edits = [(rng.choice(WEIGHTED), rng.randrange(2**32)) for _ in range(rng.choice([1, 1, 2, 3]))]
        check(make_mutant(name, edits), f"mutant {i} of {name} {edits}")


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(name=st.sampled_from(sorted(SOURCES)),
       edits=st.lists(st.tuples(st.sampled_from(WEIGHTED), st.integers(0, 2**32 - 1)), min_size=1, max_size=3))
def test_hypothesis_mutants(name: str, edits: list[tuple[str, int]]):
    check(make_mutant(name, edits), f"{name} {edits}")
