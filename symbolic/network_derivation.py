"""From a network file to its ``NetworkProgram``: its stages, and the programs its module runs.

A token network (``vit``): the embedding and the readout discretized on the image grids
(``stages.discretize_stage``), the block step and the final projection derived as the block
scheme's own. Its token domain is ``Ω_x = {x_cls} ∪ Ω_grid``, enumerated class node first, then
the grid row by row. A grid step (``resnet-block``, ``unet-level``): ``u⁺ = Proj(R u + Δt F(u))``
operator by operator, one program per transfer (R its operators', R = 1). CvT: ``symbolic.cvt``.
"""

from __future__ import annotations

import sympy as sp

from .cvt import derive_cvt
from .derivation import derive
from .domains import X, Y
from .image import C, X1, X2
from .latex import equation
from .network_pieces import INPUT, INPUT_STATE, TRANSFER, embedding_program, grid_program, readout_program
from .network_program import NetworkProgram, Piece
from .network_spec import GridNetworkSpec, MultiscaleSpec, NetworkSpec, TokenNetworkSpec, application_names
from .operators import STATE
from .program import TIME_STEP, Assignment, Tensor
from .stack import final_norm_kind, final_norm_scheme
from .stages import Stage, discretize_stage, field_tensor
from .vision_operators import IMAGE

__all__ = ["derive_network", "derive_token_network", "derive_grid_network", "TOKENS_LATEX", "TOKENS_DISCRETE"]

#: The initial condition on ``Ω_x = {x_cls} ∪ Ω_grid`` (``network_pieces.initial_condition`` derives it).
TOKENS_LATEX = (
    r"u^{(0)}(x, y) = \begin{cases} c^{\mathrm{cls}}(y) + E(x_{\mathrm{cls}}, y) & x = x_{\mathrm{cls}} \\ "
    r"f(x, y) + E(x, y) & x \in \Omega_{\mathrm{grid}} \end{cases}"
)
#: Its discrete form: the class node is node 0, grid node ``(p, q)`` is node ``1 + N_2 p + q``.
TOKENS_DISCRETE = (
    r"{u^{(0)}}_{0,l} = {c^{\mathrm{cls}}}_{l} + {E}_{0,l}, \quad "
    r"{u^{(0)}}_{1 + N_2 p + q,l} = {f}_{p,q,l} + {E}_{1 + N_2 p + q,l}"
)


def derive_token_network(spec: TokenNetworkSpec) -> NetworkProgram:
    """The token network of ``spec``: its embedding and readout programs, its block step and final projection."""
    embedding = discretize_stage(spec.embedding, {IMAGE: field_tensor(INPUT, "I", (), "input")})
    readout = discretize_stage(spec.readout, {STATE: field_tensor("u", "u", (X.index, Y.index), "input")})
    blocks = {"step": derive(spec.scheme)}
    if spec.final_norm:
        blocks["final"] = derive(final_norm_scheme(final_norm_kind(spec.scheme)))  # the scheme's own
    pieces = {"embedding": Piece(embedding_program(spec.module_name, embedding), INPUT,
                                 getattr(spec.embedding, "sizes", dict)()),
              "readout": Piece(readout_program(spec.module_name, readout), "u")}
    return NetworkProgram(spec, "token", {"embedding": (embedding,), "readout": (readout,)}, pieces, blocks)


def _chain(spec: GridNetworkSpec, keys: tuple[str, ...], names: tuple[str, ...], start: Tensor) -> tuple[Stage, ...]:
    """The operators ``keys`` applied in turn to ``start``, their arrays named ``names``."""
    stages, state = [], start
    for key, name in zip(keys, names):
        stage = discretize_stage(spec.operators[key], {STATE: state}, name)
        stages.append(stage)
        state = stage.tensors[stage.output]
    return tuple(stages)


def derive_grid_network(spec: GridNetworkSpec) -> NetworkProgram:
    """One grid step ``u⁺ = Proj(R u + Δt F(u))`` with ``Δt = 1``: its field, transfer and update, and its program per
    transfer (``step_with``: R the transfer's operators, present where the file names some; ``step_identity``: R = 1)."""
    start = field_tensor(INPUT_STATE, "u", (C.index, X1.index, X2.index), "input")
    names = application_names((*spec.field, *spec.transfer, *((spec.projection,) if spec.projection else ())))
    field = _chain(spec, spec.field, names[:len(spec.field)], start)
    transfer = _chain(spec, spec.transfer, names[len(spec.field):len(spec.field) + len(spec.transfer)], start)
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
        projection = discretize_stage(spec.operators[spec.projection], {STATE: total}, names[-1])
    parts = {"field": field, "transfer": transfer, "update": (update,) + ((projection,) if projection else ())}
    sizes = {stage.operator.key: getattr(stage.operator, "sizes", dict)() for stage in parts["field"] + transfer
             + parts["update"][1:]}
    pieces = {f"step_{'with' if moved else 'identity'}": Piece(
        grid_program(spec.module_name, field, moved, update, projection), INPUT_STATE, group_sizes=sizes)
        for moved in ((transfer, ()) if transfer else ((),))}
    return NetworkProgram(spec, "grid", parts, pieces)


def derive_network(spec: NetworkSpec) -> NetworkProgram:
    """The derived network of any network file."""
    if isinstance(spec, MultiscaleSpec):
        return derive_cvt(spec)
    if isinstance(spec, GridNetworkSpec):
        return derive_grid_network(spec)
    return derive_token_network(spec)
