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

__all__ = ["gelu"]


def _argument(expr: sp.Expr) -> sp.Indexed | None:
    """The array whose exact GELU ``expr`` is, or ``None``."""
    if not expr.has(sp.erf):
        return None
    arrays = expr.atoms(sp.Indexed)
    if len(arrays) != 1:
        return None
    x = next(iter(arrays))
    return x if sp.expand(expr - x * (1 + sp.erf(x / sp.sqrt(2))) / 2) == 0 else None


def gelu(module: Module) -> Module:
    ops = []
    for op in module.ops:
        x = _argument(op.expr) if isinstance(op, Elementwise) else None
        ops.append(op if x is None else replace(op, expr=ExactGelu(x)))
    return replace(module, ops=ops)
