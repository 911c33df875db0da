"""Cross-attention: the state attends to a memory held fixed over the step (a decoder's second input).

The memory ``M(x̂, ξ)`` lives on its own token domain ``Ω_m`` (the encoder's output); queries
come from the state, keys and values from the memory:
``a(h, x, x̂) = |Ω_e|^{-1/2} ∫ q(x, h, e) k(x̂, h, e) de``, ``γ = χ_m e^{a} / ∫_{Ω_m} χ_m e^{a}``, and
``∫_{Ω_m} γ(h, x, x̂) v(x̂, h, e) dx̂``. Its support ``χ_m(x, x̂)`` comes from the memory's own
padding mask (``memory_key_padding_mask``). Parameters as ``attention`` (``W_q … b_o``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from .domains import E, ETA_MEMORY, H, HEAD_FEATURES, X, X_MEMORY, XI, Y
from .inputs import MEMORY, MEMORY_SUPPORT as MEMORY_SUPPORT_INPUT
from .operators import STATE, Attention, Definition, apply, register_operator
from .quadrature import integral

__all__ = ["CrossAttention", "MEMORY_FIELD", "MEMORY_SUPPORT"]

#: The memory field ``M(x̂, ξ)``; emitted from the ``memory`` argument.
MEMORY_FIELD = MEMORY.name
#: The support ``χ_m(x, x̂)`` of the integral over memory tokens; from ``memory_key_padding_mask``.
MEMORY_SUPPORT = MEMORY_SUPPORT_INPUT.name


@register_operator
@dataclass(frozen=True)
class CrossAttention(Attention):
    """Multi-head attention of the state (queries) over a fixed memory (keys and values)."""

    kind: ClassVar[str] = "cross-attention"
    symbol: ClassVar[str] = r"\mathcal{C}"
    input_fields: ClassVar[tuple] = (MEMORY, MEMORY_SUPPORT_INPUT)

    def definitions(self) -> tuple[Definition, ...]:
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}

        def projection(name: str, source: sp.Expr, token, meaning: str) -> Definition:
            lower = name.lower()
            return Definition(lower, name, (token, H, E), integral(p[f"W_{lower}"] * source, XI) + p.get(f"b_{lower}", 0),
                              meaning)

        u, m = apply(STATE, X, XI), apply(MEMORY_FIELD, X_MEMORY, XI)
        score = integral(apply("q", X, H, E) * apply("k", X_MEMORY, H, E), E) / sp.sqrt(HEAD_FEATURES.measure)
        weight = apply(MEMORY_SUPPORT, X, X_MEMORY) * sp.exp(apply("a", H, X, X_MEMORY))
        normalizer = integral(apply(MEMORY_SUPPORT, X, ETA_MEMORY) * sp.exp(apply("a", H, X, ETA_MEMORY)), ETA_MEMORY)
        mixed = integral(apply("gamma", H, X, X_MEMORY) * apply("v", X_MEMORY, H, E), X_MEMORY)
        output = integral(integral(p["W_o"] * apply("o", X, H, E), E), H) + p.get("b_o", 0)
        return (
            projection("Q", u, X, "queries of the state"),
            projection("K", m, X_MEMORY, r"keys of the memory $m(\hat{x}, \xi)$, held fixed over the step"),
            projection("V", m, X_MEMORY, "values of the memory"),
            Definition("a", "a", (H, X, X_MEMORY), score, r"scores against the memory tokens, scaled by $|\Omega_e|^{-1/2}$"),
            Definition("gamma", r"\gamma", (H, X, X_MEMORY), weight / normalizer,
                       r"kernel $\mathrm{Softmax}_2$ over the memory tokens, restricted to $\chi_m$",
                       absorbs=(X_MEMORY,)),
            Definition("o", "O", (X, H, E), mixed, r"the non-local integral over the memory domain $\Omega_m$"),
            Definition("out", r"\mathcal{C}", (X, Y),
                       output, "heads combined by the output kernel"),
        )

    def uses_support(self) -> bool:
        return False
