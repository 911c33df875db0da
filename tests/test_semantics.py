"""The independent evaluator and the checks of a scheme's own derived and emitted program.

Negative controls: the mutations of the derivation that once survived ``splitformer check``
(score scale 1/N_e, fractions ignored, parallel weights replaced by 1/K) must now fail it
on user schemes.
"""

from dataclasses import dataclass, replace
from typing import ClassVar

import mpmath
import numpy as np
import pytest
import sympy as sp

from splitformer.codegen.verification.definitions import evaluate_definitions
from splitformer.codegen.verification.parameters import random_parameters
from splitformer.codegen.verification.scheme_checks import derived_check, emitted_check
from splitformer.codegen.verification.semantics import FLOAT, KNOWN_KINDS, MPMATH, Semantics, Sizes
from splitformer.symbolic import derive, load_scheme, parse_scheme
from splitformer.symbolic import derivation
from splitformer.symbolic.domains import FEATURES, HEAD_FEATURES, X, XI, Y
from splitformer.symbolic.kinds import OPERATOR_KINDS
from splitformer.symbolic.operators import Attention, Definition, Operator, Parameter, apply, register_operator
from splitformer.symbolic.quadrature import integral

from conftest import ROOT

SCHEMES = ROOT / "tests" / "schemes"
SIZES = Sizes(tokens=4, features=6, heads=2, hidden=5)


def _exact(params):
    return {name: np.frompyfunc(mpmath.mpf, 1, 1)(value) for name, value in params.items()}


@pytest.mark.parametrize("name", ["pre-ln", "paper-lie", str(SCHEMES / "swiglu.toml")])
def test_hand_semantics_agree_with_the_continuous_definitions(name):
    scheme = load_scheme(name)
    with mpmath.workdps(50):
        params = _exact(random_parameters(scheme, SIZES, 3))
        u = np.frompyfunc(mpmath.mpf, 1, 1)(np.random.default_rng(4).standard_normal((SIZES.tokens, SIZES.features)))
        support = np.tril(np.ones((SIZES.tokens, SIZES.tokens), dtype=int))
        semantics = Semantics(scheme, params, SIZES, MPMATH, support=support, eps=mpmath.mpf("1e-5"))
        for key, kind in scheme.operators.items():
            difference = KNOWN_KINDS[kind](semantics, key, u) - evaluate_definitions(semantics, key, u)
            assert max(abs(value) for value in difference.flat) < mpmath.mpf(10) ** -45, key


def test_token_spacing_cancels_and_a_wrong_spacing_rule_would_show():
    scheme = load_scheme("post-ln")
    params = random_parameters(scheme, SIZES, 5)
    u = np.random.default_rng(6).standard_normal((SIZES.tokens, SIZES.features))
    one = Semantics(scheme, params, SIZES, FLOAT, eps=1e-5).step(u)
    other = Semantics(scheme, params, replace(SIZES, token_spacing=0.37), FLOAT, eps=1e-5).step(u)
    assert np.abs(one - other).max() < 1e-13
    # negative control: dropping Δx from the mixing integral changes the block
    broken = Semantics(scheme, params, replace(SIZES, token_spacing=0.37), FLOAT, eps=1e-5)
    original = KNOWN_KINDS["attention"]
    try:
        KNOWN_KINDS["attention"] = lambda sem, key, v: original(sem, key, v) * 0.37 ** -1
        assert np.abs(broken.step(u) - one).max() > 1e-3
    finally:
        KNOWN_KINDS["attention"] = original


@pytest.mark.parametrize("file", ["strang.toml", "thirds.toml", "richardson.toml", "clash.toml",
                                  "swiglu.toml"])
def test_user_schemes_pass_their_own_checks(file):
    scheme = load_scheme(str(SCHEMES / file))
    program = derive(scheme)
    for check in (derived_check(scheme, program), emitted_check(scheme, program)):
        assert check.holds, (check.id, check.detail)


# -- mutations of the derivation ------------------------------------------------------------

def _score_scale_one_over_n(monkeypatch):
    original = Attention.definitions

    def mutated(self):
        measure = HEAD_FEATURES.measure
        scale = {measure ** sp.Rational(-1, 2): 1 / measure}
        return tuple(replace(d, rhs=d.rhs.xreplace(scale)) if d.function == "a" else d
                     for d in original(self))

    monkeypatch.setattr(Attention, "definitions", mutated)


def _fraction_ignored(monkeypatch):
    original = derivation._Deriver.substep
    monkeypatch.setattr(derivation._Deriver, "substep",
                        lambda self, step, state, evaluations: original(self, replace(step, fraction=sp.Integer(1)),
                                                                        state, evaluations))


def _weights_one_over_k(monkeypatch):
    original = derivation._Deriver.parallel

    def mutated(self, step, state, evaluations):
        count = len(step.branches)
        return original(self, replace(step, weights=(sp.Rational(1, count),) * count), state, evaluations)

    monkeypatch.setattr(derivation._Deriver, "parallel", mutated)


@pytest.mark.parametrize("mutation, file", [
    (_score_scale_one_over_n, "strang.toml"),
    (_fraction_ignored, "thirds.toml"),
    (_fraction_ignored, "strang.toml"),
    (_weights_one_over_k, "richardson.toml"),
])
def test_mutated_derivations_fail_the_user_schemes_checks(monkeypatch, mutation, file):
    scheme = load_scheme(str(SCHEMES / file))
    mutation(monkeypatch)
    program = derive(scheme)
    emitted = emitted_check(scheme, program)
    assert not emitted.holds and "max |emitted − evaluator|" in emitted.detail


# -- operator kinds the evaluator does not know ---------------------------------------------

@dataclass(frozen=True)
class _Mixer(Operator):
    """A user kind: ``tanh(∫ W(ξ, y) u(x, ξ) dξ)``."""

    kind: ClassVar[str] = "test-tanh-mixer"
    symbol: ClassVar[str] = r"\mathcal{M}"

    def parameters(self):
        return (Parameter("W", "W", "W", (XI, Y), (FEATURES, FEATURES), (XI,)),)

    def definitions(self):
        w = apply("W", XI, Y)
        return (Definition("out", r"\mathcal{M}", (X, Y), sp.tanh(integral(w * apply("u", X, XI), XI)), "mixer"),)


def test_a_user_kind_is_evaluated_from_its_continuous_definitions():
    if _Mixer.kind not in OPERATOR_KINDS:
        register_operator(_Mixer)
    scheme = parse_scheme('name = "mixing"\nsummary = "s"\n[operators]\nmix = "test-tanh-mixer"\n'
                          '[[steps]]\noperator = "mix"\nsolver = "explicit"\nfraction = "1/2"\n')
    check = emitted_check(scheme, derive(scheme))
    assert check.holds, check.detail
    assert "test-tanh-mixer evaluated from their continuous definitions" in check.detail


def test_a_user_file_named_like_a_builtin_is_checked_as_itself(tmp_path):
    from splitformer.codegen.verification.runner import scheme_checks

    path = tmp_path / "macaron.toml"
    path.write_text('name = "macaron"\nsummary = "not the built-in"\n[operators]\nattn = "attention"\n'
                    'ffn = "feed-forward"\n[[steps]]\noperator = "attn"\nsolver = "explicit"\n'
                    '[[steps]]\noperator = "ffn"\nsolver = "explicit"\n')
    report = scheme_checks(load_scheme(str(path)))
    ids = {check.id for check in report.checks}
    assert "semantics/macaron/emitted" in ids and "recovery/macaron/numeric" not in ids
    assert report.holds


def test_gelu_tanh_and_pi_in_the_evaluator():
    """GPT-2's activation (it holds √(2/π)), by hand and from the continuous definitions."""
    scheme = load_scheme("pre-ln").with_activation("gelu-tanh")
    with mpmath.workdps(50):
        params = _exact(random_parameters(scheme, SIZES, 8))
        u = np.frompyfunc(mpmath.mpf, 1, 1)(np.random.default_rng(9).standard_normal((SIZES.tokens, SIZES.features)))
        semantics = Semantics(scheme, params, SIZES, MPMATH, eps=mpmath.mpf("1e-5"))
        difference = KNOWN_KINDS["feed-forward"](semantics, "ffn", u) - evaluate_definitions(semantics, "ffn", u)
        assert max(abs(value) for value in difference.flat) < mpmath.mpf(10) ** -45
        # negative control: GELU's exact form differs from the tanh approximation by ~1e-4
        exact = Semantics(scheme.with_activation("gelu"), params, SIZES, MPMATH, eps=mpmath.mpf("1e-5"))
        gap = KNOWN_KINDS["feed-forward"](exact, "ffn", u) - KNOWN_KINDS["feed-forward"](semantics, "ffn", u)
        assert max(abs(value) for value in gap.flat) > 1e-6
