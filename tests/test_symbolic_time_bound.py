"""The symbolic semantics comparison is bounded in time (a fuzzer's finding, s42): a Strang step of RMS-normalized
attention around a feed-forward ran for minutes in SymPy's assumptions and ``check`` never answered. Past
``SYMBOLIC_SECONDS`` it is skipped, saying so; the emitted modules are still compared numerically."""

from splitformer.codegen.verification import scheme_checks
from splitformer.codegen.api import derive
from splitformer.symbolic import load_scheme


def _checks(name):
    scheme = load_scheme(name)
    return {check.id.rsplit("/", 1)[1]: check for check in scheme_checks.scheme_checks(scheme, derive(scheme).program)}


def test_a_symbolic_comparison_past_its_bound_is_skipped_and_the_numbers_still_compared(monkeypatch):
    monkeypatch.setattr(scheme_checks, "SYMBOLIC_SECONDS", 1e-3)
    checks = _checks("rk4")
    assert checks["derived"].method == "skipped" and checks["derived"].holds
    assert checks["derived"].detail.startswith("skipped: SymPy did not finish the symbolic comparison within 0.001 s")
    assert checks["emitted"].method == "numeric" and checks["emitted"].holds


def test_control_within_the_bound_the_comparison_is_symbolic():
    checks = _checks("rk4")
    assert checks["derived"].method == "symbolic" and checks["derived"].holds, checks["derived"].detail
