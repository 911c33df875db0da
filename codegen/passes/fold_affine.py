"""Fold a per-channel affine map of a convolution's output into its kernel and bias.

An inference BatchNorm after a convolution, ``a[l] K[b, l, p, q] + c[l]`` with ``a`` and ``c``
maps of parameters alone, is the convolution with the kernel ``a[l] W[c, r, s, l]`` and the bias
``a[l] b[l] + c[l]``: two statements over the kernel and the channels replace two passes over
every entry of the output (and their temporaries). The convolution must be read by one
elementwise map, where ``a[l]·K`` stands as a term of a sum; the other terms of that sum that are
per-channel maps of parameters (``c[l]``) go into the bias. A map of the output that is not
affine per channel (``K²``, ``a[p] K``) is left alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import sympy as sp

from ..ir import Convolution, Elementwise, Module, TensorInfo

__all__ = ["fold_affine"]


def _channel_only(expr: sp.Expr, channel: sp.Idx, module: Module) -> bool:
    """``expr`` reads parameters (and maps of them) at ``[channel]`` only, and numbers."""
    arrays = expr.atoms(sp.Indexed)
    grids = expr.xreplace({item: sp.Integer(1) for item in arrays}).atoms(sp.Idx)
    return not grids and all(item.indices == (channel,) and not module.batched(str(item.base.label)) for item in arrays)


def _affine(expr: sp.Expr, use: sp.Indexed, channel: sp.Idx, module: Module) -> tuple[sp.Add, sp.Expr, sp.Expr, list] | None:
    """The sum in ``expr`` holding the term ``scale·use``, that term, the scale and the sum's per-channel terms, or None."""
    for total in expr.atoms(sp.Add):
        for term in total.args:
            scale = term / use
            if (term == use or (isinstance(term, sp.Mul) and use in term.args)) and _channel_only(scale, channel, module):
                shifts = [other for other in total.args if other is not term and _channel_only(other, channel, module)]
                if scale != 1 or shifts:
                    return total, term, scale, shifts
    return None


def _fresh(module: Module, name: str) -> str:
    while name in module.tensors:
        name += "_"
    return name


def _fold(conv: Convolution, consumer: Elementwise, module: Module) -> tuple[list, Elementwise] | None:
    """The kernel and bias statements, the convolution on them and its consumer rewritten; None if not affine."""
    uses = [item for item in consumer.expr.atoms(sp.Indexed) if str(item.base.label) == conv.out]
    if len(uses) != 1 or conv.channels_last:
        return None
    (use,) = uses
    channel = use.indices[0]
    found = _affine(consumer.expr, use, channel, module)
    if found is None:
        return None
    total, term, scale, shifts = found
    weight_labels = module.tensors[conv.weight].labels
    out = sp.Idx(sp.Symbol(weight_labels[-1], integer=True))
    at_out = {channel: out}
    weight = sp.IndexedBase(conv.weight)[tuple(sp.Idx(sp.Symbol(label, integer=True)) for label in weight_labels)]
    bias = sum((shift.xreplace(at_out) for shift in shifts), sp.Integer(0))
    if conv.bias is not None:
        bias += scale.xreplace(at_out) * sp.IndexedBase(conv.bias)[out]
    affine = scale * use + sum(shifts, sp.Integer(0))
    kernel = Elementwise(_fresh(module, f"{conv.weight}_folded"), weight_labels, "", conv.section,
                         expr=weight * scale.xreplace(at_out))
    kernel = replace(kernel, comment=f"{kernel.out}[{', '.join(weight_labels)}] = {kernel.expr}")
    ops = [kernel]
    module.tensors[kernel.out] = TensorInfo(kernel.out, "param", weight_labels)
    bias_name = None
    if isinstance(bias, sp.Indexed):  # a shift alone (a convolution without bias): that array
        bias_name = str(bias.base.label)
    elif bias != 0:
        bias_name = _fresh(module, f"{conv.weight.removesuffix('_W')}_b_folded")
        ops.append(Elementwise(bias_name, (out.name,), f"{bias_name}[{out.name}] = {bias}", conv.section, expr=bias))
        module.tensors[bias_name] = TensorInfo(bias_name, "param", (out.name,))
    ops.append(replace(conv, weight=kernel.out, bias=bias_name,
                       comment=f"{conv.comment}\n{use} ← {affine} (folded into the kernel and bias)"))
    rest = [arg for arg in total.args if arg is not term and arg not in shifts]
    rewritten = consumer.expr.xreplace({total: sp.Add(use, *rest)})
    return ops, replace(consumer, expr=rewritten)


def _hoisted(ops: list, position: int, end: int, names: set[str]) -> list:
    """The statements between ``position`` and ``end`` that compute ``names`` (maps of parameters alone) and
    what they read, in order."""
    needed, moved = set(names), []
    for op in reversed(ops[position + 1:end]):
        if op.out in needed:
            moved.insert(0, op)
            needed.update(op.reads())
    return moved


def fold_affine(module: Module) -> Module:
    """Each convolution read once, by an elementwise map affine in it per channel, folded; the maps of parameters
    its kernel and bias read move before it."""
    module = replace(module, tensors=dict(module.tensors))
    reads = Counter(name for op in module.ops for name in op.reads())
    ops = list(module.ops)
    for conv in [op for op in ops if isinstance(op, Convolution)]:
        consumer = next((op for op in ops if conv.out in op.reads()), None)
        if reads[conv.out] != 1 or not isinstance(consumer, Elementwise) or conv.out == module.output:
            continue
        folded = _fold(conv, consumer, module)
        if folded is None:
            continue
        new_ops, new_consumer = folded
        position, end = ops.index(conv), ops.index(consumer)
        moved = _hoisted(ops, position, end, {name for op in new_ops for name in op.reads()})
        ops[end] = new_consumer
        ops = [op for op in ops if op not in moved]
        position = ops.index(conv)
        ops[position:position + 1] = [*moved, *new_ops]
    return replace(module, ops=ops)
