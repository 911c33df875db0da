"""The gated feed-forward field ``W_2 (act(W_1 u + b_1) ⊙ (W_3 u + b_3)) + b_2`` (SwiGLU, GeGLU).

A vector field, not a projection: the lifting ``W_1`` goes through the activation (the
scheme's, or the operator's ``activation`` option: ``silu`` gives SwiGLU, ``gelu`` GeGLU),
the second lifting ``W_3`` gates it pointwise on ``Ω_z``, and ``W_2`` restricts back to
``Ω_y``. Canonical parameters: ``<key>.W_1 (d, d_ff)``, ``b_1 (d_ff,)``, ``W_3 (d, d_ff)``,
``b_3 (d_ff,)``, ``W_2 (d_ff, d)``, ``b_2 (d,)``; with ``bias = false`` there are no biases.
Defined through the public operator API only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .activations import Activation
from .domains import FEATURES, HIDDEN, X, XI, Y, ZETA
from .operators import STATE, Definition, Operator, Parameter, apply, integral, kernel, register_operator

__all__ = ["GatedFeedForward"]


@register_operator
@dataclass(frozen=True)
class GatedFeedForward(Operator):
    """``W_2 (act(W_1 u + b_1) ⊙ (W_3 u + b_3)) + b_2``; ``bias=False`` drops the three biases."""

    activation: Activation | None = None
    bias: bool = True
    kind: ClassVar[str] = "gated-feed-forward"
    symbol: ClassVar[str] = r"\mathcal{G}"

    def parameters(self) -> tuple[Parameter, ...]:
        parameters = (
            kernel("W_1", "W_{1}", (XI, ZETA), (FEATURES, HIDDEN), (XI,)),
            kernel("b_1", "b_{1}", (ZETA,), (HIDDEN,)),
            kernel("W_3", "W_{3}", (XI, ZETA), (FEATURES, HIDDEN), (XI,)),
            kernel("b_3", "b_{3}", (ZETA,), (HIDDEN,)),
            kernel("W_2", "W_{2}", (ZETA, Y), (HIDDEN, FEATURES), (ZETA,)),
            kernel("b_2", "b_{2}", (Y,), (FEATURES,)),
        )
        return tuple(p for p in parameters if self.bias or p.kind != "bias")

    def definitions(self) -> tuple[Definition, ...]:
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        u = apply(STATE, X, XI)
        lifted = integral(p["W_1"] * u, XI) + p.get("b_1", 0)
        gate = integral(p["W_3"] * u, XI) + p.get("b_3", 0)
        hidden = self.activation(apply("w", X, ZETA)) * apply("gate", X, ZETA)
        restricted = integral(p["W_2"] * apply("s", X, ZETA), ZETA) + p.get("b_2", 0)
        return (
            Definition("w", "w", (X, ZETA), lifted, r"lifting $\Omega_y \to \Omega_z$, an affine integral transform"),
            Definition("gate", r"\tilde{w}", (X, ZETA), gate, r"the gate: a second lifting $\Omega_y \to \Omega_z$"),
            Definition("s", "s", (X, ZETA), hidden, f"{self.activation.meaning}, gated pointwise"),
            Definition("out", r"\mathcal{G}", (X, Y), restricted, r"restriction $\Omega_z \to \Omega_y$"),
        )
