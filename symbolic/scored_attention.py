"""Attention with options on its score kernel: qk-normalization, ALiBi, T5's relative bias, talking heads.

The scores ``a(h, x, x̃)`` of multi-head attention (``operators.Attention``) are changed by
options that compose (each set in ``attn = { kind = "scored-attention", … }``):

- ``qk_norm`` (cosine attention; Henry et al. 2020): queries and keys are projected onto the
  unit sphere of each head, ``q̂ = q / ‖q‖_{Ω_e}``, then scaled by learned per-feature gains
  ``g_q(h, e)``, ``g_k(h, e)`` (``q_gain``, ``k_gain``; a temperature is a constant gain);
- ``pre_talking_heads`` (Shazeer et al. 2020): the scores are mixed across the head axis before
  the softmax, ``s + ∫_{Ω_h} T_pre(h, h̃) s(h̃, x, x̃) dh̃`` (x-transformers' residual form);
- ``alibi`` (Press et al. 2022): each head's scores gain ``−m(h) |p(x) − p(x̃)|``, ``p`` the token
  positions (cached with the keys), the slopes ``m`` a control over the heads (``slopes``);
- ``rel_pos_bias`` (T5; Raffel et al. 2020), ``"causal"`` or ``"bidirectional"``: each head's scores
  gain ``∫_{Ω_b} T(b, h) δ(b − β(x, x̃)) db``, the learned table ``T`` (``rel_bias``, ``(n_buckets,
  n_heads)``; ``n_buckets`` is its length) read at the bucket ``β`` of the key's relative position
  (``relative_position``; ``max_distance``, default 128, where the logarithmic buckets end), key
  positions cached like ALiBi's;
- ``post_talking_heads``: the attention kernel is mixed across heads after the softmax,
  ``∫_{Ω_h} T_post(h, h̃) γ(h̃, x, x̃) dh̃`` (a kernel of kernels: the token spacing cancels).

Both kernels start at zero (controls, not weights): the pre-softmax mixing then is plain
attention, the post-softmax one a zero attention branch (as ReZero starts). Canonical
parameters besides attention's: ``q_gain``, ``k_gain`` ``(d,)``; ``slopes`` ``(n_heads,)``; ``rel_bias``
``(n_buckets, n_heads)`` (zeros at start: no bias);
``mix_pre``, ``mix_post`` ``(n_heads, n_heads)`` (``[h, h̃]``: output head, input head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from .domains import BUCKETS, HEAD_FEATURES, HEADS, B, H, H_MIX, E, X, X_KEY
from .errors import SplitformerError
from .inputs import POSITIONS
from .operators import Attention, Definition, Parameter, apply, heads_domain, kernel, register_operator
from .quadrature import integral
from .relative_position import relative_bucket

__all__ = ["ScoredAttention"]


def _head_mixing(field: str, kernel_name: str) -> sp.Expr:
    """``∫_{Ω_h} T(h, h̃) field(h̃, x, x̃) dh̃``: a linear map across the head axis."""
    return integral(apply(kernel_name, H, H_MIX) * apply(field, H_MIX, X, X_KEY), H_MIX)


@register_operator
@dataclass(frozen=True)
class ScoredAttention(Attention):
    """Multi-head attention whose score kernel carries the options ``qk_norm``, ``alibi`` and talking heads."""

    qk_norm: bool = False
    alibi: bool = False
    rel_pos_bias: str = ""
    max_distance: int = 128
    pre_talking_heads: bool = False
    post_talking_heads: bool = False
    kind: ClassVar[str] = "scored-attention"
    symbol: ClassVar[str] = r"\mathcal{A}^{s}"

    input_fields: ClassVar[tuple] = (POSITIONS,)  # declared to the emitted code only where ALiBi reads them

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rel_pos_bias not in ("", "causal", "bidirectional"):
            raise SplitformerError(f"{self.key}: rel_pos_bias must be \"causal\" or \"bidirectional\", "
                                   f"got {self.rel_pos_bias!r}")
        if isinstance(self.max_distance, bool) or not isinstance(self.max_distance, int) or \
                not 2 <= self.max_distance <= 2**31:
            raise SplitformerError(f"{self.key}: max_distance must be an int from 2 to 2**31, "
                                   f"got {str(self.max_distance)[:40]}")

    def parameters(self) -> tuple[Parameter, ...]:
        extra = []
        if self.qk_norm:
            heads = heads_domain(self.d_head)
            extra += [kernel("q_gain", "g^{Q}", (H, E), (heads,)), kernel("k_gain", "g^{K}", (H, E), (heads,))]
        if self.alibi:
            extra.append(kernel("slopes", "m", (H,), (HEADS,)))
        if self.rel_pos_bias:
            extra.append(kernel("rel_bias", "T^{b}", (B, H), (BUCKETS, HEADS), (B,)))
        for option, name in (("pre_talking_heads", "mix_pre"), ("post_talking_heads", "mix_post")):
            if getattr(self, option):
                latex = rf"T^{{{name.removeprefix('mix_')}}}"
                extra.append(kernel(name, latex, (H, H_MIX), (HEADS, HEADS), (H_MIX,)))
        return (*super().parameters(), *extra)

    def definitions(self) -> tuple[Definition, ...]:
        base = {definition.function: definition for definition in super().definitions()}
        definitions = [base["q"], base["k"], base["v"]]
        query, key = "q", "k"
        if self.qk_norm:
            for field in ("q", "k"):
                square = integral(apply(field, X, H, E) ** 2, E)
                projected = apply(f"{field}_gain", H, E) * apply(field, X, H, E) / sp.sqrt(apply(f"n{field}", X, H))
                definitions += [
                    Definition(f"n{field}", rf"\|{field.upper()}\|^2", (X, H), square,
                               f"the squared norm of a head's {field}"),
                    Definition(f"{field}n", rf"\hat{{{field.upper()}}}", (X, H, E), projected,
                               f"{field} projected onto the unit sphere of its head, then its learned gain"),
                ]
            query, key = "qn", "kn"
        score = integral(apply(query, X, H, E) * apply(key, X_KEY, H, E), E) / sp.sqrt(HEAD_FEATURES.measure)
        meaning = r"scores, scaled by $|\Omega_e|^{-1/2}$"
        if self.pre_talking_heads:
            definitions.append(Definition("s", "s", (H, X, X_KEY), score, meaning))
            score, meaning = apply("s", H, X, X_KEY) + _head_mixing("s", "mix_pre"), "scores mixed across heads"
        if self.alibi:
            distance = sp.Abs(apply(POSITIONS.name, X) - apply(POSITIONS.name, X_KEY))
            score, meaning = score - apply("slopes", H) * distance, meaning + r", plus $-m(h)\,|p(x) - p(\tilde{x})|$"
        if self.rel_pos_bias:
            offset = apply(POSITIONS.name, X_KEY) - apply(POSITIONS.name, X)
            bucket = relative_bucket(offset, BUCKETS.measure, self.max_distance, self.rel_pos_bias == "causal")
            definitions += [
                Definition("bk", r"\beta", (X, X_KEY), bucket,
                           f"the {self.rel_pos_bias} T5 bucket of the key's relative position"),
                Definition("rb", r"\tau", (H, X, X_KEY),
                           integral(apply("rel_bias", B, H) * sp.KroneckerDelta(B.symbol, apply("bk", X, X_KEY)), B),
                           "the learned bias of that bucket, per head"),
            ]
            score, meaning = score + apply("rb", H, X, X_KEY), meaning + r", plus $\tau(h, x, \tilde{x})$"
        definitions += [Definition("a", "a", (H, X, X_KEY), score, meaning), base["gamma"]]
        mixed = base["o"]
        if self.post_talking_heads:
            definitions.append(Definition("gt", r"\tilde{\gamma}", (H, X, X_KEY), _head_mixing("gamma", "mix_post"),
                                          "the attention kernel mixed across heads", absorbs=(X_KEY,)))
            mixed = Definition("o", "O", (X, H, E), integral(apply("gt", H, X, X_KEY) * apply("v", X_KEY, H, E), X_KEY),
                               mixed.meaning)
        return (*definitions, mixed, base["out"])
