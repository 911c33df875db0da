"""Closed-form projections derived from their optimality conditions.

``derive_layer_norm_projection`` solves the Lagrange system of
``min ½‖u − v‖² + ½(g − γ)²  s.t.  mean(u) = σ_1,  (Σ(u − σ_1)² + g²)/N = σ_2²``:
Theorem 3.1 of the paper is the case without the ghost coordinate (``γ = 0``); with the
ghost value ``γ = √(N ε)`` the same derivation yields LayerNorm's ``(v − α)/√(β + ε)``.
``derive_relu_projection`` solves the KKT system of ``min ½(u − v)²  s.t.  u ≥ 0``.

Both problems separate over the components once the multipliers are fixed, so the
derivation works on one generic component ``v`` and the aggregates ``α = mean(v)``,
``β = var(v)``: an affine map ``c v + d`` has mean ``c α + d`` and variance ``c² β``.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .cache import disk_cached
from .projection_verifiers import verify_layer_norm_projection, verify_relu_projection

__all__ = ["Projection", "ProjectionSymbols", "derive_layer_norm_projection", "derive_relu_projection"]


@dataclass(frozen=True)
class ProjectionSymbols:
    """The symbols the derived projection formulas are written in."""

    v: sp.Symbol = sp.Symbol("v", real=True)
    alpha: sp.Symbol = sp.Symbol(r"\alpha", real=True)
    beta: sp.Symbol = sp.Symbol(r"\beta", positive=True)
    sigma_1: sp.Symbol = sp.Symbol(r"\sigma_1", real=True)
    sigma_2: sp.Symbol = sp.Symbol(r"\sigma_2", positive=True)
    ghost: sp.Symbol = sp.Symbol(r"\gamma", nonnegative=True)
    size: sp.Symbol = sp.Symbol("N", integer=True, positive=True)
    epsilon: sp.Symbol = sp.Symbol(r"\varepsilon", nonnegative=True)


SYMBOLS = ProjectionSymbols()


@dataclass(frozen=True)
class Projection:
    """A derived projection: its formula and the steps that led to it, in LaTeX."""

    formula: sp.Expr
    steps: tuple[tuple[str, str], ...]
    distance: sp.Expr | None = None
    theorem: sp.Expr | None = None
    gap: sp.Expr | None = None


def _mean(affine: sp.Expr) -> sp.Expr:
    """Mean over the features of ``c v + d``: the component ``v`` becomes ``α``."""
    return affine.subs(SYMBOLS.v, SYMBOLS.alpha)


def _variance(affine: sp.Expr) -> sp.Expr:
    """Population variance of ``c v + d``: ``c² β``."""
    return sp.diff(affine, SYMBOLS.v) ** 2 * SYMBOLS.beta


@disk_cached(Projection, verify=verify_layer_norm_projection)
def derive_layer_norm_projection() -> Projection:
    """Projection onto ``S_1(σ_1, σ_2)`` with a ghost coordinate, by Lagrange multipliers."""
    s = SYMBOLS
    u, g = sp.symbols("u g", real=True)
    lam, mu = sp.symbols(r"\lambda \mu", real=True)
    scale = sp.Symbol("c", positive=True)
    steps: list[tuple[str, str]] = []

    component = (u - s.v) ** 2 / 2 + lam * u / s.size + mu * (u - s.sigma_1) ** 2 / s.size
    ghost = (g - s.ghost) ** 2 / 2 + mu * g**2 / s.size
    steps.append((
        "Lagrangian, one feature component and the ghost coordinate",
        sp.latex(sp.Eq(sp.Symbol(r"\mathcal{L}_k"), component)) + r",\quad "
        + sp.latex(sp.Eq(sp.Symbol(r"\mathcal{L}_g"), ghost)),
    ))
    u_stationary = sp.solve(sp.diff(component, u), u)[0]
    g_stationary = sp.solve(sp.diff(ghost, g), g)[0]
    c = sp.factor(sp.diff(u_stationary, s.v))
    steps.append((
        "stationarity: every component is the same affine map of v",
        sp.latex(sp.Eq(u, u_stationary)) + r",\quad " + sp.latex(sp.Eq(g, g_stationary)),
    ))
    lam_value = sp.solve(sp.Eq(_mean(u_stationary), s.sigma_1), lam)[0]
    u_centered = sp.simplify(u_stationary.subs(lam, lam_value))
    u_general = s.sigma_1 + scale * (s.v - s.alpha)
    if sp.simplify(u_centered - u_general.subs(scale, c)) != 0:
        raise AssertionError("mean constraint did not centre the stationary point")
    steps.append((
        "the mean constraint fixes the multiplier λ and centres the map at α",
        sp.latex(sp.Eq(lam, lam_value)) + r",\quad "
        + sp.latex(sp.Eq(u, u_general)) + r",\quad " + sp.latex(sp.Eq(scale, c)),
    ))
    ghost_general = scale * s.ghost
    variance = _variance(u_general) + ghost_general**2 / s.size
    unknown = sp.Symbol("C", real=True)
    roots = sorted(sp.solve(sp.Eq(variance.subs(scale, unknown), s.sigma_2**2), unknown), key=sp.default_sort_key)
    readable = [sp.sign(root) * s.sigma_2 / sp.sqrt(s.beta + s.ghost**2 / s.size) for root in roots]
    if any(sp.simplify(root - form) != 0 for root, form in zip(roots, readable)):
        raise AssertionError("rewriting the roots changed them")
    roots = readable
    steps.append((
        "the variance constraint (ghost included) leaves two roots",
        sp.latex(sp.Eq(variance.subs(scale, sp.Symbol("c")), s.sigma_2**2)) + r"\;\Rightarrow\; c \in \left\{"
        + ", ".join(sp.latex(root) for root in roots) + r"\right\}",
    ))

    def distance(root: sp.Expr) -> sp.Expr:
        residual = (root - 1) * (s.v - s.alpha) + (s.sigma_1 - s.alpha)
        squared = sp.expand(residual**2)
        mean_squared = squared.subs(s.v**2, s.beta + s.alpha**2).subs(s.v, s.alpha)
        return s.size * mean_squared + (root - 1) ** 2 * s.ghost**2

    first, second = roots
    gap = sp.factor(sp.expand(distance(first) - distance(second)))
    best = second if gap.is_positive else first if gap.is_negative else None
    if best is None:
        raise AssertionError(f"cannot order the two roots' distances: {gap}")
    steps.append((
        "compare the two roots: the distance of the negative root exceeds the positive one's by",
        sp.latex(abs(gap)) + r" > 0",
    ))
    formula = u_general.subs(scale, best)
    epsilon_form = formula.subs(s.ghost, sp.sqrt(s.size * s.epsilon))
    theorem = formula.subs(s.ghost, 0)
    steps.append((
        "the minimizer; with the ghost value γ = √(N ε) this is LayerNorm's formula "
        "(γ = 0 gives Theorem 3.1)",
        sp.latex(sp.Eq(u, formula)) + r"\;\xrightarrow{\gamma=\sqrt{N\varepsilon}}\; "
        + sp.latex(epsilon_form) + r",\qquad \gamma = 0:\; " + sp.latex(theorem),
    ))
    return Projection(
        formula=epsilon_form,
        steps=tuple(steps),
        distance=sp.factor(sp.simplify(distance(best).subs(s.ghost, 0))),
        theorem=theorem,
        gap=abs(gap),
    )


@disk_cached(Projection, verify=verify_relu_projection)
def derive_relu_projection() -> Projection:
    """Projection onto ``S_2 = {u ≥ 0}`` from the KKT conditions (it separates pointwise)."""
    s = SYMBOLS
    u = sp.Symbol("u", real=True)
    lam = sp.Symbol(r"\lambda", real=True)
    lagrangian = (u - s.v) ** 2 / 2 - lam * u
    stationary = sp.solve(sp.diff(lagrangian, u), u)[0]
    steps = [(
        "Lagrangian and stationarity",
        sp.latex(sp.Eq(sp.Symbol(r"\mathcal{L}"), lagrangian)) + r",\quad " + sp.latex(sp.Eq(u, stationary)),
    )]
    branches = []
    for active in (lam, u):
        solution = sp.solve([sp.Eq(active, 0), sp.Eq(u, stationary)], [u, lam], dict=True)[0]
        feasible = sp.And(solution[u] >= 0, solution[lam] >= 0)
        branches.append((solution[u], sp.simplify(feasible)))
    steps.append((
        "complementary slackness λu = 0: either the multiplier or the constraint is inactive",
        r",\quad ".join(rf"u = {sp.latex(value)} \text{{ if }} {sp.latex(condition)}" for value, condition in branches),
    ))
    piecewise = sp.Piecewise(*branches)
    formula = sp.Max(s.v, 0)
    offset = sp.Symbol("p", nonnegative=True)
    regions = []
    for value, condition in branches:
        region = condition.as_set()
        regions.append(region)
        witness = region.inf + offset if region.inf.is_finite else region.sup - offset
        if sp.simplify(formula.subs(s.v, witness) - value.subs(s.v, witness)) != 0:
            raise AssertionError(f"the KKT branch u = {value} on {region} is not max(v, 0)")
    if sp.Union(*regions) != sp.S.Reals:
        raise AssertionError("the KKT branches do not cover the real line")
    steps.append((
        "the two branches cover the line and join continuously at v = 0",
        sp.latex(sp.Eq(u, piecewise)) + " = " + sp.latex(formula),
    ))
    return Projection(formula=formula, steps=tuple(steps))
