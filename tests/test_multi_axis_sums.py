"""A sum over several indices that no pattern takes is lowered as one reduction per index (``Lowering.one_axis_sums``).
A tester's output gate over the heads' features, ``σ(∫ W_g u dξ + b_g)`` on ``(x, h, e)`` (``tests/plugins/sum_gate.py``),
has the adjoint ``ū(x, ξ) = Σ_{h,e} W_g(ξ, h, e) σ′(z(x, h, e)) ḡ(x, h, e)``; hoisted whole, that sum was a temporary
defined as itself, lowered without end (``RecursionError``: the kind could not be derived). Values and gradients against
torch's autograd of the formula written here, float64, every parameter random. The same gate over (heads, features,
hidden) (``head-hidden-gate``) sums over three indices, and its kernels are stored with three axes: its step's derived
backward bound no ``d_ff`` for their views (``vjp`` NameError) and the ``matmul`` pass took the kernel ``(d, d, d_ff)``
for a matrix (``forward`` failed inside NumPy)."""

import numpy as np
import pytest
import torch

from conftest import derived_plugin

_SCHEME = '''name = "gated"
summary = "u + G(LN u): an output gate over the heads' features"
[operators]
norm = "layer-norm"
g = "{kind}"
[[steps]]
operator = "g"
solver = "explicit"
on = "norm"
'''
D, HEADS, HIDDEN = 8, 2, 3


def _reference(u, params, eps=1e-5):
    """u + σ(LN(u) W_g + b_g) W_o (row vectors; the gate's axes (heads' features, and hidden) contracted)."""
    normed = torch.nn.functional.layer_norm(u, (D,), params["norm.gain"], params["norm.bias"], eps)
    gate_in, gate_out = params["g.W_g"], params["g.W_o"]
    gate = torch.sigmoid(torch.tensordot(normed, gate_in, dims=1) + params["g.b_g"])
    return u + torch.tensordot(gate, gate_out, dims=gate_out.dim() - 1)


@pytest.fixture(scope="module", params=["head-gate", "head-hidden-gate"])
def derivation(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, derived_plugin(folder, "sum_gate.py", _SCHEME.format(kind=request.param))


def _inputs(seed, gate_bias=None, kind="head-gate"):
    """u, random parameters (``gate_bias``: b_g given) and a costate."""
    rng = np.random.default_rng(seed)
    gate = (D,) if kind == "head-gate" else (D, HIDDEN)
    params = {"norm.gain": 1 + 0.3 * rng.standard_normal(D), "norm.bias": rng.standard_normal(D),
              "g.W_g": rng.standard_normal((D, *gate)),
              "g.b_g": rng.standard_normal(gate) if gate_bias is None else gate_bias,
              "g.W_o": rng.standard_normal((*gate, D))}
    return rng.standard_normal((2, 5, D)), params, rng.standard_normal((2, 5, D))


def _autograd(u, params, grad):
    tensors = {name: torch.tensor(value, requires_grad=True) for name, value in params.items()}
    u_t = torch.tensor(u, requires_grad=True)
    out = _reference(u_t, tensors)
    out.backward(torch.tensor(grad))
    return out.detach().numpy(), u_t.grad.numpy(), {name: tensor.grad.numpy() for name, tensor in tensors.items()}


def assert_numpy_matches(module, u, params, grad):
    """The NumPy ``forward`` and ``vjp`` against torch's autograd of ``_reference``."""
    out, grad_u, grads = _autograd(u, params, grad)
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(module.forward(u, params, n_heads=HEADS), out, rtol=0, atol=1e-12)
        got_u, got = module.vjp(u, params, grad, n_heads=HEADS)
    np.testing.assert_allclose(got_u, grad_u, rtol=0, atol=1e-11)
    for name in params:
        np.testing.assert_allclose(got[name], grads[name], rtol=0, atol=1e-11, err_msg=name)


def assert_torch_matches(module, backward, u, params, grad):
    """The torch Block's gradients (``backward``) against torch's autograd of ``_reference``."""
    _, grad_u, grads = _autograd(u, params, grad)
    d_ff = params["g.W_g"].shape[-1] if params["g.W_g"].ndim == 3 else D
    block = module.Block(D, HEADS, d_ff, backward=backward, dtype=torch.float64).load_params(params)
    u_t = torch.tensor(u, requires_grad=True)
    block(u_t).backward(torch.tensor(grad))
    np.testing.assert_allclose(u_t.grad.numpy(), grad_u, rtol=0, atol=1e-11)
    named = dict(block.named_parameters())
    for name in params:
        np.testing.assert_allclose(named[name].grad.numpy(), grads[name], rtol=0, atol=1e-11, err_msg=name)


def test_numpy_forward_and_vjp(derivation):
    kind, derived = derivation
    assert_numpy_matches(derived.numpy_module(), *_inputs(0, kind=kind))


def test_torch_derived_backward(derivation):
    kind, derived = derivation
    assert_torch_matches(derived.torch_module(), "derived", *_inputs(1, kind=kind))
