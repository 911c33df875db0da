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


_LOW_RANK = '''name = "low-rank"
summary = "u + L(u): a low-rank linear map"
[operators]
g = "low-rank-map"
[[steps]]
operator = "g"
solver = "explicit"
'''


def test_a_sum_times_a_sum_is_one_contraction(tmp_path, monkeypatch):
    """``Σ_ξ u(x, ξ) Σ_ζ A(ξ, ζ) B(ζ, y)`` (``tests/plugins/low_rank.py``) was a temporary ``Σ_ζ A B`` broadcast against
    the state over (batch, tokens, d, d) and summed; now one einsum of the three factors (``flattened_sums``), and so
    are A's and B's gradients. Values and gradients against torch's autograd of ``u + u A B``."""
    import splitformer.codegen.lowering as lowering

    derived = derived_plugin(tmp_path, "low_rank.py", _LOW_RANK)
    source = derived.source("numpy")
    forward = source[source.index("def forward("):source.index("def forward_stack(")]
    assert '_einsum("bik,zl,kz->bil", u0, g_B, g_A)' in forward and "np.sum(" not in forward
    backward = source[source.index("def _vjp_backward("):]
    assert '_einsum("zl,bil,bik->kz", g_B, g_out_bar, u0)' in backward  # the gradients too (the adjoint's lowering)
    rng = np.random.default_rng(5)
    params = {"g.A": rng.standard_normal((D, HIDDEN)), "g.B": rng.standard_normal((HIDDEN, D))}
    u, grad = rng.standard_normal((2, 5, D)), rng.standard_normal((2, 5, D))
    tensors = {name: torch.tensor(value, requires_grad=True) for name, value in params.items()}
    u_t = torch.tensor(u, requires_grad=True)
    (u_t + u_t @ tensors["g.A"] @ tensors["g.B"]).backward(torch.tensor(grad))
    module = derived.numpy_module()
    got_u, got = module.vjp(u, params, grad)
    np.testing.assert_allclose(module.forward(u, params), (u + u @ params["g.A"] @ params["g.B"]), rtol=0, atol=1e-12)
    np.testing.assert_allclose(got_u, u_t.grad.numpy(), rtol=0, atol=1e-12)
    for name in params:
        np.testing.assert_allclose(got[name], tensors[name].grad.numpy(), rtol=0, atol=1e-12, err_msg=name)
    monkeypatch.setattr(lowering, "flattened_sums", lambda total: total)  # the control: the sums as they were
    (tmp_path / "control").mkdir()
    again = derived_plugin(tmp_path / "control", "low_rank.py", _LOW_RANK.replace("low-rank", "low-rank-control", 1))
    control = again.source("numpy")
    assert "np.sum(t1*u0[:, :, None], axis=3)" in control[control.index("def forward("):]
