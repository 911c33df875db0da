"""Token shift (Peng et al.'s RWKV time-mix, x-transformers' ``shift_tokens``): a local relative kernel
along the tokens, one offset per segment of the features.

The features are cut into ``n`` segments of ``w = ⌊N_y / n⌋`` features (the rest, ``N_y − n w``, stays);
segment ``j`` reads its token at offset ``s_j`` (``s ∈ −k … k``, or ``0 … k`` with ``causal``),
``k = reach``; ``masked = false`` drops the support factor (x-transformers' feed-forward shift,
which is given no mask). As a token integral with a relative kernel of local support,

    (S u)(x, y) = ∫_{Ω_x} κ(x, x̃, y) u(x̃, y) dx̃,
    κ(x, x̃, y) = Σ_j 1[y ∈ segment j] δ_Δx(p(x) − p(x̃) − s_j) χ(x, x̃)^{[s_j ≠ 0]}  (+ δ_Δx(p(x) − p(x̃)) on the rest),

``δ_Δx(r) = 1[r = 0] / Δx`` a delta of one token's width and ``p`` the token positions, so the
rectangle rule over ``x̃`` (the quadrature attention uses) gives a Kronecker delta per segment: the
token spacing cancels. A shifted token outside the sequence or off the support ``χ`` (a padded or
future token) reads zero; an unshifted one reads itself, as x-transformers' ``shift`` does.

The state is read through a copy ``w(x, y) = u(x, y)`` so that, in a causal scheme, the KV cache keeps
every earlier token's ``w`` (as it keeps keys) and cached decoding equals the full pass.
No parameters. Use it as a substep's ``shift``: ``{ operator = "attn", on = "norm", shift = "shift" }``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from .domains import FEATURES, TOKENS, X, X_KEY, Y
from .errors import SplitformerError
from .inputs import POSITIONS
from .operators import STATE, SUPPORT, Definition, Operator, Parameter, apply, integral, register_operator

__all__ = ["TokenShift"]

_HALF = sp.Rational(1, 2)


def _indicator(low: sp.Expr, value: sp.Expr, high: sp.Expr) -> sp.Expr:
    """``1[low ≤ value < high]`` for integers, as a product of steps (``Heaviside(v, 0)`` is ``v > 0``)."""
    return sp.Heaviside(value - low + _HALF, 0) * sp.Heaviside(high - _HALF - value, 0)


#: The widest reach: 2 reach + 1 segments, each a term of the kernel (reach 32 derives in about 3 s, 128 in 25 s,
#: 1000 in minutes; x-transformers' shift_tokens is 1 or 2 in practice).
MAX_REACH = 32


@register_operator
@dataclass(frozen=True)
class TokenShift(Operator):
    """Segments of the features read at tokens ``s_j`` earlier (``s_j < 0``: later); no parameters."""

    reach: int = 1
    causal: bool = False
    masked: bool = True
    kind: ClassVar[str] = "token-shift"
    symbol: ClassVar[str] = r"\mathcal{S}"
    is_token_map: ClassVar[bool] = True
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def __post_init__(self) -> None:
        if type(self.reach) is not int or not 1 <= self.reach <= MAX_REACH:
            raise SplitformerError(f"{self.key}: reach must be an int from 1 to {MAX_REACH} (the kernel holds one term "
                                   f"per offset, derived symbolically), got {str(self.reach)[:40]!r}")

    def offsets(self) -> tuple[int, ...]:
        """The segments' offsets in order: ``0 … k`` (causal) or ``−k … k``."""
        return tuple(range(0 if self.causal else -self.reach, self.reach + 1))

    def parameters(self) -> tuple[Parameter, ...]:
        return ()

    def definitions(self) -> tuple[Definition, ...]:
        offsets = self.offsets()
        channel = Y.symbol / FEATURES.spacing  # the feature's grid index
        width = sp.floor(FEATURES.measure / (len(offsets) * FEATURES.spacing))
        distance = apply(POSITIONS.name, X) - apply(POSITIONS.name, X_KEY)
        support = apply(SUPPORT, X, X_KEY)
        kernel = _indicator(len(offsets) * width, channel, FEATURES.measure / FEATURES.spacing + 1) \
            * _indicator(0, distance, 1)  # the features after the last segment: unshifted
        for segment, offset in enumerate(offsets):
            masked = support if offset != 0 and self.masked else 1
            kernel += _indicator(segment * width, channel, (segment + 1) * width) \
                * _indicator(offset, distance, offset + 1) * masked
        return (
            Definition("w", "w", (X, Y), apply(STATE, X, Y), "the branch input, kept by the cache for later tokens"),
            Definition("kappa", r"\kappa", (X, X_KEY, Y), kernel / TOKENS.spacing,
                       r"the relative kernel: a delta of one token's width at the segment's offset $s_j$",
                       absorbs=(X_KEY,)),
            Definition("out", r"\mathcal{S}", (X, Y), integral(apply("kappa", X, X_KEY, Y) * apply("w", X_KEY, Y), X_KEY),
                       "the token integral: each feature read at its segment's offset"),
        )

    def checked_features(self) -> int:
        """Two features a segment and one unshifted: at the checks' d = 8 a reach of 4 (9 segments of ⌊8/9⌋ = 0
        features) was the identity, so its checks held without reading a shift (a tester)."""
        return 2 * len(self.offsets()) + 1

    def uses_support(self) -> bool:
        return True  # also unmasked: in a causal scheme the cache keeps the earlier tokens' ``w``
