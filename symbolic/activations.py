"""Pointwise activations of the feed-forward operator.

ReLU is not typed in: it is the projection onto ``S_2 = {u ≥ 0}`` derived from its KKT
conditions; squared ReLU is that projection squared. The others are pointwise maps, not
projections (docs/model.md §6).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .errors import SplitformerError
from .projections import SYMBOLS, derive_relu_projection

__all__ = ["Activation", "ACTIVATIONS", "activation"]


@dataclass(frozen=True)
class Activation:
    """A pointwise map ``v ↦ formula(v)`` and how the model reads it."""

    name: str
    formula: sp.Expr
    meaning: str

    def __call__(self, argument: sp.Expr) -> sp.Expr:
        return self.formula.subs(SYMBOLS.v, argument)


def _relu_squared() -> Activation:
    return Activation(
        "relu-squared",
        derive_relu_projection().formula ** 2,
        r"squared ReLU (So et al. 2021): the projection onto $S_2$, squared; a pointwise map, not a proximal map",
    )


def _relu() -> Activation:
    return Activation(
        "relu",
        derive_relu_projection().formula,
        r"projection onto $S_2 = \{u \ge 0\}$ (implicit step of $\partial I_{S_2}$), derived from KKT",
    )


_v = SYMBOLS.v
ACTIVATIONS = {
    "relu": _relu,
    "relu-squared": _relu_squared,
    "gelu": lambda: Activation("gelu", _v * (1 + sp.erf(_v / sp.sqrt(2))) / 2, "exact GELU, a pointwise map"),
    "silu": lambda: Activation("silu", _v / (1 + sp.exp(-_v)), "SiLU (swish), a pointwise map"),
    "tanh": lambda: Activation("tanh", sp.tanh(_v), "hyperbolic tangent, a pointwise map"),
    "gelu-tanh": lambda: Activation(
        "gelu-tanh", _v * (1 + sp.tanh(sp.sqrt(2 / sp.pi) * (_v + sp.Rational(44715, 10**6) * _v**3))) / 2,
        "GELU with the tanh approximation (GPT-2's gelu_new), a pointwise map"),
}


def activation(name: str) -> Activation:
    """The activation called ``name``; a ``SplitformerError`` lists the known ones."""
    if name not in ACTIVATIONS:
        known = ", ".join(sorted(ACTIVATIONS))
        raise SplitformerError(f"unknown activation {name!r} (known: {known})")
    return ACTIVATIONS[name]()
