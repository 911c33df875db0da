"""Checks of schemes combined across layers (``[across_layers]``: Adams–Bashforth, heavy-ball, Nesterov).

The methods are written here again, plainly, from their textbook statements (not from the
SymPy equations the emitted code prints): ``run_layers`` drives any one-step map ``step`` (the
evaluator's Euler step of the field, or an emitted ``forward``) through the layers. Three checks:

- ``structure/<scheme>/stack`` (``structure.across_stack_check``): the emitted ``forward_stack``
  equals the method driven by the emitted ``forward``; control: the layers reversed.
- ``order/<scheme>``: the order the file claims against the series of ``symbolic.across_layers``.
- ``convergence/<scheme>``: on frozen smooth fields, ``N`` layers of ``Δt = 1/(s N)`` against RK4 on
  ``u' = s G(u)`` over ``[0, 1/s]`` (``s = 1``, or ``1/(1 − β)`` for momentum with a fixed ``β``: the
  flow of ``G`` over ``[0, 1]`` either way); the error decays with the series order. Momentum's velocity
  builds up over about ``1/(1 − β)`` layers, and the error is O(Δt) only once the layers are many more:
  the layer counts ``1 … 32`` are multiplied by the power of two at or above ``1/(1 − β)`` (β = 9/10:
  16 … 512). With 1 … 32 layers over ``[0, 1]`` (a flow of ``G`` over ``[0, s]``), β = 9/10 read 0.59 for
  order 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import sympy as sp

from splitformer.symbolic.across_layers import AcrossLayers
from splitformer.symbolic.scheme import Scheme

from .convergence import HORIZON, SIZES, STEPS, Study, reference_flow, smooth_variant
from .parameters import random_parameters
from .semantics import FLOAT, Semantics
from .statements import SKIPPED, Check
from .statements.order import PROJECTIONS

__all__ = ["run_layers", "layer_counts", "convergence_budget", "consistent_scale", "across_order_check",
           "across_convergence"]

#: How far the empirical order may be from the series order (as for one-step schemes).
TOLERANCE = 0.3
#: The most layers the convergence study runs (``layer_counts``: 128 × 32, momentum up to 127/128; β = 99/100 takes
#: about 7 s on the 2-core machine, β = 99999/100000 would run 4 million layers).
MAX_LAYERS = 4096


def run_layers(across: AcrossLayers, steps: Sequence[Callable[[np.ndarray], np.ndarray]], u: np.ndarray) -> np.ndarray:
    """``u`` after the layers ``steps`` (each ``w ↦ w + Δt Gⁿ(w)``) combined by ``across``."""
    beta = float(across.momentum)
    previous = velocity = None
    for step in steps:
        if across.method in ("adams-bashforth", "two-step"):
            b0, b1 = (1.5, -0.5) if across.method == "adams-bashforth" else map(float, across.weights)
            increment = step(u) - u
            u = u + increment if previous is None else u + b0 * increment + b1 * previous
            previous = increment
        else:  # heavy-ball or nesterov: v⁺ = β v + Δt G(point), u⁺ = u + v⁺; v⁰ = 0
            velocity = np.zeros_like(u) if velocity is None else velocity
            point = u + beta * velocity if across.method == "nesterov" else u
            velocity = beta * velocity + (step(point) - point)
            u = u + velocity
    return u


def layer_counts(across: AcrossLayers) -> tuple[int, ...]:
    """The numbers of layers the convergence study runs: ``STEPS``, times the power of two at or above the
    ``1/(1 − β)`` layers a fixed momentum's velocity takes to build up."""
    beta = float(across.momentum) if across.method in ("heavy-ball", "nesterov") else 0.0
    factor = 2 ** max(0, int(np.ceil(np.log2(1 / (1 - beta)))))
    return tuple(factor * count for count in STEPS)


def convergence_budget(scheme: Scheme) -> Check | None:
    """The convergence check skipped, saying why, where momentum so near 1 would need more than ``MAX_LAYERS``
    layers (its velocity builds up over ``1/(1 − β)`` of them); ``None``: the study runs."""
    counts = layer_counts(scheme.across_layers)
    if counts[-1] <= MAX_LAYERS:
        return None
    beta = scheme.across_layers.momentum
    return Check(f"convergence/{scheme.name}", scheme.name,
                 f"On the continuous model with frozen smooth nonlinear fields, the error of {scheme.name} "
                 f"({scheme.across_layers.method} across layers) decays with its series order.", SKIPPED, True,
                 f"not checked: budget: with momentum {beta} the velocity builds up over 1/(1 − β) = "
                 f"{float(1 / (1 - beta)):g} layers, and the study would run up to {counts[-1]} layers, more than the "
                 f"{MAX_LAYERS} it takes on (momentum up to 127/128)")


def _over(scale: sp.Expr, count: str = "") -> str:
    """``1/(scale count)`` in exact numbers: ``1/N_t``, ``1/(2 N_t)``, ``7/(10 N_t)``, ``1``, ``7/10``."""
    return str(1 / (scale * (sp.Symbol(count) if count else 1))).replace("*", " ")


def consistent_scale(across: AcrossLayers) -> float:
    """The ``s`` of the flow ``u' = s G(u)`` the method converges to: a fixed momentum ``β`` sums the
    geometric series ``1 + β + β² + … = 1/(1 − β)`` of past increments."""
    return 1.0 / (1.0 - float(across.momentum))


def across_order_check(scheme: Scheme) -> tuple[Check | None, dict]:
    """The claimed order against the series; the orders to record (``order``, the scale, the leading error)."""
    result = scheme.across_layers.order()
    recorded = {"order": result.order, "splitting_order": None, "tied_splitting_order": None,
                "leading_error": str(result.leading_in_fields), "exact_subflows_error": None, "generators": [],
                "projections": PROJECTIONS, "conditions": [], "splitting_conditions": [], "checked_nodes": None,
                "across_layers": scheme.across_layers.method, "consistent_scale": str(result.scale),
                "splitting_note": ""}
    claimed = scheme.claims.get("order")
    if claimed is None:
        return None, recorded
    flow = "inconsistent" if result.scale is None else f"u' = {result.scale}·G(u)"
    return Check(
        f"order/{scheme.name}", scheme.name,
        f"The stack of {scheme.name} ({scheme.across_layers.method} across layers) has order {claimed}: its local "
        "error from exact history on u' = s f(u) (scalar, f generic, s the scale that makes it consistent) is "
        f"O(h^{claimed + 1}) and not O(h^{claimed + 2}); projections held out.",
        "symbolic", result.order == claimed,
        f"series: order {result.order} for the flow {flow}; leading local error (G = f) {result.leading_in_fields}"
        + ("" if result.order == claimed else f"; claimed {claimed}"),
    ), recorded


def across_convergence(scheme: Scheme, order: int, seed: int = 0, scale: float | None = None) -> tuple[Check, Study]:
    """The error at ``T = 1`` with ``N_t = 1 … 32`` layers (``layer_counts``; one control for all: frozen fields) against
    RK4 on ``u' = s G(u)``; ``scale`` replaces ``s`` (a control: the unscaled flow for momentum)."""
    smooth = smooth_variant(scheme)
    params = random_parameters(smooth, SIZES, seed)
    u0 = np.random.default_rng(seed + 1).standard_normal((SIZES.tokens, SIZES.features))
    consistent = consistent_scale(scheme.across_layers)
    written = 1 / (1 - sp.Rational(scheme.across_layers.momentum))  # the same, exact, as the statement writes it
    s = consistent if scale is None else scale
    flow = Semantics(smooth, params, SIZES, FLOAT, eps=1e-5, projections=False)
    exact = reference_flow(flow, smooth, u0, duration=s / consistent * HORIZON)  # u' = s G over [0, 1/consistent]
    errors, counts = [], layer_counts(scheme.across_layers)
    for count in counts:
        layer = Semantics(smooth, params, SIZES, FLOAT, eps=1e-5, time_step=HORIZON / (consistent * count),
                          projections=False).step
        errors.append(float(np.abs(run_layers(scheme.across_layers, [layer] * count, u0) - exact).max()))
    x = np.log(HORIZON / np.array(counts, dtype=float))[-3:]
    slope = float(np.polyfit(x, np.log(np.array(errors))[-3:], 1)[0])
    study = Study(scheme.name, counts, tuple(errors), slope)
    check = Check(
        f"convergence/{scheme.name}", scheme.name,
        f"On the continuous model with frozen smooth nonlinear fields (tanh activation, projections held out), "
        f"the error of {scheme.name} ({scheme.across_layers.method} across N_t = "
        f"{', '.join(map(str, counts))} layers of Δt = {_over(written, 'N_t')}) against u' = {s:g}·G(u) over "
        f"[0, {_over(written)}] decays with slope within {TOLERANCE} of its series order {order}.",
        "numeric", abs(slope - order) <= TOLERANCE,
        f"empirical order {slope:.3f} (fit over the three finest steps); errors "
        + ", ".join(f"{error:.2e}" for error in errors))
    return check, study
