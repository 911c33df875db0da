"""A token mixer that reads the support χ as a factor of its formula (attack 24): the mean of the state over the
tokens a query may see, then an affine map over the features. Its code multiplies by χ and divides by ∫ χ, where
the built-in attention reads χ only through its softmax."""

from dataclasses import dataclass
from typing import ClassVar

from splitformer.symbolic.domains import ETA, FEATURES, X_KEY, XI, X, Y
from splitformer.symbolic.operators import STATE, SUPPORT, Definition, Operator, apply, integral, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class SupportMean(Operator):
    """``u ↦ ∫ W(ξ, y) m(x, ξ) dξ + b(y)`` with ``m(x, y) = ∫ χ(x, x̃) u(x̃, y) dx̃ / ∫ χ(x, η) dη``."""

    kind: ClassVar[str] = "support-mean"
    symbol: ClassVar[str] = r"\mathcal{M}"

    def parameters(self):
        return (kernel("W", "W", (XI, Y), (FEATURES, FEATURES), (XI,)), kernel("b", "b", (Y,), (FEATURES,)))

    def definitions(self):
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        mean = integral(apply(SUPPORT, X, X_KEY) * apply(STATE, X_KEY, Y), X_KEY) / integral(apply(SUPPORT, X, ETA), ETA)
        return (Definition("m", "m", (X, Y), mean, "the mean of the state over the support"),
                Definition("out", r"\mathcal{M}", (X, Y), integral(p["W"] * apply("m", X, XI), XI) + p["b"],
                           "an affine map of the mean"))

    def uses_support(self):
        return True
