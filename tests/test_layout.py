"""The package's shape (issue 22): no Python file over 600 lines, and no import circle between opgym's
modules at import time (a module importing another at its top level, directly or through others, that
imports it back). Imports inside functions are not edges: they run after both modules are loaded.
Package __init__ files are not nodes: importing a submodule runs its package's __init__ first anyway,
and the op table's __init__ imports its parts lazily.

A stricter check (issue 30): no circle even through imports inside functions, packages included (run.measure
<-> run.profile, the coverage package <-> its modules, vllm <-> vllm.layers were such circles): what two
modules share lives in a module that neither imports back. `from . import sub` is an edge to the submodule
only (the package is already being imported by then)."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "python" / "opgym"
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG.parent).with_suffix("")
        out[".".join(rel.parts)] = p
    return out


def _top_level_imports(name: str, path: Path, known: set[str], anywhere: bool = False) -> set[str]:
    """Modules of opgym that `name` imports when it is itself imported (statements at module level,
    including those under if/try at module level); anywhere=True: every import statement of the file,
    those inside functions too."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rsplit(".", 1)[0]
    deps: set[str] = set()

    def add(mod: str):
        if mod in known:
            deps.add(mod)

    def visit(stmts):
        for node in stmts:
            if isinstance(node, ast.Import):
                for a in node.names:
                    add(a.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known]
                if len(subs) < len(node.names):  # a name from the module itself, not only its submodules
                    add(mod)
                for sub in subs:
                    add(sub)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(getattr(node, "finalbody", []))

    visit(list(ast.walk(tree)) if anywhere else tree.body)
    deps.discard(name)
    return deps


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles a depth-first search closes (each as the path from a module back to itself)."""
    state: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def dfs(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                circles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                dfs(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m)
    return circles


def test_no_python_file_over_600_lines():
    long = {str(p.relative_to(PKG.parent)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_no_import_circle_between_modules():
    mods = _modules()
    nodes = {m for m, p in mods.items() if p.name != "__init__.py"}
    graph = {m: {d for d in _top_level_imports(m, mods[m], set(mods)) if d in nodes} for m in nodes}
    assert sum(len(v) for v in graph.values()) > 20, "the import graph is implausibly small: the parser missed imports"

    circles = _circles(graph)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def _package_name(mod: str, path: Path) -> str:
    return mod.rsplit(".", 1)[0] if path.name == "__init__.py" else mod


def test_no_import_circle_even_inside_functions():
    mods = {_package_name(m, p): p for m, p in _modules().items()}
    graph = {m: _top_level_imports(m, p, set(mods), anywhere=True) for m, p in mods.items()}
    assert {"opgym.run.profile", "opgym.vllm._stats"} <= graph["opgym.run.measure"] | graph["opgym.vllm.layers"]
    circles = _circles(graph)
    assert not circles, "import circles (counting imports inside functions): " + "; ".join(
        " -> ".join(c) for c in circles)


def test_the_circle_detector_finds_a_circle(tmp_path):
    """The parser and the search see a circle where there is one (a check that cannot fail proves nothing)."""
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("import os\ntry:\n    from . import a\nexcept ImportError:\n    pass\n")
    mods = {"p": pkg / "__init__.py", "p.a": pkg / "a.py", "p.b": pkg / "b.py"}
    assert _top_level_imports("p.a", mods["p.a"], set(mods)) == {"p.b"}
    assert _top_level_imports("p.b", mods["p.b"], set(mods)) == {"p.a"}
    (pkg / "c.py").write_text("def f():\n    from . import b\n    from .b import os\n")
    mods["p.c"] = pkg / "c.py"
    assert _top_level_imports("p.c", mods["p.c"], set(mods)) == set()
    assert _top_level_imports("p.c", mods["p.c"], set(mods), anywhere=True) == {"p.b"}
    assert _circles({"p.a": {"p.b"}, "p.b": {"p.a"}}) == [["p.a", "p.b", "p.a"]]
    assert _circles({"p.a": {"p.b"}, "p.b": set()}) == []
