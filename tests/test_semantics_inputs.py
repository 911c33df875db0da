"""Rotary attention and cross-attention in the independent evaluator, each with negative controls.

The evaluator's rotary attention turns each pair of a head as a point of the plane by
``p(x) θ^{-2r/d_h}`` and reads key/value head ``⌊h/n_rep⌋``; its cross-attention mixes a
memory held fixed over the step within the memory's own support. The derived and emitted
programs of a user scheme with both must agree with it, and mutations of the derivation
(rotation sign, θ, the memory support) and of the emitted code (θ's exponent, the memory
padding mask) must make the checks fail.
"""

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import pytest
import sympy as sp
from sympy.core.function import AppliedUndef

from splitformer.codegen.lowering import lower
from splitformer.codegen.render import render_module
from splitformer.codegen.verification.scheme_checks import SKIPPED, derived_check, emitted_check, scheme_checks
from splitformer.codegen.verification.semantics import FLOAT, Semantics, Sizes, unevaluable
from splitformer.symbolic import derive, load_scheme, parse_scheme
from splitformer.symbolic import rotary_attention
from splitformer.symbolic.cross_attention import MEMORY_SUPPORT, CrossAttention
from splitformer.symbolic.inputs import POSITIONS, Constant
from splitformer.symbolic.kinds import OPERATOR_KINDS
from splitformer.symbolic.operators import Operator, register_operator
from splitformer.symbolic.rotary_attention import ROPE_THETA, RotaryAttention
from splitformer.symbolic.stack import final_norm_scheme

from conftest import ROOT

ROTARY_CROSS = str(ROOT / "tests" / "schemes" / "rotary-cross.toml")


@pytest.fixture(scope="module")
def scheme():
    return load_scheme(ROTARY_CROSS)


def test_a_user_scheme_with_rotary_and_cross_attention_passes_its_own_checks(scheme):
    assert unevaluable(scheme) == {}
    program = derive(scheme)
    for check in (derived_check(scheme, program), emitted_check(scheme, program)):
        assert check.holds and check.method != SKIPPED, (check.id, check.detail)
    assert "2 key/value heads, rope_theta = 100" in check.statement and "memory of 4 tokens" in check.statement


# -- mutations of the derivation ------------------------------------------------------------

def _rotation_sign(monkeypatch):
    """R(−φ) for R(φ): the pairs turn the other way."""
    monkeypatch.setattr(rotary_attention, "rotation_kernel",
                        lambda angle, c, c_in: sp.cos(angle + (c - c_in) * sp.pi / 2))


def _theta_squared(monkeypatch):
    original = RotaryAttention.definitions

    def mutated(self):
        return tuple(replace(d, rhs=d.rhs.xreplace({ROPE_THETA: ROPE_THETA ** 2})) if d.function == "phi" else d
                     for d in original(self))

    monkeypatch.setattr(RotaryAttention, "definitions", mutated)


def _memory_support_ignored(monkeypatch):
    original = CrossAttention.definitions

    def ignored(expr):
        return expr.replace(lambda e: isinstance(e, AppliedUndef) and e.func.__name__ == MEMORY_SUPPORT,
                            lambda e: sp.Integer(1))

    monkeypatch.setattr(CrossAttention, "definitions",
                        lambda self: tuple(replace(d, rhs=ignored(d.rhs)) for d in original(self)))


@pytest.mark.parametrize("mutation", [_rotation_sign, _theta_squared, _memory_support_ignored])
def test_mutated_derivations_fail_the_emitted_check(monkeypatch, scheme, mutation):
    mutation(monkeypatch)
    check = emitted_check(scheme, derive(scheme))
    assert not check.holds and "max |emitted − evaluator|" in check.detail


CROSS_RESIDUAL = ('name = "cross-residual"\nsummary = "u + C(u; m)"\n[operators]\ncross = "cross-attention"\n'
                  '[[steps]]\noperator = "cross"\nsolver = "explicit"\n')


@pytest.mark.parametrize("mutation, scheme_of", [
    (_rotation_sign, lambda: load_scheme(str(ROOT / "tests" / "schemes" / "rotary-residual.toml"))),
    (_memory_support_ignored, lambda: parse_scheme(CROSS_RESIDUAL)),
])
def test_mutated_derivations_fail_the_symbolic_check(monkeypatch, mutation, scheme_of):
    """On one-operator schemes (a wrong program inside a whole block makes SymPy's comparison
    slow); θ does not reach the tiny size (one frequency, ω₀ = 1): the emitted check covers it."""
    scheme = scheme_of()
    assert derived_check(scheme, derive(scheme)).holds
    mutation(monkeypatch)
    check = derived_check(scheme, derive(scheme))
    assert not check.holds and "do not vanish" in check.detail


# -- mutations of the emitted code -----------------------------------------------------------

def _mutated_modules(scheme, old: str, new: str) -> dict:
    block, final_norm = lower(derive(scheme)), lower(derive(final_norm_scheme()))
    modules = {}
    for backend in ("numpy", "torch"):
        source = render_module(scheme, block, final_norm, backend)
        assert old in source, (backend, old)
        namespace: dict = {}
        exec(compile(source.replace(old, new), f"<mutated {backend}>", "exec"), namespace)  # noqa: S102
        modules[backend] = type("Module", (), namespace)
    return modules


@pytest.mark.parametrize("old, new", [
    ("rope_theta**(2*_grid(d_half, u0)/d_head)", "rope_theta**(_grid(d_half, u0)/d_head)"),  # wrong frequencies
    ("if memory_key_padding_mask is None:", "if True:"),  # the memory padding mask ignored
    # query head h reads key/value head h mod N_g instead of ⌊h / n_rep⌋
    ("(batch, n_tokens, n_kv_heads, n_rep, 2, d_half)", "(batch, n_tokens, n_rep, n_kv_heads, 2, d_half).swapaxes(2, 3)"),
])
def test_mutated_emitted_code_fails_the_emitted_check(scheme, old, new):
    check = emitted_check(scheme, derive(scheme), _mutated_modules(scheme, old, new))
    assert not check.holds, check.detail


# -- the evaluator's own properties ------------------------------------------------------------

SIZES = Sizes(tokens=5, features=8, heads=2, hidden=6, kv_heads=1)  # d_h = 4: two frequencies


def _step(scheme, params, u, **inputs):
    return Semantics(scheme, params, SIZES, FLOAT, eps=1e-5, **inputs).step(u)


def test_rotary_attention_depends_on_position_differences_only():
    from splitformer.codegen.verification.parameters import random_parameters

    scheme = load_scheme(str(ROOT / "tests" / "schemes" / "rotary-residual.toml"))
    params = random_parameters(scheme, SIZES, 1)
    u = np.random.default_rng(2).standard_normal((SIZES.tokens, SIZES.features))
    positions = np.array([0.0, 1.0, 3.0, 4.0, 7.0])
    base = _step(scheme, params, u, positions=positions, constants={"rope_theta": 50.0})
    shifted = _step(scheme, params, u, positions=positions + 11.5, constants={"rope_theta": 50.0})
    assert np.abs(shifted - base).max() < 1e-12
    # negative controls: other gaps, another base
    assert np.abs(_step(scheme, params, u, positions=positions * 2, constants={"rope_theta": 50.0}) - base).max() > 1e-3
    assert np.abs(_step(scheme, params, u, positions=positions, constants={"rope_theta": 5000.0}) - base).max() > 1e-3


def test_cross_attention_reads_the_memory_within_its_support(scheme):
    from splitformer.codegen.verification.parameters import random_parameters

    single = load_scheme("decoder-pre-ln")
    params = random_parameters(single, SIZES, 3)
    rng = np.random.default_rng(4)
    u, memory = rng.standard_normal((SIZES.tokens, SIZES.features)), rng.standard_normal((3, SIZES.features))
    support = np.array([[1, 0, 1]] * SIZES.tokens)
    changed = memory.copy()
    changed[1] += 1.0
    base = _step(single, params, u, memory=memory, memory_support=support)
    assert np.abs(_step(single, params, u, memory=changed, memory_support=support) - base).max() < 1e-14
    # the order of the memory tokens does not matter (no positions); a padded token does not either
    assert np.abs(_step(single, params, u, memory=memory[::-1], memory_support=support[:, ::-1]) - base).max() < 1e-12
    # negative control: without the support the changed token is read
    assert np.abs(_step(single, params, u, memory=changed) - _step(single, params, u, memory=memory)).max() > 1e-3
    with pytest.raises(ValueError, match="needs a memory"):
        _step(single, params, u)


# -- operator kinds the evaluator cannot evaluate ---------------------------------------------

@dataclass(frozen=True)
class _OwnRotary(RotaryAttention):
    """A user kind reading token positions through its continuous definitions only."""

    kind: ClassVar[str] = "test-own-rotary"


def test_a_user_kind_reading_inputs_the_evaluator_lacks_is_skipped_with_the_reason():
    if _OwnRotary.kind not in OPERATOR_KINDS:
        register_operator(_OwnRotary)
    scheme = parse_scheme('name = "own"\nsummary = "s"\ncausal = true\n[operators]\nattn = "test-own-rotary"\n'
                          '[[steps]]\noperator = "attn"\nsolver = "explicit"\n')
    # token positions are a declared input the evaluator reads, θ a constant it takes at its default; the rotated
    # pairs' grids it lacks
    assert "reads domains Ω_c" in unevaluable(scheme)["attn"] and "rope_theta" not in unevaluable(scheme)["attn"]
    checks = {check.id: check for check in scheme_checks(scheme, derive(scheme))}
    for what in ("derived", "emitted"):
        check = checks[f"semantics/own/{what}"]
        assert check.method == SKIPPED and "domains Ω_c" in check.detail
    assert checks["structure/own/stack"].holds


@dataclass(frozen=True)
class _Waves(Operator):
    """``u ↦ sin(u) + cos(u)/2`` pointwise: functions the guide allows."""

    kind: ClassVar[str] = "test-waves"
    symbol: ClassVar[str] = r"\mathcal{W}"

    def parameters(self):
        return ()

    def definitions(self):
        from splitformer.symbolic.domains import X, Y
        from splitformer.symbolic.operators import STATE, Definition, apply

        state = apply(STATE, X, Y)
        return (Definition("out", self.symbol, (X, Y), sp.sin(state) + sp.cos(state) / 2, "waves"),)


def test_sin_and_cos_of_a_user_kind_are_evaluated():
    """A tester's finding: ``sin`` and ``cos``, allowed in a kind's formulas, left the evaluator without a rule, so its
    semantics checks and convergence study were skipped; both are evaluated now and the checks hold."""
    if _Waves.kind not in OPERATOR_KINDS:
        register_operator(_Waves)
    scheme = parse_scheme('name = "waves"\nsummary = "s"\n[operators]\nf = "test-waves"\n'
                          '[[steps]]\noperator = "f"\nsolver = "explicit"\n')
    assert unevaluable(scheme) == {}
    checks = {check.id: check for check in scheme_checks(scheme, derive(scheme))}
    assert all(checks[f"semantics/waves/{what}"].holds and checks[f"semantics/waves/{what}"].method != SKIPPED
               for what in ("derived", "emitted"))


@dataclass(frozen=True)
class _PositionalWave(Operator):
    """``u(x, y) cos(p(x)/θ)``: a user kind declaring the library's own θ (``ROPE_THETA``) as its constant."""

    kind: ClassVar[str] = "test-positional-wave"
    symbol: ClassVar[str] = r"\mathcal{P}"
    constants: ClassVar[tuple] = (Constant(ROPE_THETA, 10000.0, "the wave's period"),)
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def parameters(self):
        return ()

    def definitions(self):
        from splitformer.symbolic.domains import X, Y
        from splitformer.symbolic.operators import STATE, Definition, apply

        return (Definition("out", self.symbol, (X, Y), sp.cos(apply("pos", X) / ROPE_THETA) * apply(STATE, X, Y),
                           "a positional gain"),)


def test_a_user_kinds_rope_theta_is_the_checks_theta():
    """A reviewer's finding: with constants evaluated at their defaults, a kind declaring ``ROPE_THETA`` was evaluated
    at 10000 while the emitted check ran its module with the check's θ (100): a false failure. The evaluator takes the
    check's θ, as the built-in rotary evaluator does. Now every declared constant is run at its ``check_value`` by
    the emitted code and the evaluator alike (this kind's: 4/5 of its default)."""
    if _PositionalWave.kind not in OPERATOR_KINDS:
        register_operator(_PositionalWave)
    scheme = parse_scheme('name = "wave"\nsummary = "s"\ncausal = true\n[operators]\nf = "test-positional-wave"\n'
                          '[[steps]]\noperator = "f"\nsolver = "explicit"\n')
    checks = {check.id: check for check in scheme_checks(scheme, derive(scheme))}
    emitted = checks["semantics/wave/emitted"]
    assert emitted.holds and emitted.method != SKIPPED and "rope_theta = 8000" in emitted.statement, emitted.detail
