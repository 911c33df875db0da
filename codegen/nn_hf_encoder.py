"""``transformers``' ``BertModel`` → ``splitformer.nn.TextEncoder``.

``from_hf_encoder(model)`` reads the encoder through the block adapters (``from_hf``: the
``post-ln`` scheme with BERT's activation and ε), the embeddings (word, learned positions,
token types, their LayerNorm) and the pooler when the model has one, into a ``TextEncoder``
whose ``forward`` equals ``last_hidden_state`` and whose ``pool`` equals ``pooler_output``
(``attention_mask`` 0 ↔ ``padding_mask`` True).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

from splitformer.symbolic.errors import SplitformerError

from .adapters import from_hf
from .adapters.inspection import library_name
from .nn import TextEncoder

__all__ = ["from_hf_encoder"]


@functools.lru_cache(maxsize=8)
def _derived(scheme: str, activation: str) -> types.ModuleType:
    """The torch module of a built-in scheme with ``activation``, derived once per process."""
    from .api import derive

    return derive(scheme, activation).torch_module()


def _check_parts(model: Any, eps: float) -> None:
    """Refuse relative positions, edited default ids and an embedding LayerNorm ε other than the layers' (``from_hf``
    refuses parts, tensors and attributes other than BERT's as built: a pooler that is not dense then tanh)."""
    name = type(model).__name__
    embeddings = model.embeddings
    kind = getattr(model.config, "position_embedding_type", "absolute")
    if kind not in (None, "absolute"):
        raise SplitformerError(f"{name} has position_embedding_type={kind!r}; the TextEncoder's positions are "
                               "learned absolute ones")
    _check_default_ids(name, embeddings)
    norm = embeddings.LayerNorm
    if float(norm.eps) != eps:
        raise SplitformerError(f"{name}.embeddings.LayerNorm has eps={norm.eps:g}, its layers eps={eps:g}; "
                               "the TextEncoder takes one eps")


def _check_default_ids(name: str, embeddings: Any) -> None:
    """Refuse edited ``position_ids``/``token_type_ids`` buffers: BERT reads them when the call passes none,
    the TextEncoder computes positions ``0, 1, …`` and token type 0."""
    defaults = {"position_ids": lambda ids: torch.arange(ids.shape[-1], device=ids.device).expand_as(ids),
                "token_type_ids": torch.zeros_like}
    for buffer, default in defaults.items():
        ids = getattr(embeddings, buffer, None)
        if ids is not None and not torch.equal(ids, default(ids)):
            meaning = "0, 1, 2, …" if buffer == "position_ids" else "all 0"
            raise SplitformerError(f"{name}.embeddings.{buffer} is not the default ({meaning}); the TextEncoder "
                                   f"computes the default {buffer.replace('_', ' ')[:-1]}s")


def from_hf_encoder(model: Any, *, torch_module: types.ModuleType | None = None) -> TextEncoder:
    """A ``TextEncoder`` holding a ``BertModel``'s parameters (in their dtype), in eval mode.

    ``torch_module``: the emitted torch module of the encoder's scheme (``generated.torch.post_ln_gelu``
    after ``splitformer derive post-ln --activation gelu``); by default it is derived in memory
    (once per process). The source's dropout is not carried (the result has none).
    """
    if library_name(model) != "BertModel":
        raise SplitformerError(f"no whole-encoder reader for {type(model).__name__}; read BertModel "
                               "(single layers and the encoder stack: splitformer.adapters.from_hf)")
    adapted = from_hf(model)
    _check_parts(model, adapted.eps)
    embeddings, pooler = model.embeddings, model.pooler
    weight = embeddings.word_embeddings.weight
    module = torch_module if torch_module is not None else _derived(adapted.scheme, adapted.activation)
    encoder = TextEncoder(module, weight.shape[0], d_model=adapted.sizes["d_model"], n_heads=adapted.n_heads,
                          d_ff=adapted.sizes["d_ff"], n_layers=len(adapted.layers),
                          max_tokens=embeddings.position_embeddings.num_embeddings,
                          n_token_types=embeddings.token_type_embeddings.num_embeddings, pooler=pooler is not None,
                          eps=adapted.eps, final_norm=False, dtype=weight.dtype, device=weight.device)
    adapted.load_into(encoder.stack)
    with torch.no_grad():
        encoder.embed.weight.copy_(weight)
        encoder.positions.weight.copy_(embeddings.position_embeddings.weight)
        encoder.token_types.weight.copy_(embeddings.token_type_embeddings.weight)
        encoder.embedding_norm.load_state_dict(embeddings.LayerNorm.state_dict())
        if pooler is not None:
            encoder.pooler.load_state_dict(pooler.dense.state_dict())
    return encoder.eval()
