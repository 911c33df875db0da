"""Sources whose parameters share memory (one Parameter under two names, or two Parameters viewing one storage,
within a layer or across layers) are refused at read time, naming both entries: a generated Block/Stack would
train two copies and writing them back would keep one (attack11 F1: 0.57–52 off after one trained step; F2: BERT
raised a raw KeyError). Controls: each source as built is read; whole layers shared at every step are read as
``tied`` (test_adapter_refusals); a GPT-2 head tied to its embedding is read; views of one storage that do not
overlap are read."""

from __future__ import annotations

import pytest
import torch

from splitformer import SplitformerError
from splitformer.adapters import from_hf, from_timm, from_torch
from splitformer.nn import from_hf_lm

from test_adapter_refusals import _bert_layer, _gpt2_block, _llama_layer, _pre_ln_encoder, _timm_block, one_line
from test_adapters import bert, encoder_layer
from test_nn_hf import gpt2


def _share(module, first: str, second: str) -> None:
    """``second`` becomes the very Parameter ``first`` is."""
    owner, _, name = second.rpartition(".")
    setattr(module.get_submodule(owner), name, module.get_parameter(first))


def _view(module, first: str, second: str) -> None:
    """``second`` becomes another Parameter object viewing ``first``'s storage."""
    owner, _, name = second.rpartition(".")
    setattr(module.get_submodule(owner), name, torch.nn.Parameter(module.get_parameter(first).detach()))


CASES = [  # (reader, make, share, first, second)
    (from_torch, encoder_layer, _share, "norm1.weight", "norm2.weight"),
    (from_torch, encoder_layer, _view, "norm1.weight", "norm2.weight"),
    (from_torch, _pre_ln_encoder, _share, "layers.0.linear1.weight", "layers.1.linear1.weight"),
    (from_hf, _gpt2_block, _share, "ln_1.weight", "ln_2.weight"),
    (from_hf, _bert_layer, _share, "attention.output.LayerNorm.weight", "output.LayerNorm.weight"),
    (from_hf, lambda: bert(layers=2), _view, "encoder.layer.0.output.dense.bias", "encoder.layer.1.output.dense.bias"),
    (from_hf, _llama_layer, _share, "input_layernorm.weight", "post_attention_layernorm.weight"),
    (from_timm, _timm_block, _share, "norm1.weight", "norm2.weight"),
    (from_hf_lm, gpt2, _share, "transformer.h.0.ln_1.weight", "transformer.h.1.ln_1.weight"),
    (from_hf_lm, gpt2, _view, "transformer.h.0.attn.c_attn.bias", "transformer.h.1.attn.c_attn.bias"),
]


@pytest.mark.parametrize("reader, make, share, first, second", CASES,
                         ids=[f"{make.__name__}-{share.__name__}-{second}" for _, make, share, _, second in CASES])
def test_parameters_sharing_memory_are_refused_naming_both(reader, make, share, first, second):
    source = make()
    reader(source)  # control: the source as built
    share(source, first, second)
    owner = type(source).__name__
    with pytest.raises(SplitformerError, match=rf"^{owner}\.{first} and {owner}\.{second} share one parameter's "
                                               "memory") as error:
        reader(source)
    one_line(error)


def test_a_head_tied_to_the_embedding_and_disjoint_views_of_one_storage_are_read():
    model = gpt2()
    assert model.lm_head.weight is model.transformer.wte.weight
    assert from_hf_lm(model).tie_weights  # the tie the LanguageModel maps
    layer = encoder_layer()
    both = torch.cat([layer.norm1.weight.detach(), layer.norm2.weight.detach()])
    layer.norm1.weight, layer.norm2.weight = (torch.nn.Parameter(half) for half in both.split(layer.norm1.weight.numel()))
    assert layer.norm1.weight.untyped_storage().data_ptr() == layer.norm2.weight.untyped_storage().data_ptr()
    from_torch(layer)  # one storage, no byte in common
