"""An emitted block's KV cache kept in transformers' ``Cache`` (``DynamicCache``), one layer per block.

An emitted causal ``Block`` keeps, for each attention evaluation of its step (a Runge–Kutta
scheme evaluates attention more than once), the keys (``attn.k``; ``attn.kr`` rotated, for
RoPE) and values (``attn.v``) of the tokens seen so far, each (batch, tokens, heads, …).
transformers' cache layer holds keys and values (batch, heads, tokens, width): the
evaluations' keys sit side by side on the head axis, then their values, so a one-evaluation
scheme's cache is exactly transformers' (rotated keys in its ``rotate_half`` layout).
"""

from __future__ import annotations

import math

import torch
from transformers.cache_utils import Cache

from splitformer.symbolic.errors import SplitformerError

__all__ = ["CacheLayout", "cache_layout", "check_layers", "read_layer", "write_layer"]

#: One block's cache entries, keys first: (name, shape after the batch and token axes).
CacheLayout = tuple[tuple[str, tuple[int, ...]], ...]


def cache_layout(block: torch.nn.Module) -> CacheLayout:
    """The cache entries of an emitted causal ``block``, read from a one-token step of it."""
    weight = next(block.parameters())
    own: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        block(torch.zeros(1, 1, block.d_model, dtype=weight.dtype, device=weight.device), cache=own)
    for record in ("key_padding_mask", "options"):  # how the tokens were cached: transformers keeps its own mask
        own.pop(record, None)
    entries = sorted(own.items(), key=lambda item: (item[0].endswith(".v"), item[0]))
    for name, tensor in entries:
        if tensor.dim() < 4 or name.rpartition(".")[2] not in ("k", "kr", "v"):
            raise SplitformerError(f"the cache entry {name!r} is not a key or value per head; transformers' cache "
                                   "holds only those")
    return tuple((name, tuple(tensor.shape[2:])) for name, tensor in entries)


def check_layers(cache: Cache, layers: int) -> None:
    """Refuse a cache whose layers do not hold the same tokens for each of the model's ``layers`` and none past them
    (another model's: more or fewer layers), before any layer is read or written."""
    held = [cache.get_seq_length(index) for index in range(max(layers, len(cache.layers)))]
    if len(set(held[:layers])) > 1 or any(held[layers:]):
        raise ValueError(f"cache holds {held} tokens in its layers; this model has {layers} layers, each holding the "
                         "same tokens: another model's cache")


def read_layer(cache: Cache, index: int, layout: CacheLayout, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Block ``index``'s own cache holding what ``cache`` holds for it (empty before the first tokens); ``dtype``: the
    block's."""
    if cache.get_seq_length(index) == 0:
        return {}
    layer = cache.layers[index]
    for part, tensor in (("keys", layer.keys), ("values", layer.values)):
        if tensor.dtype != dtype:
            raise ValueError(f"cache layer {index} holds {part} in {tensor.dtype}; this model computes in {dtype}: "
                             "another model's cache")
        shapes = [shape for name, shape in layout if name.endswith(".v") == (part == "values")]
        kept = (sum(shape[0] for shape in shapes), math.prod(shapes[0][1:]))
        if tensor.dim() != 4 or (tensor.shape[1], tensor.shape[3]) != kept:
            raise ValueError(f"cache layer {index} holds {part} of shape {tuple(tensor.shape)} (batch, heads, tokens, "
                             f"width); this model keeps {kept[0]} heads of width {kept[1]}: another model's cache")
    packed = torch.cat((layer.keys, layer.values), dim=1)  # (batch, heads of every entry, tokens, width)
    own, start = {}, 0
    for name, shape in layout:
        part = packed[:, start:start + shape[0]].transpose(1, 2)
        own[name] = part.reshape(*part.shape[:2], *shape)
        start += shape[0]
    return own


def write_layer(cache: Cache, index: int, own: dict[str, torch.Tensor], layout: CacheLayout, n_new: int) -> None:
    """Append the last ``n_new`` tokens of block ``index``'s own cache to ``cache``."""
    keys, values = [], []
    for name, _ in layout:
        new = own[name][:, -n_new:]
        (values if name.endswith(".v") else keys).append(new.reshape(*new.shape[:3], -1).transpose(1, 2))
    cache.update(torch.cat(keys, dim=1), torch.cat(values, dim=1), index)
