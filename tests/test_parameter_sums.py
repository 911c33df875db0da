"""A kind whose formula sums parameters alone (``tests/plugins/parameter_sums.py``): its emitted code runs and equals
a reference written here; its layers commute, and the stack check takes a control that moves (one layer fewer). A
step of the query inside a linear map (``tests/plugins/gated_map.py``) leaves a matmul."""

import inspect

import numpy as np
import torch

from splitformer.codegen import nested_sums

from conftest import derived_plugin, plugin_scheme


def _derived(tmp_path):
    return derived_plugin(tmp_path, "parameter_sums.py", plugin_scheme("scaled-mean", mix="scaled-support-mean"))


def test_the_scale_of_parameters_alone_is_emitted_and_equals_the_reference(tmp_path):
    derived = _derived(tmp_path)
    rng = np.random.default_rng(0)
    params = {"mix.W": rng.standard_normal((6, 6))}
    u = rng.standard_normal((2, 5, 6))
    padded = np.array([[False] * 5, [False, False, True, True, True]])
    kept = ~padded[:, None, :].repeat(5, axis=1)  # (batch, query, key)
    mean = np.einsum("bij,bjl->bil", kept, u) / kept.sum(-1, keepdims=True)
    expected = u + (params["mix.W"] ** 2).sum(0) * mean
    got = derived.numpy_module().forward(u, params, key_padding_mask=padded)
    assert np.abs(got - expected).max() < 1e-12
    block = derived.torch_module().Block(6, 1, 6, dtype=torch.float64).load_params(params)
    with torch.no_grad():
        got = block(torch.from_numpy(u), key_padding_mask=torch.from_numpy(padded)).numpy()
    assert np.abs(got - expected).max() < 1e-12
    assert np.abs(u + (params["mix.W"] ** 2).sum(1) * mean - got).max() > 1e-3  # control: the other axis summed


def test_the_stack_check_of_layers_that_commute_holds_with_a_control_that_moves(tmp_path):
    report = _derived(tmp_path).check(only="semantics")
    stack = next(check for check in report.checks if check.id == "structure/scaled-mean/stack")
    assert stack.holds and "they commute" in stack.statement, stack.detail
    assert report.holds, [(check.id, check.detail) for check in report.checks if not check.holds]


def test_a_step_of_the_query_inside_a_linear_map_leaves_a_matmul(tmp_path, monkeypatch):
    """``∫ H(p(x) − 3, 1) W(ξ, y) u(x, ξ) dξ``: a GEMM times the step, equal to the reference; control: with the step
    left in the sum, a broadcast product summed."""
    derived = derived_plugin(tmp_path, "gated_map.py", plugin_scheme("gated", mix="gated-map"))
    rng = np.random.default_rng(2)
    params, u = {"mix.W": rng.standard_normal((6, 6))}, rng.standard_normal((2, 5, 6))
    expected = u + (np.arange(5) >= 3)[None, :, None] * (u @ params["mix.W"])
    module = derived.numpy_module()
    assert np.abs(module.forward(u, params) - expected).max() < 1e-12
    assert "@ mix_W" in inspect.getsource(module.forward)
    monkeypatch.setattr(nested_sums, "_contraction_freed", lambda flat, nested: False)
    monkeypatch.setenv("SPLITFORMER_CACHE", "off")
    kept = derived_plugin(tmp_path, "gated_map.py", plugin_scheme("gated", mix="gated-map")).source("numpy")
    assert "@ mix_W" not in kept
