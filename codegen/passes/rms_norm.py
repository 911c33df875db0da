"""Recognize a derived RMSNorm: a mean of squares and one scaling map → ``Normalize(centred=False)``.

Matches ``ρ = mean_k x²`` and ``out = g x/√(ε + ρ)`` (the projection onto the sphere
``{mean u² = 1}`` with its gain, after ``inline-elementwise``) when ``ρ`` is read nowhere else.
Backends emit one fused RMS normalization.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import sympy as sp

from splitformer.symbolic.operators import EPSILON

from ..ir import Elementwise, Module, Normalize, Operand, Reduction

__all__ = ["rms_norm"]


def _match(op: Elementwise, mean_square: Reduction, module: Module) -> Normalize | None:
    body = mean_square.body
    if not (mean_square.mean and isinstance(body, sp.Pow) and body.exp == 2 and isinstance(body.base, sp.Indexed)):
        return None
    x = body.base
    rho = sp.IndexedBase(mean_square.out)[x.indices[:-1]]
    arrays = {str(item.base.label): item for item in op.expr.atoms(sp.Indexed)}
    params = [item for name, item in arrays.items() if module.tensors.get(name) and module.tensors[name].role == "param"]
    source = arrays.get(str(x.base.label))
    if source is None or len(params) != 1 or len(arrays) != 3:
        return None
    gain = params[0]
    if sp.simplify(op.expr - gain * source / sp.sqrt(EPSILON + rho)) != 0:
        return None
    return Normalize(op.out, op.labels, op.comment, op.section, x=Operand(str(source.base.label), op.labels),
                     gain=str(gain.base.label), eps=EPSILON, centred=False)


def rms_norm(module: Module) -> Module:
    reads = Counter(name for op in module.ops for name in op.reads())
    producers = {op.out: op for op in module.ops}
    fused: dict[int, Normalize] = {}
    removed: set[str] = set()
    for position, op in enumerate(module.ops):
        if not isinstance(op, Elementwise):
            continue
        reductions = [producers[name] for name in op.reads() if isinstance(producers.get(name), Reduction)]
        if len(reductions) != 1 or reads[reductions[0].out] != 1:
            continue
        normalize = _match(op, reductions[0], module)
        if normalize is not None:
            fused[position] = replace(normalize, comment="\n".join((reductions[0].comment, op.comment)))
            removed.add(reductions[0].out)
    ops = [fused.get(position, op) for position, op in enumerate(module.ops) if op.out not in removed]
    return replace(module, ops=ops)
