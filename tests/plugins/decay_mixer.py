"""A token mixer whose weights are normalized per feature and decay at a learned rate (a researcher's kind):
``w(x, x̃, y) = χ H(p(x) − p(x̃)) e^{−λ(y)² (p(x) − p(x̃))} / ∫ (the same at η) dη``, ``m = ∫ w u dx̃``, then an affine
map. The adjoint of λ, a parameter inside the normalized weights, is a sum over three token indices
(``Σ_{i,j,n} (p_i − p_n) w_{ijl} w_{inl} w̄_{ijl}``); nested (``codegen.nested_sums``) it is two quadratic sums."""

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import ETA, FEATURES, X, X_KEY, XI, Y
from splitformer.symbolic.inputs import POSITIONS
from splitformer.symbolic.operators import STATE, SUPPORT, Definition, Operator, apply, integral, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class DecayMixer(Operator):
    kind: ClassVar[str] = "decay-mixer"
    symbol: ClassVar[str] = r"\mathcal{D}"
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def parameters(self):
        return (kernel("lam", r"\lambda", (Y,), (FEATURES,)),
                kernel("W", "W", (XI, Y), (FEATURES, FEATURES), (XI,)), kernel("b", "b", (Y,), (FEATURES,)))

    def weight(self, key) -> sp.Expr:
        """The weight of the key ``key`` before the normalization."""
        distance = apply(POSITIONS.name, X) - apply(POSITIONS.name, key)
        return apply(SUPPORT, X, key) * sp.Heaviside(distance, 1) * sp.exp(-apply("lam", Y) ** 2 * distance)

    def definitions(self):
        mixed = integral(apply("w", X, X_KEY, Y) * apply(STATE, X_KEY, Y), X_KEY)
        weights = self.weight(X_KEY) / integral(self.weight(ETA), ETA)
        return (Definition("w", "w", (X, X_KEY, Y), weights, "the decay weights", absorbs=(X_KEY,)),
                Definition("m", "m", (X, Y), mixed, "the mix"),
                Definition("out", self.symbol, (X, Y), integral(apply("W", XI, Y) * apply("m", X, XI), XI) + apply("b", Y),
                           "the affine map"))

    def uses_support(self):
        return True


@register_operator
@dataclass(frozen=True)
class UniformPlusDecayMixer(DecayMixer):
    """``w ∝ χ (1 + H(p(x) − p(x̃), 1) e^{−λ(y)² (p(x) − p(x̃))})``: a uniform mean plus a causal decay (a tester's
    kind). The rate's adjoint sums the step over the keys and divides by the normalizer; nested apart, a query that sees
    no key divided the empty sum 0 by its normalizer 0. The step and the normalizer stay in one product."""

    kind: ClassVar[str] = "uniform-plus-decay-mixer"

    def weight(self, key) -> sp.Expr:
        distance = apply(POSITIONS.name, X) - apply(POSITIONS.name, key)
        return apply(SUPPORT, X, key) * (1 + sp.Heaviside(distance, 1) * sp.exp(-apply("lam", Y) ** 2 * distance))


@register_operator
@dataclass(frozen=True)
class CountedDecayMixer(DecayMixer):
    """``w ∝ c (1 + c₂ e^{−λ(y)² (p(x) − p(x̃))})`` with the steps definitions, ``c(x, x̃) = H(p(x) − p(x̃), 0)``,
    ``c₂(x, x̃) = H(p(x) − p(x̃) − 1, 1)``, and no support (a reviewer's kind): the first token sees no key. An array
    computed from bools alone is a mask as a step is, glued to the normalizer it guards (apart: 0/0 in the rate's
    gradient)."""

    kind: ClassVar[str] = "counted-decay-mixer"

    def weight(self, key) -> sp.Expr:
        distance = apply(POSITIONS.name, X) - apply(POSITIONS.name, key)
        return apply("c", X, key) * (1 + apply("c2", X, key) * sp.exp(-apply("lam", Y) ** 2 * distance))

    def definitions(self):
        distance = apply(POSITIONS.name, X) - apply(POSITIONS.name, X_KEY)
        return (Definition("c", "c", (X, X_KEY), sp.Heaviside(distance, 0), "the step"),
                Definition("c2", "c_2", (X, X_KEY), sp.Heaviside(distance - 1, 1), "the step past the previous key"),
                *super().definitions())

    def uses_support(self):
        return False
