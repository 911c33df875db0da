"""Closed-form projections derived from their optimality conditions, one deriver for every set.

``derive_projection(S)`` minimizes ``½‖u − v‖² (+ ½(g − γ)² for a ghost coordinate)`` over a
``ConstraintSet`` given only by its constraints:

- moment constraints (equalities) by Lagrange multipliers: stationarity makes every
  component the same affine map ``u = c v + d`` of ``v`` (the problem separates once the
  multipliers are fixed); the constraints, averaged over the features with the set's
  statistics (``α = mean v``, ``β = var v``: ``mean v² = β + α²``), fix ``c`` and ``d``; of
  the roots, the one at the smallest distance is selected, and that selection must be
  decidable from the symbols' assumptions;
- pointwise bounds by the KKT conditions: every active set is one case of the split; the
  feasible cases must cover the real line, and their values must agree with the
  closed form (a max/min of the branches) on every case's region.

With the ghost value ``γ = √(N ε)`` the ``ε`` of LayerNorm and RMSNorm comes out of the same
derivation; ``γ = 0`` gives the set's own projection (Theorem 3.1 for ``S_1``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache

import sympy as sp

from .cache import disk_cached
from .constraints import G, S_1, S_2, SYMBOLS, U, ConstraintSet, ProjectionSymbols
from .errors import SplitformerError

__all__ = [
    "Projection", "ProjectionSymbols", "SYMBOLS", "derive_projection", "feature_mean",
    "derive_layer_norm_projection", "derive_relu_projection",
]


@dataclass(frozen=True)
class Projection:
    """A derived projection: its formula and the steps that led to it, in LaTeX.

    ``formula`` carries ``ε`` (ghost value ``√(N ε)``), ``theorem`` is the formula without
    the ghost, ``distance`` the squared distance of the minimizer without the ghost and
    ``gap`` how much farther the nearest rejected root is (positive).
    """

    formula: sp.Expr
    steps: tuple[tuple[str, str], ...]
    distance: sp.Expr | None = None
    theorem: sp.Expr | None = None
    gap: sp.Expr | None = None

    def _repr_markdown_(self) -> str:
        return "\n\n".join(f"{title}: $${latex}$$" for title, latex in self.steps)


def _fail(constraint_set: ConstraintSet, message: str) -> SplitformerError:
    return SplitformerError(f"projection onto {constraint_set.name}: {message}")


def _tidy(root: sp.Expr) -> sp.Expr:
    """``±√(r²)`` with ``r²`` cancelled, when that is the same number (it reads like the papers)."""
    sign = sp.sign(root)
    if sign not in (1, -1):
        return root
    tidy = sign * sp.sqrt(sp.cancel(root**2))
    return tidy if sp.simplify(tidy - root) == 0 else root


class _Means:
    """Means over the features of polynomials in ``v``, written in the set's statistics."""

    def __init__(self, constraint_set: ConstraintSet):
        self.moments = [sp.Symbol(f"m_{power}") for power in range(3)]
        relations = []
        for statistic in constraint_set.statistics:
            relations.append(sp.Eq(statistic.symbol, self.raw(statistic.mean_of)))
        unknown = [m for m in self.moments[1:] if any(relation.has(m) for relation in relations)]
        solutions = sp.solve(relations, unknown, dict=True) if unknown else [{}]
        if len(solutions) != 1:
            raise _fail(constraint_set, "its statistics do not determine the moments of v")
        self.values = solutions[0]

    def raw(self, expr: sp.Expr) -> sp.Expr:
        """The mean of ``expr`` in the raw moments ``m_p = mean v^p``."""
        polynomial = sp.Poly(sp.expand(expr), SYMBOLS.v)
        if polynomial.degree() > 2:
            raise SplitformerError(f"a mean of a polynomial of degree {polynomial.degree()} in v")
        moments = [sp.Integer(1), *self.moments[1:]]
        return sum((coefficient * moments[power] for (power,), coefficient in polynomial.terms()), sp.Integer(0))

    def __call__(self, expr: sp.Expr) -> sp.Expr:
        mean = self.raw(expr).subs(self.values)
        if any(mean.has(m) for m in self.moments[1:]):
            raise SplitformerError("the set's statistics do not express the mean of " + sp.sstr(expr))
        return sp.expand(mean)


def feature_mean(constraint_set: ConstraintSet, expr: sp.Expr) -> sp.Expr:
    """The mean over the features of ``expr`` (a polynomial of degree ≤ 2 in ``v``), in the set's statistics."""
    return _Means(constraint_set)(expr)


def _lagrange(constraint_set: ConstraintSet) -> Projection:
    s = SYMBOLS
    moments = constraint_set.moments
    multipliers = [sp.Symbol(rf"\lambda_{{{n + 1}}}", real=True) for n in range(len(moments))]
    steps: list[tuple[str, str]] = []
    component = (U - s.v) ** 2 / 2 + sum(lam * m.component for lam, m in zip(multipliers, moments)) / s.size
    ghost = (G - s.ghost) ** 2 / 2 + sum(lam * m.ghost for lam, m in zip(multipliers, moments)) / s.size
    lagrangians = sp.latex(sp.Eq(sp.Symbol(r"\mathcal{L}_k"), component))
    if constraint_set.ghost:
        lagrangians += r",\quad " + sp.latex(sp.Eq(sp.Symbol(r"\mathcal{L}_g"), ghost))
    steps.append(("Lagrangian, one feature component" + (" and the ghost coordinate" if constraint_set.ghost else ""),
                  lagrangians))

    stationary = sp.solve(sp.diff(component, U), U)
    if len(stationary) != 1 or sp.diff(stationary[0], s.v, 2) != 0:
        raise _fail(constraint_set, "stationarity does not make u one affine map of v (constraints must be "
                    "at most quadratic in u)")
    stationary = sp.simplify(stationary[0])
    slope, offset = sp.simplify(sp.diff(stationary, s.v)), sp.simplify(stationary.subs(s.v, 0))
    scale, shift = sp.Symbol("c", real=True), sp.Symbol("d", real=True)
    free = [(symbol, value) for symbol, value in ((scale, slope), (shift, offset)) if value.has(*multipliers)]
    inverse = sp.solve([sp.Eq(symbol, value) for symbol, value in free], multipliers, dict=True)
    if len(inverse) != 1 or len(free) != len(multipliers):
        raise _fail(constraint_set, "the multipliers are not determined by the affine map they produce")
    free_symbols = dict(free)
    general = (scale if scale in free_symbols else slope) * s.v + (shift if shift in free_symbols else offset)
    ghost_value = sp.Integer(0)
    if constraint_set.ghost:
        solved = sp.solve(sp.diff(ghost, G), G)
        if len(solved) != 1:
            raise _fail(constraint_set, "the ghost coordinate has no unique stationary point")
        ghost_value = sp.simplify(solved[0].subs(inverse[0]))
    stationarity = sp.latex(sp.Eq(U, stationary))
    if constraint_set.ghost:
        stationarity += r",\quad " + sp.latex(sp.Eq(G, ghost_value))
    steps.append(("stationarity: every component is the same affine map of v", stationarity))

    means = _Means(constraint_set)
    equations = [sp.Eq(means(m.component.subs(U, general)) + m.ghost.subs(G, ghost_value) / s.size, m.value)
                 for m in moments]
    unknowns = [symbol for symbol, _ in free]
    if shift in unknowns:  # eliminate the offset with the first constraint that fixes it
        for equation in equations:
            solved = sp.solve(equation, shift)
            if len(solved) == 1 and not solved[0].has(*multipliers):
                general = sp.collect(sp.expand(general.subs(shift, solved[0])), scale)
                equations = [sp.simplify(e.subs(shift, solved[0])) for e in equations if e is not equation]
                steps.append(("the constraint linear in the offset fixes it and centres the map",
                              sp.latex(sp.Eq(shift, solved[0])) + r",\quad " + sp.latex(sp.Eq(U, general))))
                unknowns.remove(shift)
                break
    equations = [e for e in equations if e is not sp.true]
    roots = sp.solve(equations, unknowns, dict=True) if unknowns else [{}]
    roots = sorted(({symbol: _tidy(value) for symbol, value in root.items()} for root in roots),
                   key=lambda root: sp.default_sort_key(tuple(root.values())))
    if not roots:
        raise _fail(constraint_set, "the constraints have no stationary point")
    steps.append((
        "the remaining constraints" + (" (ghost included)" if constraint_set.ghost else "") + " leave "
        + ("one root" if len(roots) == 1 else f"{len(roots)} roots"),
        r",\quad ".join(sp.latex(e) for e in equations) + r"\;\Rightarrow\; "
        + r",\; ".join(r"\left(" + ", ".join(sp.latex(sp.Eq(k, v)) for k, v in root.items()) + r"\right)"
                       for root in roots),
    ))

    def distance(root: dict) -> sp.Expr:
        point = general.subs(root)
        return s.size * means((point - s.v) ** 2) + (ghost_value.subs(root) - s.ghost) ** 2

    best, gap = roots[0], None
    if len(roots) > 1:
        distances = [distance(root) for root in roots]
        for candidate, own in zip(roots, distances):
            gaps = [sp.factor(sp.expand(other - own)) for other in distances if other is not own]
            if all(g.is_positive for g in gaps):
                best, gap = candidate, min(gaps, key=sp.count_ops)
                break
        else:
            raise _fail(constraint_set, "cannot decide which stationary point is nearest: "
                        + "; ".join(sp.sstr(d) for d in distances))
        steps.append(("compare the roots: every other root is farther, by at least", sp.latex(gap) + r" > 0"))
    formula = general.subs(best)
    tidy = {symbol: _tidy(value.subs(s.ghost, sp.sqrt(s.size * s.epsilon))) for symbol, value in best.items()}
    epsilon_form = general.subs(tidy)
    theorem = general.subs({symbol: _tidy(value.subs(s.ghost, 0)) for symbol, value in best.items()})
    if constraint_set.ghost:
        steps.append((
            "the minimizer; with the ghost value γ = √(N ε) the ε of the normalization layer appears "
            "(γ = 0 gives the projection onto the set itself)",
            sp.latex(sp.Eq(U, formula)) + r"\;\xrightarrow{\gamma=\sqrt{N\varepsilon}}\; "
            + sp.latex(epsilon_form) + r",\qquad \gamma = 0:\; " + sp.latex(theorem),
        ))
    else:
        steps.append(("the minimizer", sp.latex(sp.Eq(U, formula))))
    no_ghost = {symbol: _tidy(value.subs(s.ghost, 0)) for symbol, value in best.items()}
    try:
        nearest = sp.factor(sp.simplify(distance(no_ghost).subs(s.ghost, 0)))
    except SplitformerError:  # the set's statistics need not express ‖u − v‖² when there is one root
        nearest = None
    return Projection(
        formula=epsilon_form,
        steps=tuple(steps),
        distance=nearest,
        theorem=theorem,
        gap=gap,
    )


def _closed_form(values: list[sp.Expr]) -> list[sp.Expr]:
    """Candidates for a continuous piecewise map: max/min of its branch values."""
    candidates = [sp.Max(*values), sp.Min(*values)]
    if len(values) == 3:
        for a, b, c in itertools.permutations(values):
            candidates += [sp.Min(sp.Max(a, b), c), sp.Max(sp.Min(a, b), c)]
    return candidates


def _witnesses(region: sp.Set) -> list[sp.Expr]:
    """Points of ``region`` (an interval): a symbolic one next to each infinite end, the midpoint otherwise."""
    offset = sp.Symbol("p", nonnegative=True)
    if region.inf.is_finite and region.sup.is_finite:
        return [region.inf, (region.inf + region.sup) / 2, region.sup]
    return [region.inf + offset] if region.inf.is_finite else [region.sup - offset] if region.sup.is_finite else [offset, -offset]


def _kkt(constraint_set: ConstraintSet) -> Projection:
    s = SYMBOLS
    bounds = [bound.expr for bound in constraint_set.bounds]
    if any(sp.diff(bound, U, 2) != 0 for bound in bounds):
        raise _fail(constraint_set, "a bound must be affine in u")
    multipliers = [sp.Symbol(r"\lambda" if len(bounds) == 1 else rf"\lambda_{{{n + 1}}}", real=True)
                   for n in range(len(bounds))]
    lagrangian = (U - s.v) ** 2 / 2 - sum(lam * bound for lam, bound in zip(multipliers, bounds))
    stationary = sp.solve(sp.diff(lagrangian, U), U)[0]
    steps = [(
        "Lagrangian and stationarity",
        sp.latex(sp.Eq(sp.Symbol(r"\mathcal{L}"), lagrangian)) + r",\quad " + sp.latex(sp.Eq(U, stationary)),
    )]
    branches = []
    for active in itertools.product((False, True), repeat=len(bounds)):
        equations = [sp.Eq(U, stationary)] + [
            sp.Eq(bound, 0) if on else sp.Eq(lam, 0) for bound, lam, on in zip(bounds, multipliers, active)]
        for solution in sp.solve(equations, [U, *multipliers], dict=True):
            feasible = sp.And(*(bound.subs(solution) >= 0 for bound in bounds),
                              *(solution[lam] >= 0 for lam, on in zip(multipliers, active) if on))
            if feasible is not sp.false:
                branches.append((solution[U], sp.simplify(feasible)))
    steps.append((
        "complementary slackness λ h(u) = 0: each multiplier or its constraint is inactive",
        r",\quad ".join(rf"u = {sp.latex(value)} \text{{ if }} {sp.latex(condition)}" for value, condition in branches),
    ))
    regions = [condition.as_set() for _, condition in branches]
    if sp.Union(*regions) != sp.S.Reals:
        raise _fail(constraint_set, "the KKT cases do not cover the real line")
    values = [value for value, _ in branches]
    for candidate in _closed_form(values):
        if all(sp.simplify(candidate.subs(s.v, point) - value.subs(s.v, point)) == 0
               for (value, _), region in zip(branches, regions) for point in _witnesses(region)):
            formula = candidate
            break
    else:
        formula = sp.Piecewise(*branches)
    steps.append((
        "the cases cover the line and agree where they meet",
        sp.latex(sp.Eq(U, sp.Piecewise(*branches))) + " = " + sp.latex(formula),
    ))
    return Projection(formula=formula, steps=tuple(steps))


@cache
def derive_projection(constraint_set: ConstraintSet) -> Projection:
    """The closed-form projection onto ``constraint_set``, derived from its optimality conditions."""
    if constraint_set.moments and constraint_set.bounds:
        raise _fail(constraint_set, "sets with both moment constraints and pointwise bounds have no closed form here")
    if not constraint_set.moments and not constraint_set.bounds:
        raise _fail(constraint_set, "no constraints")
    return _lagrange(constraint_set) if constraint_set.moments else _kkt(constraint_set)


@disk_cached
def derive_layer_norm_projection() -> Projection:
    """Projection onto ``S_1(σ_1, σ_2)`` with a ghost coordinate (Theorem 3.1, LayerNorm's ε)."""
    return derive_projection(S_1)


@disk_cached
def derive_relu_projection() -> Projection:
    """Projection onto ``S_2 = {u ≥ 0}`` from the KKT conditions (it separates pointwise)."""
    return derive_projection(S_2)
