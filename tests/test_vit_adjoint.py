"""vit's derived adjoint: NumPy ``vjp``/``vjp_logits`` and torch ``backward="derived"`` against
transformers' ViT under autograd and the generated torch module under autograd (float64)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers

from splitformer.adapters import from_hf
from splitformer.codegen.verification.statements.network_adjoint import network_adjoint_checks
from splitformer.symbolic.network_spec import load_network
from splitformer.symbolic.network_derivation import derive_token_network

from conftest import generated_now

NUMPY, TORCH = generated_now("vit")


def _relative(got: dict, expected: dict) -> float:
    """The worst relative error over every array; ``∂J/∂b_k`` (zero in exact arithmetic) on W_k's scale."""
    assert set(got) == set(expected)
    worst = 0.0
    for name, value in expected.items():
        scale = np.abs(expected[name[:-len("b_k")] + "W_k"] if name.endswith(".b_k") else value).max()
        worst = max(worst, np.abs(got[name] - value).max() / scale)
    return worst


def _vit(classifier: bool):
    config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=8, num_attention_heads=2,
                                    num_hidden_layers=2, intermediate_size=12, qkv_bias=True, layer_norm_eps=1e-6,
                                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)
    torch.manual_seed(0)
    cls = transformers.ViTForImageClassification if classifier else transformers.ViTModel
    model = cls(config).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():  # default inits zero biases: would hide bugs
            parameter.normal_(0, 0.5)
    return model


def _hf_gradients(model, pixels, seed):
    """transformers' autograd gradients, renamed to the canonical names by the weight adapter itself."""
    pixels = pixels.clone().requires_grad_(True)
    output = model(pixels)
    (output.logits if hasattr(output, "logits") else output.last_hidden_state).backward(seed)
    gradients = copy.deepcopy(model)
    with torch.no_grad():
        for parameter, target in zip(model.parameters(), gradients.parameters()):
            target.copy_(parameter.grad if parameter.grad is not None else torch.zeros_like(parameter))  # the pooler
    return pixels.grad.numpy(), dict(from_hf(gradients).params)


@pytest.mark.parametrize("classifier", [False, True], ids=["ViTModel", "ViTForImageClassification"])
def test_vjp_matches_transformers_autograd(classifier):
    model = _vit(classifier)
    adapted = from_hf(model)
    pixels = torch.randn(2, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    shape = (2, 3) if classifier else (2, 5, 8)
    seed = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    expected_image, expected = _hf_gradients(model, pixels, seed)
    function = NUMPY.vjp_logits if classifier else NUMPY.vjp
    grad_image, grads = function(pixels.numpy(), adapted.params, seed.numpy(), **adapted.config)
    assert np.abs(grad_image - expected_image).max() / np.abs(expected_image).max() <= 1e-10
    if not classifier:  # the head does not enter the hidden states
        expected = {name: value for name, value in expected.items() if not name.startswith("head.")}
    assert _relative(grads, expected) <= 1e-10


def _generated(backward: str, params: dict | None = None):
    torch.manual_seed(3)
    model = TORCH.Model(n_layers=2, d_model=8, n_heads=2, d_ff=12, n_channels=3, patch_size=2, image_size=(5, 4),
                        n_classes=3, dtype=torch.float64, backward=backward)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.5)
    return model.load_params(params) if params is not None else model


def _autograd(model, function: str, pixels, seed):
    pixels = pixels.clone().requires_grad_(True)
    getattr(model, function)(pixels).backward(seed)
    return pixels.grad.numpy(), {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("function", ["forward", "logits"])
def test_vjp_and_derived_backward_match_generated_autograd(function):
    """An image the patches do not cover (5 × 4, patch 2): the uncovered row gets zero gradient."""
    reference = _generated("autograd")
    params = {name: p.detach().numpy().copy() for name, p in reference.named_parameters()}
    pixels = torch.randn(2, 3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    shape = (2, 3) if function == "logits" else (2, 5, 8)
    seed = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    expected_image, expected = _autograd(reference, function, pixels, seed)
    assert (expected_image[:, :, 4] == 0).all()
    numpy_function = NUMPY.vjp_logits if function == "logits" else NUMPY.vjp
    grad_image, grads = numpy_function(pixels.numpy(), params, seed.numpy(), patch_size=2, n_heads=2)
    assert np.abs(grad_image - expected_image).max() / np.abs(expected_image).max() <= 1e-10
    assert _relative(grads, expected) <= 1e-10
    derived_image, derived = _autograd(_generated("derived", params), function, pixels, seed)
    assert np.abs(derived_image - expected_image).max() / np.abs(expected_image).max() <= 1e-10
    assert _relative(derived, expected) <= 1e-10


def test_derived_backward_float32_and_no_grad():
    params = {name: p.detach().numpy().astype(np.float32) for name, p in _generated("autograd").named_parameters()}
    model = TORCH.Model(n_layers=2, d_model=8, n_heads=2, d_ff=12, n_channels=3, patch_size=2, image_size=(5, 4),
                        n_classes=3, dtype=torch.float32, backward="derived").load_params(params)
    reference = TORCH.Model(n_layers=2, d_model=8, n_heads=2, d_ff=12, n_channels=3, patch_size=2, image_size=(5, 4),
                            n_classes=3, dtype=torch.float32).load_params(params)
    pixels = torch.randn(2, 3, 5, 4, generator=torch.Generator().manual_seed(6))
    seed = torch.randn(2, 3, generator=torch.Generator().manual_seed(7))
    got_image, got = _autograd(model, "logits", pixels, seed)
    expected_image, expected = _autograd(reference, "logits", pixels, seed)
    assert np.abs(got_image - expected_image).max() / np.abs(expected_image).max() <= 1e-4
    with torch.no_grad():
        assert torch.allclose(model(pixels), reference(pixels), atol=1e-5)


def test_bad_costate_and_backward_option():
    params = {name: p.detach().numpy() for name, p in _generated("autograd").named_parameters()}
    pixels = np.zeros((2, 3, 5, 4))
    with pytest.raises(ValueError, match="grad_out must have shape"):
        NUMPY.vjp(pixels, params, np.zeros((2, 5, 7)), patch_size=2, n_heads=2)
    with pytest.raises(ValueError, match="grad_logits has dtype"):
        NUMPY.vjp_logits(pixels, params, np.zeros((2, 3), dtype=bool), patch_size=2, n_heads=2)
    with pytest.raises(ValueError, match="backward must be"):
        _generated("reverse")


def test_check_holds_and_its_negative_control_fails():
    checks = {check.id: check for check in network_adjoint_checks(derive_token_network(load_network("vit")))}
    assert checks["adjoint/vit/finite-difference"].holds, checks["adjoint/vit/finite-difference"].detail
    control = checks["adjoint/vit/negative-control"]
    assert control.holds and float(control.detail.rsplit(" ", 1)[1]) > 1e-3
