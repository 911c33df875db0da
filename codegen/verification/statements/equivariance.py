"""Translation equivariance of a relative-kernel operator, checked on its derived formula.

A convolution ``∫ k(σ) u(x + σ) dσ`` on a grid of stride ``S`` commutes with shifts of the
input by ``S`` pixels: shifting the sampled field ``I[…, ρ, …] → I[…, ρ − S, …]`` along the
row axis gives the output at the previous grid node ``p − 1``. The check substitutes both
sides in the derived assignment and compares the index expressions exactly; the negative
control shifts by ``S + 1`` and must fail.
"""

from __future__ import annotations

import sympy as sp

from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.program import Assignment
from . import Check

__all__ = ["equivariance_check", "shift_commutes"]


def _canonical(expr: sp.Expr) -> sp.Expr:
    return expr.replace(lambda e: isinstance(e, sp.Indexed),
                        lambda e: e.base[tuple(sp.expand(index) for index in e.indices)])


def shift_commutes(assignment: Assignment, node: sp.Idx, axis: int, shift: sp.Expr) -> bool:
    """Whether shifting the sampled fields by ``shift`` along ``axis`` moves the output by one ``node``."""
    def shifted(read: sp.Indexed) -> sp.Indexed:
        if all(isinstance(index, sp.Idx) for index in read.indices):
            return read
        indices = list(read.indices)
        indices[axis] = indices[axis] - shift
        return read.base[tuple(indices)]

    rhs = assignment.rhs
    moved_input = rhs.replace(lambda e: isinstance(e, sp.Indexed), shifted)
    moved_output = rhs.xreplace({node: node - 1})
    return sp.expand(_canonical(moved_input) - _canonical(moved_output)) == 0


def equivariance_check(check_id: str, owner: str, assignment: Assignment, node: sp.Idx, axis: int,
                       stride: sp.Expr) -> Check:
    """The equivariance statement for ``assignment`` and its negative control (shift by stride + 1)."""
    if not any(not isinstance(i, sp.Idx) for read in assignment.rhs.atoms(sp.Indexed) for i in read.indices):
        raise SplitformerError(f"{check_id}: {assignment.target} reads no field at shifted points")
    holds = shift_commutes(assignment, node, axis, stride)
    control = shift_commutes(assignment, node, axis, stride + 1)
    return Check(
        check_id, owner,
        f"The derived {assignment.target} is a translation-equivariant integral operator: shifting the input "
        f"field by the stride ({stride} pixels) along the rows shifts the output by one grid node; a shift by "
        f"{stride + 1} pixels does not (negative control).",
        "symbolic", holds and not control,
        f"shift by {stride}: {'commutes' if holds else 'does not commute'}; "
        f"shift by {stride + 1}: {'commutes (control failed)' if control else 'does not commute'}",
    )
