"""A kind whose formula steps the state itself: ``u ↦ −H(u, 0) u/2 + H(u, 1)/3`` (minus half its ReLU, and a third
where it is ≥ 0). Its derivative ``−H(u, 0)/2 − u δ(u)/2 + δ(u)/3`` holds the steps' own derivatives, ``DiracDelta``, which are 0
wherever they are defined: the derived adjoint reads them so (it had no spelling for them)."""

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import X, Y
from splitformer.symbolic.operators import STATE, Definition, Operator, apply, register_operator


@register_operator
@dataclass(frozen=True)
class StateSteps(Operator):
    kind: ClassVar[str] = "state-steps"
    symbol: ClassVar[str] = r"\mathcal{S}"

    def parameters(self):
        return ()

    def definitions(self):
        u = apply(STATE, X, Y)
        return (Definition("out", self.symbol, (X, Y), -sp.Heaviside(u, 0) * u / 2 + sp.Heaviside(u, 1) / 3,
                           "minus half the ReLU, and a third where the state is ≥ 0"),)


@register_operator
@dataclass(frozen=True)
class StepGap(Operator):
    """``u ↦ |H(u, 0) − H(u, 1)| + u``: the state, and 1 where it is 0; its steps' derivatives are 0 wherever they are
    defined, and the adjoint with its first costate's sign flipped has the directional derivative 0."""

    kind: ClassVar[str] = "step-gap"
    symbol: ClassVar[str] = r"\mathcal{G}"

    def parameters(self):
        return ()

    def definitions(self):
        u = apply(STATE, X, Y)
        return (Definition("out", self.symbol, (X, Y), sp.Abs(sp.Heaviside(u, 0) - sp.Heaviside(u, 1)) + u,
                           "the state, and 1 where it is 0"),)


@register_operator
@dataclass(frozen=True)
class TwiceRelu(Operator):
    """``u ↦ 2 H(u, 0) u``: a step times a positive integer and the state (NumPy's ``2 * bool`` is int64, which made a
    float32 product float64)."""

    kind: ClassVar[str] = "twice-relu"
    symbol: ClassVar[str] = r"\mathcal{T}"

    def parameters(self):
        return ()

    def definitions(self):
        u = apply(STATE, X, Y)
        return (Definition("out", self.symbol, (X, Y), 2 * sp.Heaviside(u, 0) * u, "twice the ReLU"),)
