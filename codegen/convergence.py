"""Convergence study: the empirical order of a scheme on the continuous model.

The fields of the scheme — each operator evaluated by *generated* NumPy code — are frozen
(random controls), made smooth (tanh activation) and integrated over ``[0, T]``. The
reference solution is RK4 with 512 steps (2048 for schemes of order 3 and more) for
``u_t = Σ c_k A_k(u)``; the scheme runs with ``N_t = 1, 2, 4, …, 32`` steps of size ``T/N_t``
(up to 128 for order 3 and more). Projection substeps are held out, as in the
series analysis. The slope of log error against log Δt over the finest steps is the
empirical order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from splitformer.symbolic.derivation import derive
from splitformer.symbolic.equation import equation_terms
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.scheme import Parallel, RungeKutta, Scheme, Sequence, Substep
from splitformer.symbolic.stack import final_norm_scheme

from .lowering import lower
from .render import render_module

__all__ = ["Study", "convergence_study", "plot_study", "plot_studies"]

TOKENS, WIDTH, HEADS, HIDDEN, HORIZON = 4, 4, 2, 8, 1.0
STEPS = (1, 2, 4, 8, 16, 32)
#: Schemes of order 3 and more reach their asymptotic slope only at finer steps, and need a
#: finer reference to stay far below their error.
FINE_STEPS, REFERENCE_STEPS, FINE_REFERENCE_STEPS = (64, 128), 512, 2048


@dataclass(frozen=True)
class Study:
    scheme: str
    steps: tuple[int, ...]
    errors: tuple[float, ...]
    slope: float


def _field_function(scheme: Scheme, step: Substep):
    """``u ↦ A(on(u))`` from the generated NumPy code of a one-substep scheme."""
    operators = {step.operator: scheme.operators[step.operator]}
    if step.on is not None:
        operators[step.on] = scheme.operators[step.on]
    single = Scheme(f"field-{step.operator}", "one field", operators,
                    Sequence((Substep(step.operator, "explicit", on=step.on),)), activation=scheme.activation)
    program = derive(single)
    source = render_module(single, lower(program), lower(derive(final_norm_scheme())), "numpy")
    namespace: dict = {"__name__": f"splitformer_field_{step.operator}"}
    exec(compile(source, f"<field {step.operator}>", "exec"), namespace)  # noqa: S102 - our own generated code
    forward = namespace["forward"]
    return lambda u, params: forward(u, params, n_heads=HEADS) - u


class _Fields:
    def __init__(self, scheme: Scheme, params: dict):
        self.scheme, self.params, self.cache = scheme, params, {}

    def __call__(self, step: Substep, u: np.ndarray) -> np.ndarray:
        key = (step.operator, step.on)
        if key not in self.cache:
            self.cache[key] = _field_function(self.scheme, step)
        return self.cache[key](u, self.params)


def _step(fields: _Fields, node, u: np.ndarray, dt: float) -> np.ndarray:
    if isinstance(node, Sequence):
        for child in node.steps:
            u = _step(fields, child, u, dt)
        return u
    if isinstance(node, Parallel):
        return sum(float(weight) * _step(fields, branch, u, dt) for weight, branch in zip(node.weights, node.branches))
    if isinstance(node, RungeKutta):
        def field(v):
            return sum(float(f.fraction) * fields(f, v) for f in node.fields)

        stages: list[np.ndarray] = []
        for row in node.tableau.a:
            stages.append(field(u + dt * sum((float(a) * k for a, k in zip(row, stages) if a), np.zeros_like(u))))
        return u + dt * sum(float(b) * k for b, k in zip(node.tableau.b, stages))
    if node.solver == "projection":
        return u  # held out
    return u + float(node.fraction) * dt * fields(node, u)


def _reference(fields: _Fields, scheme: Scheme, u: np.ndarray, steps: int = REFERENCE_STEPS) -> np.ndarray:
    terms = [(float(term.coefficient), Substep(term.operator, "explicit", on=term.on))
             for term in equation_terms(scheme) if not term.projection]

    def field(v):
        return sum(coefficient * fields(step, v) for coefficient, step in terms)

    dt = HORIZON / steps
    for _ in range(steps):
        k1 = field(u)
        k2 = field(u + dt / 2 * k1)
        k3 = field(u + dt / 2 * k2)
        k4 = field(u + dt * k3)
        u = u + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return u


def _controls(scheme: Scheme, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = {"d": WIDTH, "d_ff": HIDDEN}
    params = {}
    for operator in scheme.instantiate().values():
        for parameter in operator.parameters():
            shape = tuple(sizes[domain.code_name] for domain in parameter.shape)
            scale = 1.0 if parameter.kind == "gain" else 0.4
            params[f"{operator.key}.{parameter.name}"] = rng.standard_normal(shape) * scale + (parameter.kind == "gain")
    return params


def convergence_study(scheme: Scheme, seed: int = 0, order: int | None = None) -> Study:
    """Errors of ``scheme`` at ``N_t = 1, 2, 4, …`` steps and the fitted slope.

    ``order`` (the series order, when known) of 3 or more adds the steps ``FINE_STEPS``.
    """
    smooth = scheme.with_activation("tanh")
    fields = _Fields(smooth, _controls(smooth, seed))
    u0 = np.random.default_rng(seed + 1).standard_normal((1, TOKENS, WIDTH))
    fine = order is not None and order >= 3
    steps = STEPS + FINE_STEPS if fine else STEPS
    exact = _reference(fields, smooth, u0, FINE_REFERENCE_STEPS if fine else REFERENCE_STEPS)
    errors = []
    for count in steps:
        u = u0
        for _ in range(count):
            u = _step(fields, smooth.body, u, HORIZON / count)
        errors.append(float(np.abs(u - exact).max()))
    finest = slice(-3, None)
    x = np.log(HORIZON / np.array(steps, dtype=float))[finest]
    slope = float(np.polyfit(x, np.log(np.array(errors))[finest], 1)[0])
    return Study(scheme.name, steps, tuple(errors), slope)


def _figure(width: float, height: float):
    """A figure outside pyplot: no global backend switch, nothing to close (notebooks keep theirs)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    return figure, figure.subplots()


def _save(figure, path: Path) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, metadata={"Software": None})
    except OSError as error:
        raise SplitformerError(f"cannot write {path}: {error.strerror}") from None
    return path


def plot_study(study: Study, order: int, path: Path) -> Path:
    """Error against Δt on log–log axes, with a reference line of the expected slope."""
    steps = np.array([HORIZON / count for count in study.steps])
    errors = np.array(study.errors)
    figure, axes = _figure(4.8, 3.6)
    axes.loglog(steps, errors, "o-", label=f"{study.scheme} (slope {study.slope:.2f})")
    axes.loglog(steps, errors[-1] * (steps / steps[-1]) ** order, "--", color="gray", label=f"order {order}")
    axes.set_xlabel("Δt")
    axes.set_ylabel("max error at T = 1")
    axes.set_title(f"convergence of {study.scheme}")
    axes.legend()
    figure.tight_layout()
    return _save(figure, path)


def plot_studies(studies: list[Study], path: Path | None = None):
    """Every study on one set of log–log axes; saved to ``path``, or the figure when ``None``."""
    figure, axes = _figure(5.6, 4.2)
    for study in studies:
        steps = [HORIZON / count for count in study.steps]
        axes.loglog(steps, study.errors, "o-", markersize=3, label=f"{study.scheme} (slope {study.slope:.2f})")
    axes.set_xlabel("Δt")
    axes.set_ylabel("max error at T = 1")
    axes.set_title("convergence of the schemes")
    axes.legend(fontsize="small")
    figure.tight_layout()
    return figure if path is None else _save(figure, path)
