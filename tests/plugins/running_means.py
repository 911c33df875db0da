"""Kinds whose formulas compute with steps of the token positions alone: running means over the earlier tokens (the
query's own weighted 0, ½ or 1: ``H(0)``), and a count of overlapping steps. Their bool values are numbers in the
state's dtype (``codegen.bool_values``): a sum of steps counts, a count divides in the state's dtype, and the strict
mean's first token, which sees no earlier one, is 0."""

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import ETA, X, X_KEY, Y
from splitformer.symbolic.inputs import POSITIONS
from splitformer.symbolic.operators import STATE, SUPPORT, Definition, Operator, apply, integral, register_operator


def _step(query, key, shift=0, at_zero=0):
    """``H(p(query) − p(key) − shift)`` with the value ``at_zero`` at 0 (``None``: SymPy's default, ½)."""
    difference = apply(POSITIONS.name, query) - apply(POSITIONS.name, key) - shift
    return sp.Heaviside(difference) if at_zero is None else sp.Heaviside(difference, at_zero)


@register_operator
@dataclass(frozen=True)
class StrictRunningMean(Operator):
    """``u ↦ ∫ w(x, x̃) u(x̃, y) dx̃``, ``w = H(p(x) − p(x̃)) / ∫ H(p(x) − p(η)) dη`` with ``H(0) = 0``: the mean of
    the earlier tokens (none at the first)."""

    kind: ClassVar[str] = "strict-running-mean"
    symbol: ClassVar[str] = r"\mathcal{R}"
    input_fields: ClassVar[tuple] = (POSITIONS,)
    at_zero: ClassVar = sp.Integer(0)
    #: The steps' shift: ``H(p(x) − p(x̃) − shift)``.
    shift: ClassVar = sp.Integer(0)
    #: The weights' scale (a fraction makes the steps numbers before they mask the quotient).
    scale: ClassVar = sp.Integer(1)

    def parameters(self):
        return ()

    def factor(self) -> sp.Expr:
        """What the weights hold besides the step and the scale."""
        return sp.Integer(1)

    def definitions(self):
        total = integral(_step(X, ETA, self.shift, self.at_zero), ETA)
        weight = self.scale * _step(X, X_KEY, self.shift, self.at_zero) * self.factor() / total
        return (Definition("w", "w", (X, X_KEY), weight, "the running weights", absorbs=(X_KEY,)),
                Definition("out", self.symbol, (X, Y), integral(apply("w", X, X_KEY) * apply(STATE, X_KEY, Y), X_KEY),
                           "the running mean"))


@register_operator
@dataclass(frozen=True)
class HalfRunningMean(StrictRunningMean):
    """The same with ``H(0) = ½`` (SymPy's default): the query's own token weighs half."""

    kind: ClassVar[str] = "half-running-mean"
    at_zero: ClassVar = sp.Rational(1, 2)


@register_operator
@dataclass(frozen=True)
class InclusiveRunningMean(StrictRunningMean):
    """The same with ``H(0) = 1``: the query's own token included."""

    kind: ClassVar[str] = "inclusive-running-mean"
    at_zero: ClassVar = sp.Integer(1)


@register_operator
@dataclass(frozen=True)
class StrictRunningThird(StrictRunningMean):
    """A third of the strict running mean: ``w = H(p(x) − p(x̃)) / (3 ∫ H(p(x) − p(η)) dη)``."""

    kind: ClassVar[str] = "strict-running-third"
    scale: ClassVar = sp.Rational(1, 3)


@register_operator
@dataclass(frozen=True)
class NegatedRunningMean(StrictRunningMean):
    """Minus the strict running mean: ``w = −H(p(x) − p(x̃)) / ∫ H(p(x) − p(η)) dη`` (``-`` of a bool array is an
    error in NumPy and torch)."""

    kind: ClassVar[str] = "negated-running-mean"
    scale: ClassVar = sp.Integer(-1)


@register_operator
@dataclass(frozen=True)
class TwoThirdsRunningMean(StrictRunningMean):
    """Two thirds of the strict running mean (NumPy's ``2 * bool`` is int64: a float32 state's weights float64)."""

    kind: ClassVar[str] = "two-thirds-running-mean"
    scale: ClassVar = sp.Rational(2, 3)


@register_operator
@dataclass(frozen=True)
class DecayedRunningMean(StrictRunningMean):
    """``w = H(p(x) − p(x̃)) e^{p(x̃) − p(x)} / ∫ H(p(x) − p(η)) dη``: the earlier tokens decayed by their distance.
    Outside the step the factor ``e^{p(x̃) − p(x)}`` overflows at long sequences (800 tokens), so the product must be
    0 there by its mask, not ``0 · ∞``."""

    kind: ClassVar[str] = "decayed-running-mean"

    def factor(self) -> sp.Expr:
        return sp.exp(apply(POSITIONS.name, X_KEY) - apply(POSITIONS.name, X))


@register_operator
@dataclass(frozen=True)
class SupportedRunningMean(StrictRunningMean):
    """The strict running mean over the tokens the masks leave: ``w = χ H / ∫ χ H dη`` (a mask of two factors)."""

    kind: ClassVar[str] = "supported-running-mean"

    def factor(self) -> sp.Expr:
        return apply(SUPPORT, X, X_KEY)

    def definitions(self):
        total = integral(apply(SUPPORT, X, ETA) * _step(X, ETA), ETA)
        weight = self.factor() * _step(X, X_KEY) / total
        return (Definition("w", "w", (X, X_KEY), weight, "the running weights", absorbs=(X_KEY,)),
                Definition("out", self.symbol, (X, Y), integral(apply("w", X, X_KEY) * apply(STATE, X_KEY, Y), X_KEY),
                           "the running mean"))

    def uses_support(self):
        return True


@register_operator
@dataclass(frozen=True)
class ShiftedRunningMean(StrictRunningMean):
    """``w = H(p(x) − p(x̃) − 1) / ∫ H(p(x) − p(η) − 1) dη`` with SymPy's ``H(0) = ½``: the tokens before the previous
    one, the previous one weighed ½; none at the first token (its step ``H(v, 0) + δ(v, 0)/2`` is no bool, and lost
    its mask)."""

    kind: ClassVar[str] = "shifted-running-mean"
    shift: ClassVar = sp.Integer(1)
    at_zero: ClassVar = None


@register_operator
@dataclass(frozen=True)
class MismatchedMean(Operator):
    """``∫ H(p(x) − p(x̃), 1) u(x̃, y) dx̃ / ∫ H(p(x) − p(η), 0) dη``: a sum over the tokens up to the query over the
    count of those before it; ∞ at the first token, as the formula is (its sum is no sum over the counted tokens)."""

    kind: ClassVar[str] = "mismatched-mean"
    symbol: ClassVar[str] = r"\mathcal{Q}"
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def parameters(self):
        return ()

    def definitions(self):
        total = integral(_step(X, X_KEY, at_zero=1) * apply(STATE, X_KEY, Y), X_KEY)
        return (Definition("out", self.symbol, (X, Y), total / integral(_step(X, ETA), ETA), "the quotient"),)


@register_operator
@dataclass(frozen=True)
class StepCount(Operator):
    """``u ↦ ∫ c(x, x̃) u(x̃, y) dx̃ / |Ω_x|``, ``c = H(δ) + H(δ − 1)``, ``δ = p(x) − p(x̃)``, ``H(0) = 1``: weight 2 on
    the earlier tokens, 1 on the query's own (two bool steps add as "or")."""

    kind: ClassVar[str] = "step-count"
    symbol: ClassVar[str] = r"\mathcal{C}"
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def count(self):
        return _step(X, X_KEY, at_zero=1) + _step(X, X_KEY, shift=1, at_zero=1)

    def parameters(self):
        return ()

    def definitions(self):
        return (Definition("out", self.symbol, (X, Y),
                           integral(self.count() * apply(STATE, X_KEY, Y), X_KEY) / X.domain.measure,
                           "the stepped sum over the tokens' measure"),)


@register_operator
@dataclass(frozen=True)
class ThirdCount(StepCount):
    """The same with ``c = H(δ) + H(δ − 1)/3``: a third of a bool step (a torch bool array times 1/3 is float32, a
    float64 state's third rounded)."""

    kind: ClassVar[str] = "third-count"

    def count(self):
        return _step(X, X_KEY, at_zero=1) + _step(X, X_KEY, shift=1, at_zero=1) / 3


@register_operator
@dataclass(frozen=True)
class InverseCount(Operator):
    """``u ↦ u(x, y) |Ω_x| / ∫ H(p(x) − p(η)) dη`` with ``H(0) = 0``: the state over the share of the earlier tokens,
    infinite at the first token (no earlier one), where no exact 0 stops the quotient."""

    kind: ClassVar[str] = "inverse-count"
    symbol: ClassVar[str] = r"\mathcal{I}"
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def parameters(self):
        return ()

    def definitions(self):
        return (Definition("out", self.symbol, (X, Y),
                           apply(STATE, X, Y) * X.domain.measure / integral(_step(X, ETA), ETA),
                           "the state over the share of earlier tokens"),)


@register_operator
@dataclass(frozen=True)
class NegativeCount(StepCount):
    """``c = −H(δ)``: minus a bool step (``-`` of a bool array is an error in NumPy and torch)."""

    kind: ClassVar[str] = "negative-count"

    def count(self):
        return -_step(X, X_KEY, at_zero=1)


@register_operator
@dataclass(frozen=True)
class MaxCount(StepCount):
    """``c = max(H(δ − 1), H(δ)/2)``: 1 on the earlier tokens, ½ on the query's own (a maximum of steps)."""

    kind: ClassVar[str] = "max-count"

    def count(self):
        return sp.Max(_step(X, X_KEY, shift=1, at_zero=1), _step(X, X_KEY, at_zero=1) / 2)
