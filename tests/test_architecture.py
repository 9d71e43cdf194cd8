"""The package's shape, as docs/architecture.md draws it: every module imports, no import
circles, and no engine module grows past what one reader holds in mind without saying why.

Import circles are found from the source, not by importing: the graph is built from each
module's AST, with

- every `import` and `from ... import` of the package, relative ones resolved against the
  module's own package; `from pkg import name` is an edge to `pkg.name` when that is a module,
  else to `pkg`;
- imports inside functions too: an import moved into a function to dodge a circle is still a
  circle (the code that runs it depends on both modules). Lazy imports that are not part of
  a circle (kept lazy for start-up time, e.g. the CLI's or a job supervisor's) are fine;
- NOT imports under `if TYPE_CHECKING:`: they never run, they only name types;
- NOT the entry points in the root `jupyter_gpujobs/__init__.py` (`ENTRY_POINTS`): Jupyter
  and IPython call them by name to load the extension; the root package imports nothing
  when it is imported, so nothing can be in a circle through it.

The size rule: a module of `jupyter_gpujobs/engine/` over `MAX_ENGINE_LINES` lines must say why
in its docstring's first `MARKER_WITHIN` lines, with the phrase `MARKER` ("Over 600 lines
because ...").
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = "jupyter_gpujobs"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
#: Functions of the root package that Jupyter or IPython call by name (see the module docstring).
ENTRY_POINTS = {"_jupyter_server_extension_points", "load_ipython_extension"}
#: Modules run by a tool that sets them up, not importable on their own (alembic's migrations).
NOT_IMPORTABLE = (f"{PACKAGE}.engine.store.migrations.env",)
MAX_ENGINE_LINES = 600
MARKER = "Over 600 lines because"
MARKER_WITHIN = 8  # lines of the module's docstring


def modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's __init__), for every .py file of the package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, package)
    return out


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, path: Path, package: bool, known: set[str]) -> dict[str, tuple[int, bool]]:
    """The package's modules that `name` imports: target -> (line, whether only in a function)."""
    base = name if package else name.rpartition(".")[0]
    found: dict[str, tuple[int, bool]] = {}

    def resolve(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    def add(target: str, line: int, lazy: bool) -> None:
        module = resolve(target)
        if module is None or module == name:
            return
        if module not in found or (found[module][1] and not lazy):
            found[module] = (line, lazy)

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit_one(other, lazy)
                continue
            visit_one(child, lazy)

    def visit_one(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    add(alias.name, node.lineno, lazy)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                origin = base
                for _ in range(node.level - 1):
                    origin = origin.rpartition(".")[0]
                origin = f"{origin}.{node.module}" if node.module else origin
            else:
                origin = node.module or ""
            if origin.split(".")[0] == PACKAGE:
                for alias in node.names:
                    sub = f"{origin}.{alias.name}"
                    add(sub if sub in known else origin, node.lineno, lazy)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and name == PACKAGE and node.name in ENTRY_POINTS:
            return
        visit(node, lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def import_graph() -> dict[str, dict[str, tuple[int, bool]]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, package, known) for name, (path, package) in mods.items()}


def circles(graph: dict[str, dict[str, tuple[int, bool]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one cycle
    through its modules, in import order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:  # (recursive: the package's import depth is small)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_one_cycle(graph, c) for c in components]


def _one_cycle(graph: dict[str, dict[str, tuple[int, bool]]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth first)."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                return paths[v] + [start]
            if w in component and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return sorted(component)  # (not reached: a component's modules reach each other)


def describe(graph: dict[str, dict[str, tuple[int, bool]]], cycle: list[str]) -> str:
    steps = []
    for a, b in zip(cycle, cycle[1:]):
        line, lazy = graph[a][b]
        steps.append(f"  {a} -> {b}  ({modules()[a][0].relative_to(ROOT.parent)}:{line}"
                     f"{', inside a function' if lazy else ''})")
    return "\n".join(steps)


def test_the_graph_sees_relative_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """The checker itself: a circle closed by a relative import inside a function is found,
    and one closed only under TYPE_CHECKING is not."""
    pkg = tmp_path / PACKAGE / "part"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n")
    known = {f"{PACKAGE}.part", f"{PACKAGE}.part.a", f"{PACKAGE}.part.b", f"{PACKAGE}.part.c"}
    graph = {m: imports_of(m, tmp_path / (m.replace(".", "/") + ".py"), False, known)
             for m in sorted(known - {f"{PACKAGE}.part"})}
    graph[f"{PACKAGE}.part"] = {}
    assert graph[f"{PACKAGE}.part.b"] == {f"{PACKAGE}.part.a": (2, True)}
    assert graph[f"{PACKAGE}.part.c"] == {}
    assert circles(graph) == [[f"{PACKAGE}.part.a", f"{PACKAGE}.part.b", f"{PACKAGE}.part.a"]]


def test_no_import_circles() -> None:
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles (break each by design: see docs/architecture.md):\n" + "\n\n".join(
        describe(graph, c) for c in found)


def test_every_module_imports_on_its_own() -> None:
    """Each module imported first, in a fresh set of the package's modules (third-party ones
    stay loaded, for time), so that no module works only when another was imported before."""
    names = [n for n in modules() if n not in NOT_IMPORTABLE]
    script = (
        "import importlib, sys, traceback\n"
        f"names = {names!r}\n"
        "failed = []\n"
        "for name in names:\n"
        f"    for loaded in [m for m in sys.modules if m == {PACKAGE!r} or m.startswith({PACKAGE + '.'!r})]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except BaseException:\n"
        "        failed.append(name + ':\\n' + traceback.format_exc(limit=3))\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT.parent, timeout=600)
    assert result.returncode == 0, f"modules that do not import:\n{result.stdout}{result.stderr[-3000:]}"


def test_engine_modules_stay_readable() -> None:
    """An engine module over MAX_ENGINE_LINES lines says why in its docstring's first lines."""
    over = []
    for name, (path, _) in modules().items():
        if not name.startswith(f"{PACKAGE}.engine"):
            continue
        text = path.read_text()
        lines = text.count("\n") + (not text.endswith("\n"))
        if lines <= MAX_ENGINE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if MARKER not in " ".join(doc.splitlines()[:MARKER_WITHIN]):
            over.append(str(path.relative_to(ROOT.parent)))
    assert not over, (
        f"engine modules over {MAX_ENGINE_LINES} lines without {MARKER!r} in the first {MARKER_WITHIN} lines "
        "of their docstring (split them, or say why):\n" + "\n".join(sorted(over)))
