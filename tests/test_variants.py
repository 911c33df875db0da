"""The built-in variants against independent references, in both backends (float64)."""

import re

import numpy as np
import pytest
import torch

from splitformer.codegen.adapters import from_torch
from splitformer.codegen.output import write_files
from splitformer.codegen.pipeline import generate
from splitformer.symbolic import load_scheme

import reference
from conftest import GENERATED, ROOT, import_path, random_encoder_layer

VARIANTS = ["macaron", "parallel", "symmetric_parallel", "rk2", "rk4"]


def _both(name, folder=GENERATED):
    return import_path(folder / "numpy" / f"{name}.py"), import_path(folder / "torch" / f"{name}.py")


def _torch_forward(module, params, u, n_heads, d_ff, eps):
    block = module.Block(u.shape[-1], n_heads, d_ff, eps=eps, dtype=torch.float64).load_params(params)
    return block(torch.tensor(u)).detach().numpy()


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("d, n_heads, d_ff, eps", [(8, 2, 12, 1e-5), (12, 3, 20, 0.05)])
def test_variant_matches_its_published_formula(name, d, n_heads, d_ff, eps, rng):
    numpy_module, torch_module = _both(name)
    params = reference.random_params(numpy_module.PARAMETERS, d, d_ff, rng)
    u = rng.standard_normal((2, 5, d))
    expected = getattr(reference, name)(u, params, n_heads, eps)
    assert np.abs(numpy_module.forward(u, params, n_heads=n_heads, eps=eps) - expected).max() <= 1e-10
    assert np.abs(_torch_forward(torch_module, params, u, n_heads, d_ff, eps) - expected).max() <= 1e-10


def test_macaron_has_two_feed_forward_operators_with_their_own_parameters():
    numpy_module, _ = _both("macaron")
    assert {"ffn_pre.W_1", "ffn_post.W_1", "norm3.gain"} <= set(numpy_module.PARAMETERS)
    assert "ffn_pre.W_1" in numpy_module.__doc__


def test_parallel_block_normalizes_once():
    text = (GENERATED / "numpy" / "parallel.py").read_text()
    assert len(re.findall(r"\b_layer_norm\(u0, norm1_gain, norm1_bias, eps\)", text)) == 1  # not _kept_layer_norm


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_pre_ln_matches_torch_norm_first(activation, rng):
    name = "pre_ln" if activation == "relu" else "pre_ln_gelu"
    numpy_module, torch_module = _both(name)
    layer = random_encoder_layer(8, 2, 12, 1e-5, norm_first=True, activation=activation)
    params = from_torch(layer)
    u = rng.standard_normal((2, 5, 8))
    expected = layer(torch.tensor(u)).detach().numpy()
    assert np.abs(numpy_module.forward(u, params, n_heads=2) - expected).max() <= 1e-10
    assert np.abs(_torch_forward(torch_module, params, u, 2, 12, 1e-5) - expected).max() <= 1e-10


@pytest.mark.parametrize("activation", ["silu", "tanh"])
def test_other_activations_emit_and_match(activation, tmp_path, rng):
    scheme = load_scheme("pre-ln").with_activation(activation)
    write_files(generate(scheme, ("numpy", "torch"), tmp_path))
    name = f"pre_ln_{activation}"
    numpy_module, torch_module = _both(name, tmp_path)
    params = reference.random_params(numpy_module.PARAMETERS, 8, 12, rng)
    u = rng.standard_normal((2, 4, 8))
    x = u + reference.attention(reference.norm(u, params, "norm1", 1e-5), params, 2)
    expected = x + reference.feed_forward(reference.norm(x, params, "norm2", 1e-5), params, activation=activation)
    assert np.abs(numpy_module.forward(u, params, n_heads=2) - expected).max() <= 1e-10
    assert np.abs(_torch_forward(torch_module, params, u, 2, 12, 1e-5) - expected).max() <= 1e-10


def test_user_scheme_file_derives_emits_and_runs(tmp_path, rng):
    """tests/schemes/sandwich.toml: attention, feed-forward, attention (two attention operators)."""
    path = ROOT / "tests" / "schemes" / "sandwich.toml"
    write_files(generate(load_scheme(str(path)), ("numpy", "torch"), tmp_path))
    numpy_module, torch_module = _both("sandwich", tmp_path)
    params = reference.random_params(numpy_module.PARAMETERS, 8, 12, rng)
    u = rng.standard_normal((2, 4, 8))
    renamed = {name.replace("attn_in.", "attn.") : value for name, value in params.items()}
    x = u + reference.attention(reference.norm(u, params, "norm1", 1e-5), renamed, 2)
    x = x + reference.feed_forward(reference.norm(x, params, "norm2", 1e-5), params)
    renamed = {name.replace("attn_out.", "attn.") : value for name, value in params.items()}
    expected = x + reference.attention(reference.norm(x, params, "norm3", 1e-5), renamed, 2)
    assert np.abs(numpy_module.forward(u, params, n_heads=2) - expected).max() <= 1e-10
    assert np.abs(_torch_forward(torch_module, params, u, 2, 12, 1e-5) - expected).max() <= 1e-10


def test_numpy_erf_matches_the_standard_library():
    import math

    module = import_path(GENERATED / "numpy" / "pre_ln_gelu.py")  # its GELU routines' erf, double and single precision
    x = np.concatenate([np.linspace(-30, 30, 30001), [0.0, -0.0, 1.0, -1.0, 8.0, -8.0, 1e-300, 27.0, -40.0]])
    expected = np.array([math.erf(value) for value in x])
    assert np.abs(module._erf_block(x) - expected).max() <= 4e-16
    # float32: erf(x/√2) of the GELU's x as tanh g(x), g = artanh erf(x/√2) by the fitted polynomial
    # (tools/gelu_fit.py), evaluated in float32: within 2e-7, under 2 spacings of float32 at 1 (1.2e-7); the control:
    # g(√2 x), erf(x), the GELU's 1/√2 left out
    single = x.astype(np.float32)
    halved = np.array([math.erf(value / math.sqrt(2)) for value in single.astype(np.float64)])
    rows = np.empty((3, single.size), np.float32)
    erf = np.tanh(module._artanh_erf(single, 1.0, rows))
    assert erf.dtype == np.float32 and np.abs(erf - halved).max() <= 2e-7
    assert np.abs(np.tanh(module._artanh_erf(single, math.sqrt(2), rows)) - halved).max() > 1e-2
