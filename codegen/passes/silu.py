"""Recognize the SiLU, ``x/(1 + e^{−x})``, as one call: ``Silu(x)``.

A product holding an array ``x`` and ``1/(1 + e^{−x})`` (llama's gated feed-forward
``w̃ w/(1 + e^{−w})``) becomes ``w̃ Silu(w)``. torch spells it ``torch.nn.functional.silu``: one
kernel instead of ``neg``, ``exp``, ``add``, ``div`` and their temporaries (and MKL's ``exp``,
which wakes its threads for a row of a few hundred entries); NumPy spells the formula.
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from ..ir import Elementwise, Module, Silu

__all__ = ["silu"]


def _logistic_of(factor: sp.Expr) -> sp.Indexed | None:
    """The array ``x`` of a factor ``1/(1 + e^{−x})``, or None."""
    if not (isinstance(factor, sp.Pow) and factor.exp == -1 and isinstance(factor.base, sp.Add)):
        return None
    one, *rest = sorted(factor.base.args, key=lambda term: not term.is_number)
    if one != 1 or len(rest) != 1 or not isinstance(rest[0], sp.exp):
        return None
    x = -rest[0].args[0]
    return x if isinstance(x, sp.Indexed) else None


def _product(mul: sp.Mul) -> sp.Expr:
    """``mul`` with each pair ``x · 1/(1 + e^{−x})`` of its factors written ``Silu(x)``."""
    factors = list(mul.args)
    for factor in list(factors):
        x = _logistic_of(factor)
        if x is not None and x in factors:
            factors.remove(factor)
            factors.remove(x)
            factors.append(Silu(x))
    return sp.Mul(*factors) if len(factors) != len(mul.args) else mul


def silu(module: Module) -> Module:
    ops = []
    for op in module.ops:
        if isinstance(op, Elementwise) and op.expr.has(sp.exp):
            op = replace(op, expr=op.expr.replace(lambda e: isinstance(e, sp.Mul), _product))
        ops.append(op)
    return replace(module, ops=ops)
