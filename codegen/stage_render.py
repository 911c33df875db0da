"""Template variables of the emitted network programs (an embedding, a readout, a grid step, CvT's programs).

Input: a network ``Program`` (its operators' assignments and the chaining between them, in
index notation) and the sizes its network fixes. Output (``program_context``): its forward,
lowered (``codegen.lowering``) and optimized (``passes.network_passes``), and its
derived backward, the reverse mode over the same assignments (``codegen.adjoint``): the
forward statements the adjoint reads, then the adjoint; each function's parameters (shape,
view, group), statements by section spelled by the backend, and what it binds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy as sp

from splitformer.symbolic.network_program import Piece
from splitformer.symbolic.program import Program

from .adjoint import Backward, lower_stage_adjoint
from .backends import BACKENDS
from .bool_values import with_dtype_of
from .ir import Convolution, Module
from .lowering import lower
from .passes import NETWORK_ADJOINT_STAGE, network_passes, run_passes
from .passes.convolution import convolution
from .printers import CODE_NAMES, code

__all__ = ["LoweredProgram", "lower_program", "stage_context", "program_context"]

#: Configuration values (``config[name]``) and grid sizes the emitted statements may read.
CONFIG_NAMES = ("d", "n_heads", "stride", "kernel_qkv", "stride_q", "padding_q", "stride_kv", "padding_kv", "patch_size",
                "patch_stride", "patch_padding", "n_rows", "n_cols", "n_rows_kv", "n_cols_kv", "n_tokens", "n_memory")


def _size(domain, sizes: dict) -> str | int:
    """A parameter axis in code: a number where the model fixes it (a kernel size), else a name."""
    size = domain.size.xreplace(sizes)
    if size.is_Integer:
        return int(size)
    return CODE_NAMES.get(size, domain.code_name if size == domain.size else code(size))


def _size_names(domain, sizes: dict) -> set[str]:
    """The names ``_size`` spells the axis with (none for a number)."""
    size = domain.size.xreplace(sizes)
    if size.is_Integer:
        return set()
    if size in CODE_NAMES or size == domain.size:
        return {_size(domain, sizes)}
    return {CODE_NAMES.get(symbol, symbol.name) for symbol in sp.sympify(size).free_symbols}


def _frees(module: Module) -> dict[int, list[str]]:
    """Statement position → the stage's own arrays (written here, not its output) read there for the last time."""
    own = {name for op in module.ops for name in op.writes()} - {module.output}
    last = {name: position for position, op in enumerate(module.ops) for name in op.reads() if name in own}
    free: dict[int, list[str]] = {}
    for name, position in sorted(last.items()):
        free.setdefault(position, []).append(name)
    return free


def stage_context(module: Module, backend: str, sizes: dict, free: bool = False,
                  group_sizes: dict[str, dict] | None = None) -> dict:
    """One emitted network program (or its adjoint): parameters and statements by section.

    ``free``: each array the stage writes (but its output) is deleted after its last reader.
    ``group_sizes``: the sizes of one operator's parameters (its key → sizes) where they are not ``sizes``
    (operators of one program fixing different kernel sizes).
    """
    parameters = []
    for info in module.parameters():
        group, _, attribute = info.parameter.partition(".")
        own = (group_sizes or {}).get(group, sizes)
        shape = tuple(_size(domain, own) for domain in info.shape)
        view = tuple(_size(domain, own) for domain in info.view) if info.view else None
        parameters.append({"name": info.parameter, "variable": info.name, "group": group, "attribute": attribute,
                           "shape": shape, "view": view, "kind": info.kind,
                           "shape_names": set().union(*(_size_names(domain, own) for domain in info.shape)),
                           "view_names": set().union(*(_size_names(domain, own) for domain in info.view or ()))})
    sections: list[dict] = []
    frees = _frees(module) if free else {}
    spelled = [BACKENDS[backend].spell(module, op) for op in module.ops]
    for position, op in enumerate(module.ops):
        if not sections or sections[-1]["title"] != op.section:
            sections.append({"title": op.section, "statements": []})
        sections[-1]["statements"].append({"comment": op.comment.splitlines(), "code": spelled[position].lines,
                                           "free": frees.get(position, [])})
    holds_scratch = BACKENDS[backend].scratch_outputs and any(isinstance(op, Convolution) and op.scratch
                                                              for op in module.ops)
    return {"parameters": parameters, "sections": sections, "output": module.output, "holds_scratch": holds_scratch,
            "groups": list(dict.fromkeys(parameter["group"] for parameter in parameters)),
            # the names the statements read besides arrays (helpers, sizes), and the arrays they read
            "uses": set().union(*(statement.used for statement in spelled)),
            "reads": {name for op in module.ops for name in op.reads()}}


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
            "batch": "batch" in code_names, "d_head": head_size, "uses": code_names, "sizes": sizes}


@dataclass(frozen=True)
class LoweredProgram:
    """One network program lowered for every backend: its forward as lowered (``forward``) and optimized (``run``), its
    derived backward (``lower_stage_adjoint``) and the backward's two functions optimized."""

    program: Program
    input: str
    forward: Module
    run: Module
    backward: Backward
    functions: tuple[Module, Module]


def lower_program(piece: Piece, passes: tuple | None = None) -> LoweredProgram:
    """``piece``'s program's forward (dead arrays freed, optimized by ``network_passes(passes)``) and its derived backward
    (the forward statements the adjoint reads, the adjoint, each optimized by ``NETWORK_ADJOINT_STAGE``; the seed, the
    costate of the piece's input): what no backend changes, so lowered once for all of them."""
    program, input_name = piece.program, piece.input
    forward = lower(program, (convolution,), network=True)
    backward = lower_stage_adjoint(piece.adjoint, forward, input_name)
    adjoint_passes = network_passes(passes, NETWORK_ADJOINT_STAGE)
    adjoint = run_passes(backward.adjoint, adjoint_passes)
    adjoint = replace(adjoint, ops=[with_dtype_of(op, backward.seed) for op in adjoint.ops])
    return LoweredProgram(program, input_name, forward, run_passes(forward, network_passes(passes)), backward,
                          (run_passes(backward.forward, adjoint_passes), adjoint))


def program_context(lowered: LoweredProgram, backend: str, sizes: dict | None = None,
                    group_sizes: dict[str, dict] | None = None) -> dict:
    """One lowered network program spelled by ``backend``: its forward (``run``) and its derived backward (the seed, the
    costate of its input, the gradients in the order of the parameters), each with what it binds (``_binding``)."""
    backward, input_name = lowered.backward, lowered.input

    def context(module: Module, free: bool = False) -> dict:
        return stage_context(module, backend, sizes or {}, free, group_sizes)

    run = context(lowered.run, free=True)
    with_views = [parameter for parameter in context(lowered.forward)["parameters"] if parameter["view"]]
    functions = [context(function) for function in lowered.functions]
    binding = _binding(functions, with_views)
    functions[0]["parameters"] = binding["parameters"]
    shapes = {parameter["name"]: parameter["shape"] for parameter in with_views}
    order = [tensor.parameter for tensor in lowered.program.tensors.values() if tensor.role == "param"]
    gradients = sorted((name for name in backward.gradients if name != input_name), key=order.index)
    return {"forward": functions[0], "adjoint": functions[1], "seed": backward.seed, "input": input_name,
            "gradient_input": backward.gradients[input_name], **binding, "run": {**run, **_binding([run])},
            "gradients": [{"name": name, "variable": backward.gradients[name], "shape": shapes.get(name)}
                          for name in gradients]}
