"""``transformers`` vision models (``ViTModel``, ``ViTForImageClassification``) → canonical parameters.

The result, ``AdaptedModel``, holds the flat canonical mapping of a whole generated model
(``embed.W``, ``layers.0.attn.W_q``, …, ``final_norm.gain``, ``head.W``) and the keyword
configuration of its ``forward``/``logits``. Configurations the generated model does not
compute are refused by name, never approximated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .common import activation_name, check_norms
from .inspection import check_parts
from .registry import adapter, network_adapter

__all__ = ["AdaptedModel", "from_hf_vit", "from_hf_cvt"]


@dataclass(frozen=True)
class AdaptedModel:
    """A whole model read from a source: ``model`` (built-in name), ``params``, ``config``."""

    model: str
    params: Mapping[str, np.ndarray]
    config: Mapping[str, Any]
    source: tuple[str, str]
    notes: tuple[str, ...] = field(default=())
    #: The source parameters' dtype name (set by the dispatch in ``splitformer.adapters``).
    source_dtype: str = "float32"

    @property
    def module_name(self) -> str:
        return self.model.replace("-", "_")

    def astype(self, dtype: Any) -> "AdaptedModel":
        return replace(self, params={name: value.astype(dtype) for name, value in self.params.items()})

    def build(self, torch_module: Any, *, device: Any = None, dtype: Any = None) -> Any:
        """The ``Model`` of the generated ``vit`` torch module holding these parameters (in their dtype)."""
        import torch

        if self.model != "vit":
            raise SplitformerError(f"build() makes vit models; {self.source[1]} is read as {self.model!r} "
                                   "(construct its Model with the per-stage configuration yourself)")
        if set(getattr(torch_module, "PARAMETERS", ())) != {"embed.W", "embed.b", "embed.cls", "embed.pos",
                                                            "final_norm.gain", "final_norm.bias"}:
            raise SplitformerError(f"{getattr(torch_module, '__name__', torch_module)!r} is not the generated vit "
                                   "torch module (splitformer derive vit --backend torch)")
        d_model = self.params["embed.W"].shape[-1]
        d_ff = self.params["layers.0.ffn.W_1"].shape[1] if "layers.0.ffn.W_1" in self.params else 1  # no layers
        head = self.params.get("head.W")
        model = torch_module.Model(
            n_layers=sum(name.endswith(".attn.W_q") for name in self.params), d_model=d_model, d_ff=d_ff,
            n_channels=self.params["embed.W"].shape[0], n_classes=0 if head is None else head.shape[1],
            device=device, dtype=dtype or getattr(torch, str(self.params["embed.W"].dtype)), **self.config)
        return model.load_params(self.params)


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


#: The submodules of a ``ViTLayer`` the adapter reads, and their classes (transformers 5, then 4).
VIT_LAYER_PARTS = (
    {"attention": "ViTAttention", "attention.q_proj": "Linear", "attention.k_proj": "Linear",
     "attention.v_proj": "Linear", "attention.o_proj": "Linear", "layernorm_before": "LayerNorm",
     "layernorm_after": "LayerNorm", "mlp": "ViTMLP", "mlp.fc1": "Linear", "mlp.fc2": "Linear", "mlp.activation_fn": None},
    {"attention.attention.query": "Linear", "attention.attention.key": "Linear", "attention.attention.value": "Linear",
     "attention.output.dense": "Linear", "layernorm_before": "LayerNorm", "layernorm_after": "LayerNorm",
     "intermediate.dense": "Linear", "intermediate.intermediate_act_fn": None, "output.dense": "Linear"},
)


def _vit_modules(vit: Any, owner: str) -> float:
    """Check the layers' parts and read what the modules compute (not the config): every layer's
    activation must be the exact GELU, and every LayerNorm (the final one included) share one ε, returned."""
    layers = list(vit.layers) if hasattr(vit, "layers") else list(vit.encoder.layer)
    parts = VIT_LAYER_PARTS[0] if hasattr(vit, "layers") else VIT_LAYER_PARTS[1]
    norms = {"layernorm": vit.layernorm}
    for index, layer in enumerate(layers):
        where = f"{owner} layer {index}"
        check_parts(where, layer, parts)
        path = next(name for name, expected in parts.items() if expected is None)
        activation = activation_name(f"{where} {path}", layer.get_submodule(path))
        if activation != "gelu":
            raise SplitformerError(f"{where}: {path} computes {activation}; the vit model's step uses the exact erf GELU")
        norms |= {f"layers.{index}.{name}": getattr(layer, name) for name in ("layernorm_before", "layernorm_after")}
    return check_norms(owner, norms)


def _vit_config(config: Any, owner: str) -> dict[str, Any]:
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
    return {"patch_size": int(patch), "n_heads": int(config.num_attention_heads), "image_size": image_size}


def _vit_layers(vit: Any) -> list[tuple]:
    """Per layer: LayerNorm, Q, K, V, output, LayerNorm, lifting, restriction (transformers 5 and 4 layouts)."""
    if hasattr(vit, "layers"):
        return [(layer.layernorm_before, layer.attention.q_proj, layer.attention.k_proj, layer.attention.v_proj,
                 layer.attention.o_proj, layer.layernorm_after, layer.mlp.fc1, layer.mlp.fc2) for layer in vit.layers]
    return [(layer.layernorm_before, layer.attention.attention.query, layer.attention.attention.key,
             layer.attention.attention.value, layer.attention.output.dense, layer.layernorm_after,
             layer.intermediate.dense, layer.output.dense) for layer in vit.encoder.layer]


def _check_vit_scaling(vit: Any, owner: str, n_heads: int) -> None:
    """Refuse an attention whose ``scaling`` is not ``1/√head_dim`` (transformers 5 and 4 layouts)."""
    attentions = [layer.attention for layer in vit.layers] if hasattr(vit, "layers") else \
        [layer.attention.attention for layer in vit.encoder.layer]
    head_dim = vit.config.hidden_size // n_heads
    for index, attention in enumerate(attentions):
        scale = getattr(attention, "scaling", head_dim ** -0.5)
        if not math.isclose(scale, head_dim ** -0.5, rel_tol=1e-12):
            raise SplitformerError(f"{owner}: layer {index} scales attention scores by {scale}, "
                                   "the vit model's step by 1/sqrt(head_dim)")


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
@network_adapter("hf", "vit", "ViTModel", "ViTForImageClassification")
def from_hf_vit(module: Any) -> AdaptedModel:
    """The ``vit`` model's parameters and configuration of a transformers ViT."""
    owner = type(module).__name__
    vit = module.vit if owner == "ViTForImageClassification" else module
    config = _vit_config(module.config, owner) | {"eps": _vit_modules(vit, owner)}
    _check_vit_scaling(vit, owner, config["n_heads"])
    params = _vit_params(vit)
    if owner == "ViTForImageClassification":
        if type(module.classifier).__name__ != "Linear":
            raise SplitformerError(f"{owner}: the classifier is {type(module.classifier).__name__} (num_labels = 0?); "
                                   "the readout is a linear head")
        _dense(params, "head.W", "head.b", module.classifier)
    notes = () if getattr(vit, "pooler", None) is None else (
        f"{owner}.pooler (dense and tanh on the class token: pooler_output) is not mapped; forward computes "
        "last_hidden_state",)
    return AdaptedModel("vit", params, config, ("hf", owner), notes=notes)


def _depthwise(params: dict, prefix: str, projection: Any, eps: set) -> None:
    """A ``dw_bn`` projection: the depth-wise kernel ``(k, k, d)`` and its BatchNorm's four vectors."""
    convolution = projection.convolution_projection
    params[f"{prefix}conv.W"] = _array(convolution.convolution.weight)[:, 0].transpose(1, 2, 0).copy()
    norm = convolution.normalization
    if norm.running_mean is None or norm.running_var is None:
        raise SplitformerError(f"{prefix}bn tracks no running statistics (track_running_stats=False); the cvt step "
                               "normalizes with the BatchNorm's running mean and variance")
    params[f"{prefix}bn.gain"], params[f"{prefix}bn.bias"] = _array(norm.weight), _array(norm.bias)
    params[f"{prefix}bn.mean"], params[f"{prefix}bn.var"] = _array(norm.running_mean), _array(norm.running_var)
    eps.add(float(norm.eps))


def _cvt_stage(params: dict, index: int, stage: Any, eps: set, owner: str) -> None:
    prefix = f"stages.{index}."
    embedding = stage.embedding.convolution_embeddings
    params[prefix + "embed.W"] = _array(embedding.projection.weight).transpose(1, 2, 3, 0).copy()
    params[prefix + "embed.b"] = _array(embedding.projection.bias)
    _norm(params, prefix + "embed_norm", embedding.normalization)
    eps.add(float(embedding.normalization.eps))
    if getattr(stage, "cls_token", None) is not None:
        params[prefix + "cls"] = _array(stage.cls_token).reshape(-1)
    for number, layer in enumerate(stage.layers):
        at = f"{prefix}layers.{number}."
        attention = layer.attention.attention
        activation = layer.intermediate.activation
        if type(activation).__name__ != "GELU" or getattr(activation, "approximate", "none") != "none":
            raise SplitformerError(f"{owner}: stage {index} uses {activation!r}; the cvt step uses the exact erf GELU")
        _norm(params, at + "norm1", layer.layernorm_before)
        for letter, name in (("q", "query"), ("k", "key"), ("v", "value")):
            _depthwise(params, at + letter, getattr(attention, f"convolution_projection_{name}"), eps)
            _dense(params, f"{at}attn.W_{letter}", f"{at}attn.b_{letter}", getattr(attention, f"projection_{name}"))
        _dense(params, at + "attn.W_o", at + "attn.b_o", layer.attention.output.dense)
        _norm(params, at + "norm2", layer.layernorm_after)
        _dense(params, at + "ffn.W_1", at + "ffn.b_1", layer.intermediate.dense)
        _dense(params, at + "ffn.W_2", at + "ffn.b_2", layer.output.dense)
        eps.update(float(norm.eps) for norm in (layer.layernorm_before, layer.layernorm_after))


def _cvt_config(config: Any, owner: str) -> list[dict[str, Any]]:
    stages = []
    for index in range(len(config.depth)):
        if config.qkv_projection_method[index] != "dw_bn":
            raise SplitformerError(f"{owner}: stage {index} has qkv_projection_method="
                                   f"{config.qkv_projection_method[index]!r}; the cvt step derives 'dw_bn'")
        if config.cls_token[index] and index != len(config.depth) - 1:
            raise SplitformerError(f"{owner}: a class token in stage {index}; the class node joins in the last stage only")
        if config.stride_q[index] != 1 or 2 * config.padding_q[index] != config.kernel_qkv[index] - 1:
            raise SplitformerError(f"{owner}: stage {index} has stride_q = {config.stride_q[index]}, padding_q = "
                                   f"{config.padding_q[index]} with kernel_qkv = {config.kernel_qkv[index]}: the "
                                   "queries leave the token grid, so the residual sum has no meaning (the module "
                                   "itself fails on any input)")
        stages.append({"patch_size": config.patch_sizes[index], "patch_stride": config.patch_stride[index],
                       "patch_padding": config.patch_padding[index], "n_heads": config.num_heads[index],
                       "kernel_qkv": config.kernel_qkv[index], "stride_q": config.stride_q[index],
                       "padding_q": config.padding_q[index], "stride_kv": config.stride_kv[index],
                       "padding_kv": config.padding_kv[index], "cls": bool(config.cls_token[index])})
    return stages


@adapter("hf", "CvtModel", "CvtForImageClassification")
@network_adapter("hf", "cvt", "CvtModel", "CvtForImageClassification")
def from_hf_cvt(module: Any) -> AdaptedModel:
    """The ``cvt`` model's parameters and configuration of a transformers CvT (eval mode)."""
    owner = type(module).__name__
    cvt = module.cvt if owner == "CvtForImageClassification" else module
    stages = _cvt_config(module.config, owner)
    params: dict[str, np.ndarray] = {}
    eps: set[float] = set()
    for index, stage in enumerate(cvt.encoder.stages):
        _cvt_stage(params, index, stage, eps, owner)
    if owner == "CvtForImageClassification":
        if not stages[-1]["cls"]:
            raise SplitformerError(f"{owner}: the last stage has no class token; the readout averaging the grid "
                                   "is not generated")
        if type(module.classifier).__name__ != "Linear":
            raise SplitformerError(f"{owner}: the classifier is {type(module.classifier).__name__}; the readout is a linear head")
        _norm(params, "final_norm", module.layernorm)
        eps.add(float(module.layernorm.eps))
        _dense(params, "head.W", "head.b", module.classifier)
    if len(eps) != 1:
        raise SplitformerError(f"{owner}: LayerNorm and BatchNorm eps differ ({sorted(eps)}); the generated forward takes one")
    return AdaptedModel("cvt", params, {"stages": stages, "eps": eps.pop()}, ("hf", owner))
