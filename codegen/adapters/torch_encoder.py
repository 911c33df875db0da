"""``torch.nn.TransformerEncoderLayer`` → canonical parameters (NumPy arrays)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["from_torch"]


def _array(tensor: Any) -> np.ndarray:
    return tensor.detach().cpu().numpy().copy()


def _bias(linear_bias: Any, size: int, dtype: np.dtype) -> np.ndarray:
    return np.zeros(size, dtype=dtype) if linear_bias is None else _array(linear_bias)


def from_torch(layer: Any) -> dict[str, np.ndarray]:
    """The canonical parameters of a ``torch.nn.TransformerEncoderLayer``.

    ``W`` is the transpose of a ``torch.nn.Linear`` weight (row-vector convention
    ``u @ W + b``); a layer built with ``bias=False`` maps to zero biases.
    """
    attention = layer.self_attn
    d = attention.embed_dim
    if attention.in_proj_weight is not None:
        weights = np.split(_array(attention.in_proj_weight), 3, axis=0)
    else:
        weights = [_array(w) for w in (attention.q_proj_weight, attention.k_proj_weight, attention.v_proj_weight)]
    dtype = weights[0].dtype
    biases = (np.split(_array(attention.in_proj_bias), 3) if attention.in_proj_bias is not None
              else [np.zeros(d, dtype=dtype)] * 3)
    params = {}
    for name, weight, bias in zip("qkv", weights, biases):
        params[f"attn.W_{name}"] = weight.T.copy()
        params[f"attn.b_{name}"] = bias
    params["attn.W_o"] = _array(attention.out_proj.weight).T.copy()
    params["attn.b_o"] = _bias(attention.out_proj.bias, d, dtype)
    for name in ("norm1", "norm2"):
        norm = getattr(layer, name)
        params[f"{name}.gain"] = _array(norm.weight) if norm.weight is not None else np.ones(d, dtype=dtype)
        params[f"{name}.bias"] = _bias(norm.bias, d, dtype)
    params["ffn.W_1"] = _array(layer.linear1.weight).T.copy()
    params["ffn.b_1"] = _bias(layer.linear1.bias, layer.linear1.out_features, dtype)
    params["ffn.W_2"] = _array(layer.linear2.weight).T.copy()
    params["ffn.b_2"] = _bias(layer.linear2.bias, d, dtype)
    return params
