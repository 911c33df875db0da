"""Emission of whole models: the lowered stages through a backend's model template."""

from __future__ import annotations

from splitformer.symbolic import __version__
from splitformer.symbolic.model_derivation import TOKENS_DISCRETE, ModelProgram

from .ir import BATCH, Module
from .lowering import lower
from .model_backends import CODE_NAMES, statements
from .model_ir import Tokens
from .model_lowering import lower_stage
from .render import environment, unit_context

__all__ = ["render_model", "stage_context", "model_units"]


def stage_context(module: Module, backend: str, sizes: dict) -> dict:
    """One emitted stage (embedding or readout): parameters and statements by section."""
    parameters = []
    for info in module.tensors.values():
        if info.role != "param":
            continue
        group, attribute = info.parameter.split(".")
        shape = tuple(CODE_NAMES.get(domain.size.xreplace(sizes), domain.code_name) for domain in info.shape)
        parameters.append({"name": info.parameter, "variable": info.name, "group": group, "attribute": attribute,
                           "shape": shape, "view": None, "kind": info.kind})
    sections: list[dict] = []
    for op in module.ops:
        if not sections or sections[-1]["title"] != op.section:
            sections.append({"title": op.section, "statements": []})
        sections[-1]["statements"].append({"comment": op.comment.splitlines(), "code": statements(backend, module, op)})
    return {"parameters": parameters, "sections": sections, "output": module.output,
            "groups": list(dict.fromkeys(parameter["group"] for parameter in parameters))}


def model_units(model: ModelProgram, passes=None) -> dict[str, Module]:
    """The lowered stages: embedding (with the initial condition on the tokens), step, final, readout."""
    embedding = lower_stage(model.embedding)
    key = model.embedding.operator.key
    embedding.ops.append(Tokens("u0", (BATCH, "i", "l"), TOKENS_DISCRETE, embedding.ops[-1].section,
                                node=f"{key}_cls", grid=embedding.output, position=f"{key}_pos"))
    embedding.output = "u0"
    units = {"embedding": embedding, "step": lower(model.step, passes), "readout": lower_stage(model.readout)}
    if model.final is not None:
        units["final"] = lower(model.final, passes)
    return units


def render_model(model: ModelProgram, backend: str, passes=None) -> str:
    """The source of the generated ``backend`` module of ``model``."""
    units = model_units(model, passes)
    sizes = getattr(model.spec.embedding, "sizes", dict)()
    step = unit_context(units["step"], backend)
    final = unit_context(units["final"], backend) if "final" in units else None
    helpers = step["uses"] | (final["uses"] if final else set()) | {"_einsum"}
    template = environment().get_template(f"{backend}/model.py.j2")
    return template.render(
        model=model.spec, name=model.name, scheme=model.spec.scheme, version=__version__,
        embedding=stage_context(units["embedding"], backend, sizes), block=step, final=final,
        readout=stage_context(units["readout"], backend, {}), uses=helpers,
    )
