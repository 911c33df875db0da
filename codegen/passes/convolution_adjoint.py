"""Recognize the adjoint of a convolution, its kernel's gradient and its input's costate, as one op each.

A network's derived adjoint writes the gradient of a ``Convolution``'s kernel as the windows of its input ``x``
(``Window``: a 6-D view ``x[b, c, S p + r − P, S q + s − P]``) contracted with the costate ``K̄[b, l, p, q]`` over
``b, p, q``; einsum copies the view first (k² times the input for a k × k kernel of stride 1) and runs small batched
products. It writes the
input's costate as each window's values ``Σ_l W[c, r, s, l] K̄[b, l, p, q]`` (a 6-D array; depth-wise, a sum of such
products over the convolutions reading ``x``) added back at the window's points (``Fold``: one strided addition per
kernel offset). CvT's derived training step spent a quarter of its time in these. When the windows, or the blocks, are
read by that one statement alone, the two become ``ConvolutionWeightAdjoint`` or ``ConvolutionInputAdjoint``: torch
spells them as its convolution backward (``torch.ops.aten.convolution_backward``, what autograd runs for ``conv2d``)
for the kernel alone, or the input alone per convolution; NumPy as the two statements written as one.
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from ..ir import (Contraction, ConvolutionInputAdjoint, ConvolutionWeightAdjoint, Elementwise, Fold, Module, Op, Window,
                  readers as reading)

__all__ = ["convolution_adjoint"]


def _gradient_labels(window: tuple[str, ...], costate: tuple[str, ...]) -> tuple[str, ...] | None:
    """The labels of the kernel gradient of windows ``(b, c, p, q, r, s)`` and a costate ``(b, l, p, q)``: ``(r, s,
    l)`` where ``c = l`` (depth-wise), else ``(c, r, s, l)``; None where the two do not share ``b, p, q``."""
    if len(window) != 6 or len(costate) != 4 or (window[0], *window[2:4]) != (costate[0], *costate[2:]):
        return None
    return (*window[4:], costate[1]) if window[1] == costate[1] else (window[1], *window[4:], costate[1])


def _full_terms(blocks: Contraction, module: Module) -> tuple[tuple[str, str], ...] | None:
    """``((K̄, W),)`` when ``blocks`` is ``Σ_l K̄[b, l, p, q] W[c, r, s, l]`` over ``(b, c, p, q, r, s)``, else None."""
    if len(blocks.operands) != 2 or blocks.scale != 1 or blocks.bias is not None or len(blocks.labels) != 6:
        return None
    b, c, p, q, r, s = blocks.labels
    for costate, weight in (blocks.operands, blocks.operands[::-1]):
        if (costate.labels[:1] + costate.labels[2:] == (b, p, q) and len(costate.labels) == 4
                and weight.labels == (c, r, s, costate.labels[1]) and not module.batched(weight.name)
                and module.batched(costate.name)):
            return ((costate.name, weight.name),)
    return None


def _depthwise_terms(blocks: Elementwise, module: Module) -> tuple[tuple[str, str], ...] | None:
    """``((K̄₁, W₁), …)`` when ``blocks`` over ``(b, l, p, q, r, s)`` is ``Σ_t W_t[r, s, l] K̄_t[l, p, q]``, else None."""
    if len(blocks.labels) != 6:
        return None
    _, l, p, q, r, s = blocks.labels
    terms = []
    for term in sp.Add.make_args(blocks.expr):
        factors = sp.Mul.make_args(term)
        if len(factors) != 2 or not all(isinstance(factor, sp.Indexed) for factor in factors):
            return None
        by_indices = {tuple(str(index) for index in factor.indices): str(factor.base.label) for factor in factors}
        weight, costate = by_indices.get((r, s, l)), by_indices.get((l, p, q))
        if weight is None or costate is None or module.batched(weight) or not module.batched(costate):
            return None
        terms.append((costate, weight))
    return tuple(terms)


def _input_adjoint(fold: Fold, blocks: Op, module: Module) -> ConvolutionInputAdjoint | None:
    """The input's costate ``fold`` adds back from ``blocks``, as one op, when ``blocks`` are convolutions' values."""
    if fold.axes != (2, 3) or len(blocks.labels) != 6:
        return None
    depthwise = isinstance(blocks, Elementwise)
    terms = (_depthwise_terms(blocks, module) if depthwise
             else _full_terms(blocks, module) if isinstance(blocks, Contraction) else None)
    if not terms:
        return None
    return ConvolutionInputAdjoint(fold.out, fold.labels, fold.comment, fold.section, terms=terms, depthwise=depthwise,
                                   blocks=blocks, fold=fold)


def convolution_adjoint(module: Module) -> Module:
    windows = {op.out: op for op in module.ops if isinstance(op, Window) and op.axes == (2, 3)}
    producers = {op.out: op for op in module.ops}
    readers = reading(module.ops)
    fused, gone = {}, set()
    for op in module.ops:
        if isinstance(op, Fold) and readers[op.source] == [op] and op.source in producers:
            adjoint = _input_adjoint(op, producers[op.source], module)
            if adjoint is not None:
                fused[id(op)] = adjoint
                gone.add(id(producers[op.source]))
            continue
        if not isinstance(op, Contraction) or len(op.operands) != 2 or op.scale != 1 or op.bias is not None:
            continue
        for window, costate in (op.operands, op.operands[::-1]):
            candidate = windows.get(window.name)
            if (candidate is not None and window.labels == candidate.labels and readers[window.name] == [op]
                    and _gradient_labels(window.labels, costate.labels) == op.labels):
                fused[id(op)] = ConvolutionWeightAdjoint(op.out, op.labels, candidate.read_in(op.comment), op.section,
                                                         window=candidate, product=op)
                gone.add(id(candidate))
                break
    return replace(module, ops=[fused.get(id(op), op) for op in module.ops if id(op) not in gone])
