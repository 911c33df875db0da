"""RoPE's base θ is read exactly from a rotary buffer (``adapters.rope``): transformers and x-transformers compute
``inv_freq`` in float32, and the buffer must be exactly that computation for θ (or θ^(−2r/R) in float64). Before,
x-transformers' default (rotary dim 32) was read as θ = 9999.998 from ``inv_freq[1]`` and frequencies within 1e-6
were accepted (tenth attacker, F4: 8.5e-6 off at 2048 tokens); Llama's buffer was accepted within 4.8e-7. A
frequency scaled by 1 + 1e-7 is now refused by name. What remains is the float32 rounding of the source's
frequencies: the generated code rotates by exact ones (docs/guide/adapters.md gives the measured difference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
import x_transformers

import splitformer.nn as splitformer_nn
from splitformer import SplitformerError
from splitformer.adapters import from_hf, from_xtransformers
from splitformer.codegen.adapters.rope import is_frequencies_of, library_frequencies, read_theta

from llama_reference import llama_config, randomized

_DERIVED: dict[str, object] = {}


def decoder(dtype=torch.float64, **flags):
    """x-transformers' Decoder with its default rotary embedding: 32 rotated features of heads of 64."""
    torch.manual_seed(0)
    module = x_transformers.Decoder(dim=16, depth=1, heads=2, attn_dim_head=64, attn_flash=True, rotary_pos_emb=True,
                                    **flags).to(dtype).eval()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(0.3 * torch.randn_like(parameter))
    return module


def _difference(module, tokens):
    adapted = from_xtransformers(module)
    if adapted.scheme_file not in _DERIVED:
        _DERIVED[adapted.scheme_file] = adapted.derivation().torch_module()
    generated = adapted.build(_DERIVED[adapted.scheme_file], dtype=torch.float64)
    u = torch.randn(1, tokens, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return float((generated(u) - module(u)).abs().max())


def _refused(read, module, message):
    with pytest.raises(SplitformerError, match=message) as error:
        read(module)
    assert "\n" not in str(error.value)


def test_the_default_base_is_read_exactly():
    module = decoder()
    assert len(module.rotary_pos_emb.inv_freq) == 16
    assert from_xtransformers(module).options["rope_theta"] == 10000.0  # was 9999.99793854509
    assert from_xtransformers(decoder(torch.float32)).options["rope_theta"] == 10000.0


def test_a_rescaled_base_is_a_float32_base_reproducing_the_buffer():
    """``rotary_base_rescale_factor`` makes θ = 10000 · 2^(32/30), not an integer: the base read is a float32 one
    whose float32 frequencies are the buffer, exactly."""
    module = decoder(rotary_base_rescale_factor=2.0)
    theta = from_xtransformers(module).options["rope_theta"]
    assert theta == float(np.float32(theta)) and abs(theta / (10000 * 2 ** (32 / 30)) - 1) < 1e-7
    assert torch.equal(library_frequencies(theta, 32).double(), module.rotary_pos_emb.inv_freq)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("index", [2, 9, 15])
def test_a_frequency_scaled_by_one_plus_1e_7_is_refused(dtype, index):
    module = decoder(dtype)
    with torch.no_grad():
        module.rotary_pos_emb.inv_freq[index] *= 1 + 1e-7
    _refused(from_xtransformers, module, r"rotary frequencies other than θ\^\(−2r/rotary_emb_dim\) for any θ")


def test_the_remaining_difference_is_the_float32_rounding_of_the_frequencies():
    """Control: the same module with its buffer holding θ^(−2r/R) in float64 equals the generated Stack within 1e-10
    at 512 tokens; with its own float32-rounded buffer the difference stays within the documented bound."""
    exact = decoder()
    exact.rotary_pos_emb.inv_freq = 10000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    assert from_xtransformers(exact).options["rope_theta"] == 10000.0
    assert _difference(exact, 512) <= 1e-10
    rounded = _difference(decoder(), 512)
    assert 1e-9 < rounded <= 3e-6  # documented: about 2e-8 at 6 tokens, 2e-7 at 64, 1e-6 at 512


def test_read_theta_refuses_what_no_base_computes():
    buffer = library_frequencies(10000.0, 32).double()
    assert read_theta(buffer, 32) == 10000.0 and is_frequencies_of(buffer, 10000.0, 32)
    assert not is_frequencies_of(buffer, 10000.0 + 1 / 64, 32)  # a base one float32 step away
    assert read_theta(buffer.flip(0), 32) is None and read_theta(-buffer, 32) is None
    assert read_theta(buffer[:1], 2) is None


def llama():
    return randomized(transformers.LlamaForCausalLM(llama_config(theta=10000.0, vocab_size=32, num_hidden_layers=1,
                                                                 max_position_embeddings=32)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_a_llama_frequency_scaled_by_one_plus_1e_7_is_refused(dtype):
    model = llama().to(dtype)
    assert isinstance(splitformer_nn.from_hf_lm(model), splitformer_nn.LanguageModel)  # control: as built
    with torch.no_grad():
        model.model.rotary_emb.inv_freq[1] *= 1 + 1e-7
    _refused(from_hf, model, r"^LlamaForCausalLM\.model\.rotary_emb\.inv_freq differs from the default RoPE "
                             r"frequencies of rope_theta=10000 \(relative [0-9.e-]+\)")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_a_llama_converted_to_half_precision_is_refused_for_its_rounded_frequencies(dtype):
    """A tester's finding (high): ``model.to(torch.bfloat16)`` rounds ``inv_freq`` too (0.4 % off in bfloat16) and
    transformers rotates by the rounded values, while the float32 LanguageModel ``from_hf_lm`` returned rotated by
    exact ones: logits 2.3 off at positions 50…2000 (the buffer was compared with the exact frequencies rounded to its
    own dtype). Refused, naming the conversion; controls: the float32 model reads, and so does the half-precision one
    with its buffer computed again in float32, as ``from_pretrained(dtype=…)`` keeps it."""
    model = llama()
    assert isinstance(splitformer_nn.from_hf_lm(model), splitformer_nn.LanguageModel)
    model = model.to(dtype)
    _refused(splitformer_nn.from_hf_lm, model, rf"^LlamaForCausalLM\.model\.rotary_emb\.inv_freq differs from the "
                                               rf"default RoPE frequencies of rope_theta=10000 \(relative [0-9.e-]+\) "
                                               rf"\({str(dtype).replace('.', '[.]')}: \.to\(\) rounds it")
    model.model.rotary_emb.inv_freq = library_frequencies(10000.0, 2 * model.model.rotary_emb.inv_freq.numel(), "cpu")
    assert isinstance(splitformer_nn.from_hf_lm(model), splitformer_nn.LanguageModel)
