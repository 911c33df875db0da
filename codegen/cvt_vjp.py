"""Template variables of CvT's derived programs: its forward and its adjoint (``vjp``, ``vjp_logits``,
``backward="derived"``).

Input: a ``CvtProgram``. Output: one entry per program of ``symbolic.cvt_adjoint`` (the
embedding, a step, the stage's grid and class node, the readout; the chaining between
operators inside them, in index notation): its forward, lowered (``codegen.program_lowering``)
and optimized (``passes.NETWORK_STAGE``), which the emitted forward chains through the stages;
and its derived backward, the reverse mode over the same assignments lowered as a model
stage's (``codegen.model_adjoint``): the forward statements it reads, then the adjoint. The
templates run the backwards through the stages (``templates/cvt_adjoint.py.j2``).
"""

from __future__ import annotations

from splitformer.symbolic.adjoint import derive_adjoint
from splitformer.symbolic.cvt import CvtProgram
from splitformer.symbolic.cvt_adjoint import cvt_programs

from .model_adjoint import lower_stage_adjoint
from .program_lowering import lower_program, optimized
from .stage_render import stage_context

__all__ = ["cvt_vjp_context"]

#: Configuration values (``config[name]``) and grid sizes the emitted statements may read.
CONFIG_NAMES = ("d", "n_heads", "kernel_qkv", "stride_q", "padding_q", "stride_kv", "padding_kv", "patch_size",
                "patch_stride", "patch_padding", "n_rows", "n_cols", "n_rows_kv", "n_cols_kv", "n_tokens", "n_memory")


def _binding(functions: list[dict], reshaped: list[dict] = ()) -> dict:
    """What a function made of ``functions`` binds before its statements: the parameters they read
    (``Op.reads``), the configuration values and sizes the backend recorded while spelling them
    (``Spelled.used``) or that the parameters' views and ``reshaped`` shapes name."""
    arrays = set().union(*(function["reads"] for function in functions))
    parameters = [parameter for parameter in functions[0]["parameters"] if parameter["variable"] in arrays]
    code_names = set().union(*(function["uses"] for function in functions))
    names = code_names.union(*(parameter["view_names"] for parameter in parameters if parameter["view"]),
                             *(parameter["shape_names"] for parameter in reshaped))
    head_size = "d_head" in names
    # any other size the statements read is an axis of a parameter (``d_ff``: ``ffn.W_1``'s second)
    sizes = {}
    for parameter in parameters:
        for axis, size in enumerate(parameter["shape"]):
            if size in code_names and size not in (*CONFIG_NAMES, "batch", "d_head"):
                sizes.setdefault(size, (parameter["name"], axis))
    return {"parameters": parameters,
            "config": [name for name in CONFIG_NAMES if name in names or (head_size and name in ("d", "n_heads"))],
            "batch": "batch" in code_names, "d_head": head_size, "dropout_p": "dropout_p" in code_names,
            "sizes": sizes}


def cvt_vjp_context(model: CvtProgram, backend: str) -> dict:
    """Every program of ``symbolic.cvt_adjoint``: its forward (``run``, what the emitted forward
    chains) and its derived backward (the forward statements the adjoint reads, the adjoint, the
    seed, the gradients), each with what it binds (``_binding``)."""
    context = {}
    for name, piece in cvt_programs(model).items():
        forward = lower_program(piece.program)
        backward = lower_stage_adjoint(derive_adjoint(piece.program), forward, piece.input)
        run = stage_context(optimized(forward), backend, piece.sizes, free=True)
        with_views = [parameter for parameter in stage_context(forward, backend, piece.sizes)["parameters"]
                      if parameter["view"]]
        shapes = {parameter["name"]: parameter["shape"] for parameter in with_views}
        functions = [stage_context(backward.forward, backend, piece.sizes),
                     stage_context(backward.adjoint, backend, piece.sizes)]
        binding = _binding(functions, with_views)
        functions[0]["parameters"] = binding["parameters"]
        context[name] = {
            "forward": functions[0], "adjoint": functions[1], "seed": backward.seed, "input": piece.input,
            "gradient_input": backward.gradients[piece.input], **binding,
            "run": {**run, **_binding([run])},
            "gradients": [{"name": key, "variable": value, "shape": shapes.get(key)}
                          for key, value in backward.gradients.items() if key != piece.input],
        }
    return context
