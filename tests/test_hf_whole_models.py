"""Whole models read from their sources: timm's ``VisionTransformer`` into the generated ``vit``
network (``from_timm(model, network="vit")``) and transformers' ``BertModel`` into
``splitformer.nn.TextEncoder`` (``from_hf_encoder``), each against the source's own forward in
float64 (random weights, every bias nonzero), with negative controls and the refusals by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from splitformer import SplitformerError
from splitformer import nn as splitformer_nn
from splitformer.adapters import from_hf, from_timm

from conftest import GENERATED, import_path
from test_adapters import randomize
from timm_import import import_timm

vision_transformer = import_timm("timm.models.vision_transformer")
NUMPY_VIT = import_path(GENERATED / "numpy" / "vit.py")
TORCH_VIT = import_path(GENERATED / "torch" / "vit.py")


def timm_vit(**options):
    settings = dict(img_size=(16, 8), patch_size=4, embed_dim=12, depth=2, num_heads=3, mlp_ratio=1.5,
                    num_classes=5) | options
    torch.manual_seed(0)
    return randomize(vision_transformer.VisionTransformer(**settings).double())


def _pixels(model, batch=2):
    height, width = model.patch_embed.img_size
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


@pytest.mark.parametrize("num_classes", [5, 0], ids=["head", "no-head"])
def test_timm_vision_transformer_equals_the_vit_network_both_backends(num_classes):
    model = timm_vit(num_classes=num_classes)
    pixels = _pixels(model)
    with torch.no_grad():
        features, output = model.forward_features(pixels), model(pixels)
    adapted = from_timm(model, network="vit")
    assert adapted.model == "vit" and adapted.config == {"patch_size": 4, "n_heads": 3, "eps": 1e-6,
                                                         "image_size": (16, 8)}
    generated = adapted.build(TORCH_VIT)
    with torch.no_grad():
        assert (generated(pixels) - features).abs().max() <= 1e-10
        if num_classes:
            assert (generated.logits(pixels) - output).abs().max() <= 1e-10
    assert np.abs(NUMPY_VIT.forward(pixels.numpy(), adapted.params, **adapted.config) - features.numpy()).max() <= 1e-10
    if num_classes:
        logits = NUMPY_VIT.logits(pixels.numpy(), adapted.params, **adapted.config)
        assert np.abs(logits - output.numpy()).max() <= 1e-10
    else:
        assert "head.W" not in adapted.params


def test_timm_negative_control_positions_read_in_another_order_differ():
    model = timm_vit()
    pixels = _pixels(model)
    adapted = from_timm(model, network="vit")
    params = dict(adapted.params)
    params["embed.pos"] = params["embed.pos"][::-1].copy()  # the class token's position read last
    with torch.no_grad():
        expected = model(pixels).numpy()
    assert np.abs(NUMPY_VIT.logits(pixels.numpy(), params, **adapted.config) - expected).max() > 1e-3


@pytest.mark.parametrize("options, message", [
    ({"class_token": False, "global_pool": "avg"}, "no class token"),
    ({"reg_tokens": 2}, "register tokens"),
    ({"no_embed_class": True}, "no_embed_class"),
    ({"pos_embed": "none"}, "no position embedding"),
    ({"dynamic_img_size": True}, "dynamic_img_size"),
    ({"pre_norm": True}, "pre_norm"),
    ({"global_pool": "avg"}, "pooling global_pool='avg'"),  # named first: it moves the final norm (fc_norm)
    ({"global_pool": "avg", "fc_norm": False}, "pooling global_pool='avg'"),
    ({"final_norm": False}, "no final norm"),
    ({"qk_norm": True}, "q/k normalization"),
    ({"init_values": 1e-5}, "LayerScale"),
    ({"act_layer": torch.nn.SiLU}, "exact GELU"),
])
def test_timm_options_the_vit_network_does_not_compute_are_refused_by_name(options, message):
    with pytest.raises(SplitformerError, match=message):
        from_timm(timm_vit(**options), network="vit")


def test_timm_a_hook_or_replaced_forward_is_refused_and_other_networks_too():
    model = timm_vit()
    handle = model.patch_embed.register_forward_hook(lambda module, args, out: out * 2)
    with pytest.raises(SplitformerError, match="patch_embed has a forward hook"):
        from_timm(model, network="vit")
    handle.remove()
    model.norm.forward = lambda x: x
    with pytest.raises(SplitformerError, match="norm has its forward replaced"):
        from_timm(model, network="vit")
    with pytest.raises(SplitformerError, match=r"no timm reader of VisionTransformer into the network 'cvt' "
                                               r"\(supported: VisionTransformer → vit\)"):
        from_timm(timm_vit(), network="cvt")
    with pytest.raises(SplitformerError, match="whole network 'vit': it can be expected to have n_heads and eps, not scheme"):
        from_timm(timm_vit(), network="vit", scheme="pre-ln")
    assert from_timm(timm_vit(), network="vit", eps=1e-6, n_heads=3).model == "vit"
    assert from_timm(timm_vit()).stack  # without network=: the blocks and final norm, as before


def test_hf_vit_takes_network_too_and_builds():
    config = transformers.ViTConfig(image_size=16, patch_size=4, hidden_size=12, num_attention_heads=3,
                                    num_hidden_layers=1, intermediate_size=20, num_labels=4)
    source = randomize(transformers.ViTForImageClassification(config).double())
    adapted = from_hf(source, network="vit")
    pixels = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        assert (adapted.build(TORCH_VIT).logits(pixels) - source(pixels).logits).abs().max() <= 1e-10
    with pytest.raises(SplitformerError, match="not the generated vit torch module"):
        adapted.build(import_path(GENERATED / "torch" / "pre_ln.py"))
    # attack 24: the repr printed every parameter array (45,700 characters for a small ViT)
    assert repr(adapted) == ("AdaptedModel(hf.ViTForImageClassification → vit, patch_size=4, n_heads=3, "
                             "image_size=(16, 16), eps=1e-12, 24 parameter arrays, dtype=float64)")


# --- BertModel → TextEncoder ------------------------------------------------------------------
POST_LN_GELU = import_path(GENERATED / "torch" / "post_ln_gelu.py")


def bert(add_pooling_layer=True, **overrides):
    settings = dict(vocab_size=50, hidden_size=12, num_attention_heads=3, num_hidden_layers=2, intermediate_size=20,
                    max_position_embeddings=16, type_vocab_size=3, layer_norm_eps=1e-6, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0) | overrides
    torch.manual_seed(0)
    return randomize(transformers.BertModel(transformers.BertConfig(**settings), add_pooling_layer=add_pooling_layer)
                     .double())


def _bert_inputs():
    generator = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 50, (3, 7), generator=generator)
    token_types = torch.randint(0, 3, (3, 7), generator=generator)
    attention_mask = torch.ones(3, 7, dtype=torch.long)
    attention_mask[1, 4:] = 0  # right padding
    attention_mask[2, :2] = 0  # left padding
    return tokens, token_types, attention_mask


@pytest.mark.parametrize("pooler", [True, False], ids=["pooler", "no-pooler"])
def test_bert_model_equals_the_text_encoder(pooler):
    source = bert(add_pooling_layer=pooler)
    tokens, token_types, attention_mask = _bert_inputs()
    encoder = splitformer_nn.from_hf_encoder(source, torch_module=POST_LN_GELU)
    assert not encoder.training and encoder.scheme == "post-ln" and (encoder.pooler is not None) == pooler
    with torch.no_grad():
        expected = source(tokens, attention_mask=attention_mask, token_type_ids=token_types)
        hidden = encoder(tokens, token_types=token_types, padding_mask=attention_mask == 0)
        assert hidden.dtype == torch.float64
        assert (hidden - expected.last_hidden_state).abs().max() <= 1e-10  # padded rows too
        assert torch.equal(encoder(tokens, token_type_ids=token_types, padding_mask=attention_mask == 0), hidden)
        if pooler:
            assert (encoder.pool(hidden) - expected.pooler_output).abs().max() <= 1e-10
        # negative controls: without the padding mask, or without the token types, the result differs
        assert (encoder(tokens, token_types=token_types) - expected.last_hidden_state).abs().max() > 1e-3
        assert (encoder(tokens, padding_mask=attention_mask == 0) - expected.last_hidden_state).abs().max() > 1e-3
        plain = source(tokens)
        assert (encoder(tokens) - plain.last_hidden_state).abs().max() <= 1e-10  # token types default to 0


def test_bert_parts_the_text_encoder_does_not_compute_are_refused_by_name():
    with pytest.raises(SplitformerError, match="NewGELUActivation"):
        splitformer_nn.from_hf_encoder(bert(hidden_act="gelu_new"), torch_module=POST_LN_GELU)
    source = bert()
    source.embeddings.LayerNorm.eps = 1e-5
    with pytest.raises(SplitformerError, match=r"embeddings.LayerNorm has eps=1e-05, its layers eps=1e-06"):
        splitformer_nn.from_hf_encoder(source, torch_module=POST_LN_GELU)
    source = bert()
    source.pooler.activation = torch.nn.Identity()
    with pytest.raises(SplitformerError, match=r"BertModel\.pooler\.activation is Identity, not the Tanh BertModel builds"):
        splitformer_nn.from_hf_encoder(source, torch_module=POST_LN_GELU)
    with pytest.raises(SplitformerError, match="no whole-encoder reader for BertEncoder"):
        splitformer_nn.from_hf_encoder(bert().encoder, torch_module=POST_LN_GELU)
    source = bert()
    source.embeddings.register_forward_hook(lambda module, args, out: out)
    with pytest.raises(SplitformerError, match="embeddings has a forward hook"):
        splitformer_nn.from_hf_encoder(source, torch_module=POST_LN_GELU)
    with pytest.raises(SplitformerError, match="computes"):
        splitformer_nn.from_hf_encoder(bert(), torch_module=import_path(GENERATED / "torch" / "pre_ln_gelu.py"))


def test_text_encoder_checks_its_arguments_before_work():
    encoder = splitformer_nn.TextEncoder(POST_LN_GELU, 20, d_model=8, n_heads=2, n_token_types=0, pooler=False)
    tokens = torch.zeros(2, 5, dtype=torch.long)
    assert encoder(tokens).shape == (2, 5, 8)
    with pytest.raises(ValueError, match="n_token_types = 0"):
        encoder(tokens, token_types=tokens)
    with pytest.raises(ValueError, match="no pooler"):
        encoder.pool(encoder(tokens))
    typed = splitformer_nn.TextEncoder(POST_LN_GELU, 20, d_model=8, n_heads=2, n_token_types=2)
    with pytest.raises(ValueError, match=r"token_types must lie in \[0, 2\)"):
        typed(tokens, token_types=tokens + 2)
    with pytest.raises(ValueError, match="token_types must have shape"):
        typed(tokens, token_types=tokens[:, :3])
    with pytest.raises(ValueError, match=r"token_type_ids must lie in \[0, 2\)"):  # BERT's name, named back
        typed(tokens, token_type_ids=tokens + 2)
    with pytest.raises(ValueError, match="give token_types or token_type_ids"):
        typed(tokens, token_types=tokens, token_type_ids=tokens)
    with pytest.raises(ValueError, match="n_token_types must be an int ≥ 0"):
        splitformer_nn.TextEncoder(POST_LN_GELU, 20, n_token_types=-1)


def test_hf_vit_model_says_its_pooler_is_not_mapped():
    config = transformers.ViTConfig(image_size=8, patch_size=4, hidden_size=12, num_attention_heads=3,
                                    num_hidden_layers=1, intermediate_size=20)
    assert any("pooler" in note for note in from_hf(transformers.ViTModel(config)).notes)
    assert not any("pooler" in note for note in from_hf(transformers.ViTModel(config, add_pooling_layer=False)).notes)


def test_text_encoder_trains_with_dropout_and_resets():
    torch.manual_seed(0)
    encoder = splitformer_nn.TextEncoder(POST_LN_GELU, 20, d_model=8, n_heads=2, dropout=0.5)
    tokens = torch.randint(0, 20, (2, 5))
    assert not torch.equal(encoder(tokens), encoder(tokens))  # training: dropout draws anew
    encoder.eval()
    assert torch.equal(encoder(tokens), encoder(tokens))
    encoder.pool(encoder(tokens, token_types=torch.ones_like(tokens))).sum().backward()
    assert all(parameter.grad is not None for parameter in encoder.parameters())
    before = encoder.embed.weight.detach().clone()
    encoder.reset_parameters()
    assert not torch.equal(before, encoder.embed.weight) and torch.equal(encoder.embedding_norm.bias, torch.zeros(8))


def test_generate_ends_rows_at_the_sources_end_token_as_transformers_does():
    """A tester's finding: ``LanguageModel.generate`` had no end token, so a model with ``eos_token_id`` set (every
    checkpoint) went on where transformers' ``generate`` pads the row and stops. ``from_hf_lm`` reads the source's
    generation config; the tokens equal transformers' (greedy, float64, every parameter random); controls: without
    an end token the rows go on, and an end token outside the vocabulary is refused by name."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, eos_token_id=None)
    model = transformers.LlamaForCausalLM(config).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    prompt = torch.tensor([[3, 7, 9], [1, 2, 5]])
    free = splitformer_nn.from_hf_lm(model).generate(prompt, 12, greedy=True)
    end = int(free[1, 3])  # the second row's first new token: that row ends at once
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = end, 0
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    language_model = splitformer_nn.from_hf_lm(model)
    got = language_model.generate(prompt, 12, greedy=True)
    assert torch.equal(got, expected) and got.shape[1] < free.shape[1] and (got[1, 4:] == 0).all()
    assert torch.equal(language_model.generate(prompt, 12, greedy=True, eos_token_id=()), free)
    written = splitformer_nn.to_hf(language_model)  # the end tokens travel in the config transformers' generate reads
    assert (written.config.eos_token_id, written.config.pad_token_id) == (end, 0)
    assert torch.equal(written.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                                        do_sample=False), expected)
    with pytest.raises(ValueError, match=r"^eos_token_id must be None or a token id or a sequence of them \(each in "
                                         r"0 … 39\), got 40$"):
        language_model.generate(prompt, 2, eos_token_id=40)
