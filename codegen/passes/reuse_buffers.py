"""Reuse a dead temporary as the output of an elementwise map.

``u1 = attn_out + u0`` becomes ``np.add(attn_out, u0, out=attn_out)`` (``attn_out.add_(u0)``
in PyTorch) when ``attn_out`` is read nowhere later, and ``s = max(w, 0)`` becomes
``np.maximum(w, 0, out=w)`` (``w.clamp_min_(0)``), ``s = max(K + u0, 0)`` becomes
``K.add_(u0).clamp_min_(0)``, the GELU of a dead product ``s = _gelu(w)`` becomes ``_gelu(w, out=w)``
(``torch.ops.aten.gelu_(w)``) and SwiGLU's ``s = w̃ · silu(w)`` becomes ``silu(w, inplace=True).mul_(w̃)`` (NumPy
``_silu(w, out=w)`` then ``s *= w̃``): no fresh allocation, no page faults. Only products of matrix
multiplications and convolutions are reused: their backward needs their inputs, never their
output, so autograd stays correct.
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from ..ir import Contraction, Convolution, Elementwise, ExactGelu, MatMul, Module, Silu, TanhGelu

__all__ = ["reuse_buffers", "called", "CALLS"]

#: The recognized elementwise routines that can write into their argument.
CALLS = (ExactGelu, TanhGelu, Silu)


def called(expr: sp.Expr) -> sp.Function | None:
    """The routine call that ``expr`` is, or that it multiplies by factors which do not read the call's argument
    (SwiGLU's ``w̃ · silu(w)``): what a backend computes in place in that argument, then scales."""
    if isinstance(expr, CALLS):
        return expr
    if not isinstance(expr, sp.Mul):
        return None
    calls = [factor for factor in expr.args if isinstance(factor, CALLS)]
    if len(calls) != 1 or (expr / calls[0]).has(calls[0].args[0]):
        return None
    return calls[0]


def _candidate(op: Elementwise, module: Module, produced: set[str]) -> str | None:
    """A product read by ``op`` that could hold its result (same axes)."""
    call = called(op.expr)
    if call is not None:
        arguments = call.args
    elif isinstance(op.expr, sp.Add):
        arguments = op.expr.args
    elif isinstance(op.expr, sp.Max) and any(argument.is_number for argument in op.expr.args):
        arguments = [argument for argument in op.expr.args if not argument.is_number]
        if len(arguments) == 1 and isinstance(arguments[0], sp.Add):  # max(K + u0, 0): the sum in place first
            arguments = arguments[0].args
    else:
        return None
    for argument in arguments:
        if not isinstance(argument, sp.Indexed):
            continue
        name = str(argument.base.label)
        labels = tuple(str(index) for index in argument.indices)
        if name in produced and module.batched(name) and ("b",) + labels == op.labels:
            return name
    return None


def reuse_buffers(module: Module) -> Module:
    ops = list(module.ops)
    produced: set[str] = set()  # outputs of matrix products seen so far
    last_read = {name: position for position, op in enumerate(ops) for name in op.reads()}
    for position, op in enumerate(ops):
        if isinstance(op, Elementwise):
            name = _candidate(op, module, produced)
            if name is not None and last_read.get(name, -1) <= position and name != module.output:
                ops[position] = replace(op, reuse=name)
        if isinstance(op, (MatMul, Contraction, Convolution)):
            produced.update(op.writes())
    return replace(module, ops=ops)
