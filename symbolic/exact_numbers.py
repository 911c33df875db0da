"""Exact small rationals from the numbers a scheme file may hold (fractions, weights, tableaux).

An int, a decimal (``0.5``, ``1e-3``) or a fraction string (``"1/6"``); numerator and
denominator at most ``MAX_TERM``. The text is checked before Python converts it, so
``"1e99999999"`` is refused at once instead of computing ``10**99999999``, and no value
reaches the generated code that a float could not hold.
"""

from __future__ import annotations

import re
from fractions import Fraction

import sympy as sp

__all__ = ["exact_number", "MAX_TERM"]

MAX_TERM = 10**9
_MAX_EXPONENT = 40
#: ASCII digits only (``re.ASCII``): Python reads other scripts' digits ("١/٢", a fullwidth "２") as numbers, which
#: the documented forms, a decimal or p/q, are not.
_NUMBER = re.compile(r"[+-]?(?:\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})(?:[eE][+-]?\d{1,9})?|[+-]?\d{1,30}/\d{1,30}",
                     re.ASCII)
#: A number written with more digits than ``_NUMBER`` reads: out of range, not "not a number".
_LONG_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?\d+/\d+", re.ASCII)


def exact_number(value: object) -> sp.Rational:
    """The rational written as ``value``; ``ValueError`` with the reason (one line) otherwise."""
    if isinstance(value, sp.Rational):
        if max(abs(value.p), value.q) > MAX_TERM:  # before printing: a long one has more digits than str allows
            raise ValueError(f"a number of {max(abs(value.p), value.q).bit_length()} bits is out of range: numerator and "
                             f"denominator at most {MAX_TERM}")
        value = str(value)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a number or a fraction string, got {type(value).__name__}")
    if isinstance(value, int) and abs(value) > MAX_TERM:  # by its size: a long int's digits are no misspelt number
        shown = value if value.bit_length() <= 128 else f"an int of {value.bit_length()} bits"
        raise ValueError(f"{shown} is out of range: numerator and denominator at most {MAX_TERM}")
    text = value.strip() if isinstance(value, str) else str(value)
    shown = text if len(text) <= 40 else text[:40] + "…"
    if not _NUMBER.fullmatch(text):
        if _LONG_NUMBER.fullmatch(text):
            raise ValueError(f"{shown} has more digits than a number is read with (30 in a part, 9 in the exponent; "
                             f"numerator and denominator at most {MAX_TERM})")
        raise ValueError(f"not a number: {shown!r} (a rational number: a decimal or p/q)")
    out_of_range = f"{shown} is out of range: numerator and denominator at most {MAX_TERM}"
    if abs(int(re.split("[eE]", text + "e0")[1])) > _MAX_EXPONENT:
        raise ValueError(out_of_range)
    try:
        fraction = Fraction(text)
    except ZeroDivisionError:
        raise ValueError(f"not a number: {shown!r} (zero denominator)") from None
    if abs(fraction.numerator) > MAX_TERM or fraction.denominator > MAX_TERM:
        raise ValueError(out_of_range)
    return sp.Rational(fraction.numerator, fraction.denominator)
