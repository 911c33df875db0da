"""Convergence study: the empirical order of a scheme on the continuous model.

The fields of the scheme are frozen (random controls), made smooth (tanh activation) and
integrated over ``[0, T]``, all by the independent evaluator (``semantics``, float64):
the scheme's steps with ``Δt = T/N_t``, ``N_t = 1, 2, 4, …, 32`` (up to 128 for order 3
and more), against RK4 for ``u_t = Σ c_k A_k(u)`` (``converged_reference``: from 64 steps,
doubled while its own error, estimated by Richardson, exceeds 10⁻⁴ of the scheme's smallest;
at most 512 steps, 2048 for order 3 and more). Projection substeps are held out (the
identity), as in the series analysis. The slope of log error against log Δt over the finest
steps is the empirical order, where those steps are in the asymptotic range (``asymptotic``: their local slopes
agree), N_t doubled up to three times more until they are; stiff frozen fields may keep them out of it. Cross-attention reads
a random memory held fixed over ``[0, T]``; rotary attention the positions ``0 … N−1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from splitformer.symbolic.equation import equation_terms
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.scheme import Parallel, RungeKutta, Scheme, Sequence, Substep

from ..output import PLOTS_HINT, check_replaceable, write_files
from .parameters import random_parameters
from .semantics import FLOAT, Semantics, Sizes

__all__ = ["Study", "smooth_variant", "convergence_study", "plot_study", "plot_studies", "reference_flow",
           "converged_reference", "asymptotic", "local_slopes"]

SIZES = Sizes(tokens=4, features=4, heads=2, hidden=8)
MEMORY_TOKENS = 3
HORIZON = 1.0
STEPS = (1, 2, 4, 8, 16, 32)
#: Schemes of order 3 and more reach their asymptotic slope only at finer steps, and may need a
#: finer reference to stay far below their error.
FINE_STEPS, REFERENCE_STEPS, FINE_REFERENCE_STEPS = (64, 128), 512, 2048
#: The reference's fewest RK4 steps, and its largest error relative to the scheme's smallest (``converged_reference``):
#: each error the slope is fitted to is off by at most 0.01 %.
REFERENCE_START, REFERENCE_TOLERANCE = 64, 1e-4
#: With exact sub-flows: coarser steps (high splitting orders reach the reference's error
#: sooner), each substep's flow integrated by RK4 in pieces of at most ``SUBFLOW_STEP``.
SUBFLOW_STEPS, SUBFLOW_STEP = (1, 2, 4, 8, 16), 1 / 256
#: The asymptotic range: the two local slopes of the three finest errors agree within ``SLOPE_AGREEMENT``. Where they
#: do not (stiff frozen fields: an error flat at 0.5 down to N_t = 32, then 10⁵ smaller in one halving), N_t is doubled
#: up to ``EXTRA_DOUBLINGS`` times, unless the finest error is below ``ERROR_FLOOR`` (near the reference's own).
SLOPE_AGREEMENT, EXTRA_DOUBLINGS, ERROR_FLOOR = 0.15, 3, 1e-9


@dataclass(frozen=True)
class Study:
    scheme: str
    steps: tuple[int, ...]
    errors: tuple[float, ...]
    slope: float
    #: Whether the reference (the flow at T = 1) is finite: a field growing faster than the state can blow up before.
    finite_reference: bool = True
    #: Whether the finest errors are in the asymptotic range (``asymptotic``), where a slope is an order.
    asymptotic: bool = True


def local_slopes(steps, errors) -> np.ndarray:
    """The slopes of log error against log Δt between consecutive studies."""
    return np.diff(np.log(np.asarray(errors, dtype=float))) / np.diff(np.log(1 / np.asarray(steps, dtype=float)))


def asymptotic(steps, errors) -> bool:
    """Whether the three finest errors lie on one line of log error against log Δt (``SLOPE_AGREEMENT``), or refining
    cannot tell more: an error that is not finite and positive, or the finest below ``ERROR_FLOOR``."""
    finest = np.asarray(errors[-3:], dtype=float)
    if len(finest) < 3 or not (np.isfinite(finest).all() and (finest > 0).all()) or finest[-1] < ERROR_FLOOR:
        return True
    first, second = local_slopes(steps[-3:], finest)
    return bool(abs(second - first) <= SLOPE_AGREEMENT)


def reference_flow(semantics: Semantics, scheme: Scheme, u: np.ndarray, steps: int = REFERENCE_STEPS,
               duration: float = HORIZON) -> np.ndarray:
    """``u`` after the flow of the scheme's summed field over ``duration``, by RK4 in ``steps`` steps."""
    terms = [(float(term.coefficient), term.substep)
             for term in equation_terms(scheme) if not term.projection]

    def field(v):
        return sum(coefficient * semantics.field(step, v) for coefficient, step in terms)

    return _rk4(field, u, duration, steps)


def converged_reference(semantics: Semantics, scheme: Scheme, u: np.ndarray, solutions: list[np.ndarray],
                        most: int = REFERENCE_STEPS) -> tuple[np.ndarray, int]:
    """The reference flow (``reference_flow``) accurate to ``REFERENCE_TOLERANCE`` of the scheme's smallest error
    (its ``solutions``' distance to the flow), and its RK4 steps, at most ``most``.

    RK4's error at n steps is 1/15 of the gap between its results at n/2 and n (Richardson: a halved step divides it
    by 16) where the gaps of 16 → 32 → 64 steps shrink by about 16 (the asymptotic regime); the steps are doubled
    from 64 while that error scaled by (64/n)⁴ exceeds the tolerance. Outside that regime, or where a solution lies
    within the error's estimate of the 64-step flow (a scheme as accurate as RK4: ``rk4`` itself), ``most``.
    """
    counts = (REFERENCE_START // 4, REFERENCE_START // 2, REFERENCE_START)
    flows = [reference_flow(semantics, scheme, u, count) for count in counts]
    gaps = [float(np.abs(finer - coarser).max()) for coarser, finer in zip(flows, flows[1:])]
    error = gaps[1] / 15
    smallest = min(float(np.abs(solution - flows[-1]).max()) for solution in solutions) - 2 * error
    asymptotic = gaps == [0.0, 0.0] or (gaps[1] > 0 and 8 <= gaps[0] / gaps[1] <= 32)
    steps = REFERENCE_START
    if not asymptotic or smallest <= 0:
        steps = most
    while steps < most and error * (REFERENCE_START / steps) ** 4 > REFERENCE_TOLERANCE * smallest:
        steps *= 2
    return (flows[-1] if steps == REFERENCE_START else reference_flow(semantics, scheme, u, steps)), steps


def _rk4(field, u: np.ndarray, duration: float, steps: int) -> np.ndarray:
    """``steps`` classic RK4 steps of ``u' = field(u)`` over ``duration``."""
    dt = duration / steps
    for _ in range(steps):
        k1 = field(u)
        k2 = field(u + dt / 2 * k1)
        k3 = field(u + dt / 2 * k2)
        k4 = field(u + dt * k3)
        u = u + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return u


def _exact_subflows_step(semantics: Semantics, scheme: Scheme, time_step: float):
    """One step with every substep's own flow integrated accurately (RK4 in pieces of at most
    ``SUBFLOW_STEP``) instead of by its solver — a Runge–Kutta step by the flow of its summed field over
    the whole step: what the splitting order is about."""

    def flow(terms: list[tuple[float, Substep]], duration: float, u: np.ndarray) -> np.ndarray:
        pieces = max(1, int(np.ceil(abs(duration) / SUBFLOW_STEP)))
        return _rk4(lambda v: sum(weight * semantics.field(step, v) for weight, step in terms), u, duration, pieces)

    def sequence(steps: Sequence, u: np.ndarray) -> np.ndarray:
        for step in steps.steps:
            if isinstance(step, Parallel):
                u = sum(float(weight) * sequence(branch, u) for weight, branch in zip(step.weights, step.branches))
            elif isinstance(step, RungeKutta):
                u = flow([(float(field.fraction), field) for field in step.fields], time_step, u)
            elif step.solver != "projection":  # projections are held out, as in the tree analysis
                u = flow([(1.0, step)], float(step.fraction) * time_step, u)
        return u

    return lambda u: sequence(scheme.body, u)


def smooth_variant(scheme: Scheme) -> Scheme:
    """``scheme`` with tanh as the activation of every operator that takes the scheme's (orders hold for smooth fields;
    an operator naming its own activation keeps it)."""
    return scheme.with_activation("tanh") if scheme.reads_activation() else scheme


def convergence_study(scheme: Scheme, seed: int = 0, order: int | None = None, exact_subflows: bool = False) -> Study:
    """Errors of ``scheme`` at ``N_t = 1, 2, 4, …`` steps and the fitted slope.

    ``order`` (the tree order, when known) of 3 or 4 adds the steps ``FINE_STEPS`` (beyond,
    the errors at ``N_t = 32`` are already near the reference's). ``exact_subflows`` integrates
    each substep's flow accurately instead of by the scheme's solver (a Runge–Kutta step's: the
    flow of its fields' sum): its slope is the splitting order's.
    """
    smooth = smooth_variant(scheme)
    params = random_parameters(smooth, SIZES, seed)
    u0 = np.random.default_rng(seed + 1).standard_normal((SIZES.tokens, SIZES.features))
    fine = order is not None and order >= 3
    steps = SUBFLOW_STEPS if exact_subflows else STEPS + FINE_STEPS if fine and order <= 4 else STEPS
    memory = np.random.default_rng(seed + 2).standard_normal((MEMORY_TOKENS, SIZES.features))
    flow = Semantics(smooth, params, SIZES, FLOAT, eps=1e-5, projections=False, memory=memory)

    def solution(count: int) -> np.ndarray:
        semantics = Semantics(smooth, params, SIZES, FLOAT, eps=1e-5, time_step=HORIZON / count,
                              projections=False, memory=memory)
        step = _exact_subflows_step(flow, smooth, HORIZON / count) if exact_subflows else semantics.step
        u = u0
        for _ in range(count):
            u = step(u)
        return u

    steps = list(steps)
    with np.errstate(all="ignore"):  # a flow that blows up is reported (finite_reference, the errors), not warned about
        solutions = [solution(count) for count in steps]
        for extra in range(EXTRA_DOUBLINGS + 1):
            most = (FINE_REFERENCE_STEPS if fine else REFERENCE_STEPS) * 2 ** extra
            exact, _ = converged_reference(flow, smooth, u0, solutions, most)
            errors = [float(np.abs(u - exact).max()) for u in solutions]
            if asymptotic(steps, errors) or extra == EXTRA_DOUBLINGS:
                break
            steps.append(2 * steps[-1])
            solutions.append(solution(steps[-1]))
        finest = slice(-2, None) if exact_subflows else slice(-3, None)  # high orders: the last two steps
        x = np.log(HORIZON / np.array(steps, dtype=float))[finest]
        slope = float(np.polyfit(x, np.log(np.array(errors))[finest], 1)[0])
    return Study(scheme.name, tuple(steps), tuple(errors), slope, bool(np.isfinite(exact).all()),
                 asymptotic(steps, errors))


def _range(study: Study) -> str:
    """What a plot's legend adds to a study's slope outside the asymptotic range."""
    return "" if study.asymptotic else ", not yet asymptotic"


def _figure(width: float, height: float):
    """A figure outside pyplot: no global backend switch, nothing to close (notebooks keep theirs)."""
    from ..figures import InlineFigure

    figure = InlineFigure(figsize=(width, height), dpi=100)
    return figure, figure.subplots()


def _save(figure, path: Path) -> Path:
    """Write the PNG at once (all or nothing), marked as ours; never over an image someone else made."""
    image = figure.marked_png()
    check_replaceable(path, hint=PLOTS_HINT)
    write_files({path: image}, root=path.parent)  # through a symbolic link, as derive writes
    return path


def plot_study(study: Study, order: int, path: Path) -> Path:
    """Error against Δt on log–log axes, with a reference line of the expected slope."""
    steps = np.array([HORIZON / count for count in study.steps])
    errors = np.array(study.errors)
    figure, axes = _figure(4.8, 3.6)
    axes.loglog(steps, errors, "o-", label=f"{study.scheme} (slope {study.slope:.2f}{_range(study)})")
    axes.loglog(steps, errors[-1] * (steps / steps[-1]) ** order, "--", color="gray", label=f"order {order}")
    axes.set_xlabel("Δt")
    axes.set_ylabel("max error at T = 1")
    axes.set_title(f"convergence of {study.scheme}")
    axes.legend()
    figure.tight_layout()
    return _save(figure, path)


def plot_studies(studies: list[Study], path: Path | None = None):
    """Every study on one set of log–log axes; saved to ``path``, or the figure when ``None``."""
    measured = [study for study in studies if study.finite_reference and all(map(np.isfinite, study.errors))]
    if path is not None and not measured:  # an empty figure "slope nan": said instead
        raise SplitformerError(f"plot: no error to plot for {', '.join(study.scheme for study in studies)}: the flow "
                               "or the scheme's steps are not finite at T = 1 from the study's random state "
                               "(`check --only convergence` says which); nothing written")
    figure, axes = _figure(5.6, 4.2)
    for study in studies:
        steps = [HORIZON / count for count in study.steps]
        if study not in measured:  # named in the legend, no points
            axes.plot([], [], "o-", markersize=3, label=f"{study.scheme} (not finite at T = 1: no error)")
            continue
        axes.loglog(steps, study.errors, "o-", markersize=3,
                    label=f"{study.scheme} (slope {study.slope:.2f}{_range(study)})")
    axes.set_xlabel("Δt")
    axes.set_ylabel("max error at T = 1")
    axes.set_title("convergence of the schemes")
    axes.legend(fontsize="small")
    figure.tight_layout()
    return figure if path is None else _save(figure, path)
