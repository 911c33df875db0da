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
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from splitformer.symbolic.builtins import builtin_names
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.scheme import Scheme
from splitformer.symbolic.scheme_file import load_scheme, parse_scheme

from .api import as_scheme
from .hf_cache import CacheLayout, cache_layout, check_layers, read_layer, write_layer
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
        if scheme not in builtin_names() or self.activation is not None:  # a built-in's name with its activation too
            scheme = load_scheme(scheme) if scheme in builtin_names() else parse_scheme(scheme, "the config's scheme")
            scheme = scheme if self.activation is None else scheme.with_activation(self.activation)
        options = self.stack_options or {}
        if not isinstance(options, dict) or not all(isinstance(name, str) for name in options):
            raise ValueError(f"stack_options must be a mapping of option names, got {type(options).__name__}")
        taken = sorted(set(options) & {*_SIZES, "tie_weights", "device", "dtype"})
        if taken:
            raise ValueError(f"stack_options: {taken[0]!r} is not a Stack option here (the configuration's own "
                             "field, or the model's)")
        return LanguageModel(scheme, **{name: getattr(self, name) for name in _SIZES},
                             tie_weights=self.tie_word_embeddings, **options)


class SplitformerForCausalLM(transformers.PreTrainedModel, transformers.GenerationMixin):
    """A ``LanguageModel`` (``.model``) behind transformers' causal-LM interface."""

    config_class = SplitformerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"

    def __init__(self, config: SplitformerConfig, model: LanguageModel | None = None):
        super().__init__(config)
        self.model = config.language_model() if model is None else model
        if model is None:  # the end tokens generate ends rows with: the config's, as transformers' generate reads them
            self.model.eos_token_id, self.model.pad_token_id = config.eos_token_id, config.pad_token_id
        if config.tie_word_embeddings:
            self._tied_weights_keys = {"model.head.weight": "model.embed.weight"}
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        if isinstance(module, LanguageModel):
            module.reset_parameters()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' ``from_pretrained``, refusing a checkpoint that lacks a parameter the configuration asks for
        (a config field overridden: ``n_layers=3``, ``final_norm=True``): transformers would leave it as the
        uninitialized memory it allocated."""
        wants_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        if info["missing_keys"]:
            missing = sorted(info["missing_keys"])
            raise ValueError(f"the checkpoint lacks {len(missing)} parameter(s) the configuration asks for "
                             f"({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''}): change the configuration "
                             "back, or build the model with to_hf and load what you have into it")
        return (model, info) if wants_info else model

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
                past_key_values: Cache | None = None, return_dict: bool | None = None,
                **kwargs) -> CausalLMOutputWithPast | tuple:
        """Logits of the next token; ``loss`` (shifted cross-entropy, -100 ignored) with ``labels``,
        summed over ``num_items_in_batch`` tokens when ``Trainer`` gives it (gradient accumulation).

        ``attention_mask`` (batch, cached + new tokens): 1 keeps a token, 0 marks padding.
        ``cache`` (or its older name ``past_key_values``): a ``DynamicCache`` (made here when
        ``use_cache`` and none is given; ``use_cache`` defaults to the config's in eval mode, off
        in training). ``return_dict=False``: a tuple. ``output_attentions`` and
        ``output_hidden_states`` may be False; any other keyword is refused by name.
        """
        cache = _one_cache(cache, past_key_values)
        _check_keywords(kwargs)
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("input_ids is required: a splitformer LanguageModel embeds its tokens itself")
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, tokens) token ids, got {list(input_ids.shape)}")
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError(f"attention_mask must be (batch, tokens) of 1 and 0, got {list(attention_mask.shape)}")
        use_cache = self.config.use_cache and not self.training if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if cache is not None:
            check_layers(cache, len(self.model.stack.layers))
        dtype = next(self.model.stack.parameters()).dtype
        layers = None if cache is None else [read_layer(cache, index, self._cache_layout, dtype)
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
        output = CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache if use_cache else None)
        return output if return_dict is None or return_dict else output.to_tuple()


def _one_cache(cache, past_key_values) -> Cache | None:
    """The cache, given under its name or under transformers' older name ``past_key_values``."""
    if cache is not None and past_key_values is not None:
        raise ValueError("give the cache once: as cache= or as past_key_values= (its older name), not both")
    cache = past_key_values if cache is None else cache
    if cache is not None and not (isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer
                                                                          for layer in cache.layers)):
        raise TypeError(f"cache (past_key_values) must be a transformers DynamicCache (every earlier token's keys "
                        f"and values, in order), got {type(cache).__name__}")
    return cache


#: Keywords of transformers' interface the forward takes when false: it returns no attentions or hidden states.
_FALSE_ONLY = ("output_attentions", "output_hidden_states")


def _check_keywords(keywords: dict) -> None:
    """Refuse a keyword the forward does not read (``token_type_ids``, ``cache_position``, ``logits_to_keep``, …):
    ignored, it would compute something else than asked."""
    unread = sorted(f"{name}={value!r}" if name in _FALSE_ONLY else name for name, value in keywords.items()
                    if name not in _FALSE_ONLY or value)
    if unread:
        raise TypeError(f"SplitformerForCausalLM.forward does not take {', '.join(unread)} (a splitformer "
                        "LanguageModel has no such input or output)")


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
    """A module's plain attributes (``eps``, ``bias``, ``max_norm``, …), not its tensors, submodules or mode, nor a
    ``LanguageModel``'s end tokens (``to_hf`` writes them into the config, where ``generate`` reads them)."""
    generation = ("eos_token_id", "pad_token_id") if isinstance(module, LanguageModel) else ()
    return {name: value for name, value in vars(module).items()
            if not name.startswith("_") and name != "training" and name not in generation}


def _same(value, other) -> bool:
    try:
        return bool(value == other)
    except (RuntimeError, TypeError, ValueError):  # a tensor set as an attribute: not a plain value
        return False


def _kind(module: torch.nn.Module | None) -> str:
    return "nothing" if module is None else f"a {type(module).__name__}"


def _described(parameter: torch.Tensor) -> str:
    return f"{list(parameter.shape)} {parameter.dtype}"


def _sharing(model: torch.nn.Module) -> dict[str, list[str]]:
    """Each parameter's name and the names of the other parameters that are the same object (a tied head)."""
    named = list(model.named_parameters(remove_duplicate=False))
    return {name: [other for other, same in named if same is parameter and other != name] for name, parameter in named}


def _edited(what: str, built: str) -> SplitformerError:
    return SplitformerError(f"to_hf: {what} but the model's arguments (what the config stores) build {built}; build "
                            "the LanguageModel that way (then load_state_dict) instead of editing it afterwards")


def _check_as_built(model: LanguageModel) -> None:
    """Refuse a model edited after construction: the config stores ``model.arguments``, and ``from_pretrained``
    rebuilds the model those arguments build. Compared with that rebuild (on the meta device: no memory, no
    values), module by module: its class, plain attributes, forward hooks, parameters and buffers (name, shape,
    dtype), and which parameters are one object (a head tied to the embedding)."""
    rebuilt = LanguageModel(**model.arguments, device="meta", dtype=next(model.parameters()).dtype)
    have = dict(model.named_modules(remove_duplicate=False))
    built = dict(rebuilt.named_modules(remove_duplicate=False))
    for name in [*built, *(name for name in have if name not in built)]:
        where = f"model.{name}" if name else "the LanguageModel"
        module, wanted = have.get(name), built.get(name)
        if type(module).__qualname__ != type(wanted).__qualname__:
            raise _edited(f"{where} is {_kind(module)}", f"{_kind(wanted)} there")
        attributes, expected = _configuration(module), _configuration(wanted)
        for key in sorted(attributes.keys() | expected.keys()):
            if not _same(attributes.get(key), expected.get(key)):
                raise _edited(f"{where} has {key}={attributes.get(key)!r}", f"{key}={expected.get(key)!r}")
        if module._forward_hooks or module._forward_pre_hooks:
            raise _edited(f"{where} has a forward hook", "none")
        parameters = {key: _described(one) for key, one in [*module.named_parameters(recurse=False),
                                                             *module.named_buffers(recurse=False)]}
        expected = {key: _described(one) for key, one in [*wanted.named_parameters(recurse=False),
                                                          *wanted.named_buffers(recurse=False)]}
        for key in [*expected, *(key for key in parameters if key not in expected)]:
            if parameters.get(key) != expected.get(key):
                raise _edited(f"{where}.{key} is {parameters.get(key, 'absent')}", expected.get(key, "none"))
    sharing, expected = _sharing(model), _sharing(rebuilt)
    for name in expected:
        for other in expected[name]:
            if other not in sharing[name]:
                raise _edited(f"model.{name} is not model.{other}",
                              f"them as one parameter (tie_weights={model.arguments['tie_weights']})")
        for other in sharing[name]:
            if other not in expected[name]:
                raise _edited(f"model.{name} is model.{other}", "them as separate parameters")


def to_hf(model: LanguageModel) -> SplitformerForCausalLM:
    """``model`` as a transformers causal LM sharing its parameters (same dtype and device), left as it is;
    a model whose parts differ from what its constructor's arguments (the config) build is refused by name."""
    if not isinstance(model, LanguageModel):
        raise SplitformerError(f"to_hf takes a splitformer.nn.LanguageModel, got {type(model).__name__}")
    _check_as_built(model)
    arguments = dict(model.arguments)
    fields = _scheme_fields(arguments.pop("scheme"))
    tied = arguments.pop("tie_weights")
    sizes = {name: arguments.pop(name) for name in _SIZES}
    dtype = next(model.parameters()).dtype
    config = SplitformerConfig(**fields, **sizes, stack_options=arguments, tie_word_embeddings=tied,
                               dtype=dtype, bos_token_id=None, eos_token_id=model.eos_token_id,
                               pad_token_id=model.pad_token_id)
    return SplitformerForCausalLM(config, model)


transformers.AutoConfig.register(SplitformerConfig.model_type, SplitformerConfig)
transformers.AutoModelForCausalLM.register(SplitformerConfig, SplitformerForCausalLM)
