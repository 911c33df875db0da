"""Recognize the softmax-attention contraction: scores, kernel and mixing → ``Attention``.

Matches ``a = scale Σ_e q k`` (axes ``b, m, i, j``), ``γ = softmax_j(a, χ)`` and
``o = Σ_j γ v`` when ``a`` and ``γ`` are read nowhere else. PyTorch emits
``scaled_dot_product_attention``; NumPy one batched routine with an in-place softmax.

Grouped heads (GQA) match too: queries on the heads ``(g, s)``, keys and values on ``g``
(axes ``b, g, s, i, j``), with the features a pair of axes (a rotated pair ``(c, r)``) or one,
a support over ``(b, i, j)`` only; they are emitted as ``_grouped_attention``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ..ir import BATCH, Attention, Contraction, Module, Softmax

__all__ = ["fused_attention"]


def is_scores(op, softmax: Softmax) -> bool:
    if not isinstance(op, Contraction) or len(op.operands) != 2 or op.bias is not None:
        return False
    q, k = op.operands
    if len(q.labels) == 4 and len(k.labels) == 4 and q.labels[0] == BATCH:
        _, row, head, feature = q.labels
        _, column, head_k, feature_k = k.labels
        return (head, feature) == (head_k, feature_k) and op.labels == (BATCH, head, row, column) == softmax.labels
    return _grouped_scores(op, softmax) is not None


def _grouped_scores(op: Contraction, softmax: Softmax) -> tuple[str, str, str, str] | None:
    """``(row, column, group, member)`` of grouped scores ``a[b, g, s, i, j] = scale Σ q[b, i, g, s, f…]
    k[b, j, g, f…]`` restricted to a support over ``(b, i, j)``, else None."""
    q, k = op.operands
    if len(q.labels) < 5 or q.labels[0] != BATCH or k.labels[:1] != (BATCH,):
        return None
    _, row, group, member, *features = q.labels
    _, column, *rest = k.labels
    distinct = len({row, column, group, member, *features}) == 4 + len(features)
    if rest != [group, *features] or not 1 <= len(features) <= 2 or not distinct:
        return None
    if op.labels != (BATCH, group, member, row, column) or softmax.labels != op.labels:
        return None
    if softmax.support is not None and softmax.support.labels != (BATCH, row, column):
        return None
    return row, column, group, member


def is_mixing(op, softmax: Softmax, scores: Contraction) -> bool:
    if not isinstance(op, Contraction) or len(op.operands) != 2 or op.bias is not None or op.scale != 1:
        return False
    kernel, v = op.operands
    q, k = scores.operands
    if kernel.name != softmax.out or kernel.labels != softmax.labels:
        return False
    if len(q.labels) == 4:
        return v.labels == k.labels and op.labels == q.labels
    row, column, group, member = _grouped_scores(scores, softmax)
    value = v.labels[-1]
    return (v.labels == (BATCH, column, group, value) and op.labels == (BATCH, row, group, member, value)
            and value not in q.labels)


def fused_attention(module: Module) -> Module:
    reads = Counter(name for op in module.ops for name in op.reads())
    producers = {op.out: op for op in module.ops}
    ops = list(module.ops)
    for position, op in enumerate(module.ops):
        if not isinstance(op, Contraction) or len(op.operands) != 2:
            continue
        softmax = producers.get(op.operands[0].name)
        if not isinstance(softmax, Softmax) or reads[softmax.out] != 1:
            continue
        scores = producers.get(softmax.scores.name)
        if reads.get(scores.out if scores else "", 0) != 1 or not is_scores(scores, softmax):
            continue
        if not is_mixing(op, softmax, scores):
            continue
        q, k = scores.operands
        fused = Attention(op.out, op.labels, "\n".join((scores.comment, softmax.comment, op.comment)), op.section,
                          q=q, k=k, v=op.operands[1], scale=scores.scale, support=softmax.support,
                          dropout=softmax.dropout)
        ops = [fused if item is op else item for item in ops if item is not scores and item is not softmax]
    return replace(module, ops=ops)
