"""How a scheme composes its substeps: sequences, parallel branches and Runge–Kutta steps.

A ``Scheme`` (``scheme.py``) holds one such tree as its ``body``; the equation it discretizes
(``equation.py``) and the checks of its fields (``scheme_fields.py``) walk the same tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import sympy as sp

from .errors import SplitformerError
from .exact_numbers import exact_number
from .tableaux import HEUN, Tableau

__all__ = ["Substep", "Parallel", "RungeKutta", "Heun", "Sequence", "STEP_CONTROLS"]

#: How a substep's time step is set: ``fixed`` (its ``fraction`` of Δt), ``per-channel``: a
#: learned control ``λ(y)`` of the operator's field (``<operator>.step``), a diagonal time step
#: (LayerScale), or ``scalar``: one learned number ``λ`` scaling the field (ReZero).
STEP_CONTROLS = ("fixed", "per-channel", "scalar")


def _exact(value: object, where: str) -> sp.Rational:
    """A fraction or weight as an exact rational (a decimal or ``p/q``, either sign, bounded)."""
    try:
        return exact_number(value)
    except ValueError as error:
        raise SplitformerError(f"{where}: {error}") from None


@dataclass(frozen=True)
class Substep:
    """Solve ``u_t = fraction · A(u)`` (or ``A(Proj(u))`` with ``on``) over one step.

    ``then`` names a projection applied to the field's output before it is added (a branch map:
    ``u_t = P(A(u))``, the sandwich norm); ``step`` other than ``fixed`` multiplies the field by a
    learned control ``λ`` (``STEP_CONTROLS``): ``u_t = fraction · λ ⊙ A(u)``; ``combine`` names a
    residual combiner ``c`` (a field of the state and the branch output, ``Operator.is_combiner``):
    ``u_t = fraction · c(u, A(u))`` (the GRU gate); ``shift`` names a token map ``S``
    (``Operator.is_token_map``) applied to the branch input after ``on``: ``u_t = A(S(Proj(u)))`` (token shift).
    ``stream``: the substep also adds its increment ``fraction·Δt·A(u)`` to a second state ``d`` that no
    projection acts on, ``d_t = fraction · A(u)`` (the accumulating stream of ResiDual; ``Scheme.streams``).
    """

    operator: str
    solver: str
    fraction: sp.Rational = sp.Integer(1)
    on: str | None = None
    then: str | None = None
    step: str = "fixed"
    combine: str | None = None
    shift: str | None = None
    #: Not in the repr: schemes without a stream keep their fingerprints (``Scheme.fingerprint`` adds it).
    stream: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:  # "-1/2", -0.5 and Rational(-1, 2) are one exact number
        object.__setattr__(self, "fraction", _exact(self.fraction, f"substep {self.operator!r}: fraction"))

    @property
    def field(self) -> tuple[str, str | None, str | None, str, str | None, str | None]:
        """What the substep evaluates, whatever its share of the step: ``(operator, on, then, step, combine, shift)``."""
        return self.operator, self.on, self.then, self.step, self.combine, self.shift


@dataclass(frozen=True)
class Parallel:
    """Branches that start from the same state; the result is their weighted sum."""

    branches: tuple["Sequence", ...]
    weights: tuple[sp.Rational, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", tuple(_exact(weight, "parallel step: weight") for weight in self.weights))


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
