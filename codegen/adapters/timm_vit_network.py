"""timm's ``VisionTransformer`` as a whole ``vit`` network (``from_timm(model, network="vit")``).

The ``vit`` network computes: a patch embedding (a convolution whose stride is its square
kernel), a class token put first, a learned position term over the class token and the
patches, timm ``Block``s (``pre-ln``, exact GELU), the final LayerNorm, and a linear head on the
class token's final state. Each timm option that changes this computation is refused by
name (the blocks' own refusals are those of ``read_vit_block``): no class token, register
tokens, positions not added to the class token (``no_embed_class``), no or dynamic position
embedding, a normalized patch embedding or ``pre_norm``, no final norm, another pooling
(``global_pool``, ``fc_norm``, attention pooling).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .arrays import array, linear_weight
from .common import final_norm_params, same_configuration, zero_bias
from .hf_vision import AdaptedModel
from .inspection import check_exact_class, library_name
from .registry import network_adapter
from .timm_vit import TIMM_BLOCK, TIMM_VISION_TRANSFORMER, read_vit_block

__all__ = ["read_vit_network"]

_OWNER = "VisionTransformer"


def _refuse_if(condition: bool, what: str) -> None:
    if condition:
        raise SplitformerError(f"{_OWNER} has {what}; the vit network does not compute it")


def _check_front(model: Any) -> None:
    """The embedding: a plain patch convolution, a class token, learned positions over all tokens."""
    embed = model.patch_embed
    check_exact_class(f"{_OWNER}.patch_embed", embed, "timm.layers.patch_embed.PatchEmbed")
    _refuse_if(model.cls_token is None, "no class token (class_token=False)")
    _refuse_if(getattr(model, "reg_token", None) is not None, f"{model.num_reg_tokens} register tokens (reg_tokens)")
    _refuse_if(model.pos_embed is None, "no position embedding (pos_embed='none')")
    _refuse_if(model.no_embed_class, "positions not added to the class token (no_embed_class=True)")
    _refuse_if(getattr(model, "dynamic_img_size", False), "resampled positions (dynamic_img_size=True)")
    _refuse_if(getattr(embed, "dynamic_img_pad", False), "padded images (dynamic_img_pad=True)")
    _refuse_if(embed.img_size is None, "no fixed image size (img_size=None)")
    _refuse_if(not embed.flatten, "an unflattened patch embedding (output_fmt)")
    _refuse_if(library_name(embed.norm) != "Identity", "a normalized patch embedding (embed_norm_layer)")
    _refuse_if(library_name(model.norm_pre) != "Identity", "a norm before the blocks (pre_norm=True)")
    proj = embed.proj
    _refuse_if(proj.kernel_size[0] != proj.kernel_size[1], f"non-square patches {tuple(proj.kernel_size)}")
    _refuse_if(tuple(proj.stride) != tuple(proj.kernel_size) or tuple(proj.padding) != (0, 0)
               or tuple(proj.dilation) != (1, 1) or proj.groups != 1,
               "a patch convolution that is not stride = kernel, unpadded, undilated, ungrouped")


def _check_back(model: Any) -> None:
    """The readout: the final LayerNorm, the class token's state, a linear head (or none)."""
    _refuse_if(model.global_pool != "token",  # first: 'avg' also moves the final norm after the pooling (fc_norm)
               f"pooling global_pool={model.global_pool!r} (the network reads the class token: global_pool='token')")
    _refuse_if(library_name(model.norm) == "Identity", "no final norm (final_norm=False or fc_norm)")
    attention_pool = getattr(model, "attn_pool", None)
    _refuse_if(attention_pool is not None, f"attention pooling (attn_pool is {type(attention_pool).__name__}) where "
               "the network reads the class token")
    _refuse_if(library_name(model.fc_norm) != "Identity", "a norm after pooling (fc_norm)")
    _refuse_if(library_name(model.head) not in ("Linear", "Identity"), f"the head {type(model.head).__name__}")


@network_adapter("timm", "vit", "VisionTransformer")
def read_vit_network(model: Any) -> AdaptedModel:
    """The ``vit`` network's parameters and configuration of a timm ``VisionTransformer``."""
    check_exact_class(_OWNER, model, TIMM_VISION_TRANSFORMER)
    _check_front(model)
    _check_back(model)
    blocks = []
    for index, block in enumerate(model.blocks):
        check_exact_class(f"{_OWNER}.blocks.{index}", block, TIMM_BLOCK)
        blocks.append(read_vit_block(block))
    first = same_configuration(_OWNER, blocks)
    _refuse_if(first.activation != "gelu", f"the activation {first.activation} (the vit step's is the exact GELU)")
    proj = model.patch_embed.proj
    weight = array(proj.weight)
    params = {
        "embed.W": np.ascontiguousarray(weight.transpose(1, 2, 3, 0)),
        "embed.b": zero_bias(weight.shape[0], weight.dtype) if proj.bias is None else array(proj.bias),
        "embed.cls": array(model.cls_token).reshape(-1),
        "embed.pos": array(model.pos_embed)[0],
    }
    for index, block in enumerate(blocks):
        params |= {f"layers.{index}.{name}": value for name, value in block.params.items()}
    params |= {f"final_norm.{name}": value for name, value in final_norm_params(_OWNER, model.norm, first).items()}
    if library_name(model.head) == "Linear":
        params["head.W"] = linear_weight(model.head.weight)
        params["head.b"] = zero_bias(params["head.W"].shape[1], weight.dtype) if model.head.bias is None \
            else array(model.head.bias)
    config = {"patch_size": int(proj.kernel_size[0]), "n_heads": first.n_heads, "eps": first.eps,
              "image_size": tuple(int(size) for size in model.patch_embed.img_size)}
    return AdaptedModel("vit", params, config, ("timm", _OWNER))
