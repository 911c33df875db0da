"""The sign of the subdifferential: ``v − u ∈ ∂I_S(u)`` is the projection identity.

For ``S = [0, ∞)`` the normal cone is ``∂I_S(u) = {0}`` for ``u > 0`` and ``(−∞, 0]`` at
``u = 0``. The tool searches a grid of inputs ``v`` for a counterexample to each form.
"""

from __future__ import annotations

import sympy as sp

from splitformer.symbolic.projections import SYMBOLS as S, derive_relu_projection
from . import Check

__all__ = ["sign_check"]


def _in_normal_cone(vector: sp.Expr, point: sp.Expr) -> bool:
    """``vector ∈ ∂I_{[0,∞)}(point)`` for a feasible ``point``."""
    return vector == 0 if point > 0 else vector <= 0


def _counterexample(relation, candidates) -> sp.Expr | None:
    projection = derive_relu_projection().formula
    for v in candidates:
        u = projection.subs(S.v, v)
        if not relation(u, v):
            return v
    return None


FORMS = {"v - u": lambda u, v: v - u, "u - v": lambda u, v: u - v}


def sign_check(claimed: str = "v - u") -> Check:
    """The ``claimed`` form holds on the grid and the other form has a counterexample.

    ``claimed = "u - v"`` plays the paper's printed sign as the claim (a negative control).
    """
    other = "u - v" if claimed == "v - u" else "v - u"
    candidates = [sp.Rational(n, 2) for n in range(-6, 7)]
    grid = "{−3, −5/2, …, 3}"
    broken = _counterexample(lambda u, v: _in_normal_cone(FORMS[claimed](u, v), u), candidates)
    rival = _counterexample(lambda u, v: _in_normal_cone(FORMS[other](u, v), u), candidates)
    holds = broken is None and rival is not None
    projection = derive_relu_projection().formula
    if broken is not None:
        u = projection.subs(S.v, broken)
        detail = (f"the claimed {claimed} ∈ ∂I_S(u) fails at v = {broken}: u = Proj(v) = {u}, "
                  f"{claimed} = {FORMS[claimed](u, broken)} is not in ∂I_S({u})")
    elif rival is None:
        detail = f"no counterexample to {other} ∈ ∂I_S(u) on the grid v ∈ {grid}: the forms are not told apart"
    else:
        u = projection.subs(S.v, rival)
        detail = (f"{claimed} ∈ ∂I_S(u) holds for every v in {grid}; {other} ∈ ∂I_S(u) fails at v = {rival}: "
                  f"u = Proj(v) = {u}, {other} = {FORMS[other](u, rival)} is not in ∂I_S({u}) = (−∞, 0]")
    return Check(
        "subdifferential/sign", None,
        f"For S = [0, ∞): u = Proj_S(v) ⇔ {claimed} ∈ ∂I_S(u), the normal cone (the paper prints u − v ∈ ∂I_S(u)).",
        "symbolic", holds, detail,
    )
