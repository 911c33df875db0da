"""How a scheme composes its substeps: sequences, parallel branches and Runge–Kutta steps.

A ``Scheme`` (``scheme.py``) holds one such tree as its ``body``; the equation it discretizes
(``equation.py``) and the checks of its fields (``scheme_fields.py``) walk the same tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import sympy as sp

from .tableaux import HEUN, Tableau

__all__ = ["Substep", "Parallel", "RungeKutta", "Heun", "Sequence"]


@dataclass(frozen=True)
class Substep:
    """Solve ``u_t = fraction · A(u)`` (or ``A(Proj(u))`` with ``on``) over one step."""

    operator: str
    solver: str
    fraction: sp.Rational = sp.Integer(1)
    on: str | None = None


@dataclass(frozen=True)
class Parallel:
    """Branches that start from the same state; the result is their weighted sum."""

    branches: tuple["Sequence", ...]
    weights: tuple[sp.Rational, ...]


@dataclass(frozen=True)
class RungeKutta:
    """One explicit Runge–Kutta step (``tableau``) of the summed field ``G = Σ fraction_i A_i(on_i(u))``.

    ``k_i = G(u + Δt Σ_j a_ij k_j)``, ``u⁺ = u + Δt Σ_i b_i k_i``; every stage shares the
    operators' parameters.
    """

    fields: tuple[Substep, ...]
    tableau: Tableau = HEUN


@dataclass(frozen=True)
class Heun(RungeKutta):
    """One Heun (RK2) step: ``k_1 = G(u)``, ``k_2 = G(u + Δt k_1)``, ``u⁺ = u + Δt (k_1 + k_2)/2``."""


@dataclass(frozen=True)
class Sequence:
    """Substeps applied one after the other (Lie splitting); empty means ``v_t = 0``."""

    steps: tuple[Union[Substep, Parallel, RungeKutta], ...] = ()
