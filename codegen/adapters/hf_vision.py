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

from .arrays import array as _array
from .common import activation_name, check_head_split, check_norms
from .inspection import check_parts, library_name
from .network_params import NetworkParams, builtin_computes
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

    def __post_init__(self) -> None:
        """``params`` as ``NetworkParams``: the generated modules refuse them with a configuration not ``config``."""
        object.__setattr__(self, "params", NetworkParams(self.params, self.model, self.config))

    @property
    def module_name(self) -> str:
        return self.model.replace("-", "_")

    def check_computes(self, module: Any) -> None:
        """Refuse a generated network module whose ``COMPUTES`` digest is not the built-in network's
        (another scheme's steps, final norm or operators, whatever its name)."""
        name = getattr(module, "__name__", type(module).__name__)
        digest = getattr(module, "COMPUTES", None)
        if digest is None:
            raise SplitformerError(f"{name!r} has no COMPUTES digest (emitted by an older splitformer): derive it again")
        expected = builtin_computes(self.model)
        if digest != expected:
            raise SplitformerError(f"{name!r} computes another network than {self.source[1]} (the built-in "
                                   f"{self.model!r}: COMPUTES {digest}, the source's {expected}); "
                                   f"derive it with splitformer derive {self.model} --backend torch")

    def astype(self, dtype: Any) -> "AdaptedModel":
        return replace(self, params={name: value.astype(dtype) for name, value in self.params.items()})

    def __repr__(self) -> str:
        """One line, as an ``Adapted``'s: the source, the network, its configuration and the parameters' count."""
        config = ", ".join(f"{key}={value!r}" for key, value in self.config.items())
        dtype = next((str(value.dtype) for value in self.params.values()), self.source_dtype)
        return (f"AdaptedModel({self.source[0]}.{self.source[1]} → {self.model}, {config}, "
                f"{len(self.params)} parameter arrays, dtype={dtype})")

    def build(self, torch_module: Any, *, device: Any = None, dtype: Any = None, backward: str = "autograd") -> Any:
        """The ``Model`` of the generated ``vit`` or ``cvt`` torch module holding these parameters (in their dtype), its
        sizes read from them (layers, widths, classes) and from ``config``; ``backward`` as the Model's."""
        import torch

        if not callable(getattr(torch_module, "Model", None)):
            raise SplitformerError(f"{getattr(torch_module, '__name__', torch_module)!r} is not the generated "
                                   f"{self.model} torch module (splitformer derive {self.model} --backend torch)")
        self.check_computes(torch_module)
        sizes = self._vit_sizes() if self.model == "vit" else self._cvt_sizes()
        first = next(iter(self.params.values()))
        model = torch_module.Model(**sizes, device=device, dtype=dtype or getattr(torch, str(first.dtype)),
                                   backward=backward)
        return model.load_params(self.params)

    def _head_classes(self) -> int:
        head = self.params.get("head.W")
        return 0 if head is None else head.shape[1]

    def _vit_sizes(self) -> dict:
        d_ff = self.params["layers.0.ffn.W_1"].shape[1] if "layers.0.ffn.W_1" in self.params else 1  # no layers
        return {"n_layers": sum(name.endswith(".attn.W_q") for name in self.params),
                "d_model": self.params["embed.W"].shape[-1], "d_ff": d_ff, "n_channels": self.params["embed.W"].shape[0],
                "n_classes": self._head_classes(), **self.config}

    def _cvt_sizes(self) -> dict:
        stages = range(len(self.config["stages"]))
        return {"n_channels": self.params["stages.0.embed.W"].shape[0],
                "embed_dims": [self.params[f"stages.{s}.embed.W"].shape[-1] for s in stages],
                "depths": [sum(name.startswith(f"stages.{s}.layers.") and name.endswith(".attn.W_q")
                               for name in self.params) for s in stages],
                "d_ffs": [self.params[f"stages.{s}.layers.0.ffn.W_1"].shape[1] for s in stages],
                "n_classes": self._head_classes(), **self.config}


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
    """Refuse an attention whose heads (``num_attention_heads``, the head width its forward splits by) are not
    ``n_heads`` of ``d / n_heads``, or whose ``scaling`` is not ``1/√head_dim`` (transformers 5 and 4 layouts)."""
    attentions = [layer.attention for layer in vit.layers] if hasattr(vit, "layers") else \
        [layer.attention.attention for layer in vit.encoder.layer]
    head_dim = vit.config.hidden_size // n_heads
    d = vit.layernorm.weight.shape[0]
    for index, attention in enumerate(attentions):
        named = {name: getattr(attention, name) for name in ("head_dim", "attention_head_size") if hasattr(attention, name)}
        check_head_split(f"{owner} layer {index} attention", d, ("num_attention_heads", attention.num_attention_heads),
                         named, {"all_head_size": attention.all_head_size} if hasattr(attention, "all_head_size") else {})
        if attention.num_attention_heads != n_heads:
            raise SplitformerError(f"{owner} layer {index} attention.num_attention_heads is {attention.num_attention_heads}, "
                                   f"config.num_attention_heads {n_heads}; the vit model's step takes one n_heads")
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
    owner = library_name(module)
    vit = module.vit if owner == "ViTForImageClassification" else module
    config = _vit_config(module.config, owner) | {"eps": _vit_modules(vit, owner)}
    _check_vit_scaling(vit, owner, config["n_heads"])
    params = _vit_params(vit)
    if owner == "ViTForImageClassification":
        if library_name(module.classifier) != "Linear":
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
        if library_name(activation) != "GELU" or getattr(activation, "approximate", "none") != "none":
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


def _check_cvt_modules(stage: Any, index: int, config: dict[str, Any], owner: str) -> None:
    """Refuse a stage whose modules compute with other sizes than ``config`` (the model's config, which
    may be edited after construction): strides, paddings and kernels of its convolutions, heads, class
    token and score scale of its attentions."""
    def agree(path: str, attribute: str, module_value: Any, config_value: Any, key: str) -> None:
        if module_value != config_value:
            raise SplitformerError(f"{owner}: stage {index} config has {key} = {config[key]!r} but "
                                   f"{path}.{attribute} is {module_value!r}; the modules compute, the config must describe them")

    where = f"stages.{index}"
    projection = stage.embedding.convolution_embeddings.projection
    for attribute, key in (("kernel_size", "patch_size"), ("stride", "patch_stride"), ("padding", "patch_padding")):
        agree(f"{where}.embedding.convolution_embeddings.projection", attribute, getattr(projection, attribute),
              (config[key],) * 2, key)
    for number, layer in enumerate(stage.layers):
        attention = layer.attention.attention
        at = f"{where}.layers.{number}.attention.attention"
        agree(at, "num_heads", attention.num_heads, config["n_heads"], "n_heads")
        agree(at, "with_cls_token", bool(attention.with_cls_token), config["cls"], "cls")
        if not math.isclose(attention.scale, attention.embed_dim ** -0.5, rel_tol=1e-12):
            raise SplitformerError(f"{owner}: {at}.scale is {attention.scale}; the cvt step scales scores by "
                                   f"1/sqrt(d) = {attention.embed_dim ** -0.5:g}")
        for name, kind in (("query", "q"), ("key", "kv"), ("value", "kv")):
            path = f"{at}.convolution_projection_{name}.convolution_projection.convolution"
            convolution = getattr(attention, f"convolution_projection_{name}").convolution_projection.convolution
            agree(path, "kernel_size", convolution.kernel_size, (config["kernel_qkv"],) * 2, "kernel_qkv")
            agree(path, "stride", convolution.stride, (config[f"stride_{kind}"],) * 2, f"stride_{kind}")
            agree(path, "padding", convolution.padding, (config[f"padding_{kind}"],) * 2, f"padding_{kind}")
    agree(where, "cls_token", getattr(stage, "cls_token", None) is not None, config["cls"], "cls")


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
    owner = library_name(module)
    cvt = module.cvt if owner == "CvtForImageClassification" else module
    stages = _cvt_config(module.config, owner)
    params: dict[str, np.ndarray] = {}
    eps: set[float] = set()
    if len(cvt.encoder.stages) != len(stages):
        raise SplitformerError(f"{owner} has {len(cvt.encoder.stages)} stages, its config.depth {len(stages)}")
    for index, stage in enumerate(cvt.encoder.stages):
        _check_cvt_modules(stage, index, stages[index], owner)
        _cvt_stage(params, index, stage, eps, owner)
    if owner == "CvtForImageClassification":
        if not stages[-1]["cls"]:
            raise SplitformerError(f"{owner}: the last stage has no class token; the readout averaging the grid "
                                   "is not generated")
        if library_name(module.classifier) != "Linear":
            raise SplitformerError(f"{owner}: the classifier is {type(module.classifier).__name__}; the readout is a linear head")
        _norm(params, "final_norm", module.layernorm)
        eps.add(float(module.layernorm.eps))
        _dense(params, "head.W", "head.b", module.classifier)
    if len(eps) != 1:
        raise SplitformerError(f"{owner}: LayerNorm and BatchNorm eps differ ({sorted(eps)}); the generated forward takes one")
    return AdaptedModel("cvt", params, {"stages": stages, "eps": eps.pop()}, ("hf", owner))
