"""Spatial discretization: uniform grids and the rectangle rule, applied to SymPy expressions.

A continuous expression is built from applied functions of grid variables (``u(x, ξ)``),
integrals over whole domains (``∫_{Ω_y} … dξ``) and domain measures ``|Ω|``. The rules:

- ``∫_Ω f(ξ) dξ  →  Δ Σ_k f_k`` (rectangle rule on a uniform grid);
- ``|Ω| → N Δ``; a coordinate used as a value (``θ^{−2r/|Ω_e|}``) → ``k Δ`` at grid point ``k``;
- ``f(x, ξ) → f[i, k]`` for a field; a *kernel* stores its values times the spacings of the
  variables it is integrated against, ``K[i, k] = Δξ K(x_i, ξ_k)``, so the quadrature
  weight is absorbed into the learned (or derived) array.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy as sp
from sympy.core.function import AppliedUndef

from .domains import Variable
from .program import Number

__all__ = ["Grid", "integral"]


def integral(body: sp.Expr, variable: Variable) -> sp.Integral:
    """``∫_{Ω} body d<variable>`` over the whole domain of ``variable``."""
    return sp.Integral(body, (variable.symbol, 0, variable.domain.measure))


def _sum(body: sp.Expr, variable: Variable) -> sp.Expr:
    """``Σ_k body`` with the factors that do not depend on ``k`` taken out (linearity), but for steps and δs: a mask
    that reads the query alone (``H(p(x) − 3)``) stays in the sum, so that in a normalizer it makes the support empty,
    not a factor outside that cancels against the numerator's (a full softmax where the weights are 0). The lowering
    takes it out where what remains is a contraction (``codegen.nested_sums``)."""
    index = variable.index
    constant, dependent = [], []
    for factor in sp.Mul.make_args(body):
        masks = isinstance(factor, (sp.Heaviside, sp.KroneckerDelta)) and factor.has(sp.Indexed, sp.Idx)
        (dependent if factor.has(index) or masks else constant).append(factor)
    return sp.Mul(*constant) * sp.Sum(sp.Mul(*dependent), (index, 0, variable.domain.size - 1))


@dataclass
class Grid:
    """Maps continuous variables to grid indices and functions to discrete arrays."""

    variables: Mapping[sp.Symbol, Variable]
    arrays: Mapping[str, sp.IndexedBase]
    absorbed: Mapping[str, tuple[sp.Symbol, ...]] = field(default_factory=dict)

    def absorption(self, function: str, arguments: tuple[sp.Expr, ...]) -> sp.Expr:
        """Product of the spacings a kernel absorbs (1 for a field)."""
        positions = self.absorbed.get(function, ())
        factor = sp.Integer(1)
        for argument in arguments:
            if argument in positions:
                factor *= self.variables[argument].domain.spacing
        return factor

    def __call__(self, expr: sp.Expr) -> sp.Expr:
        return self._discretize(expr)

    def _discretize(self, expr: sp.Expr) -> sp.Expr:
        if isinstance(expr, sp.Integral):
            return self._integral(expr)
        if isinstance(expr, AppliedUndef):
            return self._sample(expr)
        if isinstance(expr, sp.Symbol):
            if expr in self.variables:
                variable = self.variables[expr]
                return variable.index * variable.domain.spacing
            for variable in self.variables.values():
                if expr == variable.domain.measure:
                    return variable.domain.size * variable.domain.spacing
            return expr
        if not expr.args:
            return expr
        return expr.func(*(self._discretize(argument) for argument in expr.args))

    def _integral(self, expr: sp.Integral) -> sp.Expr:
        body = expr.function
        result = None
        for limit in reversed(expr.limits):
            variable = self.variables[limit[0]]
            if limit[1:] != (0, variable.domain.measure):
                raise ValueError(f"integral over {limit} is not over a whole domain")
            inner = self._discretize(body) if result is None else result
            result = variable.domain.spacing * _sum(inner, variable)
        return result

    def _sample(self, expr: AppliedUndef) -> sp.Expr:
        name = expr.func.__name__
        indices = []
        for argument in expr.args:
            if argument not in self.variables:
                raise ValueError(f"{name} is not sampled at grid variables: {expr}")
            indices.append(self.variables[argument].index)
        array = self.arrays[name]
        value = array[tuple(indices)] if indices else Number(array)  # a control with no axis: its one number
        return value / self.absorption(name, expr.args)
