"""Whole-model readers compare every submodule with the one the library builds from the configuration
(``as_built``), outside the blocks too: a dropout of the embeddings replaced by ``nn.Tanh()``, a part deleted,
or one added is refused by name in one line (tenth attacker, F3: ``transformer.drop`` 0.206 off,
``embeddings.dropout`` 0.027 and 0.05 off, all accepted before). Controls: the same models as built adapt and
equal their sources in float64 within 1e-10, every parameter random."""

from __future__ import annotations

import re

import pytest
import torch
import transformers

from splitformer import SplitformerError
from splitformer import nn as splitformer_nn
from splitformer.adapters import from_hf

from test_hf_whole_models import POST_LN_GELU, TORCH_VIT, bert
from test_whole_model_inputs import gpt2
from test_adapters import randomize

TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]])
PIXELS = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def hf_vit():
    config = transformers.ViTConfig(image_size=16, patch_size=4, hidden_size=12, num_attention_heads=3,
                                    num_hidden_layers=1, intermediate_size=20, num_labels=4)
    torch.manual_seed(0)
    return randomize(transformers.ViTForImageClassification(config).double())


def _gpt2_difference(model):
    return (splitformer_nn.from_hf_lm(model)(TOKENS) - model(TOKENS).logits).abs().max()


def _bert_difference(model):
    return (splitformer_nn.from_hf_encoder(model, torch_module=POST_LN_GELU)(TOKENS)
            - model(TOKENS).last_hidden_state).abs().max()


def _vit_difference(model):
    return (from_hf(model).build(TORCH_VIT).logits(PIXELS) - model(PIXELS).logits).abs().max()


#: (model, its reader's difference from the source, owner, the part outside the blocks)
MODELS = [(gpt2, _gpt2_difference, "GPT2LMHeadModel", "transformer.drop"),
          (bert, _bert_difference, "BertModel", "embeddings.dropout"),
          (hf_vit, _vit_difference, "ViTForImageClassification", "vit.embeddings.dropout")]
IDS = ["gpt2 from_hf_lm", "bert from_hf_encoder", "vit from_hf"]


def _refused(difference, model, message):
    with torch.no_grad(), pytest.raises(SplitformerError, match=message) as error:
        difference(model)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("make, difference, owner, path", MODELS, ids=IDS)
def test_the_models_as_built_equal_their_sources(make, difference, owner, path):
    with torch.no_grad():
        assert difference(make()) <= 1e-10


@pytest.mark.parametrize("make, difference, owner, path", MODELS, ids=IDS)
def test_a_part_outside_the_blocks_of_another_class_is_refused_by_name(make, difference, owner, path):
    model = make()
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent), name, torch.nn.Tanh())
    _refused(difference, model, rf"^{re.escape(owner)}\.{re.escape(path)} is Tanh, not the Dropout {owner} builds there")


@pytest.mark.parametrize("make, difference, owner, path", MODELS, ids=IDS)
def test_a_part_deleted_or_added_outside_the_blocks_is_refused_by_name(make, difference, owner, path):
    model = make()
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent), name, None)
    _refused(difference, model, rf"^{re.escape(owner)}\.{re.escape(path)} is missing: {owner} builds a Dropout "
                                "there")
    model = make()
    model.get_submodule(parent).extra = torch.nn.Linear(2, 2, dtype=torch.float64)
    _refused(difference, model, rf"^{re.escape(owner)}\.{re.escape(parent)}\.extra \(Linear\) is a part {owner} "
                                "does not build from this configuration")
