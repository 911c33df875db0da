"""``timm`` ViT (``Block``, ``VisionTransformer``) ↔ canonical parameters.

A timm ``Block`` is the ``pre-ln`` scheme: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``
with a fused ``qkv`` projection. ``VisionTransformer`` maps its ``blocks`` and final ``norm``;
the patch embedding, class token, position embedding, pooling and head are not part of the
block equation (feed the stack the embedded tokens). Refused: LayerScale (``init_values``),
q/k normalization, attention-output or MLP normalization, another attention or MLP class, any
submodule or parameter the adapter does not map (``Attention(gated=True)``'s ``gate``),
activations other than the scheme's, non-standard head size or scaling, and a mix of biased
and bias-less projections (timm's ``Block`` default ``qkv_bias=False`` with a biased ``proj``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .registry import adapter, writer
from .adapted import Adapted
from .arrays import array, linear_weight
from .inspection import check_exact_class, check_only_parts, library_name, runs_one_of
from .common import (activation_name, check_bias, check_norms, final_norm_params, layer_norm_params,
                     same_configuration, shared_layers, stack_state, state_dict, zero_bias)

__all__ = ["read_vit_block", "read_vision_transformer", "write_vit_block", "write_vision_transformer"]


#: The timm classes the adapter reads, exactly (timm's beit, nest, volo, pvt_v2 and sam define other classes of
#: these names, which compute otherwise).
TIMM_BLOCK, TIMM_ATTENTION, TIMM_MLP = ("timm.models.vision_transformer.Block", "timm.layers.attention.Attention",
                                        "timm.layers.mlp.Mlp")
TIMM_VISION_TRANSFORMER = "timm.models.vision_transformer.VisionTransformer"
#: The submodules a timm ``Block`` may have and their classes (``mlp.act``: read by ``activation_name``).
BLOCK_PARTS = {"norm1": "LayerNorm", "attn": TIMM_ATTENTION, "attn.qkv": "Linear", "attn.q_norm": "Identity",
               "attn.k_norm": "Identity", "attn.attn_drop": "Dropout", "attn.norm": "Identity", "attn.proj": "Linear",
               "attn.proj_drop": "Dropout", "ls1": "Identity", "drop_path1": ("Identity", "DropPath"),
               "norm2": "LayerNorm", "mlp": TIMM_MLP, "mlp.fc1": "Linear", "mlp.act": None, "mlp.drop1": "Dropout",
               "mlp.norm": "Identity", "mlp.fc2": "Linear", "mlp.drop2": "Dropout", "ls2": "Identity",
               "drop_path2": ("Identity", "DropPath")}
#: The parameters a timm ``Block`` may have: those the adapter maps.
BLOCK_PARAMETERS = frozenset(f"{part}.{kind}" for part in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2")
                             for kind in ("weight", "bias"))


def _identity(owner: str, module: Any, what: str) -> None:
    if not runs_one_of(module, ("Identity",)):
        raise SplitformerError(f"{owner} has {what} ({type(module).__name__}, a {library_name(module)}); "
                               "the pre-ln scheme has none")


def _check_block(block: Any) -> None:
    check_exact_class("timm Block", block, TIMM_BLOCK)
    attention, mlp = block.attn, block.mlp
    check_exact_class("timm Block.attn", attention, TIMM_ATTENTION)
    check_exact_class("timm Block.mlp", mlp, TIMM_MLP)
    for name, what in (("ls1", "LayerScale (init_values)"), ("ls2", "LayerScale (init_values)")):
        _identity("timm Block", getattr(block, name), what)
    for name, what in (("q_norm", "q/k normalization (qk_norm)"), ("k_norm", "q/k normalization (qk_norm)"),
                       ("norm", "attention-output normalization (scale_attn_norm)")):
        _identity("timm Block attn", getattr(attention, name), what)
    _identity("timm Block mlp", mlp.norm, "hidden normalization (scale_mlp_norm)")
    check_only_parts("timm Block", block, BLOCK_PARTS, BLOCK_PARAMETERS)
    d = block.norm1.weight.shape[0]
    if attention.num_heads * attention.head_dim != d or attention.attn_dim != d:
        raise SplitformerError(f"timm Block attention width {attention.num_heads}×{attention.head_dim} (attn.attn_dim "
                               f"= {attention.attn_dim}) differs from dim {d}; the scheme's heads split d")
    if not math.isclose(attention.scale, attention.head_dim ** -0.5, rel_tol=1e-12):
        raise SplitformerError(f"timm Block scales scores by {attention.scale}, the scheme by 1/sqrt(head_dim)")


@adapter("timm", "Block")
def read_vit_block(block: Any) -> Adapted:
    """One timm ViT ``Block``: pre-ln, ``mlp.act`` as activation, the LayerNorms' ε."""
    _check_block(block)
    attention, mlp = block.attn, block.mlp
    eps = check_norms("timm Block", {"norm1": block.norm1, "norm2": block.norm2})
    bias = check_bias("timm Block", [attention.qkv.bias, attention.proj.bias, mlp.fc1.bias, mlp.fc2.bias,
                                     block.norm1.bias, block.norm2.bias])
    params: dict[str, np.ndarray] = {}
    weights = attention.qkv.weight.chunk(3)
    biases = attention.qkv.bias.chunk(3) if attention.qkv.bias is not None else [None] * 3
    for name, weight, qkv_bias in zip("qkv", weights, biases):
        params[f"attn.W_{name}"] = linear_weight(weight)
        params[f"attn.b_{name}"] = zero_bias(weight.shape[0], params["attn.W_q"].dtype) if qkv_bias is None else array(qkv_bias)
    for name, linear in (("attn.W_o", attention.proj), ("ffn.W_1", mlp.fc1), ("ffn.W_2", mlp.fc2)):
        params[name] = linear_weight(linear.weight)
        bias_name = name.replace(".W_", ".b_")
        params[bias_name] = zero_bias(params[name].shape[1], params[name].dtype) if linear.bias is None else array(linear.bias)
    params |= layer_norm_params("norm1", block.norm1) | layer_norm_params("norm2", block.norm2)
    return Adapted(scheme="pre-ln", activation=activation_name("timm Block mlp", mlp.act), layers=(params,),
                   n_heads=attention.num_heads, eps=eps, bias=bias, source=("timm", "Block"))


@adapter("timm", "VisionTransformer")
def read_vision_transformer(model: Any) -> Adapted:
    """A timm ``VisionTransformer``'s blocks and final ``norm`` (embeddings, pooling, head not mapped)."""
    layers = []
    check_exact_class("VisionTransformer", model, TIMM_VISION_TRANSFORMER)
    for index, block in enumerate(model.blocks):
        check_exact_class(f"VisionTransformer block {index}", block, TIMM_BLOCK)
        layers.append(read_vit_block(block))
    first = same_configuration("VisionTransformer", layers)
    final = None if runs_one_of(model.norm, ("Identity",)) else final_norm_params("VisionTransformer", model.norm, first)
    note = ("VisionTransformer: blocks and final norm are mapped; patch embedding, class and register tokens, "
            "position embedding, the norm before the blocks (norm_pre), pooling (and fc_norm) and head are not: "
            "the stack takes the tokens blocks[0] takes; to_torch writes the mapped keys only; "
            "from_timm(model, network='vit') reads the whole model")
    return Adapted(scheme=first.scheme, activation=first.activation, layers=tuple(a.params for a in layers),
                   n_heads=first.n_heads, eps=first.eps, bias=first.bias, final_norm=final, stack=True,
                   tied=shared_layers("VisionTransformer.blocks", list(model.blocks)), source=("timm", "VisionTransformer"),
                   notes=(note,))


def _block_state(params: Any) -> dict[str, np.ndarray]:
    return {
        "norm1.weight": params["norm1.gain"], "norm1.bias": params["norm1.bias"],
        "attn.qkv.weight": np.concatenate([params[f"attn.W_{n}"].T for n in "qkv"]),
        "attn.qkv.bias": np.concatenate([params[f"attn.b_{n}"] for n in "qkv"]),
        "attn.proj.weight": params["attn.W_o"].T, "attn.proj.bias": params["attn.b_o"],
        "norm2.weight": params["norm2.gain"], "norm2.bias": params["norm2.bias"],
        "mlp.fc1.weight": params["ffn.W_1"].T, "mlp.fc1.bias": params["ffn.b_1"],
        "mlp.fc2.weight": params["ffn.W_2"].T, "mlp.fc2.bias": params["ffn.b_2"],
    }


@writer("timm", "Block")
def write_vit_block(adapted: Adapted) -> dict[str, Any]:
    """The state dict of a timm ViT ``Block``."""
    return state_dict(_block_state(adapted.params), adapted.bias)


@writer("timm", "VisionTransformer")
def write_vision_transformer(adapted: Adapted) -> dict[str, Any]:
    """The ``blocks.*`` and ``norm.*`` entries of a ``VisionTransformer``'s state dict."""
    return stack_state(adapted, _block_state, "blocks")
