"""Series in non-commuting generators, as a table of words (how ``order`` writes a leading error on linear fields).

A series ``Σ c_w h^{|w|} w`` is stored as ``{w: c_w}``: every generator comes with one
factor of the step ``h`` (one step multiplies each field by ``h``), so the power of ``h`` is
the word's length and truncating at ``h^degree`` drops the longer words. Products and sums
on these tables are what SymPy's ``expand`` of the same non-commutative polynomials
computes, without rebuilding and re-canonicalizing the whole expression at every step;
``expression`` turns a part back into the SymPy expression ``expand`` would give.
"""

from __future__ import annotations

from collections.abc import Iterable

import sympy as sp

__all__ = ["Series"]

Word = tuple[sp.Symbol, ...]


class Series:
    """``Σ c_w h^{|w|} w`` over words ``w`` of at most ``degree`` non-commuting generators."""

    __slots__ = ("terms", "degree")

    def __init__(self, terms: dict[Word, sp.Expr], degree: int):
        self.terms = {word: coefficient for word, coefficient in terms.items()
                      if len(word) <= degree and coefficient != 0}
        self.degree = degree

    @classmethod
    def constant(cls, value: sp.Expr, degree: int) -> Series:
        return cls({(): sp.sympify(value)}, degree)

    @classmethod
    def field(cls, parts: Iterable[tuple[sp.Expr, sp.Symbol]], degree: int) -> Series:
        """``h Σ c_k A_k`` from ``(c_k, A_k)`` (equal generators add up)."""
        terms: dict[Word, sp.Expr] = {}
        for coefficient, generator in parts:
            terms[(generator,)] = terms.get((generator,), sp.Integer(0)) + coefficient
        return cls(terms, degree)

    def __add__(self, other: Series) -> Series:
        terms = dict(self.terms)
        for word, coefficient in other.terms.items():
            terms[word] = terms.get(word, sp.Integer(0)) + coefficient
        return Series(terms, self.degree)

    def __sub__(self, other: Series) -> Series:
        return self + other.scaled(sp.Integer(-1))

    def scaled(self, factor: sp.Expr) -> Series:
        return Series({word: factor * coefficient for word, coefficient in self.terms.items()}, self.degree)

    def __matmul__(self, other: Series) -> Series:
        """The product ``self · other`` (``other`` acts first), truncated."""
        terms: dict[Word, sp.Expr] = {}
        for left, a in self.terms.items():
            room = self.degree - len(left)
            for right, b in other.terms.items():
                if len(right) <= room:
                    word = left + right
                    terms[word] = terms.get(word, sp.Integer(0)) + a * b
        return Series(terms, self.degree)

    def power(self, exponent: int) -> Series:
        result = Series.constant(1, self.degree)
        for _ in range(exponent):
            result = result @ self
        return result

    def exponential(self) -> Series:
        """``Σ_k X^k / k!`` up to the truncation (``self`` without constant term)."""
        term, total = Series.constant(1, self.degree), Series.constant(1, self.degree)
        for power in range(1, self.degree + 1):
            term = (term @ self).scaled(sp.Rational(1, power))
            total = total + term
        return total

    def part(self, length: int) -> Series:
        """The words of one length: the coefficient of ``h^length``."""
        return Series({word: c for word, c in self.terms.items() if len(word) == length}, self.degree)

    def is_zero(self) -> bool:
        return not self.terms

    def coefficient_sum(self) -> sp.Expr:
        """The value with every generator set to 1 (and ``h`` left out)."""
        return sp.Add(*self.terms.values())

    def expression(self, step: sp.Symbol | None = None) -> sp.Expr:
        """The SymPy polynomial (``Σ c_w w``, times ``h^{|w|}`` when ``step`` is given)."""
        return sp.Add(*(coefficient * (step ** len(word) if step is not None else 1) * sp.Mul(*word)
                        for word, coefficient in self.terms.items()))
