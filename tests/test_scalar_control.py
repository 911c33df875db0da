"""A plug-in control with no axis (``tests/plugins/scalar_control.py``): emitted, its values and gradients equal a
reference written here (the temperature's gradient a 0-d array), and every check holds."""

import numpy as np
import torch

from conftest import derived_plugin, plugin_scheme


def _derived(tmp_path):
    return derived_plugin(tmp_path, "scalar_control.py", plugin_scheme("gaussian", mix="gaussian-mixer"))


def _reference(u, tau, padded):
    """``u + ∫ w u``, ``w ∝ e^{−τ² (p(x) − p(x̃))²}`` over the keys not padded (torch, for its autograd)."""
    position = torch.arange(u.shape[1], dtype=u.dtype)
    scores = -tau ** 2 * (position[:, None] - position[None, :]) ** 2
    weights = torch.softmax(scores.masked_fill(padded[:, None, :], float("-inf")), dim=-1)
    return u + weights @ u


def test_a_control_with_no_axis_is_emitted_with_the_reference_values_and_gradients(tmp_path):
    derived = _derived(tmp_path)
    rng = np.random.default_rng(0)
    u, tau = rng.standard_normal((2, 6, 4)), np.array(0.7)
    padded = np.array([[False] * 6, [False, False, False, True, True, True]])
    u_t, padded_t = torch.tensor(u, requires_grad=True), torch.tensor(padded)
    tau_t = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    expected = _reference(u_t, tau_t, padded_t)
    weight = torch.tensor(rng.standard_normal(u.shape))
    (expected * weight).sum().backward()
    got = derived.numpy_module().forward(u, {"mix.tau": tau}, key_padding_mask=padded)
    assert np.abs(got - expected.detach().numpy()).max() < 1e-12
    assert np.abs(got - _reference(u_t, tau_t * 2, padded_t).detach().numpy()).max() > 1e-3  # control: another τ
    for backward in ("autograd", "derived"):
        block = derived.torch_module().Block(4, 1, 4, dtype=torch.float64, backward=backward).load_params(
            {"mix.tau": tau})
        x = torch.tensor(u, requires_grad=True)
        (block(x, key_padding_mask=padded_t) * weight).sum().backward()
        gradient = dict(block.named_parameters())["mix.tau"].grad
        assert gradient.shape == () and abs(float(gradient) - float(tau_t.grad)) < 1e-12
        assert np.abs(x.grad.numpy() - u_t.grad.numpy()).max() < 1e-12


def test_every_check_holds(tmp_path):
    report = _derived(tmp_path).check(only=("semantics", "adjoint", "adjoint-test", "causality"))
    assert report.holds, [(check.id, check.detail) for check in report.checks if not check.holds]


def test_a_control_with_no_axis_in_a_pointwise_definition_derives_with_the_passes(tmp_path):
    """``u + α tanh(u)``: with every pass (the elementwise temporaries inlined), NumPy and torch equal the formula."""
    derived = derived_plugin(tmp_path, "scalar_control.py", plugin_scheme("scaled", op="scaled-tanh"))
    assert r"\alpha t(x, y)" in derived.report and r"\alpha()" not in derived.report  # a number, not a call
    u = np.random.default_rng(1).standard_normal((2, 5, 3))
    expected = u + 0.3 * np.tanh(u)
    assert np.abs(derived.numpy_module().forward(u, {"op.alpha": np.array(0.3)}) - expected).max() < 1e-14
    block = derived.torch_module().Block(3, 1, 3, dtype=torch.float64).load_params({"op.alpha": np.array(0.3)})
    with torch.no_grad():
        assert np.abs(block(torch.tensor(u)).numpy() - expected).max() < 1e-14
