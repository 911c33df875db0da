"""A sum of the count rule's form, ``Σ_k Where(m, v, 0)`` with ``v`` finite and its counts safe, emitted as the
contraction ``Σ_k m v`` (the ``masked-sums`` pass, ``codegen/passes/masked_sums.py``): support-mean's derived adjoint
``Σ_j χ[j, i] m̄[j, l] / Σ_n χ[j, n]`` was a (b, j, i, l) product then a sum (torch, N = 1024, d = 64, float64: 386 ms
for a training step's forward and backward, autograd 7.5; now 8, each in a process of its own), now one einsum. Its
values against torch's autograd through a reference written here from the kind's formula, rows of no key included;
the sums whose value is no such product keep their masked form."""

import importlib
import inspect
import re

import numpy as np
import pytest
import sympy as sp
import torch

import splitformer
from splitformer.codegen.ir import Contraction, Elementwise, Module, Numbers, Reduction, TensorInfo, Where


from conftest import derived_plugin, plugin_scheme

masked_sums = importlib.import_module("splitformer.codegen.passes.masked_sums")  # the module (its function shadows it)

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
    monkeypatch.setattr(masked_sums, "_contraction", lambda *arguments: None)
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
    """One explicit step of key-gate-mean, ``u + ∫ χ(x̃, x) e^{u(x̃)} / ∫ χ(x̃, η) dη dx̃``, each term 0 where its χ is
    (the evaluators' rule: a factor exactly 0 makes the product 0, whatever the gate is)."""
    counts = support.sum(-1).to(u.dtype)
    gates = torch.exp(u) / torch.where(counts > 0, counts, 1)[..., None]
    terms = torch.where(support[..., None] > 0, gates[:, :, None], 0)  # (b, x̃, x, y)
    return u + terms.sum(1)


@pytest.mark.parametrize("einsum_anyway", [False, True], ids=["as-derived", "control"])
def test_a_value_read_through_an_exponential_keeps_the_masked_sum(tmp_path, monkeypatch, einsum_anyway):
    """A tester's high finding: ``e = exp(u)`` a definition, spread over the keys a query sees. Where a query's gate
    overflows (state 710 in float64: ``e^{710} = ∞``), the outputs of the keys it sees are ∞ and those of the keys it
    does not see (padding) are their states; taken as an einsum, ``0 · ∞`` made the latter NaN. Control: with every
    value taken as finite, the einsum and its NaN come back."""
    if einsum_anyway:
        monkeypatch.setattr(masked_sums, "_finite", lambda expr, finite: True)
    numpy_module, torch_module = _modules(tmp_path, "key-gate-mean")
    u = torch.randn(2, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[0, 3:] = True
    u[0, 1] = 710.0
    expected = _gate_reference(u, ~padding[:, None, :].expand(-1, 5, -1))
    assert torch.isinf(expected[0, :3]).all() and torch.isfinite(expected[0, 3:]).all()
    with np.errstate(over="ignore", invalid="ignore"):
        got = numpy_module.forward(u.numpy(), {}, key_padding_mask=padding.numpy())
    with torch.no_grad():
        block = torch_module.Block(3, 1, 4, dtype=torch.float64)(u, key_padding_mask=padding)
    for out in (torch.from_numpy(got), block):
        exact = torch.equal(torch.isinf(out), torch.isinf(expected)) and not torch.isnan(out).any() and bool(
            torch.abs(out - expected)[torch.isfinite(expected)].max() < 1e-12)
        assert exact != einsum_anyway


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


# --- the pass on modules written here: what it takes as finite, names, switches ---------------------------------

I, J, N = (sp.Idx(name, (0, 3)) for name in "ijn")
L = sp.Idx("l", (0, 2))


def _read(name, *indices):
    return sp.IndexedBase(name)[indices]


@pytest.mark.parametrize("expr, finite", [
    (_read("u0", I, L), True), (_read("w", I), False), (sp.Integer(3), True), (sp.nan, False), (I + 1, True),
    (sp.exp(_read("u0", I, L)), False), (sp.tanh(_read("u0", I, L)), True), (sp.tanh(sp.exp(_read("u0", I, L))), False),
    (_read("u0", I, L) ** 3, True), (1 / _read("u0", I, L), False), (sp.sqrt(_read("u0", I, L)), False),
    (sp.log(_read("u0", I, L)), False), (_read("u0", I, L) / Where(_read("c", J), _read("c", J), 1), True),
    (_read("u0", I, L) / Where(_read("chi", I, J), _read("c", J), 1), False),
    (Where(_read("chi", I, J), _read("u0", I, L), 0), True), (Where(_read("chi", I, J), sp.exp(_read("u0", I, L)), 0), False),
    (Numbers(_read("chi", I, J), sp.Symbol("u0")), True), (sp.Max(_read("u0", I, L), 0) + _read("u0", I, L), True)])
def test_finite_takes_what_cannot_overflow_from_finite_arrays(expr, finite):
    assert masked_sums._finite(expr, {"u0", "chi", "c"}) is finite


def _module(g_written: bool, taken_name: str | None = None, mean: bool = False) -> Module:
    """``out[i, l] = Σ_j Where(χ[j, i], g[l] u0[j, l] / Where(c[j], c[j], 1), 0)``, c the count of χ's rows, g a
    parameter given, or computed (``exp(a)``) where ``g_written``; ``taken_name``, an array of that name beside."""
    tensors = {"u0": TensorInfo("u0", "input", ("b", "i", "l")), "chi": TensorInfo("chi", "support", ("b", "i", "j")),
               "g": TensorInfo("g", "param", ("l",)), "a": TensorInfo("a", "param", ("l",))}
    ops = [Elementwise("g", ("l",), expr=sp.exp(_read("a", L)))] if g_written else []
    ops.append(Reduction("c", ("b", "j"), body=Numbers(_read("chi", J, N), sp.Symbol("u0")), body_labels=("b", "j", "n"),
                         axis="n", mean=False))
    if taken_name:
        ops.append(Elementwise(taken_name, ("b", "i", "l"), expr=2 * _read("u0", I, L)))
    value = _read("g", L) * _read("u0", J, L) / Where(_read("c", J), _read("c", J), 1)
    ops.append(Reduction("out", ("b", "i", "l"), body=Where(_read("chi", J, I), value, 0), body_labels=("b", "j", "i", "l"),
                         axis="j", mean=mean))
    return Module("probe", tensors, ops, "out")


def test_the_pass_takes_a_given_parameter_not_one_computed_from_parameters():
    """A reviewer's finding: ``g = exp(a)`` computed from parameters alone has the parameters' role; it was taken as
    given (finite), so its exponential reached the einsum."""
    given = masked_sums.masked_sums(_module(g_written=False))
    assert isinstance(given.ops[-1], Contraction) and given.ops[-1].out == "out"
    (value,) = [op for op in given.ops if op.out == "out_value"]
    assert value.expr == Where(_read("c", J), _read("g", L) * _read("u0", J, L) / Where(_read("c", J), _read("c", J), 1), 0)
    computed = masked_sums.masked_sums(_module(g_written=True))
    assert isinstance(computed.ops[-1], Reduction)


def test_the_pass_names_its_temporaries_apart_from_the_modules_arrays():
    """A reviewer's finding: a definition named ``out_value`` beside the sum ``out`` was written twice."""
    module = masked_sums.masked_sums(_module(g_written=False, taken_name="out_value"))
    names = [name for op in module.ops for name in op.writes()]
    assert len(names) == len(set(names)) and "out_value2" in names


def test_a_mean_keeps_its_reduction():
    module = masked_sums.masked_sums(_module(g_written=False, mean=True))
    assert isinstance(module.ops[-1], Reduction)


def test_the_pass_can_be_switched_off(tmp_path):
    """``--passes`` without ``masked-sums``: the sum as written, the same values."""
    from splitformer.codegen.passes import DEFAULT, select

    passes = tuple(rewrite for rewrite in DEFAULT if rewrite is not select("masked-sums")[0])
    derivation = derived_plugin(tmp_path, "support_mean.py", plugin_scheme("s-support-mean", mix="support-mean"))
    off = splitformer.derive(str(tmp_path / "support_mean.toml"), passes=passes)
    assert MASKED_SUM.search(inspect.getsource(off.numpy_module())) and not MASKED_SUM.search(
        inspect.getsource(derivation.numpy_module()))
    u, W, b, padding, _ = _inputs()
    arguments = (u.numpy(), {"mix.W": W.numpy(), "mix.b": b.numpy()}, np.ones(u.shape))
    assert np.abs(off.numpy_module().vjp(*arguments, key_padding_mask=padding.numpy())[0]
                  - derivation.numpy_module().vjp(*arguments, key_padding_mask=padding.numpy())[0]).max() < 1e-12
