"""The published formulas of the built-in blocks, written with SymPy matrices.

These are the references the exact-recovery check compares derived programs with; they
are written from the papers' formulas, not from the derivation. Entries may be symbols
(exact comparison) or high-precision floats (numeric comparison).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sympy as sp

from .scheme import Scheme
from .scheme_file import is_builtin

__all__ = ["REFERENCES", "reference_block", "has_published_reference", "product"]

Params = Mapping[str, sp.Matrix]


def _rows(vector: sp.Matrix, count: int) -> sp.Matrix:
    return sp.Matrix(count, len(vector), lambda i, k: vector[k])


def product(a: sp.Matrix, b: sp.Matrix) -> sp.Matrix:
    """The matrix product ``a b`` as sums of products, skipping zero entries: SymPy's own product
    asks every entry whether it is infinite (``0·∞``), an assumptions query that walks the whole
    expression and dominates the symbolic recovery of the two-stage blocks (rk2: 9.7 s of 15)."""
    return sp.Matrix(a.rows, b.cols, lambda i, j: sp.Add(*(a[i, k] * b[k, j] for k in range(a.cols)
                                                          if a[i, k] != 0 and b[k, j] != 0)))


def layer_norm(x: sp.Matrix, p: Params, name: str, eps: sp.Expr) -> sp.Matrix:
    n, d = x.shape
    out = sp.zeros(n, d)
    for i in range(n):
        mean = sum(x[i, :]) / d
        variance = sum((x[i, k] - mean) ** 2 for k in range(d)) / d
        for k in range(d):
            out[i, k] = (x[i, k] - mean) / sp.sqrt(variance + eps) * p[f"{name}.gain"][k] + p[f"{name}.bias"][k]
    return out


def attention(x: sp.Matrix, p: Params, n_heads: int, key: str = "attn", causal: bool = False,
              memory: sp.Matrix | None = None) -> sp.Matrix:
    """Concat_m softmax(Q_m K_mᵀ / √d_h) V_m, then W^O (Vaswani et al. 2017); ``causal``: keys j ≤ i only;
    ``memory``: keys and values from it (cross-attention)."""
    n, d = x.shape
    width = d // n_heads
    source = x if memory is None else memory
    q = product(x, p[f"{key}.W_q"]) + _rows(p[f"{key}.b_q"], n)
    k, v = (product(source, p[f"{key}.W_{c}"]) + _rows(p[f"{key}.b_{c}"], source.shape[0]) for c in "kv")
    heads = []
    for m in range(n_heads):
        columns = slice(m * width, (m + 1) * width)
        scores = product(q[:, columns], k[:, columns].T) / sp.sqrt(width)
        keys = [range(i + 1) if causal else range(source.shape[0]) for i in range(n)]
        weights = sp.Matrix(n, source.shape[0], lambda i, j: sp.exp(scores[i, j]) / sum(sp.exp(scores[i, t]) for t in keys[i])
                            if j in keys[i] else 0)
        heads.append(product(weights, v[:, columns]))
    return product(sp.Matrix.hstack(*heads), p[f"{key}.W_o"]) + _rows(p[f"{key}.b_o"], n)


def feed_forward(x: sp.Matrix, p: Params, activation: Callable, key: str = "ffn") -> sp.Matrix:
    hidden = (product(x, p[f"{key}.W_1"]) + _rows(p[f"{key}.b_1"], x.shape[0])).applyfunc(activation)
    return product(hidden, p[f"{key}.W_2"]) + _rows(p[f"{key}.b_2"], x.shape[0])


def _post_ln(x, p, heads, eps, act):
    x = layer_norm(x + attention(x, p, heads), p, "norm1", eps)
    return layer_norm(x + feed_forward(x, p, act), p, "norm2", eps)


def _pre_ln(x, p, heads, eps, act):
    x = x + attention(layer_norm(x, p, "norm1", eps), p, heads)
    return x + feed_forward(layer_norm(x, p, "norm2", eps), p, act)


def _macaron(x, p, heads, eps, act):
    half = sp.Rational(1, 2)
    x = layer_norm(x + half * feed_forward(x, p, act, "ffn_pre"), p, "norm1", eps)
    x = layer_norm(x + attention(x, p, heads), p, "norm2", eps)
    return layer_norm(x + half * feed_forward(x, p, act, "ffn_post"), p, "norm3", eps)


def _macaron_pre_ln(x, p, heads, eps, act):
    """The pre-norm macaron (Conformer, x-transformers' macaron): ½F, A, ½F each on its own LayerNorm."""
    half = sp.Rational(1, 2)
    x = x + half * feed_forward(layer_norm(x, p, "norm1", eps), p, act, "ffn_pre")
    x = x + attention(layer_norm(x, p, "norm2", eps), p, heads)
    return x + half * feed_forward(layer_norm(x, p, "norm3", eps), p, act, "ffn_post")


def _gpt2(x, p, heads, eps, act):
    """Radford et al. 2019: pre-LN with causal self-attention."""
    x = x + attention(layer_norm(x, p, "norm1", eps), p, heads, causal=True)
    return x + feed_forward(layer_norm(x, p, "norm2", eps), p, act)


def rms_norm(x: sp.Matrix, p: Params, name: str, eps: sp.Expr) -> sp.Matrix:
    """x / √(mean x² + ε) · g (Zhang and Sennrich 2019)."""
    n, d = x.shape
    return sp.Matrix(n, d, lambda i, k: x[i, k] / sp.sqrt(sum(x[i, t] ** 2 for t in range(d)) / d + eps)
                     * p[f"{name}.gain"][k])


def rotary(x: sp.Matrix, head_width: int, theta: sp.Expr, positions: sp.Matrix) -> sp.Matrix:
    """RoPE: ``x cos + rotate_half(x) sin`` per head at the tokens' positions (Su et al. 2021;
    transformers' layout: feature r of a head pairs with r + d_head/2)."""
    n, width = x.shape
    half = head_width // 2

    def entry(i, column):
        head, e = divmod(column, head_width)
        r = e % half
        angle = positions[i] * theta ** (-sp.Rational(2 * r, head_width))
        partner = head * head_width + (e + half) % head_width
        rotated_half = x[i, partner] * sp.sin(angle)
        return x[i, column] * sp.cos(angle) + (-rotated_half if e < half else rotated_half)

    return sp.Matrix(n, width, entry)


def grouped_attention(x: sp.Matrix, p: Params, n_heads: int, theta: sp.Expr, key: str = "attn") -> sp.Matrix:
    """Causal attention with rotary positions, query head h reading key/value head h // n_rep (Ainslie et al. 2023)."""
    n, d = x.shape
    width = d // n_heads
    n_rep = n_heads // (p[f"{key}.W_k"].shape[1] // width)
    q, k = (rotary(product(x, p[f"{key}.W_{c}"]), width, theta, p["positions"]) for c in "qk")
    v = product(x, p[f"{key}.W_v"])
    heads = []
    for m in range(n_heads):
        columns, shared = slice(m * width, (m + 1) * width), slice((m // n_rep) * width, (m // n_rep + 1) * width)
        scores = product(q[:, columns], k[:, shared].T) / sp.sqrt(width)
        weights = sp.Matrix(n, n, lambda i, j: sp.exp(scores[i, j]) / sum(sp.exp(scores[i, t]) for t in range(i + 1))
                            if j <= i else 0)
        heads.append(product(weights, v[:, shared]))
    return product(sp.Matrix.hstack(*heads), p[f"{key}.W_o"])


def swiglu(x: sp.Matrix, p: Params, activation: Callable, key: str = "ffn") -> sp.Matrix:
    """(act(x W_1) ⊙ x W_3) W_2 (Shazeer 2020)."""
    gated = product(x, p[f"{key}.W_1"]).applyfunc(activation).multiply_elementwise(product(x, p[f"{key}.W_3"]))
    return product(gated, p[f"{key}.W_2"])


def _llama(x, p, heads, eps, act, theta=10000):
    """Touvron et al. 2023: RMSNorm pre-norm, rotary grouped-query causal attention, SwiGLU
    (``p["positions"]``: the tokens' positions)."""
    x = x + grouped_attention(rms_norm(x, p, "norm1", eps), p, heads, theta)
    return x + swiglu(rms_norm(x, p, "norm2", eps), p, act)


def _decoder(x, p, heads, eps, act):
    """Vaswani et al. 2017, post-LN: causal self-attention, cross-attention to ``p["memory"]``, feed-forward."""
    x = layer_norm(x + attention(x, p, heads, causal=True), p, "norm1", eps)
    x = layer_norm(x + attention(x, p, heads, "cross", memory=p["memory"]), p, "norm2", eps)
    return layer_norm(x + feed_forward(x, p, act), p, "norm3", eps)


def _decoder_pre_ln(x, p, heads, eps, act):
    x = x + attention(layer_norm(x, p, "norm1", eps), p, heads, causal=True)
    x = x + attention(layer_norm(x, p, "norm2", eps), p, heads, "cross", memory=p["memory"])
    return x + feed_forward(layer_norm(x, p, "norm3", eps), p, act)


def _parallel(x, p, heads, eps, act):
    y = layer_norm(x, p, "norm1", eps)
    return x + attention(y, p, heads) + feed_forward(y, p, act)


def _fields(p, heads, eps, act):
    def a(y):
        return attention(layer_norm(y, p, "norm1", eps), p, heads)

    def f(y):
        return feed_forward(layer_norm(y, p, "norm2", eps), p, act)

    return a, f


def _symmetric_parallel(x, p, heads, eps, act):
    a, f = _fields(p, heads, eps, act)
    first = x + a(x)
    first = first + f(first)
    second = x + f(x)
    second = second + a(second)
    return (first + second) / 2


def _rk2(x, p, heads, eps, act):
    a, f = _fields(p, heads, eps, act)
    k1 = a(x) + f(x)
    y = x + k1
    return x + (k1 + a(y) + f(y)) / 2


REFERENCES = {
    "post-ln": _post_ln, "pre-ln": _pre_ln, "macaron": _macaron, "macaron-pre-ln": _macaron_pre_ln,
    "parallel": _parallel,
    "symmetric-parallel": _symmetric_parallel, "rk2": _rk2, "gpt2": _gpt2, "llama": _llama,
    "decoder": _decoder, "decoder-pre-ln": _decoder_pre_ln,
}


def reference_block(name: str, x: sp.Matrix, params: Params, n_heads: int, eps: sp.Expr,
                    activation: Callable) -> sp.Matrix:
    """One step of the published block ``name``."""
    return REFERENCES[name](x, params, n_heads, eps, activation)


def has_published_reference(scheme: Scheme) -> bool:
    """Whether ``scheme`` is a built-in whose published formula ``REFERENCES`` holds."""
    return scheme.name in REFERENCES and is_builtin(scheme)
