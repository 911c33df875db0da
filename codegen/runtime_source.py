"""The runtime helpers a generated module uses, inlined into it from ``runtime/``.

A template marks where each runtime module's helpers go (``{{ runtime("numpy_helpers") }}``);
``inline_runtime`` reads the names the rendered module uses (``ast``) and writes, at each mark,
the definitions of that runtime module the module reaches: those it reads, and those they read,
in the runtime module's order. A definition is a paragraph of the runtime module (statements not
parted by a blank line, the comments right above them included), so constants stay grouped.
The generated module keeps its own imports: it imports the standard library and its backend,
never splitformer.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

__all__ = ["RUNTIME_MODULES", "Definition", "definitions", "runtime_mark", "inline_runtime"]

#: The runtime modules a backend's generated code may use (``runtime/<name>.py``).
RUNTIME_MODULES = {
    "numpy": ("checks", "numpy_helpers", "numpy_inputs", "numpy_grids", "numpy_parameters"),
    "torch": ("checks", "torch_helpers", "torch_inputs", "torch_grids", "torch_parameters"),
}
_MARK = re.compile(r"^#@runtime (\w+)\n", re.MULTILINE)


@dataclass(frozen=True)
class Definition:
    """One paragraph of a runtime module: the names it binds, the names it reads, its text."""

    module: str
    position: int
    binds: frozenset[str]
    reads: frozenset[str]
    text: str


def runtime_mark(module: str) -> str:
    """The line a template writes where the helpers of ``runtime/<module>.py`` go."""
    if not any(module in names for names in RUNTIME_MODULES.values()):
        raise ValueError(f"no runtime module {module!r}")
    return f"#@runtime {module}"


def _bound(statement: ast.stmt) -> set[str]:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).partition(".")[0] for alias in statement.names}
    targets = statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)]
    return {node.id for target in targets if target is not None for node in ast.walk(target)
            if isinstance(node, ast.Name)}


def _read(node: ast.AST) -> set[str]:
    return {child.id for child in ast.walk(node) if isinstance(child, ast.Name)}


@cache
def _module(name: str) -> tuple[dict[str, str], tuple[Definition, ...]]:
    """The names ``runtime/<name>.py`` imports (name → its import statement) and its definitions."""
    source = resources.files("splitformer.runtime").joinpath(f"{name}.py").read_text(encoding="utf-8")
    lines = source.splitlines()
    imports: dict[str, str] = {}
    paragraphs: list[tuple[int, int, list[ast.stmt]]] = []
    for statement in ast.parse(source).body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            imports.update(dict.fromkeys(_bound(statement), ast.get_source_segment(source, statement)))
            continue
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # the module's docstring
        first = min([statement.lineno] + [node.lineno for node in getattr(statement, "decorator_list", [])])
        while first > 1 and lines[first - 2].lstrip().startswith("#"):
            first -= 1
        if paragraphs and first == paragraphs[-1][1] + 1:
            paragraphs[-1] = (paragraphs[-1][0], statement.end_lineno, paragraphs[-1][2] + [statement])
        else:
            paragraphs.append((first, statement.end_lineno, [statement]))
    found = tuple(Definition(name, position, frozenset().union(*map(_bound, statements)),
                             frozenset().union(*map(_read, statements)), "\n".join(lines[first - 1:last]))
                  for position, (first, last, statements) in enumerate(paragraphs))
    return imports, found


@cache
def definitions(backend: str) -> dict[str, Definition]:
    """Name → the definition binding it, over the runtime modules of ``backend``; a name bound twice
    is an error of the runtime modules."""
    table: dict[str, Definition] = {}
    for module in RUNTIME_MODULES[backend]:
        for definition in _module(module)[1]:
            for name in definition.binds:
                if name in table:
                    raise ValueError(f"runtime/{module}.py and runtime/{table[name].module}.py both define {name}")
                table[name] = definition
    return table


def _reached(reads: set[str], table: dict[str, Definition], own: set[str]) -> list[Definition]:
    """The definitions ``reads`` reaches through ``table``, transitively; not those of names the module binds itself."""
    reached: dict[tuple[str, int], Definition] = {}
    pending = [name for name in reads if name in table and name not in own]
    while pending:
        definition = table[pending.pop()]
        if (definition.module, definition.position) not in reached:
            reached[definition.module, definition.position] = definition
            pending += [name for name in definition.reads if name in table and name not in own]
    return list(reached.values())


def inline_runtime(source: str, backend: str) -> str:
    """``source`` (a rendered module with its runtime marks) with, at each mark, the definitions of that
    runtime module it uses, each followed by two blank lines; a mark of a module it does not use vanishes.
    A plain ``import name`` those definitions need (``threading``, ``weakref``) joins the module's first
    block of plain imports, so a module imports what its helpers use and nothing more; any other import
    they need (``import numpy as np``) must be the module's own."""
    tree = ast.parse(source)
    own = set().union(*map(_bound, tree.body))
    table = definitions(backend)
    reached = _reached(_read(tree), table, own)
    marks = _MARK.findall(source)
    marked = set(marks)
    if len(marks) > len(marked):
        raise ValueError(f"a runtime module is marked twice: {sorted(marks)}")
    added: set[str] = set()
    for definition in reached:
        if definition.module not in marked:
            raise ValueError(f"the module uses {sorted(definition.binds)} of runtime/{definition.module}.py "
                             f"but its template has no {runtime_mark(definition.module)!r} line")
        imports = _module(definition.module)[0]
        needed = {name for name in definition.reads & imports.keys() - own if name not in table}
        added |= {name for name in needed if imports[name] == f"import {name}"}
        missing = sorted(needed - added)
        if missing:
            raise ValueError(f"{sorted(definition.binds)} of runtime/{definition.module}.py need "
                             f"{', '.join(imports[name] for name in missing)}, which the module lacks")
    text = {module: "".join(definition.text + "\n\n\n" for definition in
                            sorted(reached, key=lambda definition: definition.position) if definition.module == module)
            for module in marked}
    return _MARK.sub(lambda match: text[match[1]], _with_imports(source, tree, added))


def _with_imports(source: str, tree: ast.Module, names: set[str]) -> str:
    """``source`` with ``import name`` for each of ``names`` in its first block of plain imports, sorted (before its
    first import, as a block of its own, where that is not a plain one)."""
    if not names:
        return source
    lines = source.splitlines(keepends=True)
    statements = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    block = []
    for node in statements:
        plain = isinstance(node, ast.Import) and all(alias.asname is None for alias in node.names)
        if not plain or (block and node.lineno != block[-1].end_lineno + 1):
            break
        block.append(node)
    if not block:
        first = statements[0].lineno - 1 if statements else 0
        return "".join(lines[:first] + [f"import {name}\n" for name in sorted(names)] + ["\n"] + lines[first:])
    present = {alias.name for node in block for alias in node.names}
    merged = sorted(present | names)
    return "".join(lines[:block[0].lineno - 1] + [f"import {name}\n" for name in merged]
                   + lines[block[-1].end_lineno:])
