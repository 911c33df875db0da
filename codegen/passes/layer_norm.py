"""Recognize a derived LayerNorm: two means and one normalization map → ``Normalize``.

Matches ``α = mean_k x``, ``β = mean_k (x − α)²`` and ``out = g (x − α)/√(ε + β) + c``
(the projection onto ``S_1(0, 1)`` with its gain and bias, after ``inline-elementwise``)
when ``α`` and ``β`` are read nowhere else. Backends emit one fused normalization.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from itertools import permutations

import sympy as sp

from splitformer.symbolic.operators import EPSILON

from ..ir import Elementwise, Module, Normalize, Operand, Reduction

__all__ = ["layer_norm"]


def _match(op: Elementwise, mean: Reduction, variance: Reduction, module: Module) -> Normalize | None:
    x = mean.body
    if not isinstance(x, sp.Indexed) or not mean.mean or not variance.mean:
        return None
    row = x.indices[:-1]
    alpha = sp.IndexedBase(mean.out)[row]
    if variance.body != (x - alpha) ** 2:
        return None
    arrays = {str(item.base.label): item for item in op.expr.atoms(sp.Indexed)}
    source = next((item for name, item in arrays.items() if name == str(x.base.label)), None)
    params = [item for name, item in arrays.items() if module.tensors.get(name) and module.tensors[name].role == "param"]
    if source is None or len(params) != 2 or len(arrays) != 5:
        return None
    beta = sp.IndexedBase(variance.out)[row]
    candidates = [(gain, bias, gain * (source - alpha) / sp.sqrt(EPSILON + beta) + bias)
                  for gain, bias in permutations(params)]
    # the derived map is usually the expected expression itself; simplify only otherwise (slow)
    for equal in (lambda expr, expected: expr == expected, lambda expr, expected: sp.simplify(expr - expected) == 0):
        for gain, bias, expected in candidates:
            if equal(op.expr, expected):
                labels = op.labels
                return Normalize(op.out, labels, op.comment, op.section, x=Operand(str(source.base.label), labels),
                                 gain=str(gain.base.label), bias=str(bias.base.label), eps=EPSILON)
    return None


def layer_norm(module: Module) -> Module:
    reads = Counter(name for op in module.ops for name in op.reads())
    producers = {op.out: op for op in module.ops}
    fused: dict[int, Normalize] = {}
    removed: set[str] = set()
    for position, op in enumerate(module.ops):
        if not isinstance(op, Elementwise):
            continue
        reductions = [producers.get(name) for name in op.reads() if isinstance(producers.get(name), Reduction)]
        if len(reductions) != 2:
            continue
        variance = next((r for r in reductions if any(n == other.out for other in reductions for n in r.reads())), None)
        mean = next((r for r in reductions if r is not variance), None)
        if variance is None or mean is None or reads[mean.out] != 2 or reads[variance.out] != 1:
            continue
        normalize = _match(op, mean, variance, module)
        if normalize is not None:
            fused[position] = replace(normalize, comment="\n".join((mean.comment, variance.comment, op.comment)))
            removed |= {mean.out, variance.out}
    ops = [fused.get(position, op) for position, op in enumerate(module.ops) if op.out not in removed]
    return replace(module, ops=ops)
