"""CvT's pieces as forward programs, for reverse mode (``symbolic.adjoint``).

A CvT stage is a chain of pieces: the convolutional token embedding (a strided
convolution) and its projection onto ``S_1``, and per step ``norm1``, each convolutional
projection (the depth-wise convolution then BatchNorm, one program), the convolutional
attention, ``norm2``, the feed-forward field; the readout's projection and head. Each
piece is one program whose adjoint is derived; between pieces the costate only changes
layout (the class node / grid split and the token concatenation, whose transposes are the
concatenation and the split) or adds up (the residual sums, ``Δt = 1``).
"""

from __future__ import annotations

from .cvt import CvtProgram
from .model_adjoint import _record
from .program import Program

__all__ = ["cvt_pieces"]


def cvt_pieces(model: CvtProgram) -> dict[str, tuple[Program, str, tuple]]:
    """Each piece as ``(forward program, the input whose costate its adjoint returns, its stages)``."""
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
