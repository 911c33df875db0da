"""``transformers`` ``LlamaDecoderLayer`` → canonical parameters of the ``llama`` scheme.

``W`` is the transpose of each ``nn.Linear`` weight (row-vector convention ``u @ W``); the
gated feed-forward reads ``gate_proj`` as ``W_1`` (through silu), ``up_proj`` as ``W_3`` (the
gate) and ``down_proj`` as ``W_2``. What the emitted code does not implement is refused:
RoPE scaling variants (any ``rope_type`` but ``default``), partial rotary factors, sliding
windows, biases, another activation, a head width other than ``d / n_heads``, a score scale
(``self_attn.scaling``) other than ``1/√head_dim``, a non-causal attention (``self_attn.is_causal``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .arrays import array, linear_weight
from .registry import adapter, writer
from .adapted import Adapted
from .common import activation_name, check_attention, state_dict
from .inspection import check_parts
from .rope import is_frequencies_of

__all__ = ["llama_layer_params", "llama_layer_config", "check_rotary", "read_llama_layer", "write_llama_layer"]

#: Canonical name → the ``LlamaDecoderLayer`` state-dict key (a Linear weight transposed).
KEYS = {
    "norm1.gain": "input_layernorm.weight", "attn.W_q": "self_attn.q_proj.weight",
    "attn.W_k": "self_attn.k_proj.weight", "attn.W_v": "self_attn.v_proj.weight",
    "attn.W_o": "self_attn.o_proj.weight", "norm2.gain": "post_attention_layernorm.weight",
    "ffn.W_1": "mlp.gate_proj.weight", "ffn.W_3": "mlp.up_proj.weight", "ffn.W_2": "mlp.down_proj.weight",
}


#: The submodules a ``LlamaDecoderLayer`` is read through, and their classes.
LLAMA_PARTS = {"input_layernorm": "LlamaRMSNorm", "post_attention_layernorm": "LlamaRMSNorm",
               **{f"self_attn.{name}_proj": "Linear" for name in "qkvo"},
               **{f"mlp.{name}_proj": "Linear" for name in ("gate", "up", "down")}}



def llama_layer_config(layer: Any) -> dict[str, Any]:
    """``n_heads``, ``n_kv_heads``, ``eps`` and ``rope_theta`` of a ``LlamaDecoderLayer``; refuses the rest."""
    check_parts("LlamaDecoderLayer", layer, LLAMA_PARTS)
    config = layer.self_attn.config
    d, n_heads = config.hidden_size, config.num_attention_heads
    rope = dict(getattr(config, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise SplitformerError(f"LlamaDecoderLayer uses RoPE scaling {rope_type!r}; the llama scheme implements "
                               "the default rotary embedding only")
    if rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) != 1.0:
        raise SplitformerError("LlamaDecoderLayer rotates part of each head (partial_rotary_factor ≠ 1); "
                               "the llama scheme rotates every feature pair")
    if getattr(config, "sliding_window", None) is not None:
        raise SplitformerError(f"LlamaDecoderLayer uses a sliding window ({config.sliding_window}); "
                               "the llama scheme's causal support is x̃ ≤ x")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise SplitformerError(f"LlamaDecoderLayer uses activation {config.hidden_act!r}; the llama scheme's "
                               "gated feed-forward uses silu (SwiGLU)")
    if activation_name("LlamaDecoderLayer.mlp.act_fn", layer.mlp.act_fn) != "silu":
        raise SplitformerError("LlamaDecoderLayer.mlp.act_fn is not silu; the llama scheme's gated feed-forward uses silu")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise SplitformerError("LlamaDecoderLayer has biases (attention_bias or mlp_bias); the llama scheme has none")
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        if getattr(layer.get_submodule(name), "bias", None) is not None:
            raise SplitformerError(f"LlamaDecoderLayer.{name} has a bias; the llama scheme has none")
    if layer.self_attn.head_dim * n_heads != d:
        raise SplitformerError(f"LlamaDecoderLayer has head_dim = {layer.self_attn.head_dim} ≠ hidden_size / "
                               f"num_attention_heads = {d // n_heads}")
    check_attention("LlamaDecoderLayer", "self_attn", layer.self_attn, layer.self_attn.head_dim, "llama")
    eps = {layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon}
    if len(eps) != 1:
        raise SplitformerError(f"LlamaDecoderLayer's RMSNorms have different ε ({', '.join(map(str, sorted(eps)))})")
    theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    if getattr(layer.self_attn, "rotary_emb", None) is not None:  # transformers 4's layers hold their own
        check_rotary("LlamaDecoderLayer.self_attn.rotary_emb", layer.self_attn.rotary_emb, layer.self_attn.head_dim, theta)
    return {"n_heads": n_heads, "n_kv_heads": config.num_key_value_heads, "eps": float(eps.pop()), "rope_theta": theta}


def check_rotary(owner: str, rotary: Any, head_dim: int, theta: float) -> None:
    """Refuse a rotary embedding whose ``inv_freq`` buffer is not exactly the default RoPE frequencies of ``theta``
    (``rope.is_frequencies_of``: transformers' float32 computation, or θ^(-2k/head_dim) in float64) or whose
    ``attention_scaling`` is not 1, as the llama scheme computes."""
    buffer = rotary.inv_freq
    expected = theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if not buffer.is_floating_point() or tuple(buffer.shape) != expected.shape:
        raise SplitformerError(f"{owner}.inv_freq is {tuple(buffer.shape)} {buffer.dtype}; the llama scheme's rotary "
                               f"embedding has {expected.size} floating frequencies (head_dim / 2)")
    if not is_frequencies_of(buffer, theta, head_dim):
        worst = float(np.max(np.abs(array(buffer) / expected - 1.0)))
        rounded = "" if buffer.element_size() >= 4 else \
            (f" ({buffer.dtype}: .to() rounds it, and transformers rotates by the rounded values; "
             "from_pretrained(dtype=...) keeps it in float32)")
        raise SplitformerError(f"{owner}.inv_freq differs from the default RoPE frequencies of rope_theta={theta:g} "
                               f"(relative {worst:.2g}){rounded}, which transformers computes in float32; the llama "
                               "scheme computes theta^(-2k/head_dim)")
    scaling = float(getattr(rotary, "attention_scaling", 1.0))
    if not math.isclose(scaling, 1.0, rel_tol=1e-12):
        raise SplitformerError(f"{owner}.attention_scaling is {scaling:g}; the llama scheme's rotary embedding scales "
                               "cos and sin by 1")


def llama_layer_params(layer: Any) -> dict[str, np.ndarray]:
    """The canonical parameters of a ``LlamaDecoderLayer`` (``norm1``, ``attn``, ``norm2``, ``ffn``)."""
    attention, mlp = layer.self_attn, layer.mlp
    return {
        "norm1.gain": array(layer.input_layernorm.weight),
        "attn.W_q": linear_weight(attention.q_proj.weight), "attn.W_k": linear_weight(attention.k_proj.weight),
        "attn.W_v": linear_weight(attention.v_proj.weight), "attn.W_o": linear_weight(attention.o_proj.weight),
        "norm2.gain": array(layer.post_attention_layernorm.weight),
        "ffn.W_1": linear_weight(mlp.gate_proj.weight), "ffn.W_3": linear_weight(mlp.up_proj.weight),
        "ffn.W_2": linear_weight(mlp.down_proj.weight),
    }


@adapter("hf", "LlamaDecoderLayer")
def read_llama_layer(layer: Any) -> Adapted:
    """One ``LlamaDecoderLayer``: the causal ``llama`` scheme; heads, key/value heads, ε, RoPE θ.

    Note: transformers' ``LlamaRMSNorm`` computes in float32 whatever the input dtype; the
    generated code computes in the input's dtype (the same formula, exact in float64).
    """
    config = llama_layer_config(layer)
    return Adapted(scheme="llama", activation="silu", layers=(llama_layer_params(layer),), n_heads=config["n_heads"],
                   eps=config["eps"], source=("hf", "LlamaDecoderLayer"), bias=False,
                   options={"n_kv_heads": config["n_kv_heads"], "rope_theta": config["rope_theta"], "causal": True},
                   notes=("LlamaRMSNorm rounds to float32 inside; the generated RMSNorm keeps the input dtype",))


@writer("hf", "LlamaDecoderLayer")
def write_llama_layer(adapted: Adapted) -> dict[str, Any]:
    """The state dict of a ``LlamaDecoderLayer``."""
    p = adapted.params
    return state_dict({key: p[name].T if name.split(".")[1].startswith("W") else p[name]
                       for name, key in KEYS.items()}, bias=False)
