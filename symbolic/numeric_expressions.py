"""SymPy expressions of a program compiled to closures over mpmath numbers.

``evaluate(..., digits=n)`` computes every entry in ``n``-digit arithmetic. Writing each
``Sum`` out as SymPy terms and rounding afterwards builds, canonicalizes and discards a SymPy
object per term, which costs a dense 16-stage tableau minutes; the closures here do the same
arithmetic on mpmath numbers directly (tens of times cheaper). Sums run over their ranges
with the index bound in an environment, array entries are read through ``lookup``; a
function without an mpmath counterpart in the table is evaluated by SymPy at its numeric
arguments (slower, still exact to ``n`` digits).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable

import mpmath
import sympy as sp

from .errors import NotReal

__all__ = ["compile_numeric", "as_number", "work", "real_valued"]

#: ``env`` maps index symbols to integers; a closure returns an ``int``, ``mpf`` or ``bool``.
Closure = Callable[[dict], object]

def real_valued(function: Callable, name: str) -> Callable:
    """``function`` of an mpmath number, refusing a complex result (``NotReal``) instead of carrying it on."""

    def real(*arguments):
        result = function(*arguments)
        if isinstance(result, mpmath.mpc):
            shown = ", ".join(mpmath.nstr(argument, 6) for argument in arguments)
            raise NotReal(f"{name}({shown}) has no real value")
        return result

    return real


_FUNCTIONS = {sp.exp: mpmath.exp, sp.log: real_valued(mpmath.log, "log"), sp.tanh: mpmath.tanh, sp.erf: mpmath.erf,
              sp.sin: mpmath.sin, sp.cos: mpmath.cos, sp.Abs: abs, sp.sign: mpmath.sign}
_SQRT, _POWER = real_valued(mpmath.sqrt, "sqrt"), real_valued(lambda base, exponent: base ** exponent, "power")
_RELATIONS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
              "==": operator.eq, "!=": operator.ne}


def as_number(value, digits: int):
    """An input entry as an ``int`` or an mpmath number (SymPy numbers rounded to ``digits``)."""
    if isinstance(value, (int, mpmath.mpf)) and not isinstance(value, bool):
        return value
    number = sp.N(value, digits)
    if not number.is_number or not number.is_real:
        raise ValueError(f"not a real number: {sp.sstr(value)[:80]}")
    return int(number) if number.is_Integer else mpmath.mpf(number)


def compile_numeric(expr: sp.Expr, lookup: Callable[[str, tuple[int, ...]], object], digits: int) -> Closure:
    """``expr`` as a closure of an index environment; call it (and compile it) inside ``mpmath.workdps(digits)``."""

    def build(node) -> Closure:
        if isinstance(node, sp.Sum):
            return _sum(build(node.function), [(index, int(lower), int(upper)) for index, lower, upper in node.limits])
        if isinstance(node, sp.Indexed):
            name, indices = str(node.base.label), [build(index) for index in node.indices]
            return lambda env: lookup(name, tuple(int(index(env)) for index in indices))
        if isinstance(node, (sp.Idx, sp.Symbol)):
            return lambda env: env[node]
        if node.is_Integer:
            value = int(node)
            return lambda env: value
        if node.is_number and not node.args or node.is_Rational:
            value = as_number(node, digits)
            return lambda env: value
        if node in (sp.true, sp.false):
            truth = bool(node)
            return lambda env: truth
        if isinstance(node, sp.Piecewise):
            pieces = [(build(expression), build(condition)) for expression, condition in node.args]
            return lambda env: next(expression(env) for expression, condition in pieces if condition(env))
        arguments = [build(argument) for argument in node.args]
        if isinstance(node, sp.Add):
            return lambda env: sum(argument(env) for argument in arguments)
        if isinstance(node, sp.Mul):
            reciprocal = [isinstance(factor, sp.Pow) and factor.exp.is_negative is True for factor in node.args]
            factors = [argument for _, argument in sorted(zip(reciprocal, arguments), key=lambda pair: pair[0])]
            return lambda env: _product(factors, env)
        if isinstance(node, sp.Pow):
            base, exponent = arguments
            if node.exp == sp.Rational(1, 2):
                return lambda env: _SQRT(base(env))
            return lambda env: _POWER(mpmath.mpf(base(env)), exponent(env))
        if isinstance(node, (sp.Max, sp.Min)):
            choose = max if isinstance(node, sp.Max) else min
            return lambda env: choose(argument(env) for argument in arguments)
        if isinstance(node, sp.Heaviside):
            half = mpmath.mpf(1) / 2
            value, at_zero = arguments if len(arguments) == 2 else (arguments[0], lambda env: half)
            return lambda env: _step(value(env), at_zero(env))
        if isinstance(node, sp.core.relational.Relational):
            relation, (left, right) = _RELATIONS[node.rel_op], arguments
            return lambda env: relation(left(env), right(env))
        if isinstance(node, (sp.And, sp.Or)):
            combine = all if isinstance(node, sp.And) else any
            return lambda env: combine(argument(env) for argument in arguments)
        if isinstance(node, sp.Not):
            return lambda env: not arguments[0](env)
        if node.func in _FUNCTIONS:
            function = _FUNCTIONS[node.func]
            return lambda env: function(*(argument(env) for argument in arguments))
        if isinstance(node, sp.Function) and node.func.__module__.startswith("sympy."):
            func = node.func
            return lambda env: as_number(func(*(sp.Float(argument(env), digits) for argument in arguments)), digits)
        raise ValueError(f"cannot evaluate {type(node).__name__} numerically: {sp.sstr(node)[:80]}")

    return build(expr)


def work(expr: sp.Expr) -> int:
    """How many closures one evaluation of ``compile_numeric(expr)`` calls (a ``Sum`` counts its body once per term)."""
    if isinstance(expr, sp.Sum):
        terms = 1
        for _, lower, upper in expr.limits:
            terms *= max(0, int(upper) - int(lower) + 1)
        return 1 + terms * work(expr.function)
    if isinstance(expr, sp.Piecewise):
        return 1 + sum(work(expression) + work(condition) for expression, condition in expr.args)
    if isinstance(expr, sp.Indexed):
        return 1 + sum(map(work, expr.indices))
    if isinstance(expr, (sp.Idx, sp.Symbol)) or not expr.args or expr.is_Rational:
        return 1
    return 1 + sum(map(work, expr.args))


def _sum(body: Closure, limits: list[tuple[sp.Symbol, int, int]]) -> Closure:
    indices = [index for index, _, _ in limits]
    ranges = [range(lower, upper + 1) for _, lower, upper in limits]

    def run(env: dict):
        outer = {index: env[index] for index in indices if index in env}
        total = 0
        for values in itertools.product(*ranges):
            env.update(zip(indices, values))
            total += body(env)
        for index in indices:
            env.pop(index, None)
        env.update(outer)
        return total

    return run


def _product(factors: list[Closure], env: dict):
    """The factors' product, reciprocals last: one exactly 0 makes it 0 before any reciprocal is taken (a step or mask
    outside its support times ``1/∫`` of that support, empty there), as the semantic evaluators' products and the
    emitted code's ``Masked`` are."""
    result = 1
    for factor in factors:
        if result == 0:
            return result
        result = result * factor(env)
    return result


def _step(value, at_zero):
    return 1 if value > 0 else 0 if value < 0 else at_zero
