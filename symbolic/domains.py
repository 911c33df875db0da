"""Continuous domains, their uniform grids and the rectangle quadrature rule.

A domain ``Ω`` has a continuous coordinate, a number of grid points ``N`` and a spacing
``Δ``; its measure is ``|Ω| = N Δ``. Several continuous variables may live on one domain
(``x`` and ``x̃`` on the token domain); each gets its own grid index.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

__all__ = [
    "Domain", "Variable", "TOKENS", "FEATURES", "HEADS", "HEAD_FEATURES", "HIDDEN",
    "X", "X_KEY", "ETA", "Y", "XI", "H", "E", "ZETA", "VARIABLES",
]


@dataclass(frozen=True)
class Domain:
    """A one-dimensional domain ``Ω_<name>`` discretized by ``size`` uniform cells."""

    name: str
    size: sp.Symbol
    spacing: sp.Symbol
    code_name: str
    description: str

    @property
    def measure(self) -> sp.Symbol:
        """``|Ω|`` as a positive symbol (kept opaque until discretization)."""
        return sp.Symbol(rf"|\Omega_{{{self.name}}}|", positive=True)

    @property
    def latex(self) -> str:
        return rf"\Omega_{{{self.name}}}"


@dataclass(frozen=True)
class Variable:
    """A continuous coordinate on a domain and the grid index that samples it."""

    symbol: sp.Symbol
    domain: Domain
    index: sp.Idx


def _domain(name: str, size: str, code_name: str, description: str) -> Domain:
    return Domain(
        name=name,
        size=sp.Symbol(size, integer=True, positive=True),
        spacing=sp.Symbol(rf"\Delta {name}", positive=True),
        code_name=code_name,
        description=description,
    )


TOKENS = _domain("x", "N_x", "n_tokens", "token positions")
FEATURES = _domain("y", "N_y", "d", "embedding features")
HEADS = _domain("h", "N_h", "n_heads", "attention heads")
HEAD_FEATURES = _domain("e", "N_e", "d_head", "features of one head")
HIDDEN = _domain("z", "N_z", "d_ff", "hidden features of the feed-forward operator")


def _variable(name: str, domain: Domain, index: str) -> Variable:
    return Variable(sp.Symbol(name, real=True), domain, sp.Idx(index, domain.size))


#: Continuous coordinates and the grid index each is sampled with. The index letters are
#: also the axis labels of the emitted einsum contractions.
X = _variable("x", TOKENS, "i")
X_KEY = _variable(r"\tilde{x}", TOKENS, "j")
ETA = _variable(r"\eta", TOKENS, "n")
Y = _variable("y", FEATURES, "l")
XI = _variable(r"\xi", FEATURES, "k")
H = _variable("h", HEADS, "m")
E = _variable("e", HEAD_FEATURES, "e")
ZETA = _variable(r"\zeta", HIDDEN, "z")
VARIABLES = {variable.symbol: variable for variable in (X, X_KEY, ETA, Y, XI, H, E, ZETA)}
