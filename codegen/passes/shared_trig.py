"""Compute each ``cos`` and ``sin`` of an array once: ``cos φ[i, r]`` as its own statement.

The rotary kernel's entries read ``cos φ`` and ``sin φ`` twice each (``q̂₀ = cos φ q₀ − sin φ q₁``,
``q̂₁ = sin φ q₀ + cos φ q₁``), and the keys' rotation reads them again: eight evaluations over
the angles per step, each broadcast to the heads. A cosine or sine of one array read, wherever
statements use it, becomes one statement over that array's axes (``attn_phi_cos``), computed
before its first reader; the readers read it instead. A function of a sum of arrays, or of an
array that is read once, is left in place.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import sympy as sp

from ..ir import BATCH, Elementwise, Module, Unrolled

__all__ = ["shared_trig"]

_FUNCTIONS = (sp.cos, sp.sin)


def _expressions(op) -> list[sp.Expr]:
    if isinstance(op, Unrolled):
        return [entry for row in op.entries for entry in row]
    return [op.expr] if isinstance(op, Elementwise) else []


def _calls(expr: sp.Expr) -> list[sp.Expr]:
    """The cosines and sines of one array read in ``expr``, once per occurrence."""
    found = []
    for call in sp.preorder_traversal(expr):
        if isinstance(call, _FUNCTIONS) and isinstance(call.args[0], sp.Indexed):
            found.append(call)
    return found


def _rewritten(op, replacements: dict):
    if not replacements:
        return op
    if isinstance(op, Unrolled):
        return replace(op, entries=tuple(tuple(entry.xreplace(replacements) for entry in row) for row in op.entries))
    return replace(op, expr=op.expr.xreplace(replacements))


def shared_trig(module: Module) -> Module:
    uses = Counter(call for op in module.ops for expr in _expressions(op) for call in _calls(expr))
    shared = {call for call, count in uses.items() if count > 1}
    if not shared:
        return module
    ops, names, taken = [], {}, {op.out for op in module.ops} | set(module.tensors)
    for op in module.ops:
        needed = [call for call in dict.fromkeys(c for expr in _expressions(op) for c in _calls(expr))
                  if call in shared and call not in names]
        for call in needed:
            x = call.args[0]
            name = f"{x.base.label}_{type(call).__name__}"
            while name in taken:
                name += "_"
            taken.add(name)
            labels = ((BATCH,) if module.batched(str(x.base.label)) else ()) + tuple(str(index) for index in x.indices)
            names[call] = sp.IndexedBase(name)[x.indices]
            ops.append(Elementwise(name, labels, f"{name}[{', '.join(map(str, x.indices))}] = {call}", op.section,
                                   expr=call))
        used = {c for expr in _expressions(op) for c in _calls(expr)}
        ops.append(_rewritten(op, {call: names[call] for call in used if call in names}))
    return replace(module, ops=ops)
