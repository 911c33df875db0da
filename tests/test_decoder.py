"""decoder, decoder-pre-ln: the emitted blocks and stacks against ``torch.nn.TransformerDecoderLayer``."""

import numpy as np
import pytest
import torch

from splitformer.codegen.adapters.torch_decoder import decoder_layer_config, decoder_layer_params
from splitformer.symbolic.errors import SplitformerError

from conftest import GENERATED, import_path

SCHEMES = {False: "decoder", True: "decoder_pre_ln"}


def _modules(norm_first):
    name = SCHEMES[norm_first]
    return import_path(GENERATED / "numpy" / f"{name}.py"), import_path(GENERATED / "torch" / f"{name}.py")


def random_decoder_layer(d, n_heads, d_ff, eps, norm_first, seed=0, activation="relu"):
    """A float64 decoder layer whose every parameter (biases and gains included) is random."""
    torch.manual_seed(seed)
    layer = torch.nn.TransformerDecoderLayer(d, n_heads, d_ff, dropout=0.0, batch_first=True, norm_first=norm_first,
                                             layer_norm_eps=eps, activation=activation, dtype=torch.float64).eval()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    for name, parameter in layer.named_parameters():
        assert (parameter != 0).all() and (parameter != 1).any(), name
    return layer


def _masks(batch, n, n_memory):
    padding = np.zeros((batch, n), dtype=bool)
    padding[0, n - 2:] = True
    memory_padding = np.zeros((batch, n_memory), dtype=bool)
    memory_padding[1, 2:] = True
    return padding, memory_padding


def _torch_reference(layer, u, memory, padding=None, memory_padding=None):
    n = u.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).triu(1)  # True = not allowed
    with torch.no_grad():
        return layer(torch.tensor(u), torch.tensor(memory), tgt_mask=causal, tgt_is_causal=True,
                     tgt_key_padding_mask=None if padding is None else torch.tensor(padding),
                     memory_key_padding_mask=None if memory_padding is None else torch.tensor(memory_padding)).numpy()


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-ln", "pre-ln"])
@pytest.mark.parametrize("d, n_heads, d_ff, eps", [(8, 2, 12, 1e-5), (12, 3, 7, 1e-3)])
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "causal+padding"])
def test_float64_parity_with_transformer_decoder_layer(norm_first, d, n_heads, d_ff, eps, masked, rng):
    numpy_module, torch_module = _modules(norm_first)
    layer = random_decoder_layer(d, n_heads, d_ff, eps, norm_first, seed=d)
    config = decoder_layer_config(layer)
    assert config == {"scheme": SCHEMES[norm_first].replace("_", "-"), "activation": "relu", "n_heads": n_heads,
                      "eps": eps}
    params = decoder_layer_params(layer)
    u, memory = rng.standard_normal((2, 6, d)), rng.standard_normal((2, 5, d))
    padding, memory_padding = _masks(2, 6, 5) if masked else (None, None)
    expected = _torch_reference(layer, u, memory, padding, memory_padding)
    keep = np.ones((2, 6), bool) if padding is None else ~padding
    out = numpy_module.forward(u, memory, params, n_heads=n_heads, eps=eps, key_padding_mask=padding,
                               memory_key_padding_mask=memory_padding)
    assert np.abs(out - expected)[keep].max() <= 1e-10
    block = torch_module.Block(d, n_heads, d_ff, eps=eps, dtype=torch.float64).load_params(params)
    with torch.no_grad():
        result = block(torch.tensor(u), torch.tensor(memory),
                       key_padding_mask=None if padding is None else torch.tensor(padding),
                       memory_key_padding_mask=None if memory_padding is None else torch.tensor(memory_padding))
    assert np.abs(result.numpy() - expected)[keep].max() <= 1e-10


def test_memory_padding_matters(rng):
    """Negative control: ignoring the memory's padding mask changes the result."""
    numpy_module, _ = _modules(False)
    layer = random_decoder_layer(8, 2, 12, 1e-5, False)
    u, memory = rng.standard_normal((2, 6, 8)), rng.standard_normal((2, 5, 8))
    _, memory_padding = _masks(2, 6, 5)
    expected = _torch_reference(layer, u, memory, None, memory_padding)
    out = numpy_module.forward(u, memory, decoder_layer_params(layer), n_heads=2)
    assert np.abs(out - expected)[1].max() > 1e-3


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-ln", "pre-ln"])
def test_float32_parity(norm_first, rng):
    numpy_module, torch_module = _modules(norm_first)
    layer = random_decoder_layer(16, 4, 40, 1e-5, norm_first).float()
    params = decoder_layer_params(layer)
    u = rng.standard_normal((2, 7, 16)).astype(np.float32)
    memory = rng.standard_normal((2, 4, 16)).astype(np.float32)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(7)
    with torch.no_grad():
        expected = layer(torch.tensor(u), torch.tensor(memory), tgt_mask=causal, tgt_is_causal=True).numpy()
    out = numpy_module.forward(u, memory, params, n_heads=4)
    assert out.dtype == np.float32 and np.abs(out - expected).max() <= 1e-4
    block = torch_module.Block(16, 4, 40).load_params(params)
    with torch.no_grad():
        result = block(torch.tensor(u), torch.tensor(memory))
    assert result.dtype == torch.float32 and np.abs(result.numpy() - expected).max() <= 1e-4


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-ln", "pre-ln"])
def test_stack_equals_transformer_decoder(norm_first, rng):
    numpy_module, torch_module = _modules(norm_first)
    layer = random_decoder_layer(8, 2, 12, 1e-5, norm_first)
    final = torch.nn.LayerNorm(8, dtype=torch.float64) if norm_first else None
    decoder = torch.nn.TransformerDecoder(layer, 3, norm=final).eval()
    with torch.no_grad():
        for parameter in decoder.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    u, memory = rng.standard_normal((2, 6, 8)), rng.standard_normal((2, 5, 8))
    padding, memory_padding = _masks(2, 6, 5)
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)
    with torch.no_grad():
        expected = decoder(torch.tensor(u), torch.tensor(memory), tgt_mask=causal, tgt_is_causal=True,
                           tgt_key_padding_mask=torch.tensor(padding),
                           memory_key_padding_mask=torch.tensor(memory_padding)).numpy()
    layers = [decoder_layer_params(block) for block in decoder.layers]
    final_norm = {"gain": final.weight.detach().numpy(), "bias": final.bias.detach().numpy()} if final else None
    keep = ~padding
    out = numpy_module.forward_stack(u, memory, layers, n_heads=2, final_norm=final_norm, key_padding_mask=padding,
                                     memory_key_padding_mask=memory_padding)
    assert np.abs(out - expected)[keep].max() <= 1e-10
    stack = torch_module.Stack(3, 8, 2, 12, dtype=torch.float64).load_params(layers, final_norm)
    with torch.no_grad():
        result = stack(torch.tensor(u), torch.tensor(memory), key_padding_mask=torch.tensor(padding),
                       memory_key_padding_mask=torch.tensor(memory_padding)).numpy()
    assert np.abs(result - expected)[keep].max() <= 1e-10


def test_decoder_decodes_token_by_token(rng):
    """The self-attention's keys and values are cached; the memory is read again at each step."""
    numpy_module, torch_module = _modules(True)
    layer = random_decoder_layer(8, 2, 12, 1e-5, True)
    params = decoder_layer_params(layer)
    u, memory = rng.standard_normal((2, 6, 8)), rng.standard_normal((2, 5, 8))
    expected = _torch_reference(layer, u, memory)
    cache = {}
    steps = [numpy_module.forward(u[:, i:i + 1], memory, params, n_heads=2, cache=cache) for i in range(6)]
    assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10
    block = torch_module.Block(8, 2, 12, dtype=torch.float64).load_params(params)
    cache = {}
    with torch.no_grad():
        steps = [block(torch.tensor(u[:, i:i + 1]), torch.tensor(memory), cache=cache).numpy() for i in range(6)]
    assert np.abs(np.concatenate(steps, axis=1) - expected).max() <= 1e-10


def test_bad_memory_is_named(rng):
    numpy_module, torch_module = _modules(False)
    params = decoder_layer_params(random_decoder_layer(8, 2, 12, 1e-5, False))
    u = rng.standard_normal((2, 3, 8))
    with pytest.raises(ValueError, match="memory must be"):
        numpy_module.forward(u, rng.standard_normal((2, 3, 6)), params, n_heads=2)
    with pytest.raises(ValueError, match="memory_key_padding_mask"):
        numpy_module.forward(u, rng.standard_normal((2, 4, 8)), params, n_heads=2,
                             memory_key_padding_mask=np.zeros((2, 3), bool))
    block = torch_module.Block(8, 2, 12, dtype=torch.float64).load_params(params)
    with pytest.raises(ValueError, match="memory must be"):
        block(torch.tensor(u), torch.zeros(2, 4, 8, dtype=torch.float32))


def test_unsupported_decoder_layers_are_refused():
    layer = torch.nn.TransformerDecoderLayer(8, 2, 12, batch_first=True, activation=torch.nn.functional.silu)
    with pytest.raises(SplitformerError, match="activation"):
        decoder_layer_config(layer)
    with pytest.raises(SplitformerError, match="batch_first=False"):
        decoder_layer_config(torch.nn.TransformerDecoderLayer(8, 2, 12))
