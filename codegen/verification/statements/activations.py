"""Activations as proximal maps: ``σ = prox_φ`` for a convex ``φ`` iff σ is monotone and 1-Lipschitz.

For such σ the penalty has ``φ'(u) = σ⁻¹(u) − u`` on the range of σ (and ``+∞`` off it).
Otherwise the check names a witness: a point where ``σ' < 0`` or ``σ' > 1``.
"""

from __future__ import annotations

import sympy as sp

from splitformer.symbolic.activations import ACTIVATIONS, Activation
from splitformer.symbolic.projections import SYMBOLS as S
from . import Check, plain

__all__ = ["activation_checks", "PROXIMAL"]

#: The claim the reports make for each activation (docs/model.md §6).
PROXIMAL = {"relu": True, "tanh": True, "gelu": False, "silu": False, "gelu-tanh": False, "relu-squared": False}
#: The penalties, stated as claims; the check verifies prox_φ = σ for each.
PENALTIES = {
    "relu": "the indicator of [0, ∞)",
    "tanh": "φ(u) = u·artanh(u) + ½ log(1 − u²) − u²/2 on (−1, 1), +∞ elsewhere",
}


def _witness(activation: Activation) -> str | None:
    """The grid point where σ' leaves [0, 1] the most, if any."""
    slope = sp.diff(activation.formula, S.v)
    worst, excess = None, sp.Integer(0)
    for v in (sp.Rational(n, 8) for n in range(-48, 49)):
        value = slope.evalf(30, subs={S.v: v})  # numerically at v: substituting first rebuilds the tree
        if not value.is_real:
            continue
        outside = max(-value, value - 1)
        if outside > excess:
            worst, excess = (v, value), outside
    if worst is None:
        return None
    v, value = worst
    return f"σ'({v}) = {sp.N(value, 6)} {'< 0: not monotone' if value < 0 else '> 1: expansive'}"


def _penalty_matches(name: str, activation: Activation) -> tuple[bool, str]:
    """Check ``prox_φ = σ``, i.e. ``v − σ(v) ∈ ∂φ(σ(v))`` for the stated penalty."""
    v = sp.Symbol("p", positive=True)
    if name == "relu":  # ∂I_{[0,∞)}(u) = {0} for u > 0, (−∞, 0] at u = 0
        positive = sp.simplify(v - activation(v)) == 0
        negative = activation(-v) == 0 and (-v - activation(-v) <= 0) is sp.true
        return positive and negative, "v − σ(v) ∈ ∂I_{[0,∞)}(σ(v)) on both half-lines"
    u = sp.Symbol("u", real=True)
    penalty = u * sp.atanh(u) + sp.log(1 - u**2) / 2 - u**2 / 2
    gradient = sp.diff(penalty, u)
    residual = gradient.subs(u, activation(S.v)) - (S.v - activation(S.v))
    identity = sp.simplify(sp.expand_log(residual.rewrite(sp.log).rewrite(sp.exp), force=True))
    curvature = sp.simplify(sp.diff(penalty, u, 2).subs(u, activation(S.v)))  # φ'' on the range of σ
    holds = identity == 0 and curvature.is_nonnegative is True
    return holds, f"φ'(σ(v)) − (v − σ(v)) = {plain(identity)}, φ''(σ(v)) = {plain(curvature)} ≥ 0"


def activation_checks(claims: dict[str, bool] | None = None, names: tuple[str, ...] | None = None) -> list[Check]:
    """``activation/<name>`` for every activation (or those in ``names``): its proximal claim proved or refuted."""
    claims = PROXIMAL if claims is None else claims
    checks = []
    for name in ACTIVATIONS if names is None else names:
        activation = ACTIVATIONS[name]()
        witness = _witness(activation)
        proximal = witness is None
        if proximal and name in PENALTIES:
            penalty_ok, how = _penalty_matches(name, activation)
            detail = f"monotone and 1-Lipschitz; penalty {PENALTIES[name]}; {how}"
            proximal = penalty_ok
        elif proximal:  # a registered activation: no penalty stated, the slope condition decides
            detail = ("0 ≤ σ' ≤ 1 at 97 points of [−6, 6]: monotone and 1-Lipschitz, the proximal map of the convex "
                      "penalty with φ'(u) = σ⁻¹(u) − u")
        else:
            detail = f"not a proximal map of a convex penalty: {witness}"
        claim = claims[name] if name in claims else activation.proximal
        checks.append(Check(
            f"activation/{name}", None,
            f"{name} {'is' if claim else 'is not'} the proximal map of a convex penalty "
            "(for a map of the line: iff it is monotone and 1-Lipschitz).",
            "symbolic", proximal == claim, detail,
        ))
    return checks
