"""Tests of tkc.frontend.parser: the grammar, the syntax tree it builds, locations,
and that every bad input comes out as a located TkcSyntaxError/TkcUnsupportedError."""

from __future__ import annotations

import dataclasses
import random
import re
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkc.errors import Loc, TkcSyntaxError, TkcUnsupportedError
from tkc.frontend import ast
from tkc.frontend.parser import parse

GEMM = """\
@kernel
def gemm(a: bf16[M, K], b: bf16[K, N], c: bf16[M, N],
         BM: const = 128, BN: const = 128, BK: const = 64):
    grid(cdiv(M, BM), cdiv(N, BN))
    pm = program_id(0)
    pn = program_id(1)
    acc = zeros([BM, BN], f32)
    for k in range(cdiv(K, BK)):
        acc += a[pm*BM:(pm+1)*BM, k*BK:(k+1)*BK] @ b[k*BK:(k+1)*BK, pn*BN:(pn+1)*BN]
    c[pm*BM:(pm+1)*BM, pn*BN:(pn+1)*BN] = acc.to(bf16)
"""

ATTENTION = '''\
"""A module docstring."""
from __future__ import annotations
import tkc


@tkc.kernel(num_warps=4)
def attn(q: bf16[B, H, S, D], k: bf16[B, H, S, D], o: bf16[B, H, S, D],
         scale: f32, BM: const = 64, BN: const = 64, causal: const = False,):
    """Flash attention, forward."""
    grid(cdiv(S, BM), B * H)
    i = program_id(0)
    b, h = program_id(1) // H, program_id(1) % H
    qt = q[b, h, i*BM:(i+1)*BM, :]
    m = full([BM], -1e30, f32)
    l = zeros([BM], f32)
    acc = zeros([BM, D], f32)
    for j in range(0, cdiv(S, BN)):
        kt = load(k[b, h, j*BN:(j+1)*BN, :], other=0.0)
        s = (qt @ kt.T) * scale  # scores
        if causal and j * BN > i * BM:
            s = where(arange(BN)[None, :] + j*BN <= arange(BM)[:, None] + i*BM, s, -1e30)
        elif not causal:
            pass
        else:
            s = s * 1.0
        mn = maximum(m, s.max(1))
        p = exp(s - mn[:, None])
        l = l * exp(m - mn) + p.sum(1, keepdim=False)
        acc = acc * exp(m - mn)[:, None] + p.to(bf16) @ \\
            v[b, h, j*BN:(j+1)*BN, :]
        m = mn
    o[b, h, i*BM:(i+1)*BM, :] = (acc / l[:, None]).to(bf16)
'''


def expr(text: str) -> ast.Expr:
    (stmt,) = parse(f"x = {text}\n", "t.tk").body
    return stmt.value


def sx(node) -> str:
    """A compact s-expression of an expression, to check tree shapes."""
    if node is None:
        return "_"
    match node:
        case ast.Name(id=i):
            return i
        case ast.Num(value=v) | ast.Bool(value=v):
            return repr(v)
        case ast.Str(value=v):
            return repr(v)
        case ast.NoneLit():
            return "None"
        case ast.BinOp(op=op, left=a, right=b) | ast.Compare(op=op, left=a, right=b) | ast.BoolOp(
                op=op, left=a, right=b):
            return f"({op} {sx(a)} {sx(b)})"
        case ast.UnaryOp(op=op, operand=a):
            return f"({op} {sx(a)})"
        case ast.IfExp(cond=c, then=a, orelse=b):
            return f"(if {sx(c)} {sx(a)} {sx(b)})"
        case ast.Call(func=f, args=args, keywords=kws):
            parts = [sx(f)] + [sx(a) for a in args] + [f"{k.name}={sx(k.value)}" for k in kws]
            return "(call " + " ".join(parts) + ")"
        case ast.Attribute(value=v, attr=a):
            return f"(. {sx(v)} {a})"
        case ast.Subscript(value=v, index=idx):
            return "([] " + " ".join([sx(v)] + [sx(i) for i in idx]) + ")"
        case ast.Slice(lower=lo, upper=hi):
            return f"{sx(lo)}:{sx(hi)}"
        case ast.Tuple(elts=e):
            return "(tuple " + " ".join(map(sx, e)) + ")"
        case ast.List(elts=e):
            return "[" + " ".join(map(sx, e)) + "]"
    raise AssertionError(node)


def nodes(root):
    """Every Node under root (root included)."""
    stack = [root]
    while stack:
        n = stack.pop()
        if isinstance(n, list):
            stack.extend(n)
        elif isinstance(n, ast.Node):
            yield n
            stack.extend(getattr(n, f.name) for f in dataclasses.fields(n) if f.name != "loc")


def assert_located(module: ast.Module) -> None:
    nlines = module.source.count("\n") + 1
    for n in nodes(module):
        assert isinstance(n.loc, Loc), n
        assert 1 <= n.loc.line <= nlines and n.loc.col >= 1, (n, n.loc)


def error(src: str, first_line: int = 1):
    with pytest.raises((TkcSyntaxError, TkcUnsupportedError)) as info:
        parse(src, "t.tk", first_line=first_line)
    return info.value


# ------------------------------------------------------------------ programs
def test_gemm():
    m = parse(GEMM, "gemm.tk")
    assert m.file == "gemm.tk" and m.source == GEMM
    (fn,) = m.body
    assert isinstance(fn, ast.FunctionDef) and fn.name == "gemm"
    assert [sx(d) for d in fn.decorators] == ["kernel"]
    assert [(p.name, sx(p.annotation), sx(p.default)) for p in fn.params] == [
        ("a", "([] bf16 M K)", "_"), ("b", "([] bf16 K N)", "_"), ("c", "([] bf16 M N)", "_"),
        ("BM", "const", "128"), ("BN", "const", "128"), ("BK", "const", "64")]
    grid, pm, pn, acc, loop, store = fn.body
    assert sx(grid.value) == "(call grid (call cdiv M BM) (call cdiv N BN))"
    assert isinstance(pm, ast.Assign) and sx(pm.target) == "pm" and sx(pm.value) == "(call program_id 0)"
    assert sx(acc.value) == "(call zeros [BM BN] f32)"
    assert isinstance(loop, ast.For) and sx(loop.target) == "k"
    assert sx(loop.iter) == "(call range (call cdiv K BK))"
    (upd,) = loop.body
    assert isinstance(upd, ast.AugAssign) and upd.op == "+" and sx(upd.target) == "acc"
    assert sx(upd.value) == ("(@ ([] a (* pm BM):(* (+ pm 1) BM) (* k BK):(* (+ k 1) BK)) "
                             "([] b (* k BK):(* (+ k 1) BK) (* pn BN):(* (+ pn 1) BN)))")
    assert isinstance(store, ast.Assign) and isinstance(store.target, ast.Subscript)
    assert sx(store.value) == "(call (. acc to) bf16)"
    assert_located(m)


def at(src: str, line: int, needle: str, nth: int = 0) -> tuple[int, int]:
    """(line, col) of the nth occurrence of needle on a 1-based line of src."""
    text = src.splitlines()[line - 1]
    col = -1
    for _ in range(nth + 1):
        col = text.index(needle, col + 1)
    return line, col + 1


def pos(node) -> tuple[int, int]:
    return node.loc.line, node.loc.col


def test_gemm_locations():
    fn = parse(GEMM, "gemm.tk").body[0]
    assert fn.loc.file == "gemm.tk" and pos(fn) == (2, 1)  # the 'def', not the decorator
    assert pos(fn.decorators[0]) == (1, 2)
    bm = fn.params[3]
    assert pos(bm) == at(GEMM, 3, "BM") == (3, 10)
    assert pos(bm.default) == at(GEMM, 3, "128")
    assert pos(fn.params[1].annotation) == at(GEMM, 2, "bf16", 1)
    loop = fn.body[4]
    assert pos(loop) == (8, 5)
    assert pos(loop.iter.args[0]) == at(GEMM, 8, "cdiv")
    upd = loop.body[0]
    assert pos(upd) == (9, 9)
    matmul = upd.value
    assert pos(matmul) == at(GEMM, 9, "a[")  # a node is located at its first token
    rhs = matmul.right
    assert pos(rhs) == at(GEMM, 9, "b[")
    assert pos(rhs.index[0]) == at(GEMM, 9, "k*BK", 1)  # a slice starts at its lower bound
    assert pos(rhs.index[0].upper) == at(GEMM, 9, "(k+1)", 1)  # a parenthesized operand at its '('
    assert pos(rhs.index[1]) == at(GEMM, 9, "pn*BN")
    store = fn.body[5]
    assert pos(store) == (10, 5)
    assert pos(store.value.func) == at(GEMM, 10, "acc.to")
    assert pos(store.value.args[0]) == at(GEMM, 10, "bf16")
    assert fn.loc.source == GEMM  # so diagnostics can show the line


def test_docs_example_parses():
    doc = Path(__file__).resolve().parents[2] / "docs" / "language.md"
    if not doc.exists():
        pytest.skip("docs/language.md not present")
    block = re.search(r"```python\n(.*?)```", doc.read_text(), re.S)
    assert block, "docs/language.md has no python example"
    assert_located(parse(block.group(1), str(doc)))


def test_bigger_kernel():
    m = parse(ATTENTION, "attn.py")
    doc, fut, imp, fn = m.body
    assert isinstance(doc, ast.ExprStmt) and doc.value == ast.Str("A module docstring.", loc=doc.loc)
    assert isinstance(fut, ast.Import) and fut.text == "from __future__ import annotations"
    assert imp.text == "import tkc" and (imp.loc.line, imp.loc.col) == (3, 1)
    assert sx(fn.decorators[0]) == "(call (. tkc kernel) num_warps=4)"
    assert [p.name for p in fn.params][-1] == "causal" and sx(fn.params[-1].default) == "False"
    assert isinstance(fn.body[0], ast.ExprStmt) and fn.body[0].value.value == "Flash attention, forward."
    tup = fn.body[3]
    assert sx(tup.target) == "(tuple b h)"
    assert sx(tup.value) == "(tuple (// (call program_id 1) H) (% (call program_id 1) H))"
    loop = fn.body[-2]
    kt = loop.body[0]
    assert sx(kt.value) == "(call load ([] k b h (* j BN):(* (+ j 1) BN) _:_) other=0.0)"
    branch = loop.body[2]
    assert isinstance(branch, ast.If) and sx(branch.cond) == "(and causal (> (* j BN) (* i BM)))"
    (elif_,) = branch.orelse
    assert isinstance(elif_, ast.If) and sx(elif_.cond) == "(not causal)"
    assert (elif_.loc.line, elif_.loc.col) == (22, 9)  # an elif is located at 'elif'
    assert isinstance(elif_.body[0], ast.Pass) and sx(elif_.orelse[0].value) == "(* s 1.0)"
    assert "keepdim=False" in sx(loop.body[5].value)
    cont = loop.body[6]  # a backslash continuation
    assert sx(cont.value).endswith("(@ (call (. p to) bf16) ([] v b h (* j BN):(* (+ j 1) BN) _:_)))")
    assert_located(m)


# ----------------------------------------------------------------- expressions
@pytest.mark.parametrize("text, tree", [
    ("-x**2", "(- (** x 2))"),
    ("a + b @ c", "(+ a (@ b c))"),
    ("a if c else b", "(if c a b)"),
    ("a if c else b if d else e", "(if c a (if d b e))"),
    ("x if a or b else y", "(if (or a b) x y)"),
    ("2**-1", "(** 2 (- 1))"),
    ("a**b**c", "(** a (** b c))"),
    ("-a**-b", "(- (** a (- b)))"),
    ("a - b - c", "(- (- a b) c)"),
    ("a * b // c % d / e @ f", "(@ (/ (% (// (* a b) c) d) e) f)"),
    ("a + b * c - d", "(- (+ a (* b c)) d)"),
    ("not a == b", "(not (== a b))"),
    ("a or b and c", "(or a (and b c))"),
    ("a or b or c", "(or (or a b) c)"),
    ("not a and not b", "(and (not a) (not b))"),
    ("a & b | c ^ d", "(| (& a b) (^ c d))"),
    ("a < b + 1", "(< a (+ b 1))"),
    ("a + 1 >= b & c", "(>= (+ a 1) (& b c))"),
    ("~a == b", "(== (~ a) b)"),
    ("-a.b[0](x)", "(- (call ([] (. a b) 0) x))"),
    ("+x", "(+ x)"),
    ("--x", "(- (- x))"),
    ("(a + b) * c", "(* (+ a b) c)"),
    ("x.to(bf16).T", "(. (call (. x to) bf16) T)"),
    ("f(a, b=2,)", "(call f a b=2)"),
    ("f()", "(call f)"),
    ("f(g(1), k=h(x=2))", "(call f (call g 1) k=(call h x=2))"),
    ("[a, b,]", "[a b]"),
    ("[]", "[]"),
    ("()", "(tuple )"),
    ("(a,)", "(tuple a)"),
    ("(a, b,)", "(tuple a b)"),
    ("a, b", "(tuple a b)"),
    ("x[i]", "([] x i)"),
    ("x[i,]", "([] x i)"),
    ("x[:, None]", "([] x _:_ None)"),
    ("x[None, :]", "([] x None _:_)"),
    ("x[a:, :b, a:b, 1:2:]", "([] x a:_ _:b a:b 1:2)"),
    ("x[i*BM:(i+1)*BM]", "([] x (* i BM):(* (+ i 1) BM))"),
    ("x[0][1]", "([] ([] x 0) 1)"),
    ("a != b", "(!= a b)"),
    ("a <= b", "(<= a b)"),
    ("(a < b) and (b < c)", "(and (< a b) (< b c))"),
])
def test_expression_shapes(text, tree):
    assert sx(expr(text)) == tree


@pytest.mark.parametrize("text, value", [
    ("1", 1), ("0", 0), ("1_000", 1000), ("0x10", 16), ("0XfF", 255), ("0o17", 15), ("0b101", 5),
    ("1.5", 1.5), ("1.", 1.0), (".5", 0.5), ("1e-3", 1e-3), ("2E+2", 200.0), ("1_0.2_5", 10.25),
    ("1e3", 1000.0),
])
def test_numbers(text, value):
    node = expr(text)
    assert isinstance(node, ast.Num) and node.value == value and type(node.value) is type(value)


def test_constants_and_strings():
    assert isinstance(expr("None"), ast.NoneLit)
    assert expr("True") == ast.Bool(True, loc=None) and expr("False").value is False
    assert expr("'a'").value == "a" and expr('"b"').value == "b"
    assert expr("'a' \"b\"").value == "ab"  # implicit concatenation
    assert expr('"""x\ny"""').value == "x\ny" and expr("r'\\d'").value == "\\d"
    assert expr("'it''s'").value == "its"


# ----------------------------------------------------------------- statements
def test_statements():
    src = textwrap.dedent("""\
        def helper(x, y=2) -> f32:
            '''Triple-quoted
            docstring.'''
            a, b = x, y
            c[i:j, :] = x
            c[0] *= 2
            z: f32 = 1.5
            w: i32
            q //= 3; q @= r;
            while a < b:
                break
            for i, j in pairs:
                continue
            if a: pass
            return a, b
        """)
    fn = parse(src, "s.tk").body[0]
    assert sx(fn.returns) == "f32" and [p.name for p in fn.params] == ["x", "y"]
    doc, tup, store, aug, ann, ann2, floor, matmul, loop, for_, if_, ret = fn.body
    assert doc.value.value == "Triple-quoted\n    docstring."
    assert sx(tup.target) == "(tuple a b)" and sx(tup.value) == "(tuple x y)"
    assert sx(store.target) == "([] c i:j _:_)"
    assert isinstance(aug, ast.AugAssign) and aug.op == "*" and sx(aug.target) == "([] c 0)"
    assert isinstance(ann, ast.AnnAssign) and sx(ann.annotation) == "f32" and sx(ann.value) == "1.5"
    assert ann2.value is None
    assert (floor.op, matmul.op) == ("//", "@") and floor.loc.line == matmul.loc.line == 9
    assert isinstance(loop, ast.While) and isinstance(loop.body[0], ast.Break)
    assert sx(for_.target) == "(tuple i j)" and isinstance(for_.body[0], ast.Continue)
    assert isinstance(if_, ast.If) and isinstance(if_.body[0], ast.Pass) and if_.orelse == []
    assert isinstance(ret, ast.Return) and sx(ret.value) == "(tuple a b)"


def test_elif_chain():
    src = "if a:\n    x = 1\nelif b:\n    x = 2\nelif c:\n    x = 3\nelse:\n    x = 4\n"
    (top,) = parse(src, "e.tk").body
    assert sx(top.cond) == "a" and (top.loc.line, top.loc.col) == (1, 1)
    (mid,) = top.orelse
    assert sx(mid.cond) == "b" and mid.loc.line == 3
    (last,) = mid.orelse
    assert sx(last.cond) == "c" and last.loc.line == 5
    (final,) = last.orelse
    assert isinstance(final, ast.Assign) and sx(final.value) == "4"
    no_else = parse("if a:\n    pass\nelif b:\n    pass\n", "e.tk").body[0]
    assert no_else.orelse[0].orelse == []


def test_decorators_and_nested_defs():
    src = ("@kernel\n@tkc.kernel\n@tkc.kernel(num_warps=8)\n@a.b.c(1, 2)\n"
           "def f():\n    def g(v):\n        return v\n")
    fn = parse(src, "d.tk").body[0]
    assert [sx(d) for d in fn.decorators] == [
        "kernel", "(. tkc kernel)", "(call (. tkc kernel) num_warps=8)", "(call (. (. a b) c) 1 2)"]
    assert fn.loc.line == 5 and fn.params == []
    (inner,) = fn.body
    assert isinstance(inner, ast.FunctionDef) and inner.name == "g" and inner.decorators == []


def test_imports():
    src = "import tkc\nimport a.b as c, d\nfrom . import x\nfrom tkc.lang import (zeros,\n    ones,)\n"
    texts = [s.text for s in parse(src, "i.tk").body]
    assert texts == ["import tkc", "import a.b as c, d", "from . import x",
                     "from tkc.lang import (zeros, ones,)"]


def test_comments_blank_lines_and_continuations():
    src = ("# head\n\ndef f(a,  # first\n      b):\n\n    # inside\n"
           "    x = (a +\n         b)\n    y = a \\\n        + b\n\n")
    fn = parse(src, "c.tk").body[0]
    assert [sx(s.value) for s in fn.body] == ["(+ a b)", "(+ a b)"]
    assert fn.body[1].loc.line == 9


def test_crlf_and_missing_final_newline():
    assert len(parse("x = 1\r\nif x:\r\n    y = 2", "w.tk").body) == 2
    assert parse("", "e.tk").body == [] and parse("# only a comment", "e.tk").body == []
    assert parse("\ufeffx = 1\n", "bom.tk").body[0].loc.col == 1  # a byte-order mark takes no column


def test_indented_source_with_first_line():
    # what inspect.getsource gives for a kernel defined inside a class or function
    src = ("    @tkc.kernel\n    def k(x: f32[N]):\n# a comment at column 1\n"
           "        y = foo(\n1)\n        return y\n")
    m = parse(src, "m.py", first_line=41)
    fn = m.body[0]
    assert (fn.loc.line, fn.loc.col) == (42, 5)
    assert (fn.decorators[0].loc.line, fn.decorators[0].loc.col) == (41, 6)
    assert (fn.params[0].loc.line, fn.params[0].loc.col) == (42, 11)
    assign = fn.body[0]
    assert (assign.loc.line, assign.loc.col) == (44, 9)
    assert (assign.value.args[0].loc.line, assign.value.args[0].loc.col) == (45, 1)
    assert assign.loc.snippet() == "        y = foo(\n        ^"
    err = error("    def k():\n        x = 1 $\n", first_line=10)
    assert (err.loc.line, err.loc.col) == (11, 15)
    assert str(err).endswith("        x = 1 $\n              ^")
    err = error("    def k():\n        x = 1\n      y = 2\n", first_line=3)
    assert (err.loc.line, err.loc.col) == (5, 7) and "unindent" in err.message
    err = error("    x = 1\n  y = 2\n")
    assert err.message == "unindent does not match any outer indentation level"


def test_a_string_annotation_is_read_as_the_type_it_holds():
    quoted = parse('def k(x: "f32[N]", s: \'tkc.f32\', BN: "const" = 64):\n    t: "f32" = 1.0\n', "q.py")
    bare = parse("def k(x: f32[N], s: tkc.f32, BN: const = 64):\n    t: f32 = 1.0\n", "b.py")
    fq, fb = quoted.body[0], bare.body[0]
    assert [sx(p.annotation) for p in fq.params] == [sx(p.annotation) for p in fb.params]
    assert sx(fq.body[0].annotation) == sx(fb.body[0].annotation)
    assert_located(quoted)
    # located at the characters inside the string
    assert (fq.params[0].annotation.loc.line, fq.params[0].annotation.loc.col) == (1, 11)
    assert (fq.params[0].annotation.index[0].loc.line, fq.params[0].annotation.index[0].loc.col) == (1, 15)


@pytest.mark.parametrize("src, line, col, message", [
    ('def k(x: "f32[N"):\n    pass\n', 1, 14, "cannot read the annotation 'f32[N': '[' was never closed"),
    ('def k(x: "f32[N]]"):\n    pass\n', 1, 17, "cannot read the annotation 'f32[N]]': unexpected ']'"),
    ('def k(x):\n    t: "f32 +" = 1.0\n', 2, 14, "cannot read the annotation 'f32 +': unexpected end of"),
    ('def k(x: ""):\n    pass\n', 1, 10, "cannot read the annotation '' as a type; write a tensor like"),
    ('def k(x: "x = 1"):\n    pass\n', 1, 10, "cannot read the annotation 'x = 1' as a type"),
    # not written plainly (an escape): located at the string
    ('def k(x: "f32[\\x4e"):\n    pass\n', 1, 10, "cannot read the annotation 'f32[N': '[' was never closed"),
])
def test_a_string_annotation_that_does_not_parse_says_so(src, line, col, message):
    err = error(src)
    assert type(err) is TkcSyntaxError, err
    assert err.message.startswith(message), err.message
    assert (err.loc.line, err.loc.col) == (line, col), str(err)


def test_parse_from_threads():
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: parse(GEMM, f"{i}.tk"), range(40)))
    assert all(r.body == results[0].body for r in results)


# ------------------------------------------------------------------- errors
@pytest.mark.parametrize("src, line, col, message", [
    ("x = lambda: 1\n", 1, 5, "'lambda' is not supported in tile kernels"),
    ("f(lambda a: a)\n", 1, 3, "'lambda' is not supported"),
    ("y = [v for v in x]\n", 1, 5, "comprehensions are not supported"),
    ("y = (v for v in x)\n", 1, 5, "comprehensions are not supported"),
    ("y = sum(v for v in x)\n", 1, 9, "comprehensions are not supported"),
    ("y = {v for v in x}\n", 1, 5, "dict and set literals are not supported"),
    ("y = {'a': 1}\n", 1, 5, "dict and set literals are not supported"),
    ("class A:\n    pass\n", 1, 1, "'class' is not supported"),
    ("def f():\n    try:\n        pass\n    except E:\n        pass\n", 2, 5, "'try' is not supported"),
    ("with a as b:\n    pass\n", 1, 1, "'with' is not supported"),
    ("def f():\n    global g\n", 2, 5, "'global' is not supported"),
    ("def f():\n    nonlocal g\n", 2, 5, "'nonlocal' is not supported"),
    ("assert x > 0\n", 1, 1, "'assert' is not supported"),
    ("del x\n", 1, 1, "'del' is not supported"),
    ("def f():\n    yield 1\n", 2, 5, "'yield' is not supported"),
    ("async def f():\n    pass\n", 1, 1, "'async' is not supported"),
    ("x = await y\n", 1, 5, "'await' is not supported"),
    ("raise E\n", 1, 1, "'raise' is not supported"),
    ("if (n := 3) > 2:\n    pass\n", 1, 7, "the ':=' operator is not supported"),
    ("f(*args)\n", 1, 3, "'*' unpacking and star-arguments are not supported"),
    ("f(**kw)\n", 1, 3, "'**' unpacking and star-arguments are not supported"),
    ("def f(a, *rest):\n    pass\n", 1, 10, "'*' unpacking"),
    ("a, *b = c\n", 1, 4, "'*' unpacking"),
    ("y = a < b < c\n", 1, 11, "chained comparisons like 'a < b < c' are not supported"),
    ("y = a == b != c\n", 1, 12, "chained comparisons"),
    ("y = a is None\n", 1, 7, "'is' is not supported"),
    ("y = a is not None\n", 1, 7, "'is not' is not supported"),
    ("y = a in b\n", 1, 7, "the 'in' operator is not supported"),
    ("y = a not in b\n", 1, 7, "the 'not in' operator is not supported"),
    ("y = x[...]\n", 1, 7, "'...' is not supported"),
    ("y = 2j\n", 1, 5, "complex numbers are not supported"),
    ("y = f'{x}'\n", 1, 5, "f-strings are not supported"),
    ("y = b'x'\n", 1, 5, "bytes literals are not supported"),
    ("a = b = 0\n", 1, 5, "chained assignment"),
    ("x.y = 1\n", 1, 1, "assigning to an attribute is not supported"),
    ("[a, b] = c\n", 1, 1, "assigning to a list here is not supported"),
    ("(a, b) += c\n", 1, 1, "assigning to a tuple here is not supported"),
    ("x[0]: f32 = 1\n", 1, 1, "an annotation on anything but a plain name"),
    ("for x in y:\n    pass\nelse:\n    pass\n", 3, 1, "'else' on a loop is not supported"),
    ("while x:\n    pass\nelse:\n    pass\n", 3, 1, "'else' on a loop is not supported"),
])
def test_unsupported(src, line, col, message):
    err = error(src)
    assert isinstance(err, TkcUnsupportedError), err
    assert message in err.message and "\n" not in err.message
    assert (err.loc.file, err.loc.line, err.loc.col) == ("t.tk", line, col), str(err)


@pytest.mark.parametrize("src, line, col, message", [
    ("x = (1, 2))\n", 1, 11, "unexpected ')'"),
    ("f(a b)\n", 1, 5, "unexpected 'b'"),
    ("x = 1 +\n", 1, 8, "unexpected end of line"),
    ("x = (1 +\n", 1, 5, "'(' was never closed"),
    ("def f(a,\n      b:\n", 1, 6, "'(' was never closed"),
    ("x = a[1, 2)\n", 1, 11, "closing ')' does not match opening '['"),
    ("for i in range(3)\n    pass\n", 1, 18, "expected ':'"),
    ("if x\n    pass\n", 1, 5, "expected ':'"),
    ("def f()\n    pass\n", 1, 8, "expected ':'"),
    ("def f():\nreturn 1\n", 2, 1, "expected an indented block"),
    ("def f():\n", 1, 9, "expected an indented block"),
    ("x = 1\n    y = 2\n", 2, 5, "unexpected indent"),
    ("if x:\n        a = 1\n    b = 2\n", 3, 5, "unindent does not match any outer indentation level"),
    ("if x:\n\ta = 1\n        b = 2\n", 3, 9, "inconsistent use of tabs and spaces in indentation"),
    ("if x:\n    a = 1\n\tb = 2\n", 3, 2, "inconsistent use of tabs and spaces in indentation"),
    ("x = 1 $ 2\n", 1, 7, "invalid character '$'"),
    ("x = a ? b\n", 1, 7, "invalid character '?'"),
    ("x = 'abc\n", 1, 5, "unterminated string literal"),
    ('x = """abc\n\n', 1, 5, "unterminated string literal"),
    ("x = 012\n", 1, 5, "invalid number literal"),
    ("x = 1 \\ 2\n", 1, 7, "unexpected character after line continuation character"),
    ("f(x) = 1\n", 1, 1, "cannot assign to a function call"),
    ("1 = x\n", 1, 1, "cannot assign to a literal"),
    ("a + b = 1\n", 1, 1, "cannot assign to an expression"),
    ("for f(x) in y:\n    pass\n", 1, 5, "cannot assign to a function call"),
    ("f(a=1, 2)\n", 1, 8, "positional argument follows keyword argument"),
    ("f(a=1, a=2)\n", 1, 8, "keyword argument repeated: 'a'"),
    ("f(a.b=1)\n", 1, 3, "a keyword argument must be a plain name"),
    ("def f(a, a):\n    pass\n", 1, 10, "duplicate parameter 'a'"),
    ("def f(a=1, b):\n    pass\n", 1, 12, "parameter without a default follows parameter with a default"),
    ("x = '\\N{nope}'\n", 1, 5, "invalid string literal"),
    ("x = (\n", 1, 5, "'(' was never closed"),
    ("else:\n    pass\n", 1, 1, "unexpected 'else'"),
    ("x = 1\n@dec\n", 2, 5, "unexpected end of file"),
])
def test_syntax_errors(src, line, col, message):
    err = error(src)
    assert type(err) is TkcSyntaxError, err
    assert err.message == message or err.message.startswith(message), err.message
    assert (err.loc.line, err.loc.col) == (line, col), str(err)


def test_error_rendering():
    # Like Python, a bracket that is never closed is the error, at the bracket.
    err = error("def f():\n    x = [1, 2\n    y = 3\n", first_line=7)
    assert str(err) == "t.tk:8:9: error: '[' was never closed\n    x = [1, 2\n        ^"


@pytest.mark.parametrize("bad", [b"x = 1", None, 3])
def test_non_text_input(bad):
    with pytest.raises(TkcSyntaxError):
        parse(bad, "t.tk")


def test_deep_nesting_is_an_error_or_a_tree():
    deep = ["x = " + "(" * 400 + "1" + ")" * 400, "x = " + " + ".join("a" * 3000), "x = " + "-" * 2000 + "1"]
    for src in deep:
        try:
            parse(src, "t.tk")
        except TkcSyntaxError as e:
            assert e.loc is not None


# ----------------------------------------------------------------------- fuzz
_PIECES = [
    "(", ")", "[", "]", "{", "}", ":", ",", "=", "==", "+", "-", "*", "**", "@", ".", "...", "\n", "    ",
    "\t",
    "#", "'", '"', '"""', "\\", "\\\n", "$", "lambda", "for", "in", "if", "else", "elif", "def", "return",
    "while", "None", "1e-3", "0x", "0x1F", "1_0", "x", "is", "not", ":=", ";", "async", "class", "\r", "\x00",
    "é", "->", "<<", "//=", "1j", "f'", "yield", "pass", "import", "from", "@kernel\n",
]
_SOURCES = [GEMM, ATTENTION, "    " + GEMM.replace("\n", "\n    ").rstrip(" ")]
_TOKEN = re.compile(r"\s+|\w+|[^\w\s]")


def _mutate(rng: random.Random, src: str) -> str:
    for _ in range(rng.randint(1, 4)):
        i = rng.randint(0, len(src))
        j = min(len(src), i + rng.randint(1, 12))
        kind = rng.randrange(5)
        if kind == 0:
            src = src[:i] + src[j:]  # delete a few characters
        elif kind == 1:
            src = src[:i] + rng.choice(_PIECES) + src[i:]
        elif kind == 2:
            src = src[:j] + src[i:j] + src[j:]  # duplicate a stretch
        else:  # token-level: delete, duplicate or swap whole tokens
            toks = _TOKEN.findall(src)
            k = rng.randrange(len(toks)) if toks else 0
            if kind == 3 and toks:
                del toks[k]
            elif toks:
                m = rng.randrange(len(toks))
                toks[k], toks[m] = toks[m], toks[k]
            src = "".join(toks)
    return src


def _check_parse(src: str) -> None:
    try:
        m = parse(src, "fuzz.tk", first_line=3)
    except (TkcSyntaxError, TkcUnsupportedError) as e:
        assert e.loc is not None and e.loc.line >= 3 and e.loc.col >= 1, repr(src)
        assert e.message and "\n" not in e.message
        str(e)  # the snippet renders
    else:
        for n in nodes(m):
            assert isinstance(n.loc, Loc) and n.loc.line >= 3 and n.loc.col >= 1, (src, n)


@pytest.mark.parametrize("seed", [0, 1, 2, None])
def test_fuzz_random_mutations(seed):
    # None: a fresh seed each run, drawn here (not in the test's id, which every worker of a
    # parallel run must collect alike) and named when it fails.
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    for _ in range(150):
        try:
            _check_parse(_mutate(rng, rng.choice(_SOURCES)))
        except AssertionError as e:
            raise AssertionError(f"seed {seed}: {e}") from e


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_SOURCES), st.integers(0, 2**32 - 1))
def test_fuzz_hypothesis_mutations(src, seed):
    _check_parse(_mutate(random.Random(seed), src))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(_PIECES + list("abc012 \n")), max_size=40).map("".join))
def test_fuzz_hypothesis_from_pieces(src):
    _check_parse(src)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_fuzz_hypothesis_any_text(src):
    _check_parse(src)


def test_a_text_parsed_again_reuses_its_tree_and_errors_are_raised_each_time():
    text = "@kernel\ndef k(x: f32[N]):\n    grid(1)\n"
    first = parse(text, "k.tk")
    assert parse(text, "k.tk") is first
    # another file or first line is another tree: its locations differ
    moved = parse(text, "k.tk", first_line=11)
    assert moved is not first and moved.body[0].loc.line == first.body[0].loc.line + 10
    assert parse(text, "other.tk").body[0].loc.file == "other.tk"
    for _ in range(2):  # a failed parse is not kept
        with pytest.raises(TkcSyntaxError):
            parse(text + "    x = (\n", "k.tk")
