"""A per-head linear map without scores: out = ∫∫ O(h, e, y) ∫ W(ξ, h, e) u(x, ξ) dξ de dh. Its parameters are
viewed per head, (d, n_heads, d_head), and no statement of its derived adjoint names ``d_head`` (tests: the adjoint
binds it for those views all the same)."""
from dataclasses import dataclass
from typing import ClassVar
from splitformer.symbolic.domains import FEATURES, XI, X, Y, H, E
from splitformer.symbolic.operators import STATE, Definition, Operator, apply, integral, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class HeadLinear(Operator):
    kind: ClassVar[str] = "head-linear"
    symbol: ClassVar[str] = r"\mathcal{H}"

    def parameters(self):
        return (kernel("W", "W", (XI, H, E), (FEATURES, FEATURES), (XI,)),
                kernel("O", "O", (H, E, Y), (FEATURES, FEATURES), (H, E)))

    def definitions(self):
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        v = integral(p["W"] * apply(STATE, X, XI), XI)
        return (Definition("v", "v", (X, H, E), v, "per head"),
                Definition("out", r"\mathcal{H}", (X, Y), integral(integral(p["O"] * apply("v", X, H, E), E), H), "combined"))
