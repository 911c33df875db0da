"""The adjoint section of a derivation report: Hamiltonian, stationarity, adjoint assignments."""

from __future__ import annotations

import sympy as sp

from splitformer.symbolic.adjoint import RELU_SUBGRADIENT_AT_ZERO, Adjoint
from splitformer.symbolic.domains import MEMORY, TOKENS, VARIABLES

__all__ = ["adjoint_context"]


def adjoint_context(adjoint: Adjoint) -> dict:
    """Template variables of ``report/scheme/adjoint.md.j2``."""
    forward = adjoint.forward.tensors
    read = sorted({str(item.base.label) for assignment in adjoint.assignments for item in assignment.rhs.atoms(sp.Indexed)
                   if str(item.base.label) in forward
                   and forward[str(item.base.label)].role in ("input", "memory", "state", "temp")},
                  key=list(forward).index)
    tokens = {variable.index for variable in VARIABLES.values() if variable.domain in (TOKENS, MEMORY)}
    recomputed = [name for name in read if sum(index in tokens for index in forward[name].indices) >= 2]
    kinds = {evaluation.kind for record in adjoint.forward.records for evaluation in record.evaluations}
    return {
        "records": adjoint.records,
        "seed": adjoint.tensors[adjoint.seed].latex,
        "kept": [forward[name].latex for name in read if name not in recomputed],
        "recomputed": [forward[name].latex for name in recomputed],
        "layer_norm": "layer-norm" in kinds,
        "rms_norm": "rms-norm" in kinds,
        "attention": bool({"attention", "rotary-attention", "cross-attention"} & kinds),
        "rotary": "rotary-attention" in kinds,
        "memory": "cross-attention" in kinds,
        "relu": any(assignment.rhs.has(sp.Heaviside) for assignment in adjoint.assignments),
        "relu_at_zero": sp.latex(RELU_SUBGRADIENT_AT_ZERO),
    }
