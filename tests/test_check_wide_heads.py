"""``splitformer check`` runs a scheme whose operators ask for wider heads than the checks' default sizes give.

A rotary dimension of 8 asks each head for at least 8 features, and the emitted code refuses narrower heads; the
checks that run the emitted code (semantics, causality, the adjoint tests) used to build 2 heads of 4 features and
report that refusal as a crash of a valid scheme. ``emitted_sizes`` widens the features per head instead."""

from __future__ import annotations

import pytest

import splitformer
from splitformer.codegen.verification import causality, scheme_checks, structure

from test_head_width_and_cache_refusals import NARROW, PARTIAL_ROTARY

#: The partial rotary scheme (rotary_dim = 8) of the refusal tests, named for these checks.
SCHEME = PARTIAL_ROTARY.replace('name = "partial-rotary"', 'name = "rotary-eight"')
GROUPS = ("semantics", "causality", "adjoint-test")


@pytest.fixture(scope="module")
def derivation(tmp_path_factory):
    path = tmp_path_factory.mktemp("scheme") / "rotary-eight.toml"
    path.write_text(SCHEME, encoding="utf-8")
    return splitformer.derive(str(path))


def test_the_checks_that_run_the_emitted_code_hold_for_heads_wider_than_their_default(derivation):
    report = derivation.check(only=GROUPS)
    assert report.holds, [(check.id, check.detail) for check in report.checks if not check.holds]
    names = {check.id for check in report.checks}
    assert {"semantics/rotary-eight/emitted", "causality/rotary-eight/block", "structure/rotary-eight/stack"} <= names
    emitted = next(check for check in report.checks if check.id == "semantics/rotary-eight/emitted")
    assert emitted.method != "skipped" and emitted.holds


def test_control_the_default_sizes_crash_on_the_emitted_codes_refusal(derivation, monkeypatch):
    """Without the widening, the emitted code refuses the heads of 4 features and the groups crash."""
    for module in (scheme_checks, causality, structure):
        monkeypatch.setattr(module, "emitted_sizes", lambda sizes, scheme: sizes.of(scheme))
    report = derivation.check(only=GROUPS)
    crashed = [check for check in report.checks if check.method == "crashed"]
    assert crashed and all(NARROW in check.detail for check in crashed)


def test_heads_too_wide_for_the_budget_skip_the_numbers_only(tmp_path):
    """A rotary dimension of 128 widens the emitted check's heads past its budget: that check is skipped with the
    reason, and the symbolic check of the derived program, at its own tiny sizes, still runs."""
    path = tmp_path / "rotary-wide.toml"
    path.write_text(SCHEME.replace("rotary-eight", "rotary-wide").replace("rotary_dim = 8", "rotary_dim = 128"),
                    encoding="utf-8")
    report = splitformer.derive(str(path)).check(only=("semantics",))
    checks = {check.id: check for check in report.checks}
    emitted, derived = checks["semantics/rotary-wide/emitted"], checks["semantics/rotary-wide/derived"]
    assert emitted.method == "skipped" and "with heads of 128 features" in emitted.detail
    assert derived.method == "symbolic" and derived.holds
