"""resnet-block and unet-level's derived adjoint: NumPy ``vjp`` and torch ``backward="derived"``
against plain torch Conv2d / BatchNorm2d (eval) / ReLU / ConvTranspose2d under autograd (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from splitformer.codegen.verification.statements.network_adjoint import grid_adjoint_checks
from splitformer.symbolic.network_spec import load_network
from splitformer.symbolic.network_derivation import derive_grid_network

from conftest import generated_now
from test_grid_networks import _batch_norm, _conv

MODULES = {name.replace("-", "_"): dict(zip(("numpy", "torch"), generated_now(name)))
           for name in ("resnet-block", "unet-level")}


def _resnet(c_in, c_out, stride, shortcut):
    torch.manual_seed(stride * 10 + shortcut)
    layers = {"conv1": _conv(c_in, c_out, 3, stride, 1), "bn1": _batch_norm(c_out), "conv2": _conv(c_out, c_out, 3, 1, 1),
              "bn2": _batch_norm(c_out)}
    if shortcut:
        layers.update(shortcut=_conv(c_in, c_out, 1, stride), bn3=_batch_norm(c_out))

    def reference(x):
        field = layers["bn2"](layers["conv2"](torch.relu(layers["bn1"](layers["conv1"](x)))))
        return torch.relu(field + (layers["bn3"](layers["shortcut"](x)) if shortcut else x))

    return layers, reference


def _unet():
    torch.manual_seed(3)
    layers = {"down": _conv(3, 6, 3, 2, 1), "conv": _conv(6, 6, 3, 1, 1), "bn": _batch_norm(6),
              "up": _conv(6, 3, 2, 2, transposed=True)}
    return layers, lambda x: x + layers["up"](torch.relu(layers["bn"](layers["conv"](layers["down"](x)))))


def _canonical(layers, value) -> dict:
    """Canonical names → ``value(tensor)`` of each torch parameter (a kernel permuted as the adapters do)."""
    result = {}
    for group, layer in layers.items():
        if isinstance(layer, torch.nn.BatchNorm2d):
            result.update({f"{group}.gain": value(layer.weight), f"{group}.bias": value(layer.bias)})
            continue
        order = (0, 2, 3, 1) if isinstance(layer, torch.nn.ConvTranspose2d) else (1, 2, 3, 0)
        result.update({f"{group}.W": value(layer.weight).transpose(order).copy(), f"{group}.b": value(layer.bias)})
    return result


def _statistics(layers) -> dict:
    return {f"{group}.{name}": getattr(layer, buffer).numpy().copy() for group, layer in layers.items()
            if isinstance(layer, torch.nn.BatchNorm2d) for name, buffer in (("mean", "running_mean"), ("var", "running_var"))}


def _worst(got: dict, expected: dict) -> float:
    return max(np.abs(got[name] - value).max() / np.abs(value).max() for name, value in expected.items())


CASES = {"resnet-identity": ("resnet_block", (4, 4, 1, False)), "resnet-strided-projection": ("resnet_block", (3, 5, 2, True)),
         "unet": ("unet_level", None)}


@pytest.mark.parametrize("name, case", CASES.values(), ids=CASES.keys())
def test_vjp_and_derived_backward_match_torch_autograd(name, case):
    layers, reference = _resnet(*case) if case else _unet()
    stride = case[2] if case else 1
    params = _canonical(layers, lambda tensor: tensor.detach().numpy().copy()) | _statistics(layers)
    x = torch.randn(2, 4 if case and not case[3] else 3, *((9, 8) if case else (8, 10)), dtype=torch.float64,
                    generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    out = reference(x)
    seed = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out.backward(seed)
    expected = _canonical(layers, lambda tensor: tensor.grad.numpy().copy())
    grad_u, grads = MODULES[name]["numpy"].vjp(x.detach().numpy(), params, seed.numpy(), stride=stride)
    assert set(grads) == set(params)
    assert np.abs(grad_u - x.grad.numpy()).max() / np.abs(x.grad.numpy()).max() <= 1e-10
    assert _worst(grads, expected) <= 1e-10
    # BatchNorm's statistics are buffers in torch: their gradients against autograd through the generated module
    generated = MODULES[name]["torch"]
    d = params[next(iter(params))].shape[-1]
    options = {"stride": stride, "transfer": bool(case and case[3])} if case else {}
    for backward in ("autograd", "derived"):
        model = generated.Model(x.shape[1], d, dtype=torch.float64, backward=backward, **options).load_params(params)
        u = x.detach().clone().requires_grad_(True)
        model(u).backward(seed)
        autograd = {key: parameter.grad.numpy() for key, parameter in model.named_parameters()}
        assert np.abs(u.grad.numpy() - x.grad.numpy()).max() / np.abs(x.grad.numpy()).max() <= 1e-10
        assert _worst(grads, autograd) <= 1e-10


def test_bad_costate_is_refused_before_work():
    layers, _ = _unet()
    params = _canonical(layers, lambda tensor: tensor.detach().numpy().copy()) | _statistics(layers)
    with pytest.raises(ValueError, match="grad_out must have shape"):
        MODULES["unet_level"]["numpy"].vjp(np.zeros((1, 3, 8, 8)), params, np.zeros((1, 3, 4, 4)))
    with pytest.raises(ValueError, match="backward must be"):
        MODULES["unet_level"]["torch"].Model(3, 6, backward="reverse")


@pytest.mark.parametrize("name", ["resnet-block", "unet-level"])
def test_check_holds_and_its_negative_control_fails(name):
    checks = {check.id: check for check in grid_adjoint_checks(derive_grid_network(load_network(name)))}
    assert checks[f"adjoint/{name}/finite-difference"].holds, checks[f"adjoint/{name}/finite-difference"].detail
    assert checks[f"adjoint/{name}/negative-control"].holds
