"""From a model to its discrete stages: embedding, block step, final projection, readout;
and a convolutional grid step ``u⁺ = Proj(R u + Δt F(u))`` operator by operator.

The block step and the final projection are the block scheme's own derivation. The
embedding and the readout are discretized here on the image grids (``image.ShiftedGrid``):
kernels absorb the spacings they are integrated against, the pixel spacing ``Δ`` cancels
(a stride and a kernel size are counts of pixels), and feature and channel grids have unit
spacing. The token domain of the steps is ``Ω_x = {x_cls} ∪ Ω_grid``, enumerated class
node first, then the grid row by row.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .derivation import UNIT_SPACINGS, derive, discretize_definitions, operator_arrays
from .domains import TOKENS, X, Y
from .image import C, CHANNELS, CLASSES, IMAGE_VARIABLES, PIXEL, X1, X2, ShiftedGrid
from .latex import equation
from .network_spec import GridNetworkSpec, TokenNetworkSpec
from .operators import STATE, Operator
from .program import TIME_STEP, Assignment, Program, Tensor
from .stack import final_norm_kind, final_norm_scheme
from .cnn_operators import SPACING
from .cvt_operators import KEYS
from .vision_operators import IMAGE

__all__ = ["TokenNetworkProgram", "GridNetworkProgram", "Stage", "derive_token_network", "derive_grid_network", "discretize_stage",
           "field_tensor",
           "INPUT_STATE", "TRANSFER", "INPUT", "TOKENS_LATEX", "TOKENS_DISCRETE"]

#: The batched input of a model (``pixel_values``, channels first).
INPUT = "image"
#: The batched input of a grid step (a feature map, channels first), and ``R u`` (the transfer's value).
INPUT_STATE, TRANSFER = "u0", "transfer"
#: The initial condition on ``Ω_x = {x_cls} ∪ Ω_grid`` (``network_adjoint.initial_condition`` derives it).
TOKENS_LATEX = (
    r"u^{(0)}(x, y) = \begin{cases} c^{\mathrm{cls}}(y) + E(x_{\mathrm{cls}}, y) & x = x_{\mathrm{cls}} \\ "
    r"f(x, y) + E(x, y) & x \in \Omega_{\mathrm{grid}} \end{cases}"
)
#: Its discrete form: the class node is node 0, grid node ``(p, q)`` is node ``1 + N_2 p + q``.
TOKENS_DISCRETE = (
    r"{u^{(0)}}_{0,l} = {c^{\mathrm{cls}}}_{l} + {E}_{0,l}, \quad "
    r"{u^{(0)}}_{1 + N_2 p + q,l} = {f}_{p,q,l} + {E}_{1 + N_2 p + q,l}"
)
_UNIT = {**UNIT_SPACINGS, CHANNELS.spacing: sp.Integer(1), CLASSES.spacing: sp.Integer(1)}


@dataclass(frozen=True)
class Stage:
    """The discretized definitions of one operator outside the block steps."""

    operator: Operator
    tensors: dict[str, Tensor]
    assignments: tuple[Assignment, ...]

    @property
    def output(self) -> str:
        return self.assignments[-1].target


@dataclass(frozen=True)
class TokenNetworkProgram:
    """Everything the model's lowering and report need."""

    spec: TokenNetworkSpec
    embedding: Stage
    step: Program
    final: Program | None
    readout: Stage

    @property
    def name(self) -> str:
        return self.spec.module_name


def field_tensor(name: str, latex: str, indices, role: str, parameter=None, shape=None, kind="") -> Tensor:
    """A discrete array of a stage: a batched field (``input``, ``temp``) or a parameter."""
    return Tensor(name, latex, tuple(indices), role, parameter, shape, kind)


def discretize_stage(operator: Operator, inputs: dict[str, Tensor], prefix: str | None = None) -> Stage:
    """The operator's definitions on the grids; ``inputs`` maps its fields to batched arrays.

    ``prefix`` names the stage's arrays (default: the operator's key; a second application
    of one operator needs another).
    """
    key, prefix = operator.key, prefix or operator.key
    tensors = {tensor.name: tensor for tensor in inputs.values()}
    sizes = getattr(operator, "sizes", dict)()
    for parameter in operator.parameters():
        latex = parameter.latex if "_" in parameter.latex else f"{parameter.latex}_{{{operator.key_latex()}}}"
        # the kernel's offsets over the support the operator fixes (its adjoint's gradient has that range)
        tensors[f"{key}_{parameter.name}"] = field_tensor(
            f"{key}_{parameter.name}", latex, (v.index.xreplace(sizes) for v in parameter.arguments), "param",
            f"{key}.{parameter.name}", parameter.shape, parameter.kind)
    definitions = operator.definitions()
    arrays, absorbed = operator_arrays(operator, definitions, prefix)
    arrays.update({function: sp.IndexedBase(tensor.name) for function, tensor in inputs.items()})
    grid = ShiftedGrid(IMAGE_VARIABLES, arrays, absorbed, getattr(operator, "positions", dict)(),
                       getattr(operator, "sampled", dict)())
    names = {tensor.name: tensor.latex for tensor in tensors.values()}
    names.update({f"{prefix}_{d.function}": rf"{d.latex}^{{{operator.key_latex()}}}" for d in definitions})
    assignments = discretize_definitions(operator, definitions, grid, names, _UNIT,
                                         (PIXEL, SPACING, TOKENS.spacing, KEYS.spacing),
                                         getattr(operator, "targets", dict)(), sizes)
    for assignment in assignments:
        tensors[assignment.target] = field_tensor(assignment.target, names[assignment.target],
                                                  assignment.lhs.indices, "temp")
    return Stage(operator, tensors, assignments)


def derive_token_network(spec: TokenNetworkSpec) -> TokenNetworkProgram:
    """The discrete stages of ``spec``."""
    image = field_tensor(INPUT, "I", (), "input")
    embedding = discretize_stage(spec.embedding, {IMAGE: image})
    step = derive(spec.scheme)
    final = derive(final_norm_scheme(final_norm_kind(spec.scheme))) if spec.final_norm else None  # the scheme's own
    state = field_tensor("u", "u", (X.index, Y.index), "input")
    readout = discretize_stage(spec.readout, {STATE: state})
    return TokenNetworkProgram(spec, embedding, step, final, readout)


@dataclass(frozen=True)
class GridNetworkProgram:
    """The stages of one grid step: the field ``F``, the transfer ``R``, the update, the projection."""

    spec: GridNetworkSpec
    field: tuple[Stage, ...]
    transfer: tuple[Stage, ...]
    update: Assignment
    projection: Stage | None

    @property
    def name(self) -> str:
        return self.spec.module_name

    @property
    def output(self) -> str:
        return self.projection.output if self.projection else self.update.target

    def stages(self) -> tuple[Stage, ...]:
        return self.field + self.transfer + ((self.projection,) if self.projection else ())


def _chain(spec: GridNetworkSpec, keys: tuple[str, ...], start: Tensor, used: set[str]) -> tuple[Stage, ...]:
    stages, state = [], start
    for key in keys:
        prefix = key if key not in used else f"{key}2"
        used.add(key)
        stage = discretize_stage(spec.operators[key], {STATE: state}, prefix)
        stages.append(stage)
        state = stage.tensors[stage.output]
    return tuple(stages)


def derive_grid_network(spec: GridNetworkSpec) -> GridNetworkProgram:
    """The discrete stages of a grid step: ``u⁺ = Proj(R u + Δt F(u))`` with ``Δt = 1``."""
    start = field_tensor(INPUT_STATE, "u", (C.index, X1.index, X2.index), "input")
    used: set[str] = set()
    field = _chain(spec, spec.field, start, used)
    transfer = _chain(spec, spec.transfer, start, used)
    indices = (Y.index, X1.index, X2.index)
    moved = sp.IndexedBase(TRANSFER)[indices]
    total = field_tensor("u1", "u^{+}", indices, "temp")
    update = Assignment(sp.IndexedBase(total.name)[indices], moved + TIME_STEP * sp.IndexedBase(field[-1].output)[indices],
                        r"explicit Euler step on the new grid: $u^{+} = R u + \Delta t\, F(u)$",
                        continuous=r"u^{+}(y, x) = (R u)(y, x) + \Delta t\, F(u)(y, x)",
                        quadrature=equation(sp.IndexedBase("u^{+}")[indices],
                                            sp.IndexedBase("R u")[indices] + TIME_STEP * sp.IndexedBase("F")[indices]))
    projection = None
    if spec.projection:
        projection = discretize_stage(spec.operators[spec.projection], {STATE: total},
                                      spec.projection if spec.projection not in used else f"{spec.projection}2")
    return GridNetworkProgram(spec, field, transfer, update, projection)
