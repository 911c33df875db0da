"""Bool values as numbers where the arithmetic needs numbers, and quotients that are 0 where a support is empty.

A step ``θ(v, 0)``, a δ and the support χ print as comparisons and masks: bool arrays. A bool array is a number
only as a factor of a product with a floating array (ReLU's adjoint ``θ(s, 0) λ``). Anywhere else it is not:

- two bools add as "or" (NumPy and torch), so ``θ(a) + θ(b)`` is 1 where both hold, not 2;
- a sum of bools counts in int64, and torch divides two integer or bool arrays in its default dtype (float32)
  whatever the state's; torch's einsum takes no bool;
- a Python number times a torch bool array is float32 (a third rounded, read with a float64 state), and NumPy's
  float64 (a float32 state's result widened); ``-`` of a bool array is an error in both.

``as_numbers`` rewrites every formula of a module so that such a bool value is ``Numbers(value, like)``: the value
cast to the dtype of the array ``like`` (the state ``u0``; in a derived adjoint, the output's costate, so that the
backward keeps no input for its dtype). A step whose value at 0 is neither 0 nor 1 becomes ``θ(v, 0) + c δ(v, 0)``.

The evaluators' product rule (a factor exactly 0 makes the product 0 before any reciprocal is taken) holds in the
emitted code where a formula divides by 0 because a support is empty: ``Where(m, v, 0)``, ``v`` where ``m`` is not 0
and exactly 0 elsewhere, with each denominator of ``v`` read as ``Where(m, d, 1)`` there, so that neither the value
nor torch's autograd through it divides by 0. ``m`` is
- the factors of bools and counts of a product that divides by an array (a step, χ, a window's
  ``θ(v, 0) + δ(v, 0)/2``): a strictly causal running mean's weight ``θ(p(x) − p(x̃), 0) / ∫ θ(p(x) − p(η), 0) dη``
  is 0 at the first token, which sees no earlier one;
- the counts (arrays of bools alone: ``∫ χ dη``) a product divides by, where another factor is a sum over a support
  (``∫ χ u dx̃``, 0 where the support is empty): the support mean ``∫ χ u dx̃ / ∫ χ dη``.
A mean over no key is then 0, as the softmax's row of an empty support is, not ``0/0``; a quotient whose numerator
is no sum over the support (``u / ∫ χ``) is left as the formula says (∞ where the count is 0).

It runs after the passes (which match the steps as they stand) on every module, and is no pass: it is never switched
off.
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from splitformer.symbolic.adjoint import is_plain
from splitformer.symbolic.inputs import MEMORY_SUPPORT
from splitformer.symbolic.operators import SUPPORT

from .ir import BATCH, Contraction, Elementwise, Mask, Module, Numbers, Op, Reduction, Where

__all__ = ["as_numbers", "state_numbers", "with_dtype_of", "is_bool", "is_denominator", "counted", "SUPPORTS"]

#: The masks a formula may read: the tokens' support χ and the memory's χ_m (bool, or 0 and 1 in the state's dtype
#: where a module casts it once to read it as a factor).
SUPPORTS = (SUPPORT, MEMORY_SUPPORT.name)
#: The array whose dtype a bool value takes (``with_dtype_of`` names another).
_STATE = sp.Symbol("u0")


def as_numbers(module: Module) -> Module:
    """``module`` with each formula's bool values cast where they are not a floating product's factor, and its
    quotients that divide by 0 on an empty support made 0 there."""
    rewrite, ops = _Rewrite(), []
    for op in module.ops:
        if isinstance(op, Elementwise):
            rewrite.note(op.out, op.expr)
            expr = rewrite(op.expr)
            op = op if expr == op.expr else replace(op, expr=expr, reuse=None)
        elif isinstance(op, Reduction):
            rewrite.note(op.out, op.body, op.axis, op.labels)
            body = rewrite(op.body)
            op = op if body == op.body else replace(op, body=body)
        elif isinstance(op, Contraction):
            rewrite.note_contraction(op)
        ops.append(op)
    return replace(module, ops=ops)


def state_numbers(bools: sp.Expr) -> Numbers:
    """``bools`` as numbers in the state's dtype (``with_dtype_of`` names another array)."""
    return Numbers(bools, _STATE)


def with_dtype_of(op: Op, name: str) -> Op:
    """``op`` with its bool values cast to the dtype of the array ``name`` instead of the state's."""
    def cast(formula: sp.Expr) -> sp.Expr:
        return formula.replace(lambda e: isinstance(e, Numbers), lambda e: Numbers(e.args[0], sp.Symbol(name)))

    if isinstance(op, Elementwise) and op.expr.has(Numbers):
        return replace(op, expr=cast(op.expr))
    if isinstance(op, Reduction) and op.body.has(Numbers):
        return replace(op, body=cast(op.body))
    return op


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
    """``expr`` is 0 or 1 by what it is: a step, a δ or a support read, or a product of such (a bool array; a support
    read as a factor is 0 and 1 in the state's dtype)."""
    if isinstance(expr, sp.Mul):
        return all(is_bool(factor) for factor in expr.args)
    return (isinstance(expr, (sp.Heaviside, sp.KroneckerDelta)) and expr.has(sp.Indexed, sp.Idx)) or (
        isinstance(expr, sp.Indexed) and str(expr.base.label) in SUPPORTS)


def counted(expr: sp.Expr, counts: set[str] | frozenset[str]) -> bool:
    """``expr`` is a number of bools and of the arrays ``counts`` (computed from bools alone) alone, or a sum of one."""
    if is_bool(expr) or expr.is_number:
        return True
    if isinstance(expr, sp.Indexed):
        return str(expr.base.label) in counts
    if isinstance(expr, sp.Sum):
        return counted(expr.function, counts)
    return not isinstance(expr, sp.Idx) and bool(expr.args) and all(counted(argument, counts) for argument in expr.args)


def _floating(expr: sp.Expr) -> bool:
    """``expr`` reads a floating array (a state, a parameter, the positions, a grid coordinate) outside any bool."""
    if is_bool(expr) or isinstance(expr, (Numbers, Where)):
        return isinstance(expr, (Numbers, Where))
    if isinstance(expr, (sp.Indexed, sp.Idx)):
        return True
    return any(_floating(argument) for argument in expr.args if isinstance(argument, sp.Expr))


def is_denominator(factor: sp.Expr) -> bool:
    """``factor`` divides by an array."""
    return isinstance(factor, sp.Pow) and factor.exp.is_negative is True and factor.base.has(sp.Indexed, sp.Idx)


def _safe(power: sp.Pow) -> sp.Pow:
    """``1/d`` as ``1/Where(d, d, 1)``: 1 for the denominator where it is 0."""
    return sp.Pow(Where(power.base, power.base, 1), power.exp)


def _where(mask: sp.Expr, value: sp.Expr) -> sp.Expr:
    """``value`` where ``mask`` is not 0, else 0, each denominator of ``value`` read as 1 there."""
    safe = value.replace(is_denominator, lambda power: sp.Pow(Where(mask, power.base, 1), power.exp))
    return Where(mask, safe, 0)


class _Rewrite:
    """The rewrite of one module's formulas, in order. ``counts``: the arrays computed from bools alone (a count of a
    support, 0 where it is empty); ``supports``: the sums over a support and the counts of one, each by its support
    (``chi[i, _]``, the summed axis ``_``): a quotient is 0 where its numerator sums over the support its denominator
    counts and that support is empty, not where another one is."""

    def __init__(self):
        self.counts: set[str] = set()
        #: Per array, its support's factors (each index a symbol of its name, the summed one ``_``) and the array's
        #: own axes, by which a read of it renames them (``support``).
        self.supports: dict[str, tuple[tuple[sp.Expr, ...], tuple[str, ...]]] = {}

    def note(self, name: str, formula: sp.Expr, axis: str | None = None, labels: tuple[str, ...] = ()) -> None:
        """``name`` (over ``labels``) is a count where ``formula`` reads bools and counts alone; summed along ``axis``, a
        sum over the support its factors of bools and counts make."""
        if formula.has(sp.Indexed) and counted(formula, self.counts):
            self.counts.add(name)
        support = [factor for factor in sp.Mul.make_args(formula) if not factor.is_number and counted(factor, self.counts)]
        if axis is not None and support:
            self.supports[name] = (tuple(_named(factor, axis) for factor in support), _axes_of(labels))

    def note_contraction(self, op: Contraction) -> None:
        """A contraction along one axis with supports or counts as operands is a sum over them; of such alone, a count
        (two-hop reach ``Σ_n χ[i, n] χ[n, j]``)."""
        bounded = [operand for operand in op.operands if operand.name in SUPPORTS or operand.name in self.counts]
        if bounded and len(bounded) == len(op.operands):
            self.counts.add(op.out)
        summed = {label for operand in op.operands for label in operand.labels} - set(op.labels)
        if bounded and len(summed) == 1:
            (axis,) = summed
            self.supports[op.out] = (tuple(
                sp.IndexedBase(operand.name)[tuple(sp.Symbol("_" if label == axis else label)
                                                   for label in _axes_of(operand.labels))]
                for operand in bounded), _axes_of(op.labels))

    def __call__(self, expr: sp.Expr) -> sp.Expr:
        if isinstance(expr, Mask):  # bools by construction (a softmax's support)
            return expr
        expr = _steps(expr)
        return Numbers(expr, _STATE) if is_bool(expr) else self.numbers(expr)

    def numbers(self, expr: sp.Expr) -> sp.Expr:
        if is_bool(expr) or not isinstance(expr, sp.Expr) or not expr.args or isinstance(expr, (sp.Indexed, Numbers)):
            return expr
        if isinstance(expr, sp.Mul):
            return self.product(expr)
        arguments = [Numbers(argument, _STATE) if is_bool(argument) else self.numbers(argument)
                     for argument in expr.args]
        return expr if arguments == list(expr.args) else expr.func(*arguments)

    def product(self, expr: sp.Mul) -> sp.Expr:
        """A product that divides by an array: 0 where its factors of bools and counts are (a step, ``H(v, 0) + δ(v, 0)/2``,
        a count), or where the counts it divides by are and a sum over their support is a factor. Otherwise bool
        factors stay bare only beside a floating array and no number (NumPy's ``2 * bool`` is int64, which makes a
        float32 product float64)."""
        masks = [factor for factor in expr.args if not is_denominator(factor)
                 and (is_bool(factor) or (not factor.is_number and counted(factor, self.counts)))]
        if masks and any(is_denominator(factor) for factor in expr.args):
            others = [self.numbers(factor) for factor in expr.args if factor not in masks]
            if all(is_bool(factor) for factor in masks):
                if self.counts_of(sp.Mul(*masks), others):  # the mask ≠ 0 makes every count ≥ 1
                    safe = [_safe(factor) if is_denominator(factor) else factor for factor in others]
                    return Where(sp.Mul(*masks), sp.Mul(*safe), 0)  # each count made safe at its own shape
                return _where(sp.Mul(*masks), sp.Mul(*others))
            weight = self.numbers(sp.Mul(*masks))  # a step's ½ at 0, a count: a value besides a mask
            return _where(weight, sp.Mul(weight, *others))
        bools = [factor for factor in expr.args if is_bool(factor)]
        others = [self.numbers(factor) for factor in expr.args if not is_bool(factor)]
        counts = {self.support(factor.base): factor.base for factor in others if is_denominator(factor)}
        counts.pop(None, None)
        summed = {self.support(factor) for factor in others} & set(counts)
        if summed:
            return _where(sp.Mul(*(counts[support] for support in summed)), sp.Mul(*others))
        if bools and not (all(not factor.is_number for factor in others) and any(map(_floating, others))):
            bools = [Numbers(sp.Mul(*bools), _STATE)]
        arguments = [*bools, *others]
        return expr if sorted(arguments, key=sp.default_sort_key) == sorted(expr.args, key=sp.default_sort_key) \
            else sp.Mul(*arguments)

    def counts_of(self, mask: sp.Expr, factors: list[sp.Expr]) -> bool:
        """Every denominator of ``factors`` counts the bools of ``mask`` along one of its axes (the strict running
        mean's ``θ(p(i) − p(j)) / Σ_n θ(p(i) − p(n))``), so that the mask ≠ 0 makes it at least 1."""
        counted = {" ".join(sorted(_read(factor, str(index.label)) for factor in sp.Mul.make_args(mask)))
                   for index in mask.atoms(sp.Idx)}  # written as note() writes a count's support
        denominators = [factor.base for factor in factors if is_denominator(factor)]
        return bool(denominators) and all(
            isinstance(base, sp.Indexed) and str(base.base.label) in self.counts and self.support(base) in counted
            for base in denominators)

    def support(self, factor: sp.Expr) -> str | None:
        """The support of ``factor`` where it is a sum over one, or a count of one (``supports``), written with the
        indices ``factor`` reads it at: ``t[j]`` of ``t[i] = Σ_n χ[i, n]`` is ``chi[j, _]``, no count of ``χ[i, j]``
        along ``j`` (a key's count read as the query's made its quotient 1 where it divides by 0)."""
        if not isinstance(factor, sp.Indexed) or str(factor.base.label) not in self.supports:
            return None
        factors, axes = self.supports[str(factor.base.label)]
        if len(axes) != len(factor.indices) or not is_plain(factor.indices):
            return None
        renamed = {sp.Symbol(axis): sp.Symbol(str(index.label)) for axis, index in zip(axes, factor.indices)}
        return " ".join(sorted(str(each.xreplace(renamed)) for each in factors))


def _named(factor: sp.Expr, axis: str) -> sp.Expr:
    """``factor`` (a read of a support or a count, a step) with each index a symbol of its name, ``axis`` ``_``."""
    return factor.xreplace({index: sp.Symbol("_" if str(index.label) == axis else str(index.label))
                            for index in factor.atoms(sp.Idx)})


def _read(factor: sp.Expr, axis: str) -> str:
    """``factor`` (a read of a support or a count, a step) as text, with the index ``axis`` written ``_``."""
    return str(_named(factor, axis))


def _axes_of(labels: tuple[str, ...]) -> tuple[str, ...]:
    """The axes of an array's reads (its labels without the batch)."""
    return tuple(label for label in labels if label != BATCH)
