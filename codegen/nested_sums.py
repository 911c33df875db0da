"""Sums over several indices nested so that each factor is summed only over the indices it reads.

``Σ_{i,j,n} (p_i − p_n) w_{ijl} w_{inl} w̄_{ijl}`` (the adjoint of a normalized kernel with respect to a parameter
inside it) is ``Σ_i (Σ_n (p_i − p_n) w_{inl}) (Σ_j w_{ijl} w̄_{ijl})``: the product over ``(i, j, n, l)`` that the
first form materializes is cubic in the tokens, each inner sum of the second quadratic. This is variable elimination:
an index is summed first over the factors that read it, where that leaves some factor out, the index whose sum
spans the fewest axes first. The lowering takes the nested form only where it spans fewer axes than the flat one.
"""

from __future__ import annotations

import sympy as sp

from .bool_values import is_bool, is_denominator

__all__ = ["nested_sums", "widest"]


def nested_sums(expr: sp.Expr, masks: frozenset[str] = frozenset()) -> sp.Expr:
    """``expr`` with every sum nested (``_nested``) where that shrinks the widest product it sums, else as it is;
    ``masks``: the arrays computed from bools alone (a step written as a definition), masks as steps are."""
    if not expr.has(sp.Sum):
        return expr
    return expr.replace(lambda node: isinstance(node, sp.Sum), lambda total: _nested_if_narrower(total, masks))


def widest(expr: sp.Expr) -> int:
    """The most axes (indices) any summand of ``expr`` spans: the size, in axes, of its largest product."""
    return max((len(_axes(total.function)) for total in expr.atoms(sp.Sum)), default=0)


def _nested_if_narrower(total: sp.Sum, masks: frozenset[str]) -> sp.Expr:
    if len(total.limits) == 1 and not isinstance(total.function, sp.Sum) and all(
            total.limits[0][0] in factor.free_symbols for factor in sp.Mul.make_args(total.function)):
        return total  # one index every factor reads: nothing to take out
    flat = _flattened(total)
    nested = _nested(_glued(sp.Mul.make_args(flat.function), masks), list(flat.limits))
    narrower = widest(nested) < widest(flat)
    return nested if narrower or (widest(nested) == widest(flat) and _contraction_freed(flat, nested)) else total


def _contraction_freed(flat: sp.Sum, nested: sp.Expr) -> bool:
    """``nested`` takes steps or δs out of ``flat`` (which sums them with arrays) and leaves a sum of a product of array
    reads alone, a contraction (a GEMM: a step of the query inside a linear map, ``∫ H(p(x) − 3) W(ξ, y) u(x, ξ) dξ``).
    A normalizer's sum, ``Σ_n H χ e^a``, keeps its steps: outside, they cancel against the numerator's."""
    outside = [factor for factor in sp.Mul.make_args(nested) if not factor.has(sp.Sum)]
    sums = nested.atoms(sp.Sum)
    return bool(outside) and all(is_bool(factor) or factor.is_number for factor in outside) and len(sums) == 1 and \
        all(isinstance(factor, sp.Indexed) for factor in sp.Mul.make_args(next(iter(sums)).function)) and \
        not isinstance(flat.function, sp.Indexed)


def _glued(factors: tuple[sp.Expr, ...], masks: frozenset[str]) -> tuple[sp.Expr, ...]:
    """``factors`` with its masks (steps, δs, supports, arrays of ``masks``) and its denominators as one factor, where
    it has both: a quotient is 0 where its masks are (``codegen.bool_values``), the evaluators' rule for a normalizer
    that an empty support makes 0, only while the masks and the denominator stand in one product (apart, an empty
    row's inner sum over the masks is 0 and the normalizer outside it 0: 0/0)."""
    def mask(factor: sp.Expr) -> bool:
        return is_bool(factor) or (isinstance(factor, sp.Indexed) and str(factor.base.label) in masks)

    glued = [factor for factor in factors if mask(factor) or is_denominator(factor)]
    if not any(map(mask, glued)) or all(map(mask, glued)):
        return factors
    return (sp.Mul(*glued, evaluate=False), *(factor for factor in factors if factor not in glued))


def _flattened(total: sp.Sum) -> sp.Sum:
    """``Σ_a Σ_b f`` as ``Σ_{a,b} f``."""
    limits = list(total.limits)
    body = total.function
    while isinstance(body, sp.Sum):
        limits += body.limits
        body = body.function
    return sp.Sum(body, *limits)


def _nested(factors: tuple[sp.Expr, ...], limits: list[tuple]) -> sp.Expr:
    """``Σ_limits Π factors`` by variable elimination; a limit whose bounds read another summed index stays outside."""
    summed = {limit[0] for limit in limits}
    if any(summed & (sp.Tuple(*limit[1:]).free_symbols) for limit in limits):
        return sp.Sum(sp.Mul(*factors), *limits)
    factors = list(factors)
    while limits:
        candidates = [_elimination(limit, factors, limits) for limit in limits]
        candidates = [candidate for candidate in candidates if candidate is not None]
        if not candidates:
            break
        _, reading, inner = min(candidates, key=lambda candidate: candidate[0])
        factors = [factor for factor in factors if not any(factor is r for r in reading)]
        factors.append(_nested(tuple(reading), inner) if len(inner) > 1 else sp.Sum(sp.Mul(*reading), *inner))
        limits = [limit for limit in limits if limit not in inner]
    return sp.Mul(*factors) if not limits else sp.Sum(sp.Mul(*factors), *limits)


def _elimination(limit: tuple, factors: list[sp.Expr], limits: list[tuple]):
    """Summing ``limit``'s index first: (the axes its sum spans, the factors it reads, the limits summed with it:
    those no other factor reads), or None where every factor reads it, or where the sum would keep no axis (a
    batched factor's sum is per batch entry, an axis no index names)."""
    reading = [factor for factor in factors if limit[0] in factor.free_symbols]
    if len(reading) == len(factors):
        return None
    span = set().union(*(_axes(factor) for factor in reading))
    others = set().union(*(_axes(factor) for factor in factors if not any(factor is r for r in reading)))
    inner = [other for other in limits if other[0] in span and other[0] not in others]
    if not span - {other[0] for other in inner}:
        return None
    return len(span), reading, inner


def _axes(expr: sp.Expr) -> set[sp.Idx]:
    return {symbol for symbol in expr.free_symbols if isinstance(symbol, sp.Idx)}
