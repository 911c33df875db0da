"""Proof checks: each claim linking the continuous equation to a discrete layer, checkable.

Every check returns ``Check`` records; a record states its claim and hypotheses in words,
says how it was checked (``symbolic`` or ``numeric``), whether it holds, and why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import sympy as sp

__all__ = ["Check", "plain"]

_GREEK = {r"\alpha": "α", r"\beta": "β", r"\sigma_1": "σ₁", r"\sigma_2": "σ₂", r"\gamma": "γ",
          r"\varepsilon": "ε", r"\lambda": "λ", r"\mu": "μ", r"\sigma": "σ", r"\rho": "ρ"}


def plain(expr: sp.Expr) -> str:
    """An expression as one line of plain text, Greek letters for the projection symbols."""
    text = sp.sstr(expr)
    for name, letter in _GREEK.items():
        text = text.replace(name, letter)
    return text


@dataclass(frozen=True)
class Check:
    id: str
    scheme: str | None
    statement: str
    method: str
    holds: bool
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)
