"""Re-checking a derived projection against the conditions that define it (used on cache loads).

A cached ``Projection`` reaches the derivation only if its formulas satisfy, at fresh
random points in 50-digit arithmetic, the conditions the derivation solved:

- LayerNorm with the ghost coordinate: ``u`` is an affine map of the component ``v``
  (stationarity of the Lagrangian), its mean is ``σ₁`` and its variance, ghost included,
  ``σ₂²`` (the constraints), and its slope is positive (the minimizing root). These fix
  the formula uniquely. ``theorem`` is the same with ``γ = 0``; ``distance`` must be
  ``‖u − v‖²`` of that map and ``gap`` the distance difference of the two roots.
- ReLU: ``u ≥ 0``, ``λ = u − v ≥ 0``, ``λ u = 0`` (KKT of ``min ½(u − v)², u ≥ 0``).

Points are drawn from the operating system's random source, so an entry crafted to pass
at known points fails. The narrative steps are text that only the report shows: they are
checked to hold no markup (no ``$``, backquote, ``<``, link or new line, and only the
LaTeX commands derivations write), not re-derived. Values that reach code or a check
(``formula``, ``theorem``) must moreover be written exactly in the canonical form the
derivation produces (structural equality, the same tree, as the closed forms below, hand-written here and
proven by the conditions above and by a test against the fresh derivation): a value-equal
form in other operations could cancel catastrophically in float (``((v + c)² − c²)/(v + 2c)``
is exactly ``v``), so no other form is accepted. ``distance`` and ``gap`` reach checks and
reports: they too must be the derivation's canonical forms (value-equal within the numeric tolerance was
accepted once: a tester's ``distance + 1/10^60`` changed the report's formula and failed Theorem 3.1's check).
A verifier raises ``ValueError`` naming the condition that fails.
"""

from __future__ import annotations

import random
import re

import sympy as sp

from .constraints import SYMBOLS

__all__ = ["verify_layer_norm_projection", "verify_relu_projection", "canonical_layer_norm", "canonical_distance",
           "canonical_gap", "canonical_relu"]

DIGITS = 50
TOLERANCE = sp.Float("1e-30", DIGITS)
POINTS = 4


def _number(text: str, expression: sp.Expr, point: dict) -> sp.Float:
    value = sp.N(expression.xreplace(point), DIGITS)
    if not (value.is_Number and value.is_finite and value.is_real):
        raise ValueError(f"{text} is not a real number at {point}: {value}")
    return sp.Float(value, DIGITS)


def _close(text: str, left: sp.Expr, right: sp.Expr, point: dict) -> None:
    first, second = _number(text, left, point), _number(text, right, point)
    if abs(first - second) > TOLERANCE * (1 + abs(second)):
        raise ValueError(f"{text} fails at {point}: {first} ≠ {second}")


def _only(name: str, expression, allowed: set) -> None:
    if not isinstance(expression, sp.Expr):
        raise ValueError(f"{name} is not an expression")
    extra = expression.free_symbols - allowed
    if extra:
        raise ValueError(f"{name} has unexpected symbols {sorted(map(str, extra))}")


#: What report text must not hold: leaving math mode, Markdown code or links, HTML, a new line.
_ACTIVE = ("$", "`", "<", "](", "]:", "][", "{:", "\n", "\r")
#: The LaTeX commands a derivation's narrative may use: typesetting, Greek letters, relations.
#: Anything else (``\href``, ``\input``, ``\def``, ``\end{align*}`` …) is refused.
_COMMANDS = frozenset("""
    frac sqrt left right quad qquad text mathcal mathrm operatorname max min cdot geq leq ne neq
    Rightarrow xrightarrow to sum prod limits infty partial hat bar tilde lVert rVert
    alpha beta gamma delta varepsilon epsilon lambda mu sigma xi eta chi phi varphi omega
    begin{cases} end{cases}
""".split())
_COMMAND = re.compile(r"\\([a-zA-Z]+)(\{[a-zA-Z*]*\})?")
#: The operations the code printers can spell: a cached formula holds nothing else.
_PRINTABLE = (sp.Add, sp.Mul, sp.Pow, sp.Max, sp.Symbol, sp.Number)


def _steps(steps) -> None:
    """The narrative (description, LaTeX) pairs: text only, nothing a report would render as markup."""
    if not isinstance(steps, tuple) or not all(
            isinstance(step, tuple) and len(step) == 2 and all(isinstance(text, str) and len(text) < 20_000 for text in step)
            for step in steps):
        raise ValueError("steps are not pairs of text")
    for description, latex in steps:
        if any(mark in description + latex for mark in _ACTIVE) or any(mark in description for mark in "[]{}"):
            raise ValueError(f"step {description[:40]!r} holds markup ({', '.join(repr(m) for m in _ACTIVE)} are "
                             "refused, and brackets or braces in its description: a link definition, attributes)")
        for name, argument in _COMMAND.findall(description + latex):
            command = name + argument if name in ("begin", "end") else name
            if command not in _COMMANDS:
                raise ValueError(f"step {description[:40]!r} holds the LaTeX command \\{command}, "
                                 "which no derivation writes")


def _printable(name: str, formula: sp.Expr, allowed: tuple = _PRINTABLE) -> None:
    """``formula`` is built only of ``allowed`` operations (those the code printers spell), numeric exponents."""
    for node in sp.preorder_traversal(formula):
        if not isinstance(node, allowed) or (isinstance(node, sp.Pow) and not node.exp.is_Number):
            raise ValueError(f"{name} uses {type(node).__name__}, which the code printers do not spell")


def _canonical(name: str, value: sp.Expr, expected: sp.Expr) -> None:
    """``value`` is written exactly as ``expected`` (the same tree), not merely equal in value."""
    if not isinstance(value, sp.Basic) or value != expected:
        raise ValueError(f"{name} is not in the canonical form the derivation writes ({expected}): "
                         "a value-equal form may round differently")


def canonical_layer_norm(ghost_variance: sp.Expr) -> sp.Expr:
    """``σ₁ + σ₂ (v − α) / √(β + ghost_variance)``: the form the derivation writes."""
    s = SYMBOLS
    return s.sigma_1 + s.sigma_2 * (s.v - s.alpha) / sp.sqrt(s.beta + ghost_variance)


def canonical_distance() -> sp.Expr:
    """``N (α² − 2 α σ₁ − 2 √β σ₂ + β + σ₁² + σ₂²)``, ``‖u − v‖²`` of the minimizer: the form the derivation writes."""
    s = SYMBOLS
    return s.size * (s.alpha**2 - 2 * s.alpha * s.sigma_1 - 2 * sp.sqrt(s.beta) * s.sigma_2 + s.beta + s.sigma_1**2
                     + s.sigma_2**2)


def canonical_gap() -> sp.Expr:
    """``4 √N σ₂ √(N β + γ²)``, the distance of the negative root less that of the positive one: the form the
    derivation writes."""
    s = SYMBOLS
    return 4 * sp.sqrt(s.size) * s.sigma_2 * sp.sqrt(s.size * s.beta + s.ghost**2)


def canonical_relu() -> sp.Expr:
    """``max(0, v)``: the form the derivation writes."""
    return sp.Max(0, SYMBOLS.v)


def _random_points() -> list[dict]:
    s, draw = SYMBOLS, random.SystemRandom()

    def rational(low: int, high: int) -> sp.Rational:
        return sp.Rational(draw.randint(low, high), 1000)

    return [{s.v: rational(-3000, 3000), s.alpha: rational(-3000, 3000), s.sigma_1: rational(-3000, 3000),
             s.beta: rational(1, 3000), s.sigma_2: rational(1, 3000), s.epsilon: rational(1, 1000),
             s.ghost: rational(0, 3000), s.size: sp.Integer(draw.randint(1, 64))} for _ in range(POINTS)]


def _slope(name: str, formula: sp.Expr) -> sp.Expr:
    """The slope of an affine map of ``v``: stationarity makes every component the same affine map."""
    v = SYMBOLS.v
    slope = sp.diff(formula, v)
    if v in slope.free_symbols:
        raise ValueError(f"{name} is not an affine map of v: the stationarity condition fails")
    return slope


def _on_sphere(name: str, formula: sp.Expr, ghost_variance: sp.Expr, points: list[dict]) -> None:
    """Mean σ₁, variance (ghost included) σ₂², positive slope: the minimizing stationary point."""
    s = SYMBOLS
    slope = _slope(name, formula)
    for point in points:
        _close(f"{name}: the mean constraint", formula.subs(s.v, s.alpha), s.sigma_1, point)
        _close(f"{name}: the variance constraint", slope**2 * (s.beta + ghost_variance), s.sigma_2**2, point)
        if _number(f"{name}: the slope", slope, point) <= 0:
            raise ValueError(f"{name}: the slope is not positive at {point}: not the minimizing root")


def _mean_square(affine: sp.Expr) -> sp.Expr:
    """Mean over the features of ``(a v + b)²``: ``a² (β + α²) + 2 a b α + b²``."""
    s = SYMBOLS
    a, b = sp.diff(affine, s.v), affine.subs(s.v, 0)
    return a**2 * (s.beta + s.alpha**2) + 2 * a * b * s.alpha + b**2


def verify_layer_norm_projection(projection) -> None:
    """Raise ``ValueError`` unless ``projection`` is the projection onto S₁ with the ghost coordinate."""
    s = SYMBOLS
    _steps(projection.steps)
    parameters = {s.alpha, s.beta, s.sigma_1, s.sigma_2, s.size}
    _only("formula", projection.formula, parameters | {s.v, s.epsilon})
    _printable("formula", projection.formula)
    _only("theorem", projection.theorem, parameters | {s.v})
    _only("distance", projection.distance, parameters)
    _only("gap", projection.gap, parameters | {s.ghost})
    for name in ("distance", "gap"):  # algebraic: no max, which SymPy's series and limits cannot expand
        _printable(name, getattr(projection, name), tuple(kind for kind in _PRINTABLE if kind is not sp.Max))
    _canonical("formula", projection.formula, canonical_layer_norm(s.epsilon))
    _canonical("theorem", projection.theorem, canonical_layer_norm(sp.Integer(0)))
    _canonical("distance", projection.distance, canonical_distance())
    _canonical("gap", projection.gap, canonical_gap())
    points = _random_points()
    _on_sphere("formula", projection.formula, s.epsilon, points)
    _on_sphere("theorem", projection.theorem, sp.Integer(0), points)
    squared = s.size * _mean_square(projection.theorem - s.v)
    ghost_slope = _slope("formula", projection.formula).subs(s.epsilon, s.ghost**2 / s.size)

    def distance(root: sp.Expr) -> sp.Expr:
        return s.size * _mean_square(s.sigma_1 + root * (s.v - s.alpha) - s.v) + (root - 1) ** 2 * s.ghost**2

    for point in points:
        _close("distance: ‖u − v‖² of the minimizer", projection.distance, squared, point)
        _close("gap: distance of the negative root minus that of the positive one", projection.gap,
               distance(-ghost_slope) - distance(ghost_slope), point)
        if _number("gap", projection.gap, point) <= 0:
            raise ValueError(f"gap is not positive at {point}")


def verify_relu_projection(projection) -> None:
    """Raise ``ValueError`` unless ``projection.formula`` satisfies the KKT conditions of ``u ≥ 0``."""
    s = SYMBOLS
    _steps(projection.steps)
    _only("formula", projection.formula, {s.v})
    _printable("formula", projection.formula)
    if (projection.distance, projection.theorem, projection.gap) != (None, None, None):
        raise ValueError("a ReLU projection carries only its formula and steps")
    _canonical("formula", projection.formula, canonical_relu())
    draw = random.SystemRandom()
    values = [sp.Integer(0)] + [sp.Rational(sign * draw.randint(1, 3000), 1000) for sign in (1, -1) for _ in range(POINTS)]
    for value in values:
        point = {s.v: value}
        u = _number("formula", projection.formula, point)
        multiplier = u - value
        if u < -TOLERANCE or multiplier < -TOLERANCE or abs(u * multiplier) > TOLERANCE:
            raise ValueError(f"formula fails the KKT conditions at v = {value}: u = {u}, λ = {multiplier}")
