"""The derived projections: KKT conditions, closed forms, minimality (numbers in plain NumPy)."""

import numpy as np
import pytest
import sympy as sp

from splitformer.symbolic.constraints import U, ConstraintSet, Moment
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.projections import SYMBOLS as S, derive_layer_norm_projection, derive_projection, derive_relu_projection


def _project(formula, v, sigma_1, sigma_2, eps=0.0):
    f = sp.lambdify((S.v, S.alpha, S.beta, S.sigma_1, S.sigma_2, S.epsilon), formula, "numpy")
    return f(v, v.mean(), v.var(), sigma_1, sigma_2, eps)


def test_theorem_3_1_closed_form_is_what_the_derivation_yields():
    projection = derive_layer_norm_projection()
    closed_form = S.sigma_1 + S.sigma_2 * (S.v - S.alpha) / sp.sqrt(S.beta)
    assert sp.simplify(projection.theorem - closed_form) == 0
    with_eps = S.sigma_1 + S.sigma_2 * (S.v - S.alpha) / sp.sqrt(S.beta + S.epsilon)
    assert sp.simplify(projection.formula - with_eps) == 0


def test_distance_of_the_minimizer_matches_the_paper():
    distance = derive_layer_norm_projection().distance
    expected = S.size * ((S.sigma_2 - sp.sqrt(S.beta)) ** 2 + (S.sigma_1 - S.alpha) ** 2)
    assert sp.expand(distance - expected) == 0


@pytest.mark.parametrize("seed", range(5))
def test_projection_onto_s1_satisfies_kkt_and_beats_every_feasible_point(seed):
    rng = np.random.default_rng(seed)
    n = 7
    v = rng.normal(size=n) * 2 + 1
    sigma_1, sigma_2 = rng.normal(), abs(rng.normal()) + 0.1
    u = _project(derive_layer_norm_projection().theorem, v, sigma_1, sigma_2)
    assert u.mean() == pytest.approx(sigma_1, abs=1e-12)
    assert u.var() == pytest.approx(sigma_2**2, rel=1e-12)
    # stationarity: u − v + λ/N·1 + 2μ/N·(u − σ_1) = 0 for some multipliers λ, μ
    basis = np.stack([np.ones(n) / n, 2 * (u - sigma_1) / n], axis=1)
    multipliers, *_ = np.linalg.lstsq(basis, v - u, rcond=None)
    assert np.abs(basis @ multipliers - (v - u)).max() < 1e-12
    # minimality against random points of S_1
    best = np.sum((u - v) ** 2)
    for _ in range(200):
        w = rng.normal(size=n)
        w = sigma_1 + sigma_2 * (w - w.mean()) / w.std()
        assert np.sum((w - v) ** 2) >= best - 1e-12


def test_layer_norm_with_eps_is_the_augmented_sphere_projection():
    rng = np.random.default_rng(0)
    n, eps = 6, 0.3
    v = rng.normal(size=n)
    derived = _project(derive_layer_norm_projection().formula, v, 0.0, 1.0, eps)
    augmented = np.append(v - v.mean(), np.sqrt(n * eps))
    on_sphere = augmented * np.sqrt(n) / np.linalg.norm(augmented)
    np.testing.assert_allclose(derived, on_sphere[:n], rtol=0, atol=1e-14)
    reference = (v - v.mean()) / np.sqrt(v.var() + eps)
    np.testing.assert_allclose(derived, reference, rtol=0, atol=1e-14)


def test_projection_steps_render_as_latex():
    for description, latex in derive_layer_norm_projection().steps + derive_relu_projection().steps:
        assert description and latex and "\\" in latex


@pytest.mark.parametrize("value", [-2.5, -1e-9, 0.0, 1e-9, 3.0])
def test_relu_is_the_projection_onto_the_nonnegative_cone(value):
    formula = derive_relu_projection().formula
    u = float(formula.subs(S.v, value))
    multiplier = u - value  # stationarity: u = v + λ
    assert u >= 0 and multiplier >= 0 and u * multiplier == 0
    assert formula == sp.Max(S.v, 0)


def test_feature_means_refuse_what_the_statistics_cannot_express():
    """Means of polynomials of degree ≤ 2 only, and only in moments the statistics determine."""
    from splitformer.symbolic.constraints import SYMBOLS, ConstraintSet, Statistic
    from splitformer.symbolic.errors import SplitformerError
    from splitformer.symbolic.projections import feature_mean

    s = SYMBOLS
    second = ConstraintSet("S", "S", statistics=(Statistic("beta", s.beta, r"\beta", s.v**2, "mean square"),))
    assert feature_mean(second, s.v**2 + 1) == s.beta + 1
    with pytest.raises(SplitformerError, match="do not express the mean of v"):
        feature_mean(second, s.v)  # the mean of v is not among the statistics
    with pytest.raises(SplitformerError, match="degree 3"):
        feature_mean(second, s.v**3)


def test_a_constraint_whose_stationarity_is_not_affine_in_v_is_refused():
    """``mean e^u = 1``: one stationary point, ``u = v − W(λ e^v)``, not affine in ``v``; and ``mean u³ = 1``: two."""
    for name, moment in (("exponential", Moment(sp.exp(U), 1)), ("cubic", Moment(U**3, 1))):
        with pytest.raises(SplitformerError, match="does not make u one affine map of v"):
            derive_projection(ConstraintSet(name, "", moments=(moment,)))
