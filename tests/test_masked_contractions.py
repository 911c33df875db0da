"""A sum of the count rule's form, ``Σ_k Where(m, v, 0)`` with ``v`` a product of reads and safe counts, emitted as
the contraction ``Σ_k m v`` (``codegen.bool_values._masked_contraction``): support-mean's derived adjoint
``Σ_j χ[j, i] m̄[j, l] / Σ_n χ[j, n]`` was a (b, j, i, l) product then a sum (torch, N = 1024, d = 64, float64:
526 ms for a training step's forward and backward, autograd 12; now 12.5), now one einsum. Its values against
torch's autograd through a reference written here from the kind's formula, rows of no key included; the sums
whose value is no such product keep their masked form."""

import inspect
import re

import numpy as np
import pytest
import torch

import splitformer.codegen.bool_values as bool_values

from conftest import derived_plugin, plugin_scheme

#: A masked sum over four axes (batch, query, key, feature) written as a where, then summed.
MASKED_SUM = re.compile(r"(torch|np)\.sum\((torch|np)\.where\(")


def _modules(tmp_path, kind: str, plugin: str = "support_mean.py"):
    derivation = derived_plugin(tmp_path, plugin, plugin_scheme(f"s-{kind}", mix=kind))
    return derivation.numpy_module(), derivation.torch_module()


def _sources(modules) -> str:
    return "".join(inspect.getsource(module) for module in modules)


def _reference(u, W, b, support):
    """One explicit step of support-mean, ``u + (∫ χ u dx̃ / ∫ χ dη) W + b``, a row of no key contributing 0."""
    counts = support.sum(-1, keepdim=True).to(u.dtype)
    mean = torch.einsum("bij,bjl->bil", support.to(u.dtype), u) / torch.where(counts > 0, counts, 1)
    return u + mean @ W + b


def _inputs(dtype=torch.float64):
    generator = torch.Generator().manual_seed(3)
    u = torch.randn(3, 7, 5, dtype=dtype, generator=generator)
    W, b = torch.randn(5, 5, dtype=dtype, generator=generator), torch.randn(5, dtype=dtype, generator=generator)
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[1, 4:] = True  # the second sequence's last three tokens are padding
    blocked = torch.zeros(7, 7, dtype=torch.bool)
    blocked[2] = True  # the third query sees no key: its count is 0
    return u, W, b, padding, blocked


def test_the_adjoint_of_a_support_mean_is_an_einsum(tmp_path, monkeypatch):
    """Control: without the rewrite, the adjoint's sum is the masked broadcast product (both backends)."""
    modules = _modules(tmp_path, "support-mean")
    assert not MASKED_SUM.search(_sources(modules))
    assert 'einsum("bji,bjl->bil", chi' in _sources(modules)
    monkeypatch.setattr(bool_values, "_masked_contraction", lambda *arguments: None)
    (tmp_path / "plain").mkdir()
    plain = _modules(tmp_path / "plain", "support-mean")
    assert len(MASKED_SUM.findall(_sources(plain))) >= 2


@pytest.mark.parametrize("mode", ["derived", "autograd"])
def test_the_support_means_gradients_equal_autograd_through_the_formula(tmp_path, mode):
    """Padding, and a query that sees no key (its row of χ empty: the mean is 0 there, and no costate reaches the
    keys through it); float64, 1e-12."""
    _, torch_module = _modules(tmp_path, "support-mean")
    u, W, b, padding, blocked = _inputs()
    support = ~padding[:, None, :] & ~blocked
    block = torch_module.Block(5, 1, 4, dtype=torch.float64, backward=mode)
    with torch.no_grad():
        block.mix.W.copy_(W)
        block.mix.b.copy_(b)
    seed = torch.randn(u.shape, dtype=u.dtype, generator=torch.Generator().manual_seed(4))
    x, reference_x = u.clone().requires_grad_(), u.clone().requires_grad_()
    reference_W, reference_b = W.clone().requires_grad_(), b.clone().requires_grad_()
    out = block(x, key_padding_mask=padding, src_mask=blocked)
    expected = _reference(reference_x, reference_W, reference_b, support)
    assert torch.abs(out - expected).max() < 1e-12
    out.backward(seed)
    expected.backward(seed)
    assert torch.abs(x.grad - reference_x.grad).max() < 1e-12
    assert torch.abs(block.mix.W.grad - reference_W.grad).max() < 1e-12
    assert torch.abs(block.mix.b.grad - reference_b.grad).max() < 1e-12



def test_the_numpy_vjp_equals_autograd_through_the_formula(tmp_path):
    """Padding, and a sequence of padding alone (every row of χ empty); float64, 1e-12."""
    numpy_module, _ = _modules(tmp_path, "support-mean")
    u, W, b, padding, _ = _inputs()
    padding[2] = True
    seed = torch.randn(u.shape, dtype=u.dtype, generator=torch.Generator().manual_seed(4))
    x, reference_W = u.clone().requires_grad_(), W.clone().requires_grad_()
    expected = _reference(x, reference_W, b, ~padding[:, None, :].expand(-1, 7, -1))
    expected.backward(seed)
    out = numpy_module.forward(u.numpy(), {"mix.W": W.numpy(), "mix.b": b.numpy()}, key_padding_mask=padding.numpy())
    u_bar, grads = numpy_module.vjp(u.numpy(), {"mix.W": W.numpy(), "mix.b": b.numpy()}, seed.numpy(),
                                    key_padding_mask=padding.numpy())
    assert np.abs(out - expected.detach().numpy()).max() < 1e-12
    assert np.abs(u_bar - x.grad.numpy()).max() < 1e-12
    assert np.abs(grads["mix.W"] - reference_W.grad.numpy()).max() < 1e-12


def test_a_float32_row_of_no_key_has_finite_gradients(tmp_path):
    numpy_module, torch_module = _modules(tmp_path, "support-mean")
    u, W, b, padding, blocked = _inputs(torch.float32)
    padding[2] = True  # a whole sequence of padding
    block = torch_module.Block(5, 1, 4, dtype=torch.float32, backward="derived")
    x = u.clone().requires_grad_()
    block(x, key_padding_mask=padding, src_mask=blocked).sum().backward()
    assert x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(parameter.grad).all() for parameter in block.parameters())
    u_bar, _ = numpy_module.vjp(u.numpy(), {"mix.W": W.numpy(), "mix.b": b.numpy()}, np.ones(u.shape, np.float32),
                                key_padding_mask=padding.numpy())
    assert u_bar.dtype == np.float32 and np.isfinite(u_bar).all()


@pytest.mark.parametrize("kind, plugin", [("memory-mean", "support_mean.py"),
                                          ("scaled-support-mean", "parameter_sums.py")])
def test_other_means_over_a_support_take_the_einsum_too(tmp_path, kind, plugin):
    assert not MASKED_SUM.search(_sources(_modules(tmp_path, kind, plugin)))


@pytest.mark.parametrize("kind, plugin", [("mismatched-mean", "running_means.py"), ("two-hop-mean", "support_mean.py")])
def test_a_sum_whose_value_reads_its_mask_stays_masked(tmp_path, kind, plugin):
    """A count of another mask than the sum's (the value's counts read as 1 where that mask is 0, so the value reads
    the mask's axes), a count as the mask (a number besides the bools): the masked sum as it was (their values:
    ``test_bool_values``, ``test_support_factor``)."""
    assert MASKED_SUM.search(_sources(_modules(tmp_path, kind, plugin)))


def _gate_reference(u: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """One explicit step of key-gate-mean, ``u + ∫ χ(x̃, x) e^{u(x̃)} / ∫ χ(x̃, η) dη dx̃``: a query x̃ that sees no key
    adds nothing (its gate is not even computed here)."""
    counts = support.sum(-1).to(u.dtype)
    seen = counts[..., None] > 0
    gates = torch.where(seen, torch.exp(torch.where(seen, u, 0)) / torch.where(counts > 0, counts, 1)[..., None], 0)
    return u + torch.einsum("bji,bjl->bil", support.to(u.dtype), gates)


@pytest.mark.parametrize("einsum_anyway", [False, True], ids=["as-derived", "control"])
def test_a_value_read_through_an_exponential_keeps_the_masked_sum(tmp_path, monkeypatch, einsum_anyway):
    """A tester's high finding: ``e = exp(u)`` a definition, spread over the keys a query sees. A sequence of
    padding alone whose states are 90 (float32: ``e^{90} = ∞``) sees no key, so it adds nothing; taken as an
    einsum, ``0 · ∞`` was NaN in every output of that sequence (NumPy and torch). Control: with every array taken as
    finite, the einsum and its NaN come back."""
    if einsum_anyway:
        monkeypatch.setattr(bool_values, "_finite", lambda expr, finite: True)
    numpy_module, torch_module = _modules(tmp_path, "key-gate-mean")
    u = torch.randn(2, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[1] = True
    u[1] = 90.0
    expected = _gate_reference(u, ~padding[:, None, :].expand(-1, 5, -1))
    assert torch.isfinite(expected).all()
    with np.errstate(over="ignore", invalid="ignore"):
        got = numpy_module.forward(u.float().numpy(), {}, key_padding_mask=padding.numpy())
    with torch.no_grad():
        block = torch_module.Block(3, 1, 4, dtype=torch.float32)(u.float(), key_padding_mask=padding)
    for out in (torch.from_numpy(got), block):
        error = torch.abs(out.double() - expected).max() / expected.abs().max()
        assert bool(error < 1e-6) != einsum_anyway


@pytest.mark.parametrize("mode", ["derived", "autograd"])
def test_a_keys_count_read_by_a_query_divides_by_zero_as_the_formula_says(tmp_path, mode):
    """A tester's medium finding (there before): ``c(x̃)``, a count of the tokens key x̃ sees, read by a query
    that sees x̃, was taken for a count of the query's own support, so where x̃ sees no key (a ``src_mask`` row
    blocked, its column not) the quotient read its count as 1: finite values where the formula is ∞. The support of
    a count is now read at the indices the quotient reads it at."""
    _, torch_module = _modules(tmp_path, "key-share-mean")
    u = torch.arange(1.0, 9.0, dtype=torch.float64).view(1, 4, 2)
    blocked = torch.zeros(4, 4, dtype=torch.bool)
    blocked[2] = True  # query 2 sees no key; key 2 is seen by queries 0, 1 and 3
    support = (~blocked).double()
    shares = support.sum(-1) / 4
    terms = torch.where(support[None, :, :, None] > 0, u[:, None] / shares[None, None, :, None], 0)  # 0 off χ
    expected = u + terms.sum(2) / 4
    with torch.no_grad():
        out = torch_module.Block(2, 1, 4, dtype=torch.float64, backward=mode)(u, src_mask=blocked)
    assert torch.isinf(expected[0, [0, 1, 3]]).all() and torch.isfinite(expected[0, 2]).all()
    assert torch.equal(torch.isinf(out), torch.isinf(expected))
    assert torch.abs(out[0, 2] - expected[0, 2]).max() < 1e-12
