"""Recognize the exact GELU, ``x (1 + erf(x/√2))/2``, as one call: ``ExactGelu(x)``.

An elementwise map whose whole expression is the GELU of one array read (after
``inline-elementwise``) becomes ``ExactGelu(x)``. NumPy spells it ``_gelu``: the same operations in
the same order, evaluated block by block in place (one output array instead of the five
temporaries of the expression: ``√2 x``, ``/2``, ``erf``, ``1 +``, ``· x``, ``/2``); torch
spells it ``torch.nn.functional.gelu`` (one kernel).
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from ..ir import Elementwise, ExactGelu, Module

__all__ = ["gelu", "form_argument", "as_calls"]


def form_argument(expr: sp.Expr, form, function: type) -> sp.Indexed | None:
    """The one array ``x`` that ``expr`` reads when ``expr`` is ``form(x)`` (and has ``function``), or ``None``."""
    if not expr.has(function):
        return None
    arrays = expr.atoms(sp.Indexed)
    if len(arrays) != 1:
        return None
    x = next(iter(arrays))
    return x if sp.expand(expr - form(x)) == 0 else None


def as_calls(module: Module, argument, call: type) -> Module:
    """``module`` with each elementwise map whose ``argument`` is an array ``x`` written ``call(x)``."""
    ops = []
    for op in module.ops:
        x = argument(op.expr) if isinstance(op, Elementwise) else None
        ops.append(op if x is None else replace(op, expr=call(x)))
    return replace(module, ops=ops)


def _argument(expr: sp.Expr) -> sp.Indexed | None:
    """The array whose exact GELU ``expr`` is, or ``None``."""
    return form_argument(expr, ExactGelu.formula, sp.erf)


def gelu(module: Module) -> Module:
    return as_calls(module, _argument, ExactGelu)
