"""``splitformer.nn.LanguageModel`` as a ``transformers`` model: ``generate``, ``save_pretrained``, ``Trainer``.

``to_hf(model)`` wraps a ``LanguageModel`` (sharing its parameters) into a
``SplitformerForCausalLM``, a ``PreTrainedModel`` whose ``SplitformerConfig`` holds what
rebuilds it: the scheme (a built-in name, or the text of its scheme file and its
activation), the sizes, the vocabulary, the tying of the head. Both are registered with
``AutoConfig`` and ``AutoModelForCausalLM`` under the model type ``"splitformer"`` when this
module is imported, so ``AutoModelForCausalLM.from_pretrained(folder)`` reads back what
``save_pretrained(folder)`` wrote.

The KV cache is transformers' own (``DynamicCache``, one layer per block; see
``splitformer.codegen.hf_cache``). transformers is an optional dependency: only the ``hf_*``
modules import it.
"""

from __future__ import annotations

import dataclasses
import types
from functools import cached_property
from pathlib import Path

import torch
import transformers
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from splitformer.symbolic.builtins import builtin_names
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.scheme import Scheme
from splitformer.symbolic.scheme_file import parse_scheme

from .api import as_scheme
from .hf_cache import CacheLayout, cache_layout, read_layer, write_layer
from .nn import LanguageModel

__all__ = ["SplitformerConfig", "SplitformerForCausalLM", "to_hf"]

#: ``LanguageModel`` arguments the config holds under their own names.
_SIZES = ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_tokens", "dropout", "final_norm")


class SplitformerConfig(transformers.PreTrainedConfig):
    """What rebuilds a ``LanguageModel``: ``scheme`` is a built-in name or the text of a scheme
    file (with ``activation``, or None for the file's own); ``stack_options`` go to ``Stack``
    (``n_kv_heads``, ``eps``, ``bias``, ``rope_theta``)."""

    model_type = "splitformer"
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                     "max_position_embeddings": "max_tokens"}
    scheme: str = "pre-ln"
    activation: str | None = None
    vocab_size: int = 256
    d_model: int = 64
    n_heads: int = 4
    d_ff: int | None = None
    n_layers: int = 2
    max_tokens: int = 512
    dropout: float = 0.0
    final_norm: bool | None = None
    stack_options: dict | None = None
    tie_word_embeddings: bool = True
    use_cache: bool = True

    def language_model(self) -> LanguageModel:
        """A freshly initialized ``LanguageModel`` of this configuration."""
        scheme = self.scheme
        if scheme not in builtin_names():
            scheme = parse_scheme(scheme, "the config's scheme")
            scheme = scheme if self.activation is None else scheme.with_activation(self.activation)
        return LanguageModel(scheme, **{name: getattr(self, name) for name in _SIZES},
                             tie_weights=self.tie_word_embeddings, **(self.stack_options or {}))


class SplitformerForCausalLM(transformers.PreTrainedModel, transformers.GenerationMixin):
    """A ``LanguageModel`` (``.model``) behind transformers' causal-LM interface."""

    config_class = SplitformerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"

    def __init__(self, config: SplitformerConfig, model: LanguageModel | None = None):
        super().__init__(config)
        self.model = config.language_model() if model is None else model
        if config.tie_word_embeddings:
            self._tied_weights_keys = {"model.head.weight": "model.embed.weight"}
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        if isinstance(module, LanguageModel):
            module.reset_parameters()

    def save_pretrained(self, save_directory, *args, state_dict: dict | None = None, **kwargs):
        """transformers' ``save_pretrained``; the default state dict holds each tensor in storage of its
        own (a generated Block keeps ``W_q``, ``W_k``, ``W_v`` as views of one tensor, which safetensors
        cannot write); a tied head stays tied."""
        if state_dict is None:
            state_dict = {name: tensor.detach().clone() for name, tensor in self.state_dict().items()
                          if name not in (getattr(self, "_tied_weights_keys", None) or {})}
        return super().save_pretrained(save_directory, *args, state_dict=state_dict, **kwargs)

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.embed

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.model.head

    @cached_property
    def _cache_layout(self) -> CacheLayout:
        return cache_layout(self.model.stack.layers[0])

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, cache: Cache | None = None,
                labels: torch.LongTensor | None = None, use_cache: bool | None = None,
                inputs_embeds: torch.Tensor | None = None, num_items_in_batch: int | None = None,
                **kwargs) -> CausalLMOutputWithPast:
        """Logits of the next token; ``loss`` (shifted cross-entropy, -100 ignored) with ``labels``,
        summed over ``num_items_in_batch`` tokens when ``Trainer`` gives it (gradient accumulation).

        ``attention_mask`` (batch, cached + new tokens): 1 keeps a token, 0 marks padding.
        ``cache``: a ``DynamicCache`` (made here when ``use_cache`` and none is given; ``use_cache``
        defaults to the config's in eval mode, off in training).
        Other keywords of transformers' interface (``return_dict``, ``output_attentions``) are ignored.
        """
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("input_ids is required: a splitformer LanguageModel embeds its tokens itself")
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError(f"attention_mask must be (batch, tokens) of 1 and 0, got {list(attention_mask.shape)}")
        use_cache = self.config.use_cache and not self.training if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        layers = None if cache is None else [read_layer(cache, index, self._cache_layout)
                                             for index in range(len(self.model.stack.layers))]
        padding = None if attention_mask is None else attention_mask == 0
        logits = self.model(input_ids, padding_mask=padding, cache=layers, positions=position_ids)
        for index, own in enumerate(layers or ()):
            write_layer(cache, index, own, self._cache_layout, input_ids.shape[1])
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                                                     ignore_index=-100,
                                                     reduction="mean" if num_items_in_batch is None else "sum")
            loss = loss if num_items_in_batch is None else loss / num_items_in_batch
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache if use_cache else None)


def _scheme_fields(scheme) -> dict:
    """The config's ``scheme`` and ``activation`` for what a ``LanguageModel`` was built from."""
    if isinstance(scheme, str) and scheme in builtin_names():
        return {"scheme": scheme, "activation": None}
    if isinstance(scheme, types.ModuleType):
        raise SplitformerError(f"to_hf: the model was built from the emitted module {scheme.__name__}; build it from "
                               "a built-in name, a scheme file or a Scheme so that its config can rebuild it")
    scheme = as_scheme(scheme) if isinstance(scheme, (str, Path, Scheme)) else scheme
    if not scheme.source:
        raise SplitformerError(f"to_hf: the scheme {scheme.name!r} has no scheme-file text to store in the config "
                               "(build it with splitformer.scheme(...) or read it from a file)")
    _check_source(scheme)
    return {"scheme": scheme.source, "activation": scheme.activation}


#: Fields the rebuilt model does not take from the text: LanguageModel derives causal, under its own name.
_REBUILT_ANYWAY = frozenset({"causal", "made_causal", "emitted_name"})


def _check_source(scheme: Scheme) -> None:
    """Refuse a scheme whose text (what the config stores) rebuilds another scheme: a ``dataclasses.replace``
    keeps the text of the scheme it was made from."""
    rebuilt = parse_scheme(scheme.source, f"the scheme {scheme.name!r}'s source").with_activation(scheme.activation)
    for item in dataclasses.fields(Scheme):
        if item.compare and item.name not in _REBUILT_ANYWAY and getattr(rebuilt, item.name) != getattr(scheme, item.name):
            raise SplitformerError(f"to_hf: the scheme {scheme.name!r} has {item.name}={getattr(scheme, item.name)!r} "
                                   f"but its source text (what the config stores) says {getattr(rebuilt, item.name)!r}; "
                                   "build the scheme anew (splitformer.scheme(...)) instead of editing a copy")


def _configuration(module: torch.nn.Module) -> dict:
    """A module's plain attributes (``eps``, ``bias``, ``n_heads``, …), not its tensors, submodules or mode."""
    return {name: value for name, value in vars(module).items() if not name.startswith("_") and name != "training"}


def _check_stack_as_built(model: LanguageModel) -> None:
    """Refuse a model whose Stack was edited after construction: the config stores ``model.arguments``, and
    ``from_pretrained`` rebuilds the Stack those arguments build (on the meta device: no memory, no values)."""
    rebuilt = LanguageModel(**model.arguments, device="meta").stack
    pairs = [("the Stack", model.stack, rebuilt)]
    if len(model.stack.layers) == len(rebuilt.layers):
        pairs += [(f"the Stack layers[{index}]", *pair) for index, pair in enumerate(zip(model.stack.layers, rebuilt.layers))]
    else:
        raise SplitformerError(f"to_hf: the Stack has {len(model.stack.layers)} layers, its arguments build "
                               f"{len(rebuilt.layers)}; the config would rebuild the latter")
    for where, module, built in pairs:
        have, wanted = _configuration(module), _configuration(built)
        for name in sorted(have.keys() | wanted.keys()):
            if have.get(name) != wanted.get(name):
                raise SplitformerError(f"to_hf: {where} has {name}={have.get(name)!r} but the model's arguments "
                                       f"(what the config stores) build {name}={wanted.get(name)!r}; build the "
                                       "LanguageModel with that value instead of editing it afterwards")


def to_hf(model: LanguageModel) -> SplitformerForCausalLM:
    """``model`` as a transformers causal LM sharing its parameters (same dtype and device)."""
    if not isinstance(model, LanguageModel):
        raise SplitformerError(f"to_hf takes a splitformer.nn.LanguageModel, got {type(model).__name__}")
    _check_stack_as_built(model)
    arguments = dict(model.arguments)
    fields = _scheme_fields(arguments.pop("scheme"))
    tied = arguments.pop("tie_weights")
    sizes = {name: arguments.pop(name) for name in _SIZES}
    dtype = model.embed.weight.dtype
    config = SplitformerConfig(**fields, **sizes, stack_options=arguments, tie_word_embeddings=tied,
                               dtype=dtype, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return SplitformerForCausalLM(config, model)


transformers.AutoConfig.register(SplitformerConfig.model_type, SplitformerConfig)
transformers.AutoModelForCausalLM.register(SplitformerConfig, SplitformerForCausalLM)
