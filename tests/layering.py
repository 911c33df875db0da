"""The project's import graph read from its source, and the layering rules checked on it.

Every import counts, at module level or inside a function (a deferred import is still a
dependency in the design), and so does ``import_module`` with a literal name; only imports
under ``if TYPE_CHECKING:`` do not (they name a type for annotations and never run). An edge goes
from the importing module to each project module it names: ``from .a import b`` reaches
``a.b`` when that is a module, ``a`` otherwise. The folders map to dotted names as the
install maps them (``symbolic/`` is ``splitformer.symbolic``; see pyproject.toml).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Import", "ImportGraph", "read_package", "circles", "private_imports", "forbidden_imports"]


@dataclass(frozen=True)
class Import:
    """``source`` imports ``target`` (and ``name`` from it, for ``from target import name``) on ``line``."""

    source: str
    target: str
    name: str | None
    line: int


@dataclass(frozen=True)
class ImportGraph:
    """The modules of a package tree (dotted name → file) and every import among them."""

    modules: Mapping[str, Path]
    imports: tuple[Import, ...]

    def edges(self) -> dict[str, set[str]]:
        """Module → the project modules it imports."""
        graph: dict[str, set[str]] = {name: set() for name in self.modules}
        for found in self.imports:
            if found.target != found.source:
                graph[found.source].add(found.target)
        return graph


def _module_names(folders: Mapping[str, Path]) -> dict[str, Path]:
    names = {}
    for package, folder in folders.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if all((folder.joinpath(*parts[:depth]) / "__init__.py").exists() for depth in range(len(parts))):
                names[".".join((package, *parts))] = path
    return names


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _absolute(module: str, path: Path, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    base = module.split(".")
    base = base if _is_package(path) else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None) if isinstance(node, ast.If) else None
    return getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING"


def _nodes(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node of ``tree`` but the bodies of ``if TYPE_CHECKING:`` (their ``else`` runs)."""
    for child in ast.iter_child_nodes(tree):
        yield child
        if _type_checking(child):
            for other in child.orelse:
                yield other
                yield from _nodes(other)
        else:
            yield from _nodes(child)


def _imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> Iterable[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in _nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield Import(module, alias.name, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node.level, node.module)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    yield Import(module, f"{base}.{alias.name}", None, node.lineno)
                elif base in modules:
                    yield Import(module, base, alias.name, node.lineno)
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            written = node.args[0].value
            dots = len(written) - len(written.lstrip("."))
            target = _absolute(module, path, dots, written.lstrip(".") or None) if dots else written
            if target in modules:
                yield Import(module, target, None, node.lineno)


def read_package(folders: Mapping[str, Path]) -> ImportGraph:
    """The import graph of the modules under ``folders`` (dotted package name → folder)."""
    modules = _module_names(folders)
    imports = tuple(found for module, path in modules.items() for found in _imports_of(module, path, modules))
    return ImportGraph(modules, imports)


def circles(graph: ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    edges = graph.edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def private_imports(graph: ImportGraph) -> list[Import]:
    """Imports of a ``_name`` from another module (a dunder such as ``__all__`` is public)."""
    return [found for found in graph.imports
            if found.name and found.name.startswith("_") and not found.name.startswith("__")
            and found.target != found.source]


def forbidden_imports(graph: ImportGraph, importers: Iterable[str], imported: Iterable[str]) -> list[Import]:
    """Imports from a module under any of ``importers`` of a module under any of ``imported``."""

    def under(name: str, prefixes: Iterable[str]) -> bool:
        return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)

    importers, imported = tuple(importers), tuple(imported)
    return [found for found in graph.imports if under(found.source, importers) and under(found.target, imported)]
