"""Inline an elementwise result that one later elementwise map reads exactly once.

``p = (u − α)/√(β + ε); out = g p + c; u2 = out`` becomes one statement
``u2 = g (u − α)/√(β + ε) + c``: fewer temporaries, and the code reads like the formula.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import sympy as sp

from ..ir import Elementwise, Module

__all__ = ["inline_elementwise"]


def inline_elementwise(module: Module) -> Module:
    """Merge producers into their single consumer, earliest producer first, until none is left.

    Each op's read set is computed once and the read counts are updated per merge; after a
    merge the scan resumes at the first op whose eligibility the merge can change (one read
    by the merged producer), so the pass stays close to linear in the number of ops.
    """
    ops = list(module.ops)
    reads = [set(op.reads()) for op in ops]
    counts = Counter(name for names in reads for name in names)
    # a map of parameters alone (a network's BatchNorm a = γ/√(v + ε)) is computed once, not per entry
    kept = {module.output, module.stream, *module.dropout, *(name for name, info in module.tensors.items() if info.role == "param")}
    position = 0
    while position < len(ops):
        producer = ops[position]
        consumer_position = _consumer(ops, reads, counts, position, kept)
        if consumer_position is None:
            position += 1
            continue
        consumer = ops[consumer_position]
        use = next(item for item in consumer.expr.atoms(sp.Indexed) if str(item.base.label) == producer.out)
        mapping = {sp.Idx(label): index for label, index in zip(producer.labels[1:], use.indices)}
        merged = replace(consumer, expr=consumer.expr.xreplace({use: _relabel(producer.expr, mapping)}),
                         comment=producer.comment + "\n" + consumer.comment)
        merged_reads = set(merged.reads())
        counts.subtract(reads[position] | reads[consumer_position])
        counts.update(merged_reads)
        ops[consumer_position], reads[consumer_position] = merged, merged_reads
        produced = reads[position]
        del ops[position], reads[position]
        position = next((n for n in range(position) if ops[n].out in produced), position)
    return replace(module, ops=ops)


def _consumer(ops: list, reads: list[set[str]], counts: Counter, position: int, kept: set[str]) -> int | None:
    """Where the elementwise op at ``position`` can be inlined, or ``None`` (``kept``: the output and dropout sites)."""
    producer = ops[position]
    if not isinstance(producer, Elementwise) or producer.out in kept or counts[producer.out] != 1:
        return None
    consumer_position = next((n for n in range(position + 1, len(ops)) if producer.out in reads[n]), None)
    if consumer_position is None or not isinstance(ops[consumer_position], Elementwise):
        return None
    uses = [item for item in ops[consumer_position].expr.atoms(sp.Indexed) if str(item.base.label) == producer.out]
    return consumer_position if len(uses) == 1 else None  # two index patterns: keep the temporary


def _relabel(expr: sp.Expr, mapping: dict) -> sp.Expr:
    """Rename the index labels of every array in ``expr`` (a one-number control, read without indices, has none)."""
    replacements = {}
    for item in expr.atoms(sp.Indexed):
        if item.indices:
            replacements[item] = item.base[tuple(mapping.get(sp.Idx(str(index)), index) for index in item.indices)]
    return expr.xreplace(replacements)
