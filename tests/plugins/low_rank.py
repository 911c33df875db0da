"""A low-rank linear map ``L(x, y) = ∫∫ A(ξ, ζ) B(ζ, y) u(x, ξ) dξ dζ`` (a kernel factored through a hidden width):
its formula is a sum over ξ of the state times a sum over ζ, lowered as one contraction of the three factors."""

from dataclasses import dataclass
from typing import ClassVar

from splitformer.symbolic.domains import FEATURES, HIDDEN, X, XI, Y, ZETA
from splitformer.symbolic.operators import STATE, Definition, Operator, apply, integral, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class LowRankMap(Operator):
    """``∫∫ A(ξ, ζ) B(ζ, y) u(x, ξ) dξ dζ``."""

    kind: ClassVar[str] = "low-rank-map"
    symbol: ClassVar[str] = r"\mathcal{L}"

    def parameters(self):
        return (kernel("A", "A", (XI, ZETA), (FEATURES, HIDDEN), (XI,)),
                kernel("B", "B", (ZETA, Y), (HIDDEN, FEATURES), (ZETA,)))

    def definitions(self):
        out = integral(integral(apply("A", XI, ZETA) * apply("B", ZETA, Y) * apply(STATE, X, XI), XI), ZETA)
        return (Definition("out", self.symbol, (X, Y), out, "the low-rank map"),)
