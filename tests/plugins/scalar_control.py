"""A kind with a control that has no axis: ``u ↦ ∫ w u dx̃``, ``w ∝ χ e^{−τ² (p(x) − p(x̃))²}`` normalized over the keys,
with one learned temperature ``τ`` (a tester's kind). Sampled as SymPy's ``Indexed`` it crashed (an array read needs an
index); it is the array's one number (``program.Number``), as ReZero's step is."""

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import ETA, X, X_KEY, Y
from splitformer.symbolic.inputs import POSITIONS
from splitformer.symbolic.operators import STATE, SUPPORT, Definition, Operator, apply, integral, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class GaussianMixer(Operator):
    kind: ClassVar[str] = "gaussian-mixer"
    symbol: ClassVar[str] = r"\mathcal{G}"
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def parameters(self):
        return (kernel("tau", r"\tau", (), ()),)

    def definitions(self):
        def weight(key):
            distance = apply(POSITIONS.name, X) - apply(POSITIONS.name, key)
            return apply(SUPPORT, X, key) * sp.exp(-apply("tau") ** 2 * distance ** 2)

        return (Definition("w", "w", (X, X_KEY), weight(X_KEY) / integral(weight(ETA), ETA), "the weights",
                           absorbs=(X_KEY,)),
                Definition("out", self.symbol, (X, Y), integral(apply("w", X, X_KEY) * apply(STATE, X_KEY, Y), X_KEY),
                           "the weighted mean"))

    def uses_support(self):
        return True


@register_operator
@dataclass(frozen=True)
class ScaledTanh(Operator):
    """``α tanh(u)``, α one learned number in a pointwise definition (a tester's kind: the pass inlining elementwise
    temporaries renamed its indices and crashed on the control's none)."""

    kind: ClassVar[str] = "scaled-tanh"
    symbol: ClassVar[str] = r"\mathcal{S}"

    def parameters(self):
        return (kernel("alpha", r"\alpha", (), ()),)

    def definitions(self):
        return (Definition("t", "t", (X, Y), sp.tanh(apply(STATE, X, Y)), "tanh"),
                Definition("out", self.symbol, (X, Y), apply("alpha") * apply("t", X, Y), "scaled"))
