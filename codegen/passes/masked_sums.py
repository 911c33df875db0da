"""Masked sums of the count rule → one contraction of the mask and the value.

``codegen.bool_values`` writes a product that divides by counts of its own mask as ``Where(m, v, 0)``, each count in
``v`` read as 1 where it is 0 (``Where(c, c, 1)``): the mask ≠ 0 makes every count at least 1. Summed,
``Σ_k Where(m, v, 0)`` is a product broadcast over every axis the mask and the value read, then summed: support-mean's
derived adjoint ``Σ_j χ[j, i] m̄[j, l] / Σ_n χ[j, n]`` over (batch, j, i, l). Where the mask and the value each read
an axis the other does not, this pass writes it ``Σ_k m v′``, one einsum (a batched GEMM), with the value ``v′`` over
its own axes and 0 where one of its counts is (that row of the mask is empty, whatever ``v`` is there).

``0 · v′`` is 0 only where ``v′`` is finite, so the pass takes a value only where it is finite wherever the arrays
the module is given are (``_finite``): sums, products and maps that cannot overflow of those arrays and of the
module's results that are such, and reciprocals of counts; no exponential, not even inside an array the value reads
(a gate ``e = exp(u)`` spread over the keys a query sees: ``e^{90}`` is ∞ in float32). A product can still overflow
where the arrays near the dtype's limit (``u³`` past 10¹² in float32): there a masked entry of a row that is not
empty is NaN where the sum as written is 0.

It reads ``bool_values.as_numbers``' form (and ``codegen.logistic``'s σ, finite where its argument is), so
``run_passes`` runs it after those (``AFTER_NUMBERS``).
"""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from splitformer.symbolic.adjoint import is_plain

from ..bool_values import SUPPORTS, is_bool, state_numbers
from ..ir import (BATCH, Attention, AttentionAdjoint, Contraction, Elementwise, ExactGelu, MatMul, Module, Normalize,
                  NormalizeAdjoint, Numbers, Op, Operand, Reduction, Sigmoid, Silu, Softmax, TanhGelu, Where, ZerosLike)

__all__ = ["masked_sums"]

#: The roles of the arrays a module is given: finite where the caller's are (a parameter that an op computes, from
#: parameters alone, is no given one).
_GIVEN = ("input", "param", "support", "memory", "positions")
#: Operations whose results are finite where the arrays they read are: contractions, a softmax (of the scores less
#: their row maximum), attention, a normalization, their adjoints.
_FINITE_OF_READS = (Contraction, MatMul, Softmax, Attention, AttentionAdjoint, Normalize, NormalizeAdjoint, ZerosLike)
#: Maps whose value is finite where their arguments are.
_FINITE_MAPS = (sp.tanh, sp.erf, sp.sin, sp.cos, sp.Heaviside, sp.KroneckerDelta, sp.sign, sp.Abs, sp.Max, sp.Min,
                sp.floor, ExactGelu, TanhGelu, Silu, Sigmoid)


def masked_sums(module: Module) -> Module:
    """``module`` with each masked sum of the count rule over a finite value as one contraction (the module's doc)."""
    written = {name for op in module.ops for name in op.writes()}
    finite = {name for name, info in module.tensors.items() if info.role in _GIVEN and name not in written}
    taken = set(module.tensors) | written
    ops: list[Op] = []
    for op in module.ops:
        rewritten = _contraction(op, module, finite, taken) if isinstance(op, Reduction) else None
        for each in rewritten or [op]:
            if _stays_finite(each, finite):
                finite.update(each.writes())
            ops.append(each)
    return replace(module, ops=ops)


def _stays_finite(op: Op, finite: set[str]) -> bool:
    """``op``'s results are finite where the arrays it reads are, which ``finite`` holds."""
    if isinstance(op, Elementwise):
        return _finite(op.expr, finite)
    if isinstance(op, Reduction):
        return _finite(op.body, finite)
    return isinstance(op, _FINITE_OF_READS) and set(op.reads()) <= finite


def _finite(expr: sp.Expr, finite: set[str]) -> bool:
    """``expr`` is finite wherever the arrays ``finite`` are: numbers, reads of those arrays, bools as numbers, sums,
    products and maps of such that cannot overflow, non-negative integer powers, and reciprocals of counts read as 1
    where they are 0 (``Where(c, c, 1)``, which ``bool_values`` writes for counts alone). Not an exponential
    (``e^x`` overflows at x ≈ 88 in float32), nor any other reciprocal."""
    if expr.is_number:
        return bool(expr.is_finite)
    if isinstance(expr, sp.Indexed):
        return str(expr.base.label) in finite
    if isinstance(expr, (sp.Idx, Numbers)):
        return True
    if isinstance(expr, Where):
        return _finite(expr.args[1], finite) and _finite(expr.args[2], finite)
    if isinstance(expr, sp.Pow) and expr.exp.is_integer:
        return _finite(expr.base, finite) if expr.exp.is_nonnegative else _safe_count(expr.base) is not None
    if isinstance(expr, (sp.Add, sp.Mul, *_FINITE_MAPS)):
        return all(_finite(argument, finite) for argument in expr.args)
    return False


def _safe_count(expr: sp.Expr) -> sp.Expr | None:
    """The count ``c`` of ``Where(c, c, 1)``, else None."""
    if isinstance(expr, Where) and expr.args[0] == expr.args[1] and expr.args[2] == 1:
        return expr.args[0]
    return None


def _contraction(op: Reduction, module: Module, finite: set[str], taken: set[str]) -> list[Op] | None:
    """``op`` as a value, a mask where it is no support read, and their contraction; None where ``op`` is no sum of
    the count rule's form over a finite value, or its mask and value do not each read an axis the other does not."""
    body = op.body
    if op.mean or not isinstance(body, Where) or body.args[2] != 0 or not is_bool(body.args[0]):
        return None
    mask, value = body.args[:2]
    if not _finite(value, finite):
        return None
    mask_axes, value_axes = _axes(mask, module), _axes(value, module)
    if (mask_axes <= value_axes or value_axes <= mask_axes or op.axis not in mask_axes & value_axes
            or set(op.labels) != (mask_axes | value_axes) - {op.axis}):
        return None
    counts = sorted({count for power in value.atoms(sp.Pow) if (count := _safe_count(power.base)) is not None},
                    key=sp.default_sort_key)
    if counts:  # 0 where a count is: the mask's row is empty there, and v may not be finite (0 · ∞)
        value = Where(sp.Mul(*counts), value, 0)
    ops: list[Op] = []

    def operand(expr: sp.Expr, axes: set[str], role: str) -> Operand:
        labels = tuple(label for label in op.body_labels if label in axes)
        if isinstance(expr, sp.Indexed) and is_plain(expr.indices) and (
                (BATCH in labels) == module.batched(str(expr.base.label))):
            return Operand(str(expr.base.label), (BATCH,) * (BATCH in labels) + tuple(str(i) for i in expr.indices))
        name = _fresh(f"{op.out}_{role}", taken)
        indices = ", ".join(label for label in labels if label != BATCH)
        ops.append(Elementwise(name, labels, expr=expr).with_comment(f"{name}[{indices}] = {sp.sstr(expr)}",
                                                                      op.section))
        return Operand(name, labels)

    is_support = isinstance(mask, sp.Indexed) and str(mask.base.label) in SUPPORTS  # an einsum operand as it is
    operands = (operand(mask if is_support else state_numbers(mask), mask_axes, "mask"),
                operand(value, value_axes, "value"))
    return ops + [Contraction(op.out, op.labels, op.comment, op.section, operands=operands)]


def _fresh(name: str, taken: set[str]) -> str:
    """``name``, or it with the first number that makes it no array of the module; noted as taken."""
    candidate, number = name, 1
    while candidate in taken:
        number += 1
        candidate = f"{name}{number}"
    taken.add(candidate)
    return candidate


def _axes(expr: sp.Expr, module: Module) -> set[str]:
    """The axes ``expr`` varies along: its indices, and the batch where it reads a batched array."""
    batched = any(module.batched(str(read.base.label)) for read in expr.atoms(sp.Indexed))
    return {str(index.label) for index in expr.atoms(sp.Idx)} | ({BATCH} if batched else set())
