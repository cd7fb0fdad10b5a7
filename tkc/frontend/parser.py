"""Source text to the syntax tree: ``parse(source, file, first_line=1) -> ast.Module``.

Owns the Lark parser built from ``tile.lark`` (the one grammar of the
language), the indentation post-lexer, the conversion of Lark's tree into
``tkc.frontend.ast`` with a ``Loc`` on every node, and the translation of every
failure into a located ``TkcSyntaxError`` -- or ``TkcUnsupportedError`` for
Python the tile language refuses.  No other exception leaves ``parse``.
"""

from __future__ import annotations

import ast as pyast
import functools
import hashlib
import os
import pickle
import threading
import warnings
from collections import OrderedDict
from pathlib import Path

from lark import Lark, Token, Transformer_NonRecursive, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.indenter import Indenter

from tkc.errors import Loc, TkcError, TkcSyntaxError, TkcUnsupportedError
from tkc.frontend import ast
from tkc.options import knobs

__all__ = ["parse"]

_NOT_SUPPORTED = "is not supported in tile kernels"
_ARE_NOT_SUPPORTED = "are not supported in tile kernels"

# Tokens no rule uses: the parser stops on them, and this says why.
_REFUSED = {
    **{kw.upper(): f"'{kw}' {_NOT_SUPPORTED}" for kw in (
        "lambda", "class", "try", "except", "finally", "with", "global", "nonlocal",
        "assert", "del", "yield", "async", "await", "raise")},
    "WALRUS": f"the ':=' operator {_NOT_SUPPORTED}",
    "LBRACE": f"dict and set literals {_ARE_NOT_SUPPORTED}",
    "IMAG_NUMBER": f"complex numbers {_ARE_NOT_SUPPORTED}",
    "ELLIPSIS": f"'...' {_NOT_SUPPORTED}",
}
_STARS = {"STAR", "POW"}  # '*x' / '**x' where an operand is expected
_PAIRS = {"(": ")", "[": "]", "{": "}"}


class _LexError(Exception):
    """An indentation or bracket error found by the post-lexer, before the parser sees it."""

    def __init__(self, message: str, line: int, col: int):
        super().__init__(message)
        self.message, self.line, self.col = message, line, col


class _Indenter(Indenter):
    """Python's INDENT/DEDENT rules, with two differences from lark's PythonIndenter:
    levels are compared as strings, so a tab/space mix is an error instead of a
    guess at tab stops; and the base level is the first code line's indentation,
    so a method's source from ``inspect.getsource`` parses without being shifted
    (its columns stay the file's columns)."""

    NL_type = "_NEWLINE"
    OPEN_PAREN_types = ["LPAR", "LSQB", "LBRACE"]
    CLOSE_PAREN_types = ["RPAR", "RSQB", "RBRACE"]
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 8
    # with the basic lexer this only keeps the refused terminals from being dropped
    always_accept = ("_NEWLINE", *_REFUSED)

    def __init__(self) -> None:
        super().__init__()
        self.margin = ""  # set by parse() for each run, under _LOCK
        self.text_len = 0
        self.brackets: list[Token] = []
        self.levels: list[str] = [""]

    def process(self, stream):
        self.brackets = []
        self.levels = [self.margin]
        return self._run(stream)

    def _run(self, stream):
        tok = None
        for tok in stream:
            if tok.type == self.NL_type:
                if not self.brackets:  # newlines inside brackets are plain whitespace
                    yield tok
                    yield from self._indentation(tok)
                continue
            if tok.type in self.OPEN_PAREN_types:
                self.brackets.append(tok)
            elif tok.type in self.CLOSE_PAREN_types and self.brackets:
                opened = self.brackets.pop()
                if _PAIRS[opened.value] != tok.value:
                    raise _LexError(f"closing '{tok.value}' does not match opening '{opened.value}'",
                                    tok.line, tok.column)
            yield tok
        if self.brackets:  # Python's message, rather than whatever token the parser sees next
            opened = self.brackets[-1]
            raise _LexError(f"'{opened}' was never closed", opened.line, opened.column)
        while len(self.levels) > 1:
            self.levels.pop()
            yield Token.new_borrow_pos(self.DEDENT_type, "", tok)

    def _indentation(self, nl: Token):
        if nl.end_pos >= self.text_len:  # blank lines at the end: EOF closes the blocks
            return
        indent = nl.value.rsplit("\n", 1)[1]
        levels = self.levels
        if indent == levels[-1]:
            return
        if indent.startswith(levels[-1]):
            levels.append(indent)
            yield self._at(self.INDENT_type, indent, nl)
        elif indent in levels:
            while levels[-1] != indent:
                levels.pop()
                yield self._at(self.DEDENT_type, indent, nl)
        elif "\t" in indent or any("\t" in lv for lv in levels):
            raise _LexError("inconsistent use of tabs and spaces in indentation", nl.end_line, nl.end_column)
        else:
            raise _LexError("unindent does not match any outer indentation level", nl.end_line, nl.end_column)

    @staticmethod
    def _at(kind: str, value: str, nl: Token) -> Token:
        # located at the first character of the new line, where Python points
        line, col, pos = nl.end_line, nl.end_column, nl.end_pos
        return Token(kind, value, pos, line, col, line, col, pos)


_LOCK = threading.Lock()  # the Lark object and its post-lexer keep per-parse state
#: The trees of the texts parsed last, by (text, file, first line): a file compiled again with
#: other constants (a sweep, the tests) parses once.  Parsing is pure Python (about 0.1 s for
#: an 8 KB file) and nothing after it changes a tree.
_TREES: OrderedDict[tuple[str, str, int], ast.Module] = OrderedDict()
_KEPT_TREES = 64
_PARSER: Lark | None = None
#: The disk cache's entry of a parsed file (tkc.runtime.cache, under TKC_CACHE_DIR): another
#: process reads the tree back in a tenth of a parse (``import tkc.ops`` parses 12 kernel files:
#: 1.4-2.0 s -> 0.9-1.1 s beyond torch's import on a 2-core CPU, benchmarks/RESULTS.md).
_TREE_ENTRY = "tree.pickle"


def _parser() -> Lark:
    global _PARSER
    if _PARSER is None:
        grammar = (Path(__file__).with_name("tile.lark")).read_text()
        _PARSER = Lark(grammar, parser="lalr", lexer="basic", postlex=_Indenter(),
                       propagate_positions=True, maybe_placeholders=True, **_tables_file())
    return _PARSER


def _tables_file() -> dict[str, str]:
    """Where Lark keeps its analysis of the grammar (the LALR tables: about 0.4 s to build,
    half of a first ``tkc compile``; milliseconds to load): a file in tkc's cache directory.
    Lark stores a hash of the grammar, its options and its own version with the tables and
    builds them again when any differs or the file cannot be read; with no writable cache
    directory they are built in every process."""
    folder = knobs().cache_dir / "parser"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return {}
    return {"cache": str(folder / "tile-lark-tables")}


class _Source:
    """Maps positions in the parsed text to ``Loc``s in the real file."""

    def __init__(self, source: str, file: str, first_line: int):
        self.text = source.removeprefix("\ufeff")  # a byte-order mark takes no column
        self.file = file
        self.offset = first_line - 1
        # Loc.snippet indexes lines from the file's start, so pad to the real line numbers
        self.shown = "\n" * self.offset + self.text

    def loc(self, line: int | None, col: int | None) -> Loc:
        return Loc(self.file, (line or 1) + self.offset, col or 1, self.shown)

    def end(self) -> Loc:
        """Just after the last character of the last non-empty line."""
        lines = self.text.rstrip("\n").split("\n")
        return self.loc(len(lines), len(lines[-1]) + 1)


class _Annotation(_Source):
    """The text of a string annotation (``x: "f32[N]"``), located in the file that holds it: at
    its own characters where the string is written plainly on one line, else at the string."""

    def __init__(self, text: str, outer: _Source, at: Loc, plain: bool):
        self.text, self.file, self.at, self.plain = text, outer.file, at, plain
        self.offset, self.shown = 0, at.source

    def loc(self, line: int | None, col: int | None) -> Loc:
        if not self.plain:
            return self.at
        return Loc(self.at.file, self.at.line, self.at.col + (col or 1), self.at.source)


def parse(source: str, file: str, first_line: int = 1) -> ast.Module:
    """Parse tile-language text.  ``first_line`` is the file line of the text's first
    line (for a function taken out of a Python file); the text may be indented as a
    whole.  Raises TkcSyntaxError or TkcUnsupportedError, and nothing else."""
    try:
        first_line = max(int(first_line), 1)
    except (TypeError, ValueError):
        first_line = 1
    key = (source, str(file), first_line) if isinstance(source, str) else None
    if key is not None:
        with _LOCK:
            tree = _TREES.get(key)
            if tree is not None:
                _TREES.move_to_end(key)
                return tree
    src = _Source(source if isinstance(source, str) else "", str(file), first_line)
    # Only the texts of files on disk are stored (a .tk file, a @tkc.kernel's module): a text
    # made up by a program (a test, a sweep) would fill the cache with trees nobody reads again.
    stored = _stored(key) if key is not None and os.path.isfile(key[1]) else None
    try:
        if not isinstance(source, str):
            raise TkcSyntaxError(f"source must be text, not {type(source).__name__}", src.loc(1, 1))
        tree = stored[1] if stored is not None and stored[1] is not None else _parse(src)
    except TkcError:
        raise
    except RecursionError:
        raise TkcSyntaxError("the source is nested too deeply", src.loc(1, 1)) from None
    except Exception as e:  # a bug in the parser must still surface as a located error
        raise TkcSyntaxError(f"internal parser error: {type(e).__name__}: {e}", src.loc(1, 1)) from e
    if stored is not None and stored[1] is None:
        _store(stored[0], tree)
    with _LOCK:
        _TREES[key] = tree
        if len(_TREES) > _KEPT_TREES:
            _TREES.popitem(last=False)
    return tree


@functools.lru_cache(maxsize=1)
def _tree_version() -> str:
    """What a stored tree depends on besides its text: the grammar, this module, the tree's
    classes (and Loc's), lark's version and Python's (pickle's format)."""
    import sys

    import lark

    h = hashlib.sha256()
    here = Path(__file__).parent
    for p in (here / "tile.lark", here / "parser.py", here / "ast.py", here.parent / "errors.py"):
        h.update(p.read_bytes() + b"\0")
    return f"{h.hexdigest()}+lark-{lark.__version__}+python-{sys.version}"


def _stored(key: tuple[str, str, int]) -> tuple[str, ast.Module | None] | None:
    """``(the disk cache's key for key, the tree stored under it or None)``; None where the
    cache cannot be used (a key it cannot make)."""
    from tkc.runtime import cache as disk

    source, file, first_line = key
    try:
        k = disk.key(_tree_version(), source, {}, "tree", {"file": file, "first_line": first_line})
    except TkcError:
        return None
    blob = disk.get(k, _TREE_ENTRY, knobs().cache_dir)
    if blob is None:
        return k, None
    try:
        tree = pickle.loads(blob)
    except Exception:  # an entry of another build of these classes: parse again, store anew
        return k, None
    return (k, tree) if isinstance(tree, ast.Module) else (k, None)


def _store(k: str, tree: ast.Module) -> None:
    from tkc.runtime import cache as disk

    try:
        blob = pickle.dumps(tree, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # a tree that does not pickle is simply not kept
        return
    with warnings.catch_warnings():  # an unwritable cache costs the next process a parse, no more
        warnings.simplefilter("ignore")
        disk.put(k, _TREE_ENTRY, blob, knobs().cache_dir)


def _parse(src: _Source) -> ast.Module:
    text = src.text if src.text.endswith("\n") else src.text + "\n"
    with _LOCK:
        lark = _parser()
        indenter: _Indenter = lark.options.postlex
        indenter.margin = _margin(text)
        indenter.text_len = len(text)
        try:
            tree = lark.parse(text)
        except UnexpectedInput as e:
            err = _syntax_error(e, src)
            if indenter.brackets:  # like Python, a bracket that is never closed explains the error
                try:
                    for _ in lark.lex(text):
                        pass
                except _LexError as le:
                    if le.message.endswith("was never closed"):
                        err = TkcSyntaxError(le.message, src.loc(le.line, le.col))
                except UnexpectedInput:
                    pass
            raise err from None
        except _LexError as e:
            raise TkcSyntaxError(e.message, src.loc(e.line, e.col)) from None
    try:
        body = _ToAst(src).transform(tree)
    except VisitError as e:
        raise e.orig_exc from None
    return ast.Module(body, src.file, src.text, loc=src.loc(1, 1))


def _margin(text: str) -> str:
    """The indentation of the first code line: the base level of the whole text."""
    for line in text.splitlines():
        code = line.lstrip(" \t")
        if code and not code.startswith("#"):
            return line[: len(line) - len(code)]
    return ""


_SPECIAL_TOKENS = {"$END": "end of file", "_NEWLINE": "end of line", "_INDENT": "indent",
                   "_DEDENT": "end of block"}


def _describe(tok: Token) -> str:
    if tok.type in _SPECIAL_TOKENS:
        return _SPECIAL_TOKENS[tok.type]
    text = str(tok)
    return repr(text if len(text) <= 20 else text[:17] + "...")


def _syntax_error(e: UnexpectedInput, src: _Source) -> TkcError:
    if isinstance(e, UnexpectedCharacters):
        char = src.text[e.pos_in_stream] if 0 <= e.pos_in_stream < len(src.text) else ""
        loc = src.loc(e.line, e.column)
        if char in "'\"":
            return TkcSyntaxError("unterminated string literal", loc)
        if char.isdigit():
            return TkcSyntaxError("invalid number literal", loc)
        if char == "\\":
            return TkcSyntaxError("unexpected character after line continuation character", loc)
        return TkcSyntaxError(f"invalid character {char!r}", loc)
    if not isinstance(e, UnexpectedToken):  # UnexpectedEOF: not raised by LALR, but be safe
        return TkcSyntaxError("unexpected end of file", src.end())
    tok, expected = e.token, e.expected or set()
    loc = src.end() if tok.type == "$END" else src.loc(tok.line, tok.column)
    if tok.type in _REFUSED:
        return TkcUnsupportedError(_REFUSED[tok.type], loc)
    if tok.type in _STARS and "NAME" in expected:
        return TkcUnsupportedError(f"'{tok}' unpacking and star-arguments {_ARE_NOT_SUPPORTED}", loc)
    if "_INDENT" in expected and len(expected) == 1:
        return TkcSyntaxError("expected an indented block", loc)
    if tok.type == "_INDENT":
        return TkcSyntaxError("unexpected indent", loc)
    if tok.type == "_NEWLINE" and "COLON" in expected:
        return TkcSyntaxError("expected ':'", loc)
    return TkcSyntaxError(f"unexpected {_describe(tok)}", loc)


# ------------------------------------------------------------ tree to syntax tree
_CANNOT_ASSIGN = {
    ast.Call: "a function call", ast.Num: "a literal", ast.Bool: "a literal", ast.Str: "a literal",
    ast.NoneLit: "None", ast.Compare: "a comparison", ast.IfExp: "a conditional expression",
}


def _check_target(node: ast.Expr, *, tuples: bool, subscripts: bool = True) -> ast.Expr:
    """Raise unless ``node`` may be assigned to (a Name, a Subscript, or a tuple of them)."""
    if isinstance(node, ast.Name) or (subscripts and isinstance(node, ast.Subscript)):
        return node
    if isinstance(node, ast.Tuple) and tuples:
        for elt in node.elts:
            _check_target(elt, tuples=True, subscripts=subscripts)
        return node
    if isinstance(node, ast.Attribute):
        raise TkcUnsupportedError(f"assigning to an attribute {_NOT_SUPPORTED}", node.loc)
    if isinstance(node, (ast.List, ast.Tuple, ast.Subscript)):
        kind = {ast.List: "a list", ast.Tuple: "a tuple", ast.Subscript: "a subscript"}[type(node)]
        raise TkcUnsupportedError(f"assigning to {kind} here {_NOT_SUPPORTED}", node.loc)
    raise TkcSyntaxError(f"cannot assign to {_CANNOT_ASSIGN.get(type(node), 'an expression')}", node.loc)


class _Else:
    """An 'else:' clause on its way into its If (loops refuse it)."""

    def __init__(self, body: list, loc: Loc):
        self.body, self.loc = body, loc


@v_args(meta=True)
class _ToAst(Transformer_NonRecursive):
    """Bottom-up: each method gets the rule's position (meta) and converted children.
    Non-recursive, so a long ``a + b + ...`` chain cannot exhaust Python's stack."""

    def __init__(self, src: _Source):
        super().__init__(visit_tokens=False)
        self.src = src

    def _loc(self, meta) -> Loc:
        return self.src.loc(meta.line, meta.column)

    def _tok_loc(self, tok: Token) -> Loc:
        return self.src.loc(tok.line, tok.column)

    # ------------------------------------------------------------ statements
    def start(self, meta, stmts):
        return stmts

    def suite(self, meta, stmts):
        return stmts

    def expr_stmt(self, meta, c):
        return ast.ExprStmt(c[0], loc=self._loc(meta))

    def assign(self, meta, c):
        *targets, value = c
        if len(targets) > 1:
            raise TkcUnsupportedError(f"chained assignment 'a = b = ...' {_NOT_SUPPORTED}", targets[1].loc)
        return ast.Assign(_check_target(targets[0], tuples=True), value, loc=self._loc(meta))

    def augassign(self, meta, c):
        target, op, value = c
        return ast.AugAssign(str(op)[:-1], _check_target(target, tuples=False), value, loc=self._loc(meta))

    def annassign(self, meta, c):
        target, annotation, value = c
        if not isinstance(target, ast.Name):
            raise TkcUnsupportedError(f"an annotation on anything but a plain name {_NOT_SUPPORTED}",
                                      target.loc)
        return ast.AnnAssign(target, self._annotation(annotation), value, loc=self._loc(meta))

    def _annotation(self, a: ast.Expr | None) -> ast.Expr | None:
        """A string annotation (``x: "f32[N]"``, as ``from __future__ import annotations`` or a
        forward reference writes it) read as the expression it holds; any other unchanged."""
        if not isinstance(a, ast.Str):
            return a
        raw = "" if isinstance(self.src, _Annotation) else \
            self.src.text.split("\n")[a.loc.line - self.src.offset - 1][a.loc.col - 1:]
        quote = raw[:1]
        plain = quote in ("'", '"') and raw[1:len(a.value) + 2] == a.value + quote
        try:
            body = _parse(_Annotation(a.value, self.src, a.loc, plain)).body
        except TkcError as e:
            raise type(e)(f"cannot read the annotation {a.value!r}: {e.message}", e.loc) from None
        if len(body) != 1 or not isinstance(body[0], ast.ExprStmt):
            raise TkcSyntaxError(f"cannot read the annotation {a.value!r} as a type; write a tensor like "
                                 f"'bf16[M, K]', a scalar dtype like 'f32', or 'const'", a.loc)
        return body[0].value

    def return_stmt(self, meta, c):
        return ast.Return(c[0], loc=self._loc(meta))

    def pass_stmt(self, meta, c):
        return ast.Pass(loc=self._loc(meta))

    def break_stmt(self, meta, c):
        return ast.Break(loc=self._loc(meta))

    def continue_stmt(self, meta, c):
        return ast.Continue(loc=self._loc(meta))

    def import_stmt(self, meta, c):
        text = " ".join(self.src.text[meta.start_pos:meta.end_pos].replace("\\\n", " ").split())
        return ast.Import(text, loc=self._loc(meta))

    def decorator(self, meta, c):
        return c[0]

    def funcdef(self, meta, c):
        i = next(i for i, x in enumerate(c) if isinstance(x, Token) and x.type == "DEF")
        decorators, (def_tok, name, params, returns, body) = c[:i], c[i:]
        return ast.FunctionDef(str(name), params or [], body, list(decorators), returns,
                               loc=self._tok_loc(def_tok))

    def params(self, meta, params):
        seen: set[str] = set()
        defaulted = False
        for p in params:
            if p.name in seen:
                raise TkcSyntaxError(f"duplicate parameter '{p.name}'", p.loc)
            seen.add(p.name)
            if defaulted and p.default is None:
                raise TkcSyntaxError("parameter without a default follows parameter with a default", p.loc)
            defaulted = p.default is not None
        return params

    def param(self, meta, c):
        name, annotation, default = c
        return ast.Param(str(name), self._annotation(annotation), default, loc=self._loc(meta))

    def if_stmt(self, meta, c):
        cond, body, *elifs, orelse = c
        orelse = orelse.body if orelse is not None else []
        for elif_cond, elif_body, loc in reversed(elifs):  # an elif is an If in the orelse
            orelse = [ast.If(elif_cond, elif_body, orelse, loc=loc)]
        return ast.If(cond, body, orelse, loc=self._loc(meta))

    def elif_clause(self, meta, c):
        return c[0], c[1], self._loc(meta)

    def else_clause(self, meta, c):
        return _Else(c[0], self._loc(meta))

    def _no_loop_else(self, orelse):
        if orelse is not None:
            raise TkcUnsupportedError(f"'else' on a loop {_NOT_SUPPORTED}", orelse.loc)

    def for_stmt(self, meta, c):
        target, iter_, body, orelse = c
        self._no_loop_else(orelse)
        return ast.For(_check_target(target, tuples=True, subscripts=False), iter_, body, loc=self._loc(meta))

    def while_stmt(self, meta, c):
        cond, body, orelse = c
        self._no_loop_else(orelse)
        return ast.While(cond, body, loc=self._loc(meta))

    # ----------------------------------------------------------- expressions
    def var(self, meta, c):
        return ast.Name(str(c[0]), loc=self._loc(meta))

    def number(self, meta, c):
        tok = c[0]
        text = str(tok)
        value = float(text) if tok.type == "FLOAT_NUMBER" else int(text, 0)
        return ast.Num(value, loc=self._loc(meta))

    def string(self, meta, toks):
        parts = []
        for tok in toks:
            text = str(tok)
            prefix = text[: len(text) - len(text.lstrip("rRbBuUfF"))].lower()
            if "f" in prefix:
                raise TkcUnsupportedError(f"f-strings {_ARE_NOT_SUPPORTED}", self._tok_loc(tok))
            if "b" in prefix:
                raise TkcUnsupportedError(f"bytes literals {_ARE_NOT_SUPPORTED}", self._tok_loc(tok))
            try:
                with warnings.catch_warnings():  # e.g. invalid escape sequences in a docstring
                    warnings.simplefilter("ignore")
                    parts.append(pyast.literal_eval(text))
            except (SyntaxError, ValueError):
                raise TkcSyntaxError("invalid string literal", self._tok_loc(tok)) from None
        return ast.Str("".join(parts), loc=self._loc(meta))

    def none(self, meta, c):
        return ast.NoneLit(loc=self._loc(meta))

    def true(self, meta, c):
        return ast.Bool(True, loc=self._loc(meta))

    def false(self, meta, c):
        return ast.Bool(False, loc=self._loc(meta))

    def tuple(self, meta, elts):
        return ast.Tuple(list(elts), loc=self._loc(meta))

    def list(self, meta, elts):
        return ast.List(list(elts), loc=self._loc(meta))

    def comprehension(self, meta, c):
        raise TkcUnsupportedError(f"comprehensions {_ARE_NOT_SUPPORTED}", self._loc(meta))

    def comp_for(self, meta, c):
        return None  # only reached inside a comprehension, which is refused

    def ifexp(self, meta, c):
        then, cond, orelse = c
        return ast.IfExp(cond, then, orelse, loc=self._loc(meta))

    def boolor(self, meta, c):
        return ast.BoolOp("or", c[0], c[1], loc=self._loc(meta))

    def booland(self, meta, c):
        return ast.BoolOp("and", c[0], c[1], loc=self._loc(meta))

    def boolnot(self, meta, c):
        return ast.UnaryOp("not", c[0], loc=self._loc(meta))

    def comp_op(self, meta, toks):
        return " ".join(str(t) for t in toks), self._loc(meta)

    def compare(self, meta, c):
        left, ops = c[0], c[1::2]
        for i, (op, loc) in enumerate(ops):
            if op in ("is", "is not"):
                raise TkcUnsupportedError(f"'{op}' {_NOT_SUPPORTED}; compare with '==' or '!='", loc)
            if op in ("in", "not in"):
                raise TkcUnsupportedError(f"the '{op}' operator {_NOT_SUPPORTED}", loc)
            if i > 0:
                raise TkcUnsupportedError("chained comparisons like 'a < b < c' are not supported in tile "
                                          "kernels; write '(a < b) and (b < c)'", loc)
        return ast.Compare(ops[0][0], left, c[2], loc=self._loc(meta))

    def binop(self, meta, c):
        left, op, right = c
        return ast.BinOp(str(op), left, right, loc=self._loc(meta))

    def unary(self, meta, c):
        op, operand = c
        return ast.UnaryOp(str(op), operand, loc=self._loc(meta))

    def call(self, meta, c):
        func, args = c
        args, keywords = args if args is not None else ([], [])
        return ast.Call(func, args, keywords, loc=self._loc(meta))

    def arguments(self, meta, items):
        args, keywords = [], []
        for item in items:
            if isinstance(item, ast.Keyword):
                if any(k.name == item.name for k in keywords):
                    raise TkcSyntaxError(f"keyword argument repeated: '{item.name}'", item.loc)
                keywords.append(item)
            elif keywords:
                raise TkcSyntaxError("positional argument follows keyword argument", item.loc)
            else:
                args.append(item)
        return args, keywords

    def kwarg(self, meta, c):
        name, value = c
        if not isinstance(name, ast.Name):
            raise TkcSyntaxError("a keyword argument must be a plain name (did you mean '=='?)", name.loc)
        return ast.Keyword(name.id, value, loc=self._loc(meta))

    def getattr(self, meta, c):
        return ast.Attribute(c[0], str(c[1]), loc=self._loc(meta))

    def subscript(self, meta, c):
        return ast.Subscript(c[0], c[1], loc=self._loc(meta))

    def subscripts(self, meta, items):
        return list(items)

    def slice(self, meta, c):
        lower, upper, step = c
        return ast.Slice(lower, upper, step, loc=self._loc(meta))
