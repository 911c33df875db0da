"""Kinds that read, at a key's position, what is no key or value of theirs: the positions inside a softmax's normalizer
(``η``), and the state itself at ``x̃``. A cached decoding step must read them of every earlier token, from the cache
(``pos_k``, ``u_k``); before, the normalizer summed the new token's position over every key, and the mean read the
new token's state alone, so cached decoding drifted from the full pass while every check held."""

from dataclasses import dataclass, replace
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import ETA, H, X, X_KEY, Y
from splitformer.symbolic.inputs import POSITIONS
from splitformer.symbolic.operators import STATE, SUPPORT, Attention, Definition, Operator, apply, integral, \
    register_operator


def _inside(query, key, window: int) -> sp.Expr:
    """1 where the two tokens are at most ``window`` apart (a step of their positions, 1 at the edge)."""
    return sp.Heaviside(window - sp.Abs(apply(POSITIONS.name, query) - apply(POSITIONS.name, key)), 1)


@register_operator
@dataclass(frozen=True)
class WindowAttention(Attention):
    """Attention whose softmax sees the keys at most ``window`` positions from the query."""

    kind: ClassVar[str] = "window-attention"
    input_fields: ClassVar[tuple] = (POSITIONS,)
    window: int = 2

    def definitions(self):
        definitions = list(super().definitions())
        weight = apply(SUPPORT, X, X_KEY) * _inside(X, X_KEY, self.window) * sp.exp(apply("a", H, X, X_KEY))
        total = integral(apply(SUPPORT, X, ETA) * _inside(X, ETA, self.window) * sp.exp(apply("a", H, X, ETA)), ETA)
        at = [definition.function for definition in definitions].index("gamma")
        definitions[at] = replace(definitions[at], rhs=weight / total, meaning="the softmax over the window")
        return tuple(definitions)


@register_operator
@dataclass(frozen=True)
class SupportMeanOfStates(Operator):
    """``u ↦ ∫ χ(x, x̃) u(x̃, y) dx̃ / ∫ χ(x, η) dη``: the mean of the states a query sees (the state read at ``x̃``)."""

    kind: ClassVar[str] = "support-mean-of-states"
    symbol: ClassVar[str] = r"\mathcal{M}"

    def parameters(self):
        return ()

    def definitions(self):
        weight = apply(SUPPORT, X, X_KEY) / integral(apply(SUPPORT, X, ETA), ETA)
        return (Definition("w", "w", (X, X_KEY), weight, "the mean's weights", absorbs=(X_KEY,)),
                Definition("out", self.symbol, (X, Y), integral(apply("w", X, X_KEY) * apply(STATE, X_KEY, Y), X_KEY),
                           "the mean of the states"))

    def uses_support(self):
        return True
