"""Token integrals that do not read the support χ (review s32): ``token-pool``, ``m(x, y) = u(x, y) ∫ u(x̃, y) dx̃ /
∫ u(η, y)² dη`` then a linear map, mixes every token whatever the mask, so a causal step of it leaks the future and
the causality checks must say so (F1: they skipped it as token-wise because it reads no χ); ``token-ratio``, the same
pool without the factor ``u(x, y)``, is free of the query token (F5: it failed to derive)."""

from dataclasses import dataclass
from typing import ClassVar

from splitformer.symbolic.domains import ETA, FEATURES, X_KEY, XI, X, Y
from splitformer.symbolic.operators import STATE, Definition, Operator, apply, integral, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class TokenPool(Operator):
    """``u ↦ ∫ W(ξ, y) m(x, ξ) dξ`` with ``m`` the state scaled by its pool over every token."""

    kind: ClassVar[str] = "token-pool"
    symbol: ClassVar[str] = r"\mathcal{P}"

    def parameters(self):
        return (kernel("W", "W", (XI, Y), (FEATURES, FEATURES), (XI,)),)

    def definitions(self):
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        pooled = apply(STATE, X, Y) * integral(apply(STATE, X_KEY, Y), X_KEY) / integral(apply(STATE, ETA, Y) ** 2, ETA)
        return (Definition("m", "m", (X, Y), pooled, "the state scaled by its pool over every token (no χ)"),
                Definition("out", r"\mathcal{P}", (X, Y), integral(p["W"] * apply("m", X, XI), XI),
                           "a linear map of the pool"))


@register_operator
@dataclass(frozen=True)
class TokenRatio(Operator):
    """``u ↦ ∫ W(ξ, y) m(ξ) dξ`` with ``m(y) = ∫ u(x̃, y) dx̃ / ∫ u(η, y)² dη``, the same at every query token (review
    s32, F5: declared on (x, y) but free of x, it failed to derive, ``tuple.index(x)``)."""

    kind: ClassVar[str] = "token-ratio"
    symbol: ClassVar[str] = r"\mathcal{R}"
    #: the variable the pool's numerator integrates over, and whether the pool is declared on the tokens too
    pooled_over: ClassVar = X_KEY
    on_tokens: ClassVar[bool] = True

    def parameters(self):
        return (kernel("W", "W", (XI, Y), (FEATURES, FEATURES), (XI,)),)

    def definitions(self):
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        tokens = (X,) if self.on_tokens else ()
        ratio = integral(apply(STATE, self.pooled_over, Y), self.pooled_over) / integral(apply(STATE, ETA, Y) ** 2, ETA)
        return (Definition("m", "m", (*tokens, Y), ratio, "the pool over every token, the same at every query"),
                Definition("out", r"\mathcal{R}", (X, Y), integral(p["W"] * apply("m", *tokens, XI), XI),
                           "a linear map of the pool"))


@register_operator
@dataclass(frozen=True)
class TokenRatioOwnVariable(TokenRatio):
    """``token-ratio`` with its pool written ``∫ u(x, y) dx`` on its own variable ``x`` (review s32, M1): the sum would
    reuse the query's index, and its derived adjoint was wrong; refused when derived."""

    kind: ClassVar[str] = "token-ratio-own-variable"
    pooled_over: ClassVar = X


@register_operator
@dataclass(frozen=True)
class FeaturePool(TokenRatio):
    """``token-ratio`` with the pool declared on the features alone, ``m(y)``, then ``∫ W(ξ, y) m(ξ) dξ`` on (x, y)
    (review s32, M2: the product's einsum named an output axis no operand has, and the forward raised)."""

    kind: ClassVar[str] = "feature-pool"
    on_tokens: ClassVar[bool] = False


@register_operator
@dataclass(frozen=True)
class TokenMean(TokenRatio):
    """``u ↦ ∫ W(ξ, y) m(x, ξ) dξ`` with ``m(x, y) = ∫ u(x̃, y) dx̃ / |Ω_x|``, the mean over every token: one reduction,
    the same at every query (a researcher's global mean: derived, then the forward reshaped a (batch, 1, d) mean)."""

    kind: ClassVar[str] = "token-mean"

    def definitions(self):
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        mean = integral(apply(STATE, X_KEY, Y), X_KEY) / X.domain.measure
        return (Definition("m", "m", (X, Y), mean, "the mean over every token, the same at every query"),
                Definition("out", r"\mathcal{M}", (X, Y), integral(p["W"] * apply("m", X, XI), XI),
                           "a linear map of the mean"))
