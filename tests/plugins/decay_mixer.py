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

    def definitions(self):
        rate, offset = apply("lam", Y), apply("b", Y)

        def weight(key):
            distance = apply(POSITIONS.name, X) - apply(POSITIONS.name, key)
            return apply(SUPPORT, X, key) * sp.Heaviside(distance, 1) * sp.exp(-rate ** 2 * distance)

        mixed = integral(apply("w", X, X_KEY, Y) * apply(STATE, X_KEY, Y), X_KEY)
        return (Definition("w", "w", (X, X_KEY, Y), weight(X_KEY) / integral(weight(ETA), ETA), "the decay weights",
                           absorbs=(X_KEY,)),
                Definition("m", "m", (X, Y), mixed, "the mix"),
                Definition("out", self.symbol, (X, Y), integral(apply("W", XI, Y) * apply("m", X, XI), XI) + offset,
                           "the affine map"))

    def uses_support(self):
        return True
