"""``torch.nn.TransformerDecoderLayer`` and ``nn.TransformerDecoder`` ↔ canonical parameters of ``decoder`` /
``decoder-pre-ln``.

``self_attn`` is the self-attention ``attn``, ``multihead_attn`` the cross-attention ``cross``,
``linear1``/``linear2`` the feed-forward ``ffn``, ``norm1``–``norm3`` the three projections.
``W`` is the transpose of a ``torch.nn.Linear`` weight; a layer built with ``bias=False`` maps to
zero biases.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .arrays import array as _array
from .registry import adapter, writer
from .adapted import Adapted
from .common import (check_bias, final_norm_params, same_configuration, shared_layers, stack_state, state_dict,
                     torch_dropout)
from .inspection import check_parts, library_name

__all__ = ["decoder_layer_params", "decoder_layer_config", "read_decoder_layer", "read_decoder", "write_decoder_layer",
           "write_decoder"]


def _attention(prefix: str, attention: Any) -> dict[str, np.ndarray]:
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
        params[f"{prefix}.W_{name}"], params[f"{prefix}.b_{name}"] = weight.T.copy(), bias
    params[f"{prefix}.W_o"] = _array(attention.out_proj.weight).T.copy()
    params[f"{prefix}.b_o"] = (np.zeros(d, dtype=dtype) if attention.out_proj.bias is None
                               else _array(attention.out_proj.bias))
    return params


def decoder_layer_config(layer: Any) -> dict[str, Any]:
    """The scheme (``decoder`` or ``decoder-pre-ln``), activation, heads and ε; refuses the rest."""
    import torch

    activation = layer.activation
    names = {torch.nn.functional.relu: "relu", torch.nn.functional.gelu: "gelu"}
    if activation in names:
        name = names[activation]
    elif library_name(activation) == "ReLU":
        name = "relu"
    elif library_name(activation) == "GELU" and activation.approximate == "none":
        name = "gelu"
    else:
        raise SplitformerError(f"TransformerDecoderLayer activation {activation!r} is not implemented (relu, gelu)")
    if not layer.self_attn.batch_first:
        raise SplitformerError("TransformerDecoderLayer with batch_first=False: the generated code takes "
                               "(batch, tokens, d); build the layer with batch_first=True")
    eps = {layer.norm1.eps, layer.norm2.eps, layer.norm3.eps}
    if len(eps) != 1:
        raise SplitformerError(f"TransformerDecoderLayer's LayerNorms have different ε ({sorted(eps)})")
    if layer.self_attn.num_heads != layer.multihead_attn.num_heads:
        raise SplitformerError("TransformerDecoderLayer's self- and cross-attention have different head counts")
    return {"scheme": "decoder-pre-ln" if layer.norm_first else "decoder", "activation": name,
            "n_heads": layer.self_attn.num_heads, "eps": eps.pop()}


def decoder_layer_params(layer: Any) -> dict[str, np.ndarray]:
    """The canonical parameters of a ``torch.nn.TransformerDecoderLayer``."""
    params = _attention("attn", layer.self_attn) | _attention("cross", layer.multihead_attn)
    d = layer.self_attn.embed_dim
    for index in (1, 2, 3):
        norm = getattr(layer, f"norm{index}")
        params[f"norm{index}.gain"] = _array(norm.weight)
        params[f"norm{index}.bias"] = np.zeros(d, dtype=params["attn.W_q"].dtype) if norm.bias is None else _array(norm.bias)
    params["ffn.W_1"] = _array(layer.linear1.weight).T.copy()
    params["ffn.W_2"] = _array(layer.linear2.weight).T.copy()
    for name, linear in (("ffn.b_1", layer.linear1), ("ffn.b_2", layer.linear2)):
        params[name] = (np.zeros(linear.out_features, dtype=params["attn.W_q"].dtype) if linear.bias is None
                        else _array(linear.bias))
    return params


#: The submodules a ``TransformerDecoderLayer`` is read through, and their classes.
DECODER_PARTS = {"self_attn": "MultiheadAttention", "self_attn.out_proj": "Linear", "multihead_attn": "MultiheadAttention",
                 "multihead_attn.out_proj": "Linear", "linear1": "Linear", "linear2": "Linear", "norm1": "LayerNorm",
                 "norm2": "LayerNorm", "norm3": "LayerNorm"}


@adapter("torch", "TransformerDecoderLayer")
def read_decoder_layer(layer: Any) -> Adapted:
    """One ``TransformerDecoderLayer``: ``decoder`` (post-LN) or ``decoder-pre-ln`` (``norm_first``), causal."""
    check_parts("TransformerDecoderLayer", layer, DECODER_PARTS)
    config = decoder_layer_config(layer)
    biases = [attention.in_proj_bias for attention in (layer.self_attn, layer.multihead_attn)]
    biases += [layer.self_attn.out_proj.bias, layer.multihead_attn.out_proj.bias, layer.linear1.bias, layer.linear2.bias]
    biases += [getattr(layer, f"norm{index}").bias for index in (1, 2, 3)]
    return Adapted(scheme=config["scheme"], activation=config["activation"], layers=(decoder_layer_params(layer),),
                   n_heads=config["n_heads"], eps=config["eps"], source=("torch", "TransformerDecoderLayer"),
                   bias=check_bias("TransformerDecoderLayer", biases), options={"causal": True},
                   dropout=torch_dropout(layer, [layer.self_attn, layer.multihead_attn]))


@adapter("torch", "TransformerDecoder")
def read_decoder(decoder: Any) -> Adapted:
    """An ``nn.TransformerDecoder``: its layers and its final ``norm`` (if any), a causal ``Stack``."""
    layers = [read_decoder_layer(layer) for layer in decoder.layers]
    first = same_configuration("TransformerDecoder", layers)
    final = final_norm_params("TransformerDecoder", decoder.norm, first) if decoder.norm is not None else None
    return Adapted(scheme=first.scheme, activation=first.activation, layers=tuple(a.params for a in layers),
                   n_heads=first.n_heads, eps=first.eps, bias=first.bias, final_norm=final, stack=True,
                   tied=shared_layers("TransformerDecoder.layers", list(decoder.layers)),
                   source=("torch", "TransformerDecoder"), options={"causal": True}, dropout=first.dropout)


def _layer_state(p: Any) -> dict[str, np.ndarray]:
    """A ``TransformerDecoderLayer``'s arrays under its state dict's names, in its order."""
    arrays = {}
    for prefix, key in (("attn", "self_attn"), ("cross", "multihead_attn")):
        arrays[f"{key}.in_proj_weight"] = np.concatenate([p[f"{prefix}.W_{c}"].T for c in "qkv"], axis=0)
        arrays[f"{key}.in_proj_bias"] = np.concatenate([p[f"{prefix}.b_{c}"] for c in "qkv"])
        arrays[f"{key}.out_proj.weight"], arrays[f"{key}.out_proj.bias"] = p[f"{prefix}.W_o"].T, p[f"{prefix}.b_o"]
    arrays["linear1.weight"], arrays["linear1.bias"] = p["ffn.W_1"].T, p["ffn.b_1"]
    arrays["linear2.weight"], arrays["linear2.bias"] = p["ffn.W_2"].T, p["ffn.b_2"]
    for index in (1, 2, 3):
        arrays[f"norm{index}.weight"], arrays[f"norm{index}.bias"] = p[f"norm{index}.gain"], p[f"norm{index}.bias"]
    return arrays


@writer("torch", "TransformerDecoderLayer")
def write_decoder_layer(adapted: Adapted) -> dict[str, Any]:
    """The state dict of a ``TransformerDecoderLayer`` (``batch_first=True``)."""
    return state_dict(_layer_state(adapted.params), adapted.bias)


@writer("torch", "TransformerDecoder")
def write_decoder(adapted: Adapted) -> dict[str, Any]:
    """The state dict of an ``nn.TransformerDecoder`` (layers, then ``norm``)."""
    return stack_state(adapted, _layer_state, "layers")
