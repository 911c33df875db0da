"""A gate over the heads' features with its affine map written inline: ``G(x, y) = ∫∫ W_o(h, e, y) σ(∫ W_g(ξ, h, e)
u(x, ξ) dξ + b_g(h, e)) de dh`` (a Qwen-style output gate). Its adjoint of ``u`` is a sum over two indices (h, e) of a
body no contraction takes (the sigmoid's derivative of an inner sum): lowered as one reduction per index. The same gate
over (heads, features, hidden) too (``head-hidden-gate``): kernels stored with three axes, an adjoint over three indices."""

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import FEATURES, HIDDEN, E, H, X, XI, Y, ZETA
from splitformer.symbolic.operators import STATE, Definition, Operator, apply, integral, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class HeadGate(Operator):
    """``∫∫ W_o(h, e, y) σ(∫ W_g(ξ, h, e) u(x, ξ) dξ + b_g(h, e)) de dh``."""

    kind: ClassVar[str] = "head-gate"
    symbol: ClassVar[str] = r"\mathcal{G}"

    def parameters(self):
        return (kernel("W_g", "W_g", (XI, H, E), (FEATURES, FEATURES), (XI,)),
                kernel("b_g", "b_g", (H, E), (FEATURES,)),
                kernel("W_o", "W_o", (H, E, Y), (FEATURES, FEATURES), (H, E)))

    def definitions(self):
        z = integral(apply("W_g", XI, H, E) * apply(STATE, X, XI), XI) + apply("b_g", H, E)
        gate = Definition("gate", "g", (X, H, E), 1 / (1 + sp.exp(-z)), "the gate σ(∫ W_g u dξ + b_g)")
        out = integral(integral(apply("W_o", H, E, Y) * apply("gate", X, H, E), E), H)
        return (gate, Definition("out", self.symbol, (X, Y), out, "the heads' gates combined"))


@register_operator
@dataclass(frozen=True)
class HeadHiddenGate(Operator):
    """``∫∫∫ W_o(h, e, ζ, y) σ(∫ W_g(ξ, h, e, ζ) u(x, ξ) dξ + b_g(h, e, ζ)) dζ de dh``: a gate over (heads, features,
    hidden), its kernels stored with three axes (``W_g`` (d, d, d_ff)); the adjoint sums over three indices."""

    kind: ClassVar[str] = "head-hidden-gate"
    symbol: ClassVar[str] = r"\mathcal{T}"

    def parameters(self):
        return (kernel("W_g", "W_g", (XI, H, E, ZETA), (FEATURES, FEATURES, HIDDEN), (XI,)),
                kernel("b_g", "b_g", (H, E, ZETA), (FEATURES, HIDDEN)),
                kernel("W_o", "W_o", (H, E, ZETA, Y), (FEATURES, HIDDEN, FEATURES), (H, E, ZETA)))

    def definitions(self):
        z = integral(apply("W_g", XI, H, E, ZETA) * apply(STATE, X, XI), XI) + apply("b_g", H, E, ZETA)
        gate = Definition("gate", "g", (X, H, E, ZETA), 1 / (1 + sp.exp(-z)), "the gate σ(∫ W_g u dξ + b_g)")
        out = integral(integral(integral(apply("W_o", H, E, ZETA, Y) * apply("gate", X, H, E, ZETA), ZETA), E), H)
        return (gate, Definition("out", self.symbol, (X, Y), out, "the gates combined"))
