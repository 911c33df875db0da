"""``torch.nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder`` ↔ canonical parameters.

``norm_first=False`` is the ``post-ln`` scheme, ``norm_first=True`` ``pre-ln``; the activation
is ReLU, exact GELU, SiLU or tanh. Refused, each with its own message: another activation (tanh-GELU
included), LayerNorms without affine parameters or with different ε, a mix of biased and
bias-less parts, ``add_bias_kv``/``add_zero_attn`` attention, and stacks whose layers differ.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .registry import adapter, writer
from .adapted import Adapted
from .arrays import array, linear_weight
from .inspection import check_parts
from .common import (activation_name, check_bias, check_norms, final_norm_params, layer_norm_params, same_configuration,
                     shared_layers, stack_state, state_dict, torch_dropout, zero_bias)

__all__ = ["read_encoder_layer", "read_encoder", "write_encoder_layer", "write_encoder"]


def _attention(attention: Any) -> tuple[dict[str, np.ndarray], list[Any]]:
    """Canonical ``attn.*`` parameters and the source's bias tensors (``None`` where absent)."""
    if attention.bias_k is not None or attention.add_zero_attn:
        raise SplitformerError("MultiheadAttention with add_bias_kv or add_zero_attn has no scheme counterpart")
    if attention.in_proj_weight is not None:
        weights = list(attention.in_proj_weight.chunk(3))
    else:
        weights = [attention.q_proj_weight, attention.k_proj_weight, attention.v_proj_weight]
    biases = [None] * 3 if attention.in_proj_bias is None else list(attention.in_proj_bias.chunk(3))
    params = {}
    d = attention.embed_dim
    for name, weight, bias in zip("qkv", weights, biases):
        params[f"attn.W_{name}"] = linear_weight(weight)
        params[f"attn.b_{name}"] = zero_bias(d, params[f"attn.W_{name}"].dtype) if bias is None else array(bias)
    params["attn.W_o"] = linear_weight(attention.out_proj.weight)
    out_bias = attention.out_proj.bias
    params["attn.b_o"] = zero_bias(d, params["attn.W_o"].dtype) if out_bias is None else array(out_bias)
    return params, [attention.in_proj_bias, out_bias]


def _linear(linear: Any, weight: str, bias: str) -> dict[str, np.ndarray]:
    w = linear_weight(linear.weight)
    return {weight: w, bias: zero_bias(w.shape[1], w.dtype) if linear.bias is None else array(linear.bias)}


#: The submodules a ``TransformerEncoderLayer`` is read through, and their classes.
ENCODER_PARTS = {"self_attn": "MultiheadAttention", "self_attn.out_proj": "Linear", "linear1": "Linear",
                 "linear2": "Linear", "norm1": "LayerNorm", "norm2": "LayerNorm", "dropout": "Dropout",
                 "dropout1": "Dropout", "dropout2": "Dropout"}


@adapter("torch", "TransformerEncoderLayer")
def read_encoder_layer(layer: Any) -> Adapted:
    """A ``TransformerEncoderLayer``: post-ln (``norm_first=False``) or pre-ln, ReLU or GELU."""
    check_parts("TransformerEncoderLayer", layer, ENCODER_PARTS)
    activation = activation_name("TransformerEncoderLayer", layer.activation, tanh_gelu=False)
    # the activation torch's fast path computes; 0: no fast path (torch.relu, a callable of one's own), the slow
    # path computes layer.activation, which was read above
    fast = getattr(layer, "activation_relu_or_gelu", None)
    if activation == "gelu-tanh" and fast == 2:
        raise SplitformerError("TransformerEncoderLayer.activation is GELU(approximate='tanh'), which torch's layer "
                               "computes outside its fast path only: its fast path (eval, no grad) computes the exact "
                               "GELU (activation_relu_or_gelu=2), so the layer computes two functions")
    if fast and fast != {"relu": 1, "gelu": 2}.get(activation, 0):
        raise SplitformerError(f"TransformerEncoderLayer.activation ({activation}) was replaced after construction; "
                               f"torch's fast path still computes activation_relu_or_gelu={fast}")
    attention, bias_tensors = _attention(layer.self_attn)
    params = attention
    params |= _linear(layer.linear1, "ffn.W_1", "ffn.b_1") | _linear(layer.linear2, "ffn.W_2", "ffn.b_2")
    eps = check_norms("TransformerEncoderLayer", {"norm1": layer.norm1, "norm2": layer.norm2})
    params |= layer_norm_params("norm1", layer.norm1) | layer_norm_params("norm2", layer.norm2)
    bias_tensors += [layer.linear1.bias, layer.linear2.bias, layer.norm1.bias, layer.norm2.bias]
    dropout = torch_dropout(layer, [layer.self_attn])
    notes = () if layer.self_attn.batch_first else (
        "the source takes (tokens, batch, d) (batch_first=False), and so does the Block that build() makes; "
        "the NumPy forward takes (batch, tokens, d)",)
    return Adapted(
        scheme="pre-ln" if layer.norm_first else "post-ln",
        activation=activation,
        layers=(params,),
        n_heads=layer.self_attn.num_heads,
        eps=eps,
        bias=check_bias("TransformerEncoderLayer", bias_tensors),
        source=("torch", "TransformerEncoderLayer"),
        notes=notes,
        batch_first=layer.self_attn.batch_first,
        dropout=dropout,
    )


@adapter("torch", "TransformerEncoder")
def read_encoder(encoder: Any) -> Adapted:
    """An ``nn.TransformerEncoder``: its layers and its final ``norm`` (if any)."""
    layers = [read_encoder_layer(layer) for layer in encoder.layers]
    first = same_configuration("TransformerEncoder", layers)
    final = final_norm_params("TransformerEncoder", encoder.norm, first) if encoder.norm is not None else None
    return Adapted(
        scheme=first.scheme, activation=first.activation, layers=tuple(a.params for a in layers),
        n_heads=first.n_heads, eps=first.eps, bias=first.bias, final_norm=final, stack=True,
        tied=shared_layers("TransformerEncoder.layers", list(encoder.layers)),
        source=("torch", "TransformerEncoder"), notes=first.notes + _nested_note(encoder), batch_first=first.batch_first,
        dropout=first.dropout,
    )


def _nested_note(encoder: Any) -> tuple[str, ...]:
    """With nested tensors on (torch's default), the encoder's eval fast path returns 0 at padded tokens."""
    if not getattr(encoder, "enable_nested_tensor", False):
        return ()
    return ("enable_nested_tensor=True: under a src_key_padding_mask, torch's eval fast path returns 0 at padded "
            "tokens, which the generated Stack computes like any other; valid tokens agree, padded rows do not",)


@writer("torch", "TransformerEncoderLayer")
def write_encoder_layer(adapted: Adapted) -> dict[str, Any]:
    """The state dict of a ``TransformerEncoderLayer`` built with the source's configuration."""
    return state_dict(_layer_state(adapted.params), adapted.bias)


def _layer_state(params: Any) -> dict[str, np.ndarray]:
    return {
        "self_attn.in_proj_weight": np.concatenate([params[f"attn.W_{n}"].T for n in "qkv"]),
        "self_attn.in_proj_bias": np.concatenate([params[f"attn.b_{n}"] for n in "qkv"]),
        "self_attn.out_proj.weight": params["attn.W_o"].T,
        "self_attn.out_proj.bias": params["attn.b_o"],
        "linear1.weight": params["ffn.W_1"].T,
        "linear1.bias": params["ffn.b_1"],
        "linear2.weight": params["ffn.W_2"].T,
        "linear2.bias": params["ffn.b_2"],
        "norm1.weight": params["norm1.gain"],
        "norm1.bias": params["norm1.bias"],
        "norm2.weight": params["norm2.gain"],
        "norm2.bias": params["norm2.bias"],
    }


@writer("torch", "TransformerEncoder")
def write_encoder(adapted: Adapted) -> dict[str, Any]:
    """The state dict of an ``nn.TransformerEncoder`` (layers, then ``norm``)."""
    return stack_state(adapted, _layer_state, "layers")
