"""Checks of the convolutional steps: equivariance of every convolution, BatchNorm as an affine map."""

from __future__ import annotations

import sympy as sp

from splitformer.symbolic.cnn_operators import STRIDE
from splitformer.symbolic.image import X1
from splitformer.symbolic.network_program import NetworkProgram
from splitformer.symbolic.operators import EPSILON
from . import SKIPPED, Check
from .equivariance import shift_commutes

__all__ = ["grid_checks", "batch_norm_check"]


def _equivariance(program: NetworkProgram) -> Check:
    results = []
    for stage in program.parts["field"] + program.parts["transfer"]:
        operator = stage.operator
        if operator.kind != "convolution":
            continue
        stride = STRIDE if operator.stride == "stride" else sp.Integer(operator.stride)
        assignment = stage.assignments[-1]
        results.append((operator.key, stride, shift_commutes(assignment, X1.index, 1, stride),
                        shift_commutes(assignment, X1.index, 1, stride + 1)))
    statement = ("Every derived convolution is a translation-equivariant integral operator: shifting its input by "
                 "its stride along the rows shifts its output by one grid node; a shift by stride + 1 does not "
                 "(negative control).")
    if not results:
        return Check(f"{program.spec.name}/translation-equivariance", program.spec.name, statement, SKIPPED, True,
                     "skipped: the step has no convolution")
    holds = all(right and not wrong for _, _, right, wrong in results)
    detail = "; ".join(f"{key}: shift by {stride} {'commutes' if right else 'does NOT commute'}, by {stride + 1} "
                       f"{'commutes (control failed)' if wrong else 'does not'}" for key, stride, right, wrong in results)
    return Check(f"{program.spec.name}/translation-equivariance", program.spec.name, statement, "symbolic", holds, detail)


def batch_norm_check(name: str, stages) -> Check:
    """BatchNorm (inference) equals the derived per-channel affine map in every BatchNorm stage."""
    u, gain, bias, mean, var = sp.symbols("u gamma beta mu v", real=True)
    reference = gain * (u - mean) / sp.sqrt(var + EPSILON) + bias  # BatchNorm2d.eval(), Ioffe & Szegedy 2015
    wrong = gain * (u - mean) / (sp.sqrt(var) + EPSILON) + bias
    failures, controls = [], []
    for stage in stages:
        if stage.operator.kind != "batch-norm":
            continue
        key = stage.operator.key
        scale, shift = (stage.assignments[0].rhs, stage.assignments[1].rhs)
        names = {f"{key}_gain": gain, f"{key}_bias": bias, f"{key}_mean": mean, f"{key}_var": var}
        plain = {read: names[str(read.base.label)] for read in (scale + shift).atoms(sp.Indexed)}
        affine = scale.xreplace(plain) * u + shift.xreplace(plain)
        if sp.simplify(affine - reference) != 0:
            failures.append(key)
        if sp.simplify(affine - wrong) == 0:
            controls.append(key)
    return Check(f"{name}/batch-norm-affine", name,
                 "BatchNorm in inference mode, γ (u − μ)/√(v + ε) + β, equals the derived per-channel affine map "
                 "a u + c; the same map differs from γ (u − μ)/(√v + ε) + β (negative control).", "symbolic",
                 not failures and not controls,
                 "derived a u + c − reference simplifies to 0 for every BatchNorm" if not failures and not controls
                 else f"mismatch: {failures}; control not rejected: {controls}")


def grid_checks(program: NetworkProgram) -> list[Check]:
    """The statements of a convolutional step (its derived adjoint's are ``grid_adjoint_checks``)."""
    return [_equivariance(program), batch_norm_check(program.spec.name, program.stages())]
