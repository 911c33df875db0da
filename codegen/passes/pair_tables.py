"""An unrolled sum over a pair as two products of the whole array, one with the pair swapped.

``unroll_pairs`` writes ``q̂[c] = M[c][0] q[0] + M[c][1] q[1]`` as one row per point ``c``, stacked: four
products of half arrays, two sums and a copy into the result. The same sum is
``q̂[c] = D[c] q[c] + X[c] q[1 − c]`` with the diagonal ``D[c] = M[c][c]`` and the crossed entries
``X[c] = M[c][1 − c]``: two products of the whole array (the second with its pair axis reversed) and one sum.
``D`` and ``X`` are tables over the entries' own axes and ``c`` (``PairTable``: cos φ, cos φ and −sin φ, sin φ
for a rotation), built once for every sum with the same entries (the queries' and the keys' rotation by one
angle) and broadcast to each.
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from ..ir import BATCH, Module, Operand, PairTable, Unrolled

__all__ = ["pair_tables"]


def pair_tables(module: Module) -> Module:
    ops, built, taken = [], {}, {op.out for op in module.ops} | set(module.tensors)
    for op in module.ops:
        if not isinstance(op, Unrolled) or op.tables is not None or len(op.entries) != 2:
            ops.append(op)
            continue
        labels = _table_labels(module, op)
        tables = []
        for kind, entries in (("diagonal", (op.entries[0][0], op.entries[1][1])),
                              ("crossed", (op.entries[0][1], op.entries[1][0]))):
            key = (entries, labels)
            if key not in built:
                name = f"{op.out.rpartition('_')[0] or op.out}_pair_{kind}"
                while name in taken:
                    name += "_"
                taken.add(name)
                built[key] = name
                ops.append(PairTable(name, labels, _comment(name, labels, op.axis, entries), op.section,
                                     axis=op.axis, entries=entries))
            tables.append(Operand(built[key], labels))
        ops.append(replace(op, tables=tuple(tables), comment=_paired_comment(op, tables)))
    return replace(module, ops=ops)


def _table_labels(module: Module, op: Unrolled) -> tuple[str, ...]:
    """The output's axes that the entries vary along, and the pair axis, in the output's order."""
    arrays = {item for row in op.entries for entry in row for item in entry.atoms(sp.Indexed)}
    read = {str(index) for item in arrays for index in item.indices} | {op.axis}
    if any(module.batched(str(item.base.label)) for item in arrays):
        read.add(BATCH)
    return tuple(label for label in op.labels if label in read)


def _paired_comment(op: Unrolled, tables: list[Operand]) -> str:
    """The sum's formula, then the same sum as the tables' products (``= D[i, c, r]*x[.., c, r] + …``)."""
    if not op.comment:
        return op.comment
    diagonal, crossed = (f"{table.name}[{_at(table.labels, op.axis, op.axis)}]" for table in tables)
    x = op.x.name
    return (f"{op.comment}\n  = {diagonal}*{x}[{_at(op.labels, op.axis, op.axis)}] + "
            f"{crossed}*{x}[{_at(op.labels, op.axis, f'1 - {op.axis}')}]")


def _at(labels: tuple[str, ...], axis: str, point: str) -> str:
    """The indices ``labels`` (batch left out) with ``point`` in place of ``axis``."""
    return ", ".join(point if label == axis else label for label in labels if label != BATCH)


def _comment(name: str, labels: tuple[str, ...], axis: str, entries: tuple[sp.Expr, ...]) -> str:
    indices = ", ".join(label for label in labels if label != BATCH)
    return f"{name}[{indices}] = ({', '.join(str(entry) for entry in entries)})[{axis}]"
