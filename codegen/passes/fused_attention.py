"""Recognize the softmax-attention contraction: scores, kernel and mixing → ``Attention``.

Matches ``a = scale Σ_e q k`` (axes ``b, m, i, j``), ``γ = softmax_j(a, χ)`` and
``o = Σ_j γ v`` when ``a`` and ``γ`` are read nowhere else. PyTorch emits
``scaled_dot_product_attention``; NumPy one batched routine with an in-place softmax.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ..ir import BATCH, Attention, Contraction, Module, Softmax

__all__ = ["fused_attention"]


def _is_scores(op, softmax: Softmax) -> bool:
    if not isinstance(op, Contraction) or len(op.operands) != 2 or op.bias is not None:
        return False
    q, k = op.operands
    if len(q.labels) != 4 or q.labels[0] != BATCH or len(k.labels) != 4:
        return False
    _, row, head, feature = q.labels
    _, column, head_k, feature_k = k.labels
    return (head, feature) == (head_k, feature_k) and op.labels == (BATCH, head, row, column) == softmax.labels


def _is_mixing(op, softmax: Softmax, scores: Contraction) -> bool:
    if not isinstance(op, Contraction) or len(op.operands) != 2 or op.bias is not None or op.scale != 1:
        return False
    kernel, v = op.operands
    q, k = scores.operands
    return (kernel.name == softmax.out and kernel.labels == softmax.labels and v.labels == k.labels
            and op.labels == q.labels)


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
        if reads.get(scores.out if scores else "", 0) != 1 or not _is_scores(scores, softmax):
            continue
        if not _is_mixing(op, softmax, scores):
            continue
        q, k = scores.operands
        fused = Attention(op.out, op.labels, "\n".join((scores.comment, softmax.comment, op.comment)), op.section,
                          q=q, k=k, v=op.operands[1], scale=scores.scale, support=softmax.support)
        ops = [fused if item is op else item for item in ops if item is not scores and item is not softmax]
    return replace(module, ops=ops)
