"""Checks of the derived adjoint against something that is not reverse mode.

- ``adjoint/<scheme>/finite-difference``: the directional derivative ``⟨λ, dΦ(u, θ)[δ]⟩``
  by a central difference in 50-digit arithmetic equals ``⟨ū, δu⟩ + Σ ⟨θ̄, δθ⟩`` from the
  adjoint program, for a random direction through the input and every control, with a
  causal support (masks) at a tiny size.
- ``adjoint/<scheme>/negative-control``: the same comparison with the sign of one adjoint
  assignment flipped must fail.

  Both are skipped ("not checked: budget") when one evaluation of the forward program would
  call more than ``MAX_WORK`` closures (``evaluation_work``, a count): the adjoint is derived
  and evaluated only within that budget (the whole check does about 7.5 times that work: two
  forward evaluations, the adjoint and its flipped copy, each about 2.8 forwards).
- ``adjoint/layer-norm-jacobian``: the adjoint the reverse mode derives for LayerNorm equals
  the closed form ``Jᵀλ`` with ``J = diag(g)(I − 𝟙𝟙ᵀ/N − P Pᵀ/N)/√(β + ε)``, exactly.
- ``adjoint/rms-norm-jacobian``: the same for RMSNorm, ``J = diag(g)(I − P Pᵀ/N)/√(ρ + ε)``
  with ``P = v/√(ρ + ε)``, ``ρ = mean v²`` (a closed form written by hand, proven here).
- ``adjoint/relu-subgradient``: the derivative SymPy gives for the derived ReLU is the step
  function, and the value used at 0 lies in the subdifferential of ``max(0, ·)`` there.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import sympy as sp

from splitformer.symbolic.adjoint import DIFFERENTIABLE_ROLES, RELU_SUBGRADIENT_AT_ZERO, Adjoint, AdjointRecord, derive_adjoint
from splitformer.symbolic.cross_attention import MEMORY_SUPPORT
from splitformer.symbolic.domains import (
    BUCKETS, FEATURES, FREQUENCIES, GROUP, HEAD_FEATURES, HEADS, HIDDEN, KV_FEATURES, KV_HEADS, MEMORY, TOKENS,
)
from splitformer.symbolic.evaluate import evaluate, evaluation_work
from splitformer.symbolic.operators import EPSILON
from splitformer.symbolic.program import Program
from splitformer.symbolic.projections import SYMBOLS, derive_relu_projection
from splitformer.symbolic.rotary_attention import POSITIONS, ROPE_THETA
from ..guard import DIVIDES_BY_ZERO
from . import SKIPPED, Check
from .recovery import vanishes

__all__ = ["adjoint_checks", "general_adjoint_checks", "finite_difference_gap", "finite_difference_gaps", "flip_sign",
           "TOLERANCE", "MAX_WORK", "forward_work"]

_DIGITS = 50
_STEP = sp.Float("1e-20", _DIGITS)
#: ``|FD − adjoint| / |adjoint|`` below this holds (the difference's own error is ~1e-30).
TOLERANCE = sp.Float("1e-20", _DIGITS)
#: Tiny sizes; d_head = 4 keeps the score scale 1/√d_head rational, θ = 10⁴ the rotary
#: frequencies θ^(−2r/4) = 1, 1/100; grouped attention: 2 query heads share 1 key/value head.
_SIZES = {TOKENS.size: 3, FEATURES.size: 4, HEADS.size: 1, HEAD_FEATURES.size: 4, HIDDEN.size: 3,
          MEMORY.size: 2, FREQUENCIES.size: 2, BUCKETS.size: 4, ROPE_THETA: 10000}
_GROUPED_SIZES = {**_SIZES, FEATURES.size: 8, HEADS.size: 2, KV_HEADS.size: 1, GROUP.size: 2, KV_FEATURES.size: 4}
#: The most closures one forward evaluation may call for the scheme's finite-difference check
#: (``evaluation_work``). A dense 16-stage tableau of four fields on projected states (64
#: evaluations, the most a scheme may make) needs 174 432 and is checked (about 13 s of CPU for
#: the four evaluations, some 10 µs a closure); with rotary attention and gated feed-forward
#: fields it needs 470 112 and is not.
MAX_WORK = 200_000


def _random(seed: str):
    generator = random.Random(seed)
    table: dict = {}

    def value(*key):
        if key not in table:
            table[key] = sp.Float(generator.uniform(-1, 1), _DIGITS)
        return table[key]

    return value


def _grouped(program: Program) -> bool:
    """Whether ``program`` reads keys and values on a coarser head grid (grouped-query attention)."""
    return any(isinstance(index, sp.Idx) and index.upper == KV_HEADS.size - 1
               for tensor in program.tensors.values() for index in tensor.indices)


def _sizes(program: Program) -> dict:
    """The tiny sizes, and each constant an operator declares at its default (a plug-in's decay rate: unbound, the
    evaluation had no value for its symbol); θ stays 10⁴."""
    constants = {constant.symbol: sp.Rational(str(constant.default)) for constant in program.constants}
    return constants | (_GROUPED_SIZES if _grouped(program) else _SIZES)


def forward_work(program: Program) -> int:
    """The closures one evaluation of ``program`` makes in the finite-difference check (its sizes)."""
    return evaluation_work(program, _sizes(program))


def _sizes_text(program: Program) -> str:
    """The sizes and data of ``finite_difference_gap`` for ``program``, in words."""
    heads = "8 features, 2 query heads sharing 1 key/value head" if _grouped(program) else "4 features, 1 head"
    extra = [text for name, text in ((MEMORY_SUPPORT, "2 memory tokens (one padded for the first query)"),
                                     (POSITIONS, "positions 1, 4, 7, θ = 10⁴")) if name in program.tensors]
    declared = [f"{constant.name} = {constant.default:g}" for constant in program.constants if constant.symbol != ROPE_THETA]
    return ", ".join(["3 tokens", heads, "d_ff = 3", *extra, *declared, "causal support", "ε = 1e-3"])


def finite_difference_gap(adjoint: Adjoint, seed: str = "adjoint", sizes: dict | None = None,
                          positive: frozenset[str] = frozenset(), vacuous: sp.Float | None = sp.Float(0)) -> sp.Float | None:
    """``|FD − ⟨gradient, δ⟩| / max(|FD|, |⟨gradient, δ⟩|)`` for a random point, direction and costate
    (``finite_difference_gaps``; ``vacuous`` where both are 0 at every point tried).

    ``sizes`` adds to (or overrides) the tiny default sizes; the arrays named in ``positive``
    (a variance) take values in (1, 3) instead of (−1, 1).
    """
    return finite_difference_gaps([adjoint], seed, sizes, positive, vacuous)[0]


#: The random points ``finite_difference_gaps`` tries where a comparison is 0 against 0.
_TRIES = 5


def finite_difference_gaps(adjoints: list[Adjoint], seed: str = "adjoint", sizes: dict | None = None,
                           positive: frozenset[str] = frozenset(), vacuous: sp.Float | None = sp.Float(0)) -> list:
    """``finite_difference_gap`` of adjoints of one forward program (its central difference computed once a point) at
    the first of ``_TRIES`` random points (seeds ``seed``, ``seed#1``, …) where no comparison is 0 against 0; at a
    point where ReLUs cut every path (a grid step's) such a comparison proves nothing: it passed any adjoint and
    failed the negative control (a tester's network file passed or failed by its name, which seeds the point).
    ``vacuous`` for a comparison that is 0 against 0 at every point."""
    for attempt in range(_TRIES):
        gaps = _gaps_at(adjoints, seed + (f"#{attempt}" if attempt else ""), sizes, positive)
        if None not in gaps:
            return gaps
    return [vacuous if gap is None else gap for gap in gaps]


def _gaps_at(adjoints: list[Adjoint], seed: str, sizes: dict | None, positive: frozenset[str]) -> list:
    """The gaps of ``finite_difference_gaps`` at the point ``seed`` draws; None where both sides are 0."""
    program = adjoints[0].forward
    sizes = {**_sizes(program), **(sizes or {})}
    point, direction, costate = _random(seed + "/point"), _random(seed + "/direction"), _random(seed + "/costate")
    controls = [name for name, tensor in program.tensors.items() if tensor.role in DIFFERENTIABLE_ROLES]
    data = {
        "chi": lambda i, j: 1 if j <= i else 0,  # causal
        MEMORY_SUPPORT: lambda i, t: 1 if t == 0 or i > 0 else 0,  # the first query's memory padded but one token
        POSITIONS: lambda i: sp.Float(3 * i + 1, _DIGITS),
    }

    def inside(name: str, index: tuple) -> bool:
        """Whether ``index`` is a node of array ``name`` (outside: a convolution's zero padding)."""
        axes = program.tensors[name].indices
        return len(axes) != len(index) or all(
            0 <= value <= int(sp.sympify(axis.upper).xreplace(sizes)) for axis, value in zip(axes, index))

    def entry(name: str, index: tuple, shift) -> sp.Expr:
        if not inside(name, index):
            return sp.Integer(0)
        return point(name, *index) + 2 * (name in positive) + shift * direction(name, *index)

    def inputs(shift):
        table = {name: (lambda *index, name=name: entry(name, index, shift)) for name in controls}
        return table | data

    def lam(*index) -> sp.Expr:
        return costate(*index) if inside(program.output, index) else sp.Integer(0)

    eps = sp.Float("1e-3", _DIGITS)

    def objective(shift):
        values = evaluate(program, sizes, inputs(shift), eps=eps, digits=_DIGITS)[program.output]
        return sum(lam(*index) * value for index, value in values.items())

    numeric = (objective(_STEP) - objective(-_STEP)) / (2 * _STEP)

    def gap(adjoint: Adjoint) -> sp.Float:
        values = evaluate(adjoint.program(), sizes, inputs(0) | {adjoint.seed: lam}, eps=eps, digits=_DIGITS)
        derived = sum(direction(name, *index) * value
                      for name, gradient in adjoint.gradients.items()
                      for index, value in values[gradient].items() if inside(name, index))
        scale = max(abs(sp.N(derived, _DIGITS)), abs(sp.N(numeric, _DIGITS)))  # 0 only where both are
        return abs(sp.N(numeric - derived, _DIGITS)) / scale if scale else None

    return [gap(adjoint) for adjoint in adjoints]


def flip_sign(adjoint: Adjoint, target: str | None = None) -> Adjoint:
    """The adjoint with the sign of one costate assignment flipped (the negative control):
    the first one, or the one that writes ``target``."""
    records = list(adjoint.records)
    for position, record in enumerate(records):
        for number, assignment in enumerate(record.assignments):
            chosen = assignment.target == target if target is not None else (
                adjoint.tensors[assignment.target].role == "temp" and assignment.target != adjoint.gradients.get("u0"))
            if chosen:
                flipped = list(record.assignments)
                flipped[number] = replace(assignment, rhs=-assignment.rhs)
                records[position] = AdjointRecord(record.title, tuple(flipped))
                return replace(adjoint, records=records)
    raise AssertionError("no costate assignment to flip" if target is None else f"no adjoint assignment writes {target!r}")


def adjoint_checks(scheme, program: Program, adjoint: Callable[[], Adjoint] | None = None) -> list[Check]:
    """The finite-difference check of the scheme's adjoint and its negative control (within ``MAX_WORK``);
    ``adjoint`` gives the program's derived adjoint (shared with the emitted ``vjp``), called only within it."""
    work = forward_work(program)
    if work > MAX_WORK:
        return [Check(f"adjoint/{scheme.name}/{what}", scheme.name,
                      f"The derived adjoint of {scheme.name} agrees with a 50-digit central difference{extra}.",
                      SKIPPED, True,
                      f"not checked: budget: one evaluation of the step makes {work} operations, more than the "
                      f"{MAX_WORK} the finite-difference check takes on (it grows with the operator evaluations "
                      "per step); use fewer stages, fields or substeps to have it; the emitted vjp is still "
                      "tested (adjoint-test/…)")
                for what, extra in (("finite-difference", ""), ("negative-control", " (negative control)"))]
    adjoint = adjoint() if adjoint is not None else derive_adjoint(program)
    flipped = flip_sign(adjoint)
    where = next(record.title for record, original in zip(flipped.records, adjoint.records) if record != original)
    sizes = _sizes_text(program)
    statement = (f"The derived adjoint of {scheme.name} gives the directional derivative of ⟨λ, Φ(u, θ)⟩ along a "
                 f"random direction through the input{', the memory' if MEMORY_SUPPORT in program.tensors else ''} "
                 f"and every control: central difference (step 1e-20) in 50-digit arithmetic at {sizes}.")
    control_statement = (f"With the sign of one adjoint assignment flipped ({where}), the finite-difference "
                         "comparison fails: the check can fail.")
    try:
        gap, control = finite_difference_gaps([adjoint, flipped], scheme.name)
    except ZeroDivisionError:
        return [Check(f"adjoint/{scheme.name}/finite-difference", scheme.name, statement, "numeric", False,
                      DIVIDES_BY_ZERO),
                Check(f"adjoint/{scheme.name}/negative-control", scheme.name, control_statement, SKIPPED, True,
                      f"not checked: the comparison it controls has no value ({DIVIDES_BY_ZERO})")]
    return [
        Check(f"adjoint/{scheme.name}/finite-difference", scheme.name, statement,
              "numeric", bool(gap < TOLERANCE), f"relative gap {sp.N(gap, 3)} (tolerance {sp.N(TOLERANCE, 2)})"),
        Check(f"adjoint/{scheme.name}/negative-control", scheme.name, control_statement,
              "numeric", bool(control > TOLERANCE), f"relative gap with the flipped sign {sp.N(control, 3)}"),
    ]


def _norm_jacobian_gap(kind: str, jacobian) -> tuple[list[sp.Expr], bool]:
    """Derived ``ū`` − ``J(v)ᵀλ`` per component for the normalization ``kind`` (N = 3, symbolic v, g, λ, ε),
    and whether ``jacobian(v, g, −1)`` (the closed form with the sign of its rank-one term flipped) differs:
    nonzero at a random point, where ``simplify`` took 0.9 s to say the same."""
    from splitformer.symbolic.derivation import derive
    from splitformer.symbolic.stack import final_norm_scheme

    size = 3
    adjoint = derive_adjoint(derive(final_norm_scheme(kind)))
    v = [sp.Symbol(f"v{k}", real=True) for k in range(size)]
    lam = [sp.Symbol(f"lambda{k}", real=True) for k in range(size)]
    g = [sp.Symbol(f"g{k}", real=True) for k in range(size)]
    c = [sp.Symbol(f"c{k}", real=True) for k in range(size)]
    inputs = {"u0": lambda i, k: v[k], "final_norm_gain": lambda k: g[k], "final_norm_bias": lambda k: c[k],
              adjoint.seed: lambda i, k: lam[k]}
    values = evaluate(adjoint.program(), {TOKENS.size: 1, FEATURES.size: size}, inputs, eps=EPSILON)
    derived = [values[adjoint.gradients["u0"]][(0, k)] for k in range(size)]

    closed, wrong = (jacobian(v, g, sign).T * sp.Matrix(lam) for sign in (1, -1))
    return [derived[k] - closed[k] for k in range(size)], not vanishes(derived[0] - wrong[0])


def _layer_norm_jacobian(v, g, sign):
    """``diag(g)(I − 𝟙𝟙ᵀ/N − sign·P Pᵀ/N)/√(β + ε)``, ``P = (v − α)/√(β + ε)``."""
    size = len(v)
    alpha = sum(v) / size
    scale = sp.sqrt(sum((x - alpha) ** 2 for x in v) / size + EPSILON)
    p = [(x - alpha) / scale for x in v]
    return sp.Matrix(size, size, lambda l, k: g[l] * ((1 if l == k else 0) - sp.Rational(1, size)
                                                      - sign * p[l] * p[k] / size) / scale)


def _rms_norm_jacobian(v, g, sign):
    """``diag(g)(I − sign·P Pᵀ/N)/√(ρ + ε)``, ``P = v/√(ρ + ε)``, ``ρ = mean v²``."""
    size = len(v)
    scale = sp.sqrt(sum(x**2 for x in v) / size + EPSILON)
    p = [x / scale for x in v]
    return sp.Matrix(size, size, lambda l, k: g[l] * ((1 if l == k else 0) - sign * p[l] * p[k] / size) / scale)


#: id, kind, closed form, its statement
_JACOBIANS = (
    ("adjoint/layer-norm-jacobian", "layer-norm", _layer_norm_jacobian,
     "Reverse mode over the derived LayerNorm assignments (mean, variance, projection with ε, gain and "
     "bias) gives ū = Jᵀλ with the closed form J = diag(g)(I − 𝟙𝟙ᵀ/N − P Pᵀ/N)/√(β + ε), "
     "P = (v − α)/√(β + ε) (ε included)"),
    ("adjoint/rms-norm-jacobian", "rms-norm", _rms_norm_jacobian,
     "Reverse mode over the derived RMSNorm assignments (mean square, projection onto the sphere with ε, "
     "gain) gives ū = Jᵀλ with the closed form J = diag(g)(I − P Pᵀ/N)/√(ρ + ε), P = v/√(ρ + ε), "
     "ρ = mean v² (ε included)"),
)


def _jacobian_checks() -> list[Check]:
    checks = []
    for identifier, kind, jacobian, statement in _JACOBIANS:
        differences, control = _norm_jacobian_gap(kind, jacobian)
        failing = [difference for difference in differences if not vanishes(difference)]
        holds = not failing and control
        checks.append(Check(
            identifier, None,
            statement + ": exactly, for N = 3 with symbolic v, g, λ and ε; the same comparison with the sign "
            "of P Pᵀ/N flipped fails (negative control).",
            "symbolic", holds,
            "derived − closed form expands to 0 in every component" if holds
            else f"components differ: {[sp.sstr(sp.simplify(d)) for d in failing][:1]}",
        ))
    return checks


def _relu_subgradient_check() -> Check:
    v = SYMBOLS.v
    formula = derive_relu_projection().formula
    derivative = sp.diff(formula, v)
    left = sp.limit(formula / v, v, 0, "-")
    right = sp.limit(formula / v, v, 0, "+")
    agrees = all(derivative.subs(v, point) == (1 if point > 0 else 0) for point in (-2, -sp.Rational(1, 3), 1, 5))
    inside = min(left, right) <= RELU_SUBGRADIENT_AT_ZERO <= max(left, right)
    outside = not (min(left, right) <= 2 <= max(left, right))  # negative control: 2 is no subgradient
    return Check(
        "adjoint/relu-subgradient", None,
        "The derivative of the derived ReLU (projection onto S₂) is the step function H(v) away from 0, and "
        f"the value used at v = 0, {RELU_SUBGRADIENT_AT_ZERO} (torch's convention), lies in the subdifferential "
        "[left slope, right slope] of max(0, ·) at 0; 2 does not.",
        "symbolic", bool(agrees and inside and outside),
        f"d/dv {sp.sstr(formula)} = {sp.sstr(derivative)}; subdifferential at 0 = [{left}, {right}]",
    )


def general_adjoint_checks() -> list[Check]:
    return [*_jacobian_checks(), _relu_subgradient_check()]
