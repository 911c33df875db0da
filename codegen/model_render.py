"""Emission of whole models: the lowered stages through a backend's model template."""

from __future__ import annotations

from splitformer.symbolic import __version__
from splitformer.symbolic.cvt import CvtProgram
from splitformer.symbolic.model import MultiscaleSpec, network_fingerprint
from splitformer.symbolic.adjoint import derive_adjoint
from splitformer.symbolic.model_adjoint import embedding_program, grid_program, readout_program
from splitformer.symbolic.model_derivation import INPUT_STATE, GridModelProgram, ModelProgram

from .ir import Module
from .lowering import lower
from .model_adjoint import lower_stage_adjoint
from .passes.convolution import convolution
from .program_lowering import lower_program, optimized
from .cvt_vjp import cvt_vjp_context
from .model_vjp import model_vjp_context
from .render import environment, unit_context
from .stage_render import stage_context

__all__ = ["render_model", "render_grid_model", "render_cvt", "model_units"]


def model_units(model: ModelProgram, passes=None) -> dict[str, Module]:
    """The lowered programs: the embedding (its initial condition on the tokens as layout
    assignments, ``symbolic.model_adjoint.embedding_program``), step, final, readout."""
    units = {"embedding": convolution(lower_program(embedding_program(model))), "step": lower(model.step, passes),
             "readout": convolution(lower_program(readout_program(model)))}
    if model.final is not None:
        units["final"] = lower(model.final, passes)
    return units


def render_model(model: ModelProgram, backend: str, passes=None) -> str:
    """The source of the generated ``backend`` module of ``model``."""
    units = model_units(model, passes)
    sizes = getattr(model.spec.embedding, "sizes", dict)()
    step = unit_context(units["step"], backend)
    final = unit_context(units["final"], backend) if "final" in units else None
    embedding = stage_context(optimized(units["embedding"]), backend, sizes, free=True)
    readout = stage_context(optimized(units["readout"]), backend, {}, free=True)
    vjp = model_vjp_context(model, units, backend, {"embedding": embedding, "readout": readout}, passes)
    units = [embedding, step, readout, *([final] if final else []), vjp]
    template = environment().get_template(f"{backend}/model.py.j2")
    return template.render(
        model=model.spec, name=model.name, scheme=model.spec.scheme, version=__version__,
        computes=network_fingerprint(model.spec),
        embedding=embedding, block=step, final=final, readout=readout, vjp=vjp,
        uses=set().union(*(unit["uses"] for unit in units)),
    )


def _grid_line(operator) -> str | None:
    """How an operator changes the number of grid points along an axis (``n``)."""
    if operator.kind == "convolution":
        stride = "stride" if operator.stride == "stride" else operator.stride
        return f"n = (n + {2 * operator.padding - operator.kernel}) // {stride} + 1"
    if operator.kind == "transposed-convolution":
        return f"n = n * {operator.kernel}"
    return None


def _channels(stages, default: str) -> str:
    """The code name of the channel domain the last channel-changing stage writes."""
    for stage in reversed(stages):
        if stage.operator.kind in ("convolution", "transposed-convolution"):
            return "d" if stage.operator.outputs == "y" else "n_channels"
    return default


def _grid_programs(model: GridModelProgram, backend: str) -> dict:
    """One grid step per transfer (``with``: the transfer stages, ``identity``: R = 1), each its
    derived program (``symbolic.model_adjoint.grid_program``): its forward (``run``, after the network
    passes), the forward statements its adjoint reads, the adjoint, the seed and the gradients."""
    sizes = {stage.operator.key: getattr(stage.operator, "sizes", dict)() for stage in model.stages()}
    variants = {}
    for transfer in ((True, False) if model.transfer else (False,)):
        program = grid_program(model, transfer)
        forward = convolution(lower_program(program))
        backward = lower_stage_adjoint(derive_adjoint(program), forward, INPUT_STATE)
        parameters = {tensor.parameter: name for name, tensor in program.tensors.items() if tensor.role == "param"}
        variants["with" if transfer else "identity"] = {
            "run": stage_context(optimized(forward), backend, {}, free=True, group_sizes=sizes),
            "forward": stage_context(backward.forward, backend, {}, group_sizes=sizes),
            "adjoint": stage_context(backward.adjoint, backend, {}, group_sizes=sizes), "seed": backward.seed,
            "gradient_input": backward.gradients[INPUT_STATE],
            "gradients": [{"name": name, "variable": backward.gradients[name]} for name in parameters]}
    return variants


def render_grid_model(model: GridModelProgram, backend: str) -> str:
    """The source of the generated ``backend`` module of a grid step (``resnet-block``, ``unet-level``):
    its derived programs (``_grid_programs``) and the checks of its grids and channels."""
    vjp = _grid_programs(model, backend)
    field = vjp["identity"]["run"]["parameters"]
    transfer = [p for p in vjp["with"]["run"]["parameters"] if p not in field] if "with" in vjp else []
    uses = set().union(*(piece[part]["uses"] for piece in vjp.values() for part in ("run", "forward", "adjoint")))
    template = environment().get_template(f"{backend}/grid_model.py.j2")
    return template.render(
        model=model.spec, name=model.name, version=__version__, computes=network_fingerprint(model.spec),
        field={"parameters": field, "grid": [line for stage in model.field if (line := _grid_line(stage.operator))]},
        transfer={"parameters": transfer,
                  "grid": [line for stage in model.transfer if (line := _grid_line(stage.operator))]},
        field_channels=_channels(model.field, "n_channels"), transfer_channels=_channels(model.transfer, "n_channels"),
        uses=uses, vjp=vjp,
    )


def render_cvt(model: CvtProgram, backend: str) -> str:
    """The source of the generated ``backend`` module of CvT: its derived programs (the forward
    chains them) and their adjoints (``codegen.cvt_vjp``)."""
    programs = cvt_vjp_context(model, backend)
    functions = [piece[part] for piece in programs.values() for part in ("run", "forward", "adjoint")]
    template = environment().get_template(f"{backend}/cvt.py.j2")
    return template.render(
        name=model.name, summary=model.summary, version=__version__,
        computes=network_fingerprint(MultiscaleSpec(model.name, model.summary)),
        stage_parameters=programs["embedding"]["run"]["parameters"],
        layer_parameters=programs["step"]["run"]["parameters"],
        head_parameters=programs["readout"]["run"]["parameters"],
        uses=set().union(*(function["uses"] for function in functions)), vjp=programs,
    )
