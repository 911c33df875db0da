"""The operator kinds of the paper's own Lie scheme (docs/model.md §3): its feed-forward layers.

The paper writes the feed-forward part as ``J`` linear layers on one feature domain, each an
explicit Euler step of an affine integral operator, with the projection onto
``S₂ = {u ≥ 0}`` as a substep of its own between them:

- ``affine``: ``A(u)(x, y) = ∫ W(ξ, y) u(x, ξ) dξ + b(y)``; one explicit step with ``Δt = 1``
  is ``u (I + W) + b``, the learned matrix is ``W̃ = I + W``;
- ``nonnegative``: ``Proj_{S₂}``, given by its constraint set; the generic deriver yields
  the closed form (ReLU) from the KKT conditions.

Registered the way a user's module would register its own kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .domains import FEATURES, X, XI, Y
from .constraints import S_2, ConstraintSet
from .operators import STATE, Definition, Operator, Parameter, ProjectionOperator, apply, register_operator
from .quadrature import integral

__all__ = ["Affine", "Nonnegative"]


@register_operator
@dataclass(frozen=True)
class Affine(Operator):
    """An affine integral transform of the features, ``Ω_y → Ω_y``."""

    kind: ClassVar[str] = "affine"
    symbol: ClassVar[str] = r"\mathcal{L}"

    def parameters(self) -> tuple[Parameter, ...]:
        return (
            Parameter("W", "W", "W", (XI, Y), (FEATURES, FEATURES), (XI,)),
            Parameter("b", "b", "b", (Y,), (FEATURES,)),
        )

    def definitions(self) -> tuple[Definition, ...]:
        kernel, bias = (parameter.applied() for parameter in self.parameters())
        value = integral(kernel * apply(STATE, X, XI), XI) + bias
        return (Definition("out", r"\mathcal{L}", (X, Y), value, "an affine integral transform over features"),)


@register_operator
@dataclass(frozen=True)
class Nonnegative(ProjectionOperator):
    """The projection onto ``S₂ = {u ≥ 0}``, derived from the constraint set, without gain or bias."""

    kind: ClassVar[str] = "nonnegative"
    symbol: ClassVar[str] = r"\mathrm{Proj}_{S_2}"
    constraint: ClassVar[str] = "S_2"
    constraints: ClassVar[ConstraintSet] = S_2
    affine: ClassVar[tuple[str, ...]] = ()
    output_latex: ClassVar[str] = r"\mathrm{Proj}_{S_2}"
    projection_meaning: ClassVar[str] = r"projection onto $S_2 = \{u \ge 0\}$, derived from KKT"
