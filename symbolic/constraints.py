"""Constraint sets of projections, written as data; ``projections.derive_projection`` solves them.

A set constrains, for every token, the feature components ``u_k`` of a field:

- ``Moment(φ, value, ψ)``: the mean ``(Σ_k φ(u_k) + ψ(g))/N = value``, with ``φ`` at most
  quadratic in ``u`` (the symbol ``U``); ``ψ`` is the ghost coordinate's share (symbol ``G``),
  used to carry LayerNorm's ε (docs/model.md §6);
- ``Bound(h)``: ``h(u_k) ≥ 0`` for every component, ``h`` affine in ``u``.

``Statistic`` names the per-token means the closed form is written in (``α = mean v``,
``β = mean (v − α)²``); the operator computes them before the projection. The paper's
``S_1`` and ``S_2`` are defined here; other sets are defined the same way, anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

__all__ = ["U", "G", "Moment", "Bound", "Statistic", "ConstraintSet", "ProjectionSymbols", "SYMBOLS", "S_1", "S_2"]


@dataclass(frozen=True)
class ProjectionSymbols:
    """The symbols the derived projection formulas are written in."""

    v: sp.Symbol = sp.Symbol("v", real=True)
    alpha: sp.Symbol = sp.Symbol(r"\alpha", real=True)
    beta: sp.Symbol = sp.Symbol(r"\beta", positive=True)
    sigma_1: sp.Symbol = sp.Symbol(r"\sigma_1", real=True)
    sigma_2: sp.Symbol = sp.Symbol(r"\sigma_2", positive=True)
    ghost: sp.Symbol = sp.Symbol(r"\gamma", nonnegative=True)
    size: sp.Symbol = sp.Symbol("N", integer=True, positive=True)
    epsilon: sp.Symbol = sp.Symbol(r"\varepsilon", nonnegative=True)


SYMBOLS = ProjectionSymbols()

#: A feature component of the point in the set, and the ghost coordinate.
U = sp.Symbol("u", real=True)
G = sp.Symbol("g", real=True)


@dataclass(frozen=True)
class Moment:
    """``(Σ_k component(u_k) + ghost(g)) / N = value``; ``component`` in ``U``, ``ghost`` in ``G``."""

    component: sp.Expr
    value: sp.Expr
    ghost: sp.Expr = sp.Integer(0)


@dataclass(frozen=True)
class Bound:
    """``expr(u_k) ≥ 0`` for every component; ``expr`` is affine in ``U``."""

    expr: sp.Expr


@dataclass(frozen=True)
class Statistic:
    """``symbol = mean over the features of mean_of`` (in ``v`` and earlier statistics)."""

    name: str
    symbol: sp.Symbol
    latex: str
    mean_of: sp.Expr
    meaning: str


@dataclass(frozen=True)
class ConstraintSet:
    """A set by its constraints; ``ghost`` adds the coordinate that carries ``ε``."""

    name: str
    latex: str
    moments: tuple[Moment, ...] = ()
    bounds: tuple[Bound, ...] = ()
    statistics: tuple[Statistic, ...] = ()
    ghost: bool = False

    def _repr_latex_(self) -> str:
        return f"${self.latex}$"


def _paper_sets() -> tuple[ConstraintSet, ConstraintSet]:
    s = SYMBOLS
    sphere_in_plane = ConstraintSet(
        name="S_1",
        latex=r"S_1(\sigma_1, \sigma_2) = \{u : \mathrm{mean}_y\, u = \sigma_1,\ \mathrm{var}_y\, u = \sigma_2^2\}",
        moments=(Moment(U, s.sigma_1), Moment((U - s.sigma_1) ** 2, s.sigma_2**2, G**2)),
        statistics=(
            Statistic("alpha", s.alpha, r"\alpha", s.v, "mean over features"),
            Statistic("beta", s.beta, r"\beta", (s.v - s.alpha) ** 2, "population variance over features"),
        ),
        ghost=True,
    )
    half_space = ConstraintSet(name="S_2", latex=r"S_2 = \{u : u \ge 0\}", bounds=(Bound(U),))
    return sphere_in_plane, half_space


S_1, S_2 = _paper_sets()
