"""Parity of the emitted code with ``torch.nn.TransformerEncoderLayer`` (all parameters random)."""

import numpy as np
import pytest
import torch

from splitformer.codegen.adapters import from_torch
from splitformer.codegen.pipeline import generate
from splitformer.codegen.output import write_files
from splitformer.symbolic import load_scheme

from conftest import GENERATED, import_path, random_encoder_layer

SHAPES = [  # (d, n_heads, d_ff, eps)
    (8, 1, 12, 1e-5),
    (8, 2, 20, 1e-3),
    (16, 4, 24, 1e-6),
    (12, 4, 7, 0.1),
]
SCHEMES = [("post_ln", False), ("pre_ln", True)]


def _modules(folder, name):
    return import_path(folder / "numpy" / f"{name}.py"), import_path(folder / "torch" / f"{name}.py")


def _reference(layer, x, grad):
    with torch.set_grad_enabled(grad):
        return layer(x).detach().numpy()


@pytest.mark.parametrize("name, norm_first", SCHEMES)
@pytest.mark.parametrize("d, n_heads, d_ff, eps", SHAPES)
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
def test_float64_parity(name, norm_first, d, n_heads, d_ff, eps, grad, rng):
    numpy_module, torch_module = _modules(GENERATED, name)
    layer = random_encoder_layer(d, n_heads, d_ff, eps, norm_first=norm_first, seed=d + n_heads)
    params = from_torch(layer)
    u = rng.standard_normal((3, 6, d))
    reference = _reference(layer, torch.tensor(u), grad)
    out = numpy_module.forward(u, params, n_heads=n_heads, eps=eps)
    assert out.dtype == np.float64
    assert np.abs(out - reference).max() <= 1e-10
    block = torch_module.Block(d, n_heads, d_ff, eps=eps, dtype=torch.float64).load_params(params)
    with torch.set_grad_enabled(grad):
        result = block(torch.tensor(u)).detach().numpy()
    assert np.abs(result - reference).max() <= 1e-10


@pytest.mark.parametrize("name, norm_first", SCHEMES)
def test_float32_parity_keeps_float32(name, norm_first, rng):
    numpy_module, torch_module = _modules(GENERATED, name)
    d, n_heads, d_ff, eps = 16, 2, 40, 1e-5
    layer = random_encoder_layer(d, n_heads, d_ff, eps, norm_first=norm_first)
    params = {key: value.astype(np.float32) for key, value in from_torch(layer).items()}
    layer = layer.float()
    u = rng.standard_normal((2, 9, d)).astype(np.float32)
    reference = _reference(layer, torch.tensor(u), False)
    out = numpy_module.forward(u, params, n_heads=n_heads, eps=eps)
    assert out.dtype == np.float32
    assert np.abs(out - reference).max() <= 1e-4
    block = torch_module.Block(d, n_heads, d_ff, eps=eps).load_params(params)
    result = block(torch.tensor(u))
    assert result.dtype == torch.float32
    assert np.abs(result.detach().numpy() - reference).max() <= 1e-4


@pytest.mark.parametrize("name, norm_first", SCHEMES)
def test_unbatched_input_gives_unbatched_output(name, norm_first, rng):
    numpy_module, torch_module = _modules(GENERATED, name)
    layer = random_encoder_layer(8, 2, 12, 1e-5, norm_first=norm_first)
    params = from_torch(layer)
    u = rng.standard_normal((5, 8))
    reference = _reference(layer, torch.tensor(u[None]), False)[0]
    out = numpy_module.forward(u, params, n_heads=2)
    assert out.shape == (5, 8) and np.abs(out - reference).max() <= 1e-10
    block = torch_module.Block(8, 2, 12, dtype=torch.float64).load_params(params)
    assert np.abs(block(torch.tensor(u)).detach().numpy() - reference).max() <= 1e-10


def test_parity_with_every_lowering_pass_switched_off(tmp_path, rng):
    write_files(generate(load_scheme("post-ln"), ("numpy", "torch"), tmp_path, passes=()))
    numpy_module, torch_module = _modules(tmp_path, "post_ln")
    assert "norm1_out" in (tmp_path / "numpy" / "post_ln.py").read_text()  # nothing was inlined
    layer = random_encoder_layer(8, 2, 12, 1e-5)
    params = from_torch(layer)
    u = rng.standard_normal((2, 5, 8))
    reference = _reference(layer, torch.tensor(u), False)
    assert np.abs(numpy_module.forward(u, params, n_heads=2) - reference).max() <= 1e-10
    block = torch_module.Block(8, 2, 12, dtype=torch.float64).load_params(params)
    assert np.abs(block(torch.tensor(u)).detach().numpy() - reference).max() <= 1e-10


def test_torch_block_trains_like_the_reference(rng):
    """Gradients through the generated Block equal those through the torch layer."""
    _, torch_module = _modules(GENERATED, "post_ln")
    layer = random_encoder_layer(8, 2, 12, 1e-5)
    block = torch_module.Block(8, 2, 12, dtype=torch.float64).load_params(from_torch(layer))
    x = torch.tensor(rng.standard_normal((2, 5, 8)))
    layer(x).square().sum().backward()
    block(x).square().sum().backward()
    expected = layer.linear1.weight.grad.T.numpy()
    np.testing.assert_allclose(block.ffn.W_1.grad.numpy(), expected, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["post-ln", "pre-ln", "macaron", "parallel", "symmetric-parallel", "rk2", "rk4"])
def test_passes_change_nothing_but_speed(name, tmp_path, rng):
    """Every built-in, with masks: all passes (committed code) against no passes at all."""
    module_name = name.replace("-", "_")
    write_files(generate(load_scheme(name), ("numpy", "torch"), tmp_path, passes=()))
    plain_numpy, plain_torch = _modules(tmp_path, module_name)
    fast_numpy, fast_torch = _modules(GENERATED, module_name)
    import reference

    params = reference.random_params(fast_numpy.PARAMETERS, 8, 12, rng)
    u = rng.standard_normal((2, 5, 8))
    padding = np.array([[False] * 5, [False, False, True, True, True]])
    for options in ({}, {"key_padding_mask": padding}, {"causal": True}):
        expected = plain_numpy.forward(u, params, n_heads=2, **options)
        assert np.abs(fast_numpy.forward(u, params, n_heads=2, **options) - expected).max() <= 1e-12
        torch_options = {key: torch.tensor(value) if key == "key_padding_mask" else value for key, value in options.items()}
        for module in (plain_torch, fast_torch):
            block = module.Block(8, 2, 12, dtype=torch.float64).load_params(params)
            with torch.no_grad():
                assert np.abs(block(torch.tensor(u), **torch_options).numpy() - expected).max() <= 1e-12
