"""Sums over several indices nested by the factors' indices (``codegen.nested_sums``): equal to the flat sum at every
value, narrower, left as they are where nesting gains no axis; a plug-in's cubic adjoint becomes quadratic."""

import inspect
import re

import numpy as np
import pytest
import sympy as sp

from splitformer.codegen import adjoint, lowering
from splitformer.codegen import nested_sums as nested_sums_module
from splitformer.codegen.nested_sums import nested_sums, widest

from conftest import derived_plugin, plugin_scheme

I, J, N = (sp.Idx(name, (0, 3)) for name in "ijn")
L = sp.Idx("l", (0, 2))
P, W, WBAR, RATE, C = (sp.IndexedBase(name) for name in ("p", "w", "wbar", "lam", "c"))
CUBIC = 2 * RATE[L] * sp.Sum((P[I] - P[N]) * W[I, J, L] * W[I, N, L] * WBAR[I, J, L], (I, 0, 3), (J, 0, 3), (N, 0, 3))


def _values(expr, seed=0):
    """Each array ``expr`` reads as random numbers, written out by ``doit`` (SymPy sums the terms itself)."""
    rng = np.random.default_rng(seed)
    reads = sorted({read.base for read in expr.doit().atoms(sp.Indexed)}, key=str)
    tables = {base: rng.standard_normal((4, 4, 4)) for base in reads}
    return lambda e: float(e.doit().xreplace({read: sp.Float(tables[read.base][tuple(map(int, read.indices))
                                                                               + (0,) * (3 - len(read.indices))])
                                              for read in e.doit().atoms(sp.Indexed)}))


def test_the_cubic_adjoint_sum_is_two_quadratic_sums_with_the_same_value():
    nested = nested_sums(CUBIC)
    assert widest(CUBIC) == 4 and widest(nested) == 3
    inner = {frozenset(limit[0] for limit in total.limits) for total in nested.atoms(sp.Sum)}
    assert inner == {frozenset({I}), frozenset({J}), frozenset({N})}
    for l in range(3):
        value = _values(CUBIC)
        assert value(nested.subs(L, l)) == pytest.approx(value(CUBIC.subs(L, l)), rel=1e-12)
    # control: a nesting that sums a factor over an index it does not read is another number
    wrong = 2 * RATE[L] * sp.Sum(sp.Sum((P[I] - P[N]) * W[I, N, L], (N, 0, 3)) * sp.Sum(W[I, J, L], (J, 0, 3))
                                 * sp.Sum(WBAR[I, J, L], (J, 0, 3)), (I, 0, 3))
    value = _values(CUBIC)
    assert value(wrong.subs(L, 1)) != pytest.approx(value(CUBIC.subs(L, 1)), rel=1e-6)


@pytest.mark.parametrize("expr", [
    sp.Sum(W[I, J, L] * WBAR[I, J, L], (I, 0, 3), (J, 0, 3)),  # every factor reads every index
    sp.Sum(C[I] * W[I, J, L], (J, 0, 3)),  # a factor outside gains no axis: the sum spans (i, j, l) either way
    sp.Sum(C[I] * C[J], (I, 0, 3), (J, 0, 3)),  # inner sums with no axis left (a batched factor's is per entry)
    sp.Sum(C[I] * W[I, J, L], (I, 0, J), (J, 0, 3)),  # a bound reads another summed index
], ids=["all-read", "no-gain", "no-axis", "dependent-bound"])
def test_sums_that_nesting_does_not_narrow_stay_as_they_are(expr):
    assert nested_sums(expr) == expr


def test_a_factor_free_of_the_summed_index_leaves_a_sum_it_widens():
    flat = sp.Sum(RATE[L] * W[I, J, 0], (J, 0, 3))
    assert nested_sums(flat) == RATE[L] * sp.Sum(W[I, J, 0], (J, 0, 3))


def _widest_statement(source: str) -> int:
    """The most axes any einsum of ``source`` reads (its longest operand label), or any array a NumPy sum reduces."""
    specs = re.findall(r'_einsum\("([a-z,]+)->', source)
    return max(len(label) for spec in specs for label in spec.split(","))


def _derive(folder, kind="decay-mixer"):
    return derived_plugin(folder, "decay_mixer.py", plugin_scheme("decay-pre-ln", norm1="layer-norm", mix=kind))


@pytest.fixture(scope="module")
def derived(tmp_path_factory):
    return _derive(tmp_path_factory.mktemp("decay"))


def test_the_decay_rate_adjoint_is_quadratic_and_agrees_with_autograd(derived):
    source = inspect.getsource(derived.numpy_module())
    assert _widest_statement(source) == 4  # batch, feature and two token axes; before: a (b, l, i, j, n) product
    gradients = _gradients(derived, np.zeros((2, 7), bool), True)
    for auto, derived_gradient in zip(gradients["autograd"], gradients["derived"]):
        assert np.allclose(auto.numpy(), derived_gradient.numpy(), 1e-10, 1e-12)
    assert gradients["derived"][0].abs().max() > 0


def test_without_nesting_the_adjoint_is_cubic(derived, monkeypatch, tmp_path):
    """Control: the same scheme lowered with nesting switched off keeps the five-axis product."""
    monkeypatch.setattr(lowering, "nested_sums", lambda expr, masks: expr)
    monkeypatch.setattr(adjoint, "nested_sums", lambda expr, masks: expr)
    monkeypatch.setenv("SPLITFORMER_CACHE", "off")
    assert _widest_statement(_derive(tmp_path).source("numpy")) == 5


def _gradients(derived, padded, causal):
    """The input's and parameters' gradients of ⟨w, Block(u)⟩, float64, by autograd and by the derived backward."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    params = {name: rng.standard_normal([{"d": 6, "d_ff": 8}[axis] for axis in axes]) * 0.5
              for name, axes in derived.numpy_module().PARAMETERS.items()}
    u, weight = (torch.tensor(rng.standard_normal((2, 7, 6))) for _ in range(2))
    gradients = {}
    for backward in ("autograd", "derived"):
        block = derived.torch_module().Block(6, 2, 8, backward=backward).double().load_params(params)
        x = u.clone().requires_grad_()
        (block(x, key_padding_mask=torch.from_numpy(padded), causal=causal) * weight).sum().backward()
        gradients[backward] = [x.grad] + [p.grad for p in block.parameters()]
    return gradients


EMPTY_QUERIES = {"left padding, causal": (np.array([[False] * 7, [True, True] + [False] * 5]), True),
                 "a sequence all padding": (np.array([[False] * 7, [True] * 7]), False)}


@pytest.mark.parametrize("kind", ["uniform-plus-decay-mixer", "counted-decay-mixer"])  # the step inline, a definition
@pytest.mark.parametrize("case", EMPTY_QUERIES)
def test_a_query_that_sees_no_key_has_finite_gradients_equal_to_autograd(tmp_path, case, kind):
    gradients = _gradients(_derive(tmp_path, kind), *EMPTY_QUERIES[case])
    for auto, derived_gradient in zip(gradients["autograd"], gradients["derived"]):
        assert _finite(derived_gradient) and np.allclose(auto.numpy(), derived_gradient.numpy(), 1e-10, 1e-12)


@pytest.mark.parametrize("kind", ["uniform-plus-decay-mixer", "counted-decay-mixer"])
def test_control_the_step_nested_apart_from_its_normalizer_divides_zero_by_zero(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(nested_sums_module, "_glued", lambda factors, masks: factors)
    monkeypatch.setenv("SPLITFORMER_CACHE", "off")
    gradients = _gradients(_derive(tmp_path, kind), *EMPTY_QUERIES["a sequence all padding"])
    assert not all(_finite(gradient) for gradient in gradients["derived"])


def _finite(tensor) -> bool:
    """Every entry of ``tensor`` is finite."""
    return bool(np.isfinite(tensor.numpy()).all())
