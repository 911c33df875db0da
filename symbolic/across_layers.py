"""Schemes whose step reads the previous layers: a linear multistep method or a second state.

A block scheme's step is one explicit Euler evaluation of its field ``G``: the block maps
``w`` to ``w + D`` with the increment ``D = Δt G(w)``. An ``[across_layers]`` table of the
scheme file combines these increments across layers with a second state ``v`` carried from
layer to layer (``state = (u, v)``):

- ``adams-bashforth``: ``u⁺ = u + Δt(3/2 G(u) − 1/2 G(u⁻))``; ``v`` is the previous
  increment. The weights are derived (the integral over one step of the polynomial through the
  two last field values), the first layer is the one-step method (Euler).
- ``two-step``: the same with the file's ``weights`` (they must sum to 1: consistency).
- ``heavy-ball``: ``v⁺ = β v + Δt G(u)``, ``u⁺ = u + v⁺`` (Polyak's momentum, ``β = momentum``).
- ``nesterov``: ``v⁺ = β v + Δt G(u + β v)``, ``u⁺ = u + v⁺``.

Each method is stated as SymPy equations in ``u, v, w, D``; the emitted code prints them, its
adjoint prints their derivatives. The order is derived by series: the local error of one step
from exact history on ``u' = s f(u)`` (scalar, ``f`` a generic function), ``s`` the scale that
makes the method consistent (``1`` for Adams–Bashforth; ``1/(1 − β)`` for momentum with a
fixed ``β``: heavy-ball and Nesterov converge to the flow of ``G/(1 − β)``, not of ``G``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import sympy as sp

from .errors import SplitformerError
from .exact_numbers import exact_number

__all__ = ["AcrossLayers", "ACROSS_LAYER_METHODS", "adams_bashforth_weights", "across_layers_from_table",
           "AcrossLayerOrder"]

#: The methods an ``[across_layers]`` table may name, and what each needs.
ACROSS_LAYER_METHODS = {
    "adams-bashforth": "two-step Adams–Bashforth (weights derived)",
    "two-step": "explicit two-step method with the file's weights",
    "heavy-ball": "Polyak's heavy-ball momentum (needs momentum)",
    "nesterov": "Nesterov's momentum (needs momentum)",
}
_KEYS = {"method", "momentum", "weights"}
#: Powers of Δt the order series expands to: orders up to ``_SERIES - 1`` are told apart.
_SERIES = 4

u, v, w, D = sp.symbols("u v w D")


def adams_bashforth_weights(steps: int) -> tuple[sp.Rational, ...]:
    """The explicit Adams weights ``b_j`` of ``u⁺ = u + Δt Σ_j b_j G(u_{n−j})``: the integral over
    ``s ∈ [0, 1]`` of the Lagrange basis polynomials through the nodes ``s = 0, −1, …``."""
    s = sp.Symbol("s")
    nodes = [-j for j in range(steps)]
    weights = []
    for j, node in enumerate(nodes):
        basis = sp.prod([(s - other) / (node - other) for other in nodes if other != node])
        weights.append(sp.integrate(basis, (s, 0, 1)))
    return tuple(weights)


@dataclass(frozen=True)
class AcrossLayers:
    """How a stack combines its layers' increments (see the module docstring)."""

    method: str
    momentum: sp.Rational = sp.Integer(0)
    weights: tuple[sp.Rational, ...] = ()

    def __post_init__(self) -> None:
        try:  # 0.5, "1/2" and Rational(1, 2) are one exact number
            object.__setattr__(self, "momentum", exact_number(self.momentum))
            object.__setattr__(self, "weights", tuple(exact_number(weight) for weight in self.weights))
        except (TypeError, ValueError) as error:
            raise SplitformerError(f"across_layers: {error}") from None
        if self.method not in ACROSS_LAYER_METHODS:
            raise SplitformerError(f"across_layers: unknown method {self.method!r} "
                                   f"(known: {', '.join(ACROSS_LAYER_METHODS)})")
        momentum = self.method in ("heavy-ball", "nesterov")
        if momentum and not 0 < self.momentum < 1:
            raise SplitformerError(f"across_layers: {self.method} needs a momentum β with 0 < β < 1, got {self.momentum}")
        if not momentum and self.momentum != 0:
            raise SplitformerError(f"across_layers: {self.method} takes no momentum")
        if self.method == "two-step":
            if len(self.weights) != 2 or sum(self.weights) != 1:
                raise SplitformerError(f"across_layers: two-step needs 2 weights summing to 1 (consistency), "
                                       f"got {[str(weight) for weight in self.weights]}")
        elif self.weights:
            raise SplitformerError(f"across_layers: {self.method} takes no weights"
                                   + (" (they are derived)" if self.method == "adams-bashforth" else ""))

    @property
    def key(self) -> tuple:
        """What the stack computes (part of the scheme's fingerprint)."""
        return self.method, str(self.momentum), tuple(map(str, self.weights))

    @cached_property
    def equations(self) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
        """``(w, u⁺, v⁺)`` in the symbols ``u, v`` (the states) and ``D`` (the block's increment at ``w``)."""
        beta = self.momentum
        if self.method in ("adams-bashforth", "two-step"):
            b0, b1 = self.weights or adams_bashforth_weights(2)
            return u, u + b0 * D + b1 * v, D
        point = u + beta * v if self.method == "nesterov" else u
        return point, u + beta * v + D, beta * v + D

    @cached_property
    def start(self) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
        """The first layer's ``(w, u⁺, v⁺)``: there is no previous layer (``v = 0``); Adams–Bashforth
        starts with its one-step member (``adams_bashforth_weights(1)``: Euler)."""
        point, _, velocity = (expr.subs(v, 0) for expr in self.equations)
        (b0,) = adams_bashforth_weights(1)
        return point, u + b0 * D, velocity

    @property
    def start_note(self) -> str:
        """What the first layer does, in words (a comment of the emitted code)."""
        if self.method in ("adams-bashforth", "two-step"):
            return "no previous increment: the one-step Adams–Bashforth method (Euler)"
        return "no previous layer: v = 0"

    def latex(self) -> list[str]:
        """One LaTeX line per equation of a layer after the first."""
        point, new_u, new_v = self.equations
        un, vn = sp.Symbol("u^{n}"), sp.Symbol("v^{n}")
        increment = sp.Symbol(r"\Delta t\,G^{n}(w^{n})")
        names = {u: un, v: vn, D: increment}
        return [rf"w^{{n}} = {sp.latex(point.subs(names))}", rf"u^{{n+1}} = {sp.latex(new_u.subs(names))}",
                rf"v^{{n+1}} = {sp.latex(new_v.subs(names))}"]

    def rows(self) -> list[tuple[str, str]]:
        """A title and ``latex()``'s lines, as rows of ``latex.align`` (``show --format latex``)."""
        return [("text", f"Across layers ({self.method}), each layer after the first; the first: {self.start_note}"),
                *(("equation", line) for line in self.latex())]

    def text(self) -> str:
        """The update of a layer after the first in plain text (``D = Δt G(w)``, the block's increment at ``w``)."""
        point, new_u, new_v = self.equations
        return (f"across layers ({self.method}), each layer after the first, D = Δt G(w) the block's increment at w: "
                f"w = {point}; u⁺ = {new_u}; v⁺ = {new_v} (the first layer: {self.start_note})")

    def order(self) -> "AcrossLayerOrder":
        return _series_order(self)


@dataclass(frozen=True)
class AcrossLayerOrder:
    """The consistent scale ``s`` (``None``: inconsistent), the order, the leading local error term."""

    scale: sp.Expr | None
    order: int
    leading: sp.Expr

    @property
    def leading_in_fields(self) -> sp.Expr:
        """``leading`` written in the field ``G`` and its derivatives (``G'``, ``G''``) instead of ``f(x)``."""
        field = sp.Function("f")(sp.Symbol("x"))
        return self.leading.replace(
            lambda node: isinstance(node, sp.Derivative) and node.expr == field,
            lambda node: sp.Symbol("G" + "'" * node.derivative_count)).subs(field, sp.Symbol("G"))


def _series_order(method: AcrossLayers) -> AcrossLayerOrder:
    """Local error of one layer from exact history on ``u' = s f(u)``, by Taylor series in ``Δt``."""
    h, s, x = sp.symbols("h s x")
    f = sp.Function("f")
    derivatives = [x, s * f(x)]  # u, u', u'', … at t as expressions in x = u(t)
    for _ in range(_SERIES):
        derivatives.append(sp.diff(derivatives[-1], x) * s * f(x))

    def exact(k: int) -> sp.Expr:  # u(t + k h)
        return sum((k * h) ** m / sp.factorial(m) * derivatives[m] for m in range(_SERIES + 1))

    def field(at: sp.Expr) -> sp.Expr:  # Δt f(at) expanded around x
        shift = sp.expand(at - x)
        return h * sum(sp.diff(f(x), x, j) * shift ** j / sp.factorial(j) for j in range(_SERIES))

    point, new_u, new_v = method.equations
    if new_v == D:  # v is the previous increment, at the previous state (Adams form: w = u)
        history = field(exact(-1))
    else:  # u⁺ = u + v⁺: v is the last difference of states
        history = exact(0) - exact(-1)
    state = {u: exact(0), v: history}
    at = point.subs(state)
    error = sp.expand(new_u.subs(state).subs(D, field(at)) - exact(1))  # scheme − exact, as a block's leading error
    error = sum(error.coeff(h, m) * h ** m for m in range(_SERIES + 1))
    first = sp.factor(error.coeff(h, 1))
    scales = sp.solve(first, s)
    if not scales:
        return AcrossLayerOrder(None, 0, first * h)
    scale = scales[0]
    error = sp.expand(error.subs(s, scale))
    for power in range(2, _SERIES + 1):
        term = sp.expand(error.coeff(h, power))
        if term != 0:
            return AcrossLayerOrder(scale, power - 1, sp.factor(term) * h ** power)
    return AcrossLayerOrder(scale, _SERIES, sp.Integer(0))


def across_layers_from_table(table: dict, fail) -> AcrossLayers:
    """An ``AcrossLayers`` from a scheme file's ``[across_layers]`` table; ``fail(key, message)`` makes the error."""
    extra = sorted(set(table) - _KEYS)
    if extra:
        raise fail(f"across_layers.{extra[0]}", f"unknown field (allowed: {', '.join(sorted(_KEYS))})")
    method = table.get("method")
    if not isinstance(method, str):
        raise fail("across_layers.method", f"expected one of {', '.join(ACROSS_LAYER_METHODS)}")

    def number(value, path: str) -> sp.Rational:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise fail(path, f"expected a number, got {type(value).__name__}")
        try:
            return exact_number(value)
        except ValueError as error:
            raise fail(path, str(error)) from None

    weights = table.get("weights", [])
    if not isinstance(weights, list):
        raise fail("across_layers.weights", f"expected a list, got {type(weights).__name__}")
    momentum = number(table.get("momentum", 0), "across_layers.momentum")
    numbers = tuple(number(weight, f"across_layers.weights[{n}]") for n, weight in enumerate(weights))
    try:  # the method's own refusals, said once with the file's place
        return AcrossLayers(method, momentum, numbers)
    except SplitformerError as error:
        raise fail("across_layers", str(error).removeprefix("across_layers: ")) from None
