"""Local splitting error by non-commutative series (docs/model.md §9).

The vector fields are replaced by linear generators — every attention operator by ``A``,
every feed-forward operator by ``B`` (Macaron's two feed-forward operators are one field
split in halves) — and one step of the scheme becomes a polynomial in the step ``h`` with
non-commuting coefficients. Projection substeps (and the projections inside ``on``) are
held out: they act as the identity here. Comparing with the exact flow ``e^{h(A+B)}``
gives the local error ``O(h^{p+1})`` and so the order ``p``: ``order`` with the scheme's
own substep solvers (explicit Euler, Runge–Kutta tableaux), ``splitting_order`` with exact
sub-flows. A Runge–Kutta step acts on linear fields through its stability polynomial, which
sees only part of the order conditions: its order is capped by the tableau's classical
order (Butcher's conditions on rooted trees, ``tableaux.Tableau.order``).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ..latex import plain_text
from ..scheme import Parallel, RungeKutta, Scheme, Sequence, Substep

__all__ = ["OrderResult", "splitting_order", "generator", "GENERATORS", "STEP"]

STEP = sp.Symbol("h", positive=True)
#: Non-commuting generators of the attention and feed-forward fields (gated or not); any other
#: vector-field kind is a generator of its own, named after the kind.
GENERATORS = {"attention": sp.Symbol("A", commutative=False), "feed-forward": sp.Symbol("B", commutative=False),
              "gated-feed-forward": sp.Symbol("B", commutative=False)}
_DEGREE = 5  # expansions are kept to h^5: enough to tell orders 1 to 4 apart


def generator(kind: str) -> sp.Expr:
    """The linear generator standing for the vector fields of ``kind`` (0 for a projection)."""
    from ..operators import OPERATOR_KINDS

    if kind in GENERATORS:
        return GENERATORS[kind]
    if kind in OPERATOR_KINDS and OPERATOR_KINDS[kind].is_projection:
        return sp.Integer(0)
    return sp.Symbol(kind.replace("-", "_").upper(), commutative=False)


@dataclass(frozen=True)
class OrderResult:
    """``order``/``splitting_order`` are ``None`` for an exact step; ``splitting_order`` also
    when the step is not a splitting (a Runge–Kutta stage couples the fields)."""

    order: int | None
    splitting_order: int | None
    leading_error: str
    exact_subflows_error: str
    leading_error_text: str
    leading: sp.Expr
    exact_subflows_leading: sp.Expr

    def __str__(self) -> str:
        if self.order is None:
            return "exact step: no local error term"
        splitting = "—" if self.splitting_order is None else self.splitting_order
        return f"order {self.order}, splitting order {splitting}; leading local error {self.leading_error_text}"

    def _repr_markdown_(self) -> str:
        if self.order is None:
            return "exact step: no local error term up to $h^4$"
        text = f"**order {self.order}** (own substep solvers), leading local error $${self.leading_error}$$"
        if self.splitting_order is not None:
            text += f"\n\n**splitting order {self.splitting_order}** (exact sub-flows), leading term $${self.exact_subflows_error}$$"
        return text


def _truncate(expr: sp.Expr) -> sp.Expr:
    expr = sp.expand(expr)
    return sum((expr.coeff(STEP, power) * STEP**power for power in range(_DEGREE + 1)), sp.Integer(0))


def _exponential(generator: sp.Expr) -> sp.Expr:
    term, total = sp.Integer(1), sp.Integer(1)
    for power in range(1, _DEGREE + 1):
        term = _truncate(term * generator / power)
        total += term
    return total


class _Series:
    """One step of a scheme as a truncated series; ``exact`` swaps Euler for exact sub-flows."""

    def __init__(self, scheme: Scheme, exact: bool):
        self.kinds = dict(scheme.operators)
        self.exact = exact
        self.splitting = True
        self.tableau_orders: list[int] = []

    def field(self, step: Substep) -> sp.Expr:
        return generator(self.kinds[step.operator])

    def substep(self, step: Substep) -> sp.Expr:
        if step.solver == "projection":
            return sp.Integer(1)
        generator = step.fraction * STEP * self.field(step)
        return _exponential(generator) if self.exact else 1 + generator

    def sequence(self, sequence: Sequence) -> sp.Expr:
        total = sp.Integer(1)
        for step in sequence.steps:  # later substeps act after earlier ones: multiply on the left
            total = _truncate(self.step(step) * total)
        return total

    def step(self, step) -> sp.Expr:
        if isinstance(step, Parallel):
            return _truncate(sum(weight * self.sequence(branch) for weight, branch in zip(step.weights, step.branches)))
        if isinstance(step, RungeKutta):  # on linear fields a tableau acts through its stability polynomial
            self.splitting = False
            self.tableau_orders.append(step.tableau.order())
            field = sum(f.fraction * self.field(f) for f in step.fields)
            return _truncate(1 + sum(step.tableau.stability(power) * (STEP * field) ** power
                                     for power in range(1, _DEGREE + 1)))
        return self.substep(step)


def _flow(scheme: Scheme) -> sp.Expr:
    from ..equation import equation_terms

    kinds = dict(scheme.operators)
    field = sum((term.coefficient * generator(kinds[term.operator])
                 for term in equation_terms(scheme) if not term.projection), sp.Integer(0))
    return _exponential(STEP * field)


def _order(difference: sp.Expr) -> tuple[int | None, sp.Expr]:
    """Order and leading term of a local error; ``None`` when the step is exact (no error term)."""
    for power in range(_DEGREE + 1):
        coefficient = sp.expand(difference.coeff(STEP, power))
        if coefficient != 0:
            return power - 1, coefficient * STEP**power
    return None, sp.Integer(0)


def _as_power(leading: sp.Expr, flow: sp.Expr) -> sp.Expr:
    """``c (h G)^p`` when the leading term is a power of the summed field ``G`` (Runge–Kutta
    steps of the whole field), else the term with its common factors pulled out."""
    field = sp.expand(flow).coeff(STEP, 1)
    generators = sorted(field.atoms(sp.Symbol) - {STEP}, key=sp.default_sort_key)
    power = next((p for p in range(_DEGREE + 1) if sp.expand(leading).coeff(STEP, p) != 0), None)
    if power is None or not generators or field == 0:
        return sp.factor_terms(leading)
    candidate = sp.expand((STEP * field) ** power)
    ones = {generator: 1 for generator in generators}
    scale = sp.expand(leading).xreplace(ones) / candidate.xreplace(ones)
    if scale == 0 or sp.expand(leading - scale * candidate) != 0:
        return sp.factor_terms(leading)
    return sp.Mul(scale, sp.Pow(sp.Mul(STEP, field, evaluate=False), power, evaluate=False), evaluate=False)


def splitting_order(scheme: Scheme) -> OrderResult:
    """Orders and leading local-error terms of one step of ``scheme``."""
    exact = _flow(scheme)
    own = _Series(scheme, exact=False)
    order, leading = _order(_truncate(own.sequence(scheme.body) - exact))
    if own.tableau_orders and order is not None:  # linear fields see only part of the nonlinear order conditions
        order = min([order, *own.tableau_orders])
    split = _Series(scheme, exact=True)
    split_order, split_leading = _order(_truncate(split.sequence(scheme.body) - exact))
    shown = _as_power(leading, exact)
    return OrderResult(
        order=order,
        splitting_order=split_order if own.splitting else None,
        leading_error=sp.latex(shown),
        exact_subflows_error=sp.latex(sp.factor_terms(split_leading)),
        leading_error_text=plain_text(shown),
        leading=leading,
        exact_subflows_leading=split_leading,
    )
