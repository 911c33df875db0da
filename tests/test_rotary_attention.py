"""Llama's attention alone (``u + A_rot(u)``): RoPE and GQA against ``transformers`` ``LlamaAttention``."""

import numpy as np
import pytest
import torch

from splitformer.codegen.output import write_files
from splitformer.codegen.pipeline import generate
from splitformer.symbolic import load_scheme

from conftest import ROOT, import_path

import transformers  # noqa: F401 - a test dependency: a broken install fails, never skips
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding  # noqa: E402

from llama_reference import causal_mask, llama_config, randomized, rope  # noqa: E402


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    out = tmp_path_factory.mktemp("rotary")
    write_files(generate(load_scheme(str(ROOT / "tests" / "schemes" / "rotary-residual.toml")), ("numpy", "torch"), out))
    return import_path(out / "numpy" / "rotary_residual.py"), import_path(out / "torch" / "rotary_residual.py")


def attention_params(attention):
    return {f"attn.W_{name}": getattr(attention, f"{name}_proj").weight.detach().numpy().T.copy() for name in "qkvo"}


def reference(attention, u, positions, theta, padding=None):
    batch, n, d = u.shape
    cos, sin = rope(np.broadcast_to(positions, (batch, n)), attention.head_dim, theta)
    with torch.no_grad():
        x = torch.tensor(u)
        return (x + attention(x, position_embeddings=(cos, sin), attention_mask=causal_mask(batch, n, padding=padding))[0]).numpy()


@pytest.mark.parametrize("n_heads, n_kv_heads", [(4, 4), (4, 2), (4, 1), (6, 3)])
def test_float64_parity_with_llama_attention(modules, n_heads, n_kv_heads, rng):
    numpy_module, torch_module = modules
    d, theta = 4 * n_heads, 500.0
    attention = randomized(LlamaAttention(llama_config(d, n_heads, n_kv_heads, theta=theta), 0), seed=n_kv_heads)
    params = attention_params(attention)
    assert params["attn.W_k"].shape == (d, n_kv_heads * 4)
    u = rng.standard_normal((2, 7, d))
    expected = reference(attention, u, np.arange(7), theta)
    out = numpy_module.forward(u, params, n_heads=n_heads, n_kv_heads=n_kv_heads, rope_theta=theta)
    assert np.abs(out - expected).max() <= 1e-10
    block = torch_module.Block(d, n_heads, 1, n_kv_heads=n_kv_heads, rope_theta=theta, dtype=torch.float64)
    with torch.no_grad():
        result = block.load_params(params)(torch.tensor(u)).numpy()
    assert np.abs(result - expected).max() <= 1e-10


def test_positions_argument_and_padding(modules, rng):
    """Arbitrary positions per sequence (left padding, offsets) and a key padding mask."""
    numpy_module, torch_module = modules
    attention = randomized(LlamaAttention(llama_config(16, 4, 2, theta=10.0), 0))
    params = attention_params(attention)
    u = rng.standard_normal((2, 6, 16))
    positions = np.array([[3, 5, 7, 9, 11, 13], [0, 0, 0, 1, 2, 3]])  # a stride, and left padding
    padding = np.array([[False] * 6, [True, True, False, False, False, False]])
    expected = reference(attention, u, positions, 10.0, padding)
    keep = ~padding
    out = numpy_module.forward(u, params, n_heads=4, n_kv_heads=2, rope_theta=10.0, positions=positions,
                               key_padding_mask=padding)
    assert np.abs(out - expected)[keep].max() <= 1e-10
    block = torch_module.Block(16, 4, 1, n_kv_heads=2, rope_theta=10.0, dtype=torch.float64).load_params(params)
    with torch.no_grad():
        result = block(torch.tensor(u), positions=torch.tensor(positions), key_padding_mask=torch.tensor(padding))
    assert np.abs(result.numpy() - expected)[keep].max() <= 1e-10
    shifted = numpy_module.forward(u, params, n_heads=4, n_kv_heads=2, rope_theta=10.0, positions=positions + 100,
                                   key_padding_mask=padding)
    assert np.abs(shifted - out)[keep].max() <= 1e-10  # a common shift leaves the relative kernel unchanged
    wrong = numpy_module.forward(u, params, n_heads=4, n_kv_heads=2, rope_theta=10.0, key_padding_mask=padding)
    assert np.abs(wrong - expected)[0].max() > 1e-3  # negative control: stride-2 positions are not 0, 1, …


def test_float32_parity_with_hf_rotary_embedding(modules, rng):
    """float32 against transformers' own ``LlamaRotaryEmbedding`` (cos/sin computed in float32)."""
    numpy_module, torch_module = modules
    config = llama_config(16, 4, 2, theta=1000.0)
    attention = randomized(LlamaAttention(config, 0)).float()
    params = {name: value.astype(np.float32) for name, value in attention_params(attention).items()}
    u = rng.standard_normal((2, 9, 16)).astype(np.float32)
    x = torch.tensor(u)
    cos, sin = LlamaRotaryEmbedding(config)(x, torch.arange(9)[None].expand(2, -1))
    reference64 = rope(np.arange(9), 4, 1000.0)
    assert max((cos.double() - reference64[0]).abs().max(), (sin.double() - reference64[1]).abs().max()) <= 1e-6
    with torch.no_grad():
        expected = (x + attention(x, position_embeddings=(cos, sin),
                                  attention_mask=causal_mask(2, 9, dtype=torch.float32))[0]).numpy()
    out = numpy_module.forward(u, params, n_heads=4, n_kv_heads=2, rope_theta=1000.0)
    assert out.dtype == np.float32 and np.abs(out - expected).max() <= 1e-4
    block = torch_module.Block(16, 4, 1, n_kv_heads=2, rope_theta=1000.0).load_params(params)
    with torch.no_grad():
        result = block(x)
    assert result.dtype == torch.float32 and np.abs(result.numpy() - expected).max() <= 1e-4


def test_bad_head_configurations_are_named(modules, rng):
    numpy_module, torch_module = modules
    attention = randomized(LlamaAttention(llama_config(16, 4, 2), 0))
    params = attention_params(attention)
    u = rng.standard_normal((1, 3, 16))
    with pytest.raises(ValueError, match="n_kv_heads = 3"):
        numpy_module.forward(u, params, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="attn.W_k"):
        numpy_module.forward(u, params, n_heads=4, n_kv_heads=4)
    with pytest.raises(ValueError, match="positions"):
        numpy_module.forward(u, params, n_heads=4, n_kv_heads=2, positions=np.arange(4))
    with pytest.raises(ValueError, match="n_kv_heads = 3"):
        torch_module.Block(16, 4, 1, n_kv_heads=3)
    with pytest.raises(ValueError, match="even head width, got d_head = 1"):
        numpy_module.forward(u, params, n_heads=16)
    with pytest.raises(ValueError, match=r"u must have shape \(batch, tokens, 16\)"):  # u, not the heads, is wrong
        numpy_module.forward(rng.standard_normal((1, 3, 12)), params, n_heads=4)
