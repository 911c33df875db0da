"""Recognize a derived LayerNorm whose normalized values the adjoint reads: four statements → one ``Normalize``.

Matches ``α = mean_k x``, ``β = mean_k (x − α)²``, ``P = (x − α)/√(ε + β)`` and ``out = g P + c`` (controls
``g``, ``c``) when ``α`` is read nowhere else: the ``layer-norm`` pass leaves these apart when a derived adjoint
reads ``P`` and ``β``; here they become one ``Normalize`` that keeps ``(P, β)`` as further outputs (the
statistics in one pass over ``x`` instead of a mean, a mean of squares and two maps).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import sympy as sp

from splitformer.symbolic.operators import EPSILON

from ..ir import Elementwise, Module, Normalize, Operand, Reduction, readers as reading
from .layer_norm_adjoint import normalized_variance

__all__ = ["kept_layer_norm"]


def _affine(op, p_name: str, module: Module) -> tuple[str, str] | None:
    """(gain, bias) when ``op`` is ``out = g[l] P[i, l] + c[l]`` with controls ``g``, ``c``, else None."""
    if not isinstance(op, Elementwise):
        return None
    arrays = {str(item.base.label): item for item in op.expr.atoms(sp.Indexed)}
    controls = [name for name in arrays if module.tensors.get(name) is not None and module.tensors[name].role == "param"]
    if p_name not in arrays or len(arrays) != 3 or len(controls) != 2:
        return None
    p = arrays[p_name]
    for gain, bias in (controls, controls[::-1]):
        if op.expr == sp.IndexedBase(gain)[p.indices[-1]] * p + sp.IndexedBase(bias)[p.indices[-1]]:
            return gain, bias
    return None


def kept_layer_norm(module: Module) -> Module:
    readers = defaultdict(list, reading(module.ops))
    producers = {name: op for op in module.ops for name in op.writes()}
    ops = list(module.ops)
    for p in module.ops:
        variance_name = normalized_variance(p, producers)
        if variance_name is None:
            continue
        variance = producers[variance_name]
        mean = next(producers[name] for name in p.reads()
                    if name != variance_name and isinstance(producers.get(name), Reduction))
        outs = [op for op in readers[p.out] if _affine(op, p.out, module) is not None]
        if len(outs) != 1 or {id(op) for op in readers[mean.out]} != {id(variance), id(p)}:
            continue
        (out,) = outs
        gain, bias = _affine(out, p.out, module)
        fused = Normalize(out.out, out.labels, "\n".join(op.comment for op in (mean, variance, p, out)), out.section,
                          x=Operand(str(mean.body.base.label), p.labels), gain=gain, bias=bias, eps=EPSILON,
                          kept=(p.out, variance.out))
        gone = {id(op) for op in (variance, p, out)}
        ops = [fused if op is mean else op for op in ops if id(op) not in gone]
    return replace(module, ops=ops)
