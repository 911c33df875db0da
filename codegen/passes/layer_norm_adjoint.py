"""Recognize the adjoint of a derived LayerNorm: its statements → one ``NormalizeAdjoint``.

For ``α = mean_k x``, ``β = mean_k (x − α)²``, ``P = (x − α)/s`` with ``s = √(ε + β)`` in the forward and the
costate ``λ`` of ``g P + c``, the derived adjoint writes

    P̄ = g λ,  t₁ = Σ_l P P̄,  β̄ = −t₁/(2 s²),  t₂ = Σ_k P,  t₃ = Σ_l P̄,
    x̄ = P̄/s + 2 s β̄ P/N + (−t₃/s − 2 s β̄ t₂/N)/N  (+ the costate's other terms).

Since ``t₂ = Σ_k (x − α)/s = 0`` (``α`` is the mean of ``x``), ``x̄ = (P̄ − mean P̄ − P mean(P̄ P))/s``: one
fused LayerNorm backward read at ``P`` (matched when ``P̄``, ``t₁``, ``β̄``, ``t₂``, ``t₃`` are read nowhere else).
The costate's other terms (a residual's) stay an elementwise sum. RMSNorm (no mean) is left alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from types import MappingProxyType

import sympy as sp

from splitformer.symbolic.operators import EPSILON

from ..ir import Contraction, Elementwise, Module, NormalizeAdjoint, Reduction, readers as reading

__all__ = ["layer_norm_adjoint"]


@lru_cache(maxsize=1024)
def _indexed(expr: sp.Expr) -> Mapping[str, sp.Indexed]:
    """The arrays ``expr`` reads, by name (cached: the search asks it of every statement once per LayerNorm fused and
    per candidate ``P``)."""
    return MappingProxyType({str(item.base.label): item for item in expr.atoms(sp.Indexed)})


def _equal(expr: sp.Expr, expected: sp.Expr) -> bool:
    """``expr`` is ``expected`` (SymPy distributes a number over a sum unless told otherwise: compare the difference)."""
    return expr == expected or sp.cancel(expr - expected) == 0


def normalized_variance(op, producers: dict) -> str | None:
    """β when ``op`` is ``P = (x − α)/√(ε + β)`` with ``α = mean_k x``, ``β = mean_k (x − α)²``, else None."""
    if not isinstance(op, Elementwise):
        return None
    arrays = _indexed(op.expr)
    reductions = [producers[name] for name in arrays if isinstance(producers.get(name), Reduction)]
    mean = next((r for r in reductions if isinstance(r.body, sp.Indexed) and r.mean), None)
    variance = next((r for r in reductions if r is not mean and r.mean), None)
    if len(arrays) != 3 or mean is None or variance is None:
        return None
    x = mean.body
    if variance.body != (x - sp.IndexedBase(mean.out)[x.indices[:-1]]) ** 2 or str(x.base.label) not in arrays:
        return None
    at = arrays[str(x.base.label)]
    row = at.indices[:-1]
    if op.expr != (at - sp.IndexedBase(mean.out)[row]) / sp.sqrt(EPSILON + sp.IndexedBase(variance.out)[row]):
        return None
    return variance.out


def _scaled_costate(op, module: Module, at: tuple) -> tuple[str, str] | None:
    """(gain, costate) when ``op`` is ``P̄ = g[l] λ[i, l]`` (``g`` a control) at the indices ``at`` of ``P``."""
    if not isinstance(op, Elementwise):
        return None
    gain = next((name for name in op.reads() if module.tensors.get(name) is not None
                 and module.tensors[name].role == "param"), None)
    costate = next((name for name in op.reads() if name != gain), None)
    if gain is None or costate is None or op.expr != sp.IndexedBase(gain)[at[-1]] * sp.IndexedBase(costate)[at]:
        return None
    return gain, costate


def _row_product(op, p_name: str, p_bar: Elementwise) -> bool:
    """``t₁ = Σ_l P P̄`` over the last axis."""
    return (isinstance(op, Contraction) and op.bias is None and op.scale == 1
            and {operand.name for operand in op.operands} == {p_name, p_bar.out}
            and all(operand.labels == p_bar.labels for operand in op.operands) and op.labels == p_bar.labels[:-1])


def _row_sum(op, name: str) -> bool:
    """``Σ_l name`` over the last axis."""
    return (isinstance(op, Reduction) and not op.mean and isinstance(op.body, sp.Indexed)
            and str(op.body.base.label) == name and op.axis == op.body_labels[-1])


def _control_gradients(p_name: str, costate: str, readers: dict) -> tuple | None:
    """The contractions ``ḡ = Σ P λ`` and ``c̄ = Σ λ`` over all but the last axis (the gain's and bias's
    gradients), when each is written once and read by nothing else; else None (they stay as derived)."""
    def summed(op, names: set[str]) -> bool:
        return (isinstance(op, Contraction) and op.bias is None and op.scale == 1 and len(op.labels) == 1
                and {operand.name for operand in op.operands} == names and len(op.operands) == len(names)
                and all(operand.labels[-1] == op.labels[0] for operand in op.operands)
                and len({operand.labels for operand in op.operands}) == 1)
    gain_bar = [op for op in readers[costate] if summed(op, {p_name, costate})]
    bias_bar = [op for op in readers[costate] if summed(op, {costate})]
    if len(gain_bar) != 1 or len(bias_bar) != 1 or readers.get(gain_bar[0].out) or readers.get(bias_bar[0].out):
        return None  # a term of a shared control's gradient (rk2's stages) is summed earlier than x̄: left apart
    return gain_bar[0], bias_bar[0]


def _fused(costate_op: Elementwise, p_name: str, variance: str, producers: dict, readers: dict, module: Module):
    """(ops removed, replacement ops) when ``costate_op`` holds ``x̄`` of the LayerNorm of ``P = p_name``, else None."""
    arrays = _indexed(costate_op.expr)
    if p_name not in arrays or variance not in arrays:
        return None
    written = [producers[name] for name in sorted(arrays) if name not in (p_name, variance) and name in producers]
    for p_bar in written:
        found = _group(costate_op, arrays[p_name], variance, p_bar, written, producers, readers, module)
        if found is not None:
            return found
    return None


def _group(costate_op: Elementwise, p: sp.Indexed, variance: str, p_bar, written: list, producers: dict,
           readers: dict, module: Module):
    """``_fused`` with ``p_bar`` as ``P̄``."""
    p_name, row = str(p.base.label), p.indices[:-1]
    scaled = _scaled_costate(p_bar, module, p.indices)
    if scaled is None:
        return None
    gain, costate = scaled
    s = sp.sqrt(EPSILON + sp.IndexedBase(variance)[row])
    beta_bar = t1 = None
    for op in written:
        candidate = producers.get(next((name for name in op.reads() if name != variance), ""))
        if isinstance(op, Elementwise) and _row_product(candidate, p_name, p_bar) and \
                _equal(op.expr, -sp.IndexedBase(candidate.out)[row] / (2 * (EPSILON + sp.IndexedBase(variance)[row]))):
            beta_bar, t1 = op, candidate
    t2 = next((op for op in written if _row_sum(op, p_name)), None)
    t3 = next((op for op in written if _row_sum(op, p_bar.out)), None)
    if beta_bar is None or t2 is None or t3 is None:
        return None
    size = p.indices[-1].upper + 1
    beta_bar_at, t2_at, t3_at = (sp.IndexedBase(name)[row] for name in (beta_bar.out, t2.out, t3.out))
    expected = (sp.IndexedBase(p_bar.out)[p.indices] / s + 2 * s * beta_bar_at * p / size
                + (-t3_at / s - 2 * s * beta_bar_at * t2_at / size) / size)
    terms, wanted = list(sp.Add.make_args(costate_op.expr)), list(sp.Add.make_args(expected))
    group = (p_bar, t1, beta_bar, t2, t3)
    if (not all(term in terms for term in wanted) or not set(readers[p_bar.out]) <= {t1, t3, costate_op}
            or readers[t1.out] != [beta_bar] or any(readers[op.out] != [costate_op] for op in (beta_bar, t2, t3))):
        return None
    rest = sp.Add(*(term for term in terms if term not in wanted))
    out = costate_op.out if rest == 0 else f"{p_name.rsplit('_', 1)[0]}_x_bar"
    # the row sums t₁, t₂, t₃ are written out in β̄'s and ᾱ's formulas, and the fused call has no array of theirs
    comments = [op.comment for op in group if op not in (t1, t2, t3)] + ([costate_op.comment] if rest == 0 else [])
    gradients = _control_gradients(p_name, costate, readers)
    if gradients:
        group += gradients
        comments = [op.comment for op in gradients] + comments
    # under the normalization's own section (P̄'s): λ before it is this substep's adjoint, not the one before's
    fused = NormalizeAdjoint(out, costate_op.labels, "\n".join(comments), p_bar.section, costate=costate,
                             p=p_name, variance=variance, gain=gain, eps=EPSILON,
                             gradients=tuple(op.out for op in gradients) if gradients else None)
    if rest == 0:
        return group, [fused]
    return group, [fused, Elementwise(costate_op.out, costate_op.labels, costate_op.comment, costate_op.section,
                                      expr=rest + sp.IndexedBase(out)[p.indices])]


def layer_norm_adjoint(module: Module) -> Module:
    ops = list(module.ops)
    while True:  # one LayerNorm at a time: a costate may hold the adjoints of several (rk2's stages)
        fused = _fuse_one(replace(module, ops=ops))
        if fused is None:
            return replace(module, ops=ops)
        ops = fused


def _fuse_one(module: Module) -> list | None:
    """The ops with one LayerNorm adjoint fused, or None when there is none left."""
    readers = defaultdict(list, reading(module.ops))
    producers = {name: op for op in module.ops for name in op.writes()}
    normalized = {op.out: variance for op in module.ops if (variance := normalized_variance(op, producers)) is not None}
    for op in module.ops:
        for p_name, variance in normalized.items() if isinstance(op, Elementwise) else ():
            found = _fused(op, p_name, variance, producers, readers, module)
            if found is not None:
                group, replacement = found
                gone = {id(item) for item in group}
                ops = [new for item in module.ops if id(item) not in gone
                       for new in (replacement if item is op else [item])]
                return _not_reopening(ops, replacement[0], op.section)
    return None


def _not_reopening(ops: list, fused, costate_section: str) -> list:
    """``ops`` with ``fused`` under the costate's section where its own (its normalization's) closed before it: a
    LayerNorm read by two branches from one state is fused where that state's costate is summed, after the branches'
    other sections (symmetric-parallel's norm2 of branch substep 3, after substep 1), and would repeat a header."""
    at = next(index for index, item in enumerate(ops) if item is fused)
    before = [item.section for item in ops[:at]]
    if fused.section in before and before[-1] != fused.section:
        ops[at] = replace(fused, section=costate_section)
    return ops
