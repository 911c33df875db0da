"""The operator kinds of the paper's own Lie scheme (MODEL.md §3): its feed-forward layers.

The paper writes the feed-forward part as ``J`` linear layers on one feature domain, each an
explicit Euler step of an affine integral operator, with the projection onto
``S₂ = {u ≥ 0}`` as a substep of its own between them:

- ``affine``: ``A(u)(x, y) = ∫ W(ξ, y) u(x, ξ) dξ + b(y)``; one explicit step with ``Δt = 1``
  is ``u (I + W) + b``, the learned matrix is ``W̃ = I + W``;
- ``nonnegative``: ``Proj_{S₂}``, whose closed form (ReLU) comes from its KKT conditions.

Registered the way a user's module would register its own kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .domains import FEATURES, X, XI, Y
from .operators import STATE, Definition, Operator, Parameter, apply, register_operator
from .projections import SYMBOLS, derive_relu_projection
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
class Nonnegative(Operator):
    """The projection onto ``S₂ = {u ≥ 0}``, pointwise."""

    kind: ClassVar[str] = "nonnegative"
    symbol: ClassVar[str] = r"\mathrm{Proj}_{S_2}"
    is_projection: ClassVar[bool] = True
    constraint: ClassVar[str] = "S_2"

    def parameters(self) -> tuple[Parameter, ...]:
        return ()

    def definitions(self) -> tuple[Definition, ...]:
        value = derive_relu_projection().formula.subs(SYMBOLS.v, apply(STATE, X, Y))
        return (Definition("out", r"\mathrm{Proj}_{S_2}", (X, Y), value,
                           r"projection onto $S_2 = \{u \ge 0\}$, derived from KKT"),)
