"""`splitformer check` derives a scheme's adjoint once (the finite-difference check and the emitted
``vjp`` share it) and runs the semantics checks within a counted budget (``MAX_EMITTED_WORK``,
closures of the evaluator's step, not seconds): the densest scheme the bounds allow fits it, and
above it the checks say "not checked: budget" without running."""

from __future__ import annotations

import splitformer.codegen.pipeline as pipeline
from splitformer.codegen.verification import runner
from splitformer.codegen.verification import scheme_checks as semantics
from splitformer.codegen.verification.statements import SKIPPED, Check
from splitformer.codegen.verification.statements import adjoint as adjoint_statements
from splitformer.symbolic import derive, load_scheme

from test_check_work import _dense_tableau


def test_check_derives_the_schemes_adjoint_once(monkeypatch):
    scheme = load_scheme("pre-ln")
    program = derive(scheme)
    calls = []

    def counted(original):
        def derive_adjoint(target):
            calls.append(target is program)
            return original(target)
        return derive_adjoint

    for module in (runner, pipeline, adjoint_statements):
        monkeypatch.setattr(module, "derive_adjoint", counted(module.derive_adjoint))
    for skipped in ("semantics_checks", "recovery_checks", "_orders"):  # only the two groups that need the adjoint
        monkeypatch.setattr(runner, skipped, lambda *args: [])
    report = runner.scheme_checks(scheme, program)
    ids = {check.id for check in report.checks}
    assert {"adjoint/pre-ln/finite-difference", "adjoint/pre-ln/negative-control"} <= ids
    assert any(check_id.startswith("adjoint-test/pre-ln") for check_id in ids)
    assert all(check.holds for check in report.checks)
    assert calls.count(True) == 1, calls


def test_the_densest_scheme_within_the_bounds_fits_the_semantics_budget():
    """64 operator evaluations (a dense 16-stage tableau of four fields on projected states), with the
    costliest built-in kinds: counted, not timed."""
    largest = semantics.emitted_work(derive(_dense_tableau("rotary-attention", "gated-feed-forward", "rms-norm")),
                                     semantics._EMITTED_GROUPED)
    small = semantics.emitted_work(derive(load_scheme("llama")), semantics._EMITTED_GROUPED)  # 2 evaluations
    assert 20 * small < largest <= semantics.MAX_EMITTED_WORK, (small, largest)


def test_above_the_budget_the_semantics_checks_are_not_run_and_say_so(monkeypatch):
    scheme = load_scheme("pre-ln")
    program = derive(scheme)
    work = semantics.emitted_work(program, semantics._EMITTED)
    ran = []
    monkeypatch.setattr(semantics, "emitted_check", lambda *args: ran.append("emitted") or Check(
        "semantics/pre-ln/emitted", "pre-ln", "ran", "numeric", True, ""))
    monkeypatch.setattr(semantics, "derived_check", lambda *args: ran.append("derived") or Check(
        "semantics/pre-ln/derived", "pre-ln", "ran", "symbolic", True, ""))
    monkeypatch.setattr(semantics, "MAX_EMITTED_WORK", work - 1)
    checks = {check.id: check for check in semantics.scheme_checks(scheme, program)}
    assert ran == []
    for what in ("derived", "emitted"):
        check = checks[f"semantics/pre-ln/{what}"]
        assert check.method == SKIPPED
        assert check.detail.startswith(f"not checked: budget: the evaluator's step makes {work} operations, more "
                                       f"than the {work - 1}")
    monkeypatch.setattr(semantics, "MAX_EMITTED_WORK", work)  # the control: at the budget both run
    semantics.scheme_checks(scheme, program)
    assert ran == ["emitted", "derived"]
