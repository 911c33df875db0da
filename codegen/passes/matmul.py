"""Contractions of the state with a learned kernel → 2-D matrix products with a bias epilogue.

``Σ_k x[b, i, k] W[k, …] + c[…]`` becomes ``x.reshape(rows, K) @ W + c`` with ``W`` and
``c`` in their canonical (2-D and 1-D) layout: one GEMM (``addmm`` in PyTorch) instead of
an einsum, and the bias folded into it. ``Σ_… x[b, i, …] W[k, …] (+ y[b, i, k])`` (an adjoint: the kernel's
output axes contracted, the other costate terms added) becomes ``x.reshape(rows, K) @ Wᵀ (+ y)``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from ..ir import BATCH, Contraction, MatMul, Module

__all__ = ["matmul"]


def _stored(module: Module, name: str) -> int | None:
    """The number of axes the parameter ``name`` is stored with (its canonical layout), or None (not a parameter)."""
    info = module.tensors.get(name)
    return None if info is None or info.shape is None else len(info.shape)


def _candidate(op, module: Module) -> MatMul | None:
    if not isinstance(op, Contraction) or op.scale != 1 or len(op.operands) != 2:
        return None
    x, weight = op.operands
    if not module.batched(x.name) or module.batched(weight.name):
        return None
    # bound in its canonical layout, the kernel must be stored as the matrix (contracted axes, free axes) and its
    # bias as a vector: a plug-in's kernel stored (d, d, d_ff) over (k; heads, features, hidden) is not
    if _stored(module, weight.name) != 2 or (op.bias is not None and _stored(module, op.bias.name) not in (None, 1)):
        return None
    rows = op.labels[:2]
    if x.labels[:2] != rows or rows[0] != BATCH:
        return None
    contracted, free = x.labels[2:], op.labels[2:]
    # an adjoint's product may carry the other costate terms as a batched addend with its axes
    transposed = weight.labels == free + contracted and (op.bias is None or (
        op.bias.labels == op.labels and module.batched(op.bias.name)))
    if not transposed and (weight.labels != contracted + free or (op.bias is not None and op.bias.labels != free)):
        return None
    if not transposed and op.bias is not None and module.batched(op.bias.name):
        return None
    return MatMul(op.out, op.labels, op.comment, op.section, x=x, weights=(weight.name,),
                  biases=(op.bias.name if op.bias else None,), contracted=contracted, outputs=((op.out, op.labels),),
                  transposed=transposed)


def matmul(module: Module) -> Module:
    candidates = {id(op): _candidate(op, module) for op in module.ops}
    # a kernel is bound in its canonical layout, so every reader of it must become a MatMul
    readers = defaultdict(list)
    for op in module.ops:
        for name in op.reads():
            readers[name].append(op)
    blocked = {name for name, ops in readers.items()
               if module.tensors.get(name) and module.tensors[name].role == "param"
               and any(candidates[id(op)] is None for op in ops)}
    ops = []
    for op in module.ops:
        candidate = candidates[id(op)]
        if candidate is not None and not blocked & set(candidate.reads()):
            ops.append(candidate)
        else:
            ops.append(op)
    canonical = {name for op in ops if isinstance(op, MatMul) for name in op.reads()}
    tensors = {name: replace(info, view=None) if name in canonical else info for name, info in module.tensors.items()}
    return replace(module, ops=ops, tensors=tensors)
