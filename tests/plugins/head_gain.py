"""(Review s33, F2.) An attention plug-in with a per-head-feature gain g(h, e) stored on (d,): with the option d_head, n_heads·d_head ≠ d
and that axis no longer holds (h, e); the control stores it on heads_domain(d_head)."""
from dataclasses import dataclass, replace
from typing import ClassVar

from splitformer.symbolic.domains import FEATURES, E, H
from splitformer.symbolic.operators import Attention, apply, heads_domain, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class GainAttention(Attention):
    kind: ClassVar[str] = "gain-attention"
    symbol: ClassVar[str] = r"\mathcal{A}^{g}"
    on_features: ClassVar[bool] = True

    def parameters(self):
        axis = FEATURES if self.on_features else heads_domain(self.d_head)
        return (*super().parameters(), kernel("v_gain", "g", (H, E), (axis,)))

    def definitions(self):
        definitions = list(super().definitions())
        position = [definition.function for definition in definitions].index("v")
        v = definitions[position]
        definitions[position] = replace(v, rhs=v.rhs * apply("v_gain", H, E))
        return tuple(definitions)


@register_operator
@dataclass(frozen=True)
class GainAttentionControl(GainAttention):
    kind: ClassVar[str] = "gain-attention-control"
    on_features: ClassVar[bool] = False
