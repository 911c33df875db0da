"""The continuous model: domains, the rectangle rule, operators and their LaTeX."""

import sympy as sp

from splitformer.symbolic import load_scheme
from splitformer.symbolic.domains import E, FEATURES, HEAD_FEATURES, TOKENS, X, XI, Y
from splitformer.symbolic.equation import equation_latex, equation_terms
from splitformer.symbolic.operators import Attention, FeedForward, LayerNorm, apply
from splitformer.symbolic.activations import activation
from splitformer.symbolic.quadrature import Grid, integral
from splitformer.symbolic.domains import VARIABLES


def test_rectangle_rule_turns_an_integral_into_spacing_times_sum():
    grid = Grid(VARIABLES, {"u": sp.IndexedBase("U")})
    discrete = grid(integral(apply("u", X, XI), XI))
    assert discrete == FEATURES.spacing * sp.Sum(sp.IndexedBase("U")[X.index, XI.index], (XI.index, 0, FEATURES.size - 1))


def test_kernel_absorbs_the_spacing_of_its_integrated_variable():
    grid = Grid(VARIABLES, {"u": sp.IndexedBase("U"), "W": sp.IndexedBase("W")}, {"W": (XI.symbol,)})
    discrete = grid(integral(apply("W", XI, Y) * apply("u", X, XI), XI))
    # Δy Σ_k (W_kl / Δy) U_ik: the spacing cancels into the stored array
    assert not discrete.has(FEATURES.spacing)
    assert discrete.has(sp.IndexedBase("W")[XI.index, Y.index])


def test_domain_measure_is_size_times_spacing():
    grid = Grid(VARIABLES, {})
    assert grid(1 / FEATURES.measure) == 1 / (FEATURES.size * FEATURES.spacing)
    assert grid(TOKENS.measure) == TOKENS.size * TOKENS.spacing


def test_attention_is_a_nonlocal_integral_over_tokens_with_scaled_scores():
    definitions = {d.function: d for d in Attention("attn").definitions()}
    score = definitions["a"].rhs
    integrals = [factor for factor in sp.Mul.make_args(score) if isinstance(factor, sp.Integral)]
    assert len(integrals) == 1 and integrals[0].limits[0][0] == E.symbol
    assert score / integrals[0] == HEAD_FEATURES.measure ** sp.Rational(-1, 2)
    kernel = definitions["gamma"]
    assert kernel.absorbs and kernel.absorbs[0].domain is TOKENS


def test_operators_print_latex_that_names_their_controls():
    assert r"W^{Q}" in Attention("attn").latex()
    assert r"\int_{\Omega_{z}}" in FeedForward("ffn", activation("relu")).latex()
    assert r"\sqrt{\varepsilon + \beta(x)}" in LayerNorm("norm1").latex()
    assert Attention("attn")._repr_latex_().startswith("$")


def test_equation_of_post_ln_has_each_field_once_after_the_parallel_relaxation():
    scheme = load_scheme("post-ln")
    terms = {(term.operator, term.projection): term.coefficient for term in equation_terms(scheme)}
    # the feed-forward branch runs with twice its field in a branch of weight 1/2
    assert terms == {("attn", False): 1, ("norm1", True): 1, ("ffn", False): 1, ("norm2", True): 1}
    latex = equation_latex(scheme)
    assert latex.startswith("u_t = ") and r"\partial I_{S_1" in latex
    assert scheme._repr_latex_() == f"$\\displaystyle {latex}$"
