"""Emission of whole networks: one description per network (its derived programs, parameter tables, inputs,
the public functions it exports) through the one network template, ``templates/network_module.py.j2``.

Every program of a ``NetworkProgram`` (its ``pieces``) is emitted the same way (``stage_render.lower_program``, once
for both backends: forward, passes, derived adjoint; then ``program_context``, spelled by the backend, dead arrays
freed); what a composition adds (its parameter tables, its readout, a token network's block step, a grid step's grids)
is in ``_COMPOSITIONS``.
"""

from __future__ import annotations

from splitformer.symbolic import __version__
from splitformer.symbolic.adjoint import derive_adjoint
from splitformer.symbolic.network_program import NetworkProgram
from splitformer.symbolic.network_spec import network_derive_argument, network_fingerprint

from .adjoint import lower_adjoint
from .lowering import lower
from .network_inputs import COSTATES, NETWORK_INPUTS, declared_inputs, signature
from .render import backward_context, environment, unit_context
from .runtime_source import inline_runtime
from .stage_render import LoweredProgram, lower_program, program_context

__all__ = ["lower_network", "render_network"]


def _table(name: str, doc: str, parameters: list[dict], prefix: str = "", head: bool = False) -> dict:
    """A parameter table of the module (``name = {canonical name: shape}``) and its docstring listing (``head``: the
    readout's, which only ``logits`` reads)."""
    return {"name": name, "doc": doc, "parameters": parameters, "prefix": prefix, "head": head}


def _head(parameters: list[dict]) -> dict:
    return _table("HEAD_PARAMETERS", "The readout's parameters (``logits``).", parameters, head=True)


def _token(program: NetworkProgram, programs: dict, backend: str, passes) -> dict:
    """ViT-like networks: the embedding and readout programs, the step and final projection as blocks' (each with
    its derived backward)."""
    embedding, readout = programs["embedding"]["run"]["parameters"], programs["readout"]["run"]["parameters"]
    blocks = program.blocks
    step = unit_context(lower(blocks["step"], passes), backend)
    final = unit_context(lower(blocks["final"], passes), backend) if "final" in blocks else None
    units = {name: backward_context(lower_adjoint(derive_adjoint(block), passes), backend)
             for name, block in blocks.items()}
    return {"scheme": program.spec.scheme, "block": step, "final": final, "units": {"final": None, **units},
            "tables": [_table("PARAMETERS", "Canonical names and shapes of the embedding"
                              + (" and the final projection." if final else "."),
                              embedding + (final["parameters"] if final else [])),
                       _table("LAYER_PARAMETERS", "The parameters of one step, under ``layers.<n>.`` for layer n = "
                              "0, 1, …", step["parameters"], "layers.<n>."), _head(readout)],
            "head": {"name": readout[0]["name"], "programs": ["readout"]},
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


def _grid(program: NetworkProgram, programs: dict, backend: str, passes) -> dict:
    """A grid step (``resnet-block``, ``unet-level``): its programs per transfer, its grids and channels."""
    parts = program.parts
    field = programs["step_identity"]["run"]["parameters"]
    transfer = [p for p in programs["step_with"]["run"]["parameters"] if p not in field] if parts["transfer"] else []
    return {"head": None, "adjoints": {name: f"{name}_vjp" for name in programs},
            "tables": [_table("PARAMETERS", "Canonical names and shapes of F's parameters.", field),
                       _table("TRANSFER_PARAMETERS", "The transfer R's parameters (absent: R is the identity).",
                              transfer)],
            "grids": {part: [line for stage in parts[part] if (line := _grid_line(stage.operator))]
                      for part in ("field", "transfer")},
            "channels": (_channels(parts["field"]), _channels(parts["transfer"])),
            "width": _width_source(field + transfer)}


def _width_source(parameters: list[dict]) -> dict | None:
    """The first parameter with an axis over the output's channels ``d`` and that axis (``_checked`` reads ``d`` there:
    a field that begins on the input's channels, a pre-activation block's BatchNorm, holds ``n_channels`` first), or
    None where no parameter has one (no operator writes ``d``)."""
    for parameter in parameters:
        if "d" in parameter["shape"]:
            return {"name": parameter["name"], "axis": parameter["shape"].index("d")}
    return None


def _cvt(program: NetworkProgram, programs: dict, backend: str, passes) -> dict:
    """CvT: its programs, which its forward chains through the stages."""
    parameters = {name: programs[name]["run"]["parameters"] for name in ("embedding", "step", "readout")}
    return {"tables": [_table("STAGE_PARAMETERS", "Canonical names and shapes of a stage's token embedding, under "
                              "``stages.<s>.``.", parameters["embedding"], "stages.<s>."),
                       _table("LAYER_PARAMETERS", "The parameters of one step, under ``stages.<s>.layers.<n>.``.",
                              parameters["step"], "stages.<s>.layers.<n>."), _head(parameters["readout"])],
            "head": {"name": "head.W", "programs": ["node", "readout"]},
            "rows": [{"name": "stages.<last>.cls", "shape": ("d",), "head": False}],
            "adjoints": {name: f"{name}_vjp" for name in programs}}


#: What each composition adds to its programs in the module.
_COMPOSITIONS = {"token": _token, "grid": _grid, "cvt": _cvt}


def lower_network(program: NetworkProgram, passes=None) -> dict[str, LoweredProgram]:
    """Every program of ``program`` lowered (``lower_program``): what each backend's module spells."""
    return {name: lower_program(piece, passes) for name, piece in program.pieces.items()}


def render_network(program: NetworkProgram, backend: str, passes, lowered: dict[str, LoweredProgram]) -> str:
    """The source of the generated ``backend`` module of the network ``program``, its programs ``lowered`` with
    ``passes`` by ``lower_network`` (once for both backends)."""
    programs = {name: program_context(lowered[name], backend, piece.sizes, piece.group_sizes)
                for name, piece in program.pieces.items()}
    spec, composition = program.spec, program.composition
    network = {"kind": composition, "title": spec.name, "summary": spec.summary, "spec": spec, "programs": programs,
               **_COMPOSITIONS[composition](program, programs, backend, passes)}
    reads_stride = getattr(spec, "reads_stride", True)
    rows = [{"name": table["prefix"] + p["name"], "shape": p["shape"], "head": table["head"]}
            for table in network["tables"] for p in table["parameters"]] + network.get("rows", [])
    source = environment().get_template("network_module.py.j2").render(
        network={**network, "listing": rows}, backend=backend, input=NETWORK_INPUTS[composition]["numpy"][0].name,
        name=program.name, version=__version__, signature=signature, costates=COSTATES[composition],
        regenerate=network_derive_argument(spec),
        inputs=declared_inputs(composition, backend, reads_stride),
        checked_inputs=declared_inputs(composition, "numpy", reads_stride),
        computes=network_fingerprint(spec), width=max(len(row["name"]) for row in rows) + 2, head=network["head"])
    return inline_runtime(source, backend)

