"""Template variables of CvT's derived adjoint (``vjp``, ``vjp_logits``, ``backward="derived"``).

Input: a ``CvtProgram``. Output: one derived backward per program of ``symbolic.cvt_adjoint``
(the embedding, a step, the stage's grid and class node, the readout; the chaining between
operators inside them), each the reverse mode over that program's assignments lowered as a
model stage's (``codegen.model_adjoint``): the forward statements it reads
(``codegen.program_lowering``), then the adjoint. The templates run them backwards through
the stages (``templates/cvt_adjoint.py.j2``).
"""

from __future__ import annotations

import re

from splitformer.symbolic.adjoint import derive_adjoint
from splitformer.symbolic.cvt import CvtProgram
from splitformer.symbolic.cvt_adjoint import cvt_programs

from .model_adjoint import lower_stage_adjoint
from .program_lowering import lower_program
from .stage_render import stage_context

__all__ = ["cvt_vjp_context"]

#: Configuration values (``config[name]``) and grid sizes the emitted statements may read.
CONFIG_NAMES = ("d", "n_heads", "kernel_qkv", "stride_q", "padding_q", "stride_kv", "padding_kv", "patch_size",
                "patch_stride", "patch_padding", "n_rows", "n_cols", "n_rows_kv", "n_cols_kv")


def _used(code: str, name: str) -> bool:
    return re.search(rf"\b{name}\b", code) is not None


def cvt_vjp_context(model: CvtProgram, backend: str) -> dict:
    """The derived backward of every program: forward statements it reads, adjoint, seed, gradients."""
    context = {}
    for name, piece in cvt_programs(model).items():
        forward = lower_program(piece.program)
        backward = lower_stage_adjoint(derive_adjoint(piece.program), forward, piece.input)
        forward_context = stage_context(forward, backend, piece.sizes)
        shapes = {parameter["name"]: parameter["shape"] for parameter in forward_context["parameters"] if parameter["view"]}
        functions = [stage_context(backward.forward, backend, piece.sizes),
                     stage_context(backward.adjoint, backend, piece.sizes)]
        code = "\n".join(line for function in functions for section in function["sections"]
                         for statement in section["statements"] for line in statement["code"])
        functions[0]["parameters"] = [parameter for parameter in functions[0]["parameters"]
                                      if _used(code, parameter["variable"])]
        shapes_code = " ".join(str(size) for parameter in functions[0]["parameters"] if parameter["view"]
                               for size in parameter["view"])
        shapes_code += " " + " ".join(str(size) for shape in shapes.values() for size in shape)
        head_size = _used(code + shapes_code, "d_head")
        config_names = [name for name in CONFIG_NAMES
                        if _used(code + shapes_code, name) or (head_size and name in ("d", "n_heads"))]
        context[name] = {
            "forward": functions[0], "adjoint": functions[1], "seed": backward.seed, "input": piece.input,
            "gradient_input": backward.gradients[piece.input],
            "config": config_names, "batch": _used(code, "batch"), "d_head": head_size,
            "dropout_p": _used(code, "dropout_p"),
            "gradients": [{"name": key, "variable": value, "shape": shapes.get(key)}
                          for key, value in backward.gradients.items() if key != piece.input],
        }
    return context
