"""Evaluate a discrete program at concrete sizes, entry by entry, in SymPy.

Used to compare a derived program with a reference formula symbolically (symbolic
weights, a few tokens and features) or numerically in high precision (mpmath values).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

import mpmath
import sympy as sp

from .numeric_expressions import as_number, compile_numeric, work
from .operators import EPSILON
from .program import TIME_STEP, Program

__all__ = ["evaluate", "evaluation_work"]


def _substitute(expr: sp.Expr, entry: Callable[[sp.Indexed], sp.Expr]) -> sp.Expr:
    """Write every ``Sum`` out term by term and replace every array entry by its value.

    Indices are replaced exactly (``xreplace``); ``Max`` is rebuilt unevaluated, since
    SymPy's simplification of ``Max`` over large arguments is very slow.
    """
    if isinstance(expr, sp.Sum):
        terms = [expr.function]
        for index, lower, upper in expr.limits:
            terms = [term.xreplace({index: sp.Integer(value)}) for term in terms
                     for value in range(int(lower), int(upper) + 1)]
        return sp.Add(*(_substitute(term, entry) for term in terms))
    if isinstance(expr, sp.Indexed):
        return entry(expr)
    if not expr.args:
        return expr
    if isinstance(expr, sp.Mul):
        return _product(expr, entry)
    arguments = [_substitute(argument, entry) for argument in expr.args]
    if isinstance(expr, sp.Max):
        return sp.Max(*arguments, evaluate=all(argument.is_number for argument in arguments))
    return expr.func(*arguments)


def _product(expr: sp.Mul, entry: Callable[[sp.Indexed], sp.Expr]) -> sp.Expr:
    """The factors' product, reciprocals last: a factor exactly 0 makes it 0 before any reciprocal is taken (a step or
    mask outside its support times ``1/∫`` of that support, empty there: SymPy's ``0 · zoo`` is NaN), as
    ``numeric_expressions`` computes it and the emitted code's masked quotients are."""
    values = []
    for factor in sorted(expr.args, key=lambda factor: isinstance(factor, sp.Pow) and factor.exp.is_negative is True):
        value = _substitute(factor, entry)
        if value == 0:  # structurally: SymPy's is_zero would query assumptions of large expressions
            return sp.Integer(0)
        values.append(value)
    return sp.Mul(*values)


def evaluate(
    program: Program,
    sizes: Mapping[sp.Symbol, int],
    inputs: Mapping[str, Callable[..., sp.Expr]],
    *,
    eps: sp.Expr = EPSILON,
    time_step: sp.Expr = sp.Integer(1),
    digits: int | None = None,
) -> dict[str, dict[tuple[int, ...], sp.Expr]]:
    """Every tensor's entries: ``{name: {(i, k, …): value}}``.

    An array written at a pattern accumulates its values there (entries not written are absent).
    ``inputs`` gives the entries of the input state ``u0``, of the parameters (named as in
    the program, e.g. ``attn_W_q``) and of the support ``chi``, as functions of integer
    indices. ``sizes`` fixes ``N_x``, ``N_y``, … . ``digits``: numeric inputs, every entry computed
    in that many digits with mpmath (``numeric_expressions``) and returned as a SymPy ``Float``.
    """
    values: dict[str, dict[tuple[int, ...], sp.Expr]] = {}
    read: dict[tuple[str, tuple[int, ...]], object] = {}

    def entry(indexed: sp.Indexed) -> sp.Expr:
        name, index = str(indexed.base.label), tuple(int(i) for i in indexed.indices)
        if name in values:  # zero off the nodes it was computed on (a convolution's zero padding)
            return values[name].get(index, sp.Integer(0))
        return sp.sympify(inputs[name](*index))

    def number(name: str, index: tuple[int, ...]):
        """``entry`` in ``digits``-digit numbers (an input read once)."""
        if name in values:
            return values[name].get(index, 0)
        if (name, index) not in read:
            read[name, index] = as_number(inputs[name](*index), digits)
        return read[name, index]

    def formula(rhs: sp.Expr) -> Callable[[dict], object]:
        """``rhs`` as a function of the index values: SymPy terms, or ``digits``-digit numbers."""
        if digits is None:
            return lambda point: _substitute(rhs.xreplace({index: sp.Integer(value) for index, value in point.items()}),
                                             entry)
        return compile_numeric(rhs, number, digits)

    constants = _constants(sizes, eps, time_step)
    with mpmath.workdps(digits or mpmath.mp.dps):
        for assignment in program.assignments:
            # xreplace rebuilds every Idx with its concrete range, in the body and the limits alike
            indices = assignment.lhs.xreplace(constants).indices
            rhs = formula(assignment.rhs.xreplace(constants))
            if not all(isinstance(index, sp.Idx) for index in indices):
                _accumulate(values.setdefault(assignment.target, {}), indices, rhs)
            else:
                ranges = [range(int(index.upper) + 1) for index in indices]
                values[assignment.target] = {point: rhs(dict(zip(indices, point))) for point in itertools.product(*ranges)}
    if digits is not None:
        values = {name: {point: sp.Float(value, digits) for point, value in table.items()}
                  for name, table in values.items()}
    return values


def evaluation_work(program: Program, sizes: Mapping[sp.Symbol, int]) -> int:
    """The closures ``evaluate(program, sizes, …, digits=n)`` calls: each assignment's ``work`` once per
    entry it computes. A count, not a time: bounds on it are the same on every machine."""
    constants = _constants(sizes, sp.Integer(1), sp.Integer(1))
    total = 0
    for assignment in program.assignments:
        indices = assignment.lhs.xreplace(constants).indices
        atoms = {atom for index in indices for atom in sp.sympify(index).atoms(sp.Idx)}
        points = 1
        for atom in atoms:
            points *= int(atom.upper) + 1
        total += points * work(assignment.rhs.xreplace(constants))
    return total


def _constants(sizes: Mapping[sp.Symbol, int], eps: sp.Expr, time_step: sp.Expr) -> dict:
    return {**sizes, EPSILON: eps, TIME_STEP: time_step}


def _accumulate(table: dict, indices: tuple, rhs: Callable[[dict], object]) -> None:
    """An array written at a pattern (``x[P p + r]``, ``x[0]``): each value added at its entry."""
    atoms = sorted({atom for index in indices for atom in sp.sympify(index).atoms(sp.Idx)}, key=str)
    for point in itertools.product(*(range(int(atom.upper) + 1) for atom in atoms)):
        values = dict(zip(atoms, point))
        key = tuple(int(sp.sympify(index).xreplace({atom: sp.Integer(value) for atom, value in values.items()}))
                    for index in indices)
        table[key] = table.get(key, 0) + rhs(values)
