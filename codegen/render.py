"""Emission: lowered modules through a backend's Jinja templates → Python source."""

from __future__ import annotations

from importlib import resources

import jinja2

from splitformer.symbolic import __version__
from splitformer.symbolic.domains import HIDDEN
from splitformer.symbolic.scheme import Scheme

from .backends import BACKENDS
from .ir import Module

__all__ = ["environment", "render_module", "unit_context"]


def environment() -> jinja2.Environment:
    """The Jinja environment of all templates (strict, deterministic whitespace)."""
    folder = resources.files("splitformer.templates")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["pytuple"] = lambda names: "(" + "".join(f'"{name}", ' for name in names).rstrip(" ") + ")"
    env.filters["shape"] = lambda names: "(" + ", ".join(names) + ")"
    env.filters["union"] = lambda first, second: set(first) | set(second)
    # user text in Markdown: raw HTML is shown, never interpreted
    env.filters["text"] = lambda text: text.replace("&", "&amp;").replace("<", "&lt;")
    return env


def _code_shape(domains) -> tuple[str, ...]:
    return tuple(domain.code_name for domain in domains)


def unit_context(module: Module, backend: str) -> dict:
    """One emitted function: its parameters, its statements grouped by substep, its output."""
    spelling = BACKENDS[backend]
    parameters = []
    hidden = None
    for info in module.tensors.values():
        if info.role != "param":
            continue
        group, attribute = info.parameter.split(".")
        shape = _code_shape(info.shape)
        view = _code_shape(info.view) if info.view is not None else shape
        if hidden is None and HIDDEN in info.shape:
            hidden = (info.parameter, info.shape.index(HIDDEN))
        parameters.append({
            "name": info.parameter, "variable": info.name, "group": group, "attribute": attribute,
            "shape": shape, "view": view if view != shape else None, "kind": info.kind,
        })
    sections: list[dict] = []
    for op in module.ops:
        if not sections or sections[-1]["title"] != op.section:
            sections.append({"title": op.section, "statements": []})
        sections[-1]["statements"].append({"comment": op.comment.splitlines(), "code": spelling.statements(module, op)})
    code = "\n".join(line for section in sections for statement in section["statements"] for line in statement["code"])
    return {
        "parameters": parameters,
        "groups": list(dict.fromkeys(parameter["group"] for parameter in parameters)),
        "hidden": hidden,
        "sections": sections,
        "uses_support": "chi" in module.tensors,
        "uses_erf": "_erf(" in code,
        "uses": {helper for helper in ("_einsum", "_softmax", "_attention", "_layer_norm", "_rms_norm") if f"{helper}(" in code},
        "output": module.output,
    }


def render_module(scheme: Scheme, block: Module, final_norm: Module, backend: str) -> str:
    """The source of the generated ``backend`` module: the block and a stack's final norm."""
    template = environment().get_template(f"{backend}/module.py.j2")
    return template.render(
        scheme=scheme,
        module=block,
        version=__version__,
        block=unit_context(block, backend),
        final=unit_context(final_norm, backend),
    )
