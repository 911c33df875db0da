"""gpt2: the emitted block and stack against ``transformers`` ``GPT2Block`` (every parameter random)."""

import numpy as np
import pytest
import torch

from splitformer.codegen.adapters.hf_gpt2 import gpt2_block_config, gpt2_block_params
from splitformer.symbolic.errors import SplitformerError

from conftest import GENERATED, import_path

from transformers import GPT2Config  # noqa: E402
from transformers.models.gpt2.modeling_gpt2 import GPT2Block  # noqa: E402

NUMPY = import_path(GENERATED / "numpy" / "gpt2.py")
TORCH = import_path(GENERATED / "torch" / "gpt2.py")


def gpt2_config(d=8, n_heads=2, d_ff=12, eps=1e-5, **overrides):
    settings = dict(activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                    attn_implementation="eager") | overrides
    return GPT2Config(n_embd=d, n_head=n_heads, n_inner=d_ff, layer_norm_epsilon=eps, **settings)


def random_block(config, seed=0, layer_idx=0):
    """A float64 ``GPT2Block`` whose every parameter (biases and LayerNorm gains included) is random."""
    torch.manual_seed(seed)
    block = GPT2Block(config, layer_idx=layer_idx).double().eval()
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    for name, parameter in block.named_parameters():
        assert (parameter != 0).all() and (parameter != 1).any(), name
    return block


def hf_mask(batch, n, padding=None, dtype=torch.float64):
    """GPT-2's additive 4-D mask: causal, and padded keys (True) masked out."""
    allowed = torch.ones(n, n, dtype=torch.bool).tril()[None].expand(batch, n, n)
    if padding is not None:
        allowed = allowed & ~torch.as_tensor(padding)[:, None, :]
    return torch.zeros(batch, 1, n, n, dtype=dtype).masked_fill(~allowed[:, None], torch.finfo(dtype).min)


def right_padding(batch, n):
    padding = np.zeros((batch, n), dtype=bool)
    padding[0, n - 2:] = True
    padding[-1, 1:] = True
    return padding


@pytest.mark.parametrize("d, n_heads, d_ff, eps", [(8, 2, 12, 1e-5), (12, 3, 7, 1e-3), (16, 4, 64, 1e-6)])
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "causal+padding"])
def test_float64_parity_with_gpt2_block(d, n_heads, d_ff, eps, masked, rng):
    block = random_block(gpt2_config(d, n_heads, d_ff, eps), seed=d)
    params, config = gpt2_block_params(block), gpt2_block_config(block)
    assert config == {"n_heads": n_heads, "eps": eps}
    u = rng.standard_normal((3, 6, d))
    padding = right_padding(3, 6) if masked else None
    with torch.no_grad():
        expected = block(torch.tensor(u), attention_mask=hf_mask(3, 6, padding)).numpy()
    keep = np.ones((3, 6), bool) if padding is None else ~padding
    out = NUMPY.forward(u, params, key_padding_mask=padding, **config)  # causal by default
    assert np.abs(out - expected)[keep].max() <= 1e-10
    module = TORCH.Block(d, n_heads, d_ff, eps=eps, dtype=torch.float64).load_params(params)
    with torch.no_grad():
        result = module(torch.tensor(u), key_padding_mask=None if padding is None else torch.tensor(padding)).numpy()
    assert np.abs(result - expected)[keep].max() <= 1e-10


def test_not_causal_differs_from_gpt2_block(rng):
    """Negative control: without the causal support the block is not GPT-2's."""
    block = random_block(gpt2_config())
    u = rng.standard_normal((2, 5, 8))
    with torch.no_grad():
        expected = block(torch.tensor(u), attention_mask=hf_mask(2, 5)).numpy()
    out = NUMPY.forward(u, gpt2_block_params(block), n_heads=2, causal=False)
    assert np.abs(out - expected).max() > 1e-3


def test_float32_parity(rng):
    block = random_block(gpt2_config(16, 4, 40)).float()
    params = gpt2_block_params(block)
    u = rng.standard_normal((2, 7, 16)).astype(np.float32)
    with torch.no_grad():
        expected = block(torch.tensor(u), attention_mask=hf_mask(2, 7, dtype=torch.float32)).numpy()
    out = NUMPY.forward(u, params, n_heads=4)
    assert out.dtype == np.float32 and np.abs(out - expected).max() <= 1e-4
    module = TORCH.Block(16, 4, 40).load_params(params)
    with torch.no_grad():
        result = module(torch.tensor(u))
    assert result.dtype == torch.float32 and np.abs(result.numpy() - expected).max() <= 1e-4


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "causal+padding"])
def test_stack_equals_gpt2_blocks_and_ln_f(masked, rng):
    config = gpt2_config(8, 2, 12, 1e-5)
    blocks = [random_block(config, seed=seed, layer_idx=seed) for seed in range(3)]
    ln_f = torch.nn.LayerNorm(8, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        ln_f.weight.copy_(torch.randn(8)), ln_f.bias.copy_(torch.randn(8))
    u = rng.standard_normal((3, 6, 8))
    padding = right_padding(3, 6) if masked else None
    with torch.no_grad():
        x = torch.tensor(u)
        for block in blocks:
            x = block(x, attention_mask=hf_mask(3, 6, padding))
        expected = ln_f(x).numpy()
    keep = np.ones((3, 6), bool) if padding is None else ~padding
    layers = [gpt2_block_params(block) for block in blocks]
    final_norm = {"gain": ln_f.weight.detach().numpy(), "bias": ln_f.bias.detach().numpy()}
    out = NUMPY.forward_stack(u, layers, n_heads=2, eps=1e-5, final_norm=final_norm, key_padding_mask=padding)
    assert np.abs(out - expected)[keep].max() <= 1e-10
    stack = TORCH.Stack(3, 8, 2, 12, dtype=torch.float64).load_params(layers, final_norm)  # final norm by default
    with torch.no_grad():
        result = stack(torch.tensor(u), key_padding_mask=None if padding is None else torch.tensor(padding)).numpy()
    assert np.abs(result - expected)[keep].max() <= 1e-10


@pytest.mark.parametrize("overrides, message", [
    ({"activation_function": "relu"}, r"mlp\.act is ReLU"),
    ({"scale_attn_by_inverse_layer_idx": True}, "score scale"),
    ({"reorder_and_upcast_attn": True}, "reorder_and_upcast_attn"),
])
def test_unsupported_gpt2_configurations_are_refused(overrides, message):
    config = gpt2_config()
    for key, value in overrides.items():
        setattr(config, key, value)
    with pytest.raises(SplitformerError, match=message):
        gpt2_block_config(GPT2Block(config, layer_idx=0))



@pytest.mark.parametrize("activation, noted", [("gelu_fast", True), ("gelu_new", False)])
def test_gelu_fast_is_read_with_a_note_on_its_rounded_constant(activation, noted, rng):
    """Attack s33 L5: ``gelu_fast`` writes √(2/π) as 0.7978845608 (2.9e-12 low) and was read as gelu-tanh without a
    word: float64 parity about 1e-12 where ``gelu_new``'s is about 1e-15. Now the reading says so."""
    from splitformer.adapters import from_hf

    block = random_block(gpt2_config(activation_function=activation))
    adapted = from_hf(block)
    assert any("gelu_fast writes sqrt(2/pi) as 0.7978845608" in note for note in adapted.notes) == noted
    u = rng.standard_normal((2, 5, 8)) * 3
    with torch.no_grad():
        expected = block(torch.tensor(u), attention_mask=hf_mask(2, 5)).numpy()
    difference = np.abs(NUMPY.forward(u, adapted, **adapted.forward_kwargs) - expected).max()
    assert difference <= (1e-10 if noted else 1e-13)


def test_a_gpt2_reading_is_refused_without_its_causal_mask(rng):
    """Review s33: the reading check skipped ``causal`` for every source, right for torch's layers (a mask given per
    call) but not for GPT-2, causal by construction: ``causal=False`` ran 7e-3 off the source without a word."""
    from splitformer.adapters import from_hf

    adapted = from_hf(random_block(gpt2_config()))
    u = rng.standard_normal((2, 5, 8))
    with pytest.raises(ValueError, match="^params: the source was read with causal=True, the call has causal=False"):
        NUMPY.forward(u, adapted, **{**adapted.forward_kwargs, "causal": False})
    assert NUMPY.forward(u, adapted, **adapted.forward_kwargs).shape == u.shape
