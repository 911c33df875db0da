"""Recognize the adjoint of softmax attention: its six statements → one ``AttentionAdjoint``.

In a program lowered with its derived adjoint (``codegen.adjoint``), the forward's scores
``a = scale Σ_e q k``, kernel ``γ = softmax_j(a, χ)`` and mixing ``o = Σ_j γ v`` are read by the
adjoint's

    γ̄ = Σ_e ō v,  t = Σ_j γ γ̄,  ā = γ γ̄ − γ t,  v̄ = Σ_i γ ō,  k̄ = scale Σ_i ā q,  q̄ = scale Σ_j ā k

(``B·H·N²`` arrays each). When these are the only readers of ``a``, ``γ``, ``γ̄``, ``t`` and ``ā``,
the forward becomes one ``Attention`` that also keeps the log of each row's normalizer, and the
adjoint one ``AttentionAdjoint`` (a flash-attention backward): since ``o = Σ_j γ v``,
``t = Σ_e ō o``, so no ``N²`` array has to be kept or written more than once. Runs before
``fused-attention`` (which leaves a kernel the adjoint reads unfused). Grouped heads (queries on ``(g, s)``, keys
and values on ``g``; llama's, with the rotary pair axes as features) are recognized alike: each sum over a key
head's queries runs over its members ``s`` too (``k̄ = scale Σ_{s,i} ā q``, ``v̄ = Σ_{s,i} γ ō``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import sympy as sp

from ..ir import Attention, AttentionAdjoint, Contraction, Elementwise, Module, Softmax, readers as reading
from .fused_attention import is_mixing, is_scores

__all__ = ["attention_adjoint"]


def _canonical(spec: str) -> str:
    """An einsum spec with its axis letters renamed in order of appearance (``bmji,…`` ≅ ``bxyz,…``)."""
    names: dict[str, str] = {}
    return "".join(names.setdefault(c, chr(ord("A") + len(names))) if c.isalpha() else c for c in spec)


def _contraction(op, spec: str, names: tuple[str, ...], scale: sp.Expr = sp.Integer(1)) -> bool:
    """Whether ``op`` is the contraction ``spec`` (up to axis names) of the arrays ``names``, scaled by ``scale``."""
    return (isinstance(op, Contraction) and op.bias is None and op.scale == scale
            and tuple(operand.name for operand in op.operands) == names and _canonical(op.spec) == _canonical(spec))


def _is_softmax_adjoint(op, kernel: str, kernel_bar: str, row_sum: str) -> bool:
    """``ā = γ γ̄ − γ t`` with ``t`` read at the row of ``γ``, ``γ̄`` at its entry."""
    if not isinstance(op, Elementwise):
        return False
    arrays = {str(item.base.label): item for item in op.expr.atoms(sp.Indexed)}
    if set(arrays) != {kernel, kernel_bar, row_sum}:
        return False
    gamma, gamma_bar, total = arrays[kernel], arrays[kernel_bar], arrays[row_sum]
    if gamma.indices != gamma_bar.indices or total.indices != gamma.indices[:-1]:
        return False
    if op.labels[1:] != tuple(str(index) for index in gamma.indices):
        return False
    return sp.expand(op.expr - (gamma * gamma_bar - gamma * total)) == 0


def _heads(softmax: Softmax, q, k) -> tuple[str, str, str] | None:
    """The letters of the query's heads, the key's heads and the query's feature axes in the adjoint's einsum specs:
    ``m``, ``m``, ``e`` for plain heads (b, i, m, e); ``gs``, ``g``, one letter per feature axis for grouped heads
    (queries (b, i, g, s, features…), keys (b, j, g, features…)); None for any other layout."""
    heads = len(softmax.labels) - 3  # the kernel's (b, heads…, i, j)
    features = len(q.labels) - 2 - heads
    if heads == 1 and features == 1:
        return "m", "m", "e"
    if heads == 2 and 1 <= features <= 4 and k.labels[2:3] == q.labels[2:3] and len(k.labels) == 3 + features:
        return "gs", "g", "wxyz"[:features]
    return None


def _fused(module: Module, softmax: Softmax, readers: dict, producers: dict) -> tuple[list, dict] | None:
    """(the ops removed, {op replaced: its replacement}) for the attention of ``softmax``, else None."""
    scores = producers.get(softmax.scores.name)
    if not isinstance(scores, Contraction) or readers[scores.out] != [softmax] or not is_scores(scores, softmax):
        return None
    q, k = scores.operands
    layout = _heads(softmax, q, k)
    if layout is None:
        return None
    hq, hk, f = layout
    kernel = softmax.out
    mixing = next((op for op in readers[kernel] if isinstance(op, Contraction) and op.operands[0].name == kernel
                   and is_mixing(op, softmax, scores)), None)
    if mixing is None or len(readers[kernel]) != 4:
        return None
    v = mixing.operands[1]
    others = [op for op in readers[kernel] if op is not mixing]
    row_sum = next((op for op in others if isinstance(op, Contraction) and len(op.operands) == 2
                    and op.operands[0].name == kernel), None)
    if row_sum is None:
        return None
    kernel_bar = producers.get(row_sum.operands[1].name)
    if not isinstance(kernel_bar, Contraction) or len(kernel_bar.operands) != 2:
        return None
    o_bar = kernel_bar.operands[0].name
    if not (_contraction(kernel_bar, f"bi{hq}e,bj{hk}e->b{hq}ij", (o_bar, v.name))
            and _contraction(row_sum, f"b{hq}ij,b{hq}ij->b{hq}i", (kernel, kernel_bar.out))):
        return None
    scores_bar = next((op for op in others if _is_softmax_adjoint(op, kernel, kernel_bar.out, row_sum.out)), None)
    v_bar = next((op for op in others if _contraction(op, f"b{hq}ji,bj{hq}e->bi{hk}e", (kernel, o_bar))), None)
    if scores_bar is None or v_bar is None or {id(op) for op in others} != {id(row_sum), id(scores_bar), id(v_bar)}:
        return None
    if readers[kernel_bar.out] != [row_sum, scores_bar] or readers[row_sum.out] != [scores_bar]:
        return None
    k_bar = next((op for op in readers[scores_bar.out]
                  if _contraction(op, f"b{hq}ji,bj{hq}{f}->bi{hk}{f}", (scores_bar.out, q.name), scores.scale)), None)
    q_bar = next((op for op in readers[scores_bar.out]
                  if _contraction(op, f"b{hq}ij,bj{hk}{f}->bi{hq}{f}", (scores_bar.out, k.name), scores.scale)), None)
    if k_bar is None or q_bar is None or len(readers[scores_bar.out]) != 2:
        return None
    normalizer = f"{kernel}_log_total"
    forward = Attention(mixing.out, mixing.labels, "\n".join((scores.comment, softmax.comment, mixing.comment)),
                        mixing.section, q=q, k=k, v=v, scale=scores.scale, support=softmax.support, normalizer=normalizer)
    group = (kernel_bar, row_sum, scores_bar, v_bar, k_bar, q_bar)
    # the row sum is written out in ā's formula, and the fused call has no array of its
    adjoint = AttentionAdjoint(q_bar.out, q_bar.labels, "\n".join(op.comment for op in group if op is not row_sum),
                               kernel_bar.section,
                               q=q, k=k, v=v, o=mixing.out, o_bar=o_bar, normalizer=normalizer, scale=scores.scale,
                               support=softmax.support, outputs=(q_bar.out, k_bar.out, v_bar.out))
    return [scores, softmax, *group[1:]], {id(mixing): forward, id(kernel_bar): adjoint}


def attention_adjoint(module: Module) -> Module:
    readers = defaultdict(list, reading(module.ops))
    producers = {name: op for op in module.ops for name in op.writes()}
    ops = list(module.ops)
    for softmax in [op for op in module.ops if isinstance(op, Softmax)]:
        fused = _fused(module, softmax, readers, producers)
        if fused is None:
            continue
        removed, replaced = fused
        gone = {id(op) for op in removed}
        ops = [replaced.get(id(op), op) for op in ops if id(op) not in gone]
    return replace(module, ops=ops)
