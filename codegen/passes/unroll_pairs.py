"""A sum over a two-point axis (the components of a rotated pair) → its terms, derived by SymPy.

The rotary kernel reads ``q̂(c) = Σ_c̃ cos(φ − (c − c̃)π/2) q(c̃)``: summed as written it is a
product broadcast over both pair axes, then reduced. Substituting the grid points of ``c`` and
``c̃`` into the kernel gives the entries of a 2 × 2 matrix, which SymPy evaluates exactly
(``cos(φ + π/2) = −sin φ``): ``q̂₀ = cos φ q₀ − sin φ q₁``, ``q̂₁ = sin φ q₀ + cos φ q₁``, the
rotation of each pair by elementwise products (``Unrolled``).
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from splitformer.symbolic.domains import VARIABLES

from ..ir import BATCH, Module, Operand, Reduction, Unrolled

__all__ = ["unroll_pairs", "unrolled_entries"]

#: Grid index label → its index (``"p"`` → c̃ on the two-point pair domain).
_INDICES = {str(variable.index): variable.index for variable in VARIABLES.values()}
#: Sums over axes of at most this many points are written out.
_LONGEST = 2


def _points(index: sp.Idx) -> int | None:
    """The number of grid points of ``index`` when it is a fixed small number, else None."""
    if index.upper is None:
        return None
    size = index.upper - index.lower + 1
    return int(size) if isinstance(size, sp.Integer) and size <= _LONGEST else None


def unrolled_entries(kernel: sp.Expr, axis: sp.Idx, summed: sp.Idx) -> tuple[tuple[sp.Expr, ...], ...]:
    """``M[c][c̃] = kernel(c, c̃)`` at every pair of grid points (SymPy evaluates each entry)."""
    points = range(_points(summed))
    return tuple(tuple(kernel.subs({axis: row, summed: column}) for column in points) for row in points)


def unroll_pairs(module: Module) -> Module:
    return replace(module, ops=[_unrolled(op, module) or op for op in module.ops])


def _unrolled(op, module: Module) -> Unrolled | None:
    """``op`` as an ``Unrolled`` sum when it is ``Σ_c̃ kernel(c, c̃) x[.., c̃, ..]`` over a small
    axis ``c̃``, with ``x`` read where ``op`` writes except ``c̃`` in place of ``c``."""
    if not isinstance(op, Reduction) or op.mean or op.axis not in _INDICES or _points(_INDICES[op.axis]) is None:
        return None
    summed = _INDICES[op.axis]
    factors = sp.Mul.make_args(op.body)
    arrays = [factor for factor in factors if isinstance(factor, sp.Indexed) and summed in factor.indices]
    if len(arrays) != 1:
        return None
    x = arrays[0]
    kernel = sp.Mul(*[factor for factor in factors if factor is not x])
    if any(summed in item.indices for item in kernel.atoms(sp.Indexed)):
        return None
    partners = [label for label in op.labels
                if label in _INDICES and kernel.has(_INDICES[label]) and _points(_INDICES[label]) == _points(summed)]
    if len(partners) != 1:
        return None
    axis = _INDICES[partners[0]]
    name = str(x.base.label)
    read = ((BATCH,) if module.batched(name) else ()) + tuple(str(index) for index in x.indices)
    if tuple(partners[0] if label == op.axis else label for label in read) != op.labels:
        return None
    entries = unrolled_entries(kernel, axis, summed)
    if any(entry.has(axis) or entry.has(summed) for row in entries for entry in row):
        return None
    return Unrolled(op.out, op.labels, op.comment, op.section, x=Operand(name, read), axis=partners[0],
                    summed=op.axis, entries=entries)
