"""A linear map with a step of the query written inside its integral: ``u ↦ ∫ H(p(x) − 3, 1) W(ξ, y) u(x, ξ) dξ`` (a
reviewer's kind). The step stays inside the sum the quadrature writes (as in a normalizer, where taken out it would
cancel against the numerator's); the lowering takes it out again where what remains is a contraction (a GEMM)."""

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import FEATURES, X, XI, Y
from splitformer.symbolic.inputs import POSITIONS
from splitformer.symbolic.operators import STATE, Definition, Operator, apply, integral, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class GatedMap(Operator):
    kind: ClassVar[str] = "gated-map"
    symbol: ClassVar[str] = r"\mathcal{G}"
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def parameters(self):
        return (kernel("W", "W", (XI, Y), (FEATURES, FEATURES), (XI,)),)

    def definitions(self):
        gate = sp.Heaviside(apply(POSITIONS.name, X) - 3, 1)
        return (Definition("out", self.symbol, (X, Y), integral(gate * apply("W", XI, Y) * apply(STATE, X, XI), XI),
                           "the map from the fourth token on"),)
