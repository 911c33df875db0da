"""Recognize GELU's tanh approximation, ``x (1 + tanh(√(2/π) (x + 0.044715 x³)))/2``, as one call: ``TanhGelu(x)``.

An elementwise map whose whole expression is that form of one array read (after
``inline-elementwise``; GPT-2's ``gelu_new``) becomes ``TanhGelu(x)``. NumPy spells it
``_gelu_tanh``: the formula's operations evaluated block by block in place, x³ as ``x·x·x``
(NumPy's power with exponent 3 goes through ``pow`` per element, about 100× slower, and the
expression allocates eight full-size temporaries); torch spells it
``torch.nn.functional.gelu(x, approximate="tanh")`` (one kernel).
"""

from __future__ import annotations

import sympy as sp

from ..ir import Module, TanhGelu
from .gelu import as_calls, form_argument

__all__ = ["gelu_tanh"]


def _argument(expr: sp.Expr) -> sp.Indexed | None:
    """The array whose tanh-GELU ``expr`` is, or ``None``."""
    return form_argument(expr, TanhGelu.formula, sp.tanh)


def gelu_tanh(module: Module) -> Module:
    return as_calls(module, _argument, TanhGelu)
