"""The convergence study's reference flow: as few RK4 steps as its own error allows, never a less accurate one.

Ground truth is RK4 with 2048 steps (the old fixed reference for high orders), written out here as
a plain loop over the independent evaluator's field, not through ``reference_flow``.
"""

import numpy as np
import pytest

from splitformer.codegen.verification import convergence
from splitformer.codegen.verification.parameters import random_parameters
from splitformer.codegen.verification.semantics import FLOAT, Semantics
from splitformer.symbolic import load_scheme
from splitformer.symbolic.equation import equation_terms


def _truth(semantics, scheme, u, steps=2048):
    """RK4 on Σ c_k A_k(u) over [0, 1] in ``steps`` steps, written out."""
    terms = [(float(term.coefficient), term.substep) for term in equation_terms(scheme) if not term.projection]
    dt = 1 / steps
    for _ in range(steps):
        stages = []
        for weight in (0, 0.5, 0.5, 1):
            v = u + weight * dt * stages[-1] if stages else u
            stages.append(sum(c * semantics.field(step, v) for c, step in terms))
        u = u + dt / 6 * (stages[0] + 2 * stages[1] + 2 * stages[2] + stages[3])
    return u


def _recorded_study(monkeypatch, scheme, order):
    """The study, and what its reference was given and chose."""
    seen = {}
    chosen = convergence.converged_reference

    def recording(semantics, smooth, u, solutions, most):
        seen.update(semantics=semantics, scheme=smooth, u=u, solutions=solutions, most=most)
        seen["reference"], seen["steps"] = chosen(semantics, smooth, u, solutions, most)
        return seen["reference"], seen["steps"]

    monkeypatch.setattr(convergence, "converged_reference", recording)
    return convergence.convergence_study(scheme, order=order), seen


@pytest.mark.parametrize("name, order", [("post-ln", 1), ("rk2", 2)])
def test_the_reference_is_within_its_tolerance_of_a_fine_rk4_with_fewer_steps(monkeypatch, name, order):
    scheme = load_scheme(name)
    study, seen = _recorded_study(monkeypatch, scheme, order)
    truth = _truth(seen["semantics"], seen["scheme"], seen["u"])
    errors = np.array([np.abs(u - truth).max() for u in seen["solutions"]])
    assert seen["steps"] < convergence.REFERENCE_STEPS
    assert np.abs(seen["reference"] - truth).max() <= convergence.REFERENCE_TOLERANCE * errors.min()
    np.testing.assert_allclose(study.errors, errors, rtol=2 * convergence.REFERENCE_TOLERANCE)
    if name == "rk2":  # negative control: a reference of 16 steps misses the tolerance
        coarse = convergence.reference_flow(seen["semantics"], seen["scheme"], seen["u"], 16)
        assert np.abs(coarse - truth).max() > convergence.REFERENCE_TOLERANCE * errors.min()


def _post_ln_flow():
    scheme = convergence.smooth_variant(load_scheme("post-ln"))
    params = random_parameters(scheme, convergence.SIZES, 0)
    u = np.random.default_rng(1).standard_normal((convergence.SIZES.tokens, convergence.SIZES.features))
    return Semantics(scheme, params, convergence.SIZES, FLOAT, eps=1e-5, projections=False), scheme, u


def test_a_solution_as_close_as_the_estimate_takes_the_most_steps():
    semantics, scheme, u = _post_ln_flow()
    as_accurate = convergence.reference_flow(semantics, scheme, u, convergence.REFERENCE_START)
    reference, steps = convergence.converged_reference(semantics, scheme, u, [as_accurate], most=256)
    assert steps == 256
    np.testing.assert_array_equal(reference, convergence.reference_flow(semantics, scheme, u, 256))
    far = as_accurate + 1e-3  # control: a solution far from the flow stops at the fewest steps
    assert convergence.converged_reference(semantics, scheme, u, [far], most=256)[1] == convergence.REFERENCE_START


def test_outside_rk4s_asymptotic_regime_the_reference_takes_the_most_steps(monkeypatch):
    semantics, scheme, u = _post_ln_flow()
    for power, steps in ((1, 256), (4, convergence.REFERENCE_START)):  # gaps shrinking 2× (not RK4's 16×); control: 16×
        monkeypatch.setattr(convergence, "reference_flow", lambda *args, power=power: args[2] + 1.0 / args[3] ** power)
        assert convergence.converged_reference(semantics, scheme, u, [u + 1], most=256)[1] == steps
