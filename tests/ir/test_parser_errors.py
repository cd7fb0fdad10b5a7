"""Malformed textual IR raises TkcSyntaxError at the right line:col, and nothing else.

Each case marks the expected error position with ``‸`` (removed before parsing).  The fuzz
tests mutate valid printed modules at random (deletions, insertions of IR tokens and stray
characters, duplications, truncations, line swaps) and require that ``parse_module``
followed by ``verify`` raises nothing but TkcError subclasses; when both succeed, the result
must print and round-trip like any valid module.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkc.errors import TkcError, TkcSyntaxError, TkcVerifyError
from tkc.ir.core import OPS
import tkc.ir.dialects  # noqa: F401  (registers the ops listed in OPS)
from tkc.ir.parser import parse_module
from tkc.ir.printer import print_module
from tkc.ir.verifier import verify

from .ir_strategies import modules

MARK = "‸"
DATA = Path(__file__).parent / "data"
GEMM = (DATA / "gemm.tkir").read_text()
LAYOUTS = (DATA / "layouts.tkir").read_text()  # tile types with spaces and layout attributes


def at(marked: str) -> tuple[str, int, int]:
    """The text without the marker, and the marker's 1-based line and column."""
    pos = marked.index(MARK)
    text = marked.replace(MARK, "", 1)
    line = marked.count("\n", 0, pos) + 1
    col = pos - (marked.rfind("\n", 0, pos) + 1) + 1
    return text, line, col


def k(body: str) -> str:
    """A kernel around ``body`` (lines indented by two) with a few values defined."""
    lines = "\n".join("  " + s for s in body.splitlines())
    return ("tile.kernel @k {\n^(%t: tensor<f32[M, 64]>, %n: i32):\n"
            "  %i = tile.constant {value = 1} : i32\n" + lines + "\n  tile.return\n}\n")


CASES: list[tuple[str, str, str]] = [  # (id, marked text, message regex)
    ("unknown-op", k("%x = ‸tile.frobnicate %i : i32"), r"unknown op 'tile.frobnicate'"),
    ("unknown-dialect", k("‸arith.addi %i, %i"), r"unknown op 'arith.addi'"),
    ("not-an-op-name", k("%x = ‸constant {value = 1} : i32"), r"expected an op name, found 'constant'"),
    ("number-as-op", k("‸42"), r"expected an op name, found '42'"),
    ("undefined-value", k("%x = tile.add %i, ‸%nope : i32"), r"use of undefined value '%nope'"),
    ("undefined-first", k("%x = tile.add ‸%nope, %i : i32"), r"use of undefined value '%nope'"),
    ("use-before-def", k("%x = tile.add %i, ‸%y : i32\n%y = tile.constant {value = 1} : i32"),
     r"use of undefined value '%y'"),
    ("self-use", k("%x = tile.add %i, ‸%x : i32"), r"use of undefined value '%x'"),
    ("out-of-region", k("tile.for %i, %i, %i {\n^(%iv: i32):\n  %in = tile.add %iv, %iv : i32\n"
                        "  tile.yield\n}\ntile.grid ‸%in"), r"use of undefined value '%in'"),
    ("iv-out-of-region", k("tile.for %i, %i, %i {\n^(%iv: i32):\n  tile.yield\n}\ntile.grid ‸%iv"),
     r"use of undefined value '%iv'"),
    ("other-kernel", "tile.kernel @a {\n  %x = tile.constant {value = 1} : i32\n  tile.return\n}\n"
                     "tile.kernel @b {\n  tile.grid ‸%x\n  tile.return\n}\n", r"undefined value '%x'"),
    ("redefinition", k("%x = tile.constant {value = 1} : i32\n‸%x = tile.constant {value = 2} : i32"),
     r"redefinition of '%x'"),
    ("redefine-param", k("‸%t = tile.constant {value = 2} : i32"), r"redefinition of '%t'"),
    ("redefine-in-region", k("tile.for %i, %i, %i {\n^(‸%i: i32):\n  tile.yield\n}"),
     r"redefinition of '%i'"),
    ("redefine-result", k("%x, ‸%x = tile.constant {value = 1} : i32, i32"), r"redefinition of '%x'"),
    ("redefine-arg", "tile.kernel @k {\n^(%a: i32, ‸%a: f32):\n  tile.return\n}\n", r"redefinition of '%a'"),
    ("bad-scalar-type", k("%x = tile.constant {value = 1} : ‸f33"), r"expected a type, found 'f33'"),
    ("bad-tile-dtype", k("%x = tile.constant {value = 1} : ‸tile<4xf33>"),
     r"malformed tile type 'tile<4xf33>'"),
    ("tile-without-shape", k("%x = tile.constant {value = 1} : ‸tile<f32>"), r"malformed tile type"),
    ("tile-bad-shape", k("%x = tile.constant {value = 1} : ‸tile<4x-1xf32>"), r"malformed tile type"),
    ("tile-extra", k("%x = tile.constant {value = 1} : ‸tile<4xf32, smem, reg>"),
     r"unexpected 'reg' in tile type"),
    ("unknown-layout", k("%x = tile.constant {value = 1} : ‸tile<4xf32, #nope<1, 2>>"),
     r"unknown layout '#nope<1, 2>'"),
    ("bad-tensor-dtype", "tile.kernel @k {\n^(%a: ‸tensor<q8[M]>):\n  tile.return\n}\n",
     r"malformed tensor type 'tensor<q8\[M\]>'"),
    ("bad-tensor-dim", "tile.kernel @k {\n^(%a: ‸tensor<f32[M, 4.5]>):\n  tile.return\n}\n",
     r"bad tensor dim '4.5'"),
    ("tensor-no-brackets", "tile.kernel @k {\n^(%a: ‸tensor<f32>):\n  tile.return\n}\n",
     r"malformed tensor type"),
    ("type-is-value", k("%x = tile.constant {value = 1} : ‸%i"), r"expected a type, found '%i'"),
    ("missing-type", k("‸%x = tile.constant {value = 1}\ntile.grid %i"), r"names 1 results but gives 0"),
    ("too-many-types", k("‸%x = tile.constant {value = 1} : i32, i32"), r"names 1 results but gives 2"),
    ("missing-colon-arg", "tile.kernel @k {\n^(%a ‸i32):\n  tile.return\n}\n", r"expected ':', found 'i32'"),
    ("unclosed-args", "tile.kernel @k {\n^(%a: i32\n  ‸tile.return\n}\n",
     r"expected '\)', found 'tile.return'"),
    ("args-without-colon", "tile.kernel @k {\n^(%a: i32)\n  ‸tile.return\n}\n",
     r"expected ':', found 'tile.return'"),
    ("missing-equals", k("%x ‸tile.constant {value = 1} : i32"), r"expected '=', found 'tile.constant'"),
    ("trailing-comma-results", k("%x, ‸= tile.constant {value = 1} : i32"), r"expected a result name"),
    ("trailing-comma-operands", k("%x = tile.add %i, ‸: i32"), r"expected an operand"),
    ("unclosed-brace", "tile.kernel @k {\n  %x = tile.constant {value = 1} : i32\n  tile.return\n‸",
     r"unexpected end of file: missing '}'"),
    ("unclosed-region", k("tile.for %i, %i, %i {\n^(%iv: i32):\n  tile.yield").rsplit("  tile.return", 1)[0]
     + "‸", r"unexpected end of file: missing '}'"),
    ("stray-close", k("tile.grid %i") + "‸}\n", r"expected an op name, found '}'"),
    ("unclosed-angle", k("%x = tile.constant {value = 1} : tile‸<4xf32\n"), r"unclosed '<'"),
    ("unclosed-angle-eof", "tile.kernel @k {\n^(%a: tensor‸<f32[M]", r"unclosed '<'"),
    ("attr-no-value", k("%x = tile.constant {value = ‸} : i32"),
     r"expected an attribute value, found '}'"),
    ("attr-double-comma", k("%x = tile.program_id {axis = 0, ‸, } : i32"),
     r"expected an attribute name, found ','"),
    ("attr-unclosed-list", k("%x = tile.load %t, %i, %i {box = [4, 4‸} : tile<4x4xf32>"),
     r"expected '\]', found '}'"),
    ("attr-unclosed-dict", k("%x = tile.program_id {axis = 0 ‸: i32"), r"expected '}', found ':'"),
    ("attr-missing-equals", k("%x = tile.load %t, %i, %i {box = [4, 4], squeeze ‸[0]} : tile<4xf32>"),
     r"expected '=', found '\['"),
    ("attr-bad-word", k("%x = tile.constant {value = ‸maybe} : i1"),
     r"expected an attribute value, found 'maybe'"),
    ("attr-value-is-value", k("%x = tile.constant {value = ‸%i} : i32"),
     r"expected an attribute value, found '%i'"),
    ("unterminated-string", k('%x = tile.cmp %i, %i {pred = ‸"lt} : i1'), r"invalid character '\"'"),
    ("garbage-dollar", k("%x = tile.constant {value = 1} : i32 ‸$$"), r"invalid character '\$'"),
    ("garbage-bang", k("‸!x"), r"invalid character '!'"),
    ("garbage-euro", k("%x = tile.constant {value = ‸€1} : i32"), r"invalid character '€'"),
    ("garbage-nul", k("%x = tile.constant {value = 1}‸\x00 : i32"), r"invalid character '\\x00'"),
    ("lone-percent", k("%x = tile.add ‸% i, %i : i32"), r"invalid character '%'"),
    ("lone-at", "tile.kernel ‸@ {\n  tile.return\n}\n", r"invalid character '@'"),
    ("lone-minus", k("%x = tile.constant {value = ‸- 1} : i32"), r"invalid character '-'"),
    ("truncated-after-colon", "tile.kernel @k {\n  %x = tile.constant {value = 1} : ‸",
     r"expected a type, found 'end of file'"),
    ("truncated-after-equals", "tile.kernel @k {\n  %x = ‸", r"expected an op name, found 'end of file'"),
    ("truncated-in-attrs", "tile.kernel @k {\n  %x = tile.constant {value = ‸",
     r"expected an attribute value, found 'end of file'"),
    ("truncated-attr-name", "tile.kernel @k {\n  %x = tile.program_id {axis = 0, ‸",
     r"expected an attribute name, found ''"),
    ("truncated-in-string", "tile.kernel @k {\n  %x = tile.cmp %i, %i {pred = ‸\"l", r"invalid character"),
    ("truncated-in-loc", 'tile.kernel @k {\n  tile.return loc("f.py":‸', r"expected loc"),
    ("truncated-loc-colon", 'tile.kernel @k {\n  tile.return loc("f.py":1‸', r"expected ':'"),
    ("truncated-loc-open", "tile.kernel @k {\n  tile.return loc(‸", r"expected a file name in loc"),
    ("truncated-results", "tile.kernel @k {\n  %x, ‸", r"expected a result name"),
    ("loc-float-line", k('tile.grid %i loc("f.py":‸1.5:2)'), r"expected loc\(\"file\":line:col\)"),
    ("loc-float-col", k('tile.grid %i loc("f.py":1:‸2e3)'), r"expected loc\(\"file\":line:col\)"),
    ("loc-no-file", k("tile.grid %i loc(‸f:1:2)"), r"expected a file name in loc"),
    ("loc-bad-escape", k('tile.grid %i loc(‸"f\\q.py":1:2)'), r"bad string"),
    ("loc-short-unicode", k('tile.grid %i loc(‸"f\\u12":1:2)'), r"bad string"),
    ("attr-raw-newline", k('%x = tile.cmp %i, %i {pred = ‸"l\nt"} : i1'), r"bad string"),
    ("attr-bad-escape", k('%x = tile.cmp %i, %i {pred = ‸"\\x41"} : i1'), r"bad string"),
    ("huge-int-attr", k("%x = tile.constant {value = ‸" + "9" * 5000 + "} : i32"), r"integer"),
    ("huge-tile-dim", k("%x = tile.constant {value = 1} : ‸tile<" + "9" * 5000 + "xf32>"), r"integer"),
    ("huge-loc-line", k('tile.grid %i loc("f":‸' + "9" * 5000 + ":1)"), r"integer"),
]


@pytest.mark.parametrize("marked, why", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_syntax_error_location(marked: str, why: str) -> None:
    text, line, col = at(marked)
    with pytest.raises(TkcSyntaxError) as info:
        parse_module(text, "bad.tkir")
    err = info.value
    assert re.search(why, err.message), err.message
    assert (err.loc.file, err.loc.line, err.loc.col) == ("bad.tkir", line, col), str(err)
    rendered = str(err)
    assert rendered.startswith(f"bad.tkir:{line}:{col}: error: ")
    # The snippet repeats the offending line with a caret under the column.
    if line <= len(text.splitlines()):
        src_line, caret = rendered.splitlines()[-2:] if "\n" in rendered else ("", "")
        assert caret.index("^") == col - 1, rendered


def test_cases_parse_once_fixed() -> None:
    """Sanity check of the kernel template: without the error it parses and verifies."""
    verify(parse_module(k("%x = tile.add %i, %i : i32")))


def test_error_in_second_kernel_counts_lines_from_the_file_start() -> None:
    text, line, col = at(GEMM + "tile.kernel @k2 {\n  %x = ‸tile.nope : i32\n  tile.return\n}\n")
    with pytest.raises(TkcSyntaxError, match="unknown op") as info:
        parse_module(text, "two.tkir")
    assert (info.value.loc.line, info.value.loc.col) == (line, col)


def test_empty_and_comment_only_inputs_are_empty_modules() -> None:
    for text in ("", "\n\n", "// nothing here\n", "   \t\r\n"):
        m = parse_module(text)
        assert m.ops == []
        verify(m)


# ------------------------------------------------------------------ fuzzing
VOCAB = [
    "{", "}", "(", ")", "[", "]", "<", ">", ",", "=", ":", "^", "^(", "%", "%0", "%x", "%i", "@", "@k",
    "#", "#blocked<1>", '"', "\\", "\n", " ", "  ", "loc(", 'loc("f":1:2)', 'loc("f":1.5:2)', '"\\q"',
    '"\\u12"', "1.5", "-", "-1", "0", "1e5", "1e999", "nan", "-inf", "true", "false", "tile<", ">",
    "tile<4xf32>", "tile<xf32>", "tile<0xi1>", "tensor<f32[M]>", "tensor<f32[]>", "f32", "i1", "i32",
    "bf16", "tile.add", "tile.for", "tile.if", "tile.yield", "tile.return", "tile.kernel", "tile.grid",
    "tile.load", "tile.bogus", "//", "\x00", "é", "€", "{axis = 0}", "{box = [4]}", "{squeeze = [\"a\"]}",
    "{value = []}", "{consts = {}}", "{sym_name = 1}", ": i32", ": tile<4x4xf32>", "%x = ", "9" * 4400,
    "\\u12", "\\x", "\\q", ":1.5", ":2e3",
]
_TOKEN = re.compile(r"""(?P<type>(?:tile|tensor)<[^<>\n]*>|\b(?:f32|f16|bf16|f8e4m3|f8e5m2|i32|i1)\b)
  | (?P<value>%[\w.$-]+) | (?P<sym>@[\w.$]+) | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<number>-?\d[\w.+-]*) | (?P<op>tile\.\w+) | (?P<word>-?[A-Za-z_]\w*) | (?P<punct>\S)""", re.X)
# Same-kind replacements keep the text parseable more often, so the verifier gets exercised.
KIND_VOCAB = {
    "type": ["i32", "i1", "f32", "f16", "bf16", "f8e4m3", "f8e5m2", "tile<4xf32>", "tile<64x64xf32>",
             "tile<64x32xbf16>", "tile<1x64xf16>", "tile<64xi1>", "tile<64x64xi32>", "tensor<f32[M, N]>",
             "tensor<i32[4]>", "tensor<bf16[]>"],
    "number": ["0", "1", "2", "3", "-1", "-2", "64", "1.5", "0.0", "1e-20"],
    "op": sorted(name for name in OPS if name.startswith("tile.")),
    "word": ["true", "false", "nan", "-inf", "axis", "box", "squeeze", "value", "kind", "pred", "other",
             "start", "consts", "sym_name", "loc"],
    "string": ['"sum"', '"max"', '"prod"', '"lt"', '"eq"', '"x"', '""'],
    "punct": [",", "{", "}", "[", "]", ":", "=", "(", ")"],
    "sym": ["@k", "@gemm"],
    "value": [],
}


@st.composite
def mutated(draw, base: st.SearchStrategy[str]) -> str:
    text = draw(base)
    for _ in range(draw(st.integers(1, 4))):
        n = len(text)
        i = draw(st.integers(0, n))
        j = draw(st.integers(i, min(n, i + 40)))
        kind = draw(st.sampled_from(["delete", "insert", "char", "dup", "truncate", "swap", "token",
                                     "same-kind", "same-kind", "same-kind"]))
        if kind == "delete":
            text = text[:i] + text[j:]
        elif kind == "insert":
            text = text[:i] + draw(st.sampled_from(VOCAB)) + text[i:]
        elif kind == "char":
            text = text[:i] + draw(st.characters(codec=None)) + text[i + 1:]
        elif kind == "dup":
            text = text[:j] + text[i:j] + text[j:]
        elif kind == "truncate":
            text = text[:i]
        elif kind == "swap":
            lines = text.split("\n")
            a = draw(st.integers(0, len(lines) - 1))
            b = draw(st.integers(0, len(lines) - 1))
            lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
        else:  # replace one token by a vocabulary word or another token of the text
            toks = list(_TOKEN.finditer(text))
            if not toks:
                continue
            t = draw(st.sampled_from(toks))
            if kind == "token":
                others = [m.group() for m in toks]
                other = draw(st.one_of(st.sampled_from(VOCAB), st.sampled_from(others)))
            else:
                same = [m.group() for m in toks if m.lastgroup == t.lastgroup] + KIND_VOCAB[t.lastgroup]
                other = draw(st.sampled_from(same))
            text = text[:t.start()] + other + text[t.end():]
    return text


def check_only_tkc_errors(text: str) -> None:
    try:
        m = parse_module(text, "fuzz.tkir")
    except TkcSyntaxError as e:
        assert e.loc is not None and e.loc.file == "fuzz.tkir"
        str(e)  # rendering the snippet must not fail either
        return
    try:
        verify(m)
    except TkcVerifyError as e:
        str(e)
        return
    # It parsed and verified: then it is a valid module and must round-trip.
    for locs in (True, False):
        printed = print_module(m, locs=locs)
        m2 = parse_module(printed, "fuzz2.tkir")
        verify(m2)
        assert print_module(m2, locs=locs) == printed


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
printed_modules = st.builds(print_module, modules(), st.booleans())


@FUZZ
@given(mutated(printed_modules))
def test_mutated_random_modules_raise_only_tkc_errors(text: str) -> None:
    check_only_tkc_errors(text)


@FUZZ
@given(mutated(st.sampled_from([GEMM, print_module(parse_module(GEMM, "gemm.tkir"), locs=True), LAYOUTS])))
def test_mutated_data_files_raise_only_tkc_errors(text: str) -> None:
    check_only_tkc_errors(text)


def test_tkc_error_is_the_only_exception_type_for_known_crashers() -> None:
    """Inputs that once escaped as ValueError/IndexError/TypeError from the parser or verifier."""
    crashers = [
        'tile.kernel @k {\n  tile.return loc("f.py":',      # IndexError: read past end of file
        'tile.kernel @k {\n  tile.return loc("f.py":1.5:2)\n}\n',  # ValueError: int("1.5")
        'tile.kernel @k {\n  tile.return loc("\\q":1:2)\n}\n',  # JSONDecodeError
        k("%x = tile.constant {value = " + "9" * 5000 + "} : i32"),  # int() digit limit
        k('%x = tile.load %t, %i, %i {box = [1, 4], squeeze = ["a"]} : tile<4xf32>'),  # TypeError
        k("%x = tile.load %t, %i, %i {box = [1, 4], squeeze = [0.5]} : tile<4xf32>"),  # TypeError
    ]
    for text in crashers:
        with pytest.raises(TkcError):
            verify(parse_module(text))
