"""Every adapter compares each plain attribute of each part with a fresh instance of the same library class
built from the same configuration (``adapters.as_built``): an attribute a forward reads, set after
construction, is refused by name in one line, or read (the generated forward then equals the source's).
``test_before_the_check_*`` shows, with the check switched off, what each attribute did to the result."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import transformers  # noqa: F401 - a test dependency: a broken install fails, never skips
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

import splitformer.codegen.adapters as adapters
from splitformer import SplitformerError
from splitformer.adapters import from_hf, from_torch

from llama_reference import llama_config, randomized
from test_adapters import bert, encoder_layer, randomize
from test_decoder import _torch_reference, random_decoder_layer
from test_gpt2 import gpt2_config, hf_mask, random_block
from test_llama import float64_norms, hf_forward


def _encoder():
    return encoder_layer()


def _encoder_stack():
    return randomize(torch.nn.TransformerEncoder(encoder_layer(), 2, norm=torch.nn.LayerNorm(8, dtype=torch.float64),
                                                 enable_nested_tensor=False))


def _decoder():
    return random_decoder_layer(8, 2, 12, 1e-5, False)


def _bert_layer():
    return bert(layers=1).encoder.layer[0]


def _bert_model():
    return bert(layers=2)


def _gpt2():
    return random_block(gpt2_config(8, 2, 12, 1e-5))


def _llama():
    return randomized(LlamaDecoderLayer(llama_config(16, 4, 2, d_ff=24), layer_idx=0))


def _torch_forward(layer, u):
    with torch.no_grad():
        return layer(torch.tensor(u)).numpy()


def _bert_forward(module, u):
    with torch.no_grad():
        out = module(torch.tensor(u)) if not hasattr(module, "encoder") else module.encoder(torch.tensor(u))
    out = out[0] if isinstance(out, tuple) else getattr(out, "last_hidden_state", out)
    return out.numpy()


def _gpt2_forward(block, u):
    with torch.no_grad():
        return block(torch.tensor(u), attention_mask=hf_mask(*u.shape[:2])).numpy()


def _memory(u):
    return np.random.default_rng(1).standard_normal(u.shape)


def _decoder_forward(layer, u):
    return _torch_reference(layer, u, _memory(u))


def _llama_forward(layer, u):
    return hf_forward(float64_norms(layer), u, 500.0)


#: (make, source forward, width, owner, part, attribute, value set after construction): each refused by the new
#: check, which names it; before it, each raised in the source's forward or changed nothing in eval, except
#: ``SILENT``'s.
REFUSED = [
    (_encoder, _torch_forward, 8, "TransformerEncoderLayer", "self_attn", "_qkv_same_embed_dim", False),
    (_encoder, _torch_forward, 8, "TransformerEncoderLayer", "self_attn", "embed_dim", 4),
    (_encoder, _torch_forward, 8, "TransformerEncoderLayer", "self_attn", "kdim", 4),
    (_encoder, _torch_forward, 8, "TransformerEncoderLayer", "norm1", "normalized_shape", (4,)),
    (_encoder, _torch_forward, 8, "TransformerEncoderLayer", "norm2", "elementwise_affine", False),
    (_encoder, _torch_forward, 8, "TransformerEncoderLayer", "linear1", "in_features", 4),
    (_encoder, _torch_forward, 8, "TransformerEncoderLayer", "self_attn", "extra", 1.0),
    (_encoder_stack, _torch_forward, 8, "TransformerEncoder", "", "num_layers", 1),
    (_encoder_stack, _torch_forward, 8, "TransformerEncoder", "layers.1.self_attn", "head_dim", 2),
    (_decoder, _decoder_forward, 8, "TransformerDecoderLayer", "multihead_attn", "batch_first", False),
    (_decoder, _decoder_forward, 8, "TransformerDecoderLayer", "multihead_attn", "head_dim", 2),
    (_bert_layer, _bert_forward, 8, "BertLayer", "attention", "is_cross_attention", True),
    (_bert_layer, _bert_forward, 8, "BertLayer", "", "chunk_size_feed_forward", 2),
    (_bert_model, _bert_forward, 8, "BertModel", "encoder.layer.1.output.dense", "in_features", 2),
    (_gpt2, _gpt2_forward, 8, "GPT2Block", "mlp.c_fc", "nf", 4),
    (_llama, _llama_forward, 16, "LlamaDecoderLayer", "self_attn", "attention_dropout", 0.5),
    (_llama, _llama_forward, 16, "LlamaDecoderLayer", "self_attn", "num_key_value_groups", 1),
    (_llama, _llama_forward, 16, "LlamaDecoderLayer", "mlp", "hidden_size", 3),
]
#: What the adapters accepted before the check while the source computed otherwise (largest difference 0.74).
SILENT = {"TransformerDecoderLayer.multihead_attn.batch_first"}
#: Attributes the adapters' readers refused already before (by their own messages): still refused.
REFUSED_BEFORE = [
    (_bert_layer, "", "is_decoder", True), (_bert_layer, "attention.self", "scaling", 0.25),
    (_gpt2, "attn", "scale_attn_weights", False), (_gpt2, "attn", "reorder_and_upcast_attn", True),
    (_gpt2, "attn", "is_cross_attention", True), (_gpt2, "attn", "scale_attn_by_inverse_layer_idx", True),
    (_llama, "self_attn", "is_causal", False), (_llama, "input_layernorm", "variance_epsilon", 1e-1),
    (_encoder, "", "activation_relu_or_gelu", 2),
]
IDS = [f"{case[3]}.{case[4] + '.' if case[4] else ''}{case[5]}" for case in REFUSED]


def _read(module):
    return (from_hf if type(module).__module__.startswith("transformers") else from_torch)(module)


def _generated(adapted, u):
    block = adapted.build(adapted.derivation().torch_module())
    memory = (torch.tensor(_memory(u)),) if adapted.source[1] == "TransformerDecoderLayer" else ()
    with torch.no_grad():
        return block(torch.tensor(u), *memory).numpy()


@pytest.mark.parametrize("make, forward, d, owner, part, attribute, value", REFUSED, ids=IDS)
def test_an_attribute_set_after_construction_is_refused_by_name(make, forward, d, owner, part, attribute, value):
    module = make()
    _read(module)  # control: as built
    setattr(module.get_submodule(part), attribute, value)
    where = f"{owner}.{part + '.' if part else ''}{attribute}"
    with pytest.raises(SplitformerError, match=rf"^{re.escape(where)} is ") as error:
        _read(module)
    assert "\n" not in str(error.value)


def _before(monkeypatch, make, forward, d, part, attribute, value, rng):
    """What the adapters did before the check: the largest difference of the generated forward from the
    source's (``None`` where the source's forward or the adapter raises)."""
    monkeypatch.setattr(adapters, "check_as_built", lambda *args, **kwargs: None)
    module = make()
    setattr(module.get_submodule(part), attribute, value)
    u = rng.standard_normal((2, 5, d))
    try:
        return float(np.abs(_generated(_read(module), u) - forward(module, u)).max())
    except (SplitformerError, RuntimeError, AssertionError, AttributeError, TypeError, ValueError):
        return None


@pytest.mark.parametrize("make, forward, d, owner, part, attribute, value", REFUSED, ids=IDS)
def test_before_the_check_the_result_was_silently_different(make, forward, d, owner, part, attribute, value,
                                                            monkeypatch, rng):
    name = f"{owner}.{part + '.' if part else ''}{attribute}"
    deviation = _before(monkeypatch, make, forward, d, part, attribute, value, rng)
    if name in SILENT:
        assert deviation is not None and deviation > 1e-6
    else:
        assert deviation is None or deviation <= 1e-10


@pytest.mark.parametrize("make, part, attribute, value", REFUSED_BEFORE, ids=[f"{c[1]}.{c[2]}" for c in REFUSED_BEFORE])
def test_what_the_readers_refused_is_still_refused(make, part, attribute, value):
    module = make()
    setattr(module.get_submodule(part), attribute, value)
    with pytest.raises(SplitformerError) as error:
        _read(module)
    assert "\n" not in str(error.value)


def test_an_attribute_the_adapter_reads_is_read(rng):
    """``MultiheadAttention.batch_first`` set after construction: read, and the generated forward equals the source's."""
    layer = encoder_layer()
    layer.self_attn.batch_first = False
    u = rng.standard_normal((5, 2, 8))
    assert np.abs(_generated(from_torch(layer), u) - _torch_forward(layer, u)).max() <= 1e-10
    for make, forward, d, norms, attribute in (
            (_gpt2, _gpt2_forward, 8, ("ln_1", "ln_2"), "eps"),
            (_bert_layer, _bert_forward, 8, ("attention.output.LayerNorm", "output.LayerNorm"), "eps"),
            (_llama, _llama_forward, 16, ("input_layernorm", "post_attention_layernorm"), "variance_epsilon")):
        module = make()
        for norm in norms:  # ε set after construction, the same in both norms: read from the norms
            setattr(module.get_submodule(norm), attribute, 0.1)
        u = rng.standard_normal((2, 5, d))
        assert np.abs(_generated(_read(module), u) - forward(module, u)).max() <= 1e-10


def test_a_source_as_built_is_equal(rng):
    """Control: the same modules, unmodified, are read and equal their sources."""
    for make, forward, d in ((_encoder, _torch_forward, 8), (_bert_layer, _bert_forward, 8), (_gpt2, _gpt2_forward, 8),
                             (_llama, _llama_forward, 16)):
        module = make()
        u = rng.standard_normal((2, 5, d))
        assert np.abs(_generated(_read(module), u) - forward(module, u)).max() <= 1e-10


def _gpt2_lm():
    config = transformers.GPT2Config(n_embd=8, n_head=2, n_layer=2, vocab_size=50, n_positions=16, bos_token_id=0,
                                     eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).double().eval()


def _llama_lm():
    config = llama_config(16, 4, 2, d_ff=24, num_hidden_layers=2, vocab_size=50, bos_token_id=0, eos_token_id=0,
                          pad_token_id=0)
    return transformers.LlamaForCausalLM(config).double().eval()


@pytest.mark.parametrize("make, owner, part, attribute, value", [
    (_llama_lm, "LlamaForCausalLM", "model.rotary_emb", "rope_type", "dynamic"),
    (_llama_lm, "LlamaForCausalLM", "model.rotary_emb", "original_max_seq_len", 4),
    (_llama_lm, "LlamaForCausalLM", "model.embed_tokens", "embedding_dim", 3),
    (_gpt2_lm, "GPT2LMHeadModel", "transformer.wpe", "num_embeddings", 4),
    (_gpt2_lm, "GPT2LMHeadModel", "transformer", "embed_dim", 4),
])
def test_a_whole_language_models_attribute_set_after_construction_is_refused(make, owner, part, attribute, value):
    """``from_hf_lm``: the parts outside the blocks (embeddings, rotary embedding, the model) too."""
    from splitformer.nn import from_hf_lm

    model = make()
    from_hf_lm(model)  # control: as built
    setattr(model.get_submodule(part), attribute, value)
    with pytest.raises(SplitformerError, match=rf"^{re.escape(f'{owner}.{part}.{attribute}')} is ") as error:
        from_hf_lm(model)
    assert "\n" not in str(error.value)


def _vit_classifier():
    config = transformers.ViTConfig(image_size=8, patch_size=4, hidden_size=8, num_attention_heads=2,
                                    num_hidden_layers=1, intermediate_size=12, num_labels=3)
    return randomize(transformers.ViTForImageClassification(config).double()).eval()


def _vit_deviation(model):
    from conftest import GENERATED, import_path

    adapted = from_hf(model, network="vit")
    pixels = torch.tensor(np.random.default_rng(0).standard_normal((2, 3, 8, 8)))
    with torch.no_grad():
        built = adapted.build(import_path(GENERATED / "torch" / "vit.py", "_as_built_vit"))
        return float((built.logits(pixels) - model(pixels).logits).abs().max())


def test_a_causal_vit_attention_was_silently_different_and_is_refused(monkeypatch):
    """``ViTAttention.is_causal = True`` (the sdpa and eager forwards then mask later patches): refused by name;
    with the check off it was read as the bidirectional ViT."""
    model = _vit_classifier()
    assert _vit_deviation(model) <= 1e-10  # control
    model.vit.layers[0].attention.is_causal = True
    with pytest.raises(SplitformerError, match=r"^ViTForImageClassification\.vit\.layers\.0\.attention\.is_causal is True"):
        from_hf(model, network="vit")
    monkeypatch.setattr(adapters, "check_as_built", lambda *args, **kwargs: None)
    assert _vit_deviation(model) > 1e-3


@pytest.mark.parametrize("cls, config", [
    (transformers.BertModel, dict(hidden_size=8, num_attention_heads=2, intermediate_size=16, num_hidden_layers=2,
                                  vocab_size=30, max_position_embeddings=16)),
    (transformers.ViTModel, dict(image_size=8, patch_size=4, hidden_size=8, num_attention_heads=2, intermediate_size=12,
                                 num_hidden_layers=1)),
])
def test_a_model_loaded_with_from_pretrained_is_read(cls, config, tmp_path):
    """What ``from_pretrained`` adds (``_weight_conversions``, ``name_or_path``, from 5.25 the record of the
    ``kernelize`` it runs by default: tests/test_adapter_hub_kernels.py) is known, with kernels or without;
    ``_use_kernels=True`` without that record is refused."""
    cls(cls.config_class(**config)).save_pretrained(tmp_path)
    from_hf(cls.from_pretrained(tmp_path, dtype=torch.float64).eval())
    loaded = cls.from_pretrained(tmp_path, dtype=torch.float64, use_kernels=False).eval()
    from_hf(loaded)
    loaded._use_kernels = True  # what kernelize sets, alone
    with pytest.raises(SplitformerError, match=rf"^{cls.__name__}\._use_kernels is True"):
        from_hf(loaded)


def test_the_check_leaves_the_source_and_the_random_state_as_they_were():
    """The fresh instance is built on the meta device: no weights drawn, the source's configuration untouched."""
    model = _llama_lm()
    config, state = repr(vars(model.config)), torch.get_rng_state()
    adapters.check_as_built("LlamaForCausalLM", model)
    assert repr(vars(model.config)) == config and torch.equal(torch.get_rng_state(), state)


def test_activations_the_library_makes_per_module_are_read_as_built():
    """Attack 32: GPT-2's ``gelu_pytorch_tanh`` (a ``functools.partial`` made per module) and BERT's ``gelu_python``
    (a method bound to its own module) compared unequal to a fresh module's and were refused as edited. Compared by
    what they call now; controls: another partial keyword, and a method bound to another module, are refused."""
    import functools

    import transformers

    config = transformers.GPT2Config(n_embd=8, n_head=2, n_layer=1, vocab_size=16, n_positions=16,
                                     activation_function="gelu_pytorch_tanh")
    block = transformers.GPT2Model(config).h[0].eval()
    assert from_hf(block).activation == "gelu-tanh"
    block.mlp.act.act = functools.partial(block.mlp.act.act.func, approximate="none")
    with pytest.raises(SplitformerError, match=r"mlp\.act\.act is a partial"):
        from_hf(block)
    bert_config = transformers.BertConfig(hidden_size=8, num_attention_heads=2, intermediate_size=12,
                                          num_hidden_layers=1, hidden_act="gelu_python")
    layer = transformers.BertModel(bert_config).encoder.layer[0].eval()
    assert from_hf(layer).activation == "gelu"
    other = transformers.activations.GELUActivation(use_gelu_python=True)
    layer.intermediate.intermediate_act_fn.act = other._gelu_python
    with pytest.raises(SplitformerError, match=r"intermediate_act_fn\.act is "):
        from_hf(layer)
