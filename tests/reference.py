"""Plain NumPy references written from the published formulas (not from the generator)."""

import math

import numpy as np


def layer_norm(x, gain, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gain + bias


def attention(x, p, n_heads, mask=None):
    """Multi-head attention; ``mask`` is bool (batch, tokens, tokens), True = attend."""
    b, n, d = x.shape
    h = d // n_heads

    def heads(t):
        return t.reshape(b, n, n_heads, h).transpose(0, 2, 1, 3)

    q, k, v = (heads(x @ p[f"attn.W_{c}"] + p[f"attn.b_{c}"]) for c in "qkv")
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(h)
    if mask is not None:
        scores = np.where(mask[:, None], scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(-1, keepdims=True)
    out = (weights @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
    return out @ p["attn.W_o"] + p["attn.b_o"]


ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0),
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "tanh": np.tanh,
}


def feed_forward(x, p, prefix="ffn", activation="relu"):
    hidden = ACTIVATIONS[activation](x @ p[f"{prefix}.W_1"] + p[f"{prefix}.b_1"])
    return hidden @ p[f"{prefix}.W_2"] + p[f"{prefix}.b_2"]


def norm(x, p, name, eps):
    return layer_norm(x, p[f"{name}.gain"], p[f"{name}.bias"], eps)


def macaron(x, p, n_heads, eps):
    """Lu et al. 2019: ½ FFN, attention, ½ FFN, each followed by LayerNorm."""
    x = norm(x + 0.5 * feed_forward(x, p, "ffn_pre"), p, "norm1", eps)
    x = norm(x + attention(x, p, n_heads), p, "norm2", eps)
    return norm(x + 0.5 * feed_forward(x, p, "ffn_post"), p, "norm3", eps)


def parallel(x, p, n_heads, eps):
    """GPT-J / PaLM: x + Attn(LN(x)) + FFN(LN(x)) with one LayerNorm."""
    y = norm(x, p, "norm1", eps)
    return x + attention(y, p, n_heads) + feed_forward(y, p)


def _attention_field(x, p, n_heads, eps):
    return attention(norm(x, p, "norm1", eps), p, n_heads)


def _ffn_field(x, p, eps):
    return feed_forward(norm(x, p, "norm2", eps), p)


def symmetric_parallel(x, p, n_heads, eps):
    """½ (attention then feed-forward) + ½ (feed-forward then attention), pre-LN fields."""
    first = x + _attention_field(x, p, n_heads, eps)
    first = first + _ffn_field(first, p, eps)
    second = x + _ffn_field(x, p, eps)
    second = second + _attention_field(second, p, n_heads, eps)
    return 0.5 * (first + second)


def rk2(x, p, n_heads, eps):
    """Heun's method for G(x) = Attn(LN₁ x) + FFN(LN₂ x), shared parameters."""
    def field(y):
        return _attention_field(y, p, n_heads, eps) + _ffn_field(y, p, eps)

    k1 = field(x)
    k2 = field(x + k1)
    return x + 0.5 * (k1 + k2)


def random_params(table, d, d_ff, rng, scale=0.5, **sizes):
    sizes = {"d": d, "d_ff": d_ff, **sizes}
    return {name: rng.standard_normal(tuple(sizes[a] for a in axes)) * scale for name, axes in table.items()}


def rk4(x, p, n_heads, eps):
    """The classic fourth-order Runge–Kutta step of the same field, shared parameters."""
    def field(y):
        return _attention_field(y, p, n_heads, eps) + _ffn_field(y, p, eps)

    k1 = field(x)
    k2 = field(x + 0.5 * k1)
    k3 = field(x + 0.5 * k2)
    k4 = field(x + k3)
    return x + (k1 + 2 * k2 + 2 * k3 + k4) / 6
