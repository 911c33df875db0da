"""Template variables of CvT's derived adjoint (``vjp``, ``vjp_logits``, ``backward="derived"``).

Input: a ``CvtProgram``. Output: one derived backward per piece (``symbolic.cvt_adjoint``),
each the reverse mode over that piece's discretized assignments, lowered as a model
stage's (``codegen.model_adjoint``): the forward statements it reads, then the adjoint.
The templates chain them backwards (``templates/cvt_adjoint.py.j2``).
"""

from __future__ import annotations

from splitformer.symbolic.adjoint import derive_adjoint
from splitformer.symbolic.cvt import CvtProgram
from splitformer.symbolic.cvt_adjoint import cvt_pieces

from .model_adjoint import lower_stage_adjoint
from .model_lowering import lower_stage

__all__ = ["cvt_vjp_context"]


def cvt_vjp_context(model: CvtProgram, backend: str) -> dict:
    """The derived backward of every piece: forward statements it reads, adjoint, seed, gradients."""
    from .model_render import stage_context

    context = {}
    for name, (program, input_name, stages) in cvt_pieces(model).items():
        forward = lower_stage(stages[0])
        for stage in stages[1:]:
            more = lower_stage(stage)
            forward.ops.extend(more.ops)
            forward.tensors.update(more.tensors)
        forward.output = stages[-1].output
        backward = lower_stage_adjoint(derive_adjoint(program), forward, input_name)
        sizes = {key: value for stage in stages for key, value in getattr(stage.operator, "sizes", dict)().items()}
        forward_context = stage_context(forward, backend, sizes)
        shapes = {parameter["name"]: parameter["shape"] for parameter in forward_context["parameters"] if parameter["view"]}
        context[name] = {
            "forward": stage_context(backward.forward, backend, sizes),
            "adjoint": stage_context(backward.adjoint, backend, sizes),
            "seed": backward.seed, "input": input_name, "gradient_input": backward.gradients[input_name],
            "gradients": [{"name": key, "variable": value, "shape": shapes.get(key)}
                          for key, value in backward.gradients.items() if key != input_name],
        }
    return context
