"""Reads the textual IR written by ``printer.py`` back into a ``Module``.

Errors are ``TkcSyntaxError`` located in the ``.tkir`` text.  Ops without a
``loc(...)`` get their position in the ``.tkir`` file as their location.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tkc import dtypes
from tkc.errors import Loc, TkcSyntaxError
from tkc.ir.core import OPS, Block, Module, Operation, Region, Value
from tkc.ir.types import LAYOUT_PARSERS, MBARRIER, ScalarType, TensorType, TileType, Type

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r\n]+|//[^\n]*)
  | (?P<type>(?:tile|tensor)<)
  | (?P<value>%[\w.$-]+)
  | (?P<sym>@[\w.$]+)
  | (?P<layout>\#[A-Za-z_]\w*)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<number>-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+))
  | (?P<ident>-?[A-Za-z_][\w.]*)
  | (?P<punct>[(){}\[\],=:^<>])
    """,
    re.VERBOSE,
)


class _Tok:
    __slots__ = ("kind", "text", "pos")

    def __init__(self, kind: str, text: str, pos: int):
        self.kind, self.text, self.pos = kind, text, pos


class _Parser:
    def __init__(self, text: str, file: str):
        self.text, self.file = text, file
        self.toks = self._lex()
        self.i = 0
        self.scopes: list[dict[str, Value]] = []

    # ----------------------------------------------------------------- lexing
    def _loc(self, pos: int) -> Loc:
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return Loc(self.file, line, col, self.text)

    def _lex(self) -> list[_Tok]:
        toks, pos, n = [], 0, len(self.text)
        while pos < n:
            m = _TOKEN.match(self.text, pos)
            if not m:
                raise TkcSyntaxError(f"invalid character {self.text[pos]!r}", self._loc(pos))
            kind = m.lastgroup
            if kind == "type":
                end = self._balanced(m.end() - 1)
                toks.append(_Tok("type", self.text[pos:end], pos))
                pos = end
                continue
            if kind == "layout" and self.text.startswith("<", m.end()):
                end = self._balanced(m.end())
                toks.append(_Tok("layout", self.text[pos:end], pos))
                pos = end
                continue
            if kind != "ws":
                toks.append(_Tok(kind, m.group(), pos))
            pos = m.end()
        toks.append(_Tok("eof", "", n))
        return toks

    def _balanced(self, open_pos: int) -> int:
        """Index just past the '>' that closes the '<' at ``open_pos``."""
        depth = 0
        for j in range(open_pos, len(self.text)):
            c = self.text[j]
            if c == "<":
                depth += 1
            elif c == ">":
                depth -= 1
                if depth == 0:
                    return j + 1
            elif c == "\n":
                break
        raise TkcSyntaxError("unclosed '<'", self._loc(open_pos))

    # ---------------------------------------------------------------- helpers
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> _Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self) -> _Tok:
        t = self.toks[self.i]
        if t.kind != "eof":  # stay on the end: a caller may look at the next token after it
            self.i += 1
        return t

    def int_of(self, text: str, tok: _Tok) -> int:
        try:
            return int(text)
        except ValueError:  # past Python's limit on digits
            raise self.err(f"integer literal too long: {len(text)} digits", tok) from None

    def string_of(self, tok: _Tok) -> str:
        try:
            return json.loads(tok.text)
        except ValueError as e:  # bad escapes, raw control characters
            raise self.err(f"bad string literal: {e.msg}", tok) from None

    def err(self, msg: str, tok: _Tok | None = None) -> TkcSyntaxError:
        return TkcSyntaxError(msg, self._loc((tok or self.tok).pos))

    def at(self, text: str) -> bool:
        return self.tok.text == text and self.tok.kind in ("punct", "ident")

    def expect(self, text: str) -> _Tok:
        if not self.at(text):
            found = self.tok.text or "end of file"
            raise self.err(f"expected '{text}', found '{found}'")
        return self.next()

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.i += 1
            return True
        return False

    # ------------------------------------------------------------------ types
    def parse_type(self) -> Type:
        t = self.next()
        if t.kind == "type":
            return self._type_text(t)
        if t.kind == "ident":
            if t.text == "mbarrier":
                return MBARRIER
            dt = dtypes.from_name(t.text)
            if dt is not None:
                return ScalarType(dt)
        raise self.err(f"expected a type, found '{t.text or 'end of file'}'", t)

    def _type_text(self, t: _Tok) -> Type:
        body = t.text[t.text.index("<") + 1:-1]
        if t.text.startswith("tensor"):
            m = re.fullmatch(r"\s*(\w+)\s*\[(.*)\]\s*(@ranks)?\s*", body)
            dt = dtypes.from_name(m.group(1)) if m else None
            if not m or dt is None:
                raise self.err(f"malformed tensor type '{t.text}'", t)
            dims: list[str | int] = []
            for d in filter(None, (x.strip() for x in m.group(2).split(","))):
                if re.fullmatch(r"\d+", d):
                    dims.append(self.int_of(d, t))
                elif re.fullmatch(r"[^\W\d]\w*", d):  # an identifier, non-ASCII letters too
                    dims.append(d)
                else:
                    raise self.err(f"bad tensor dim '{d}'", t)
            return TensorType(dt, tuple(dims), m.group(3) is not None)
        parts = [p.strip() for p in _split_top(body)]
        m = re.fullmatch(r"((?:\d+x)+)(\w+)", parts[0])
        dt = dtypes.from_name(m.group(2)) if m else None
        if not m or dt is None:
            raise self.err(f"malformed tile type '{t.text}'", t)
        shape = tuple(self.int_of(s, t) for s in m.group(1).split("x")[:-1])
        space = layout = None
        for p in parts[1:]:
            if p.startswith("#"):
                layout = self._layout(p, t)
            elif re.fullmatch(r"[A-Za-z_]\w*", p) and space is None:
                space = p
            else:
                raise self.err(f"unexpected '{p}' in tile type", t)
        return TileType(shape, dt, space, layout)

    def _layout(self, text: str, t: _Tok) -> object:
        m = re.fullmatch(r"#(\w+)(?:<(.*)>)?", text, re.S)
        parse = LAYOUT_PARSERS.get(m.group(1)) if m else None
        if parse is None:
            raise self.err(f"unknown layout '{text}'", t)
        try:
            return parse(m.group(2) or "")
        except ValueError as e:
            raise self.err(f"bad layout '{text}': {e}", t) from None

    # ------------------------------------------------------------- attributes
    def parse_attr(self) -> Any:
        t = self.tok
        if t.kind == "number":
            self.next()
            return float(t.text) if any(c in t.text for c in ".eE") else self.int_of(t.text, t)
        if t.kind == "string":
            self.next()
            return self.string_of(t)
        if t.kind == "ident":
            consts = {"true": True, "false": False, "inf": float("inf"), "-inf": float("-inf"),
                      "nan": float("nan"), "-nan": float("nan")}
            if t.text in consts:
                self.next()
                return consts[t.text]
        if self.accept("["):
            items = []
            while not self.at("]"):
                items.append(self.parse_attr())
                if not self.accept(","):
                    break
            self.expect("]")
            return items
        if self.at("{"):
            return self.parse_attr_dict()
        raise self.err(f"expected an attribute value, found '{t.text or 'end of file'}'")

    def parse_attr_dict(self) -> dict[str, Any]:
        self.expect("{")
        out: dict[str, Any] = {}
        while not self.at("}"):
            key = self.next()
            if key.kind != "ident":
                raise self.err(f"expected an attribute name, found '{key.text}'", key)
            self.expect("=")
            out[key.text] = self.parse_attr()
            if not self.accept(","):
                break
        self.expect("}")
        return out

    # -------------------------------------------------------------------- ops
    def lookup(self, tok: _Tok) -> Value:
        name = tok.text[1:]
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise self.err(f"use of undefined value '%{name}'", tok)

    def define(self, tok: _Tok, v: Value) -> None:
        name = tok.text[1:]
        if any(name in s for s in self.scopes):
            raise self.err(f"redefinition of '%{name}'", tok)
        v.name_hint = name
        self.scopes[-1][name] = v

    def parse_module(self) -> Module:
        m = Module()
        while self.tok.kind != "eof":
            self.scopes = [{}]
            m.body.append(self.parse_op())
        return m

    def parse_op(self) -> Operation:
        start = self.tok
        result_toks: list[_Tok] = []
        if self.tok.kind == "value":
            result_toks.append(self.next())
            while self.accept(","):
                if self.tok.kind != "value":
                    raise self.err("expected a result name")
                result_toks.append(self.next())
            self.expect("=")
        name_tok = self.next()
        if name_tok.kind != "ident" or "." not in name_tok.text:
            raise self.err(f"expected an op name, found '{name_tok.text or 'end of file'}'", name_tok)
        cls = OPS.get(name_tok.text)
        if cls is None:
            raise self.err(f"unknown op '{name_tok.text}'", name_tok)
        attrs: dict[str, Any] = {}
        if self.tok.kind == "sym":
            attrs["sym_name"] = self.next().text[1:]
        operands: list[Value] = []
        if self.tok.kind == "value" and not self._at_result_list():
            operands.append(self.lookup(self.next()))
            while self.accept(","):
                if self.tok.kind != "value":
                    raise self.err("expected an operand")
                operands.append(self.lookup(self.next()))
        if self.at("{") and self.peek().kind == "ident" and self.peek(2).text == "=":
            attrs.update(self.parse_attr_dict())
        types: list[Type] = []
        if self.accept(":"):
            types.append(self.parse_type())
            while self.accept(","):
                types.append(self.parse_type())
        if len(types) != len(result_toks):
            raise self.err(f"'{name_tok.text}' names {len(result_toks)} results but gives "
                           f"{len(types)} types", start)
        loc = self._loc(start.pos)
        if self.at("loc"):
            loc = self.parse_loc()
        regions = []
        while self.at("{"):
            regions.append(self.parse_region())
        op = cls(operands, types, attrs, regions, loc)
        for t, r in zip(result_toks, op.results):
            self.define(t, r)
        return op

    def _at_result_list(self) -> bool:
        """Whether the values here are the results of the next op (``%a, %b = ...``), as after
        an op with neither operands nor anything else printed, e.g. a misplaced terminator."""
        k = 0
        while self.peek(k).kind == "value" and self.peek(k + 1).text == ",":
            k += 2
        return self.peek(k).kind == "value" and self.peek(k + 1).text == "="

    def parse_loc(self) -> Loc:
        self.expect("loc")
        self.expect("(")
        f = self.next()
        if f.kind != "string":
            raise self.err("expected a file name in loc(...)", f)
        self.expect(":")
        line = self.loc_int()
        self.expect(":")
        col = self.loc_int()
        self.expect(")")
        return Loc(self.string_of(f), line, col)

    def loc_int(self) -> int:
        t = self.next()
        if t.kind != "number" or any(c in t.text for c in ".eE"):
            raise self.err("expected loc(\"file\":line:col)", t)
        return self.int_of(t.text, t)

    def parse_region(self) -> Region:
        self.expect("{")
        block = Block()
        self.scopes.append({})
        if self.accept("^"):
            self.expect("(")
            while self.tok.kind == "value":
                vt = self.next()
                self.expect(":")
                self.define(vt, block.add_arg(self.parse_type()))
                if not self.accept(","):
                    break
            self.expect(")")
            self.expect(":")
        while not self.at("}"):
            if self.tok.kind == "eof":
                raise self.err("unexpected end of file: missing '}'")
            block.append(self.parse_op())
        self.expect("}")
        self.scopes.pop()
        return Region([block])


def _split_top(s: str) -> list[str]:
    """Split on commas not nested in <...>."""
    parts, depth, cur = [], 0, ""
    for c in s:
        depth += c == "<"
        depth -= c == ">"
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return parts


def parse_module(text: str, file: str = "<tkir>") -> Module:
    """Parse textual IR; raises TkcSyntaxError with a location in ``text``."""
    # Importing the dialects registers their ops.
    import tkc.ir.dialects  # noqa: F401
    import tkc.ir.layouts  # noqa: F401  (registers the layout parsers)

    return _Parser(text, file).parse_module()
