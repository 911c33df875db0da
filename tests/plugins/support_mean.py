"""Kinds that read a support as a factor of their formulas (attack 24), where the built-in attentions read it only
through their softmax: the mean of the state over the tokens a query may see, then an affine map; the state summed
over them (χ only inside a product); the mean of a fixed memory over the memory tokens a query sees (χ_m); a mean
weighted by two-hop reach, whose weights are a product of supports alone (χ·χ)."""

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import ETA, ETA_MEMORY, FEATURES, X_KEY, X_MEMORY, XI, X, Y
from splitformer.symbolic.inputs import MEMORY, MEMORY_SUPPORT
from splitformer.symbolic.operators import STATE, SUPPORT, Definition, Operator, apply, integral, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class SupportMean(Operator):
    """``u ↦ ∫ W(ξ, y) m(x, ξ) dξ + b(y)`` with ``m(x, y) = ∫ χ(x, x̃) u(x̃, y) dx̃ / ∫ χ(x, η) dη``."""

    kind: ClassVar[str] = "support-mean"
    symbol: ClassVar[str] = r"\mathcal{M}"

    def parameters(self):
        return (kernel("W", "W", (XI, Y), (FEATURES, FEATURES), (XI,)), kernel("b", "b", (Y,), (FEATURES,)))

    def definitions(self):
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        mean = integral(apply(SUPPORT, X, X_KEY) * apply(STATE, X_KEY, Y), X_KEY) / integral(apply(SUPPORT, X, ETA), ETA)
        return (Definition("m", "m", (X, Y), mean, "the mean of the state over the support"),
                Definition("out", r"\mathcal{M}", (X, Y), integral(p["W"] * apply("m", X, XI), XI) + p["b"],
                           "an affine map of the mean"))

    def uses_support(self):
        return True


@register_operator
@dataclass(frozen=True)
class SupportSum(Operator):
    """``u ↦ ∫ χ(x, x̃) u(x̃, y) dx̃ / ∫ u(η, y)² dη``: χ read only inside one product, no division by its measure."""

    kind: ClassVar[str] = "support-sum"
    symbol: ClassVar[str] = r"\mathcal{S}"

    def parameters(self):
        return ()

    def definitions(self):
        total = integral(apply(SUPPORT, X, X_KEY) * apply(STATE, X_KEY, Y), X_KEY)
        energy = integral(apply(STATE, ETA, Y) ** 2, ETA)
        return (Definition("out", r"\mathcal{S}", (X, Y), total / energy, "the state summed over the support, over its "
                           "energy"),)

    def uses_support(self):
        return True


@register_operator
@dataclass(frozen=True)
class MemoryMean(Operator):
    """``u ↦ ∫ χ_m(x, x̂) M(x̂, y) dx̂ / ∫ χ_m(x, η̂) dη̂``: the mean of a fixed memory over the memory tokens a query sees
    (the memory's support χ_m read as a factor)."""

    kind: ClassVar[str] = "memory-mean"
    symbol: ClassVar[str] = r"\mathcal{M}_m"
    input_fields: ClassVar[tuple] = (MEMORY, MEMORY_SUPPORT)

    def parameters(self):
        return ()

    def definitions(self):
        mean = integral(apply(MEMORY_SUPPORT.name, X, X_MEMORY) * apply(MEMORY.name, X_MEMORY, Y), X_MEMORY) / \
            integral(apply(MEMORY_SUPPORT.name, X, ETA_MEMORY), ETA_MEMORY)
        return (Definition("out", r"\mathcal{M}_m", (X, Y), mean, "the mean of the memory over its support"),)


@register_operator
@dataclass(frozen=True)
class TwoHopMean(Operator):
    """``u ↦ ∫ c(x, x̃) u(x̃, y) dx̃ / ∫ c(x, η) dη`` with ``c(x, x̃) = ∫ χ(x, η) χ(η, x̃) dη / ∫ χ(x, η) dη``: the share of
    the tokens ``x`` sees that see ``x̃`` (a contraction of supports alone, and an adjoint whose sum holds a sum)."""

    kind: ClassVar[str] = "two-hop-mean"
    symbol: ClassVar[str] = r"\mathcal{T}"

    def parameters(self):
        return ()

    def definitions(self):
        reach = integral(apply(SUPPORT, X, ETA) * apply(SUPPORT, ETA, X_KEY), ETA) / integral(apply(SUPPORT, X, ETA), ETA)
        mean = integral(apply("c", X, X_KEY) * apply(STATE, X_KEY, Y), X_KEY) / integral(apply("c", X, ETA), ETA)
        return (Definition("c", "c", (X, X_KEY), reach, "the share of the tokens a query sees that see a key"),
                Definition("out", r"\mathcal{T}", (X, Y), mean, "the state's mean under those weights"))
    # no ``uses_support``: read from the definitions (a tester's kind that read χ without saying so failed at every call)


@register_operator
@dataclass(frozen=True)
class KeyGateMean(Operator):
    """``u ↦ ∫ χ(x̃, x) e(x̃, y) / ∫ χ(x̃, η) dη dx̃`` with ``e = exp(u)`` a definition of its own: each query's gate
    spread over the keys it sees (a tester's kind; a query that sees no key adds nothing, whatever its
    ``e``, even ``e^{90} = ∞`` in float32)."""

    kind: ClassVar[str] = "key-gate-mean"
    symbol: ClassVar[str] = r"\mathcal{G}"

    def parameters(self):
        return ()

    def definitions(self):
        count = integral(apply(SUPPORT, X_KEY, ETA), ETA)
        return (Definition("e", "e", (X, Y), sp.exp(apply(STATE, X, Y)), "the gate"),
                Definition("out", self.symbol, (X, Y), integral(apply(SUPPORT, X_KEY, X) * apply("e", X_KEY, Y) / count,
                                                                X_KEY), "the gates spread over the keys"))

    def uses_support(self):
        return True


@register_operator
@dataclass(frozen=True)
class KeyShareMean(Operator):
    """``u ↦ ∫ χ(x, x̃) u(x̃, y) / c(x̃) dx̃ / |Ω|`` with ``c(x) = ∫ χ(x, η) dη / |Ω|`` a definition of its own: each key
    weighed by the share of the tokens it sees itself (a tester's kind; a key that sees none but that a query
    sees divides by 0 there: ∞, as the formula says)."""

    kind: ClassVar[str] = "key-share-mean"
    symbol: ClassVar[str] = r"\mathcal{S}"

    def parameters(self):
        return ()

    def definitions(self):
        share = Definition("c", "c", (X,), integral(apply(SUPPORT, X, ETA), ETA) / X.domain.measure, "the share seen")
        mean = integral(apply(SUPPORT, X, X_KEY) * apply(STATE, X_KEY, Y) / apply("c", X_KEY), X_KEY) / X.domain.measure
        return (share, Definition("out", self.symbol, (X, Y), mean, "the keys weighed by their shares"))

    def uses_support(self):
        return True
