"""A sum over a finite axis of ``table[v] · δ(v, β)`` (a one-hot contraction) → a gather; its adjoint → a scatter-add.

T5's relative position bias reads ``Σ_v T[v, m] δ(v, β[i, j])``: summed as written it broadcasts
the table against every bucket, a ``B × N_b × H × N × N`` product reduced over the buckets. The
sum has one non-zero term, ``T[β[i, j], m]``: the table's rows read at the bucket (``Gather``,
``B × H × N × N``). The derived adjoint sums ``Σ_{b,i,j} δ(v, β[i, j]) ā[m, i, j]`` (the summand
materialized over the buckets, then contracted): each ``ā`` is added to its bucket's row instead
(``Scatter``, one ``bincount`` / ``scatter_add_``). An index that is no grid point of ``v`` (not an
integer in ``0 … N_v − 1``) matches no term of the sum: both read it as 0, as the sum does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import sympy as sp

from ..ir import BATCH, Contraction, Elementwise, Gather, Module, Op, Operand, Reduction, Scatter

__all__ = ["one_hot"]


def _axes(expr: sp.Expr, labels: tuple[str, ...], module: Module) -> tuple[str, ...]:
    """The axes of ``labels`` that ``expr`` varies along (its arrays' indices, the batch of a batched array,
    grid indices used as values), in the order of ``labels``."""
    read = {str(index) for index in expr.atoms(sp.Idx)}
    if any(module.batched(str(item.base.label)) for item in expr.atoms(sp.Indexed)):
        read.add(BATCH)
    return tuple(label for label in labels if label in read)


def _split(expr: sp.Expr, axis: str) -> tuple[sp.Expr, sp.Expr] | None:
    """``expr = δ(v, index) · rest`` for the grid index ``v`` named ``axis``, the index free of ``v``: (index, rest)."""
    deltas = [factor for factor in sp.Mul.make_args(expr) if isinstance(factor, sp.KroneckerDelta)
              and any(str(argument) == axis and isinstance(argument, sp.Idx) for argument in factor.args)]
    if len(deltas) != 1:
        return None
    others = [argument for argument in deltas[0].args if str(argument) != axis]
    if len(others) != 1 or axis in {str(item) for item in others[0].atoms(sp.Idx)}:
        return None
    index = others[0]
    return index, sp.Mul(*[factor for factor in sp.Mul.make_args(expr) if factor is not deltas[0]])


def _gather(op: Reduction, module: Module) -> Gather | None:
    """``op`` = ``Σ_v table[.., v, ..] δ(v, index)`` as a ``Gather``, or None."""
    if op.mean or (found := _split(op.body, op.axis)) is None:
        return None
    index, table = found
    if not isinstance(table, sp.Indexed) or [str(item) for item in table.indices].count(op.axis) != 1:
        return None
    name = str(table.base.label)
    table_labels = ((BATCH,) if module.batched(name) else ()) + tuple(str(item) for item in table.indices)
    index_labels = _axes(index, op.body_labels, module)
    rest = tuple(label for label in table_labels if label != op.axis)
    if set(rest) & set(index_labels) or sorted(index_labels + rest) != sorted(op.labels):
        return None  # a diagonal, or an output axis neither the table nor the index has
    return Gather(op.out, op.labels, op.comment, op.section, table=Operand(name, table_labels), axis=op.axis,
                  index=index, index_labels=index_labels)


def _scatter(op: Contraction, summand: Elementwise, module: Module) -> Scatter | None:
    """``op`` = ``Σ_s summand`` with ``summand = δ(v, index[s]) values[r, s]`` as a ``Scatter``, or None."""
    if len(op.operands) != 1 or op.bias is not None or op.operands[0].labels != summand.labels or not op.labels:
        return None
    axis, kept = op.labels[0], op.labels[1:]
    if (found := _split(summand.expr, axis)) is None:
        return None
    index, values = found
    summed = tuple(label for label in summand.labels if label not in op.labels)
    index_labels = _axes(index, summand.labels, module)
    values_labels = kept + summed
    if not set(index_labels) <= set(summed) or set(_axes(values, summand.labels, module)) | set(index_labels) \
            != set(values_labels):
        return None  # the index varies along a kept axis, or the summand is broadcast along a summed one
    return Scatter(op.out, op.labels, "\n".join(filter(None, (summand.comment, op.comment))), op.section,
                   values=values, values_labels=values_labels, index=index, index_labels=summed, axis=axis,
                   scale=op.scale)


def one_hot(module: Module) -> Module:
    producers = {op.out: op for op in module.ops}
    reads = Counter(name for op in module.ops for name in op.reads())
    ops: list[Op] = []
    summands = set()  # the materialized summands of the scatters: nothing else reads them
    for op in module.ops:
        if isinstance(op, Reduction):
            op = _gather(op, module) or op
        elif isinstance(op, Contraction) and len(op.operands) == 1:
            summand = producers.get(op.operands[0].name)
            if isinstance(summand, Elementwise) and reads[summand.out] == 1 and \
                    (scatter := _scatter(op, summand, module)) is not None:
                op = scatter
                summands.add(summand.out)
        ops.append(op)
    return replace(module, ops=[op for op in ops if op.out not in summands])
