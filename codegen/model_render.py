"""Emission of whole models: the lowered stages through a backend's model template."""

from __future__ import annotations

from splitformer.symbolic import __version__
from splitformer.symbolic.cvt import CvtProgram
from splitformer.symbolic.cvt_adjoint import cvt_programs
from splitformer.symbolic.model import MultiscaleSpec, network_fingerprint
from splitformer.symbolic.model_adjoint import derive_model_adjoint, embedding_program, grid_program, readout_program
from splitformer.symbolic.model_derivation import INPUT, INPUT_STATE, GridModelProgram, ModelProgram

from .adjoint import lower_adjoint
from .lowering import lower
from .network_inputs import NETWORK_INPUTS, grid_model_inputs, signature
from .render import backward_context, environment, unit_context
from .stage_render import program_context

__all__ = ["render_model", "render_grid_model", "render_cvt"]


def _uses(programs) -> set[str]:
    """The names the functions of ``programs`` (program contexts, backward contexts) read besides arrays."""
    return set().union(*(program[part]["uses"] for program in programs for part in ("run", "forward", "adjoint")
                         if part in program))


def render_model(model: ModelProgram, backend: str, passes=None) -> str:
    """The source of the generated ``backend`` module of ``model``: its embedding (its initial condition
    on the tokens as layout assignments, ``symbolic.model_adjoint.embedding_program``) and readout as
    derived programs, its step and final projection as a block's, each with its derived backward."""
    adjoint = derive_model_adjoint(model)
    embedding = program_context(embedding_program(model), INPUT, backend, getattr(model.spec.embedding, "sizes", dict)())
    readout = program_context(readout_program(model), "u", backend)
    step = unit_context(lower(model.step, passes), backend)
    final = unit_context(lower(model.final, passes), backend) if model.final is not None else None
    vjp = {"step": backward_context(lower_adjoint(adjoint.step, passes), backend), "embedding": embedding,
           "readout": readout, "final": backward_context(lower_adjoint(adjoint.final, passes), backend)
           if adjoint.final is not None else None}
    template = environment().get_template(f"{backend}/model.py.j2")
    return template.render(
        model=model.spec, name=model.name, scheme=model.spec.scheme, version=__version__, signature=signature,
        inputs=NETWORK_INPUTS["model"][backend],
        computes=network_fingerprint(model.spec), embedding=embedding["run"], block=step, final=final,
        readout=readout["run"], vjp=vjp, head={"name": readout["run"]["parameters"][0]["name"], "programs": ["readout"]},
        adjoints={"embedding": "embedding_vjp", "step": "step_adjoint", **({"final_norm": "final_adjoint"} if final else {}),
                  "readout": "readout_vjp"},
        uses=_uses([embedding, readout, vjp["step"], *([vjp["final"]] if final else [])])
        | step["uses"] | (final["uses"] if final else set()),
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


def render_grid_model(model: GridModelProgram, backend: str) -> str:
    """The source of the generated ``backend`` module of a grid step (``resnet-block``, ``unet-level``):
    one derived program per transfer (``with``: the transfer stages, ``identity``: R = 1;
    ``symbolic.model_adjoint.grid_program``) and the checks of its grids and channels."""
    sizes = {stage.operator.key: getattr(stage.operator, "sizes", dict)() for stage in model.stages()}
    vjp = {"with" if transfer else "identity": program_context(grid_program(model, transfer), INPUT_STATE, backend,
                                                               group_sizes=sizes)
           for transfer in ((True, False) if model.transfer else (False,))}
    field = vjp["identity"]["run"]["parameters"]
    transfer = [p for p in vjp["with"]["run"]["parameters"] if p not in field] if "with" in vjp else []
    template = environment().get_template(f"{backend}/grid_model.py.j2")
    return template.render(
        model=model.spec, name=model.name, version=__version__, computes=network_fingerprint(model.spec),
        inputs=grid_model_inputs(backend, model.spec.reads_stride), signature=signature,
        field={"parameters": field, "grid": [line for stage in model.field if (line := _grid_line(stage.operator))]},
        transfer={"parameters": transfer,
                  "grid": [line for stage in model.transfer if (line := _grid_line(stage.operator))]},
        field_channels=_channels(model.field, "n_channels"), transfer_channels=_channels(model.transfer, "n_channels"),
        uses=_uses(vjp.values()), vjp=vjp, head=None, adjoints={f"step_{name}": f"step_{name}_vjp" for name in vjp},
    )


def render_cvt(model: CvtProgram, backend: str) -> str:
    """The source of the generated ``backend`` module of CvT: its derived programs
    (``symbolic.cvt_adjoint``; the forward chains them through the stages) and their adjoints."""
    programs = {name: program_context(piece.program, piece.input, backend, piece.sizes)
                for name, piece in cvt_programs(model).items()}
    template = environment().get_template(f"{backend}/cvt.py.j2")
    return template.render(
        name=model.name, summary=model.summary, version=__version__, inputs=NETWORK_INPUTS["cvt"][backend],
        signature=signature,
        computes=network_fingerprint(MultiscaleSpec(model.name, model.summary)),
        stage_parameters=programs["embedding"]["run"]["parameters"],
        layer_parameters=programs["step"]["run"]["parameters"],
        head_parameters=programs["readout"]["run"]["parameters"],
        uses=_uses(programs.values()), vjp=programs, head={"name": "head.W", "programs": ["node", "readout"]},
        adjoints={name: f"{name}_vjp" for name in programs},
    )
