"""``check`` compares outputs that may hold NaN or ±∞ entry by entry (``codegen/verification/undefined.py``): equal
where both sides are undefined at the same entries, infinitely far where one side alone is, and a worst error that
is NaN where one is (Python's ``max`` skipped a NaN after a number: the semantics check of the support mean passed
with NaN outputs)."""

import math

import numpy as np

from splitformer.codegen.verification.undefined import gap, undefined_note, worst


def test_worst_keeps_a_nan_that_pythons_max_skips():
    assert max(1e-16, math.nan) == 1e-16  # the control: what the checks used
    assert math.isnan(worst([1e-16, math.nan])) and math.isnan(worst([math.nan, 1e-16]))
    assert worst([1e-16, 3e-15]) == 3e-15


def test_gap_compares_undefined_entries_as_equal_only_where_both_are():
    expected = np.array([1.0, np.nan, np.inf, -2.0])
    assert gap(expected + 1e-17, expected) < 1e-15
    for wrong in ([1.0, 0.0, np.inf, -2.0], [1.0, np.nan, -np.inf, -2.0], [np.nan, np.nan, np.inf, -2.0],
                  [1.0, np.inf, np.inf, -2.0]):
        assert gap(np.array(wrong), expected) == np.inf
    assert gap(np.full(3, np.nan), np.full(3, np.nan)) == np.inf  # nothing compared is no agreement
    assert gap(np.array([1.0, 2.5]), np.array([1.0, 2.0])) == 0.5


def test_the_note_names_what_is_undefined_on_each_side():
    assert undefined_note(np.ones(3), np.ones(3)) == ""
    both = undefined_note(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))
    assert "1 of 2 entries are not finite on both sides" in both and "emitted output" not in both
    emitted = undefined_note(np.array([np.nan, 1.0]), np.array([0.0, 1.0]))
    assert "the emitted output is not finite at 1 entry where the evaluator's is finite" in emitted


def test_a_division_by_zero_is_the_schemes_only_in_the_exact_evaluators():
    """mpmath's ``1/0`` (an exact evaluator at a point where a formula is undefined) fails a group, saying the scheme
    divides by zero there; Python's own ``1/0`` in a check is a crash of the check, said as such."""
    import mpmath

    from splitformer.codegen.verification.guard import guarded

    exact = guarded("semantics/s", "s", lambda: mpmath.mpf(1) / 0)[0]
    assert exact.method == "numeric" and not exact.holds and "divides by zero" in exact.detail
    own = guarded("semantics/s", "s", lambda: 1 / 0)[0]
    assert own.method == "crashed" and "ZeroDivisionError" in own.detail
