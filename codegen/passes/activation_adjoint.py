"""Recognize an adjoint statement that is a costate times an activation's derivative, ``λ f'(x)``, as one call.

The derived adjoint writes ``f'(x)`` out as SymPy differentiated it (a SiLU's three ``exp`` and two ``div``, a
tanh-GELU's ``tanh`` twice and its powers), often over the kept forward value ``f(x)`` instead of ``x``. A statement
``e`` is tried at each array ``x`` that the activation's signature function (``exp``, ``erf``, ``tanh``) is applied
to. It is ``λ f'(x)`` when, with each array it reads at ``x``'s indices written out where the array's formula holds
the activation of ``x`` (or one of the functions its formula is written in, applied to ``x``), and with each such
function application (``e^{−x}``, ``erf(√2 x/2)``, ``tanh(…)``) a symbol of its own, ``e / f'(x)`` cancels to a
formula ``λ`` of arrays and numbers alone, free of ``x`` and of those symbols (no function application: a costate
the cancellation rewrote into a ratio of exponentials could overflow where the statement did not). ``f'`` is SymPy's
derivative of the activation's formula, never written here. The statement then becomes ``backward(λ, x)``, which
each backend spells as its library's backward kernel (torch's ``silu_backward``, ``gelu_backward``: what autograd
runs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy as sp

from ..ir import Elementwise, Module

__all__ = ["Activation", "costate_of", "recognize"]


@dataclass(frozen=True)
class Activation:
    """An activation whose adjoint statements are recognized: the forward's call (``Silu``, its ``formula`` ``f(x)``),
    the functions that formula and its derivative are written in (``sp.exp``; the first, its signature, is in every
    statement recognized) and the backward call ``(λ, x)`` it becomes."""

    call: type[sp.Function]
    functions: tuple[type[sp.Function], ...]
    backward: type[sp.Function]

    def arguments(self, expr: sp.Expr) -> list[sp.Indexed]:
        """The arrays the signature function is applied to in ``expr``: where ``λ f'(x)`` is tried."""
        return sorted({array for item in expr.atoms(self.functions[0]) for array in item.atoms(sp.Indexed)}, key=str)

    def applications(self, expr: sp.Expr, x: sp.Expr | None = None) -> set[sp.Expr]:
        """The applications of the formula's functions in ``expr`` (those reading ``x``, if given)."""
        return {item for item in expr.atoms(*self.functions) if x is None or item.has(x)}


def _at(formula: sp.Expr, axes: tuple[str, ...], indices: tuple) -> sp.Expr:
    """``formula``, written over ``axes`` (its statement's, the batch axis left out), read at ``indices``."""
    names = {index: indices[axes.index(str(index))] for index in formula.atoms(sp.Idx) if str(index) in axes}
    return formula.xreplace(names)


def _written_out(expr: sp.Expr, x: sp.Indexed, formulas: dict[str, tuple[tuple[str, ...], sp.Expr]],
                 activation: Activation) -> sp.Expr:
    """``expr`` with each array it reads at ``x``'s indices whose formula holds the activation of ``x`` (or one of its
    functions applied to ``x``) there written out."""
    by_array = {}
    for item in expr.atoms(sp.Indexed):
        axes, formula = formulas.get(str(item.base.label), ((), None))
        if formula is None or item.indices != x.indices or len(axes) != len(item.indices):
            continue
        formula = _at(formula, axes, item.indices)
        if formula.has(activation.call(x)) or activation.applications(formula, x):
            by_array[item] = formula
    return expr.xreplace(by_array)


def costate_of(expr: sp.Expr, x: sp.Indexed, formulas: dict[str, tuple[tuple[str, ...], sp.Expr]],
               activation: Activation) -> sp.Expr | None:
    """``λ`` when ``expr`` is ``λ f'(x)`` (``f``: ``activation``) with ``λ`` a formula of arrays and numbers free of
    ``x``, else None; ``formulas``: each array's formula over its axes (without the batch axis), which this writes out
    where ``expr`` reads the array at ``x``'s indices and the formula holds ``f(x)``."""
    written = _written_out(expr, x, formulas, activation).xreplace({activation.call(x): activation.call.formula(x)})
    derivative = sp.diff(activation.call.formula(x), x)
    symbols = {item: sp.Dummy("t") for item in activation.applications(written, x) | activation.applications(derivative)}
    quotient = sp.cancel((written / derivative).xreplace(symbols))
    if quotient.has(x, *symbols.values()) or quotient.atoms(sp.Function) or not quotient.has(sp.Indexed):
        return None
    return quotient


def recognize(module: Module, activations: tuple[Activation, ...]) -> Module:
    """``module`` with each elementwise statement that is ``λ f'(x)``, ``f`` one of ``activations``, written as the
    activation's backward call."""
    formulas = {op.out: (op.labels[1:], op.expr) for op in module.ops if isinstance(op, Elementwise)}
    ops = []
    for op in module.ops:
        for activation in activations if isinstance(op, Elementwise) else ():
            costates = ((x, costate_of(op.expr, x, formulas, activation)) for x in activation.arguments(op.expr))
            x, costate = next(((x, costate) for x, costate in costates if costate is not None), (None, None))
            if costate is not None:
                op = replace(op, expr=activation.backward(costate, x))
                break
        ops.append(op)
    return replace(module, ops=ops)
