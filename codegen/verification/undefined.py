"""Comparing outputs that a scheme leaves undefined at some entries.

A plug-in's formula may be undefined at some points: ``u / ∫ H(p(x) − p(η)) dη`` is ∞ at the first token, which
has no earlier one (a mean over no key is 0 instead, in the evaluators and in the emitted code: ``bool_values``). The
emitted code computes ∞ or NaN there, as the evaluator does. Two outputs then agree where they are both undefined at
the same entries and close at every other. A NaN difference would fail every check with "nan" and no reason.
"""

from __future__ import annotations

import numpy as np

__all__ = ["gap", "undefined_note", "worst"]


def worst(values) -> float:
    """The largest of ``values``, NaN where one is: Python's ``max`` skips a NaN that follows a number (``max(1e-16,
    nan)`` is 1e-16), which would let a check pass on an output it could not compare."""
    return float(np.max(np.asarray(list(values), dtype=float)))


def gap(got, expected) -> float:
    """``max |got − expected|`` over the entries where ``expected`` is finite; ``inf`` where the two are not finite
    at the same entries, or differ there (NaN against ±∞, +∞ against −∞), or where no entry is finite."""
    got, expected = np.asarray(got, dtype=float), np.asarray(expected, dtype=float)
    finite = np.isfinite(expected)
    if not finite.any() or not np.array_equal(np.isfinite(got), finite) or \
            not np.array_equal(got[~finite], expected[~finite], equal_nan=True):
        return float("inf")
    return float(np.abs(got[finite] - expected[finite]).max(initial=0.0))


def undefined_note(got, expected) -> str:
    """``""``, or a clause for a check's detail on the entries where ``got`` (emitted) or ``expected`` (the evaluator's)
    is not finite."""
    got, expected = np.asarray(got, dtype=float), np.asarray(expected, dtype=float)
    both = int((~np.isfinite(got) & ~np.isfinite(expected)).sum())
    emitted_only = int((~np.isfinite(got) & np.isfinite(expected)).sum())
    clauses = []
    if both:
        clauses.append(f"{both} of {got.size} entries are not finite on both sides (the formulas are undefined there, "
                       "as a mean over no key is 0/0): compared as equal where they are the same")
    if emitted_only:
        clauses.append(f"the emitted output is not finite at {_entries(emitted_only)} where the evaluator's is finite: "
                       "the evaluator takes a product with a factor exactly 0 as 0 before any reciprocal, and the "
                       "emitted code does so only where a step or a support is a factor of the quotient, or the "
                       "quotient divides by a count of a support and sums over it")
    return "".join(f"; {clause}" for clause in clauses)


def _entries(count: int) -> str:
    return f"{count} entr{'y' if count == 1 else 'ies'}"
