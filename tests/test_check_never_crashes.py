"""No valid scheme crashes ``splitformer check``: the paths the audit found, and the guard.

A bias-free feed-forward, a plug-in attention at a query with empty support, a plug-in reading
an input the evaluator has no semantics for, and a group of checks that raises.
"""

from dataclasses import dataclass
from typing import ClassVar

import mpmath
import numpy as np
import pytest
import torch

from splitformer.codegen import cli
from splitformer.codegen.verification import runner
from splitformer.codegen.verification.definitions import evaluate_definitions
from splitformer.codegen.verification.emitted import emitted_modules
from splitformer.codegen.verification.guard import guarded
from splitformer.codegen.verification.parameters import random_parameters
from splitformer.codegen.verification.scheme_checks import emitted_check
from splitformer.codegen.verification.semantics import KNOWN_KINDS, MPMATH, Semantics, Sizes
from splitformer.codegen.verification.statements import SKIPPED
from splitformer.symbolic import derive, parse_scheme
from splitformer.symbolic.kinds import OPERATOR_KINDS
from splitformer.symbolic.operators import Attention, register_operator
from splitformer.symbolic.rotary_attention import RotaryAttention

D, HEADS, D_FF, TOKENS = 6, 2, 5, 4


def _scheme(name: str, kind: str):
    """One explicit half step of the operator ``op`` of ``kind`` (TOML)."""
    return parse_scheme(f'name = "{name}"\nsummary = "s"\n[operators]\nop = {kind}\n'
                        '[[steps]]\noperator = "op"\nsolver = "explicit"\nfraction = "1/2"\n')


def test_a_bias_free_feed_forward_is_emitted_and_evaluated_without_biases():
    scheme = _scheme("bias-free", '{ kind = "feed-forward", bias = false }')
    program = derive(scheme)
    params = random_parameters(scheme, Sizes(TOKENS, D, HEADS, D_FF), seed=3)
    assert set(params) == {"op.W_1", "op.W_2"}
    u = np.random.default_rng(4).standard_normal((2, TOKENS, D))
    expected = u + np.maximum(u @ params["op.W_1"], 0) @ params["op.W_2"] / 2  # written here: no bias anywhere
    modules = emitted_modules(scheme, program)
    assert np.abs(modules["numpy"].forward(u, params) - expected).max() < 1e-13
    block = modules["torch"].Block(D, HEADS, D_FF, dtype=torch.float64)
    block.load_params(params)
    with torch.no_grad():
        assert np.abs(block(torch.tensor(u)).numpy() - expected).max() < 1e-13
    check = emitted_check(scheme, program)  # the evaluator used to raise KeyError 'op.b_1'
    assert check.holds, check.detail


@dataclass(frozen=True)
class _PluginAttention(Attention):
    """A user's copy of attention: the evaluator knows it only by its continuous definitions."""

    kind: ClassVar[str] = "test-plugin-attention"


@dataclass(frozen=True)
class _PluginRotary(RotaryAttention):
    """A user's copy of rotary attention: it reads RoPE's θ, a free symbol the evaluator cannot supply
    (positions it reads since kinds declare them)."""

    kind: ClassVar[str] = "test-plugin-rotary"


@pytest.fixture(scope="module", autouse=True)
def plugins():
    for kind in (_PluginAttention, _PluginRotary):
        if kind.kind not in OPERATOR_KINDS:
            register_operator(kind)


def test_a_plugin_attention_at_a_query_with_empty_support_gives_the_output_bias():
    scheme = _scheme("plugin-attention", '"test-plugin-attention"')
    sizes = Sizes(TOKENS, D, HEADS, D_FF)
    support = np.tril(np.ones((TOKENS, TOKENS), dtype=int))
    support[:, 0] = 0  # query 0 sees no key
    with mpmath.workdps(50):
        params = {name: np.frompyfunc(mpmath.mpf, 1, 1)(value)
                  for name, value in random_parameters(scheme, sizes, 5).items()}
        u = np.frompyfunc(mpmath.mpf, 1, 1)(np.random.default_rng(6).standard_normal((TOKENS, D)))
        semantics = Semantics(scheme, params, sizes, MPMATH, support=support)
        plugin = evaluate_definitions(semantics, "op", u)  # used to raise ZeroDivisionError
        by_hand = KNOWN_KINDS["attention"](semantics, "op", u)
        assert max(abs(value) for value in (plugin - by_hand).flat) < mpmath.mpf(10) ** -45
        assert max(abs(value) for value in (plugin[0] - params["op.b_o"]).flat) < mpmath.mpf(10) ** -45
        assert max(abs(value) for value in (plugin[1] - params["op.b_o"]).flat) > 1e-3  # a query that sees keys
    check = emitted_check(scheme, derive(scheme))  # padding + causal: one query with empty support
    assert check.holds and "evaluated from their continuous definitions" in check.detail, check.detail


def test_a_plugin_reading_what_the_evaluator_lacks_is_skipped_with_the_reason_not_crashed(monkeypatch):
    scheme = _scheme("plugin-rotary", '"test-plugin-rotary"')
    monkeypatch.setattr(runner, "adjoint_checks", lambda *arguments: [])  # 20 s here; tested in test_adjoint.py
    report = runner.scheme_checks(scheme)
    skipped = {check.id: check.detail for check in report.checks if check.method == SKIPPED}
    assert set(skipped) >= {f"semantics/{scheme.name}/derived", f"semantics/{scheme.name}/emitted",
                            f"convergence/{scheme.name}"}  # the convergence study used to raise KeyError
    assert all("test-plugin-rotary reads domains" in detail and "Ω_c" in detail for detail in skipped.values())
    assert report.holds and not any(check.method == "crashed" for check in report.checks)


def test_a_check_that_raises_is_a_reported_failure():
    def broken():
        raise KeyError("u0")

    [check] = guarded("network/cvt", "cvt", broken)
    assert (check.id, check.method, check.holds) == ("network/cvt", "crashed", False)
    assert "KeyError: 'u0'" in check.detail and "in broken" in check.detail
    assert guarded("x", None, lambda: None) == []


def test_check_reports_a_crashing_network_check_as_a_failure_and_exits_1(monkeypatch, capsys):
    for name in ("projection_checks", "activation_checks", "attention_checks", "llm_checks",
                 "general_adjoint_checks"):
        monkeypatch.setattr(runner, name, lambda: [])  # the general checks are tested elsewhere
    monkeypatch.setattr(runner, "sign_check", lambda: [])

    def crashing(spec, groups):
        raise KeyError("u0")

    monkeypatch.setattr(runner, "network_statement_checks", crashing)  # the runner's network checks call it
    assert cli.main(["check", "cvt"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  network/cvt  [crashed]" in out and "KeyError: 'u0'" in out and "Traceback" not in out


@pytest.mark.parametrize("branches, weights", [
    ('[], [], [{ operator = "op", solver = "explicit" }]', '"2", "-1", "0"'),  # a zero weight
    ('[{ operator = "op", solver = "explicit" }], [{ operator = "op", solver = "explicit" }], []', '"1", "-1", "1"'),
])
def test_weights_that_cancel_every_operator_are_refused_as_the_identity(branches, weights, tmp_path, capsys):
    path = tmp_path / "identity.toml"
    path.write_text(f'name = "identity"\nsummary = "s"\n[operators]\nop = "feed-forward"\n'
                    f'[[steps]]\nparallel = [{branches}]\nweights = [{weights}]\n')
    assert cli.main(["derive", str(path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == ("error: scheme 'identity' applies no operator: the parallel weights "
                                               "cancel every operator's term, so its step is the identity")
    assert not (tmp_path / "out").exists()
