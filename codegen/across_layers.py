"""The statements a stack runs between its layers when the scheme combines them (``[across_layers]``).

``symbolic.across_layers`` states a method as the equations ``(w, u⁺, v⁺)`` in the states ``u, v`` and
the layer's increment ``D``; this module prints them (and, for the NumPy ``vjp_stack``, their
transposed derivatives) as Python statements over the stack's variables. The combination is
linear, so every statement is a sum of variables with constant coefficients, the same text in
NumPy and PyTorch.
"""

from __future__ import annotations

import sympy as sp

from splitformer.symbolic.across_layers import D, AcrossLayers, u, v, w

__all__ = ["across_context"]

#: The stack's variable of each symbol of the equations, and of the adjoint's costates.
_FORWARD = {u: "state", v: "velocity", D: "increment", w: "point"}
_ubar, _vbar, _wbar, _dbar = sp.symbols("ubar vbar wbar dbar")
_ADJOINT = {_ubar: "seed", _vbar: "grad_velocity", _wbar: "grad_point", _dbar: "grad_increment"}


def _code(expr: sp.Expr, names: dict[sp.Symbol, str]) -> str:
    """``expr``, a constant-coefficient sum of ``names``' symbols, as Python (terms in ``names``' order)."""
    expr = sp.expand(expr)
    terms = []
    for symbol, name in names.items():
        coefficient = expr.coeff(symbol)
        if coefficient == 0:
            continue
        magnitude = abs(coefficient)
        term = name if magnitude == 1 else f"{float(magnitude)!r} * {name}"
        terms.append(("- " if coefficient < 0 else "+ ") + term)
    if not terms:
        return "0"
    text = " ".join(terms)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def _statements(equations: tuple[sp.Expr, sp.Expr, sp.Expr]) -> dict[str, str]:
    point, new_u, new_v = equations
    return {"point": _code(point, _FORWARD), "state": _code(new_u, _FORWARD), "velocity": _code(new_v, _FORWARD)}


def _adjoint(equations: tuple[sp.Expr, sp.Expr, sp.Expr]) -> dict[str, str]:
    """The transposed derivatives: ``D̄`` from ``(ū⁺, v̄⁺)``, then ``(ū, v̄)`` from ``(ū⁺, v̄⁺, w̄)``."""
    point, new_u, new_v = equations

    def costate(symbol: sp.Symbol) -> sp.Expr:
        return (sp.diff(new_u, symbol) * _ubar + sp.diff(new_v, symbol) * _vbar
                + sp.diff(point, symbol) * _wbar)

    return {"grad_increment": _code(costate(D), _ADJOINT), "seed": _code(costate(u), _ADJOINT),
            "grad_velocity": _code(costate(v), _ADJOINT)}


def across_context(across: AcrossLayers | None) -> dict | None:
    """The template's view of ``across``: the first layer's and the others' statements, their adjoints and LaTeX."""
    if across is None:
        return None
    return {
        "method": across.method,
        "latex": across.latex(),
        "start_note": across.start_note,
        "start": _statements(across.start),
        "step": _statements(across.equations),
        "start_adjoint": _adjoint(across.start),
        "step_adjoint": _adjoint(across.equations),
    }
