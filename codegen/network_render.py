"""Emission of whole networks: one description per network (its derived programs, parameter tables, inputs,
the public functions it exports) through the one network template, ``templates/network_module.py.j2``."""

from __future__ import annotations

import re

from splitformer.symbolic import __version__
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.cvt import CvtProgram
from splitformer.symbolic.cvt_adjoint import cvt_programs
from splitformer.symbolic.network_spec import MultiscaleSpec, network_fingerprint
from splitformer.symbolic.network_adjoint import derive_token_network_adjoint, embedding_program, grid_program, readout_program
from splitformer.symbolic.network_derivation import INPUT, INPUT_STATE, GridNetworkProgram, TokenNetworkProgram

from .adjoint import lower_adjoint
from .lowering import lower
from .network_inputs import NETWORK_INPUTS, declared_inputs, signature
from .render import backward_context, environment, unit_context
from .runtime_source import inline_runtime
from .stage_render import program_context

__all__ = ["render_network"]


def _table(name: str, doc: str, parameters: list[dict], prefix: str = "", suffix: str = "") -> dict:
    """A parameter table of the module (``name = {canonical name: shape}``) and its docstring listing."""
    return {"name": name, "doc": doc, "parameters": parameters, "prefix": prefix, "suffix": suffix}


def _head(parameters: list[dict], backend: str) -> dict:
    return _table("HEAD_PARAMETERS", "The readout's parameters (``logits``).", parameters,
                  suffix="      (logits only)" if backend == "numpy" else "      (n_classes > 0)")


#: The sizes a token network gives each step (its ``_checked`` and its torch Model), besides the batch and tokens.
_STEP_SIZES = {"d", "d_ff", "n_heads", "d_head"}


def _check_step(model: TokenNetworkProgram, step: dict) -> None:
    """A token network feeds each step all its tokens and nothing else, with the sizes ``_STEP_SIZES``: a step scheme
    that is causal, reads more (positions, a memory, a cache) or sizes a parameter otherwise is refused in one line."""
    scheme = model.spec.scheme
    unset = sorted({axis for p in step["parameters"] for axis in p["shape"] if isinstance(axis, str)} - _STEP_SIZES)
    reads = [what for what, present in (("token positions", step["positions"] or step["half_width"]),
                                        ("a memory", step["memory"]), ("a key/value cache", step["cached"]),
                                        ("a second state across layers (a stream)", step["stream"]),
                                        (", ".join(step["keywords"]), step["keywords"])) if present]
    problem = ("is causal" if scheme.causal else f"reads {reads[0]}" if reads else
               f"sizes a parameter by {unset[0]}" if unset else "")
    if problem:
        raise SplitformerError(f"network {model.spec.name!r}: its steps' scheme {scheme.name!r} {problem}; a token "
                               "network feeds each step all its tokens and nothing else, with the sizes "
                               f"{', '.join(sorted(_STEP_SIZES))}")


def _token(model: TokenNetworkProgram, backend: str, passes) -> dict:
    """ViT-like networks: the embedding (its initial condition on the tokens as layout assignments,
    ``symbolic.network_adjoint.embedding_program``) and readout as derived programs, the step and final
    projection as a block's, each with its derived backward."""
    adjoint = derive_token_network_adjoint(model)
    programs = {"embedding": program_context(embedding_program(model), INPUT, backend,
                                             getattr(model.spec.embedding, "sizes", dict)(), passes=passes),
                "readout": program_context(readout_program(model), "u", backend, passes=passes)}
    embedding, readout = programs["embedding"]["run"]["parameters"], programs["readout"]["run"]["parameters"]
    step = unit_context(lower(model.step, passes), backend)
    _check_step(model, step)
    final = unit_context(lower(model.final, passes), backend) if model.final is not None else None
    units = {"step": backward_context(lower_adjoint(adjoint.step, passes), backend),
             "final": backward_context(lower_adjoint(adjoint.final, passes), backend) if final else None}
    tables = [_table("PARAMETERS", "Canonical names and shapes of the embedding"
                     + (" and the final projection." if final else "."), embedding + (final["parameters"] if final else [])),
              _table("LAYER_PARAMETERS", "The parameters of one step, under ``layers.<n>.`` for layer n = 0, 1, …",
                     step["parameters"], "layers.<n>."), _head(readout, backend)]
    return {"kind": "token", "title": model.spec.name, "summary": model.spec.summary, "spec": model.spec,
            "programs": programs, "tables": tables, "scheme": model.spec.scheme, "block": step, "final": final,
            "units": units, "head": {"name": readout[0]["name"], "programs": ["readout"]},
            "adjoints": {"embedding": "embedding_vjp", "step": "step_adjoint",
                         **({"final_norm": "final_adjoint"} if final else {}), "readout": "readout_vjp"}}


def _grid_line(operator) -> str | None:
    """How an operator changes the number of grid points along an axis (``n``)."""
    if operator.kind == "convolution":
        stride = "stride" if operator.stride == "stride" else operator.stride
        return f"n = (n + {2 * operator.padding - operator.kernel}) // {stride} + 1"
    if operator.kind == "transposed-convolution":
        return f"n = n * {operator.kernel}"
    return None


def _channels(stages) -> str:
    """The code name of the channel domain the last channel-changing stage writes (``n_channels``: none)."""
    for stage in reversed(stages):
        if stage.operator.kind in ("convolution", "transposed-convolution"):
            return "d" if stage.operator.outputs == "y" else "n_channels"
    return "n_channels"


def _grid(model: GridNetworkProgram, backend: str, passes) -> dict:
    """A grid step (``resnet-block``, ``unet-level``): one derived program per transfer (``with``: the
    transfer stages, ``identity``: R = 1; ``symbolic.network_adjoint.grid_program``) and its grids and channels."""
    sizes = {stage.operator.key: getattr(stage.operator, "sizes", dict)() for stage in model.stages()}
    programs = {f"step_{'with' if transfer else 'identity'}": program_context(
        grid_program(model, transfer), INPUT_STATE, backend, group_sizes=sizes, passes=passes)
        for transfer in ((True, False) if model.transfer else (False,))}
    field = programs["step_identity"]["run"]["parameters"]
    transfer = [p for p in programs["step_with"]["run"]["parameters"] if p not in field] if model.transfer else []
    return {"kind": "grid", "title": model.spec.name, "summary": model.spec.summary, "spec": model.spec,
            "programs": programs, "head": None, "adjoints": {name: f"{name}_vjp" for name in programs},
            "tables": [_table("PARAMETERS", "Canonical names and shapes of F's parameters.", field),
                       _table("TRANSFER_PARAMETERS", "The transfer R's parameters (absent: R is the identity).",
                              transfer)],
            "grids": {part: [line for stage in stages if (line := _grid_line(stage.operator))]
                      for part, stages in (("field", model.field), ("transfer", model.transfer))},
            "channels": (_channels(model.field), _channels(model.transfer))}


def _cvt(model: CvtProgram, backend: str, passes) -> dict:
    """CvT: its derived programs (``symbolic.cvt_adjoint``; the forward chains them through the stages)."""
    programs = {name: program_context(piece.program, piece.input, backend, piece.sizes, passes=passes)
                for name, piece in cvt_programs(model).items()}
    parameters = {name: programs[name]["run"]["parameters"] for name in ("embedding", "step", "readout")}
    return {"kind": "cvt", "title": model.name, "summary": model.summary,
            "spec": MultiscaleSpec(model.name, model.summary), "programs": programs,
            "tables": [_table("STAGE_PARAMETERS", "Canonical names and shapes of a stage's token embedding, under "
                              "``stages.<s>.``.", parameters["embedding"], "stages.<s>."),
                       _table("LAYER_PARAMETERS", "The parameters of one step, under ``stages.<s>.layers.<n>.``.",
                              parameters["step"], "stages.<s>.layers.<n>."), _head(parameters["readout"], backend)],
            "head": {"name": "head.W", "programs": ["node", "readout"]},
            "rows": [{"name": "stages.<last>.cls", "shape": ("d",), "suffix": ""}],
            "adjoints": {name: f"{name}_vjp" for name in programs}}


_KINDS = {TokenNetworkProgram: ("model", _token), GridNetworkProgram: ("grid_model", _grid), CvtProgram: ("cvt", _cvt)}


def render_network(model: TokenNetworkProgram | GridNetworkProgram | CvtProgram, backend: str, passes=None) -> str:
    """The source of the generated ``backend`` module of the network ``model``."""
    kind, describe = _KINDS[type(model)]
    network = describe(model, backend, passes)
    reads_stride = getattr(network["spec"], "reads_stride", True)
    rows = [{"name": table["prefix"] + p["name"], "shape": p["shape"], "suffix": table["suffix"]}
            for table in network["tables"] for p in table["parameters"]] + network.get("rows", [])
    source = environment().get_template("network_module.py.j2").render(
        network={**network, "listing": rows}, backend=backend, input=NETWORK_INPUTS[kind]["numpy"][0].name,
        name=model.name, version=__version__, signature=signature,
        inputs=declared_inputs(kind, backend, reads_stride),
        checked_inputs=declared_inputs(kind, "numpy", reads_stride),
        computes=network_fingerprint(network["spec"]), width=max(len(row["name"]) for row in rows) + 2,
        head=network["head"])
    return _tidy(inline_runtime(source, backend))


def _tidy(source: str) -> str:
    """``source`` with at most two blank lines in a row (a piece a network lacks leaves no gap)."""
    return re.sub(r"\n{4,}", "\n\n\n", source)
