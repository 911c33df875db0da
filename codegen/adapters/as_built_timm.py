"""Fresh timm ViT modules (``Block``, ``VisionTransformer``) for ``as_built``, from what fixes their computation.

timm records no constructor arguments, so a part is rebuilt from its parameters and part classes (widths,
biases, class and register tokens, position table, norms, head) and from the attributes the readers read and
check themselves (``Attention.num_heads``, ``global_pool``, ``no_embed_class``, ``dynamic_img_size``,
``PatchEmbed.img_size``, ``dynamic_img_pad``; ``pool_include_prefix``, which only a pooling the vit network
refuses reads); ``as_built`` compares every other plain attribute.
"""

from __future__ import annotations

import functools
from typing import Any

from .inspection import library_class, runs_one_of

__all__ = ["fresh_block", "fresh_vision_transformer"]


def _absent(part: Any) -> bool:
    return part is None or runs_one_of(part, ("Identity",))


def _block_options(block: Any) -> dict[str, Any]:
    """What a ``Block`` is built with besides its width; the readers refuse LayerScale and q/k, attention-output
    and MLP norms, so those keep timm's defaults (off)."""
    attention, mlp = block.attn, block.mlp
    width = attention.qkv.weight.shape[1]
    return {"num_heads": attention.num_heads, "mlp_ratio": (mlp.fc1.weight.shape[0] + 0.5) / width,  # int(dim * ratio)
            "qkv_bias": attention.qkv.bias is not None, "proj_bias": attention.proj.bias is not None,
            "act_layer": library_class(mlp.act), "norm_layer": _norm_layer(block.norm1)}


def _norm_layer(norm: Any) -> Any:
    """The norm class ``norm`` runs, with ``bias=False`` where it was built without a bias (a bias-free ViT)."""
    cls = library_class(norm)
    return functools.partial(cls, bias=False) if getattr(norm, "bias", 0) is None else cls


def _drop_path(block: Any) -> float:
    return getattr(block.drop_path1, "drop_prob", 0.0)


def fresh_block(cls: type, block: Any) -> Any:
    """A ``Block`` as timm builds it with ``block``'s width, heads, biases, activation and norm classes."""
    return cls(block.attn.qkv.weight.shape[1], drop_path=_drop_path(block), **_block_options(block))


def _embedding(model: Any) -> dict[str, Any]:
    """A ``PatchEmbed`` rebuilt from its convolution and read image size; another embedding (which the vit network
    refuses and the blocks' reader does not map) is taken as it is."""
    embed = model.patch_embed
    if not runs_one_of(embed, ("PatchEmbed",)):
        return {"embed_layer": lambda **_: embed}
    weight = embed.proj.weight
    return {"embed_layer": library_class(embed), "img_size": embed.img_size, "patch_size": tuple(weight.shape[2:]),
            "in_chans": weight.shape[1], "dynamic_img_pad": embed.dynamic_img_pad,
            "embed_norm_layer": None if _absent(embed.norm) else library_class(embed.norm)}


def fresh_vision_transformer(cls: type, model: Any) -> Any:
    """A ``VisionTransformer`` as timm builds it with ``model``'s tokens, positions, norms, pooling and head."""
    first = model.blocks[0]
    reg = getattr(model, "reg_token", None)
    return cls(**_embedding(model), num_classes=0 if _absent(model.head) else model.head.weight.shape[0],
               global_pool=model.global_pool, embed_dim=first.attn.qkv.weight.shape[1], depth=len(model.blocks),
               class_token=model.cls_token is not None, pos_embed="none" if model.pos_embed is None else "learn",
               no_embed_class=model.no_embed_class, pool_include_prefix=model.pool_include_prefix, reg_tokens=0 if reg is None else reg.shape[1],
               pre_norm=not _absent(model.norm_pre), final_norm=not (_absent(model.norm) and _absent(model.fc_norm)),
               fc_norm=not _absent(model.fc_norm), dynamic_img_size=model.dynamic_img_size,
               patch_drop_rate=getattr(model.patch_drop, "prob", 0.0),
               drop_path_rate=max(_drop_path(block) for block in model.blocks), weight_init="skip",
               **_block_options(first))
