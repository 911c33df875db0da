"""Local splitting error by non-commutative series (docs/model.md §9).

Every operator *instance* is its own non-commuting linear generator, named by its key in
the scheme (``ffn_pre`` and ``ffn_post`` of Macaron are two generators, docs/model.md §9); an
operator used twice is one instance (tied parameters: the same key). A field applied to a
projected state (``on``) is the generator of ``u ↦ A(Proj(u))``, projection included.
Projection *substeps* are excluded, for a stated reason (``PROJECTIONS``): they act as the
identity here. One step becomes a polynomial in ``h``; comparing with the exact flow
``e^{h Σ c_k A_k}`` gives the local error ``O(h^{p+1})`` and the order ``p``: ``order``
with the scheme's own substep solvers (explicit Euler, Runge–Kutta tableaux),
``splitting_order`` with exact sub-flows, and ``tied_splitting_order`` with the instances
of one kind merged (what the order would be if they shared their parameters). A
Runge–Kutta step acts on linear fields through its stability polynomial, which sees only
part of the order conditions: its order is capped by the tableau's classical order
(Butcher's conditions on rooted trees, ``tableaux.Tableau.order``). The series are tables of
words (``series.Series``), turned into SymPy expressions only for the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ..latex import plain_text
from ..scheme import Parallel, RungeKutta, Scheme, Sequence, Substep
from .series import Series

__all__ = ["OrderResult", "splitting_order", "generator", "STEP", "PROJECTIONS"]

STEP = sp.Symbol("h", positive=True)
#: Why projection substeps are not in the series, and so which flow the orders refer to.
PROJECTIONS = ("projection substeps are excluded: Proj_S is the implicit step of the normal cone ∂I_S for "
               "every Δt > 0 (the cone absorbs Δt), so it is not O(h)-close to the identity and has no series "
               "in h; the orders are those of the flow of the vector fields (fields on a projected state, "
               "'on', included as their own generators) with the projection substeps replaced by the identity")


def generator(name: str) -> sp.Symbol:
    """The non-commuting generator of the operator instance (or, tied, the kind) ``name``."""
    return sp.Symbol(name.replace("-", "_"), commutative=False)


_DEGREE = 5  # expansions are kept to h^5: enough to tell orders 1 to 4 apart


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
    generators: dict[str, str] | None = None
    tied_splitting_order: int | None = None

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


class _Series:
    """One step of a scheme as a truncated series; ``exact`` swaps Euler for exact sub-flows."""

    def __init__(self, scheme: Scheme, exact: bool, names: dict[str, str]):
        self.names = names
        self.exact = exact
        self.splitting = True
        self.tableau_orders: list[int] = []

    def field(self, step: Substep) -> sp.Symbol:
        return generator(self.names[step.operator])

    def substep(self, step: Substep) -> Series:
        if step.solver == "projection":
            return Series.constant(1, _DEGREE)
        field = Series.field([(step.fraction, self.field(step))], _DEGREE)
        return field.exponential() if self.exact else Series.constant(1, _DEGREE) + field

    def sequence(self, sequence: Sequence) -> Series:
        total = Series.constant(1, _DEGREE)
        for step in sequence.steps:  # later substeps act after earlier ones: multiply on the left
            total = self.step(step) @ total
        return total

    def step(self, step) -> Series:
        if isinstance(step, Parallel):
            total = Series({}, _DEGREE)
            for weight, branch in zip(step.weights, step.branches):
                total = total + self.sequence(branch).scaled(weight)
            return total
        if isinstance(step, RungeKutta):  # on linear fields a tableau acts through its stability polynomial
            self.splitting = False
            self.tableau_orders.append(step.tableau.order())
            field = Series.field([(f.fraction, self.field(f)) for f in step.fields], _DEGREE)
            total = Series.constant(1, _DEGREE)
            for power in range(1, _DEGREE + 1):
                total = total + field.power(power).scaled(step.tableau.stability(power))
            return total
        return self.substep(step)


def _flow(scheme: Scheme, names: dict[str, str]) -> Series:
    from ..equation import equation_terms

    field = Series.field([(term.coefficient, generator(names[term.operator]))
                          for term in equation_terms(scheme) if not term.projection], _DEGREE)
    return field.exponential()


def _order(difference: Series) -> tuple[int | None, Series]:
    """Order and leading part of a local error; ``None`` when the step is exact (no error term)."""
    for power in range(_DEGREE + 1):
        part = difference.part(power)
        if not part.is_zero():
            return power - 1, part
    return None, Series({}, _DEGREE)


def _expression(part: Series) -> sp.Expr:
    """A part of one length ``p`` as SymPy's ``c · h^p`` (``0`` for no part)."""
    if part.is_zero():
        return sp.Integer(0)
    power = len(next(iter(part.terms)))
    return part.expression() * STEP**power


def _as_power(leading: Series, flow: Series) -> sp.Expr:
    """``c (h G)^p`` when the leading term is a power of the summed field ``G`` (Runge–Kutta
    steps of the whole field), else the term with its common factors pulled out."""
    field = flow.part(1)
    if leading.is_zero() or field.is_zero():
        return sp.factor_terms(_expression(leading))
    power = len(next(iter(leading.terms)))
    candidate = field.power(power)
    scale = leading.coefficient_sum() / candidate.coefficient_sum()
    if scale == 0 or not (leading - candidate.scaled(scale)).is_zero():
        return sp.factor_terms(_expression(leading))
    return sp.Mul(scale, sp.Pow(sp.Mul(STEP, field.expression(), evaluate=False), power, evaluate=False),
                  evaluate=False)


def _orders(scheme: Scheme, names: dict[str, str]):
    exact = _flow(scheme, names)
    own = _Series(scheme, False, names)
    order, leading = _order(own.sequence(scheme.body) - exact)
    if own.tableau_orders and order is not None:  # linear fields see only part of the nonlinear order conditions
        order = min([order, *own.tableau_orders])
    split_order, split_leading = _order(_Series(scheme, True, names).sequence(scheme.body) - exact)
    return order, leading, (split_order if own.splitting else None), split_leading, exact


def splitting_order(scheme: Scheme) -> OrderResult:
    """Orders and leading local-error terms of one step of ``scheme``."""
    order, leading, split_order, split_leading, exact = _orders(scheme, {key: key for key in scheme.operators})
    by_kind = dict(scheme.operators)
    tied = _orders(scheme, by_kind)[2] if len(set(by_kind.values())) < len(by_kind) else split_order
    fields = {step.operator: step.on for step in scheme.substeps() if step.solver != "projection"}
    shown = _as_power(leading, exact)
    leading, split_leading = _expression(leading), _expression(split_leading)
    return OrderResult(
        order=order,
        splitting_order=split_order,
        leading_error=sp.latex(shown),
        exact_subflows_error=sp.latex(sp.factor_terms(split_leading)),
        leading_error_text=plain_text(shown),
        leading=leading,
        exact_subflows_leading=split_leading,
        generators={key: f"{scheme.operators[key]} {key}" + (f" on Proj({on})" if on else "")
                    for key, on in fields.items()},
        tied_splitting_order=tied,
    )
