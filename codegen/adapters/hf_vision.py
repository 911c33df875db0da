"""``transformers`` vision models (``ViTModel``, ``ViTForImageClassification``) → canonical parameters.

The result, ``AdaptedModel``, holds the flat canonical mapping of a whole generated model
(``embed.W``, ``layers.0.attn.W_q``, …, ``final_norm.gain``, ``head.W``) and the keyword
configuration of its ``forward``/``logits``. Configurations the generated model does not
compute are refused by name, never approximated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from . import adapter

__all__ = ["AdaptedModel", "from_hf_vit"]


@dataclass(frozen=True)
class AdaptedModel:
    """A whole model read from a source: ``model`` (built-in name), ``params``, ``config``."""

    model: str
    params: Mapping[str, np.ndarray]
    config: Mapping[str, Any]
    source: tuple[str, str]
    notes: tuple[str, ...] = field(default=())

    @property
    def module_name(self) -> str:
        return self.model.replace("-", "_")

    def astype(self, dtype: Any) -> "AdaptedModel":
        return replace(self, params={name: value.astype(dtype) for name, value in self.params.items()})


def _array(tensor: Any) -> np.ndarray:
    return tensor.detach().cpu().numpy().copy()


def _dense(params: dict, weight_name: str, bias_name: str, linear: Any) -> None:
    """``W = weightᵀ`` (row-vector convention), ``b`` (zeros where the source has none)."""
    params[weight_name] = _array(linear.weight).T.copy()
    params[bias_name] = (np.zeros(linear.out_features, dtype=params[weight_name].dtype) if linear.bias is None
                         else _array(linear.bias))


def _norm(params: dict, prefix: str, norm: Any) -> None:
    params[f"{prefix}.gain"] = _array(norm.weight)
    params[f"{prefix}.bias"] = _array(norm.bias)


def _vit_config(config: Any, owner: str) -> dict[str, Any]:
    if config.hidden_act != "gelu":
        raise SplitformerError(f"{owner}: hidden_act={config.hidden_act!r}; the vit model's step uses the exact "
                               "erf GELU ('gelu')")
    head_dim = getattr(config, "head_dim", None)
    if head_dim is not None and head_dim * config.num_attention_heads != config.hidden_size:
        raise SplitformerError(f"{owner}: head_dim={head_dim} × {config.num_attention_heads} heads ≠ hidden_size="
                               f"{config.hidden_size}; the step's heads split the feature domain")
    size = config.image_size
    image_size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
    patch = config.patch_size
    if isinstance(patch, (tuple, list)):
        if patch[0] != patch[1]:
            raise SplitformerError(f"{owner}: patch_size={tuple(patch)}; the vit model's patches are square")
        patch = patch[0]
    return {"patch_size": int(patch), "n_heads": int(config.num_attention_heads),
            "eps": float(config.layer_norm_eps), "image_size": image_size}


def _vit_layers(vit: Any) -> list[tuple]:
    """Per layer: LayerNorm, Q, K, V, output, LayerNorm, lifting, restriction (transformers 5 and 4 layouts)."""
    if hasattr(vit, "layers"):
        return [(layer.layernorm_before, layer.attention.q_proj, layer.attention.k_proj, layer.attention.v_proj,
                 layer.attention.o_proj, layer.layernorm_after, layer.mlp.fc1, layer.mlp.fc2) for layer in vit.layers]
    return [(layer.layernorm_before, layer.attention.attention.query, layer.attention.attention.key,
             layer.attention.attention.value, layer.attention.output.dense, layer.layernorm_after,
             layer.intermediate.dense, layer.output.dense) for layer in vit.encoder.layer]


def _vit_params(vit: Any) -> dict[str, np.ndarray]:
    embeddings = vit.embeddings
    projection = embeddings.patch_embeddings.projection
    params = {
        "embed.W": _array(projection.weight).transpose(1, 2, 3, 0).copy(),
        "embed.b": _array(projection.bias),
        "embed.cls": _array(embeddings.cls_token).reshape(-1),
        "embed.pos": _array(embeddings.position_embeddings)[0],
    }
    for index, parts in enumerate(_vit_layers(vit)):
        prefix = f"layers.{index}."
        norm1, query, key, value, output, norm2, lifting, restriction = parts
        _norm(params, prefix + "norm1", norm1)
        for name, linear in zip("qkvo", (query, key, value, output)):
            _dense(params, f"{prefix}attn.W_{name}", f"{prefix}attn.b_{name}", linear)
        _norm(params, prefix + "norm2", norm2)
        _dense(params, prefix + "ffn.W_1", prefix + "ffn.b_1", lifting)
        _dense(params, prefix + "ffn.W_2", prefix + "ffn.b_2", restriction)
    _norm(params, "final_norm", vit.layernorm)
    return params


@adapter("hf", "ViTModel", "ViTForImageClassification")
def from_hf_vit(module: Any) -> AdaptedModel:
    """The ``vit`` model's parameters and configuration of a transformers ViT."""
    owner = type(module).__name__
    vit = module.vit if owner == "ViTForImageClassification" else module
    config = _vit_config(module.config, owner)
    params = _vit_params(vit)
    if owner == "ViTForImageClassification":
        if type(module.classifier).__name__ != "Linear":
            raise SplitformerError(f"{owner}: the classifier is {type(module.classifier).__name__} (num_labels = 0?); "
                                   "the readout is a linear head")
        _dense(params, "head.W", "head.b", module.classifier)
    return AdaptedModel("vit", params, config, ("hf", owner))
