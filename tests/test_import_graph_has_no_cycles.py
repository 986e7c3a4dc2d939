"""The package's imports form a layered graph without cycles: bench -> app -> engine -> models -> kernels, with
the root-level utility modules (`parley.cache_files`, ...) below everything. `bench` sits on top because it
measures the app's server and loads models through the app's flags; app reaches a `parley bench` command only by
its module's name (cli.BENCHES), never by an import.

Every `import` and `from ... import` counts, at the top of a module or inside a function (a deferred import
still ties two modules together: a cycle that only closes at run time is still one a reader has to untangle),
relative imports resolved. Imports under `if TYPE_CHECKING:` (names for annotations only, never run) count for
the layers but not for cycles: two classes that name each other in annotations is the usual idiom.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository root is the `parley` package
PACKAGE = "parley"
LAYERS = ("bench", "app", "engine", "models", "kernels")  # each may import only those after it (and the root's)
SKIP = {"tests", "scripts", "docs", "assets", ".venv", "build", "__pycache__"}

# (importer, imported) pairs allowed to break the layer rule, each with its reason. Empty: prefer fixing the code.
LAYER_EXCEPTIONS: dict[tuple[str, str], str] = {}
# (importer, imported) imports left out of the cycle check, each with its reason.
CYCLE_EXCEPTIONS: dict[tuple[str, str], str] = {}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by its dotted name (`parley.models.config`)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(part in SKIP or part.startswith(".") for part in rel[:-1]):
            continue
        found[module_name(path, root)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The package module `name` stands for: itself, or the nearest module above it (`parley.models.config.
    ModelConfig` is parley.models.config)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _typing_only(tree: ast.Module) -> set[int]:
    """The ids of the import nodes under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or \
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING":
            found |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return found


def imports_of(module: str, path: Path, modules: dict[str, Path], typing: bool = True) -> set[str]:
    """The package modules `module` imports, anywhere in its file (`typing`: those under TYPE_CHECKING too).
    `from .pkg import sub` imports the module pkg.sub when there is one, else the name sub of pkg/__init__.py
    (so the package itself); the parent packages Python runs on the way are not counted (every module would then
    import every __init__ above it)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = set() if typing else _typing_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                parent = ".".join(base + ([node.module] if node.module else []))
            else:
                parent = node.module or ""
            targets = [f"{parent}.{alias.name}" if f"{parent}.{alias.name}" in modules else parent
                       for alias in node.names]
        for target in targets:
            if target != PACKAGE and not target.startswith(PACKAGE + "."):
                continue
            found = _resolve(target, modules)
            if found is not None and found != module:
                out.add(found)
    return out


def import_graph(root: Path = ROOT, typing: bool = True) -> dict[str, set[str]]:
    """Module -> the package modules it imports (`typing`: for annotations too)."""
    modules = package_modules(root)
    return {name: imports_of(name, path, modules, typing) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def a_circle(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """The shortest circle of imports through the component's first module: [a, b, ..., a]."""
    start, inside = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & inside):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return component


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """`importer -> imported` for each import of a higher layer (or of the package root's __init__)."""
    bad = []
    for module, deps in sorted(graph.items()):
        mine = layer_of(module)
        for dep in sorted(deps):
            theirs = layer_of(dep)
            if (module, dep) in LAYER_EXCEPTIONS:
                continue
            if mine is None and theirs is not None and module != PACKAGE:
                bad.append(f"{module} -> {dep} (a root-level module sits below every layer)")
            elif mine is not None and theirs is not None and LAYERS.index(theirs) < LAYERS.index(mine):
                bad.append(f"{module} -> {dep} ({mine} may not import {theirs})")
    return bad


def test_the_graph_sees_the_package():
    graph = import_graph()
    assert "parley.models.config" in graph and "parley.app.cli" in graph and "parley.bench.decode" in graph
    assert "parley.models.config" in graph["parley.models.loading"]
    assert all(not name.startswith("parley.tests") for name in graph)


def test_no_import_cycle():
    graph = import_graph(typing=False)
    for importer, imported in CYCLE_EXCEPTIONS:
        assert imported in graph[importer], f"{importer} no longer imports {imported}: drop its exception"
        graph[importer].discard(imported)
    found = cycles(graph)
    assert not found, "import cycles (each: its modules, then one circle among them):\n" + "\n".join(
        f"  {', '.join(c)}\n    {' -> '.join(a_circle(c, graph))}" for c in found)


def test_layers_import_downward_only():
    bad = layer_violations(import_graph())
    assert not bad, "imports against the layers (bench -> app -> engine -> models -> kernels):\n" + "\n".join(
        "  " + b for b in bad)


def test_a_planted_cycle_is_found(tmp_path):
    """The checker itself: two modules importing each other (one inside a function, relatively) are a cycle,
    and a kernel importing a model breaks the layers."""
    pkg = tmp_path / "kernels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import g\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    from . import a\n    from ..models.x import y\n    return a, y\n")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "x.py").write_text("y = 1\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["parley.kernels.a", "parley.kernels.b"]]
    assert layer_violations(graph) == ["parley.kernels.b -> parley.models.x (kernels may not import models)"]


def test_annotations_only_imports_close_no_cycle_but_obey_the_layers(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("")
    (tmp_path / "engine" / "a.py").write_text("from .b import g\n")
    (tmp_path / "engine" / "b.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..app.ui import Window\n    from .a import f\n"
        "\ndef g(): ...\n")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "ui.py").write_text("class Window: ...\n")
    assert cycles(import_graph(tmp_path, typing=False)) == []
    assert cycles(import_graph(tmp_path)) == [["parley.engine.a", "parley.engine.b"]]
    assert layer_violations(import_graph(tmp_path)) == ["parley.engine.b -> parley.app.ui (engine may not import app)"]
