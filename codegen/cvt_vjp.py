"""Template variables of CvT's derived adjoint (``vjp``, ``vjp_logits``, ``backward="derived"``).

Input: a ``CvtProgram``. Output: one derived backward per program of ``symbolic.cvt_adjoint``
(the embedding, a step, the stage's grid and class node, the readout; the chaining between
operators inside them), each the reverse mode over that program's assignments lowered as a
model stage's (``codegen.model_adjoint``): the forward statements it reads
(``codegen.program_lowering``), then the adjoint. The templates run them backwards through
the stages (``templates/cvt_adjoint.py.j2``).
"""

from __future__ import annotations

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


def cvt_vjp_context(model: CvtProgram, backend: str) -> dict:
    """The derived backward of every program: forward statements it reads, adjoint, seed, gradients.

    Each function binds the configuration values, sizes and parameters its statements read, as
    the backend recorded them while spelling the statements (``Spelled.used``, ``Op.reads``).
    """
    context = {}
    for name, piece in cvt_programs(model).items():
        forward = lower_program(piece.program)
        backward = lower_stage_adjoint(derive_adjoint(piece.program), forward, piece.input)
        with_views = [parameter for parameter in stage_context(forward, backend, piece.sizes)["parameters"]
                      if parameter["view"]]
        shapes = {parameter["name"]: parameter["shape"] for parameter in with_views}
        functions = [stage_context(backward.forward, backend, piece.sizes),
                     stage_context(backward.adjoint, backend, piece.sizes)]
        arrays = functions[0]["reads"] | functions[1]["reads"]
        functions[0]["parameters"] = [parameter for parameter in functions[0]["parameters"]
                                      if parameter["variable"] in arrays]
        code_names = functions[0]["uses"] | functions[1]["uses"]
        names = code_names.union(*(parameter["view_names"] for parameter in functions[0]["parameters"]
                                   if parameter["view"]), *(parameter["shape_names"] for parameter in with_views))
        head_size = "d_head" in names
        config_names = [name for name in CONFIG_NAMES if name in names or (head_size and name in ("d", "n_heads"))]
        context[name] = {
            "forward": functions[0], "adjoint": functions[1], "seed": backward.seed, "input": piece.input,
            "gradient_input": backward.gradients[piece.input],
            "config": config_names, "batch": "batch" in code_names, "d_head": head_size,
            "dropout_p": "dropout_p" in code_names,
            "gradients": [{"name": key, "variable": value, "shape": shapes.get(key)}
                          for key, value in backward.gradients.items() if key != piece.input],
        }
    return context
