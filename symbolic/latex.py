"""LaTeX that renders on code-hosting sites: short index names and ``∫_Ω`` integrals."""

from __future__ import annotations

from collections import ChainMap

from collections.abc import Mapping

import sympy as sp
from sympy.core.function import AppliedUndef
from sympy.printing.latex import LatexPrinter

__all__ = ["to_latex", "equation"]


class _MathPrinter(LatexPrinter):
    def _print_Symbol(self, expr: sp.Symbol, style: str = "plain") -> str:
        if expr.name.startswith("|") or expr.name.startswith("\\"):
            return self._settings["symbol_names"].get(expr, expr.name)
        return super()._print_Symbol(expr, style)

    def _print_Function(self, expr: sp.Function, exp: str | None = None) -> str:
        if not isinstance(expr, AppliedUndef):
            return super()._print_Function(expr, exp)
        name = self._settings["symbol_names"].get(sp.Symbol(expr.func.__name__), expr.func.__name__)
        text = name + "(" + ", ".join(self._print(argument) for argument in expr.args) + ")"
        return f"{text}^{{{exp}}}" if exp else text

    def _print_Idx(self, expr: sp.Idx) -> str:
        return self._print(expr.label)

    def _print_Integral(self, expr: sp.Integral) -> str:
        limits = []
        for variable, lower, upper in expr.limits:
            name = str(upper)
            if lower == 0 and name.startswith("|") and name.endswith("|"):
                limits.append((rf"\int_{{{name[1:-1]}}}", self._print(variable)))
            else:
                limits.append(
                    (rf"\int_{{{self._print(lower)}}}^{{{self._print(upper)}}}", self._print(variable))
                )
        prefix = " ".join(sign for sign, _ in limits)
        differentials = r" \, ".join(f"d{variable}" for _, variable in reversed(limits))
        return rf"{prefix} {self._print(expr.function)} \, {differentials}"

    def _print_Sum(self, expr: sp.Sum) -> str:
        text = ""
        for index, _, _ in expr.limits:
            text += rf"\sum_{{{self._print(index)}}} "
        body = expr.function
        inner = self._print(body)
        if isinstance(body, sp.Add):
            inner = rf"\left({inner}\right)"
        return text + inner


#: Names every formula uses: LayerNorm's ε is ``eps`` in code.
_DEFAULT_NAMES = {"eps": r"\varepsilon"}


def to_latex(expr: sp.Basic, names: Mapping[str, str] | None = None) -> str:
    """LaTeX of ``expr``; ``names`` renames symbols and array bases (``attn_q`` → ``Q``)."""
    names = ChainMap(names or {}, _DEFAULT_NAMES)  # no copy: derivations pass every array's name
    symbol_names = {symbol: names[symbol.name] for symbol in expr.atoms(sp.Symbol) if symbol.name in names}
    for applied in expr.atoms(AppliedUndef):
        name = applied.func.__name__
        if name in names:
            symbol_names[sp.Symbol(name)] = names[name]
    printer = _MathPrinter({"symbol_names": symbol_names, "mul_symbol": None})
    return printer.doprint(expr)


def equation(lhs: sp.Basic, rhs: sp.Basic, names: Mapping[str, str] | None = None) -> str:
    """``lhs = rhs`` in LaTeX, without SymPy deciding whether the two are equal (slow)."""
    return f"{to_latex(lhs, names)} = {to_latex(rhs, names)}"
