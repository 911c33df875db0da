"""Template variables of a model's derived adjoint (``vjp`` and ``backward="derived"``).

Input: a ``ModelProgram`` and its lowered stages. Output: the variables of the model
templates' adjoint part: the step's and the final projection's backward functions (as a
block's, ``codegen.adjoint``), and the embedding's and readout's adjoints
(``codegen.model_adjoint``), each a function of the costate of its output.
"""

from __future__ import annotations

from splitformer.symbolic.model_adjoint import derive_model_adjoint
from splitformer.symbolic.model_derivation import INPUT, ModelProgram

from .adjoint import lower_adjoint
from .ir import Module
from .model_adjoint import lower_stage_adjoint
from .render import backward_context
from .stage_render import stage_context

__all__ = ["model_vjp_context"]


def _stage(backward, backend: str, sizes: dict, parameters: list[dict]) -> dict:
    order = [parameter["name"] for parameter in parameters]
    gradients = [{"name": name, "variable": variable} for name, variable in backward.gradients.items()
                 if name != backward.input]
    gradients.sort(key=lambda gradient: order.index(gradient["name"]))
    return {"forward": stage_context(backward.forward, backend, sizes),
            "adjoint": stage_context(backward.adjoint, backend, sizes),
            "seed": backward.seed, "gradient_input": backward.gradients[backward.input], "gradients": gradients}


def model_vjp_context(model: ModelProgram, units: dict[str, Module], backend: str, contexts: dict, passes=None) -> dict:
    """The adjoint's template variables.

    ``contexts`` holds the forward stages' template variables (``embedding``, ``readout``).
    """
    adjoint = derive_model_adjoint(model)
    sizes = getattr(model.spec.embedding, "sizes", dict)()
    embedding = lower_stage_adjoint(adjoint.embedding, units["embedding"], INPUT)
    readout = lower_stage_adjoint(adjoint.readout, units["readout"], "u")
    step = backward_context(lower_adjoint(adjoint.step, passes), backend)
    final = backward_context(lower_adjoint(adjoint.final, passes), backend) if adjoint.final is not None else None
    stages = {"embedding": _stage(embedding, backend, sizes, contexts["embedding"]["parameters"]),
              "readout": _stage(readout, backend, {}, contexts["readout"]["parameters"])}
    functions = [part[name] for part in (step, final or {}, *stages.values()) for name in ("forward", "adjoint")
                 if name in part]
    return {"step": step, "final": final, **stages, "uses": set().union(*(function["uses"] for function in functions))}
