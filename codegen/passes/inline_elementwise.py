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
    ops = list(module.ops)
    changed = True
    while changed:
        changed = False
        reads = Counter(name for op in ops for name in op.reads())
        for position, producer in enumerate(ops):
            if not isinstance(producer, Elementwise) or producer.out in (module.output, *module.dropout):
                continue
            if reads[producer.out] != 1:
                continue
            consumer_position = next(
                (n for n in range(position + 1, len(ops)) if producer.out in ops[n].reads()), None)
            consumer = ops[consumer_position]
            if not isinstance(consumer, Elementwise):
                continue
            uses = [item for item in consumer.expr.atoms(sp.Indexed) if str(item.base.label) == producer.out]
            if len(uses) != 1:  # read with two index patterns: keep the temporary
                continue
            use = uses[0]
            mapping = {sp.Idx(label): index for label, index in zip(producer.labels[1:], use.indices)}
            expr = _relabel(producer.expr, mapping)
            merged = replace(consumer, expr=consumer.expr.xreplace({use: expr}),
                             comment=producer.comment + "\n" + consumer.comment)
            ops[consumer_position] = merged
            del ops[position]
            changed = True
            break
    return replace(module, ops=ops)


def _relabel(expr: sp.Expr, mapping: dict) -> sp.Expr:
    """Rename the index labels of every array in ``expr``."""
    replacements = {}
    for item in expr.atoms(sp.Indexed):
        replacements[item] = item.base[tuple(mapping.get(sp.Idx(str(index)), index) for index in item.indices)]
    return expr.xreplace(replacements)
