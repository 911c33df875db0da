"""``transformers`` BERT (``BertLayer``, ``BertEncoder``, ``BertModel``) ↔ canonical parameters.

A ``BertLayer`` is the ``post-ln`` scheme: attention, add, LayerNorm, feed-forward, add,
LayerNorm. ``BertModel`` maps its encoder only: the embeddings (which end in their own
LayerNorm) and the pooler are not part of the block equation; feed the stack
``model.embeddings(input_ids)``. Refused: decoders and cross-attention, relative position
attention, activations other than the scheme's (``gelu_new`` and other tanh forms included),
non-standard attention scaling, and LayerNorms with different ε.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .registry import adapter, writer
from .adapted import Adapted
from .arrays import array, linear_weight
from .common import activation_name, check_head_split, check_norms, same_configuration, shared_layers, stack_state, state_dict
from .inspection import check_parts

__all__ = ["read_bert_layer", "read_bert_encoder", "write_bert_layer", "write_bert_encoder"]

#: Canonical name → the ``BertLayer`` state-dict key of the same tensor (a Linear weight transposed).
KEYS = {
    "attn.W_q": "attention.self.query.weight", "attn.b_q": "attention.self.query.bias",
    "attn.W_k": "attention.self.key.weight", "attn.b_k": "attention.self.key.bias",
    "attn.W_v": "attention.self.value.weight", "attn.b_v": "attention.self.value.bias",
    "attn.W_o": "attention.output.dense.weight", "attn.b_o": "attention.output.dense.bias",
    "norm1.gain": "attention.output.LayerNorm.weight", "norm1.bias": "attention.output.LayerNorm.bias",
    "ffn.W_1": "intermediate.dense.weight", "ffn.b_1": "intermediate.dense.bias",
    "ffn.W_2": "output.dense.weight", "ffn.b_2": "output.dense.bias",
    "norm2.gain": "output.LayerNorm.weight", "norm2.bias": "output.LayerNorm.bias",
}

#: The submodules a ``BertLayer`` is read through, and their classes.
BERT_PARTS = {"attention": "BertAttention", "attention.self": "BertSelfAttention", "attention.self.query": "Linear",
              "attention.self.key": "Linear", "attention.self.value": "Linear", "attention.self.dropout": "Dropout",
              "attention.output": "BertSelfOutput", "attention.output.dense": "Linear",
              "attention.output.LayerNorm": "LayerNorm", "attention.output.dropout": "Dropout",
              "intermediate": "BertIntermediate", "intermediate.dense": "Linear", "output": "BertOutput",
              "output.dense": "Linear", "output.LayerNorm": "LayerNorm", "output.dropout": "Dropout"}


def _check_layer(layer: Any) -> None:
    check_parts("BertLayer", layer, BERT_PARTS)
    attention = layer.attention.self
    if layer.is_decoder or getattr(layer, "add_cross_attention", False) or getattr(attention, "is_causal", False):
        raise SplitformerError("BertLayer is a decoder layer (is_decoder/cross-attention); the post-ln scheme is an encoder block")
    relative = getattr(attention, "position_embedding_type", getattr(layer.attention.self.config, "position_embedding_type",
                                                                       "absolute"))
    if relative not in (None, "absolute") or hasattr(attention, "distance_embedding"):
        raise SplitformerError(f"BertLayer uses {relative} position attention; the scheme's attention has no position terms")
    d = layer.attention.output.dense.weight.shape[0]
    check_head_split("BertLayer", d, ("attention.self.num_attention_heads", attention.num_attention_heads),
                     {"attention.self.attention_head_size": attention.attention_head_size},
                     {"attention.self.all_head_size": attention.all_head_size})
    scale = getattr(attention, "scaling", 1 / math.sqrt(attention.attention_head_size))
    if not math.isclose(scale, 1 / math.sqrt(attention.attention_head_size), rel_tol=1e-12):
        raise SplitformerError(f"BertLayer scales attention scores by {scale}, the scheme by 1/sqrt(d_head)")
    for linear in (attention.query, attention.key, attention.value, layer.attention.output.dense,
                   layer.intermediate.dense, layer.output.dense):
        if linear.bias is None:
            raise SplitformerError("BertLayer has a Linear without bias; BERT's post-ln block has all biases")


@adapter("hf", "BertLayer")
def read_bert_layer(layer: Any) -> Adapted:
    """One ``BertLayer`` (encoder): post-ln, the config's activation and ``layer_norm_eps``."""
    _check_layer(layer)
    eps = check_norms("BertLayer", {"attention.output.LayerNorm": layer.attention.output.LayerNorm,
                                    "output.LayerNorm": layer.output.LayerNorm})
    state = dict(layer.named_parameters())
    params = {name: (linear_weight if name.split(".")[1].startswith("W") else array)(state[key])
              for name, key in KEYS.items()}
    if layer.attention.output.LayerNorm.bias is None or layer.output.LayerNorm.bias is None:
        raise SplitformerError("BertLayer has a LayerNorm without bias; BERT's post-ln block has all biases")
    return Adapted(
        scheme="post-ln",
        activation=activation_name("BertLayer", layer.intermediate.intermediate_act_fn),
        layers=(params,),
        n_heads=layer.attention.self.num_attention_heads,
        eps=eps,
        source=("hf", "BertLayer"),
    )


@adapter("hf", "BertEncoder", "BertModel")
def read_bert_encoder(module: Any) -> Adapted:
    """A ``BertEncoder``, or a ``BertModel``'s encoder (embeddings and pooler not mapped)."""
    encoder = getattr(module, "encoder", module)
    config = getattr(module, "config", None)
    for flag in ("is_decoder", "add_cross_attention"):  # BertModel.forward masks causally when config.is_decoder
        if getattr(config, flag, False) is not False:
            raise SplitformerError(f"{type(module).__name__}.config.{flag} is {getattr(config, flag)!r}: its forward "
                                   "is a decoder's (a causal mask, cross-attention); the post-ln scheme is an encoder stack")
    layers = [read_bert_layer(layer) for layer in encoder.layer]
    first = same_configuration(type(module).__name__, layers)
    notes = ()
    if encoder is not module:
        notes = ("BertModel: the encoder is mapped; embeddings and pooler are not "
                 "(feed the stack model.embeddings(input_ids); to_torch writes model.encoder's state dict); "
                 "splitformer.nn.from_hf_encoder reads the whole model",)
    return Adapted(
        scheme=first.scheme, activation=first.activation, layers=tuple(a.params for a in layers),
        n_heads=first.n_heads, eps=first.eps, stack=True, source=("hf", "BertEncoder"), notes=notes,
        tied=shared_layers(f"{type(module).__name__}.layer", list(encoder.layer)),
    )


def _layer_state(params: Any) -> dict[str, np.ndarray]:
    return {key: params[name].T if name.split(".")[1].startswith("W") else params[name] for name, key in KEYS.items()}


@writer("hf", "BertLayer")
def write_bert_layer(adapted: Adapted) -> dict[str, Any]:
    """The state dict of a ``BertLayer``."""
    return state_dict(_layer_state(adapted.params), bias=True)


@writer("hf", "BertEncoder")
def write_bert_encoder(adapted: Adapted) -> dict[str, Any]:
    """The state dict of a ``BertEncoder`` (``model.encoder`` of a ``BertModel``)."""
    return stack_state(adapted, _layer_state, "layer")
