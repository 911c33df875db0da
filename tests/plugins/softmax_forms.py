"""Softmaxes plug-ins write themselves in forms the lowering once crashed on or got wrong (a tester's kinds, session 35):
scores holding an integral (talking heads in the exponent), scores read with query and key swapped, weights per
feature, two exponentials, no mask, a δ mask, a float weight beside the exponential (no mask: the formula as written),
and a step of the query alone (it cancelled against the normalizer's: a full softmax where the weights are 0).
"""

from dataclasses import dataclass, replace
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import ETA, H, H_MIX, HEADS, X, X_KEY, Y
from splitformer.symbolic.inputs import POSITIONS
from splitformer.symbolic.operators import STATE, SUPPORT, Attention, Definition, Operator, apply, integral, \
    kernel, register_operator


def _softmax(definitions, numerator):
    """definitions with gamma = numerator(x̃) / ∫ numerator(η) dη."""
    definitions = list(definitions)
    at = [d.function for d in definitions].index("gamma")
    definitions[at] = replace(definitions[at], rhs=numerator(X_KEY) / integral(numerator(ETA), ETA))
    return tuple(definitions)


@register_operator
@dataclass(frozen=True)
class TalkInExponent(Attention):
    """χ e^{∫ T(h, h̃) a(h̃, x, x̃) dh̃} over its normalizer (talking heads written in the exponent)."""
    kind: ClassVar[str] = "r-talk"

    def parameters(self):
        return (*super().parameters(), kernel("mix", "T", (H, H_MIX), (HEADS, HEADS)))

    def definitions(self):
        s = lambda k: integral(apply("mix", H, H_MIX) * apply("a", H_MIX, X, k), H_MIX)
        return _softmax(super().definitions(), lambda k: apply(SUPPORT, X, k) * sp.exp(s(k)))


@register_operator
@dataclass(frozen=True)
class Transposed(Attention):
    """χ e^{a(h, x̃, x)} (scores read with query and key swapped)."""
    kind: ClassVar[str] = "r-transposed"

    def definitions(self):
        return _softmax(super().definitions(), lambda k: apply(SUPPORT, X, k) * sp.exp(apply("a", H, k, X)))


@register_operator
@dataclass(frozen=True)
class FeatureSoftmax(Operator):
    """per-feature softmax over keys, γ on (x, y, x̃) = χ e^{u(x̃, y)} / ∫ χ e^{u(η, y)} dη; out = ∫ γ u dx̃."""
    kind: ClassVar[str] = "r-feature"
    symbol: ClassVar[str] = r"\mathcal{F}"

    def parameters(self):
        return ()

    def definitions(self):
        w = lambda k: apply(SUPPORT, X, k) * sp.exp(apply(STATE, k, Y))
        return (Definition("g", "g", (X, Y, X_KEY), w(X_KEY) / integral(w(ETA), ETA), "softmax", absorbs=(X_KEY,)),
                Definition("out", self.symbol, (X, Y), integral(apply("g", X, Y, X_KEY) * apply(STATE, X_KEY, Y), X_KEY),
                           "mean"))

    def uses_support(self):
        return True


def _dist(k):
    return sp.Abs(apply(POSITIONS.name, X) - apply(POSITIONS.name, k))


class _Slopes(Attention):
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def parameters(self):
        return (*super().parameters(), kernel("slopes", "m", (H,), (HEADS,)))


@register_operator
@dataclass(frozen=True)
class AlibiTwoExp(_Slopes):
    """χ H(2 − |Δp|, 1) e^{a} e^{−m_h |Δp|} — the same maths as r-alibi-one below, written as two exponentials."""
    kind: ClassVar[str] = "r-alibi-two"

    def definitions(self):
        return _softmax(super().definitions(), lambda k: apply(SUPPORT, X, k) * sp.Heaviside(2 - _dist(k), 1)
                        * sp.exp(apply("a", H, X, k)) * sp.exp(-apply("slopes", H) * _dist(k)))


@register_operator
@dataclass(frozen=True)
class AlibiOneExp(_Slopes):
    """χ H(2 − |Δp|, 1) e^{a − m_h |Δp|}."""
    kind: ClassVar[str] = "r-alibi-one"

    def definitions(self):
        return _softmax(super().definitions(), lambda k: apply(SUPPORT, X, k) * sp.Heaviside(2 - _dist(k), 1)
                        * sp.exp(apply("a", H, X, k) - apply("slopes", H) * _dist(k)))


@register_operator
@dataclass(frozen=True)
class AlibiNoMask(_Slopes):
    """e^{a − m_h |Δp|} with no support or step factor."""
    kind: ClassVar[str] = "r-alibi-nomask"

    def definitions(self):
        return _softmax(super().definitions(), lambda k: sp.exp(apply("a", H, X, k) - apply("slopes", H) * _dist(k)))


@register_operator
@dataclass(frozen=True)
class Chunked(Attention):
    """χ δ(⌊p(x)/3⌋, ⌊p(x̃)/3⌋) e^{a} (block-diagonal chunks of 3)."""
    kind: ClassVar[str] = "r-chunk"
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def definitions(self):
        p = lambda v: apply(POSITIONS.name, v)
        return _softmax(super().definitions(), lambda k: apply(SUPPORT, X, k)
                        * sp.KroneckerDelta(sp.floor(p(X) / 3), sp.floor(p(k) / 3)) * sp.exp(apply("a", H, X, k)))


@register_operator
@dataclass(frozen=True)
class FloatWeight(Attention):
    """r(x, x̃) e^{a} / ∫ r e^{a}, r = 1/(1 + |Δp|) a positive float weight (no mask)."""
    kind: ClassVar[str] = "r-weight"
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def definitions(self):
        d = list(super().definitions())
        at = [x.function for x in d].index("gamma")
        d.insert(at, Definition("r", "r", (X, X_KEY), 1 / (1 + _dist(X_KEY)), "a positive weight"))
        return _softmax(d, lambda k: apply("r", X, k) * sp.exp(apply("a", H, X, k)))


@register_operator
@dataclass(frozen=True)
class QueryStep(Attention):
    """χ H(p(x) − 3, 1) e^{a}: queries before position 3 keep no key (weight 0, output bias alone)."""
    kind: ClassVar[str] = "r-qstep"
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def definitions(self):
        return _softmax(super().definitions(), lambda k: apply(SUPPORT, X, k)
                        * sp.Heaviside(apply(POSITIONS.name, X) - 3, 1) * sp.exp(apply("a", H, X, k)))


@register_operator
@dataclass(frozen=True)
class FlatFeatureSoftmax(Operator):
    """Weights declared per feature, ``g(x, x̃, y) = χ e^{−|p(x) − p(x̃)|} / ∫ χ e^{−|p(x) − p(η)|} dη``, that read no
    feature: normalized along their middle axis, and there is no feature index to view them back by."""
    kind: ClassVar[str] = "r-flat"
    symbol: ClassVar[str] = r"\mathcal{F}"
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def parameters(self):
        return ()

    def definitions(self):
        w = lambda k: apply(SUPPORT, X, k) * sp.exp(-_dist(k))
        return (Definition("g", "g", (X, X_KEY, Y), w(X_KEY) / integral(w(ETA), ETA), "weights", absorbs=(X_KEY,)),
                Definition("out", self.symbol, (X, Y), integral(apply("g", X, X_KEY, Y) * apply(STATE, X_KEY, Y), X_KEY),
                           "mean"))

    def uses_support(self):
        return True
