"""Recognize relative kernels of local support along the tokens (a token shift) → ``LocalKernel``.

A token map's kernel ``κ[a, c, l]`` (an ``Elementwise`` over two token axes and the features) that is
a sum of terms ``channels(l) · Π θ(±(p[a] − p[c]) + e, 0) · χ[a, c]^{0 or 1}`` with each term's
distance ``p[a] − p[c]`` bounded on both sides, read by contractions ``Σ_c κ[a, c, l] v[c, l]`` (or,
an adjoint, ``Σ_a κ[a, c, l] v[a, l]``): each contraction becomes a ``LocalKernel``, which sums only
the few tokens within each term's distance, O(N · s · d) for s tokens a window instead of the
dense N × N kernel; the kernel is dropped when nothing else reads it. The statement keeps both
formulas (the kernel's and the contraction's) above it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import sympy as sp

from ..ir import BATCH, Contraction, Elementwise, LocalKernel, Module, Op, Operand, TokenWindow

__all__ = ["local_kernel", "reads_without_support"]


def _distance_bound(step: sp.Heaviside, near: sp.Indexed, far: sp.Indexed) -> tuple[str, sp.Expr] | None:
    """``θ(±(near − far) + e, 0)`` as ``("low", −e)`` (``near − far > −e``) or ``("high", e)``; None otherwise."""
    if step.args[1:] != (0,):
        return None
    argument = sp.expand(step.args[0])
    sign = argument.coeff(near)
    rest = argument - sign * (near - far)
    if sign not in (1, -1) or not rest.is_number:
        return None
    return ("low", -rest) if sign == 1 else ("high", rest)


def _is_support(array: sp.Indexed, module: Module) -> bool:
    info = module.tensors.get(str(array.base.label))
    return info is not None and info.role == "support"


def _windows(kernel: Elementwise, module: Module) -> tuple[tuple[TokenWindow, ...], tuple[str, str], str | None] | None:
    """The terms of ``kernel[b, a, c, l]`` as windows on ``p(a) − p(c)``, the position arrays of ``a`` and
    ``c`` and the support's name; None unless every term is one with both bounds."""
    if len(kernel.labels) != 4 or kernel.labels[0] != BATCH or not kernel.expr.has(sp.Heaviside) or \
            not all(len(item.indices) == 1 or _is_support(item, module) for item in kernel.expr.atoms(sp.Indexed)):
        return None  # reads more than token positions and the support: not a token map's kernel
    near_axis, far_axis = kernel.labels[1:3]
    near = far = support = None
    windows = []
    for term in sp.Add.make_args(sp.expand(kernel.expr)):
        bounds: dict[str, list[sp.Expr]] = {"low": [], "high": []}
        channels, masked = sp.Integer(1), False
        for factor in sp.Mul.make_args(term):
            arrays = factor.atoms(sp.Indexed)
            if not arrays:
                if {str(index) for index in factor.atoms(sp.Idx)} & {near_axis, far_axis}:
                    return None
                channels *= factor
                continue
            if isinstance(factor, sp.Indexed) and _is_support(factor, module):
                if tuple(map(str, factor.indices)) != (near_axis, far_axis) or support not in (None, factor.base.label):
                    return None
                support, masked = factor.base.label, True
                continue
            positions = {str(item.indices[0]): item for item in arrays if len(item.indices) == 1}
            if not isinstance(factor, sp.Heaviside) or len(arrays) != 2 or set(positions) != {near_axis, far_axis}:
                return None
            if near is not None and (positions[near_axis], positions[far_axis]) != (near, far):
                return None  # every step reads the same two position arrays
            near, far = positions[near_axis], positions[far_axis]
            bound = _distance_bound(factor, near, far)
            if bound is None:
                return None
            bounds[bound[0]].append(bound[1])
        if not bounds["low"] or not bounds["high"]:
            return None  # not local: a side of the distance is unbounded
        windows.append(TokenWindow(channels, sp.Max(*bounds["low"]), sp.Min(*bounds["high"]), masked))
    if near is None or not all(module.batched(str(item.base.label)) for item in (near, far)):
        return None
    return tuple(windows), (str(near.base.label), str(far.base.label)), None if support is None else str(support)


def _relabelled(window: TokenWindow, channel: str, label: str) -> TokenWindow:
    """``window`` with the feature axis ``channel`` of its kernel read as ``label`` (the contraction's)."""
    renames = {index: sp.Idx(label, (index.lower, index.upper)) for index in window.channels.atoms(sp.Idx)
               if str(index) == channel}
    return replace(window, channels=window.channels.xreplace(renames))


def _local(op: Contraction, kernel: Elementwise, found: tuple) -> LocalKernel | None:
    """``op`` (``Σ κ v``) as a ``LocalKernel`` of the kernel's ``found`` windows, or None for another contraction."""
    if len(op.operands) != 2 or op.bias is not None:
        return None
    read, values = op.operands if op.operands[0].name == kernel.out else op.operands[::-1]
    if read.name != kernel.out or len(read.labels) != 4 or len(values.labels) != 3 or len(op.labels) != 3:
        return None
    _, first, second, channel = read.labels
    _, summed, feature = values.labels
    if op.labels != (BATCH, *({first, second} - {summed}), feature) or feature != channel or first == second:
        return None
    windows, (near, far), support = found
    windows = tuple(_relabelled(window, kernel.labels[3], channel) for window in windows)
    transposed = first == summed  # Σ_a κ[a, c] v[a]: the distance p(c) − p(a) = −(p(a) − p(c))
    if transposed:
        windows = tuple(replace(window, low=-window.high, high=-window.low) for window in windows)
        near, far = far, near
    if not any(window.masked for window in windows):
        support = None
    return LocalKernel(op.out, op.labels, "\n".join((kernel.comment, op.comment)), op.section,
                       values=Operand(values.name, values.labels), positions=(near, far), windows=windows,
                       support=support, transposed=transposed)


def local_kernel(module: Module) -> Module:
    producers = {op.out: op for op in module.ops}
    kernels = {op.out: found for op in module.ops
               if isinstance(op, Elementwise) and (found := _windows(op, module)) is not None}
    rewritten: dict[int, Op] = {}
    for position, op in enumerate(module.ops):
        if isinstance(op, Contraction) and op.scale == 1:
            name = next((operand.name for operand in op.operands if operand.name in kernels), None)
            if name is not None and (local := _local(op, producers[name], kernels[name])) is not None:
                rewritten[position] = local
    ops = [rewritten.get(position, op) for position, op in enumerate(module.ops)]
    reads = Counter(name for op in ops for name in op.reads())
    return replace(module, ops=[op for op in ops if not (op.out in kernels and not reads[op.out])])


def reads_without_support(module: Module) -> dict[str, tuple[tuple[sp.Expr, sp.Expr], ...]]:
    """The windows ``(low, high)`` on ``p(a) − p(c)`` that a token map's kernel sums without ``χ`` (a token shift's
    offset 0), by the positions array of the tokens ``c`` it reads: a query there reads a key ``c`` whatever its
    index, a later one too (with or without this pass: the kernel, or the ``LocalKernel`` it became)."""
    found: dict[str, set] = {}
    for op in module.ops:
        if isinstance(op, LocalKernel) and not op.transposed:
            windows, far = op.windows, op.positions[1]
        elif isinstance(op, Elementwise) and (recognized := _windows(op, module)) is not None:
            windows, far = recognized[0], recognized[1][1]
        else:
            continue
        found.setdefault(far, set()).update((window.low, window.high) for window in windows if not window.masked)
    return {far: tuple(sorted(bounds, key=lambda bound: (float(bound[0]), float(bound[1]))))
            for far, bounds in found.items() if bounds}
