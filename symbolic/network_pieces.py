r"""The programs a token network's and a grid step's module runs (what their forward emits and reverse mode
differentiates), each a ``Program`` in index notation built from the network's stages:

- the embedding program: the embedding stage's assignments followed by the initial condition on
  ``Ω_x = {x_cls} ∪ Ω_grid`` in index notation (``initial_condition``), whose output is the state
  ``u^{(0)}`` entering the first step;
- the readout program, whose input is the final state;
- one grid step ``u⁺ = Proj(R u + Δt F(u))`` (``grid_program``), ``R u`` an assignment of its own.

A token network's step and final projection are block programs. The costate runs readout → final
projection → steps (last first) → embedding, each piece's input costate seeding the one before
(``λ^n = (∂Φ/∂u^n)ᵀ λ^{n+1}``).
"""

from __future__ import annotations

import sympy as sp

from .domains import X, Y
from .image import COLS, X1, X2
from .latex import equation
from .program import Assignment, Evaluation, Program, SubstepRecord, Tensor
from .stages import Stage, stage_record

__all__ = ["initial_condition", "embedding_program", "readout_program", "grid_program", "STATE", "INPUT",
           "INPUT_STATE", "TRANSFER"]

#: The state entering the first step (the embedding program's output).
STATE = "u0"
#: The batched input of a token network (``pixel_values``, channels first).
INPUT = "image"
#: The batched input of a grid step (a feature map, channels first), and ``R u`` (the transfer's value).
INPUT_STATE, TRANSFER = "u0", "transfer"


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


def embedding_program(name: str, stage: Stage) -> Program:
    """The embedding ``stage`` and the initial condition on the tokens, as one program with output ``u^{(0)}``."""
    tensors, assignments = initial_condition(stage)
    tokens = SubstepRecord("initial condition on the token domain", "",
                           (Evaluation("tokens", "initial-condition", "", assignments),), None)
    return Program(f"{name}_embedding", {**stage.tensors, **tensors}, [stage_record(stage), tokens], STATE)


def readout_program(name: str, stage: Stage) -> Program:
    """The readout ``stage`` as a program whose input is the final state ``u``."""
    return Program(f"{name}_readout", dict(stage.tensors), [stage_record(stage)], stage.output)


def grid_program(name: str, field: tuple[Stage, ...], transfer: tuple[Stage, ...], update: Assignment,
                 projection: Stage | None) -> Program:
    """One grid step ``u⁺ = Proj(R u + Δt F(u))`` as one program: R the map of the ``transfer`` stages, the
    identity where there are none; ``R u`` written as an assignment of its own."""
    stages = field + transfer
    tensors = {name: tensor for stage in stages for name, tensor in stage.tensors.items()}
    records = [stage_record(stage) for stage in stages]
    indices = update.lhs.indices
    source = transfer[-1].output if transfer else INPUT_STATE
    moved = Assignment(sp.IndexedBase(TRANSFER)[indices], sp.IndexedBase(source)[indices],
                       "the transfer R u" if transfer else "the transfer R = 1",
                       quadrature=rf"(R u)_{{{','.join(map(str, indices))}}} = "
                                  + (tensors[source].latex if transfer else "u") + f"_{{{','.join(map(str, indices))}}}")
    tensors[TRANSFER] = Tensor(TRANSFER, "R u", indices, "temp")
    tensors[update.target] = Tensor(update.target, "u^{+}", indices, "temp")
    records.append(SubstepRecord("transfer", "", (Evaluation("transfer", "transfer", "", (moved,)),), None))
    records.append(SubstepRecord("update: explicit Euler step", "",
                                 (Evaluation("update", "update", "", (update,)),), None))
    if projection is not None:
        tensors.update(projection.tensors)
        records.append(stage_record(projection))
    return Program(f"{name}_step", tensors, records, projection.output if projection else update.target)
