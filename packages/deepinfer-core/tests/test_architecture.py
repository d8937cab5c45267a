"""Architecture rules for deepinfer-core, checked on the source text.

Every ``.py`` file under ``src/deepinfer`` is parsed with :mod:`ast` and never imported, so the
checks see the code as written (``if TYPE_CHECKING:`` blocks included) and cannot be affected by
import side effects. The helpers are tested on hand-built inputs at the end, so a rule that passes
is known to pass because the code obeys it, not because the checker is blind.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
SRC = PACKAGE_ROOT / "src"
TOP = "deepinfer"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80

Import = ast.Import | ast.ImportFrom
FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
# importer -> imported module -> line of the importer's first import of it
ImportGraph = dict[str, dict[str, int]]


@dataclass(frozen=True)
class Module:
    """One parsed source file: ``name`` is its dotted module name (a package for __init__.py)."""

    name: str
    path: Path
    tree: ast.Module
    is_package: bool


def load_modules(src: Path, top: str) -> dict[str, Module]:
    """Parse every ``.py`` file of package ``top`` under ``src``, keyed by dotted module name."""
    modules: dict[str, Module] = {}
    for path in sorted((src / top).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        modules[name] = Module(name, path, tree, is_package)
    return modules


@cache
def source_modules() -> dict[str, Module]:
    return load_modules(SRC, TOP)


def module_level_imports(tree: ast.Module) -> Iterator[Import]:
    """Imports that run when the module is imported: everywhere but inside function bodies.

    Imports under ``if TYPE_CHECKING:``, ``try:`` and class bodies count; an import inside a
    function is a deliberate lazy import and does not.
    """
    stack: list[ast.AST] = [tree]
    while stack:
        for child in ast.iter_child_nodes(stack.pop()):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child
            elif not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                stack.append(child)


def all_imports(tree: ast.Module) -> Iterator[Import]:
    """Every import statement of the module, function bodies included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def nearest_known(name: str, known: AbstractSet[str]) -> str | None:
    """``name`` or its closest enclosing package that is one of ``known``; None outside them."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def resolve(node: Import, importer: Module, known: AbstractSet[str]) -> set[str]:
    """The modules of ``known`` that an import statement of ``importer`` refers to.

    ``from pkg import name`` means the submodule ``pkg.name`` where that file exists, else
    ``pkg`` itself (its __init__); relative imports are resolved against the importer's package.
    """
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        if node.level == 0:
            base = node.module or ""
        else:
            package = importer.name.split(".")
            if not importer.is_package:
                package = package[:-1]
            if node.level - 1 >= len(package):
                return set()  # beyond the top-level package: not ours
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, *([node.module] if node.module else [])])
        targets = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
            for alias in node.names
        ]
    return {module for target in targets if (module := nearest_known(target, known))}


def import_graph(modules: Mapping[str, Module], *, lazy: bool) -> ImportGraph:
    """Module -> imported modules (with the line of the first import), self-imports left out.

    ``lazy=False`` counts module-level imports only; ``lazy=True`` adds those inside functions.
    """
    known = modules.keys()
    graph: ImportGraph = {}
    for name, module in modules.items():
        edges = graph.setdefault(name, {})
        nodes = all_imports(module.tree) if lazy else module_level_imports(module.tree)
        for node in nodes:
            for target in resolve(node, module, known) - {name}:
                edges[target] = min(edges.get(target, node.lineno), node.lineno)
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None when there is none.

    Depth-first search, iterative, in sorted order so the cycle reported is stable; a node that
    appears only as a target has no edges.
    """
    finished: set[str] = set()
    for start in sorted(graph):
        if start in finished:
            continue
        path = [start]
        position = {start: 0}
        pending = [iter(sorted(graph[start]))]
        while pending:
            target = next(pending[-1], None)
            if target is None:
                finished.add(path[-1])
                del position[path.pop()]
                pending.pop()
            elif target in position:
                return [*path[position[target] :], target]
            elif target not in finished:
                position[target] = len(path)
                path.append(target)
                pending.append(iter(sorted(graph.get(target, ()))))
    return None


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def describe_import(modules: Mapping[str, Module], importer: str, target: str, line: int) -> str:
    where = modules[importer].path.relative_to(PACKAGE_ROOT)
    return f"  {importer} imports {target} ({where}:{line})"


def describe_cycle(cycle: list[str], graph: ImportGraph, modules: Mapping[str, Module]) -> str:
    edges = [
        describe_import(modules, importer, target, graph[importer][target])
        for importer, target in itertools.pairwise(cycle)
    ]
    return "\n".join([" -> ".join(cycle), *edges])


def function_lengths(tree: ast.Module) -> Iterator[tuple[str, FunctionNode, int]]:
    """(qualified name, node, length in lines) of every function and method, nested ones too."""

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, FunctionNode, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                assert child.end_lineno is not None
                yield f"{prefix}{child.name}", child, child.end_lineno - child.lineno + 1
                yield from visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


def test_import_graph_has_no_cycle() -> None:
    """Module-level imports of ``deepinfer.*`` form no cycle (``TYPE_CHECKING`` imports count).

    A cycle makes import order fragile (which module of the loop is imported first decides what
    is defined when) and hides the layering: two modules that import each other are one module
    split in two files. Imports inside functions are deliberate lazy imports and are not counted.
    """
    modules = source_modules()
    graph = import_graph(modules, lazy=False)
    cycle = find_cycle(graph)
    if cycle is not None:
        pytest.fail(f"import cycle:\n{describe_cycle(cycle, graph, modules)}", pytrace=False)


@pytest.mark.parametrize("forbidden", ["deepinfer.cache", "deepinfer.engine"])
def test_models_do_not_import(forbidden: str) -> None:
    """No module of ``deepinfer.models`` imports ``deepinfer.cache`` or ``deepinfer.engine``.

    The models see a batch only through its description, so the cache can change its state
    layout (slots, pages, prefixes) behind it, and the engine sits above the models, never below.
    Lazy imports inside functions count too: they are still a dependency.
    """
    modules = source_modules()
    graph = import_graph(modules, lazy=True)
    offenders = [
        describe_import(modules, importer, target, line)
        for importer, edges in sorted(graph.items())
        if within(importer, "deepinfer.models")
        for target, line in sorted(edges.items())
        if within(target, forbidden)
    ]
    if offenders:
        message = f"deepinfer.models imports {forbidden}:\n" + "\n".join(offenders)
        pytest.fail(message, pytrace=False)


def test_source_files_are_short() -> None:
    """No ``.py`` file under ``src`` is over 400 lines: small files keep the core readable."""
    lengths = {
        path.relative_to(PACKAGE_ROOT): len(path.read_text(encoding="utf-8").splitlines())
        for path in SRC.rglob("*.py")
    }
    offenders = sorted(
        ((n, path) for path, n in lengths.items() if n > MAX_FILE_LINES), reverse=True
    )
    if offenders:
        lines = [f"  {path}: {n} lines" for n, path in offenders]
        pytest.fail(f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(lines), pytrace=False)


def test_functions_are_short() -> None:
    """No function or method under ``src`` is over 80 lines: small functions keep the core
    readable (the length runs from the ``def`` line to the last line of the body)."""
    offenders: list[tuple[int, str]] = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, node, n in function_lengths(tree):
            if n > MAX_FUNCTION_LINES:
                where = f"{path.relative_to(PACKAGE_ROOT)}:{node.lineno}"
                offenders.append((n, f"  {where} {name}: {n} lines"))
    if offenders:
        lines = [line for _, line in sorted(offenders, reverse=True)]
        pytest.fail(
            f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(lines), pytrace=False
        )


# The checker, checked on hand-built inputs.


@pytest.mark.parametrize(
    ("graph", "cycle"),
    [
        ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
        ({"a": {"a"}}, ["a", "a"]),
        ({"d": {"a"}, "a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": set()}, None),
        ({"a": {"b"}}, None),  # "b" only appears as a target
        ({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}, None),  # a diamond is no cycle
        ({"a": {"b", "c"}, "b": {"c"}, "c": {"d"}, "d": {"b"}}, ["b", "c", "d", "b"]),
    ],
)
def test_find_cycle(graph: dict[str, set[str]], cycle: list[str] | None) -> None:
    assert find_cycle(graph) == cycle


def test_import_graph_resolution(tmp_path: Path) -> None:
    """Relative and absolute imports resolve to modules; TYPE_CHECKING imports are module-level,
    imports in functions only lazy; outside imports and self-imports are left out."""
    files = {
        "pkg/__init__.py": "from pkg.a import f\nfrom . import sub\n",
        "pkg/a.py": (
            "from typing import TYPE_CHECKING\nimport torch\n"
            "if TYPE_CHECKING:\n    from .sub import thing\n"
            "def g():\n    from pkg import b\n"
            "class C:\n    from pkg import a\n"
        ),
        "pkg/b.py": "import pkg.sub.deep\nfrom pkg import missing\n",
        "pkg/sub/__init__.py": "from ..a import f\nfrom .deep import x\n",
        "pkg/sub/deep.py": "from ... import nothing\nfrom .. import b\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    modules = load_modules(tmp_path, "pkg")

    assert import_graph(modules, lazy=False) == {
        "pkg": {"pkg.a": 1, "pkg.sub": 2},
        "pkg.a": {"pkg.sub": 4},
        "pkg.b": {"pkg.sub.deep": 1, "pkg": 2},
        "pkg.sub": {"pkg.a": 1, "pkg.sub.deep": 2},
        "pkg.sub.deep": {"pkg.b": 2},
    }
    assert import_graph(modules, lazy=True)["pkg.a"] == {"pkg.sub": 4, "pkg.b": 6}
    cycle = find_cycle(import_graph(modules, lazy=False))
    assert cycle == ["pkg.a", "pkg.sub", "pkg.a"]


def test_function_lengths() -> None:
    tree = ast.parse(
        "def f():\n    pass\n\n"
        "class C:\n    @property\n    def m(self):\n        def inner():\n            pass\n"
        "        return 1\n"
        "async def h(): pass\n"
    )
    found = {name: n for name, _, n in function_lengths(tree)}
    assert found == {"f": 2, "C.m": 4, "C.m.inner": 2, "h": 1}
