"""Template variables of one emitted model stage (an embedding, a readout, a stage's adjoint).

Input: a lowered stage (``codegen.ir.Module``) and the sizes its model fixes. Output: its
parameters (shape, view, group) and its statements by section, spelled by the backend.
"""

from __future__ import annotations

from .ir import Module
from .model_backends import CODE_NAMES, code, statements

__all__ = ["stage_context"]


def _size(domain, sizes: dict) -> str | int:
    """A parameter axis in code: a number where the model fixes it (a kernel size), else a name."""
    size = domain.size.xreplace(sizes)
    if size.is_Integer:
        return int(size)
    return CODE_NAMES.get(size, domain.code_name if size == domain.size else code(size))


def stage_context(module: Module, backend: str, sizes: dict) -> dict:
    """One emitted stage (embedding or readout): parameters and statements by section."""
    parameters = []
    for info in module.tensors.values():
        if info.role != "param" or info.parameter is None:
            continue
        group, _, attribute = info.parameter.partition(".")
        shape = tuple(_size(domain, sizes) for domain in info.shape)
        view = tuple(_size(domain, sizes) for domain in info.view) if info.view else None
        parameters.append({"name": info.parameter, "variable": info.name, "group": group, "attribute": attribute,
                           "shape": shape, "view": view, "kind": info.kind})
    sections: list[dict] = []
    for op in module.ops:
        if not sections or sections[-1]["title"] != op.section:
            sections.append({"title": op.section, "statements": []})
        sections[-1]["statements"].append({"comment": op.comment.splitlines(), "code": statements(backend, module, op)})
    return {"parameters": parameters, "sections": sections, "output": module.output,
            "groups": list(dict.fromkeys(parameter["group"] for parameter in parameters))}
