"""Checks of the projections: Theorem 3.1, ReLU, LayerNorm's ε, scale invariance, RMSNorm, and
every registered projection kind given by a constraint set (feasibility, root selection)."""

from __future__ import annotations

import sympy as sp

from splitformer.symbolic.projections import SYMBOLS as S, derive_layer_norm_projection, derive_relu_projection, feature_mean
from . import Check, plain

__all__ = ["projection_checks", "closed_form_check", "set_checks", "rms_norm_check"]

CLOSED_FORM = S.sigma_1 + S.sigma_2 * (S.v - S.alpha) / sp.sqrt(S.beta)
_HYPOTHESES = "For each token, with α = mean_y v, β = var_y v > 0 and σ₂ > 0"


def _mean(affine: sp.Expr) -> sp.Expr:
    return sp.expand(affine).subs(S.v, S.alpha)


def _variance(affine: sp.Expr) -> sp.Expr:
    return sp.diff(affine, S.v) ** 2 * S.beta


def closed_form_check(formula: sp.Expr) -> Check:
    """The projection formula ``formula`` (ε = 0) against the closed form of Theorem 3.1."""
    difference = sp.simplify(formula - CLOSED_FORM)
    return Check(
        "theorem-3.1/closed-form", None,
        f"{_HYPOTHESES}: the minimizer derived from the Lagrange system equals σ₁ + σ₂ (v − α)/√β.",
        "symbolic", difference == 0,
        "derived − closed form simplifies to 0" if difference == 0 else f"derived − closed form = {plain(difference)}",
    )


def _constraints(formula: sp.Expr) -> Check:
    mean, variance = sp.simplify(_mean(formula) - S.sigma_1), sp.simplify(_variance(formula) - S.sigma_2**2)
    holds = mean == 0 and variance == 0
    return Check(
        "theorem-3.1/constraints", None,
        f"{_HYPOTHESES}: the derived projection lies in S₁(σ₁, σ₂): its mean is σ₁ and its variance σ₂².",
        "symbolic", holds,
        "mean − σ₁ = 0 and variance − σ₂² = 0" if holds else f"mean − σ₁ = {plain(mean)}, variance − σ₂² = {plain(variance)}",
    )


def _stationarity(formula: sp.Expr) -> Check:
    scale = sp.diff(formula, S.v)
    lam, mu = S.size * (S.alpha - S.sigma_1), S.size * (1 - scale) / (2 * scale)
    residual = sp.simplify((formula - S.v) + lam / S.size + 2 * mu * (formula - S.sigma_1) / S.size)
    return Check(
        "theorem-3.1/kkt", None,
        f"{_HYPOTHESES}: the derived projection is a stationary point of the Lagrangian "
        "½‖u − v‖² + λ(mean u − σ₁) + μ(var u − σ₂²).",
        "symbolic", residual == 0,
        f"with λ = {plain(lam)}, μ = {plain(sp.simplify(mu))} the stationarity residual is {plain(residual)}",
    )


def _minimizer() -> Check:
    projection = derive_layer_norm_projection()
    expected = S.size * ((S.sigma_2 - sp.sqrt(S.beta)) ** 2 + (S.sigma_1 - S.alpha) ** 2)
    holds = sp.expand(projection.distance - expected) == 0 and projection.gap.is_positive
    return Check(
        "theorem-3.1/minimizer", None,
        f"{_HYPOTHESES}: of the two stationary points the + root is the minimizer, at squared distance "
        "|Ω_y| [(σ₂ − √β)² + (σ₁ − α)²].",
        "symbolic", holds,
        f"distance(− root) − distance(+ root) = {plain(projection.gap)} > 0; "
        f"distance(+ root) = {plain(sp.factor(projection.distance))}",
    )


def _non_unique() -> Check:
    """Two distinct points of S₁ at the same distance from a constant v (N = 4)."""
    pattern_1, pattern_2 = (1, -1, 1, -1), (1, 1, -1, -1)
    v = [S.alpha] * 4
    points = [[S.sigma_1 + S.sigma_2 * p for p in pattern] for pattern in (pattern_1, pattern_2)]
    feasible = all(sp.simplify(sum(w) / 4 - S.sigma_1) == 0
                   and sp.simplify(sum((x - S.sigma_1) ** 2 for x in w) / 4 - S.sigma_2**2) == 0 for w in points)
    distances = [sp.expand(sum((x - y) ** 2 for x, y in zip(w, v))) for w in points]
    holds = feasible and sp.expand(distances[0] - distances[1]) == 0 and points[0] != points[1]
    return Check(
        "theorem-3.1/beta-zero", None,
        "For β = 0 (v constant over the features) the projection onto S₁ is not unique, so the "
        "hypothesis β > 0 is needed: two distinct points of S₁ are at the same distance from v.",
        "symbolic", holds,
        f"N = 4, v = α·1: w = σ₁ + σ₂·{pattern_1} and w = σ₁ + σ₂·{pattern_2} both lie in S₁ at squared distance "
        f"{plain(sp.factor(distances[0]))}",
    )


def _relu() -> Check:
    formula = derive_relu_projection().formula
    failures = []
    for sign in (1, -1):
        v = sign * sp.Symbol("p", positive=True)
        value = formula.subs(S.v, v)
        multiplier = value - v
        if not (sp.simplify(value * multiplier) == 0 and (value >= 0) is sp.true and (multiplier >= 0) is sp.true):
            failures.append(f"v = {v}: u = {value}, λ = {multiplier}")
    return Check(
        "relu/kkt", None,
        "ReLU is the projection onto S₂ = {u ≥ 0}: u = max(v, 0) satisfies u ≥ 0, λ = u − v ≥ 0, λu = 0 "
        "for v > 0 and v < 0 (the problem separates pointwise).",
        "symbolic", not failures,
        "KKT conditions hold on both half-lines" if not failures else "; ".join(failures),
    )


def _ghost() -> Check:
    formula = derive_layer_norm_projection().formula.subs({S.sigma_1: 0, S.sigma_2: 1})
    norm = sp.sqrt(S.size * (S.beta + S.epsilon))  # ‖(v − α, √(N ε))‖ over N features plus the ghost
    sphere = sp.sqrt(S.size) * (S.v - S.alpha) / norm
    difference = sp.simplify(formula - sphere)
    return Check(
        "layer-norm/eps-ghost", None,
        "For ε ≥ 0: LayerNorm's (v − α)/√(β + ε) is the first N coordinates of the projection of "
        "(v − α, √(N ε)) onto the sphere of radius √N in one more dimension.",
        "symbolic", difference == 0,
        "derived formula − sphere projection = 0" if difference == 0 else f"difference {plain(difference)}",
    )


def _scale_invariance() -> Check:
    formula = derive_layer_norm_projection().formula.subs({S.sigma_1: 0, S.sigma_2: 1})
    c = sp.Symbol("c", positive=True)
    scaled = formula.subs({S.v: c * S.v, S.alpha: c * S.alpha, S.beta: c**2 * S.beta}, simultaneous=True)
    without_eps = sp.simplify((scaled - formula).subs(S.epsilon, 0))
    with_eps = sp.simplify(scaled - formula)
    witness = {S.v: 1, S.alpha: 0, S.beta: 1, S.epsilon: sp.Rational(1, 10), c: 2}
    value = with_eps.subs(witness)
    holds = without_eps == 0 and value != 0
    return Check(
        "layer-norm/scale-invariance", None,
        "Proj_{S₁}(c v) = Proj_{S₁}(v) for every c > 0 when ε = 0, and not when ε > 0: so the paper's ½ "
        "relaxation before a projection is exact only for ε = 0.",
        "symbolic", holds,
        f"ε = 0: difference {plain(without_eps)}; ε > 0: difference {float(value):.6g} at v = 1, α = 0, β = 1, "
        "ε = 1/10, c = 2",
    )


def projection_checks(formula: sp.Expr | None = None) -> list[Check]:
    """All projection checks; ``formula`` replaces the derived ε = 0 projection (negative controls)."""
    derived = derive_layer_norm_projection().theorem if formula is None else formula
    return [
        closed_form_check(derived), _constraints(derived), _stationarity(derived), _minimizer(), _non_unique(),
        _relu(), _ghost(), _scale_invariance(), rms_norm_check(),
    ] + [check for cls in _projection_kinds() for check in set_checks(cls)]


def _projection_kinds() -> list[type]:
    from splitformer.symbolic.kinds import OPERATOR_KINDS

    return [cls for kind, cls in sorted(OPERATOR_KINDS.items())
            if cls.is_projection and getattr(cls, "constraints", None) is not None and kind != "layer-norm"]


def set_checks(cls: type) -> list[Check]:
    """A projection kind given by its constraint set: its derived point lies in the set, and the root
    selection is decided (every other stationary point is farther)."""
    from splitformer.symbolic.constraints import U

    constraints, projection = cls.constraints, cls.projection()
    residuals = [sp.simplify(feature_mean(constraints, moment.component.subs(U, projection.theorem)) - moment.value)
                 for moment in constraints.moments]
    feasible = all(residual == 0 for residual in residuals)
    checks = [Check(
        f"projection/{cls.kind}/constraints", None,
        f"The projection onto {constraints.name} derived from its constraint set alone (no ghost) satisfies "
        "every moment constraint of the set, averaged over the features.",
        "symbolic", feasible,
        "every constraint residual simplifies to 0" if feasible
        else "residuals " + ", ".join(plain(residual) for residual in residuals),
    )]
    decided = projection.gap is None or bool(projection.gap.is_positive)
    checks.append(Check(
        f"projection/{cls.kind}/minimizer", None,
        f"Of the stationary points of the Lagrangian of {constraints.name}, the derived one is the nearest: "
        "every other root is farther by a positive amount.",
        "symbolic", decided,
        "a single stationary point" if projection.gap is None else f"the nearest rejected root is farther by {plain(projection.gap)}",
    ))
    return checks


def rms_norm_check(reference=None, features: int = 3) -> Check:
    """The derived RMSNorm operator, evaluated entry by entry, against ``x/√(mean x² + ε) · g``.

    ``reference(x, g, eps)`` replaces the published formula (negative controls).
    """
    from splitformer.symbolic.derivation import derive
    from splitformer.symbolic.domains import FEATURES, TOKENS
    from splitformer.symbolic.evaluate import evaluate
    from splitformer.symbolic.operators import EPSILON
    from splitformer.symbolic.scheme import Scheme, Sequence, Substep

    def published(x, g, eps):
        mean_square = sum(value**2 for value in x) / len(x)
        return [value / sp.sqrt(mean_square + eps) * gain for value, gain in zip(x, g)]

    scheme = Scheme("rms-norm", "one RMSNorm", {"norm": "rms-norm"}, Sequence((Substep("norm", "projection"),)))
    program = derive(scheme)
    x = [sp.Symbol(f"x{k}", real=True) for k in range(features)]
    g = [sp.Symbol(f"g{k}", real=True) for k in range(features)]
    inputs = {"u0": lambda i, k: x[k], "norm_gain": lambda k: g[k]}
    values = evaluate(program, {TOKENS.size: 1, FEATURES.size: features}, inputs)[program.output]
    expected = (reference or published)(x, g, EPSILON)
    residuals = [sp.simplify(values[(0, k)] - expected[k]) for k in range(features)]
    holds = all(residual == 0 for residual in residuals)
    return Check(
        "rms-norm/closed-form", None,
        "RMSNorm, derived as the projection onto the sphere {mean_y u² = 1} with the ghost coordinate √(N ε) and "
        f"followed by its gain, equals x / sqrt(mean(x²) + ε) · g: symbolically, every entry for {features} features.",
        "symbolic", holds,
        "derived − published simplifies to 0 in every entry" if holds
        else "derived − published = " + ", ".join(plain(residual) for residual in residuals),
    )
