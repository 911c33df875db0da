"""Quotients by ``1 + e^{s}`` are emitted as logistic functions (``codegen.logistic``): a plug-in's sigmoid gate
``σ(z) = 1/(1 + e^{−z})`` has the derivative ``e^{−z}/(1 + e^{−z})²`` as SymPy writes it, ``∞/∞`` (NaN) where ``e^{−z}``
overflows (z below −709 in float64) though the derivative is 0 there; autograd through the formula as written was NaN
too. A tester's sigmoid attention at scores of −1135 had NaN gradients in ``vjp``, ``backward="derived"`` and
``backward="autograd"``."""

import numpy as np
import pytest
import sympy as sp

from splitformer.codegen.ir import Sigmoid
from splitformer.codegen.logistic import with_sigmoids

from conftest import derived_plugin
from test_multi_axis_sums import _SCHEME, D, _inputs, assert_numpy_matches, assert_torch_matches

S = sp.Symbol("s", real=True)


def _as_formulas(expr):
    return expr.replace(lambda node: isinstance(node, Sigmoid), lambda node: Sigmoid.formula(node.args[0]))


@pytest.mark.parametrize("s", [S, -S, sp.Symbol("a", real=True) + 2 * sp.Symbol("b", real=True)], ids=["s", "minus-s", "a-sum"])
@pytest.mark.parametrize("p, q", [(0, 1), (0, 3), (1, 1), (1, 2), (2, 3), (sp.Rational(1, 2), 1)])
def test_the_rewrite_is_an_identity(p, q, s):
    """With ``s`` a sum too (a summed temporary plus a bias, as lowered formulas nearly always are): SymPy writes
    ``e^{2(a + 2b)}`` as ``e^{2a + 4b}`` and left it unpaired (a reviewer's finding: ``e^{2s} σ(−s)³``, ∞ · 0)."""
    written = sp.exp(p * s) / (1 + sp.exp(s)) ** q
    rewritten = with_sigmoids(written)
    outside = rewritten.replace(lambda node: isinstance(node, Sigmoid), lambda node: sp.Integer(1))
    assert rewritten.has(Sigmoid) and not sp.sympify(outside).has(sp.exp)
    assert sp.simplify(_as_formulas(rewritten) - written) == 0


def test_the_sigmoids_derivative_stays_finite():
    z = sp.Symbol("z", real=True)
    derivative = sp.diff(1 / (1 + sp.exp(-z)), z)
    value = -800.0
    with np.errstate(over="ignore", invalid="ignore"):
        as_written = sp.lambdify(z, derivative, "numpy")(np.float64(value))
    assert np.isnan(as_written)  # the control: the formula as SymPy writes it
    rewritten = with_sigmoids(derivative)
    stable = sp.lambdify(z, _as_formulas(rewritten).replace(sp.exp, lambda x: sp.Function("E")(x)),
                         [{"E": lambda x: np.exp(x)}, "numpy"])
    with np.errstate(over="ignore"):
        assert stable(np.float64(value)) == 0.0
        assert stable(np.float64(0.5)) == pytest.approx(float(derivative.subs(z, 0.5)), rel=1e-15)


@pytest.fixture(scope="module")
def derivation(tmp_path_factory):
    return derived_plugin(tmp_path_factory.mktemp("gated"), "sum_gate.py", _SCHEME.format(kind="head-gate"))


def _saturated(seed):
    """The gate's inputs with pre-activations of −1000 and beyond (b_g) beside ordinary ones."""
    return _inputs(seed, gate_bias=np.where(np.arange(D) % 2, -1000.0, 0.5))


def test_numpy_vjp_of_a_saturated_gate(derivation):
    assert_numpy_matches(derivation.numpy_module(), *_saturated(0))


@pytest.mark.parametrize("backward", ["derived", "autograd"])
def test_torch_gradients_of_a_saturated_gate(derivation, backward):
    assert_torch_matches(derivation.torch_module(), backward, *_saturated(1))


def test_a_merged_exponential_is_paired_and_its_rest_kept():
    """SymPy merges ``e^{2s} e^{c}`` into ``e^{2s + c}``: the rewrite takes ``e^{2s}`` from it, keeps ``e^{c}`` (a
    reviewer's finding: left unpaired, ``e^{2s + c} σ(−s)³`` is ∞ · 0 at large s)."""
    a, b, c = sp.symbols("a b c", real=True)
    s = a + 2 * b
    written = sp.exp(2 * s + c) / (1 + sp.exp(s)) ** 3
    rewritten = with_sigmoids(written)
    assert rewritten == Sigmoid(s) ** 2 * Sigmoid(-s) * sp.exp(c)
    assert sp.simplify(_as_formulas(rewritten) - written) == 0
    assert with_sigmoids(sp.exp(2 * a + c) / (1 + sp.exp(s)) ** 3).has(sp.exp(2 * a + c))  # no multiple of s: kept


def test_the_guides_sigmoid_attention_has_finite_autograd_gradients_at_saturated_scores(tmp_path):
    """A tester's finding: the guide's sigmoid attention, ``χ σ(a) / ∫ χ dη``, kept ``1/(1 + e^{−a})`` (its denominator
    read as ``Where(χ, 1 + e^{−a}, 1)`` for the empty support, which hid it from the rewrite), so torch's autograd (the
    Block's default) was NaN for scores below −88 in float32 and −709 in float64; ``backward="derived"`` was finite.
    The plug-in is the guide's own block, derived by the CLI; control: the emitted kernel is the sigmoid's."""
    import subprocess
    import sys

    import torch

    from conftest import ROOT, import_path
    from test_docs import blocks

    source, = [block.text for block in blocks(ROOT / "docs" / "guide" / "plugins.md")
               if block.title == "sigmoid_attention.py"]
    (tmp_path / "sigmoid_attention.py").write_text(source, encoding="utf-8")
    shown = subprocess.run([sys.executable, "-m", "splitformer", "show", "pre-ln", "--format", "toml"],
                           capture_output=True, text=True, check=True).stdout
    (tmp_path / "sigmoid-pre-ln.toml").write_text(
        shown.replace('"attention"', '"sigmoid-attention"').replace('name = "pre-ln"', 'name = "sigmoid-pre-ln"'),
        encoding="utf-8")
    subprocess.run([sys.executable, "-m", "splitformer", "derive", "--load", "sigmoid_attention.py",
                    "sigmoid-pre-ln.toml", "--out", "build", "--backend", "torch"], cwd=tmp_path, check=True,
                   capture_output=True)
    path = tmp_path / "build" / "torch" / "sigmoid_pre_ln.py"
    assert "torch.sigmoid(attn_a)" in path.read_text(encoding="utf-8")
    module = import_path(path)
    rng = np.random.default_rng(5)
    for dtype, scale in ((torch.float32, 40.0), (torch.float64, 200.0)):
        params = {name: rng.standard_normal([{"d": 8, "d_ff": 16}[axis] for axis in shape])
                  for name, shape in module.PARAMETERS.items()}
        params["attn.W_q"] *= scale
        params["attn.W_k"] *= scale
        u = torch.tensor(rng.standard_normal((2, 6, 8)), dtype=dtype)
        gradients = {}
        for backward in ("autograd", "derived"):
            block = module.Block(8, 2, 16, dtype=dtype, backward=backward).load_params(params)
            x = u.clone().requires_grad_()
            block(x).sum().backward()
            gradients[backward] = [x.grad, *(p.grad for p in block.parameters())]
            assert all(torch.isfinite(grad).all() for grad in gradients[backward]), (dtype, backward)
        tolerance = 1e-3 if dtype == torch.float32 else 1e-10
        for got, expected in zip(gradients["autograd"], gradients["derived"]):
            assert (got - expected).abs().max() <= tolerance * max(1.0, expected.abs().max())
