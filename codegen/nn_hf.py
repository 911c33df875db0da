"""``transformers`` causal language models → ``splitformer.nn.LanguageModel``.

``from_hf_lm(model)`` reads a ``GPT2LMHeadModel``/``GPT2Model`` (token and learned position
embeddings, the ``gpt2`` blocks, ``ln_f``, the head tied to the token embedding) or a
``LlamaForCausalLM``/``LlamaModel`` (token embedding, the ``llama`` blocks with RoPE and
grouped keys, the final RMSNorm, the head), block by block through the block adapters of
``splitformer.adapters``, into a ``LanguageModel`` of the same scheme that computes the same
logits. A ``*Model`` without a head gets the head tied to its token embedding. What the model's
forward reads from its configuration when it builds the attention mask must give the causal mask
of all its blocks (``_check_causal_masks``).
"""

from __future__ import annotations

import warnings
from pathlib import PurePath
from typing import Any

import torch

from splitformer.symbolic.errors import SplitformerError

from .adapters import from_hf
from .adapters.adapted import Adapted
from .adapters.hf_llama import check_rotary
from .adapters.as_built import check_as_built
from .adapters.inspection import check_computation, check_parts, dropout_rates, library_name
from .adapters.sharing import check_shared_storage
from .nn import LanguageModel

__all__ = ["from_hf_lm", "read_blocks"]


def _parts(model: Any) -> dict[str, Any]:
    """The pieces of a supported model, by role; a refusal naming the class otherwise."""
    name = library_name(model)
    if name in ("GPT2LMHeadModel", "GPT2Model"):
        body = model.transformer if name == "GPT2LMHeadModel" else model
        prefix = "transformer." if name == "GPT2LMHeadModel" else ""
        layout = {f"{prefix}wte": "Embedding", f"{prefix}wpe": "Embedding", f"{prefix}ln_f": "LayerNorm"}
        return {"layout": layout, "scheme": "gpt2", "embed": body.wte, "positions": body.wpe, "blocks": body.h, "runs": None,
                "norm": body.ln_f, "head": getattr(model, "lm_head", None), "max_tokens": model.config.n_positions,
                "rotary": None}
    if name in ("LlamaForCausalLM", "LlamaModel"):
        body = model.model if name == "LlamaForCausalLM" else model
        prefix = "model." if name == "LlamaForCausalLM" else ""
        layout = {f"{prefix}embed_tokens": "Embedding", f"{prefix}norm": "LlamaRMSNorm"}
        return {"layout": layout, "scheme": "llama", "embed": body.embed_tokens, "positions": None,
                "blocks": body.layers, "runs": (f"{prefix}config.num_hidden_layers", body.config.num_hidden_layers),
                "norm": body.norm, "head": getattr(model, "lm_head", None),
                "max_tokens": model.config.max_position_embeddings, "rotary": getattr(body, "rotary_emb", None)}
    if isinstance(model, (str, PurePath)):  # a hub name or a folder: the model transformers loads from it is read
        raise SplitformerError(f"no whole-model reader for the {type(model).__name__} {str(model)[:60]!r}: a model "
                               "is read once loaded (transformers' AutoModelForCausalLM.from_pretrained(...))")
    what = name or f"{type(model).__name__} (no library class)"
    raise SplitformerError(f"no whole-model reader for {what}; read GPT2LMHeadModel, GPT2Model, LlamaForCausalLM "
                           "or LlamaModel (single blocks: splitformer.adapters.from_hf)")


def _check_causal_masks(name: str, model: Any, blocks: int, runs: tuple[str, Any] | None) -> None:
    """Refuse what makes a causal LM's forward (``model``, named ``name``) build another mask than the causal
    one, or run fewer blocks than it holds: a ``config.is_causal`` other than True on any part (transformers'
    ``create_causal_mask`` then builds a bidirectional one), a ``config._attn_implementation`` of None (no mask
    at all), a mask function registered in place of transformers' own for the implementation, and ``runs``
    (``(path, count)``: Llama's forward runs ``layers[:config.num_hidden_layers]``) other than the blocks held."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask

    for path, part in model.named_modules():
        config = vars(part).get("config")
        if config is None:
            continue
        where = f"{name}.{path}.config" if path else f"{name}.config"
        if getattr(config, "is_causal", True) is not True:
            raise SplitformerError(f"{where}.is_causal is {config.is_causal!r}: transformers then builds a bidirectional "
                                   "mask (tokens attend to later ones); a causal LM leaves it True")
        implementation = getattr(config, "_attn_implementation", None)
        builtin = {"eager": eager_mask, "sdpa": sdpa_mask}.get(implementation)
        function = ALL_MASK_ATTENTION_FUNCTIONS.get(implementation)
        if builtin is None or function is not builtin:
            shown = "no mask" if function is None else f"its mask with {getattr(function, '__qualname__', function)}"
            raise SplitformerError(f"{where}._attn_implementation is {implementation!r}: transformers builds {shown}; "
                                   "from_hf_lm reads the built-in eager and sdpa causal masks only "
                                   "(model.set_attn_implementation('sdpa'))")
    if runs is not None and runs[1] != blocks:
        raise SplitformerError(f"{name}.{runs[0]} is {runs[1]!r}: the forward runs that many of the {blocks} blocks "
                               "it holds; set it to the number of blocks")


def read_blocks(model: Any) -> tuple[dict[str, Any], list[Adapted]]:
    """``model``'s parts by role (``_parts``) and its blocks read by ``from_hf``, once the whole model is checked:
    refused, by name, when a part computes otherwise than its class says (``inspection.check_computation``,
    ``check_parts``, ``check_as_built``), when parameters of different parts share memory, when its configuration
    makes the forward build another mask than the causal one (``_check_causal_masks``), or when Llama's rotary
    embedding, which the model's forward hands to every block, is not what its configuration derives
    (``check_rotary``). ``from_hf_lm`` and ``replace_blocks`` read through it."""
    parts = _parts(model)
    name = type(model).__name__
    check_computation(name, model)  # hooks, overrides, instance methods on every part, not only the blocks
    _check_causal_masks(name, model, len(parts["blocks"]), parts["runs"])
    check_parts(name, model, parts["layout"] | ({"lm_head": "Linear"} if parts["head"] is not None else {}))
    head = parts["head"]
    tied = head is None or head.weight is parts["embed"].weight
    check_shared_storage(name, model, exempt={"lm_head.weight"} if tied else ())  # across blocks and parts
    layers = [from_hf(block) for block in parts["blocks"]]
    first = layers[0]
    if parts["rotary"] is not None:
        body = "model." if hasattr(model, "model") else ""
        check_rotary(f"{name}.{body}rotary_emb", parts["rotary"], first.sizes["d_model"] // first.n_heads,
                     first.options["rope_theta"])
    check_as_built(name, model)  # embeddings, final norm, rotary embedding: each attribute as built
    return parts, layers


def from_hf_lm(model: Any) -> LanguageModel:
    """A ``LanguageModel`` holding ``model``'s parameters (in their dtype; a rotary model's narrower than float32 in
    float32, exactly: its blocks compute positions and angles in their dtype), in eval mode; refused, by
    name, when the whole-model checks of ``read_blocks`` refuse it or the ``LanguageModel`` would compute
    otherwise (a head with a bias, a final norm's ε other than the blocks')."""
    parts, layers = read_blocks(model)
    head, first, norm = parts["head"], layers[0], parts["norm"]
    tied = head is None or head.weight is parts["embed"].weight
    embedding = parts["embed"].weight
    if getattr(head, "bias", None) is not None:
        raise SplitformerError(f"{type(model).__name__}.lm_head has a bias; the LanguageModel head has none")
    options = {key: first.options[key] for key in ("n_kv_heads", "rope_theta") if key in first.options}
    dtype = torch.promote_types(embedding.dtype, torch.float32) if "rope_theta" in options else embedding.dtype
    result = LanguageModel(parts["scheme"], embedding.shape[0], d_model=first.sizes["d_model"],
                           n_heads=first.n_heads, d_ff=first.sizes["d_ff"], n_layers=len(layers),
                           max_tokens=parts["max_tokens"], tie_weights=tied, final_norm=True, eps=first.eps,
                           bias=first.bias, dtype=dtype, device=embedding.device, **options)
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    if eps != first.eps:
        raise SplitformerError(f"{type(model).__name__}'s final norm has ε = {eps}, its blocks {first.eps}")
    for adapted, block in zip(layers, result.stack.layers):
        adapted.check_computes(block)
    final = {"gain": norm.weight} if first.bias is False else {"gain": norm.weight, "bias": norm.bias}
    with torch.no_grad():
        result.stack.load_params([adapted.params for adapted in layers], final)
        result.embed.weight.copy_(embedding)
        if parts["positions"] is not None:
            result.positions.weight.copy_(parts["positions"].weight)
        if not tied:
            result.head.weight.copy_(head.weight)
    generation = getattr(model, "generation_config", None)  # what transformers' generate ends rows with
    result.eos_token_id = getattr(generation, "eos_token_id", None)
    result.pad_token_id = getattr(generation, "pad_token_id", None)
    rates = dropout_rates(model)
    if rates:  # the sources drop where a LanguageModel does not (GPT-2: no dropout after its activation)
        warnings.warn(f"from_hf_lm: {type(model).__name__}'s dropout (p = {', '.join(map(str, rates))}) is not "
                      "carried: the LanguageModel drops nothing in training (build one with dropout= to train with "
                      "one)", stacklevel=2)
    return result.eval()
