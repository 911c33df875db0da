"""SymPy expressions as plain JSON trees, read back without running anything.

An expression is a list ``[head, *arguments]``: ``["Symbol", name, assumptions]``,
``["Rational", p, q]`` (integers included), ``["S", name]`` for a named constant, or an
operation from a fixed table (``Add``, ``Mul``, ``Pow``, ``Max``, …) over encoded
arguments. Decoding looks heads up in that table and never evaluates text (unlike
``sympify`` or ``srepr``); sizes, depth, digits, numeric powers and the numbers that SymPy's
arithmetic would compute while building a node are bounded, so that a crafted tree cannot exhaust
time or memory. Anything else raises ``ValueError``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import sympy as sp
from sympy.core.assumptions import _assume_defined
from sympy.functions.elementary.piecewise import ExprCondPair

__all__ = ["to_json", "from_json"]

#: Operations a tree may name, mapped to the classes that build them.
OPERATIONS: dict[str, type] = {cls.__name__: cls for cls in (
    sp.Add, sp.Mul, sp.Pow, sp.Max, sp.Min, sp.Abs, sp.sign, sp.exp, sp.log, sp.erf, sp.tanh,
    sp.Piecewise, ExprCondPair, sp.And, sp.Or, sp.Not,
    sp.Equality, sp.Unequality, sp.StrictLessThan, sp.LessThan, sp.StrictGreaterThan, sp.GreaterThan,
)}
#: Named constants (``sympy.S.<name>``).
CONSTANTS = frozenset({"Pi", "Exp1", "ImaginaryUnit", "Infinity", "NegativeInfinity", "ComplexInfinity",
                       "NaN", "BooleanTrue", "BooleanFalse"})
MAX_NODES = 20_000
MAX_DEPTH = 200
MAX_DIGITS = 100
MAX_EXPONENT = 64
#: The most bits a number that SymPy computes while building a sum, product or power may have (about 4900 digits):
#: a power of a power of a 100-digit integer, each to the 64th, took minutes (attack 24).
MAX_BITS = 2**14


def to_json(expression: sp.Basic) -> list:
    """The tree of ``expression``; ``TypeError`` for a node outside the table."""
    if isinstance(expression, sp.Symbol) and type(expression) is sp.Symbol:
        return ["Symbol", expression.name, dict(sorted(expression.assumptions0.items()))]
    if isinstance(expression, sp.Rational):
        return ["Rational", str(expression.p), str(expression.q)]
    name = type(expression).__name__
    if name in CONSTANTS and getattr(sp.S, name) is expression:
        return ["S", name]
    if OPERATIONS.get(name) is type(expression):
        return [name, *(to_json(argument) for argument in expression.args)]
    raise TypeError(f"cannot store a {name} ({expression}) as JSON")


def from_json(tree: Any) -> sp.Basic:
    """The expression of ``tree``; ``ValueError`` for anything not written by ``to_json``."""
    return _Decoder().decode(tree, 0)


#: Operations rebuilt as stored, without SymPy's canonicalization: a piecewise's conditions are rewritten at every
#: nesting level (a 10,931-node tree took 68 s); the verifier decides on what was stored.
_AS_STORED = {"Piecewise", "ExprCondPair", "Equality", "Unequality", "StrictLessThan", "LessThan", "StrictGreaterThan",
              "GreaterThan"}


class _Decoder:
    def __init__(self) -> None:
        self.nodes = 0

    def decode(self, tree: Any, depth: int) -> sp.Basic:
        return self.sized(tree, depth)[0]

    def sized(self, tree: Any, depth: int) -> tuple[sp.Basic, _Size]:
        """The expression of ``tree`` and a bound on the numbers SymPy may fold out of it."""
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            raise ValueError("expression tree too large or too deep")
        if not isinstance(tree, list) or not tree or not isinstance(tree[0], str):
            raise ValueError(f"not an expression node: {str(tree)[:60]}")
        head, arguments = tree[0], tree[1:]
        if head == "Symbol":
            return _symbol(arguments), _Size(0, 0)
        if head == "Rational":
            if len(arguments) != 2:
                raise ValueError("Rational takes two integers")
            numerator, denominator = (_integer(argument) for argument in arguments)
            if denominator == 0:
                raise ValueError("zero denominator")
            return sp.Rational(numerator, denominator), _Size(_bits(numerator), _bits(denominator) - 1)
        if head == "S":
            if len(arguments) != 1 or arguments[0] not in CONSTANTS:
                raise ValueError(f"unknown constant {str(arguments)[:60]}")
            return getattr(sp.S, arguments[0]), _Size(0, 0)
        if head not in OPERATIONS:
            raise ValueError(f"unknown operation {head[:60]!r}")
        decoded, sizes = zip(*(self.sized(argument, depth + 1) for argument in arguments)) if arguments else ((), ())
        if head == "Pow":
            _check_power(list(decoded))
        size = _folded(head, list(decoded), list(sizes))
        if max(size) > MAX_BITS:
            raise ValueError(f"{head} of numbers whose result could exceed {MAX_BITS} bits")
        if head in _AS_STORED:  # stored canonical; canonicalizing again cost ~14x per nesting level (attack 20)
            return sp.Basic.__new__(OPERATIONS[head], *decoded), size
        return OPERATIONS[head](*decoded), size


def _integer(text: Any) -> int:
    digits = text.lstrip("-") if isinstance(text, str) else ""
    if not 0 < len(digits) <= MAX_DIGITS or not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"not a bounded decimal integer: {str(text)[:60]}")
    return int(text)


def _symbol(arguments: list) -> sp.Symbol:
    if len(arguments) != 2 or not isinstance(arguments[0], str) or not isinstance(arguments[1], dict):
        raise ValueError("Symbol takes a name and a table of assumptions")
    name, assumptions = arguments
    if not 0 < len(name) <= 100 or not name.isprintable():
        raise ValueError(f"bad symbol name {name[:60]!r}")
    if not all(key in _assume_defined and isinstance(value, bool) for key, value in assumptions.items()):
        raise ValueError(f"bad assumptions for symbol {name!r}")
    return sp.Symbol(name, **assumptions)


def _check_power(arguments: list[sp.Basic]) -> None:
    """Numeric powers are evaluated on construction and at verification: keep exponents small."""
    if len(arguments) != 2:
        raise ValueError("Pow takes two arguments")
    exponent = arguments[1]
    if exponent.is_Number and (not exponent.is_Rational or max(abs(exponent.p), exponent.q) > MAX_EXPONENT):
        raise ValueError(f"power with exponent {exponent} out of range")


def _bits(number: int) -> int:
    return abs(number).bit_length()


class _Size(NamedTuple):
    """Bounds on the bits of a numerator and of a denominator SymPy may fold out of a subtree: its numbers, and the
    powers of its numeric bases (``√B`` to the 63rd is ``B^31 √B``)."""

    numerator: int
    denominator: int


def _folded(head: str, arguments: list[sp.Basic], sizes: list[_Size]) -> _Size:
    """The bound of a node from its arguments': a product's bits are at most the sum of its factors'; a sum's
    numerator at most the widest numerator times every other denominator, its denominator at most the product of
    theirs; a power's at most the base's times the exponent's numerator (its reciprocal for a negative one)."""
    if not sizes:
        return _Size(0, 0)
    if head == "Pow" and arguments[1].is_Rational:
        (numerator, denominator), power = sizes[0], abs(arguments[1].p)
        size = _Size(numerator * power, denominator * power)
        return size if arguments[1].p >= 0 else _Size(size.denominator + 1, size.numerator)
    denominators = sum(size.denominator for size in sizes)
    if head == "Mul":
        return _Size(sum(size.numerator for size in sizes), denominators)
    if head == "Add":
        return _Size(max(size.numerator for size in sizes) + denominators + _bits(len(sizes)), denominators)
    return _Size(max(size.numerator for size in sizes), max(size.denominator for size in sizes))
