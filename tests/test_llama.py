"""llama: the emitted block and stack against ``transformers`` ``LlamaDecoderLayer`` (every parameter random).

transformers' ``LlamaRMSNorm`` computes in float32 whatever the input dtype (about 1e-7 off in
float64); the float64 tests therefore swap in ``torch.nn.RMSNorm`` with the same gain and ε (the
same formula, in float64). The float32 test uses the layer as it is, with the cos/sin of
``LlamaRotaryEmbedding``.
"""

import numpy as np
import pytest
import torch

from splitformer.codegen.adapters.hf_llama import llama_layer_config, llama_layer_params
from splitformer.symbolic.errors import SplitformerError

from conftest import GENERATED, import_path

import transformers  # noqa: F401 - a test dependency: a broken install fails, never skips
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding  # noqa: E402

from llama_reference import causal_mask, llama_config, randomized, rope  # noqa: E402

NUMPY = import_path(GENERATED / "numpy" / "llama.py")
TORCH = import_path(GENERATED / "torch" / "llama.py")


def float64_norms(layer):
    """The layer with its RMSNorms computed in float64 (``torch.nn.RMSNorm``, same gain and ε)."""
    for name in ("input_layernorm", "post_attention_layernorm"):
        old = getattr(layer, name)
        new = torch.nn.RMSNorm(old.weight.shape[0], eps=old.variance_epsilon, dtype=torch.float64)
        with torch.no_grad():
            new.weight.copy_(old.weight)
        setattr(layer, name, new)
    return layer


def random_layer(config, seed=0):
    return randomized(LlamaDecoderLayer(config, layer_idx=0), seed)


def hf_forward(layer, u, theta, positions=None, padding=None):
    batch, n, _ = u.shape
    positions = np.arange(n) if positions is None else positions
    cos, sin = rope(np.broadcast_to(positions, (batch, n)), layer.self_attn.head_dim, theta)
    with torch.no_grad():
        return layer(torch.tensor(u), attention_mask=causal_mask(batch, n, padding=padding),
                     position_embeddings=(cos, sin)).numpy()


@pytest.mark.parametrize("n_heads, n_kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "causal+padding"])
def test_float64_parity_with_llama_decoder_layer(n_heads, n_kv_heads, masked, rng):
    config = llama_config(16, n_heads, n_kv_heads, d_ff=24, eps=1e-5, theta=500.0)
    layer = random_layer(config, seed=n_kv_heads)
    options = llama_layer_config(layer)
    assert options == {"n_heads": n_heads, "n_kv_heads": n_kv_heads, "eps": 1e-5, "rope_theta": 500.0}
    params = llama_layer_params(layer)
    u = rng.standard_normal((2, 7, 16))
    padding = np.array([[False] * 7, [False] * 4 + [True] * 3]) if masked else None
    expected = hf_forward(float64_norms(layer), u, 500.0, padding=padding)
    keep = np.ones((2, 7), bool) if padding is None else ~padding
    out = NUMPY.forward(u, params, key_padding_mask=padding, **options)
    assert np.abs(out - expected)[keep].max() <= 1e-10
    block = TORCH.Block(16, n_heads, 24, n_kv_heads=n_kv_heads, eps=1e-5, rope_theta=500.0, dtype=torch.float64)
    with torch.no_grad():
        result = block.load_params(params)(torch.tensor(u), key_padding_mask=None if padding is None
                                           else torch.tensor(padding)).numpy()
    assert np.abs(result - expected)[keep].max() <= 1e-10


def test_llama_rms_norm_is_float32_inside(rng):
    """Why the float64 tests swap the norms: transformers' LlamaRMSNorm rounds to float32."""
    layer = random_layer(llama_config())
    u = rng.standard_normal((1, 5, 16))
    as_is = hf_forward(layer, u, 500.0)
    exact = hf_forward(float64_norms(layer), u, 500.0)
    assert 1e-9 < np.abs(as_is - exact).max() < 1e-4


def test_float32_parity_with_the_layer_as_is(rng):
    config = llama_config(16, 4, 2, d_ff=40, theta=10000.0)
    layer = random_layer(config).float()
    params = {name: value.astype(np.float32) for name, value in llama_layer_params(layer).items()}
    u = rng.standard_normal((2, 9, 16)).astype(np.float32)
    x = torch.tensor(u)
    cos, sin = LlamaRotaryEmbedding(config)(x, torch.arange(9)[None].expand(2, -1))
    with torch.no_grad():
        expected = layer(x, attention_mask=causal_mask(2, 9, dtype=torch.float32), position_embeddings=(cos, sin)).numpy()
    out = NUMPY.forward(u, params, n_heads=4, n_kv_heads=2)  # rope_theta 10000 by default
    assert out.dtype == np.float32 and np.abs(out - expected).max() <= 1e-4
    block = TORCH.Block(16, 4, 40, n_kv_heads=2).load_params(params)
    with torch.no_grad():
        result = block(x)
    assert result.dtype == torch.float32 and np.abs(result.numpy() - expected).max() <= 1e-4


def test_stack_equals_decoder_layers_and_final_rms_norm(rng):
    config = llama_config(16, 4, 2, d_ff=24, theta=500.0)
    layers = [float64_norms(random_layer(config, seed)) for seed in range(3)]
    final = torch.nn.RMSNorm(16, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        final.weight.copy_(torch.randn(16))
    u = rng.standard_normal((2, 6, 16))
    x = u
    for layer in layers:
        x = hf_forward(layer, x, 500.0)
    with torch.no_grad():
        expected = final(torch.tensor(x)).numpy()
    params = [llama_layer_params(layer) for layer in layers]
    final_norm = {"gain": final.weight.detach().numpy()}
    options = {"n_heads": 4, "n_kv_heads": 2, "rope_theta": 500.0}
    out = NUMPY.forward_stack(u, params, final_norm=final_norm, **options)
    assert np.abs(out - expected).max() <= 1e-10
    stack = TORCH.Stack(3, 16, 4, 24, n_kv_heads=2, rope_theta=500.0, dtype=torch.float64)
    with torch.no_grad():
        result = stack.load_params(params, final_norm)(torch.tensor(u)).numpy()
    assert np.abs(result - expected).max() <= 1e-10
    cache = [{} for _ in params]  # incremental decoding of the whole stack, token by token
    steps = [NUMPY.forward_stack(u[:, i:i + 1], params, final_norm=final_norm, cache=cache, **options) for i in range(6)]
    assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10
    cache = [{} for _ in params]
    with torch.no_grad():
        steps = [stack(torch.tensor(u[:, i:i + 1]), cache=cache).numpy() for i in range(6)]
    assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10


@pytest.mark.parametrize("overrides, message", [
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}, "RoPE scaling 'linear'"),
    ({"sliding_window": 4}, "sliding window"),
    ({"hidden_act": "gelu"}, "activation 'gelu'"),
    ({"attention_bias": True}, "biases"),
    ({"head_dim": 8}, "head_dim = 8"),
])
def test_unsupported_llama_configurations_are_refused(overrides, message):
    config = llama_config(16, 4, 2)
    for key, value in overrides.items():
        setattr(config, key, value)
    with pytest.raises(SplitformerError, match=message):
        llama_layer_config(LlamaDecoderLayer(config, layer_idx=0))


def test_a_reading_with_as_many_key_value_heads_as_heads_runs_with_the_default_n_kv_heads():
    """Review s33: the reading check compared the call's ``n_kv_heads=None`` (the forward's default: as many as the
    query heads) with the 4 read, and refused identical numbers; another count is still refused."""
    from splitformer.adapters import from_hf

    adapted = from_hf(random_layer(llama_config(n_heads=4, n_kv_heads=4)))
    u = np.random.default_rng(0).standard_normal((2, 5, 16))
    kwargs = {key: value for key, value in adapted.forward_kwargs.items() if key != "n_kv_heads"}
    assert np.array_equal(NUMPY.forward(u, adapted, **kwargs), NUMPY.forward(u, adapted, **adapted.forward_kwargs))
    with pytest.raises(ValueError, match="^params: the source was read with n_kv_heads=4, the call has n_kv_heads=2"):
        NUMPY.forward(u, adapted, **{**kwargs, "n_kv_heads": 2})


def test_a_block_built_with_its_defaults_loads_a_layers_reading():
    """A tester's finding: ``Block(d, h, d_ff, n_kv_heads=2)`` (``bias=True`` by default, as every Block) refused a
    Llama layer's reading, "the source has bias=False", though the llama scheme has no bias to read the flag; a
    configuration it does read (n_kv_heads) is still refused."""
    from splitformer.adapters import from_hf

    layer = random_layer(llama_config(n_heads=4, n_kv_heads=2))
    adapted = from_hf(layer)
    u = np.random.default_rng(1).standard_normal((2, 5, 16))
    block = TORCH.Block(16, 4, adapted.sizes["d_ff"], n_kv_heads=2, rope_theta=adapted.options["rope_theta"],
                        eps=adapted.eps, dtype=torch.float64).load_params(adapted)
    with torch.no_grad():
        assert np.abs(block(torch.tensor(u)).numpy() - NUMPY.forward(u, adapted, **adapted.forward_kwargs)).max() <= 1e-12
    with pytest.raises(ValueError, match="the source has n_kv_heads=2, the Block n_kv_heads=4"):
        TORCH.Block(16, 4, adapted.sizes["d_ff"], n_kv_heads=4, rope_theta=adapted.options["rope_theta"],
                    eps=adapted.eps, dtype=torch.float64).load_params(adapted)
