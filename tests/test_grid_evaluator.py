"""The float64 evaluator of continuous definitions evaluates every grid point at once (``definitions._Grid``). It must
give what the point-by-point evaluator gives (``_Point``, the same rules one point at a time), and what the hand
semantics of the built-in kinds give, masks with a query that sees no key included."""

import numpy as np
import pytest

import splitformer
from splitformer.codegen.verification import definitions
from splitformer.codegen.verification.definitions import evaluate_definitions, unsupported
from splitformer.codegen.verification.parameters import random_parameters
from splitformer.codegen.verification.semantics import FLOAT, KNOWN_KINDS, Semantics, Sizes
from splitformer.symbolic import load_scheme, parse_scheme
from splitformer.symbolic.builtins import builtin_names

from conftest import ROOT

SIZES = Sizes(tokens=5, features=6, heads=2, hidden=4)
PLUGINS = ("alibi", "support_mean", "token_pool", "my_kinds", "head_linear", "running_means")
for _name in PLUGINS:
    splitformer.load_plugin(ROOT / "tests" / "plugins" / f"{_name}.py")


def _supports():
    """No mask, causal, and causal with the first query seeing no key (padding of key 0)."""
    causal = np.tril(np.ones((SIZES.tokens, SIZES.tokens), dtype=int))
    empty = causal.copy()
    empty[:, 0] = 0
    return [None, causal, empty]


def _point_by_point(sem, key, u):
    """What ``evaluate_definitions`` gives in the exact arithmetics, in float64: one point at a time."""
    operator = sem.operator(key)
    tables = {}
    with np.errstate(all="ignore"):
        definitions.by_points(definitions._Point(sem, operator, operator.parameters(), u, tables),
                              operator.definitions(), u.dtype)
    return tables[operator.definitions()[-1].function]


def _one_step(kind: str, options: str = "") -> object:
    return parse_scheme(f'name = "s"\nsummary = "s"\n[operators]\nf = {{ kind = "{kind}"{options} }}\n'
                        '[[steps]]\noperator = "f"\nsolver = "explicit"\n')


_PLUGIN_KINDS = [("alibi-attention", ""), ("alibi-attention", ", symmetric = false"), ("support-mean", ""),
                 ("support-sum", ""), ("two-hop-mean", ""), ("token-pool", ""), ("token-ratio", ""),
                 ("token-ratio-own-variable", ""), ("feature-pool", ""), ("affine-field", ""),
                 ("scaled-field", ", scale = 2"), ("head-linear", ""), ("strict-running-mean", ""),
                 ("half-running-mean", ""), ("inclusive-running-mean", ""), ("step-count", ""), ("third-count", ""),
                 ("token-mean", "")]


@pytest.mark.parametrize("kind, options", _PLUGIN_KINDS)
def test_the_grid_evaluator_equals_the_point_evaluator_on_the_plugins(kind, options):
    scheme = _one_step(kind, options)
    params = random_parameters(scheme, SIZES, 1)
    u = np.random.default_rng(2).standard_normal((SIZES.tokens, SIZES.features))
    for support in _supports():
        sem = Semantics(scheme, params, SIZES, FLOAT, support=support, eps=1e-5)
        grid, point = evaluate_definitions(sem, "f", u), _point_by_point(sem, "f", u)
        assert grid.shape == point.shape == u.shape
        assert np.array_equal(np.isnan(grid), np.isnan(point)), (kind, support)
        finite = ~np.isnan(point)
        assert np.abs(grid[finite] - point[finite]).max() <= 1e-13 * max(1.0, np.abs(point[finite]).max()), kind


def _builtin_fields():
    found = {}
    for name in builtin_names():
        scheme = load_scheme(name)
        for key, operator in scheme.instantiate().items():
            if operator.kind in KNOWN_KINDS and not operator.is_projection and unsupported(operator) is None:
                found.setdefault(operator.kind, (name, key))
    return sorted(found.values())


@pytest.mark.parametrize("name, key", _builtin_fields())
def test_the_grid_evaluator_equals_the_hand_semantics_of_the_builtin_kinds(name, key):
    scheme = load_scheme(name)
    params = random_parameters(scheme, SIZES, 3)
    u = np.random.default_rng(4).standard_normal((SIZES.tokens, SIZES.features))
    for support in _supports()[:2]:
        sem = Semantics(scheme, params, SIZES, FLOAT, support=support, eps=1e-5)
        hand = KNOWN_KINDS[scheme.operators[key]](sem, key, u)
        assert np.abs(evaluate_definitions(sem, key, u) - hand).max() <= 1e-13 * max(1.0, np.abs(hand).max()), key


def _differs_from_the_points(kind: str, support) -> bool:
    scheme = _one_step(kind)
    params = random_parameters(scheme, SIZES, 1)
    u = np.random.default_rng(2).standard_normal((SIZES.tokens, SIZES.features))
    sem = Semantics(scheme, params, SIZES, FLOAT, support=support, eps=1e-5)
    with np.errstate(all="ignore"):
        return not np.allclose(evaluate_definitions(sem, "f", u), _point_by_point(sem, "f", u), rtol=0, atol=1e-6)


def test_a_wrong_grid_rule_shows(monkeypatch):
    """Negative controls, one per rule of the grid: a product without its exact-0 rule (a query that sees no key),
    coordinates at twice their grid points (ALiBi's positions), an integral that misses its first grid point."""
    empty = _supports()[2]
    assert not any(_differs_from_the_points(kind, empty) for kind in ("support-mean", "alibi-attention", "token-pool"))
    with monkeypatch.context() as patch:
        patch.setattr(definitions._Grid, "product", lambda self, factors, env: np.prod(
            np.broadcast_arrays(*(self.value(factor, env) for factor in factors)), axis=0))
        assert _differs_from_the_points("support-mean", empty)
    with monkeypatch.context() as patch:
        patch.setattr(definitions._Grid, "number_at", lambda self, index: 2.0 * index)
        assert _differs_from_the_points("alibi-attention", None)
    original = definitions._Grid.integral

    def first_point_missed(self, body, limits, env):
        axis = definitions._AXES[limits[-1][0]]
        return original(self, body, limits, env) - self.spacings[definitions.VARIABLES[limits[-1][0]].domain] * \
            np.take(self.value(body, {**env, limits[-1][0]: self.indices(limits[-1][0])}), [0], axis=axis)

    with monkeypatch.context() as patch:
        patch.setattr(definitions._Grid, "integral", first_point_missed)
        assert _differs_from_the_points("token-pool", None)
