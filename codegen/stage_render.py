"""Template variables of one emitted network program (an embedding, a readout, a grid step, CvT's programs, their adjoints).

Input: a lowered stage (``codegen.ir.Module``) and the sizes its model fixes. Output: its
parameters (shape, view, group) and its statements by section, spelled by the backend.
"""

from __future__ import annotations

import sympy as sp

from .backends import BACKENDS
from .ir import Module
from .printers import CODE_NAMES, code

__all__ = ["stage_context"]


def _size(domain, sizes: dict) -> str | int:
    """A parameter axis in code: a number where the model fixes it (a kernel size), else a name."""
    size = domain.size.xreplace(sizes)
    if size.is_Integer:
        return int(size)
    return CODE_NAMES.get(size, domain.code_name if size == domain.size else code(size))


def _size_names(domain, sizes: dict) -> set[str]:
    """The names ``_size`` spells the axis with (none for a number)."""
    size = domain.size.xreplace(sizes)
    if size.is_Integer:
        return set()
    if size in CODE_NAMES or size == domain.size:
        return {_size(domain, sizes)}
    return {CODE_NAMES.get(symbol, symbol.name) for symbol in sp.sympify(size).free_symbols}


def _frees(module: Module) -> dict[int, list[str]]:
    """Statement position → the stage's own arrays (written here, not its output) read there for the last time."""
    own = {name for op in module.ops for name in op.writes()} - {module.output}
    last = {name: position for position, op in enumerate(module.ops) for name in op.reads() if name in own}
    free: dict[int, list[str]] = {}
    for name, position in sorted(last.items()):
        free.setdefault(position, []).append(name)
    return free


def stage_context(module: Module, backend: str, sizes: dict, free: bool = False,
                  group_sizes: dict[str, dict] | None = None) -> dict:
    """One emitted network program (or its adjoint): parameters and statements by section.

    ``free``: each array the stage writes (but its output) is deleted after its last reader.
    ``group_sizes``: the sizes of one operator's parameters (its key → sizes) where they are not ``sizes``
    (operators of one program fixing different kernel sizes).
    """
    parameters = []
    for info in module.tensors.values():
        if info.role != "param" or info.parameter is None:
            continue
        group, _, attribute = info.parameter.partition(".")
        own = (group_sizes or {}).get(group, sizes)
        shape = tuple(_size(domain, own) for domain in info.shape)
        view = tuple(_size(domain, own) for domain in info.view) if info.view else None
        parameters.append({"name": info.parameter, "variable": info.name, "group": group, "attribute": attribute,
                           "shape": shape, "view": view, "kind": info.kind,
                           "shape_names": set().union(*(_size_names(domain, own) for domain in info.shape)),
                           "view_names": set().union(*(_size_names(domain, own) for domain in info.view or ()))})
    sections: list[dict] = []
    frees = _frees(module) if free else {}
    spelled = [BACKENDS[backend].spell(module, op) for op in module.ops]
    for position, op in enumerate(module.ops):
        if not sections or sections[-1]["title"] != op.section:
            sections.append({"title": op.section, "statements": []})
        sections[-1]["statements"].append({"comment": op.comment.splitlines(), "code": spelled[position].lines,
                                           "free": frees.get(position, [])})
    return {"parameters": parameters, "sections": sections, "output": module.output,
            "groups": list(dict.fromkeys(parameter["group"] for parameter in parameters)),
            # the names the statements read besides arrays (helpers, sizes), and the arrays they read
            "uses": set().union(*(statement.used for statement in spelled)),
            "reads": {name for op in module.ops for name in op.reads()}}
