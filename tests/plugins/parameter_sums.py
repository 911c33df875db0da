"""A kind whose formula holds a sum over parameters alone: ``u ↦ ∫∫ W(ξ, y)² χ(x, x̃) u(x̃, y) dξ dx̃ / ∫ χ(x, η) dη``,
a per-feature scale ``Σ_ξ W(ξ, y)²`` of the mean of the states a query sees (a tester's kind). The scale is computed
from the parameters alone, unbatched like them, and is no parameter itself (emitting it crashed); its layers commute
(a per-feature scale of a mean over the tokens), so reversed they give the same stack."""

from dataclasses import dataclass
from typing import ClassVar

from splitformer.symbolic.domains import ETA, FEATURES, X, X_KEY, XI, Y
from splitformer.symbolic.operators import STATE, SUPPORT, Definition, Operator, apply, integral, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class ScaledSupportMean(Operator):
    kind: ClassVar[str] = "scaled-support-mean"
    symbol: ClassVar[str] = r"\mathcal{E}"

    def parameters(self):
        return (kernel("W", "W", (XI, Y), (FEATURES, FEATURES), (XI,)),)

    def definitions(self):
        body = apply("W", XI, Y) ** 2 * apply(SUPPORT, X, X_KEY) * apply(STATE, X_KEY, Y)
        return (Definition("out", self.symbol, (X, Y), integral(integral(body, XI), X_KEY)
                           / integral(apply(SUPPORT, X, ETA), ETA), "the scaled mean"),)

    def uses_support(self):
        return True
