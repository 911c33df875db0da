r"""A whole model's programs (embedding, readout, grid step: what the emitted forward runs) and
their adjoint: reverse mode over its embedding, steps and readout.

Input: a ``TokenNetworkProgram``. Output: a ``TokenNetworkAdjoint``: the derived adjoints (``Adjoint``) of

- the embedding program: the embedding stage's assignments followed by the initial condition
  on ``Ω_x = {x_cls} ∪ Ω_grid`` written in index notation (``initial_condition``), whose
  output is the state ``u^{(0)}`` entering the first step;
- one step of the block scheme and the final projection (``derive_adjoint`` of their
  programs, as for a block);
- the readout, whose input is the final state.

The costate runs readout → final projection → steps (last first) → embedding, each
piece's input costate seeding the one before (``λ^n = (∂Φ/∂u^n)ᵀ λ^{n+1}``); every
assignment's adjoint comes out of the same differentiation as a block's.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .adjoint import Adjoint, derive_adjoint
from .domains import X, Y
from .image import COLS, X1, X2
from .network_derivation import INPUT_STATE, TRANSFER, GridNetworkProgram
from .latex import equation
from .program import Assignment, Evaluation, Program, SubstepRecord, Tensor

__all__ = ["TokenNetworkAdjoint", "derive_token_network_adjoint", "initial_condition", "embedding_program", "readout_program",
           "grid_program", "stage_program", "stage_record", "STATE"]

#: The state entering the first step (the embedding program's output).
STATE = "u0"


@dataclass(frozen=True)
class TokenNetworkAdjoint:
    """The derived adjoints of a model's pieces (``final`` is ``None`` without a final projection)."""

    embedding: Adjoint
    step: Adjoint
    final: Adjoint | None
    readout: Adjoint


def initial_condition(stage) -> tuple[dict[str, Tensor], tuple[Assignment, ...]]:
    """``u^{(0)} = t + E``, ``t`` the class node (node 0) then the grid row by row (``1 + N_2 p + q``)."""
    key = stage.operator.key
    i, l, p, q = X.index, Y.index, X1.index, X2.index
    tokens = Tensor(f"{key}_tokens", r"t", (i, l), "temp")
    state = Tensor(STATE, "u^{(0)}", (i, l), "temp")
    t, u0 = sp.IndexedBase(tokens.name), sp.IndexedBase(STATE)
    cls, grid, pos = (sp.IndexedBase(f"{key}_{name}") for name in ("cls", "f", "pos"))
    names = {name: tensor.latex for name, tensor in stage.tensors.items()} | {tokens.name: "t", STATE: "u^{(0)}"}
    assignments = (
        (t[0, l], cls[l], "the class node is node 0"),
        (t[1 + COLS.size * p + q, l], grid[p, q, l], "grid node (p, q) is node 1 + N_2 p + q"),
        (u0[i, l], t[i, l] + pos[i, l], "the position term on every node"),
    )
    return ({tokens.name: tokens, STATE: state},
            tuple(Assignment(lhs, rhs, meaning, quadrature=equation(lhs, rhs, names)) for lhs, rhs, meaning in assignments))


def stage_record(stage, assignments=None) -> SubstepRecord:
    """One model stage's assignments (or ``assignments``) as the record of a program."""
    operator = stage.operator
    evaluation = Evaluation(operator.key, operator.kind, "", tuple(assignments or stage.assignments))
    return SubstepRecord(f"{operator.key}: {operator.kind}", "", (evaluation,), None)


def stage_program(stage) -> Program:
    """One model stage alone as a program (its output: the stage's)."""
    return Program(stage.operator.key, dict(stage.tensors), [stage_record(stage)], stage.output)


def embedding_program(model) -> Program:
    """The embedding stage and the initial condition on the tokens, as one program with output ``u^{(0)}``."""
    stage = model.embedding
    tensors, assignments = initial_condition(stage)
    tokens = SubstepRecord("initial condition on the token domain", "",
                           (Evaluation("tokens", "initial-condition", "", assignments),), None)
    return Program(f"{model.name}_embedding", {**stage.tensors, **tensors}, [stage_record(stage), tokens], STATE)


def readout_program(model) -> Program:
    """The readout stage as a program whose input is the final state ``u``."""
    stage = model.readout
    return Program(f"{model.name}_readout", dict(stage.tensors), [stage_record(stage)], stage.output)


def derive_token_network_adjoint(model) -> TokenNetworkAdjoint:
    """The derived adjoints of ``model``'s embedding, step, final projection and readout."""
    return TokenNetworkAdjoint(
        embedding=derive_adjoint(embedding_program(model)),
        step=derive_adjoint(model.step),
        final=derive_adjoint(model.final) if model.final is not None else None,
        readout=derive_adjoint(readout_program(model)),
    )


def grid_program(model: GridNetworkProgram, transfer: bool) -> Program:
    """One grid step ``u⁺ = Proj(R u + Δt F(u))`` as one program (``transfer``: R the transfer
    stages' map, else the identity), ``R u`` written as an assignment of its own."""
    stages = model.field + (model.transfer if transfer else ())
    tensors = {name: tensor for stage in stages for name, tensor in stage.tensors.items()}
    records = [stage_record(stage) for stage in stages]
    indices = model.update.lhs.indices
    source = model.transfer[-1].output if transfer and model.transfer else INPUT_STATE
    moved = Assignment(sp.IndexedBase(TRANSFER)[indices], sp.IndexedBase(source)[indices],
                       "the transfer R u" if transfer else "the transfer R = 1",
                       quadrature=rf"(R u)_{{{','.join(map(str, indices))}}} = "
                                  + (tensors[source].latex if transfer else "u") + f"_{{{','.join(map(str, indices))}}}")
    tensors[TRANSFER] = Tensor(TRANSFER, "R u", indices, "temp")
    tensors[model.update.target] = Tensor(model.update.target, "u^{+}", indices, "temp")
    records.append(SubstepRecord("transfer", "", (Evaluation("transfer", "transfer", "", (moved,)),), None))
    records.append(SubstepRecord("update: explicit Euler step", "",
                                 (Evaluation("update", "update", "", (model.update,)),), None))
    if model.projection is not None:
        tensors.update(model.projection.tensors)
        records.append(stage_record(model.projection))
    return Program(f"{model.name}_step", tensors, records, model.output)
