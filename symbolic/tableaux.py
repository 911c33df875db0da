"""Explicit Runge–Kutta methods as data: Butcher tableaux, their orders, a registry by name.

A tableau ``(A, b)`` with ``A`` strictly lower triangular defines the stages
``k_i = G(u + Δt Σ_j a_ij k_j)`` and the step ``u⁺ = u + Δt Σ_i b_i k_i`` (``c_i = Σ_j a_ij``).
Its classical order is the largest ``p`` for which every rooted tree ``t`` with at most
``p`` nodes satisfies Butcher's condition ``b · Φ(t) = 1/γ(t)``. Explicit Euler and Heun
are tableaux like any other; ``register_tableau`` adds a method by name (from a user's
module too), and a scheme file may define its own under ``[tableaux.NAME]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import sympy as sp

from .errors import SplitformerError
from .exact_numbers import exact_number
from .trusted_expressions import RATIONALS

__all__ = ["Tableau", "make_tableau", "MAX_STAGES", "register_tableau", "tableau", "TABLEAUX", "EULER", "HEUN", "RK4",
           "rooted_trees"]

#: Orders are checked up to this many nodes; a method that passes all is reported at this order.
MAX_ORDER = 6
#: A tableau's name, as in scheme files: lower-case words joined by '-'.
_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


@dataclass(frozen=True)
class Tableau:
    """An explicit Runge–Kutta method: ``a`` (rows of the strictly lower triangle), weights ``b``."""

    name: str
    a: tuple[tuple[sp.Rational, ...], ...]
    b: tuple[sp.Rational, ...]
    label: str = ""

    def __post_init__(self) -> None:
        # Both reach generated code (comments, docstrings) and reports: one safe line each.
        if type(self.name) is not str or len(self.name) > 64 or not _NAME.fullmatch(self.name):
            raise SplitformerError(f"{str(self.name)[:64]!r} is not a tableau name (lower-case words joined by '-', "
                                   "at most 64 characters)")
        if (type(self.label) is not str or '"""' in self.label or not self.label.isprintable()
                or any(mark in self.label for mark in '\\<[]$`')):
            raise SplitformerError(f"tableau {self.name!r}: label must be one printable line without backslashes, "
                                   "triple quotes or markup (<, [, ], $, backquote)")
        self._check_coefficients()

    def _check_coefficients(self) -> None:
        """Explicit and consistent, however the tableau was built (``make_tableau`` or ``Tableau(...)``)."""
        b, a = self.b, self.a
        # exact classes: the coefficients are printed into emitted code, and a subclass could print itself
        if not isinstance(b, tuple) or not b or not all(type(weight) in RATIONALS for weight in b):
            raise SplitformerError(f"tableau {self.name!r}: b must be a non-empty tuple of exact rationals "
                                   "(use make_tableau)")
        if len(b) > MAX_STAGES:  # each stage nests every earlier one: the derivation grows quadratically
            raise SplitformerError(f"tableau {self.name!r} has {len(b)} stages; at most {MAX_STAGES} are supported")
        if (not isinstance(a, tuple) or len(a) != len(b)
                or not all(isinstance(row, tuple) and len(row) == len(b) for row in a)
                or not all(type(value) in RATIONALS for row in a for value in row)):
            raise SplitformerError(f"tableau {self.name!r}: a must be {len(b)} rows of {len(b)} exact rationals "
                                   "(use make_tableau)")
        if any(value != 0 for i, row in enumerate(a) for value in row[i:]):
            raise SplitformerError(f"tableau {self.name!r}: a has entries on or above the diagonal; "
                                   "only explicit methods are supported")
        if sum(b) != 1:
            raise SplitformerError(f"tableau {self.name!r}: the weights b sum to {sum(b)}, not 1 (inconsistent method)")

    @property
    def stages(self) -> int:
        return len(self.b)

    @property
    def c(self) -> tuple[sp.Expr, ...]:
        return tuple(sum(row, sp.Integer(0)) for row in self.a)

    @property
    def title(self) -> str:
        return self.label or self.name

    def order(self) -> int:
        """The classical order from Butcher's conditions (at most ``MAX_ORDER``)."""
        return _order(self)

    def latex(self) -> str:
        """The Butcher array ``c | A`` over ``b``."""
        rows = [" & ".join([sp.latex(c)] + [sp.latex(a) if j < i else "" for j, a in enumerate(row)])
                for i, (c, row) in enumerate(zip(self.c, self.a))]
        weights = " & ".join([""] + [sp.latex(b) for b in self.b])
        columns = "c|" + "c" * self.stages
        return (rf"\begin{{array}}{{{columns}}} " + r" \\ ".join(rows) + r" \\ \hline " + weights
                + r" \end{array}")

    def _repr_latex_(self) -> str:
        return f"$\\displaystyle {self.latex()}$"

    def stability(self, power: int) -> sp.Expr:
        """``b · A^{power−1} · 1``: the coefficient of ``(h λ)^power`` on a linear problem."""
        vector = [sp.Integer(1)] * self.stages
        for _ in range(power - 1):
            vector = [sum((self.a[i][j] * vector[j] for j in range(self.stages)), sp.Integer(0))
                      for i in range(self.stages)]
        return sum((weight * value for weight, value in zip(self.b, vector)), sp.Integer(0))


def _number(value, where: str) -> sp.Rational:
    """An exact rational from an int, a decimal float or a fraction string (``"1/6"``), bounded."""
    try:
        return exact_number(value)
    except ValueError as error:
        raise SplitformerError(f"{where}: {error}") from None


#: The most stages a tableau may have (classical methods have up to 7 or so).
MAX_STAGES = 16


def make_tableau(name: str, a, b, label: str = "") -> Tableau:
    """A validated tableau; ``a`` may list only the rows' lower-triangle entries (``[[], [1/2], …]``).

    Entries are numbers or fraction strings (``"1/6"``). The method must be explicit and
    consistent (``Σ b_i = 1``).
    """
    if not isinstance(b, (list, tuple)) or not b:
        raise SplitformerError(f"tableau {name!r}: b must be a non-empty list of weights")
    stages = len(b)
    if stages > MAX_STAGES:  # each stage nests every earlier one: the derivation grows quadratically
        raise SplitformerError(f"tableau {name!r} has {stages} stages; at most {MAX_STAGES} are supported")
    if not isinstance(a, (list, tuple)) or len(a) != stages:
        raise SplitformerError(f"tableau {name!r}: a has {len(a) if isinstance(a, (list, tuple)) else 0} rows "
                               f"for {stages} weights")
    rows = []
    for i, row in enumerate(a):
        if not isinstance(row, (list, tuple)):
            raise SplitformerError(f"tableau {name!r}: a[{i}] must be a list")
        values = [_number(value, f"tableau {name!r}: a[{i}][{j}]") for j, value in enumerate(row)]
        if len(values) > i and any(value != 0 for value in values[i:]):
            raise SplitformerError(f"tableau {name!r}: a[{i}] has entries on or above the diagonal; "
                                   "only explicit methods are supported")
        if len(values) > stages:
            raise SplitformerError(f"tableau {name!r}: a[{i}] has {len(values)} entries for {stages} stages")
        rows.append(tuple(values[:i]) + (sp.Integer(0),) * (stages - min(i, len(values))))
    weights = tuple(_number(value, f"tableau {name!r}: b[{i}]") for i, value in enumerate(b))
    return Tableau(name, tuple(rows), weights, label)


# -- Butcher's order conditions ---------------------------------------------------------
# A rooted tree is the sorted tuple of its subtrees; the single node is ().

def _grow(tree: tuple) -> set[tuple]:
    """Every tree with one more node than ``tree``."""
    grown = {tuple(sorted(tree + ((),)))}
    for position, child in enumerate(tree):
        for bigger in _grow(child):
            grown.add(tuple(sorted(tree[:position] + (bigger,) + tree[position + 1:])))
    return grown


@cache
def rooted_trees(nodes: int) -> tuple[tuple, ...]:
    """All rooted trees with ``nodes`` nodes (1, 1, 2, 4, 9, 20, … of them)."""
    if nodes == 1:
        return ((),)
    return tuple(sorted({bigger for tree in rooted_trees(nodes - 1) for bigger in _grow(tree)}))


def _size(tree: tuple) -> int:
    return 1 + sum(_size(child) for child in tree)


def _density(tree: tuple) -> int:
    density = _size(tree)
    for child in tree:
        density *= _density(child)
    return density


def _weights(tableau: Tableau, tree: tuple) -> list[sp.Expr]:
    """``Φ_i(t)``: product over the subtrees of ``(A Φ(child))_i``."""
    values = [sp.Integer(1)] * tableau.stages
    for child in tree:
        inner = _weights(tableau, child)
        values = [value * sum((tableau.a[i][j] * inner[j] for j in range(tableau.stages)), sp.Integer(0))
                  for i, value in enumerate(values)]
    return values


def _order(tableau: Tableau) -> int:
    for nodes in range(1, MAX_ORDER + 1):
        for tree in rooted_trees(nodes):
            elementary = sum((b * w for b, w in zip(tableau.b, _weights(tableau, tree))), sp.Integer(0))
            if elementary != sp.Rational(1, _density(tree)):
                return nodes - 1
    return MAX_ORDER


# -- registry -----------------------------------------------------------------------------

EULER = make_tableau("euler", [[]], [1], "explicit Euler")
HEUN = make_tableau("heun", [[], [1]], ["1/2", "1/2"], "rk2 (Heun)")
RK4 = make_tableau("rk4", [[], ["1/2"], [0, "1/2"], [0, 0, 1]], ["1/6", "1/3", "1/3", "1/6"],
                   "rk4 (classic Runge–Kutta)")

#: Tableaux by the name scheme files use (``rk = "rk4"``).
TABLEAUX: dict[str, Tableau] = {}


def register_tableau(method: Tableau) -> Tableau:
    """Make ``method`` usable by name in scheme files; a name is registered once."""
    if not isinstance(method, Tableau):
        raise SplitformerError(f"register_tableau: {method!r} is not a Tableau (use make_tableau)")
    if TABLEAUX.get(method.name, method) != method:
        raise SplitformerError(f"register_tableau: tableau {method.name!r} is already registered")
    TABLEAUX[method.name] = method
    return method


def tableau(name: str) -> Tableau:
    """The registered tableau ``name``; a ``SplitformerError`` lists the known ones."""
    if name not in TABLEAUX:
        raise SplitformerError(f"unknown Runge–Kutta tableau {name!r} (known: {', '.join(sorted(TABLEAUX))})")
    return TABLEAUX[name]


for _method in (EULER, HEUN, RK4):
    register_tableau(_method)
