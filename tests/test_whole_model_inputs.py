"""Whole-model readers read what the embeddings and the rotary embedding compute, not only their
tables: ``Embedding.max_norm`` (rows renormalized at lookup), BERT's ``position_ids`` and
``token_type_ids`` buffers (read when a call passes none), Llama's ``rotary_emb.inv_freq`` and
``attention_scaling`` are refused by name when they differ from what the generated model computes
(third attacker's findings 04 and 05); each refusal has a control the readers accept."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from splitformer import SplitformerError
from splitformer import nn as splitformer_nn
from splitformer.adapters import ADAPTERS, from_hf

from llama_reference import llama_config, randomized
from test_adapters import randomize
from test_hf_whole_models import bert

TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])


def gpt2():
    config = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return randomize(transformers.GPT2LMHeadModel(config).double()).eval()


def llama(theta=500.0):
    return randomized(transformers.LlamaForCausalLM(llama_config(theta=theta, vocab_size=32, num_hidden_layers=1,
                                                                 max_position_embeddings=32)))


def refused(read, model, message):
    with pytest.raises(SplitformerError, match=message) as error:
        read(model)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("read", [from_hf, splitformer_nn.from_hf_lm], ids=["from_hf", "from_hf_lm"])
def test_an_embedding_with_max_norm_is_refused_by_name(read):
    model = gpt2()
    model.transformer.wte.padding_idx = 0  # harmless for the forward: accepted
    with torch.no_grad():
        assert (read(model)(TOKENS) - model(TOKENS).logits).abs().max() <= 1e-10
    model.transformer.wte.max_norm = 0.01
    refused(read, model, r"GPT2LMHeadModel\.transformer\.wte \(Embedding\) has max_norm=0\.01: its forward "
                         "renormalizes the rows it looks up")
    source = llama()
    source.model.embed_tokens.max_norm = 1.0
    refused(read, source, r"LlamaForCausalLM\.model\.embed_tokens \(Embedding\) has max_norm=1\.0")


def test_the_whole_language_model_is_inspected_by_from_hf_lm_too():
    model = gpt2()
    model.transformer.wte.register_forward_hook(lambda module, args, out: out * 2)
    refused(splitformer_nn.from_hf_lm, model, r"GPT2LMHeadModel\.transformer\.wte has a forward hook")


@pytest.mark.parametrize("edit, message", [
    (lambda e: setattr(e.word_embeddings, "max_norm", 0.5), r"BertModel\.embeddings\.word_embeddings \(Embedding\) has max_norm"),
    (lambda e: setattr(e.position_embeddings, "max_norm", 0.5), r"embeddings\.position_embeddings \(Embedding\) has max_norm"),
    (lambda e: e.position_ids.copy_(e.position_ids.flip(-1)), r"BertModel\.embeddings\.position_ids is not the default \(0, 1, 2, …\)"),
    (lambda e: e.token_type_ids.fill_(1), r"BertModel\.embeddings\.token_type_ids is not the default \(all 0\)"),
], ids=["word max_norm", "position max_norm", "position_ids", "token_type_ids"])
def test_bert_embeddings_that_compute_otherwise_are_refused_by_name(edit, message):
    model = bert(add_pooling_layer=False).eval()
    tokens = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (splitformer_nn.from_hf_encoder(model)(tokens) - model(tokens).last_hidden_state).abs().max() <= 1e-10
        edit(model.embeddings)
    refused(splitformer_nn.from_hf_encoder, model, message)


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.inv_freq.mul_(0.5), r"rotary_emb\.inv_freq differs from the default RoPE frequencies of "
                                     r"rope_theta=500 \(relative 0\.5\)"),
    (lambda r: r.inv_freq.mul_(1 + 1e-5), r"rotary_emb\.inv_freq differs .* \(relative 1e-05\)"),
    (lambda r: r.inv_freq.__setitem__(slice(None), r.inv_freq.flip(0)), r"rotary_emb\.inv_freq differs"),
    (lambda r: setattr(r, "attention_scaling", 2.0), r"rotary_emb\.attention_scaling is 2; the llama scheme's rotary "
                                                     "embedding scales cos and sin by 1"),
], ids=["half", "1e-5", "reversed", "attention_scaling"])
def test_an_edited_llama_rotary_embedding_is_refused_by_name(edit, message):
    model = llama()
    with torch.no_grad():
        edit(model.model.rotary_emb)
    refused(from_hf, model, r"LlamaForCausalLM\.model\." + message)


def test_the_default_rotary_embedding_is_accepted_in_float32_and_float64():
    """transformers computes inv_freq in float32: its rounding (~1e-7 relative) is within the tolerance
    (the logits' parity is test_llm_hf's, which computes transformers' RoPE in float64)."""
    for model in (llama(theta=10000.0), llama(theta=10000.0).float()):
        assert model.model.rotary_emb.inv_freq.dtype == next(model.parameters()).dtype
        assert isinstance(from_hf(model), splitformer_nn.LanguageModel)


def test_a_layer_holding_its_own_rotary_embedding_is_checked():
    """transformers 4 put a rotary embedding in each layer's attention: the layer reader checks it. Attached to
    a transformers 5 layer (whose forward never calls it) it is a part the layer is not built with: refused."""
    config = llama_config()
    layer = randomized(LlamaDecoderLayer(config, 0))
    assert from_hf(layer).options["rope_theta"] == 500.0  # control: as built
    layer.self_attn.rotary_emb = LlamaRotaryEmbedding(config).double()
    assert ADAPTERS["hf", "LlamaDecoderLayer"](layer).options["rope_theta"] == 500.0
    refused(from_hf, layer, r"LlamaDecoderLayer\.self_attn\.rotary_emb \(LlamaRotaryEmbedding\) is a part LlamaDecoderLayer "
                            "does not build")
    with torch.no_grad():
        layer.self_attn.rotary_emb.inv_freq.mul_(0.5)
    refused(from_hf, layer, r"LlamaDecoderLayer\.self_attn\.rotary_emb\.inv_freq differs")
