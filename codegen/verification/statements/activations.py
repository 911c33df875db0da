"""Activations as proximal maps: ``σ = prox_φ`` for a convex ``φ`` iff σ is monotone and 1-Lipschitz.

For such σ the penalty has ``φ'(u) = σ⁻¹(u) − u`` on the range of σ (and ``+∞`` off it).
Otherwise the check names a witness: a point where ``σ' < 0`` or ``σ' > 1``.
"""

from __future__ import annotations

import sympy as sp

from splitformer.symbolic.activations import ACTIVATIONS, Activation
from splitformer.symbolic.projections import SYMBOLS as S
from ..time_bound import OutOfTime, within
from . import Check, plain

__all__ = ["activation_checks", "PROXIMAL"]

#: The claim the reports make for each activation (docs/model.md §6).
PROXIMAL = {"relu": True, "tanh": True, "gelu": False, "silu": False, "gelu-tanh": False, "relu-squared": False}
#: Where ``_witness`` looks for a slope outside [0, 1]: 97 points of [−6, 6].
SAMPLES = tuple(sp.Rational(n, 8) for n in range(-48, 49))
#: Further out, where no proof is found: about ±2^(k/4) from ±6.7 to ±1024 (eighths).
FAR_SAMPLES = tuple(sign * sp.Rational(round(8 * 2 ** (k / 4)), 8) for k in range(11, 41) for sign in (-1, 1))
#: Where no proof is found: σ' in float64 at this many points of [−8, 8] (``_dense_witness``).
DENSE = 2**16 + 1
#: How long SymPy may look for σ's jumps and critical points before the check samples instead.
SYMPY_SECONDS = 20.0
#: The penalties, stated as claims; the check verifies prox_φ = σ for each.
PENALTIES = {
    "relu": "the indicator of [0, ∞)",
    "tanh": "φ(u) = u·artanh(u) + ½ log(1 − u²) − u²/2 on (−1, 1), +∞ elsewhere",
}


def _witness(activation: Activation, samples: tuple[sp.Rational, ...] = SAMPLES) -> str | None:
    """The point of ``samples`` (the eighths of [−6, 6] unless given) where σ' leaves [0, 1] the most, if any: a
    witness refutes the claim; none proves nothing."""
    slope = sp.diff(activation.formula, S.v)
    worst, excess = None, sp.Integer(0)
    for v in samples:
        value = slope.evalf(30, subs={S.v: v})  # numerically at v: substituting first rebuilds the tree
        if not value.is_real:
            continue
        outside = max(-value, value - 1)
        if outside > excess:
            worst, excess = (v, value), outside
    if worst is None:
        return None
    v, value = worst
    return f"σ'({v}) = {sp.N(value, 6)} {_verdict(value)}"


def _dense_witness(activation: Activation) -> str | None:
    """Where SymPy decided nothing: σ' in float64 at ``DENSE`` points of [−8, 8] (a spacing of 2.4e-4, finer than
    any feature the eighths miss: a tester's bump of width 0.02 had σ' from −2.2 to 3.2 between two of them), the worst
    point then rounded to a rational and evaluated in 30 digits, which alone makes it a witness."""
    import math

    import numpy as np

    slope = sp.diff(activation.formula, S.v)
    try:
        evaluate = sp.lambdify(S.v, slope, modules=[{"erf": np.vectorize(math.erf, otypes=[float])}, "numpy"])
        with np.errstate(all="ignore"):
            grid = np.linspace(-8.0, 8.0, DENSE)
            values = np.broadcast_to(np.asarray(evaluate(grid), dtype=float), grid.shape)
    except Exception:  # noqa: BLE001 - a formula NumPy cannot evaluate: no dense scan, the samples stand
        return None
    excess = np.where(np.isfinite(values), np.maximum(-values, values - 1), 0.0)
    if not excess.max() > 0:
        return None
    point = sp.Rational(round(float(grid[int(excess.argmax())]) * 2**20), 2**20)
    return _witness(activation, (point,))


def _verdict(value: sp.Expr) -> str:
    return "< 0: not monotone" if value < 0 else "> 1: expansive"


#: Functions whose arguments split the line into pieces.
_KINKS = (sp.Max, sp.Min, sp.Abs, sp.Heaviside, sp.sign)


def _pieces(formula: sp.Expr) -> list[tuple[sp.Expr, sp.Set]] | None:
    """``formula`` as smooth pieces and the sets of the line where each holds (``Max``, ``Min``, ``Abs``, steps written
    as a ``Piecewise``): one piece, the whole line, for a smooth formula. ``None`` where a kink's argument is no
    polynomial in ``V`` (``Max(erf(v) − 1/2, 0)``): SymPy may not solve where it changes sign, or take minutes to."""
    kinks = formula.atoms(*_KINKS)
    if any(not argument.xreplace({kink: sp.Dummy() for kink in kinks}).is_polynomial(S.v)
           for kink in kinks for argument in kink.args):  # a kink's argument: a polynomial of V and kinks
        return None
    folded = sp.piecewise_fold(formula.rewrite(sp.Piecewise))
    if not isinstance(folded, sp.Piecewise):
        return [(folded, sp.S.Reals)]
    pieces, covered = [], sp.S.EmptySet
    for expr, condition in folded.args:
        region = (sp.S.Reals if condition is sp.true else condition.as_set()) - covered
        covered = covered | region
        pieces.append((expr, region))
    return pieces


def _intervals(pieces: list[tuple[sp.Expr, sp.Set]]) -> list[tuple[sp.Expr, sp.Interval]] | None:
    """Each piece with each interval (of positive length) of its region; ``None`` where a region is no union of
    intervals and points (a ``ConditionSet``: SymPy did not solve where the piece holds)."""
    intervals = []
    for expr, region in pieces:
        for part in region.args if isinstance(region, sp.Union) else (region,):
            if isinstance(part, sp.Interval) and part.measure > 0:
                intervals.append((expr, part))
            elif not isinstance(part, (sp.Interval, sp.FiniteSet)) and part is not sp.S.EmptySet:
                return None
    return intervals


def _singularities(expr: sp.Expr, interval: sp.Interval) -> list[sp.Expr]:
    """The points of ``interval`` where ``expr`` is not continuous, where SymPy finds them as points (else none:
    ``_slope_extremes`` then finds no proof)."""
    try:
        gap = interval - sp.calculus.util.continuous_domain(expr, S.v, interval)
    except NotImplementedError:
        return []
    return sorted(gap, key=float) if isinstance(gap, sp.FiniteSet) else []


def _jump(formula: sp.Expr, intervals: list[tuple[sp.Expr, sp.Interval]]) -> str | None:
    """Where σ is not continuous: a singularity inside a piece, or a point where its pieces meet (undefined there, or
    their limits differ): no 1-Lipschitz map, so no proximal one (``Max(v, 0)/v``, a unit step, is a jump the pieces
    themselves hide)."""
    ends = {}  # a point → the limits there of the pieces ending and starting at it
    for expr, interval in intervals:
        for point in _singularities(expr, interval):
            left, right = (sp.limit(expr, S.v, point, side) for side in ("-", "+"))
            if not (left.is_finite and right.is_finite and sp.N(left - right, 30) == 0):  # removable: no jump
                return f"σ is not continuous at v = {point} (a singularity of {expr}, its limits {left} and {right})"
        for end, side in ((interval.sup, "-"), (interval.inf, "+")):
            if end.is_finite:
                ends.setdefault(end, []).append(sp.limit(expr, S.v, end, side))
    for point in sorted(ends, key=float):
        value = formula.subs(S.v, point)
        if not all(item.is_finite for item in (value, *ends[point])) or any(
                sp.N(limit - value, 30) != 0 for limit in ends[point]):
            limits = " and ".join(map(str, ends[point]))
            return f"σ is not continuous at v = {point} (σ({point}) = {value}, its pieces' limits {limits})"
    return None


def _slope_extremes(intervals: list[tuple[sp.Expr, sp.Interval]]) -> list[tuple[str, sp.Expr]] | None:
    """``σ'`` where it takes its extremes: on each open interval where σ is one smooth piece, at the critical points
    (``σ'' = 0``, solved by SymPy) and as the ends are approached; ``None`` where SymPy cannot solve ``σ'' = 0`` on a
    piece (a transcendental equation: SiLU's) or a piece's slope is not continuous on its interval."""
    extremes = []
    for expr, interval in intervals:
        slope = sp.diff(expr, S.v)
        try:
            if sp.calculus.util.continuous_domain(slope, S.v, interval) != interval:
                return None
        except NotImplementedError:  # a function SymPy cannot tell the continuity of
            return None
        if slope.is_number:
            extremes.append((f"σ' on ({interval.inf}, {interval.sup})", slope))
            continue
        critical = sp.solveset(sp.diff(slope, S.v), S.v, interval)
        if not isinstance(critical, sp.FiniteSet) and critical is not sp.S.EmptySet:
            return None
        extremes += [(f"σ'({point})", slope.subs(S.v, point)) for point in critical]
        extremes += [(f"lim σ' as v → {end}", sp.limit(slope, S.v, end, side))
                     for end, side in ((interval.inf, "+"), (interval.sup, "-"))]
    return extremes


def _penalty_matches(name: str, activation: Activation) -> tuple[bool, str]:
    """Check ``prox_φ = σ``, i.e. ``v − σ(v) ∈ ∂φ(σ(v))`` for the stated penalty."""
    v = sp.Symbol("p", positive=True)
    if name == "relu":  # ∂I_{[0,∞)}(u) = {0} for u > 0, (−∞, 0] at u = 0
        positive = sp.simplify(v - activation(v)) == 0
        negative = activation(-v) == 0 and (-v - activation(-v) <= 0) is sp.true
        return positive and negative, "v − σ(v) ∈ ∂I_{[0,∞)}(σ(v)) on both half-lines"
    u = sp.Symbol("u", real=True)
    penalty = u * sp.atanh(u) + sp.log(1 - u**2) / 2 - u**2 / 2
    gradient = sp.diff(penalty, u)
    residual = gradient.subs(u, activation(S.v)) - (S.v - activation(S.v))
    identity = sp.simplify(sp.expand_log(residual.rewrite(sp.log).rewrite(sp.exp), force=True))
    curvature = sp.simplify(sp.diff(penalty, u, 2).subs(u, activation(S.v)))  # φ'' on the range of σ
    holds = identity == 0 and curvature.is_nonnegative is True
    return holds, f"φ'(σ(v)) − (v − σ(v)) = {plain(identity)}, φ''(σ(v)) = {plain(curvature)} ≥ 0"


def activation_checks(claims: dict[str, bool] | None = None, names: tuple[str, ...] | None = None) -> list[Check]:
    """``activation/<name>`` for every activation (or those in ``names``): its proximal claim proved or refuted."""
    claims = PROXIMAL if claims is None else claims
    checks = []
    for name in ACTIVATIONS if names is None else names:
        activation = ACTIVATIONS[name]()
        proximal, method, detail = _decided(name, activation)
        claim = claims[name] if name in claims else activation.proximal
        checks.append(Check(
            f"activation/{name}", None,
            f"{name} {'is' if claim else 'is not'} the proximal map of a convex penalty "
            "(for a map of the line: iff it is monotone and 1-Lipschitz).",
            method, proximal == claim, detail,
        ))
    return checks


def _analysed(formula: sp.Expr) -> tuple[str | None, list | None]:
    """A jump of σ (a witness), else σ' at its extremes (``_slope_extremes``), where SymPy finds them."""
    pieces = _pieces(formula)
    intervals = None if pieces is None else _intervals(pieces)
    if intervals is None:
        return None, None
    witness = _jump(formula, intervals)
    return witness, None if witness is not None else _slope_extremes(intervals)


def _decided(name: str, activation: Activation) -> tuple[bool, str, str]:
    """Whether ``activation`` is a proximal map, how that was decided (``symbolic``: a witness, or σ continuous with
    σ' within [0, 1] at its extremes; ``numeric``: no witness at the samples, not proved), and the detail."""
    witness, extremes, late = _witness(activation), None, ""
    if witness is None:
        try:
            witness, extremes = within(SYMPY_SECONDS, lambda: _analysed(activation.formula))
        except OutOfTime:  # a tester's narrow bump: solveset of σ'' = 0 ran for minutes
            late = f"SymPy did not decide within {SYMPY_SECONDS:g} s; "
        if witness is None and extremes is None:
            witness = _witness(activation, FAR_SAMPLES) or _dense_witness(activation)  # the eighths held
        elif extremes is not None:
            outside = [(where, value) for where, value in extremes if not 0 <= value <= 1]
            if outside:
                where, value = max(outside, key=lambda item: max(-item[1], item[1] - 1))
                witness = f"{where} = {sp.N(value, 6)} {_verdict(value)}"
    if witness is not None:
        return False, "symbolic", f"not a proximal map of a convex penalty: {witness}"
    if not extremes:
        why = late or "no closed form for the zeros of σ'' or where its pieces meet; "
        return True, "numeric", (f"0 ≤ σ' ≤ 1 at {len(SAMPLES)} points of [−6, 6], {len(FAR_SAMPLES)} out to ±1024 and "
                                 f"{DENSE} of [−8, 8] in float64, not proved: {why}sampled evidence only")
    if name in PENALTIES:
        penalty_ok, how = _penalty_matches(name, activation)
        return penalty_ok, "symbolic", f"monotone and 1-Lipschitz; penalty {PENALTIES[name]}; {how}"
    low, high = min(value for _, value in extremes), max(value for _, value in extremes)
    return True, "symbolic", (f"σ is continuous and {sp.N(low, 6)} ≤ σ' ≤ {sp.N(high, 6)} at its extremes (critical "
                              "points and the ends of its smooth pieces): monotone and 1-Lipschitz, the proximal map of "
                              "the convex penalty with φ'(u) = σ⁻¹(u) − u")
