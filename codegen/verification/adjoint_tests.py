"""The emitted ``vjp`` under the two adjoint tests Devito runs on its operators.

For a map ``Φ`` of a point ``x`` (the input and every parameter array), a random direction
``v`` of unit norm and a random costate ``w`` (float64, small sizes):

- ``adjoint-test/<name>/dot``: ``⟨J v, w⟩ = ⟨v, Jᵀ w⟩``, ``J v`` by the fourth-order central
  difference of the emitted ``forward`` (step 1e-4: truncation negligible, rounding ≈ 1e-11
  of the scale), ``Jᵀ w`` by the emitted ``vjp``; gap below 1e-8 of the larger side (of 1e-3 |Jᵀ w| where both
  sides are smaller: a direction nearly orthogonal to the gradient). Control: the
  gradient moved by 1 % of its norm along v fails it.
- ``adjoint-test/<name>/taylor``: with ``f(x) = ⟨w, Φ(x)⟩`` and ``∇f = Jᵀ w`` from ``vjp``,
  ``r(h) = |f(x + h v) − f(x) − h ⟨∇f, v⟩|`` over ``h = h₀ · 2⁻ᵏ``, ``k = 0 … 4``: the fitted
  slope of ``log r`` against ``log h`` is 2 (within 0.1). Control: the same residual with the
  gradient so moved has slope 1 (within 0.1); both slopes are reported. ``h₀`` is 10⁻⁴; where the slope
  misses 2 while ``r`` at the shortest step is below 1e-13 of ``max(1, Σ|w Φ|)`` (within a few hundred roundings of
  ``f``, which bend the fit) and the signed remainders there hold no term ``a·h`` beyond 5 standard errors of their
  scatter about ``a·h + c·h²`` (a gradient error, which the longer steps would hide under the curvature), ``h₀``
  grows tenfold, up to 0.1: a map near the identity (fields taking 1/1000 of the step) has its curvature under the
  rounding at the short steps.
  A step affine along ``v`` leaves ``r(h)`` at rounding (at most 1e-13 of ``max(1, Σ|w Φ|)``) at the shortest
  steps and at ``h`` = 1/4, 1/2, 1 (or, past a ReLU's kink there, at 1/400, 1/200, 1/100), no slope to fit: that
  holds too, the control still.

The steps are small because a ReLU is not differentiable at its kink: a step that carries a
pre-activation across 0 spoils both tests (at these sizes the chance is about 1 % a scheme).

Both tests read only the emitted NumPy module: ``forward`` is the witness of ``vjp`` (the
two are separate emitted code paths, the adjoint derived by reverse mode over the program).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .parameters import random_parameters
from .scheme_checks import EmittedInputs
from .statements import Check

__all__ = ["adjoint_tests", "scheme_adjoint_tests", "Point", "SchemePoint"]

#: Named arrays: the point ``x`` of ``Φ`` (the input, a memory, every parameter).
Point = dict[str, np.ndarray]

#: Steps along a direction of unit norm, small enough that a ReLU's kink is seldom crossed.
_STEP = 1e-4
_DOT_TOLERANCE = 1e-8
#: The dot test's gap is relative to the larger side, or to this times |∇f| where both are smaller (v and ∇f nearly
#: orthogonal: the sides are then the difference's rounding, and their ratio says nothing).
_CANCELLED = 1e-3
_STEPS = 1e-4 * 2.0 ** -np.arange(5)
#: The Taylor test's steps are ``_STEPS`` times the first of these at which the slope holds or r(h) at the shortest
#: step is at least ``_RESOLVED`` of max(1, Σ|w Φ|), clear of f's rounding, which bends the fitted slope below it.
_STEP_SCALES = (1.0, 10.0, 100.0, 1000.0)
_RESOLVED = 1e-13
#: f's rounding, relative to max(1, Σ|w Φ|): a linear term below it at the shortest step is not told from rounding.
_ROUNDING = 2e-16
_SLOPE_TOLERANCE = 0.1
#: The control's gradient: the true one plus this times its norm along v (the unit direction). Scaled by 1 + this
#: instead, its error along v would be this times ⟨∇f, v⟩, which a cancellation can make small against the curvature
#: at the Taylor test's steps (control slope 1.141 on a pool's step, ⟨J v, w⟩ = −0.0014).
_PERTURBATION = 1e-2
#: A Taylor residual at most this, relative to max(1, Σ|w Φ|) (the terms of f, whose rounding it is), is rounding.
#: Where it is so at the test's steps and at the long ones (``_AFFINE_STEPS``), Φ is affine along v (a step linear in
#: every input), r(h) has no h² to fit, and a gradient off by δ along v would leave r(1) = |δ| there; a nonlinear Φ
#: whose curvature hides under the rounding of a large constant part at h ≤ 1e-4 shows it at h = 1.
_AFFINE = 1e-13
#: The long steps, then shorter ones: a piecewise-affine Φ (convolutions and ReLUs) may cross a kink before h = 1/4
#: on a small grid, where each entry of the unit direction is large, and is affine along v up to h = 1/100 (a tester's
#: 1 × 1 grid: r(h) rounding up to 1/10, the slope fitted to rounding 0.166, failed); a gradient off by δ along v
#: leaves r(1/100) = |δ|/100 there, still far above rounding.
_AFFINE_STEPS = ((0.25, 0.5, 1.0), (0.0025, 0.005, 0.01))


def _inner(first: Point, second: Point) -> float:
    return float(sum(np.vdot(first[name], second[name]) for name in first))


def _shifted(x: Point, v: Point, h: float) -> Point:
    return {name: x[name] + h * v[name] for name in x}


def _affine_far(along: Callable[[float], np.ndarray], w: np.ndarray, base: float, derivative: float) -> float | None:
    """The longest step up to which r(h) is rounding at the long steps of ``_AFFINE_STEPS`` too (each against its own
    terms Σ|w Φ(x + h v)|), a finite Φ there, or None: the test of an affine Φ, where the short steps alone cannot
    tell a curvature from rounding."""
    def rounding(h: float) -> bool:
        with np.errstate(all="ignore"):
            output = along(h)
        scale = max(1.0, float(np.abs(w * output).sum())) if np.isfinite(output).all() else np.inf
        return abs(float(np.vdot(w, output)) - base - h * derivative) <= _AFFINE * scale
    return next((steps[-1] for steps in _AFFINE_STEPS if all(rounding(h) for h in steps)), None)


def _linear_term(steps: np.ndarray, signed: np.ndarray, rounding: float) -> bool:
    """Whether the signed remainders f(x + h v) − f(x) − h ⟨∇f, v⟩ at ``steps`` hold a term a·h, a gradient off by a
    along v: clear of their scatter about the least-squares fit a·h + c·h² (its estimate beyond 5 standard errors:
    rounding scatters, an error's a·h halves with h) and, at the shortest step, above ``rounding`` (f's: on 3 degrees
    of freedom, rounding alone passes 5 standard errors in about 4 % of draws). A right gradient whose r(h) is
    rounding has none; one off by 0.1 % on a block whose fields take 1/10000 of the step has (review s32)."""
    basis = np.stack([steps / steps[0], (steps / steps[0]) ** 2], axis=1)
    coefficients, *_ = np.linalg.lstsq(basis, signed, rcond=None)
    scatter = np.sum((signed - basis @ coefficients) ** 2) / (len(steps) - 2)
    error = np.sqrt(scatter * np.linalg.inv(basis.T @ basis)[0, 0])
    return bool(abs(coefficients[0]) > 5 * error and abs(coefficients[0]) * steps[-1] / steps[0] > rounding)


def _slope(steps: np.ndarray, residuals: np.ndarray) -> float:
    return float(np.polyfit(np.log(steps), np.log(residuals), 1)[0])


def adjoint_tests(name: str, owner: str | None, described: str, forward: Callable[[Point], np.ndarray],
                  vjp: Callable[[Point, np.ndarray], Point], x: Point, seed: int,
                  where: Callable[[np.ndarray], str] = lambda _: "") -> list[Check]:
    """The dot-product and Taylor tests of ``vjp`` against ``forward`` at ``x``, with their controls; both fail,
    saying so, when ``forward`` is not finite at ``x`` (``where(output)`` says what of ``x`` may cause it).

    ``described`` says what ``Φ`` is and at which sizes (a sentence fragment).
    """
    rng = np.random.default_rng(seed)
    v = {key: rng.standard_normal(np.shape(value)) for key, value in x.items()}
    norm = np.sqrt(_inner(v, v))
    v = {key: value / norm for key, value in v.items()}
    with np.errstate(all="ignore"):  # reported below, not warned about
        output = forward(x)
    if not np.isfinite(output).all():
        detail = (f"the emitted forward is not finite at the test's point ({np.size(output) - np.isfinite(output).sum()}"
                  f" of {np.size(output)} entries){where(output)}")
        return [Check(f"adjoint-test/{name}/{test}", owner, f"{title} test of the emitted vjp of {described}.", "numeric",
                      False, detail) for test, title in (("dot", "Dot-product"), ("taylor", "Taylor"))]
    w = rng.standard_normal(output.shape)
    gradient = vjp(x, w)
    size = np.sqrt(_inner(gradient, gradient))
    perturbed = {key: value + _PERTURBATION * size * v[key] for key, value in gradient.items()}

    def along(h: float) -> np.ndarray:
        return forward(_shifted(x, v, h))

    jv = (8 * (along(_STEP) - along(-_STEP)) - (along(2 * _STEP) - along(-2 * _STEP))) / (12 * _STEP)
    forward_side = float(np.vdot(jv, w))

    def dot_gap(g: Point) -> float:
        adjoint_side = _inner(v, g)
        return abs(forward_side - adjoint_side) / max(abs(forward_side), abs(adjoint_side), _CANCELLED * size)

    base, terms = float(np.vdot(w, output)), max(1.0, float(np.abs(w * output).sum()))

    def slope(g: Point) -> float:
        return _slope(steps, np.abs(values - base - steps * _inner(g, v)))

    for scale in _STEP_SCALES:
        steps = scale * _STEPS
        values = np.array([float(np.vdot(w, along(h))) for h in steps])
        signed = values - base - steps * _inner(gradient, v)
        residuals = np.abs(signed)
        second = slope(gradient)
        if scale == 1.0:  # the shortest steps: where an affine step's r(h) is read, and a gradient error is seen
            remainder, erring = float(residuals.max()), _linear_term(steps, signed, _ROUNDING * terms)
        if abs(second - 2) <= _SLOPE_TOLERANCE or residuals[-1] >= _RESOLVED * terms or erring:
            break  # the slope holds, or r(h) stands clear of rounding or holds a gradient error's h: not rounding's
    gap, control_gap = dot_gap(gradient), dot_gap(perturbed)
    first = slope(perturbed)
    reach = _affine_far(along, w, base, _inner(gradient, v)) if remainder <= _AFFINE * terms else None
    affine = reach is not None
    taylor = f"slope {second:.3f}; control slope {first:.3f}" + (f" (h₀ = {steps[0]:g})" if scale > 1 else "")
    if affine:
        taylor = (f"r(h) ≤ {remainder:.1e}, rounding (at most {_AFFINE:g} of max(1, Σ|w Φ|)), at h up to {reach:g} too: "
                  f"Φ is affine along v, no h² to fit; control slope {first:.3f}")
    arrays = f"{len(x)} arrays ({', '.join(list(x)[:3])}{', …' if len(x) > 3 else ''})"
    return [
        Check(f"adjoint-test/{name}/dot", owner,
              f"Dot-product test of the emitted vjp of {described}: ⟨J v, w⟩ = ⟨v, Jᵀ w⟩ for a random direction v "
              f"of unit norm through {arrays} and a random costate w; J v by the fourth-order central difference of the emitted "
              f"forward (step {_STEP:g}), Jᵀ w by the emitted vjp (float64). Control: the gradient plus "
              f"{_PERTURBATION:g} of its norm along v.",
              "numeric", bool(gap < _DOT_TOLERANCE and control_gap > 10 * _DOT_TOLERANCE),
              f"relative gap {gap:.1e} (tolerance {_DOT_TOLERANCE:g}); control {control_gap:.1e}; "
              f"⟨J v, w⟩ = {forward_side:.6g}"),
        Check(f"adjoint-test/{name}/taylor", owner,
              f"Taylor test of the emitted vjp of {described}: r(h) = |f(x + h v) − f(x) − h ⟨∇f, v⟩| with "
              f"f = ⟨w, Φ⟩ and ∇f from vjp decays as h² over h = h₀ · 2^-k, k = 0 … 4, h₀ = {_STEPS[0]:g} (or up to "
              f"{_STEP_SCALES[-1]:g} times that where the slope misses while r is near f's rounding and shows no "
              "gradient error a·h there) (fitted slope 2 ± "
              f"{_SLOPE_TOLERANCE:g}). Control: the gradient plus {_PERTURBATION:g} of its norm along v gives "
              f"slope 1 ± {_SLOPE_TOLERANCE:g}.",
              "numeric", bool((affine or abs(second - 2) <= _SLOPE_TOLERANCE) and abs(first - 1) <= _SLOPE_TOLERANCE),
              taylor),
    ]


@dataclass(frozen=True)
class SchemePoint:
    """The point of a scheme's adjoint tests: the input (and a memory) and every parameter (``x``), the NumPy
    ``forward``'s options (causal plus padding masks: query 0 of sequence 1 sees no key), the inputs and sizes."""

    x: Point
    options: dict
    inputs: EmittedInputs
    sizes: object
    padding: np.ndarray
    seed: int

    @classmethod
    def of(cls, scheme, module) -> "SchemePoint":
        batch, seed = 2, 61
        inputs = EmittedInputs.of(module.forward, batch, seed, scheme)
        sizes = replace(inputs.sizes, hidden=4)  # few ReLU units: a kink is seldom within reach
        leading, options = inputs.numpy(masked=True)
        padding = np.zeros((batch, sizes.tokens), dtype=bool)
        padding[1, [0, 3]] = True  # with the causal mask, query 0 of sequence 1 has empty support
        options.update(n_heads=sizes.heads, eps=1e-5, key_padding_mask=padding, causal=True)
        x = {"u": np.random.default_rng(seed).standard_normal((batch, sizes.tokens, sizes.features)),
             **({"memory": leading[0]} if leading else {}), **random_parameters(scheme, sizes, seed)}
        return cls(x, options, inputs, sizes, padding, seed)

    @property
    def front(self) -> list[str]:
        """The arrays given before the parameters: the input, and a memory."""
        return [key for key in ("u", "memory") if key in self.x]

    def split(self, point: Point) -> tuple[list, dict]:
        return [point[key] for key in self.front], {key: value for key, value in point.items() if key not in self.front}

    def described(self, scheme) -> str:
        """What the tests' map is, and at which sizes (a sentence fragment)."""
        extra = " and a memory" if "memory" in self.x else ""
        return (f"one step of {scheme.name} (2 sequences of {self.sizes.tokens} tokens, d = {self.sizes.features}, "
                f"{self.sizes.heads} heads, d_ff = {self.sizes.hidden}, causal plus padding masks{extra})")

    def vjp(self, module, point: Point, costate: np.ndarray) -> Point:
        """The NumPy ``vjp``'s gradients at ``point``, by name."""
        arrays, params = self.split(point)
        *gradients, parameter_gradients = module.vjp(*arrays, params, costate, **self.options)
        return {**dict(zip(self.front, gradients)), **parameter_gradients}


def scheme_adjoint_tests(scheme, module) -> list[Check]:
    """The dot-product and Taylor tests of a scheme's emitted ``vjp`` (one step, masks and every input)."""
    at = SchemePoint.of(scheme, module)

    def forward(point: Point) -> np.ndarray:
        arrays, params = at.split(point)
        return module.forward(*arrays, params, **at.options)

    def vjp(point: Point, costate: np.ndarray) -> Point:
        return at.vjp(module, point, costate)

    def where(output: np.ndarray) -> str:
        """The masks' query without a key where the output is not finite there alone; else the state's values."""
        elsewhere = ~np.isfinite(output)
        elsewhere[1, 0] = False
        if not elsewhere.any():
            return ("; only at query 0 of sequence 1, which the masks leave no key: a formula dividing by a sum over "
                    "its support that is no mean of that support (a mean over no key is 0) is ∞ or 0/0 there")
        return ("; at queries the masks leave keys as well: a formula with no real value at some of the state's "
                "values (the log or a root of a negative entry) or one that overflows")

    return adjoint_tests(scheme.name, scheme.name, at.described(scheme), forward, vjp, at.x, at.seed, where)
