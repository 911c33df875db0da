"""A derived adjoint binds ``d_head`` for the per-head views of the parameters it reads and the gradients it returns,
where no statement names it (tests/plugins/head_linear.py, derived without the passes: einsum over the views)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import splitformer

from conftest import ROOT

SCHEME = """\
name = "{name}"
summary = "a per-head linear map on the normalized state"
[operators]
norm = "layer-norm"
mix = "head-linear"
[[steps]]
operator = "mix"
solver = "explicit"
on = "norm"
"""


def _derived(tmp_path, name: str):
    splitformer.load_plugin(ROOT / "tests" / "plugins" / "head_linear.py")
    path = tmp_path / f"{name}.toml"
    path.write_text(SCHEME.format(name=name), encoding="utf-8")
    return splitformer.derive(str(path), passes="none")


def _gradients(derivation, rng):
    """The NumPy vjp's and the torch derived backward's gradients, and autograd's through the torch module."""
    params = {"norm.gain": 1 + rng.standard_normal(8) / 4, "norm.bias": rng.standard_normal(8),
              "mix.W": rng.standard_normal((8, 8)), "mix.O": rng.standard_normal((8, 8))}
    u, seed = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    grad_u, grads = derivation.numpy_module().vjp(u, params, seed, n_heads=2)
    results = {"numpy": (grad_u, grads["mix.W"])}
    for backward in ("derived", "autograd"):
        block = derivation.torch_module().Block(8, 2, 12, dtype=torch.float64, backward=backward).load_params(params)
        x = torch.tensor(u, requires_grad=True)
        block(x).backward(torch.tensor(seed))
        results[backward] = (x.grad.numpy(), block.mix.W.grad.numpy())
    return results


def test_the_adjoint_of_per_head_views_runs_and_matches_autograd(tmp_path, rng):
    results = _gradients(_derived(tmp_path, "head-views"), rng)
    for name in ("numpy", "derived"):
        for got, expected in zip(results[name], results["autograd"]):
            np.testing.assert_allclose(got, expected, rtol=1e-11, atol=1e-12)


def test_control_the_adjoint_without_its_d_head_binding_fails(tmp_path, rng):
    """The emitted NumPy source with the adjoint's ``d_head`` line taken out (as it was emitted when only statements
    naming ``d_head`` bound it) raises NameError."""
    source = _derived(tmp_path, "head-views-control")._source("numpy")
    head, _, adjoint = source.partition("def _vjp_backward(")
    assert "    d_head = d // n_heads\n" in adjoint
    namespace = {"__name__": "head_views_control"}
    exec(compile(head + "def _vjp_backward(" + adjoint.replace("    d_head = d // n_heads\n", "", 1), "<control>", "exec"),
         namespace)  # noqa: S102 - our own output
    u = rng.standard_normal((2, 5, 8))
    params = {"norm.gain": np.ones(8), "norm.bias": np.zeros(8), "mix.W": np.eye(8), "mix.O": np.eye(8)}
    with pytest.raises(NameError, match="d_head"):
        namespace["vjp"](u, params, u, n_heads=2)
