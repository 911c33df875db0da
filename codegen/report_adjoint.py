"""The adjoint section of a derivation report: Hamiltonian, stationarity, adjoint assignments."""

from __future__ import annotations

from splitformer.symbolic.adjoint import Adjoint

__all__ = ["adjoint_context"]


def adjoint_context(adjoint: Adjoint) -> dict:
    return {"records": adjoint.records, "seed": adjoint.tensors[adjoint.seed].latex}
