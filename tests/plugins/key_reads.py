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


def _inside(query, key, window: int, edge) -> sp.Expr:
    """1 where the two tokens are less than ``window`` apart, ``edge`` where exactly (a step of their positions)."""
    return sp.Heaviside(window - sp.Abs(apply(POSITIONS.name, query) - apply(POSITIONS.name, key)), edge)


@register_operator
@dataclass(frozen=True)
class WindowAttention(Attention):
    """Attention whose softmax sees the keys at most ``window`` positions from the query."""

    kind: ClassVar[str] = "window-attention"
    input_fields: ClassVar[tuple] = (POSITIONS,)
    #: The step's value at the window's edge.
    edge: ClassVar = sp.Integer(1)
    window: int = 2

    def definitions(self):
        definitions = list(super().definitions())
        inside = [_inside(X, key, self.window, self.edge) for key in (X_KEY, ETA)]
        weight = apply(SUPPORT, X, X_KEY) * inside[0] * sp.exp(apply("a", H, X, X_KEY))
        total = integral(apply(SUPPORT, X, ETA) * inside[1] * sp.exp(apply("a", H, X, ETA)), ETA)
        at = [definition.function for definition in definitions].index("gamma")
        definitions[at] = replace(definitions[at], rhs=weight / total, meaning="the softmax over the window")
        return tuple(definitions)


@register_operator
@dataclass(frozen=True)
class HalfEdgeWindowAttention(WindowAttention):
    """The window's edge weighed ½ (SymPy's default step): its mask ``H(v, 0) + δ(v, 0)/2`` is no bool, and a window
    of padded keys alone divided 0 by 0."""

    kind: ClassVar[str] = "half-edge-window-attention"
    edge: ClassVar = sp.Rational(1, 2)


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
