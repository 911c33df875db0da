"""Template variables of CvT's derived adjoint (``vjp``, ``vjp_logits``).

Input: a ``CvtProgram``. Output: one derived backward per piece of a stage, each the
reverse mode (``symbolic.adjoint``) over that piece's discretized assignments, lowered as
a model stage's (``codegen.model_adjoint``): the convolutional token embedding and its
projection, ``norm1``, each convolutional projection (depth-wise convolution then
BatchNorm, one program), the convolutional attention, ``norm2``, the feed-forward field,
and the readout's projection and head. The template chains them backwards; between them
the costate only changes layout (class node / grid split and token concatenation, whose
transposes are the concatenation and the split) or adds up (the residual sums, Δt = 1).
"""

from __future__ import annotations

from splitformer.symbolic.adjoint import derive_adjoint
from splitformer.symbolic.cvt import CvtProgram
from splitformer.symbolic.model_adjoint import _record
from splitformer.symbolic.program import Program

from .model_adjoint import lower_stage_adjoint
from .model_lowering import lower_stage

__all__ = ["cvt_pieces", "cvt_vjp_context"]


def cvt_pieces(model: CvtProgram) -> dict[str, tuple[Program, str, tuple]]:
    """Each piece of a CvT stage as a forward program, with the name of the input whose costate
    it returns and its stages."""
    pieces = {"embed": ((model.embedding[0],), "u0"), "embed_norm": ((model.embedding[1],), "tokens"),
              "norm1": ((model.norm1,), "u0")}
    for (conv, norm), letter in zip(model.projections, "qkv"):
        pieces[f"{letter}proj"] = ((conv, norm), "grid")
    pieces |= {"attn": ((model.attention,), "q_in"), "norm2": ((model.norm2,), "u1"),
               "ffn": ((model.ffn,), "norm2_out"), "final_norm": ((model.readout[0],), "cls"),
               "head": ((model.readout[1],), "final_norm_out")}
    programs = {}
    for name, (stages, input_name) in pieces.items():
        tensors = {key: tensor for stage in stages for key, tensor in stage.tensors.items()}
        programs[name] = (Program(f"{model.module_name}_{name}", tensors, [_record(stage) for stage in stages],
                                  stages[-1].output), input_name, stages)
    return programs


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
