"""No two of tkc's modules import each other, directly or around a circle.

Every import statement of every module under ``tkc/`` and ``runtime/`` (imported as
``tkc.runtime``) counts: top-level ones and the ones inside functions, which a circle hides
behind.  Imports under ``if TYPE_CHECKING:`` are left out: they never run, and name a type
for annotations only.  A module depends on the modules it names and, for ``from pkg import
name``, on ``pkg.name`` where that is a module; a package's ``__init__`` is a module like any
other.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Where each top-level package of tkc lives, by its import name.
PACKAGES = {"tkc": ROOT / "tkc", "tkc.runtime": ROOT / "runtime"}

#: Circles that remain, each named by the sorted modules of its group, with why.  Every other
#: circle is a defect to fix by moving what both sides share into a module below them.
ALLOWED: dict[tuple[str, ...], str] = {
}


def _modules() -> dict[str, Path]:
    found = {}
    for prefix, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([prefix, *parts])] = path
    return found


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``, at any depth, outside ``if TYPE_CHECKING:``."""
    out: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        if _type_checking_only(node):
            for child in node.orelse:
                walk(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(tree)
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of tkc that ``name`` (``tkc.runtime.x`` or ``runtime.x``) is, or the package
    above it that is one."""
    if name == "runtime" or name.startswith("runtime."):
        name = "tkc." + name
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if _is_package(module, modules) else module.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                found = _resolve(target, modules)
                # `import tkc.x` also runs tkc/__init__.py, which is not a dependency on the package
                # being circular with its own modules, so a module's own ancestors are left out.
                if found is not None and found != module and not module.startswith(found + "."):
                    graph[module].add(found)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Each strongly connected group of more than one module (its modules, sorted): every module
    of a group reaches every other around some circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(tuple(sorted(group)))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return groups


def _circle(group: tuple[str, ...], graph: dict[str, set[str]]) -> tuple[str, ...]:
    """A shortest circle from the group's first module back to it, through the group."""
    start = group[0]
    paths = {start: (start,)}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & set(group)):
                if w == start:
                    return paths[v]
                if w not in paths:
                    paths[w] = (*paths[v], w)
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{group} is not strongly connected")


def test_the_graph_sees_local_and_relative_imports() -> None:
    graph = _graph()
    assert "tkc.runtime.cache" in graph["tkc.compiler"]  # function-local `from tkc.runtime import cache`
    assert "tkc.codegen.lowerer" in graph["tkc.codegen.lower"]
    assert "tkc.runtime.driver" in graph["tkc.runtime.launch"]


def test_no_module_imports_itself_around_a_circle() -> None:
    found = _cycles(_graph())
    stale = [c for c in ALLOWED if c not in found]
    assert not stale, f"allowed circles that no longer exist (remove them from ALLOWED): {stale}"
    graph = _graph()
    bad = [f"{', '.join(c)}: for one, {' -> '.join((*_circle(c, graph), c[0]))}" for c in found if c not in ALLOWED]
    assert not bad, "import circles between tkc's modules:\n  " + "\n  ".join(bad)


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _cycles(graph) == [("a", "b", "c")]
    assert _circle(("a", "b", "c"), graph) == ("a", "b", "c")
