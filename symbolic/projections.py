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
from .markdown import inert
from .projection_verifiers import verify_layer_norm_projection, verify_relu_projection

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
        return inert("\n\n".join(f"{title}: $${latex}$$" for title, latex in self.steps), "the projection's view")


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


class _Lagrange:
    """Moment constraints by Lagrange multipliers, one stage per method; ``steps`` records them."""

    def __init__(self, constraint_set: ConstraintSet):
        self.set = constraint_set
        self.means = _Means(constraint_set)
        self.multipliers = [sp.Symbol(rf"\lambda_{{{n + 1}}}", real=True) for n in range(len(constraint_set.moments))]
        self.scale, self.shift = sp.Symbol("c", real=True), sp.Symbol("d", real=True)
        self.steps: list[tuple[str, str]] = []

    def fail(self, message: str) -> SplitformerError:
        return _fail(self.set, message)

    def lagrangians(self) -> tuple[sp.Expr, sp.Expr]:
        """One feature component's Lagrangian and the ghost coordinate's."""
        s, moments = SYMBOLS, self.set.moments
        component = (U - s.v) ** 2 / 2 + sum(lam * m.component for lam, m in zip(self.multipliers, moments)) / s.size
        ghost = (G - s.ghost) ** 2 / 2 + sum(lam * m.ghost for lam, m in zip(self.multipliers, moments)) / s.size
        shown = sp.latex(sp.Eq(sp.Symbol(r"\mathcal{L}_k"), component))
        if self.set.ghost:
            shown += r",\quad " + sp.latex(sp.Eq(sp.Symbol(r"\mathcal{L}_g"), ghost))
        self.steps.append(("Lagrangian, one feature component" + (" and the ghost coordinate" if self.set.ghost else ""),
                           shown))
        return component, ghost

    def stationary_map(self, component: sp.Expr, ghost: sp.Expr) -> tuple[sp.Expr, sp.Expr, list[sp.Symbol]]:
        """``u = c v + d`` (``c``, ``d`` standing for the multipliers), the ghost's value, the free coefficients."""
        s = SYMBOLS
        stationary = sp.solve(sp.diff(component, U), U)
        if len(stationary) != 1 or sp.diff(stationary[0], s.v, 2) != 0:
            raise self.fail("stationarity does not make u one affine map of v (constraints must be at most "
                            "quadratic in u)")
        stationary = sp.simplify(stationary[0])
        slope, offset = sp.simplify(sp.diff(stationary, s.v)), sp.simplify(stationary.subs(s.v, 0))
        free = {symbol: value for symbol, value in ((self.scale, slope), (self.shift, offset))
                if value.has(*self.multipliers)}
        inverse = sp.solve([sp.Eq(symbol, value) for symbol, value in free.items()], self.multipliers, dict=True)
        if len(inverse) != 1 or len(free) != len(self.multipliers):
            raise self.fail("the multipliers are not determined by the affine map they produce")
        general = (self.scale if self.scale in free else slope) * s.v + (self.shift if self.shift in free else offset)
        ghost_value = sp.Integer(0)
        shown = sp.latex(sp.Eq(U, stationary))
        if self.set.ghost:
            solved = sp.solve(sp.diff(ghost, G), G)
            if len(solved) != 1:
                raise self.fail("the ghost coordinate has no unique stationary point")
            ghost_value = sp.simplify(solved[0].subs(inverse[0]))
            shown += r",\quad " + sp.latex(sp.Eq(G, ghost_value))
        self.steps.append(("stationarity: every component is the same affine map of v", shown))
        return general, ghost_value, list(free)

    def constraints(self, general: sp.Expr, ghost_value: sp.Expr) -> list[sp.Eq]:
        """Each moment constraint at the affine map, averaged over the features."""
        return [sp.Eq(self.means(m.component.subs(U, general)) + m.ghost.subs(G, ghost_value) / SYMBOLS.size, m.value)
                for m in self.set.moments]

    def eliminate_offset(self, general: sp.Expr, equations: list, unknowns: list) -> tuple[sp.Expr, list]:
        """Solve the first constraint that fixes the offset ``d`` uniquely; the map is centred."""
        if self.shift not in unknowns:
            return general, equations
        for equation in equations:
            solved = sp.solve(equation, self.shift)
            if len(solved) == 1 and not solved[0].has(*self.multipliers):
                general = sp.collect(sp.expand(general.subs(self.shift, solved[0])), self.scale)
                self.steps.append(("the constraint linear in the offset fixes it and centres the map",
                                   sp.latex(sp.Eq(self.shift, solved[0])) + r",\quad " + sp.latex(sp.Eq(U, general))))
                unknowns.remove(self.shift)
                return general, [sp.simplify(e.subs(self.shift, solved[0])) for e in equations if e is not equation]
        return general, equations

    def roots(self, equations: list, unknowns: list) -> list[dict]:
        equations = [e for e in equations if e is not sp.true]
        roots = sp.solve(equations, unknowns, dict=True) if unknowns else [{}]
        roots = sorted(({symbol: _tidy(value) for symbol, value in root.items()} for root in roots),
                       key=lambda root: sp.default_sort_key(tuple(root.values())))
        if not roots:
            raise self.fail("the constraints have no stationary point")
        self.steps.append((
            "the remaining constraints" + (" (ghost included)" if self.set.ghost else "") + " leave "
            + ("one root" if len(roots) == 1 else f"{len(roots)} roots"),
            r",\quad ".join(sp.latex(e) for e in equations) + r"\;\Rightarrow\; "
            + r",\; ".join(r"\left(" + ", ".join(sp.latex(sp.Eq(k, v)) for k, v in root.items()) + r"\right)"
                           for root in roots),
        ))
        return roots

    def distance(self, general: sp.Expr, ghost_value: sp.Expr, root: dict) -> sp.Expr:
        """``‖u − v‖²`` over the features and the ghost coordinate, in the set's statistics."""
        s = SYMBOLS
        return s.size * self.means((general.subs(root) - s.v) ** 2) + (ghost_value.subs(root) - s.ghost) ** 2

    def select(self, general: sp.Expr, ghost_value: sp.Expr, roots: list[dict]) -> tuple[dict, sp.Expr | None]:
        """The root every other one is farther from ``v`` than, by a margin the assumptions decide."""
        if len(roots) == 1:
            return roots[0], None
        distances = [self.distance(general, ghost_value, root) for root in roots]
        for candidate, own in zip(roots, distances):
            gaps = [sp.factor(sp.expand(other - own)) for other in distances if other is not own]
            if all(gap.is_positive for gap in gaps):
                gap = min(gaps, key=sp.count_ops)
                self.steps.append(("compare the roots: every other root is farther, by at least", sp.latex(gap) + r" > 0"))
                return candidate, gap
        raise self.fail("cannot decide which stationary point is nearest: " + "; ".join(sp.sstr(d) for d in distances))

    def derive(self) -> Projection:
        s = SYMBOLS
        general, ghost_value, unknowns = self.stationary_map(*self.lagrangians())
        general, equations = self.eliminate_offset(general, self.constraints(general, ghost_value), unknowns)
        best, gap = self.select(general, ghost_value, self.roots(equations, unknowns))
        formula = general.subs(best)
        epsilon_form = general.subs({k: _tidy(v.subs(s.ghost, sp.sqrt(s.size * s.epsilon))) for k, v in best.items()})
        no_ghost = {symbol: _tidy(value.subs(s.ghost, 0)) for symbol, value in best.items()}
        theorem = general.subs(no_ghost)
        if self.set.ghost:
            self.steps.append((
                "the minimizer; with the ghost value γ = √(N ε) the ε of the normalization layer appears "
                "(γ = 0 gives the projection onto the set itself)",
                sp.latex(sp.Eq(U, formula)) + r"\;\xrightarrow{\gamma=\sqrt{N\varepsilon}}\; "
                + sp.latex(epsilon_form) + r",\qquad \gamma = 0:\; " + sp.latex(theorem),
            ))
        else:
            self.steps.append(("the minimizer", sp.latex(sp.Eq(U, formula))))
        try:
            nearest = sp.factor(sp.simplify(self.distance(general, ghost_value, no_ghost).subs(s.ghost, 0)))
        except SplitformerError:  # the set's statistics need not express ‖u − v‖² when there is one root
            nearest = None
        return Projection(formula=epsilon_form, steps=tuple(self.steps), distance=nearest, theorem=theorem, gap=gap)


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
    for kind, constraints in (("moment", constraint_set.moments), ("bound", constraint_set.bounds)):
        for position, constraint in enumerate(constraints):
            if constraint in constraints[:position]:
                raise _fail(constraint_set, f"{kind} {position + 1} repeats {kind} {constraints.index(constraint) + 1} "
                                            "(a repeated constraint has no multiplier of its own); remove it")
    try:
        return _Lagrange(constraint_set).derive() if constraint_set.moments else _kkt(constraint_set)
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, AttributeError) as error:
        # a user's set that SymPy cannot carry through: one line, not SymPy's traceback
        raise _fail(constraint_set, f"the derivation failed ({type(error).__name__}: {str(error)[:80]}); "
                                    "the constraints may be dependent or not of the supported forms") from None


@disk_cached(Projection, verify=verify_layer_norm_projection)
def derive_layer_norm_projection() -> Projection:
    """Projection onto ``S_1(σ_1, σ_2)`` with a ghost coordinate (Theorem 3.1, LayerNorm's ε)."""
    return derive_projection(S_1)


@disk_cached(Projection, verify=verify_relu_projection)
def derive_relu_projection() -> Projection:
    """Projection onto ``S_2 = {u ≥ 0}`` from the KKT conditions (it separates pointwise)."""
    return derive_projection(S_2)
