"""Which SymPy objects may reach a printer: exact classes the printers know, names that are plain ``str``.

Emitted code is printed from SymPy expressions, and SymPy lets an object print itself (a
printer's ``printmethod``, ``__str__``) and dispatches on class *names*. So whatever a user hands
over as SymPy (a plug-in kind's definitions, an activation's formula, a tableau's coefficients)
is accepted only if every node, bound variables included, is exactly one of the classes below —
no subclass — every symbol's name is an exact ``str``, and every applied function is either one
of ``FUNCTIONS`` or an undefined function made by ``sympy.Function(name)`` with an identifier
for its name and nothing added to its class.
"""

from __future__ import annotations

import keyword
import re

import sympy as sp
from sympy.core import numbers
from sympy.core.function import AppliedUndef, UndefinedFunction

__all__ = ["FUNCTIONS", "NUMBERS", "RATIONALS", "OPERATIONS", "plain_function_class", "untrusted_node", "check_expression"]

#: Exact rationals, by exact class (``sp.Integer(0)`` is ``Zero``, ``sp.Rational(1, 2)`` is ``Half``).
RATIONALS = frozenset({sp.Integer, sp.Rational, numbers.Zero, numbers.One, numbers.NegativeOne, numbers.Half})
#: Numbers and constants, by exact class.
NUMBERS = RATIONALS | {sp.Float, numbers.Pi}
#: The arithmetic and the integral transforms (an integral's limits are a ``Tuple``).
OPERATIONS = frozenset({sp.Add, sp.Mul, sp.Pow, sp.Integral, sp.Tuple})
#: The functions every backend spells (``codegen.printers``; tests/test_trusted_expressions.py checks it).
FUNCTIONS = frozenset({sp.exp, sp.log, sp.erf, sp.tanh, sp.cos, sp.sin, sp.Abs, sp.floor, sp.Max, sp.Min,
                       sp.Heaviside, sp.KroneckerDelta})
#: SymPy's values of an undefined formula.
_UNDEFINED = frozenset({numbers.NaN, numbers.ComplexInfinity, numbers.Infinity, numbers.NegativeInfinity})
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
#: What ``sympy.Function(name)`` puts into the class it makes; anything more (``_sympystr``) is refused.
_UNDEFINED_ATTRIBUTES = frozenset(vars(sp.Function("f")))


def plain_function_class(cls: type) -> bool:
    """``cls`` is ``sympy.Function(name)`` for an identifier ``name``, as SymPy made it (nothing added)."""
    name = cls.__name__
    return (type(cls) is UndefinedFunction and cls.__bases__ == (AppliedUndef,)
            and frozenset(vars(cls)) == _UNDEFINED_ATTRIBUTES and type(name) is str
            and _IDENTIFIER.fullmatch(name) is not None and not keyword.iskeyword(name))


def untrusted_node(expr: object, functions: frozenset = FUNCTIONS) -> str | None:
    """The first node of ``expr`` a printer must not see, described in a few words; ``None`` if there is none."""
    if not isinstance(expr, sp.Basic):
        return f"a {type(expr).__name__}, not a SymPy expression"
    for node in sp.preorder_traversal(expr):
        cls = type(node)
        if cls is sp.Symbol:
            if type(node.name) is not str:
                return f"the Symbol {_plain(node.name)!r}: its name is a {_plain(type(node.name).__name__)}, not a str"
        elif isinstance(node, AppliedUndef):
            if not plain_function_class(cls):
                return f"{_class(node)}, not a function made by sympy.Function(<identifier>)"
        elif cls in _UNDEFINED:
            return (f"the value {node}: the formula is undefined here (SymPy decided a 0/0 or a division by 0, "
                    "for these options)")
        elif cls not in NUMBERS and cls not in OPERATIONS and cls not in functions:
            if cls.__module__.startswith("sympy.") and getattr(sp, cls.__name__, None) is cls:
                spelled = ", ".join(sorted(function.__name__ for function in functions))
                return (f"{_class(node)}: no printer spells it; a formula may use numbers, arithmetic and powers, "
                        f"integrals, {spelled}, and fields made by sympy.Function(<identifier>)")
            return f"{_class(node)}, not a SymPy class the printers know; only SymPy's own classes (exact, no " \
                   "subclass) may be printed into emitted code"
    return None


def _plain(text: object) -> str:
    """``text`` as an exact ``str`` without calling anything it overrides (cut for a one-line message)."""
    return str.__str__(text)[:64] if isinstance(text, str) else f"<{type(text).__name__}>"


def _class(node: sp.Basic) -> str:
    """``node`` named by its class (and its name, for a symbol): ``the node 'eps' of class Eps (module m)``."""
    cls = type(node)
    name = getattr(node, "name", None) if isinstance(node, sp.Symbol) else None
    shown = f"the node {_plain(name)!r} of class" if isinstance(name, str) else "a node of class"
    return f"{shown} {_plain(cls.__name__)} (module {_plain(cls.__module__)})"


def check_expression(expr: object, what: str, functions: frozenset = FUNCTIONS) -> None:
    """``SplitformerError`` starting with ``what`` unless every node of ``expr`` is a class the printers know."""
    from .errors import SplitformerError

    wrong = untrusted_node(expr, functions)
    if wrong is not None:
        raise SplitformerError(f"{what}: {wrong}")
