"""Pointwise activations of the feed-forward operator.

ReLU is not typed in: it is the projection onto ``S_2 = {u ≥ 0}`` derived from its KKT
conditions; squared ReLU is that projection squared. The others are pointwise maps, not
projections (docs/model.md §6).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sympy as sp

from .errors import SplitformerError
from .projections import SYMBOLS, derive_relu_projection
from .trusted_expressions import untrusted_node

__all__ = ["Activation", "ACTIVATIONS", "activation", "register_activation", "V"]

#: The argument of an activation's formula (``register_activation``).
V = SYMBOLS.v
_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
#: The functions an activation's formula may use: every backend prints them, the evaluator knows them.
_FUNCTIONS = (sp.exp, sp.erf, sp.tanh, sp.Max, sp.Abs)


@dataclass(frozen=True)
class Activation:
    """A pointwise map ``v ↦ formula(v)`` and how the model reads it; ``proximal``: the claim that it is
    (or is not) the proximal map of a convex penalty, which ``splitformer check`` verifies."""

    name: str
    formula: sp.Expr
    meaning: str
    proximal: bool | None = None

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


def register_activation(name: str, formula: sp.Expr, meaning: str, *, proximal: bool) -> Activation:
    """Make ``formula`` (a SymPy expression in ``V``) the activation ``name`` for schemes and ``--activation``.

    ``proximal`` states whether it is the proximal map of a convex penalty (a projection, as ReLU
    is, or not, as GELU is not); ``splitformer check`` proves or refutes the claim
    (``activation/<name>``). Built of rationals, π, ``exp``, ``erf``, ``tanh``, ``Max(·, 0)`` and ``Abs``.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > 32:
        raise SplitformerError(f"register_activation: {name!r} is not an activation name (lower-case words joined by '-')")
    if name in ACTIVATIONS:
        raise SplitformerError(f"register_activation: the activation {name!r} exists already")
    if not isinstance(proximal, bool):
        raise SplitformerError(f"register_activation {name!r}: proximal must be True or False, got {proximal!r}")
    if not isinstance(meaning, str) or "\n" in meaning:
        raise SplitformerError(f"register_activation {name!r}: meaning must be one line of text")
    try:
        formula = sp.sympify(formula, strict=True)
    except (sp.SympifyError, TypeError):
        raise SplitformerError(f"register_activation {name!r}: the formula must be a SymPy expression in V") from None
    if formula.free_symbols != {V}:
        raise SplitformerError(f"register_activation {name!r}: the formula must depend on V alone, it reads "
                               f"{sorted(map(str, formula.free_symbols))}")
    unknown = sorted({node.func.__name__ for node in sp.preorder_traversal(formula)
                      if not (node.is_Atom or isinstance(node, (sp.Add, sp.Mul, sp.Pow)) or node.func in _FUNCTIONS)
                      or (isinstance(node, sp.Max) and (len(node.args) != 2 or 0 not in node.args))})
    if unknown or formula.has(sp.Float):
        raise SplitformerError(f"register_activation {name!r}: {unknown[0] if unknown else 'a float'} is not allowed "
                               "(rationals, pi, exp, erf, tanh, Max(·, 0), Abs)")
    untrusted = untrusted_node(formula, frozenset(_FUNCTIONS))
    if untrusted is not None:
        raise SplitformerError(f"register_activation {name!r}: the formula holds {untrusted}")
    made = Activation(name, formula, meaning, proximal)
    ACTIVATIONS[name] = lambda: made
    return made
