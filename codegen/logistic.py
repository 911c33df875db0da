"""Quotients by ``1 + e^{s}`` written as logistic functions σ, which no exponential's overflow makes NaN.

A plug-in's sigmoid ``1/(1 + e^{−a})`` has the derivative ``e^{−a}/(1 + e^{−a})²``, as SymPy writes it: where ``e^{−a}``
overflows (``a`` below −709 in float64, −88 in float32) that is ``∞/∞``, NaN, where the derivative is 0. Each factor
``(1 + e^{s})^{−q}`` of a product, with a factor ``e^{p s}`` for some ``0 < p ≤ q`` or none (``p = 0``), is written

    e^{p s}/(1 + e^{s})^q = σ(s)^p σ(−s)^{q−p},   σ(x) = 1/(1 + e^{−x}),

since ``e^{p s}/(1 + e^{s})^p = 1/(e^{−s}(1 + e^{s}))^p = σ(s)^p`` (an identity; ``tests/test_logistic.py`` checks it
with SymPy). Every σ lies in [0, 1], so the product is finite wherever its other factors are; torch spells σ
``torch.sigmoid``, whose autograd is ``σ(1 − σ)`` (autograd of the formula as written was NaN there too). No pass: it
is never switched off, as ``bool_values`` is not.
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from .ir import Elementwise, Module, Reduction, Sigmoid

__all__ = ["sigmoids", "with_sigmoids"]


def sigmoids(module: Module) -> Module:
    """``module`` with each formula's quotients by ``1 + e^{s}`` as logistic functions (``with_sigmoids``)."""
    ops = []
    for op in module.ops:
        if isinstance(op, Elementwise):
            expr = with_sigmoids(op.expr)
            op = op if expr == op.expr else replace(op, expr=expr, reuse=None)
        elif isinstance(op, Reduction):
            body = with_sigmoids(op.body)
            op = op if body == op.body else replace(op, body=body)
        ops.append(op)
    return replace(module, ops=ops)


def with_sigmoids(expr: sp.Expr) -> sp.Expr:
    """``expr`` with every ``e^{p s} (1 + e^{s})^{−q}`` (``0 ≤ p ≤ q``) as ``σ(s)^p σ(−s)^{q−p}``."""
    if not expr.args:
        return expr
    if isinstance(expr, sp.Mul):
        return _product(expr)
    logistic = _logistic(expr)
    if logistic is not None:
        return Sigmoid(-with_sigmoids(logistic[0])) ** logistic[1]
    return expr.func(*(with_sigmoids(argument) for argument in expr.args))


def _logistic(factor: sp.Expr) -> tuple[sp.Expr, sp.Expr] | None:
    """``(s, q)`` of a factor ``(1 + e^{s})^{−q}`` with ``q`` a positive number; else None."""
    if not (isinstance(factor, sp.Pow) and factor.exp.is_number and factor.exp.is_negative):
        return None
    terms = sp.Add.make_args(factor.base)
    if len(terms) != 2 or sp.Integer(1) not in terms:
        return None
    exponential = terms[1 - terms.index(sp.Integer(1))]
    return (exponential.args[0], -factor.exp) if isinstance(exponential, sp.exp) else None


def _multiple(t: sp.Expr, s: sp.Expr) -> sp.Expr | None:
    """The number ``p`` with ``t = p s``, or None: ``e^{2(a + b)}`` is written ``e^{2a + 2b}``, which SymPy's ``t/s``
    leaves unreduced where ``s`` is a sum (a summed temporary plus a bias, as lowered formulas nearly always are)."""
    p = sp.cancel(sp.expand(t) / sp.expand(s))
    return p if p.is_number else None


def _product(product: sp.Mul) -> sp.Expr:
    factors = list(product.args)
    result = []
    for position, factor in enumerate(factors):
        logistic = _logistic(factor)
        if logistic is None:
            continue
        s, q = logistic
        power = next(((index, p) for index, other in enumerate(factors) if isinstance(other, sp.exp)
                      for p in [_multiple(other.args[0], s)] if p is not None and 0 < p <= q), None)
        factors[position] = sp.Integer(1)
        if power is not None:
            factors[power[0]] = sp.Integer(1)
            result.append(Sigmoid(with_sigmoids(s)) ** power[1])
        p = power[1] if power is not None else 0
        if q - p:
            result.append(Sigmoid(-with_sigmoids(s)) ** (q - p))
    return sp.Mul(*result, *(with_sigmoids(factor) for factor in factors))
