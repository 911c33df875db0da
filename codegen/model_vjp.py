"""Template variables of a model's derived adjoint (``vjp`` and ``backward="derived"``).

Input: a ``ModelProgram`` and its lowered stages. Output: the variables of the model
templates' adjoint part: the step's and the final projection's backward functions (as a
block's, ``codegen.adjoint``), and the embedding's and readout's adjoints
(``codegen.model_adjoint``), each a function of the costate of its output.
"""

from __future__ import annotations

from splitformer.symbolic.adjoint import has_adjoint
from splitformer.symbolic.model_adjoint import derive_model_adjoint
from splitformer.symbolic.model_derivation import INPUT, ModelProgram

from .adjoint import backward_context, lower_adjoint
from .ir import Module
from .model_adjoint import lower_stage_adjoint

__all__ = ["model_vjp_context"]


def _stage(backward, backend: str, sizes: dict, parameters: list[dict]) -> dict:
    from .model_render import stage_context

    order = [parameter["name"] for parameter in parameters]
    gradients = [{"name": name, "variable": variable} for name, variable in backward.gradients.items()
                 if name != backward.input]
    gradients.sort(key=lambda gradient: order.index(gradient["name"]))
    return {"forward": stage_context(backward.forward, backend, sizes),
            "adjoint": stage_context(backward.adjoint, backend, sizes),
            "seed": backward.seed, "gradient_input": backward.gradients[backward.input], "gradients": gradients}


def model_vjp_context(model: ModelProgram, units: dict[str, Module], backend: str, contexts: dict, passes=None) -> dict | None:
    """The adjoint's template variables (``None`` where the step scheme has no derived adjoint).

    ``contexts`` holds the forward stages' template variables (``embedding``, ``readout``).
    """
    if not has_adjoint(model.spec.scheme):
        return None
    adjoint = derive_model_adjoint(model)
    sizes = getattr(model.spec.embedding, "sizes", dict)()
    embedding = lower_stage_adjoint(adjoint.embedding, units["embedding"], INPUT, sizes)
    readout = lower_stage_adjoint(adjoint.readout, units["readout"], "u", {})
    step = backward_context(lower_adjoint(adjoint.step, passes), backend)
    final = backward_context(lower_adjoint(adjoint.final, passes), backend) if adjoint.final is not None else None
    functions = [step["forward"], step["adjoint"], *([final["forward"], final["adjoint"]] if final else [])]
    return {
        "step": step, "final": final,
        "embedding": _stage(embedding, backend, sizes, contexts["embedding"]["parameters"]),
        "readout": _stage(readout, backend, {}, contexts["readout"]["parameters"]),
        "uses": set().union(*(function["uses"] for function in functions)),
        "erf": any(function["uses_erf"] for function in functions),
    }
