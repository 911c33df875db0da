"""Bool values as numbers where the arithmetic needs numbers.

A step ``θ(v, 0)``, a δ and the support χ print as comparisons and masks: bool arrays. A bool array is a number
only as a factor of a product with a floating array (ReLU's adjoint ``θ(s, 0) λ``). Anywhere else it is not:

- two bools add as "or" (NumPy and torch), so ``θ(a) + θ(b)`` is 1 where both hold, not 2;
- a sum of bools counts in int64, and torch divides two integer or bool arrays in its default dtype (float32)
  whatever the state's; torch's einsum takes no bool;
- a Python number times a torch bool array is float32 (a third rounded, read with a float64 state), and NumPy's
  float64 (a float32 state's result widened).

``as_numbers`` rewrites every formula of a module so that such a bool value is ``Numbers(value)``: the value cast
to the state's dtype (it reads the state ``u0`` for its dtype, as a grid coordinate does). A step whose value at 0
is neither 0 nor 1 becomes ``θ(v, 0) + c δ(v, 0)``.

The evaluators' product rule (a factor exactly 0 makes the product 0 before any reciprocal is taken) holds in the
emitted code where a formula may divide by 0 because a support is empty: ``Masked(m, v)`` is ``v`` where ``m`` is not
0, exactly 0 elsewhere. A bool factor of a product that divides by an array masks it (a strictly causal running
mean's weight ``θ(p(x) − p(x̃), 0) / ∫ θ(p(x) − p(η), 0) dη`` is 0 at the first token, which sees no earlier one);
so does the rest of a product that divides by a count of bools (``∫ χ u dx̃ / ∫ χ dη``, 0 where that sum over an
empty support is). A mean over no key is then 0, as the softmax's row of an empty support is, not ``0/0``.

It runs after the passes (which match the steps as they stand) on every module, and is no pass: it is never switched
off.
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from splitformer.symbolic.inputs import MEMORY_SUPPORT
from splitformer.symbolic.operators import SUPPORT

from .ir import Contraction, Elementwise, Masked, Module, Numbers, Reduction

__all__ = ["as_numbers", "is_bool", "SUPPORTS"]

#: The masks a formula may read: the tokens' support χ and the memory's χ_m (bool, or 0 and 1 in the state's dtype
#: where a module casts it once to read it as a factor).
SUPPORTS = (SUPPORT, MEMORY_SUPPORT.name)


def as_numbers(module: Module) -> Module:
    """``module`` with each formula's bool values cast where they are not a floating product's factor, and its
    quotients by counts of a support masked where their numerator is 0."""
    rewrite, ops = _Rewrite(), []
    for op in module.ops:
        if isinstance(op, Elementwise):
            rewrite.note(op.out, op.expr)
            expr = rewrite(op.expr)
            op = op if expr == op.expr else replace(op, expr=expr, reuse=None)
        elif isinstance(op, Reduction):
            rewrite.note(op.out, op.body)
            body = rewrite(op.body)
            op = op if body == op.body else replace(op, body=body)
        elif isinstance(op, Contraction) and all(name in SUPPORTS or name in rewrite.counts for name in op.reads()):
            rewrite.counts.add(op.out)  # a product of supports summed: two-hop reach
        ops.append(op)
    return replace(module, ops=ops)


def _steps(expr: sp.Expr) -> sp.Expr:
    """Each step ``θ(v, c)`` with ``c`` neither 0 nor 1 as ``θ(v, 0) + c δ(v, 0)`` (a comparison prints ``v > 0``
    or ``v ≥ 0`` only)."""
    def split(step: sp.Heaviside) -> sp.Expr:
        value, *at_zero = step.args
        c = at_zero[0] if at_zero else sp.Rational(1, 2)
        if c in (0, 1):
            return sp.Heaviside(value, c)
        return sp.Heaviside(value, 0) + c * sp.KroneckerDelta(value, 0, evaluate=False)
    return expr.replace(lambda e: isinstance(e, sp.Heaviside), split)


def is_bool(expr: sp.Expr) -> bool:
    """``expr`` prints as a bool array: a step, a δ or a support read, or a product of such."""
    if isinstance(expr, sp.Mul):
        return all(is_bool(factor) for factor in expr.args)
    return (isinstance(expr, (sp.Heaviside, sp.KroneckerDelta)) and expr.has(sp.Indexed, sp.Idx)) or (
        isinstance(expr, sp.Indexed) and str(expr.base.label) in SUPPORTS)


def _floating(expr: sp.Expr) -> bool:
    """``expr`` reads a floating array (a state, a parameter, the positions, a grid coordinate) outside any bool."""
    if is_bool(expr) or isinstance(expr, Numbers):
        return isinstance(expr, Numbers)
    if isinstance(expr, (sp.Indexed, sp.Idx)):
        return True
    return any(_floating(argument) for argument in expr.args if isinstance(argument, sp.Expr))


def _reciprocal(expr: sp.Expr) -> bool:
    """``expr`` divides by an array (which may be 0 where a bool factor of its product is)."""
    return any(power.exp.is_negative and power.base.has(sp.Indexed, sp.Idx) for power in expr.atoms(sp.Pow))


class _Rewrite:
    """The rewrite of one module's formulas, in order; ``counts``: the arrays computed from bools alone (a count of
    a support, 0 where it is empty)."""

    def __init__(self):
        self.counts: set[str] = set()

    def note(self, name: str, formula: sp.Expr) -> None:
        """``name`` is a count where ``formula`` reads bools and counts alone."""
        if formula.has(sp.Indexed) and self.counted(formula):
            self.counts.add(name)

    def counted(self, expr: sp.Expr) -> bool:
        """``expr`` is a number of bools and counts alone."""
        if is_bool(expr) or expr.is_number:
            return True
        if isinstance(expr, sp.Indexed):
            return str(expr.base.label) in self.counts
        return not isinstance(expr, sp.Idx) and bool(expr.args) and all(self.counted(argument) for argument in expr.args)

    def __call__(self, expr: sp.Expr) -> sp.Expr:
        expr = _steps(expr)
        return Numbers(expr) if is_bool(expr) else self.numbers(expr)

    def numbers(self, expr: sp.Expr) -> sp.Expr:
        if is_bool(expr) or not isinstance(expr, sp.Expr) or not expr.args or isinstance(expr, (sp.Indexed, Numbers)):
            return expr
        if isinstance(expr, sp.Mul):
            return self.product(expr)
        arguments = [Numbers(argument) if is_bool(argument) else self.numbers(argument) for argument in expr.args]
        return expr if arguments == list(expr.args) else expr.func(*arguments)

    def product(self, expr: sp.Mul) -> sp.Expr:
        """Bool factors kept bare only beside a floating array and no fraction; a product dividing by an array
        masked by its bools, or one dividing by a count masked where its other factors are 0."""
        bools = [factor for factor in expr.args if is_bool(factor)]
        others = [self.numbers(factor) for factor in expr.args if not is_bool(factor)]
        if bools and _reciprocal(sp.Mul(*others)):
            return Masked(sp.Mul(*bools), sp.Mul(*others))
        exact = all(factor.is_Integer or not factor.is_number for factor in others)
        if bools and not (exact and any(_floating(factor) for factor in others)):
            bools = [Numbers(sp.Mul(*bools))]
        numerator = [factor for factor in others if not self.count_reciprocal(factor)]
        if not bools and len(numerator) < len(others) and _floating(sp.Mul(*numerator)):
            return Masked(sp.Mul(*numerator), sp.Mul(*others))
        arguments = [*bools, *others]
        return expr if sorted(arguments, key=sp.default_sort_key) == sorted(expr.args, key=sp.default_sort_key) \
            else sp.Mul(*arguments)

    def count_reciprocal(self, factor: sp.Expr) -> bool:
        """``factor`` divides by a count of a support (a mean's ``1/∫ χ``)."""
        return isinstance(factor, sp.Pow) and factor.exp.is_negative is True and factor.base.has(sp.Indexed) \
            and self.counted(factor.base)
