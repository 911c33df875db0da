"""The master equation a scheme discretizes, and its printing.

Every explicit substep contributes its vector field with coefficient ``fraction ×``
(the weights of the parallel steps around it); over one step these must add up to the
field's coefficient in the equation. Projection substeps contribute ``−∂I_S``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import sympy as sp

from .composition import Parallel, RungeKutta, Sequence, Substep
from .latex import unicode_text

if TYPE_CHECKING:
    from .scheme import Scheme

__all__ = ["Term", "Equation", "equation_terms", "equation_latex", "equation_text", "scheme_equation", "MASTER_EQUATION"]

#: The paper's master equation (docs/model.md §2), with the subdifferential sign corrected.
MASTER_EQUATION = (
    r"u_t = \left\langle \gamma(x,\cdot,t;u),\, V(\cdot,y,t;u) \right\rangle_{\Omega_x}"
    r" - \partial I_{S_1(\sigma_1(t),\sigma_2(t))}(u)"
    r" + \sum_j \left( \left\langle W_j(\cdot,y,t),\, u(x,\cdot,t) \right\rangle_{\Omega_y} + b_j(y,t) \right)"
    r" - \partial I_{S_2}(u)"
)


@dataclass(frozen=True)
class Equation:
    """The equation a scheme discretizes: LaTeX for notebooks, plain text for terminals."""

    latex: str
    text: str

    def __str__(self) -> str:
        return self.text

    def _repr_latex_(self) -> str:
        return f"$$ {self.latex} $$"


@dataclass(frozen=True)
class Term:
    operator: str
    on: str | None
    coefficient: sp.Rational
    projection: bool
    then: str | None = None
    step: str = "fixed"
    combine: str | None = None
    shift: str | None = None

    @property
    def substep(self) -> Substep:
        """The term's field as an explicit substep of the whole step (``fraction`` 1)."""
        return Substep(self.operator, "explicit", on=self.on, then=self.then, step=self.step, combine=self.combine,
                       shift=self.shift)


def equation_terms(scheme: "Scheme") -> list[Term]:
    """The terms of the equation, with the total coefficient each substep gives them."""
    totals: dict[tuple, sp.Rational] = {}

    def visit(sequence: Sequence, weight: sp.Rational) -> None:
        for step in sequence.steps:
            if isinstance(step, Parallel):
                for branch_weight, branch in zip(step.weights, step.branches):
                    visit(branch, weight * branch_weight)
                continue
            if isinstance(step, RungeKutta):  # consistent: the stage weights sum to 1
                visit(Sequence(step.fields), weight)
                continue
            key = (*step.field, step.solver == "projection")
            totals[key] = totals.get(key, sp.Integer(0)) + weight * step.fraction

    visit(scheme.body, sp.Integer(1))
    return [Term(operator, on, coefficient, projection, then, step, combine, shift)
            for (operator, on, then, step, combine, shift, projection), coefficient in totals.items()]


def _second_state(scheme: "Scheme") -> "Scheme | None":
    """The fields of the second state ``d`` (``Substep.stream``) as a scheme of their own, or ``None``."""
    if not scheme.streams:
        return None
    return replace(scheme, body=Sequence(tuple(replace(step, stream=False) for step in scheme.substeps() if step.stream)))


def equation_latex(scheme: "Scheme") -> str:
    """``u_t = …`` for the scheme's operators, in LaTeX (and ``d_t = …`` for a second state)."""
    second = _second_state(scheme)
    if second is None:
        return _state_latex(scheme)
    return rf"{_state_latex(scheme)},\quad d_t = {_state_latex(second).removeprefix('u_t = ')},\ d(0) = u(0)"


def _state_latex(scheme: "Scheme") -> str:
    operators = scheme.instantiate()
    parts = []
    for term in equation_terms(scheme):
        argument = "u" if term.on is None else rf"{operators[term.on].labelled()}(u)"
        argument = argument if term.shift is None else rf"{operators[term.shift].labelled()}({argument})"
        text = operators[term.operator].term_latex(argument)
        if term.then is not None:  # a branch map: + P(A(…))
            text = rf"+ {operators[term.then].labelled()}({text.removeprefix('+ ')})"
        if term.step != "fixed":  # a learned time step: + λ ⊙ A(…) (diagonal) or + λ A(…) (a number)
            product = r" \odot " if term.step == "per-channel" else r"\,"
            text = text.replace("+ ", rf"+ \lambda_{{{operators[term.operator].key_latex()}}}{product}", 1)
        if term.combine is not None:  # a residual combiner: + C(u, A(…))
            text = rf"+ {operators[term.combine].labelled()}(u, {text.removeprefix('+ ')})"
        if term.coefficient != 1 and not term.projection:
            text = text.replace("+ ", "+ " + sp.latex(term.coefficient) + r"\,", 1)
        parts.append(text)
    text = " ".join(parts)
    return "u_t = " + text.removeprefix("+ ")


def equation_text(scheme: "Scheme") -> str:
    """``u_t = …`` in plain text: ``attn(u) + ffn(Proj[norm2](u)) − ∂I_S₁[norm1](u)`` (and ``d_t = …`` for a
    second state)."""
    second = _second_state(scheme)
    if second is None:
        return _state_text(scheme)
    return f"{_state_text(scheme)}; d_t = {_state_text(second).removeprefix('u_t = ')}, d(0) = u(0)"


def _state_text(scheme: "Scheme") -> str:
    operators = scheme.instantiate()
    parts = []
    for term in equation_terms(scheme):
        argument = "u" if term.on is None else f"Proj[{term.on}](u)"
        argument = argument if term.shift is None else f"{term.shift}({argument})"
        if term.projection:
            constraint = unicode_text(operators[term.operator].constraint).replace("_", "")
            parts.append(f"− ∂I_{constraint}[{term.operator}]({argument})")
        else:
            sign = "−" if term.coefficient < 0 else "+"  # "− 1/2·ffn(u)", not "+ -1/2·ffn(u)"
            magnitude = abs(term.coefficient)
            coefficient = "" if magnitude == 1 else f"{magnitude}·"
            field = f"{term.operator}({argument})"
            field = field if term.then is None else f"Proj[{term.then}]({field})"
            product = " ⊙ " if term.step == "per-channel" else "·"
            field = field if term.step == "fixed" else f"λ[{term.operator}]{product}{field}"
            field = field if term.combine is None else f"{term.combine}(u, {field})"
            parts.append(f"{sign} {coefficient}{field}")
    text = " ".join(parts)
    return "u_t = " + (text.removeprefix("+ ") if text.startswith("+ ") else "−" + text.removeprefix("− "))


def scheme_equation(scheme: "Scheme") -> Equation:
    return Equation(equation_latex(scheme), equation_text(scheme))
