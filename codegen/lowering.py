"""Lowering: index-notation assignments → tensor IR operations.

Input: a ``symbolic.program.Program``. Output: a ``codegen.ir.Module``.

Each assignment is matched, in order, against:

- the softmax kernel ``χ e^{a} / Σ_n χ e^{a}`` → ``Softmax`` over the summed axis;
- a sum of products of arrays (plus at most one bias array) → ``Contraction`` (einsum);
- ``Σ_k body / N_k`` or ``Σ_k body`` → ``Reduction`` (mean or sum over ``k``);
- anything else → ``Elementwise``, after every ``Sum`` inside it has been lowered into a
  temporary of its own.

``Δt`` is set to 1 here (the step size is absorbed into the learned controls).
"""

from __future__ import annotations

import sympy as sp

from splitformer.symbolic.domains import VARIABLES
from splitformer.symbolic.latex import plain_equation
from splitformer.symbolic.kinds import OPERATOR_KINDS
from splitformer.symbolic.program import TIME_STEP, Assignment, Program

from .ir import BATCH, UNBATCHED_ROLES, Cache, Contraction, Elementwise, Module, Op, Operand, Reduction, Softmax, TensorInfo

__all__ = ["lower", "Lowering", "INDEX_DOMAINS"]

INDEX_DOMAINS = {variable.index: variable.domain for variable in VARIABLES.values()}


class Lowering:
    """A program's assignments lowered one by one into IR operations (``lower`` runs it)."""

    def __init__(self, program: Program):
        self.program = program
        self.tensors: dict[str, TensorInfo] = {}
        self.ops: list[Op] = []
        self.temporaries = 0
        self.section = ""
        for name, tensor in program.tensors.items():
            if tensor.role == "temp" or tensor.role == "state":
                continue
            labels = tuple(str(index) for index in tensor.indices)
            view = tuple(INDEX_DOMAINS[index] for index in tensor.indices)
            if tensor.role not in UNBATCHED_ROLES:
                labels = (BATCH,) + labels
            self.tensors[name] = TensorInfo(name, tensor.role, labels, tensor.parameter, tensor.shape,
                                            view if tensor.role in UNBATCHED_ROLES else None, tensor.kind)

    def labels(self, indexed: sp.Indexed) -> tuple[str, ...]:
        labels = tuple(str(index) for index in indexed.indices)
        info = self.tensors.get(str(indexed.base.label))
        return labels if info is not None and info.role in UNBATCHED_ROLES else (BATCH,) + labels

    def operand(self, indexed: sp.Indexed) -> Operand:
        return Operand(str(indexed.base.label), self.labels(indexed))

    def assignment(self, assignment: Assignment, section: str = "") -> None:
        self.section = section
        rhs = assignment.rhs.xreplace({TIME_STEP: sp.Integer(1)})
        out = assignment.target
        labels = self.labels(assignment.lhs)
        comment = plain_equation(assignment.lhs, rhs, self.program.latex_names())
        op = self.softmax(out, labels, rhs) or self.contraction(out, labels, rhs) or self.reduction(out, labels, rhs)
        if op is None:
            op = Elementwise(out, labels, expr=self.hoist_sums(rhs, labels))
        self.ops.append(op.with_comment(comment, section))

    # -- patterns ----------------------------------------------------------------------
    def softmax(self, out: str, labels: tuple[str, ...], rhs: sp.Expr) -> Op | None:
        numerator, denominator = sp.fraction(rhs)
        if not isinstance(denominator, sp.Sum) or len(denominator.limits) != 1:
            return None
        dummy = denominator.limits[0][0]
        exponentials = [factor for factor in sp.Mul.make_args(numerator) if isinstance(factor, sp.exp)]
        if len(exponentials) != 1 or not isinstance(exponentials[0].args[0], sp.Indexed):
            return None
        scores = exponentials[0].args[0]
        key = scores.indices[-1]
        if sp.expand(denominator.function.xreplace({dummy: key}) - numerator) != 0:
            return None
        if str(key) != labels[-1]:  # the kernel is normalized over the last axis
            return None
        others = [factor for factor in sp.Mul.make_args(numerator) if factor is not exponentials[0]]
        if len(others) > 1 or (others and not isinstance(others[0], sp.Indexed)):
            return None
        support = self.operand(others[0]) if others else None
        return Softmax(out, labels, scores=self.operand(scores), support=support)

    def contraction(self, out: str, labels: tuple[str, ...], rhs: sp.Expr) -> Op | None:
        sums = [term for term in sp.Add.make_args(rhs) if term.has(sp.Sum)]
        rest = [term for term in sp.Add.make_args(rhs) if not term.has(sp.Sum)]
        if len(sums) != 1 or len(rest) > 1 or (rest and not isinstance(rest[0], sp.Indexed)):
            return None
        scale, total = sp.Integer(1), None
        for factor in sp.Mul.make_args(sums[0]):
            if isinstance(factor, sp.Sum):
                total = factor
            else:
                scale *= factor
        if total is None or scale.has(sp.Indexed):
            return None
        factors = sp.Mul.make_args(total.function)
        if len(factors) < 2 or not all(isinstance(factor, sp.Indexed) for factor in factors):
            return None
        operands = sorted((self.operand(factor) for factor in factors), key=lambda operand: _reading_order(operand, labels))
        bias = self.operand(rest[0]) if rest else None
        return Contraction(out, labels, operands=tuple(operands), scale=scale, bias=bias)

    def reduction(self, out: str, labels: tuple[str, ...], rhs: sp.Expr) -> Op | None:
        scale, total = sp.Integer(1), None
        for factor in sp.Mul.make_args(rhs):
            if isinstance(factor, sp.Sum) and total is None:
                total = factor
            else:
                scale *= factor
        if total is None or len(total.limits) != 1:
            return None
        index = total.limits[0][0]
        mean = scale == 1 / INDEX_DOMAINS[index].size
        if not mean and scale != 1:
            return None
        body_labels = _with_axis(labels, str(index), total.function)
        body = self.hoist_sums(total.function, body_labels)
        return Reduction(out, labels, body=body, body_labels=body_labels, axis=str(index), mean=mean)

    def hoist_sums(self, expr: sp.Expr, labels: tuple[str, ...]) -> sp.Expr:
        """Lower every ``Sum`` inside ``expr`` into a temporary; return the rest."""
        replacements = {}
        for total in sorted(expr.atoms(sp.Sum), key=sp.default_sort_key):
            free = [index for index in total.free_symbols if isinstance(index, sp.Idx)]
            ordered = tuple(sorted(free, key=lambda index: labels.index(str(index))))
            if not ordered:
                raise AssertionError(f"a sum over every axis has no per-token meaning: {total}")
            self.temporaries += 1
            name = f"t{self.temporaries}"
            target = sp.IndexedBase(name)[ordered]
            self.assignment(Assignment(target, total, "temporary"), self.section)
            replacements[total] = target
        return expr.xreplace(replacements)


def _with_cache(ops: list[Op], cached: dict[str, str]) -> list[Op]:
    """A ``Cache`` op before the first reader of each cached key-side field (after its producer)."""
    result: list[Op] = []
    pending = dict(cached)
    for op in ops:
        for name in [name for name in op.reads() if name in pending]:
            producer = next(item for item in reversed(result) if item.out == name)
            result.append(Cache(name, producer.labels, f"the cache: {name} of the earlier tokens, then the new ones",
                                op.section, source=Operand(name, producer.labels), key=pending.pop(name)))
        result.append(op)
    return result


def _with_axis(labels: tuple[str, ...], axis: str, body: sp.Expr) -> tuple[str, ...]:
    """The axes of a reduction's body: ``labels`` with the summed ``axis`` inserted where every
    array of ``body`` reads its axes in order (so that each broadcasts without a transpose);
    last when no position does."""
    reads = [tuple(str(index) for index in item.indices) for item in body.atoms(sp.Indexed)]
    for position in range(len(labels), 0, -1):
        candidate = labels[:position] + (axis,) + labels[position:]
        if all(_in_order(read, candidate) for read in reads):
            return candidate
    return labels + (axis,)


def _in_order(read: tuple[str, ...], labels: tuple[str, ...]) -> bool:
    positions = [labels.index(label) for label in read if label in labels]
    return positions == sorted(positions)


def _reading_order(operand: Operand, out: tuple[str, ...]) -> tuple:
    """State operands first, each ordered by where its axes stand in the output."""
    positions = tuple(out.index(label) if label in out else len(out) for label in operand.labels if label != BATCH)
    return (BATCH not in operand.labels, positions)


def _dropout_sites(program: Program) -> tuple[str, ...]:
    """Where torch puts dropout: each non-projection operator's output (a residual branch)
    and the definitions it names in ``dropout_sites`` (the feed-forward activation)."""
    sites = []
    for record in program.records:
        for evaluation in record.evaluations:
            operator = OPERATOR_KINDS.get(evaluation.kind)
            if operator is None or operator.is_projection:
                continue
            *inner, output = (assignment.target for assignment in evaluation.assignments)
            sites += [name for name in inner if name.rsplit("_", 1)[-1] in operator.dropout_sites] + [output]
    return tuple(sites)


def lower(program: Program, passes=None) -> Module:
    """The IR of ``program``; ``passes`` (default: ``codegen.passes.DEFAULT``) rewrite it."""
    from .passes import DEFAULT

    lowering = Lowering(program)
    for record in program.records:
        for evaluation in record.evaluations:
            for assignment in evaluation.assignments:
                lowering.assignment(assignment, record.title)
        lowering.assignment(record.update, record.title)
    module = Module(program.name, lowering.tensors, _with_cache(lowering.ops, program.cached), program.output,
                    dropout=_dropout_sites(program), inputs=program.inputs, constants=program.constants,
                    stream=program.stream)
    for rewrite in DEFAULT if passes is None else passes:
        module = rewrite(module)
    return module
