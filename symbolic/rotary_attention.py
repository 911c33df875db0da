"""Llama's attention: rotary position embedding (RoPE) and grouped-query attention (GQA).

- **RoPE** (Su et al. 2021). A head's features are pairs ``e = c·N_r + r`` (transformers'
  ``rotate_half`` layout: feature ``r`` pairs with ``r + d_head/2``, not interleaved). Queries
  and keys are rotated pair by pair by the angle ``φ(x, r) = p(x) θ^{−2r/|Ω_e|}`` of their
  token position ``p(x)``: ``q̂(x, c, r) = ∫_{Ω_c} R(φ; c, c̃) q(x, c̃, r) dc̃`` with the rotation
  kernel ``R(φ; c, c̃) = cos(φ − (c − c̃)π/2)`` on the two-point pair domain ``Ω_c``. Since
  ``R(φ)ᵀR(φ̃) = R(φ̃ − φ)``, the score kernel depends on ``p(x) − p(x̃)`` only
  (``splitformer check`` proves it: ``rope/relative-kernel``). Positions are an input of the
  emitted code (``positions``, default ``0 … N−1``, shifted by the cache for decoding).
- **Partial rotation** (GPT-J; x-transformers' ``rotary_emb_dim``): the option ``rotary_dim = R``
  turns pair ``r`` by ``φ(x, r) = p(x) θ^{−2r/R} H(R/2 − r)`` (``H`` the step with ``H(0) = 0``):
  the first ``R/2`` pairs rotate with the frequencies of an ``R``-feature rotary embedding, the
  others by the angle zero (they stay). ``rotary_dim = 0`` (the default) rotates every pair,
  ``φ = p(x) θ^{−2r/|Ω_e|}``.
- **GQA** (Ainslie et al. 2023). Keys and values live on a coarser head grid ``Ω_g``
  (``n_kv_heads``); the query heads are the product ``Ω_g × Ω_s`` of that grid and the
  ``n_rep = n_heads / n_kv_heads`` members of each group (head ``h = g·n_rep + s``, as
  transformers' ``repeat_kv``). The score of query head ``(g, s)`` integrates against the
  keys of head ``g``: a restriction in the head domain, equal to multi-head attention with
  every key/value head repeated ``n_rep`` times (``gqa/repeated-heads``).

No biases (Llama's ``attention_bias = False``). Canonical parameters: ``attn.W_q (d, d)``,
``attn.W_k (d, d_kv)``, ``attn.W_v (d, d_kv)``, ``attn.W_o (d, d)`` with
``d_kv = n_kv_heads · d_head``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import sympy as sp

from .errors import SplitformerError
from .domains import (
    C, C_IN, E, ETA, FEATURES, G, HEAD_FEATURES, KV_FEATURES, R, S, X, X_KEY, XI, Y,
)
from .inputs import POSITIONS as POSITIONS_INPUT
from .inputs import Constant
from .operators import (
    STATE, SUPPORT, Definition, Operator, Parameter, apply, check_head_width, heads_domain, register_operator,
)
from .quadrature import integral

__all__ = ["RotaryAttention", "ROPE_THETA", "POSITIONS", "rotation_kernel"]

#: RoPE's base θ; emitted as the ``rope_theta`` argument.
ROPE_THETA = sp.Symbol("rope_theta", positive=True)
#: Name of the token-position field ``p(x)``; emitted from the ``positions`` argument.
POSITIONS = POSITIONS_INPUT.name


def rotation_kernel(angle: sp.Expr, c: sp.Expr, c_in: sp.Expr) -> sp.Expr:
    """``R(φ; c, c̃) = cos(φ − (c − c̃)π/2)``: the rotation by ``φ`` of a pair (c = 0, 1)."""
    return sp.cos(angle - (c - c_in) * sp.pi / 2)


def _kernel(name: str, latex: str, arguments, shape, absorbs=()) -> Parameter:
    return Parameter(name, name, latex, tuple(arguments), tuple(shape), tuple(absorbs))


@register_operator
@dataclass(frozen=True)
class RotaryAttention(Operator):
    """Causal-ready multi-head attention with rotary positions and grouped key/value heads; ``rotary_dim``
    (even, > 0) rotates the first ``rotary_dim / 2`` pairs of each head only; ``d_head`` (even) sets the head
    width (default ``d / n_heads``), ``W_q`` then ``(d, n_heads · d_head)`` and ``W_o`` its transpose's shape."""

    rotary_dim: int = 0
    d_head: int | None = None

    kind: ClassVar[str] = "rotary-attention"
    symbol: ClassVar[str] = r"\mathcal{A}^{\mathrm{rot}}"
    input_fields: ClassVar[tuple] = (POSITIONS_INPUT,)
    constants: ClassVar[tuple] = (Constant(ROPE_THETA, 10000.0, "θ of the rotary angles p θ^(−2r/d_head)", 100.0),)
    head_width_option: ClassVar[str] = "rotary_dim"  # θ^(−2r/R) are the angles of an R-feature embedding

    def __post_init__(self) -> None:
        check_head_width(self.key, self.d_head)
        if self.d_head is not None and self.d_head % 2:
            raise SplitformerError(f"{self.key}: d_head must be even for rotary positions (pairs of features), "
                                   f"got {self.d_head!r}")
        if isinstance(self.rotary_dim, bool) or not isinstance(self.rotary_dim, int) or self.rotary_dim < 0 \
                or self.rotary_dim % 2:
            raise SplitformerError(f"{self.key}: rotary_dim must be an even number of features > 0 (0: all), "
                                   f"got {self.rotary_dim!r}")

    def angle(self) -> sp.Expr:
        """``φ(x, r)``: ``p(x) θ^{−2r/|Ω_e|}``, or with ``rotary_dim = R`` ``p(x) θ^{−2r/R} H(R/2 − r)``."""
        position = apply(POSITIONS, X)
        if not self.rotary_dim:
            return position * ROPE_THETA ** (-2 * R.symbol / HEAD_FEATURES.measure)
        width = sp.Integer(self.rotary_dim)
        return position * ROPE_THETA ** (-2 * R.symbol / width) * sp.Heaviside(width / 2 - R.symbol, 0)

    def parameters(self) -> tuple[Parameter, ...]:
        return (
            _kernel("W_q", "W^{Q}", (XI, G, S, C, R), (FEATURES, heads_domain(self.d_head)), (XI,)),
            _kernel("W_k", "W^{K}", (XI, G, C, R), (FEATURES, KV_FEATURES), (XI,)),
            _kernel("W_v", "W^{V}", (XI, G, E), (FEATURES, KV_FEATURES), (XI,)),
            _kernel("W_o", "W^{O}", (G, S, E, Y), (heads_domain(self.d_head), FEATURES), (G, S, E)),
        )

    def definitions(self) -> tuple[Definition, ...]:
        p = {parameter.name: parameter.applied() for parameter in self.parameters()}
        u = apply(STATE, X, XI)
        angle = self.angle()

        def rotated(field: str, arguments) -> sp.Expr:
            unrotated = apply(field, *[C_IN if variable is C else variable for variable in arguments])
            return integral(rotation_kernel(apply("phi", X, R), C.symbol, C_IN.symbol) * unrotated, C_IN)

        query_axes, key_axes = (X, G, S, C, R), (X, G, C, R)
        score = integral(integral(apply("qr", X, G, S, C, R) * apply("kr", X_KEY, G, C, R), R), C)
        weight = apply(SUPPORT, X, X_KEY) * sp.exp(apply("a", G, S, X, X_KEY))
        normalizer = integral(apply(SUPPORT, X, ETA) * sp.exp(apply("a", G, S, X, ETA)), ETA)
        mixed = integral(apply("gamma", G, S, X, X_KEY) * apply("v", X_KEY, G, E), X_KEY)
        output = integral(integral(integral(p["W_o"] * apply("o", X, G, S, E), E), S), G)
        return (
            Definition("q", "Q", query_axes, integral(p["W_q"] * u, XI),
                       r"queries on the head grid $\Omega_g \times \Omega_s$, features as pairs $(c, r)$"),
            Definition("k", "K", key_axes, integral(p["W_k"] * u, XI), r"keys on the coarser head grid $\Omega_g$"),
            Definition("v", "V", (X, G, E), integral(p["W_v"] * u, XI), r"values on the coarser head grid $\Omega_g$"),
            Definition("phi", r"\varphi", (X, R), angle, r"rotation angle of pair $r$ at position $p(x)$"
                       + (rf", zero past the first {self.rotary_dim // 2} pairs" if self.rotary_dim else "")),
            Definition("qr", r"\hat{Q}", query_axes, rotated("q", query_axes), "queries rotated pair by pair"),
            Definition("kr", r"\hat{K}", key_axes, rotated("k", key_axes), "keys rotated pair by pair"),
            Definition("a", "a", (G, S, X, X_KEY), score / sp.sqrt(HEAD_FEATURES.measure),
                       r"scores of query head $(g, s)$ against the keys of head $g$, scaled by $|\Omega_e|^{-1/2}$"),
            Definition("gamma", r"\gamma", (G, S, X, X_KEY), weight / normalizer,
                       r"attention kernel $\mathrm{Softmax}_2$, restricted to the support $\chi$", absorbs=(X_KEY,)),
            Definition("o", "O", (X, G, S, E), mixed, "the non-local integral over token positions"),
            Definition("out", r"\mathcal{A}", (X, Y), output, "heads combined by the output kernel"),
        )

    def uses_support(self) -> bool:
        return True
