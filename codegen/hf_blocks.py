"""A transformers causal LM whose blocks are replaced by a derived variant's.

``replace_blocks(hf_model, scheme)`` puts, in place of each block of a ``GPT2LMHeadModel``/
``GPT2Model`` or ``LlamaForCausalLM``/``LlamaModel``, the emitted causal ``Block`` of
``scheme`` (same sizes, ε, biases, dtype and device), carrying over every parameter the two
share by canonical name (read by ``splitformer.adapters.from_hf``). A parameter of the new
block that the old one lacks is refused by name unless ``initialize=True`` (then it keeps
the block's own initialization); one of the old block that the new one lacks is dropped.
The whole model is checked first, as ``from_hf_lm`` checks it (``nn_hf.read_blocks``): the mask
and the rotary embedding its forward hands the blocks must be what the new blocks compute. The
old blocks' dropout is not carried (its sites differ from the generated Block's): ``dropout=``
sets the new blocks' rate, and is required when the old blocks drop.
Embeddings, positions, final norm and head stay transformers'; ``generate`` keeps working
with transformers' cache (``splitformer.codegen.hf_cache``).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers.cache_utils import Cache

from splitformer.symbolic.errors import SplitformerError

from .adapters.adapted import Adapted
from .adapters.as_built import drop_rates
from .api import as_scheme
from .hf_cache import CacheLayout, cache_layout, read_layer, write_layer
from .nn_hf import read_blocks
from .nn import stack_module

__all__ = ["SchemeBlock", "replace_blocks"]

class SchemeBlock(torch.nn.Module):
    """An emitted causal ``Block`` (``.block``) called as a transformers decoder layer.

    Takes the hidden states, transformers' ``Cache`` (this block is its layer ``index``) and
    its 4-D attention mask (bool: True attends; float: added to the scores), or none for a
    plain causal one; a rotary block gets ``position_ids``.
    """

    def __init__(self, block: torch.nn.Module, index: int):
        super().__init__()
        self.block, self.index = block, index
        self.rotary = "positions" in inspect.signature(block.forward).parameters
        self.layout: CacheLayout | None = None

    def forward(self, hidden_states: torch.Tensor, cache: Cache | None = None,
                attention_mask: torch.Tensor | None = None, encoder_hidden_states: torch.Tensor | None = None, *,
                position_ids: torch.Tensor | None = None, use_cache: bool | None = False, **_) -> torch.Tensor:
        if encoder_hidden_states is not None:
            raise ValueError("a replaced block has no cross-attention: encoder_hidden_states must be None")
        options: dict[str, Any] = {"causal": True}
        if attention_mask is not None:  # (batch, 1, new, cached + new) → the block's (batch, new, keys), True excludes
            mask = attention_mask[:, 0]
            options["src_mask"] = ~mask if mask.dtype == torch.bool else mask
        if self.rotary and position_ids is not None:
            options["positions"] = position_ids.expand(hidden_states.shape[0], -1)
        if cache is None:
            return self.block(hidden_states, **options)
        if self.layout is None:
            self.layout = cache_layout(self.block)
        own = read_layer(cache, self.index, self.layout, next(self.block.parameters()).dtype)
        hidden_states = self.block(hidden_states, cache=own, **options)
        write_layer(cache, self.index, own, self.layout, hidden_states.shape[1])
        return hidden_states


@contextmanager
def _evaluated(module: torch.nn.Module) -> Iterator[None]:
    """Every part of ``module`` in eval mode, each part's mode restored after: the readers refuse a part that drops
    at random, and a model being trained has its dropouts in training mode (replace_blocks carries the rate apart)."""
    modes = [(part, part.training) for part in module.modules()]
    try:
        module.eval()
        yield
    finally:
        for part, training in modes:
            part.training = training


def _drop_rate(blocks: torch.nn.ModuleList, dropout: float | None) -> float:
    """The new blocks' dropout: ``dropout`` when given, else 0 when no old block drops, else refused naming where one
    drops (the generated Block drops at torch's sites, which are not GPT-2's or Llama's: no rate is carried silently)."""
    if dropout is not None:
        return dropout
    for index, block in enumerate(blocks):
        for path, part in block.named_modules():
            for attribute, rate in drop_rates(part).items():
                where = ".".join(filter(None, (path, attribute)))
                raise SplitformerError(
                    f"replace_blocks: {type(block).__name__} {index}'s {where} is {rate:g}: it drops in training, at "
                    "other sites than the generated "
                    "Block (torch's: attention kernel, feed-forward activation, each residual branch); pass dropout= "
                    "(the new blocks' rate, 0 for none)")
    return 0.0


def _replacement(old: torch.nn.Module, adapted: Adapted, module, initialize: bool, dropout: float) -> torch.nn.Module:
    """The emitted ``Block`` of ``module`` sized as ``old`` (read as ``adapted``), holding the parameters they share."""
    weight = next(old.parameters())
    accepted = inspect.signature(module.Block.__init__).parameters
    options = {key: value for key, value in adapted.options.items() if key in accepted}
    block = module.Block(adapted.sizes["d_model"], adapted.n_heads, adapted.sizes["d_ff"], eps=adapted.eps,
                         bias=adapted.bias, dropout=dropout, dtype=weight.dtype, device=weight.device, **options)
    own = dict(block.named_parameters())
    missing = [name for name in own if name not in adapted.params]
    if missing and not initialize:
        raise SplitformerError(f"replace_blocks: {module.SCHEME} has parameters {type(old).__name__} lacks "
                               f"({', '.join(missing)}); pass initialize=True to initialize them")
    with torch.no_grad():
        for name, parameter in own.items():
            if name in adapted.params:
                value = torch.as_tensor(adapted.params[name])
                if tuple(value.shape) != tuple(parameter.shape):
                    raise SplitformerError(f"replace_blocks: {name} is {tuple(value.shape)} in "
                                           f"{type(old).__name__}, {tuple(parameter.shape)} in {module.SCHEME}")
                parameter.copy_(value)
    return block


def replace_blocks(hf_model: Any, scheme, *, activation: str | None = None, initialize: bool = False,
                   dropout: float | None = None) -> Any:
    """``hf_model`` (changed in place and returned) with each block replaced by ``scheme``'s, made causal.

    ``scheme``: a built-in name, a scheme file or a ``Scheme``. ``activation``: the
    feed-forward's (default: the model's own, GPT-2's ``gelu-tanh``, Llama's ``silu``).
    ``initialize``: initialize the parameters the old blocks lack instead of refusing.
    ``dropout``: the new blocks' rate in training mode, at torch's sites (attention kernel,
    feed-forward activation, each residual branch); required when the old blocks drop (GPT-2's
    ``attn_pdrop``/``resid_pdrop``, Llama's ``attention_dropout``), whose sites differ. The whole
    model is checked as ``from_hf_lm`` checks it (``nn_hf.read_blocks``): what its forward hands
    the blocks (the causal mask, Llama's rotary embedding) must be what the new blocks compute.
    """
    if isinstance(hf_model, torch.nn.Module) and any(isinstance(part, SchemeBlock) for part in hf_model.modules()):
        raise SplitformerError(f"{type(hf_model).__name__}'s blocks were already replaced by replace_blocks; replace "
                               "the blocks of a fresh model (from_pretrained), or load the scheme's own model")
    with _evaluated(hf_model):
        parts, layers = read_blocks(hf_model)
    blocks = parts["blocks"]
    rate = _drop_rate(blocks, dropout)
    activation = layers[0].activation if activation is None else activation
    module = stack_module(as_scheme(scheme, activation), causal=True)
    replaced = [SchemeBlock(_replacement(old, adapted, module, initialize, rate), index)
                for index, (old, adapted) in enumerate(zip(blocks, layers))]
    for index, block in enumerate(replaced):
        blocks[index] = block
    return hf_model
