"""Quotients by ``1 + e^{s}`` written as logistic functions σ, which no exponential's overflow makes NaN.

A plug-in's sigmoid ``1/(1 + e^{−a})`` has the derivative ``e^{−a}/(1 + e^{−a})²``, as SymPy writes it: where ``e^{−a}``
overflows (``a`` below −709 in float64, −88 in float32) that is ``∞/∞``, NaN, where the derivative is 0. Each factor
``(1 + e^{s})^{−q}`` of a product, with a factor ``e^{p s}`` for some ``0 < p ≤ q`` (or ``e^{p s + r}``, whose ``e^{r}``
stays) or none (``p = 0``), is written

    e^{p s}/(1 + e^{s})^q = σ(s)^p σ(−s)^{q−p},   σ(x) = 1/(1 + e^{−x}),

since ``e^{p s}/(1 + e^{s})^p = 1/(e^{−s}(1 + e^{s}))^p = σ(s)^p`` (an identity; ``tests/test_logistic.py`` checks it
with SymPy). Every σ lies in [0, 1], so the product is finite wherever its other factors are; torch spells σ
``torch.sigmoid``, whose autograd is ``σ(1 − σ)`` (autograd of the formula as written was NaN there too). No pass: it
is never switched off, as ``bool_values`` is not.
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from .ir import Elementwise, Module, Reduction, Sigmoid, Where

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
    """``(s, q)`` of a factor ``(1 + e^{s})^{−q}`` with ``q`` a positive number; else None. A denominator that
    ``bool_values`` reads as 1 where a support is empty, ``Where(m, 1 + e^{s}, 1)``, is one too: ``1 + e^{s}`` is never
    0, and σ never NaN, so the guard has nothing to guard (a sigmoid kernel averaged over the keys, ``χ σ(a)/∫ χ dη``:
    left unpaired, torch's autograd of ``1/(1 + e^{−a})`` was NaN below a = −88 in float32)."""
    if not (isinstance(factor, sp.Pow) and factor.exp.is_number and factor.exp.is_negative):
        return None
    base = factor.base
    if isinstance(base, Where) and base.args[2] == 1:
        base = base.args[1]
    terms = sp.Add.make_args(base)
    if len(terms) != 2 or sp.Integer(1) not in terms:
        return None
    exponential = terms[1 - terms.index(sp.Integer(1))]
    return (exponential.args[0], -factor.exp) if isinstance(exponential, sp.exp) else None


def _multiple(t: sp.Expr, s: sp.Expr) -> tuple[sp.Expr, sp.Expr] | None:
    """``(p, r)`` with ``t = p s + r``, ``p`` a number and ``r`` holding none of ``s``'s terms, or None. Both sides
    expanded: ``e^{2(a + b)}`` is written ``e^{2a + 2b}``, and SymPy merges ``e^{2s} e^{c}`` into ``e^{2s + c}``.
    Each of ``s``'s terms must appear in ``t`` with the same ratio, so a split that reads a term as a multiple of
    another (``3a + 10`` as ``3(a + 1) + 7``) is not found: that factor is left as it is (finite or not, as before)."""
    t_terms = dict(reversed(term.as_coeff_Mul()) for term in sp.Add.make_args(sp.expand(t)))
    ratios = set()
    for term in sp.Add.make_args(sp.expand(s)):
        coefficient, monomial = term.as_coeff_Mul()
        if monomial not in t_terms:
            return None
        ratios.add(t_terms[monomial] / coefficient)
    if len(ratios) != 1:
        return None
    p = ratios.pop()
    return p, sp.expand(t - p * s)


def _product(product: sp.Mul) -> sp.Expr:
    factors = list(product.args)
    result = []
    for position, factor in enumerate(factors):
        logistic = _logistic(factor)
        if logistic is None:
            continue
        s, q = logistic
        power = next(((index, *split) for index, other in enumerate(factors) if isinstance(other, sp.exp)
                      for split in [_multiple(other.args[0], s)] if split is not None and 0 < split[0] <= q), None)
        factors[position] = sp.Integer(1)
        if power is not None:  # e^{p s + r} (1 + e^s)^{-q} = σ(s)^p σ(−s)^{q−p} e^r
            index, p, rest = power
            factors[index] = sp.exp(rest)
            result.append(Sigmoid(with_sigmoids(s)) ** p)
        p = power[1] if power is not None else 0
        if q - p:
            result.append(Sigmoid(-with_sigmoids(s)) ** (q - p))
    return sp.Mul(*result, *(with_sigmoids(factor) for factor in factors))
