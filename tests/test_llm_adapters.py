"""``from_hf``/``from_torch`` for GPT2Block, LlamaDecoderLayer and TransformerDecoderLayer: ``Adapted``
objects that run the generated forward exactly, round trips through ``to_torch``, refusals."""

import numpy as np
import pytest
import torch

from splitformer.adapters import from_hf, from_torch, to_torch
from splitformer.symbolic.errors import SplitformerError

from conftest import GENERATED, import_path

import transformers  # noqa: F401 - a test dependency: a broken install fails, never skips
from transformers.models.gpt2.modeling_gpt2 import GPT2Block  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaDecoderLayer  # noqa: E402

from llama_reference import llama_config, randomized  # noqa: E402
from test_decoder import _torch_reference, random_decoder_layer  # noqa: E402
from test_gpt2 import gpt2_config, hf_mask, random_block  # noqa: E402
from test_llama import float64_norms, hf_forward  # noqa: E402


def _generated(adapted):
    return (import_path(GENERATED / "numpy" / f"{adapted.module_name}.py"),
            import_path(GENERATED / "torch" / f"{adapted.module_name}.py"))


def test_gpt2_block(rng):
    block = random_block(gpt2_config(8, 2, 12, 1e-5))
    adapted = from_hf(block)
    assert (adapted.scheme, adapted.activation, adapted.module_name) == ("gpt2", "gelu-tanh", "gpt2")
    numpy_module, torch_module = _generated(adapted)
    u = rng.standard_normal((2, 5, 8))
    with torch.no_grad():
        expected = block(torch.tensor(u), attention_mask=hf_mask(2, 5)).numpy()
    assert np.abs(numpy_module.forward(u, adapted, **adapted.forward_kwargs) - expected).max() <= 1e-10
    with torch.no_grad():
        assert np.abs(adapted.build(torch_module)(torch.tensor(u)).numpy() - expected).max() <= 1e-10
    state = to_torch(adapted)
    assert set(state) == set(block.state_dict())
    for key, value in state.items():
        assert torch.equal(value, block.state_dict()[key]), key


def test_llama_decoder_layer(rng):
    layer = randomized(LlamaDecoderLayer(llama_config(16, 4, 2, d_ff=24, theta=500.0), layer_idx=0))
    adapted = from_hf(layer)
    assert adapted.module_name == "llama" and adapted.options == {"n_kv_heads": 2, "rope_theta": 500.0, "causal": True}
    numpy_module, torch_module = _generated(adapted)
    u = rng.standard_normal((2, 6, 16))
    expected = hf_forward(float64_norms(layer), u, 500.0)
    assert np.abs(numpy_module.forward(u, adapted, **adapted.forward_kwargs) - expected).max() <= 1e-10
    with torch.no_grad():
        assert np.abs(adapted.build(torch_module)(torch.tensor(u)).numpy() - expected).max() <= 1e-10
    fresh = LlamaDecoderLayer(llama_config(16, 4, 2, d_ff=24, theta=500.0), layer_idx=0).double()
    fresh.load_state_dict(to_torch(adapted), strict=False)
    for key in ("self_attn.k_proj.weight", "mlp.up_proj.weight"):
        assert torch.equal(fresh.state_dict()[key], layer.state_dict()[key])


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_decoder_layer(norm_first, rng):
    layer = random_decoder_layer(8, 2, 12, 1e-5, norm_first)
    adapted = from_torch(layer)
    assert adapted.module_name == ("decoder_pre_ln" if norm_first else "decoder")
    numpy_module, torch_module = _generated(adapted)
    u, memory = rng.standard_normal((2, 6, 8)), rng.standard_normal((2, 4, 8))
    expected = _torch_reference(layer, u, memory)
    assert np.abs(numpy_module.forward(u, memory, adapted, **adapted.forward_kwargs) - expected).max() <= 1e-10
    with torch.no_grad():
        assert np.abs(adapted.build(torch_module)(torch.tensor(u), torch.tensor(memory)).numpy() - expected).max() <= 1e-10
    state = to_torch(adapted)
    assert set(state) == set(layer.state_dict())
    for key, value in state.items():
        assert torch.equal(value, layer.state_dict()[key]), key


def test_refusals_go_through_from_hf():
    config = llama_config(16, 4, 2)
    config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    with pytest.raises(SplitformerError, match="RoPE scaling 'yarn'"):
        from_hf(LlamaDecoderLayer(config, layer_idx=0))
    with pytest.raises(SplitformerError, match=r"GPT2Block\.mlp\.act is ReLU"):
        from_hf(GPT2Block(gpt2_config(activation_function="relu")))


def test_a_llama_attention_scale_other_than_one_over_root_head_dim_is_refused():
    layer = LlamaDecoderLayer(llama_config(16, 4, 2), layer_idx=0)
    from_hf(layer)  # control: the standard scale is accepted
    layer.self_attn.scaling = 0.1
    with pytest.raises(SplitformerError, match=r"scales attention scores by 0\.1 \(self_attn\.scaling\)"):
        from_hf(layer)


def test_to_torch_names_like_when_it_is_no_adapted():
    """A tester's finding: ``like=`` a whole language model's reading (a ``LanguageModel``) was an AttributeError; it
    is named, with how its layers are written back (which works: control)."""
    source = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2)).eval()
    model = from_hf(source.model)
    with pytest.raises(SplitformerError, match=r"like must be the Adapted of the source module .* got LanguageModel; "
                                               r".*to_torch\(lm\.stack\.layers\[i\]"):
        to_torch(model.stack, like=model)
    with pytest.raises(SplitformerError, match="got dict"):
        to_torch({}, like={})
    layer = source.model.layers[1]
    layer.load_state_dict(to_torch(model.stack.layers[1], like=from_hf(layer)), strict=True)
