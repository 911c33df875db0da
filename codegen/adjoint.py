"""Lowering of a derived adjoint: forward and adjoint assignments → two IR modules.

Input: a ``symbolic.adjoint.Adjoint``. Output: a ``Backward``: the forward module that keeps
what the adjoint reads (``saved``), and the adjoint module that turns the seed ``λ`` of the
output into the gradients. A block's are lowered as one program and rewritten by the same passes
(so a pass sees every reader: the fused attention and LayerNorm stay unfused when the
adjoint reads their kernel or moments, and no buffer the adjoint needs is updated in place),
then split where the adjoint begins. Arrays over two token axes (the attention scores and
kernel; the memory's tokens count for a decoder's cross-attention) are recomputed in the
adjoint from the kept ``Q``, ``K`` instead of being kept.

A network program's adjoint (``lower_stage_adjoint``) is lowered after its forward: the
forward statements the adjoint reads, then the adjoint. An adjoint written at a pattern is
computed per coarse node and offset, then folded into an array shaped like the forward
array (``Fold`` for a window, ``Place`` for a point, ``PlaceRows`` for grid rows of the token
axis).

The gradient of a control sums over the batch as well as over the index sums of its
assignment: it is lowered to an einsum whose output has no batch axis.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy as sp

from splitformer.symbolic.adjoint import Adjoint, is_plain
from splitformer.symbolic.domains import MEMORY, TOKENS
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.program import TIME_STEP, Assignment, entry

from .bool_values import with_dtype_of
from .ir import BATCH, Contraction, Elementwise, Fold, Module, Operand, Place, PlaceRows, TensorInfo, ZerosLike
from .lowering import INDEX_DOMAINS, Lowering, flattened_index, flattened_sums, shifted_axes
from .nested_sums import nested_sums

__all__ = ["Backward", "lower_adjoint", "lower_stage_adjoint", "differentiated_inputs", "AdjointLowering",
           "ADJOINT_SECTION"]

#: Section titles of adjoint statements start with this.
ADJOINT_SECTION = "adjoint of "
_TOKEN_LABELS = {str(index) for index, domain in INDEX_DOMAINS.items() if domain in (TOKENS, MEMORY)}


def differentiated_inputs(module: Module) -> list:
    """The declared inputs of the step besides the state whose gradients the adjoint returns
    (a decoder's memory), kept by the forward."""
    return [field for field in module.inputs if field.role == "memory"]


@dataclass
class Backward:
    """The lowered forward (keeping ``saved``) and adjoint of one program."""

    forward: Module
    adjoint: Module
    saved: list[str]
    seed: str
    #: canonical parameter name (or ``u``, ``memory``) → gradient array in the adjoint module
    gradients: dict[str, str]
    #: the derived (index-notation) adjoint it was lowered from
    symbolic: Adjoint | None = None


class AdjointLowering(Lowering):
    """The lowering of adjoint assignments: gradients of controls sum over the batch; an adjoint
    written at a pattern is folded into an array shaped like its forward array."""

    def __init__(self, adjoint: Adjoint, known: dict[str, TensorInfo] | None = None, network: bool = False):
        super().__init__(adjoint.program(), known, network)
        #: an adjoint written at a pattern → the forward array it is shaped like
        self.shapes = adjoint.shapes

    def assignment(self, assignment: Assignment, section: str = "") -> None:
        info = self.tensors.get(assignment.target)
        scattered = assignment.target in self.shapes and not is_plain(assignment.lhs.indices)
        if not scattered and (info is None or info.role != "gradient"):
            return super().assignment(assignment, section)
        assignment = self.viewed(assignment, section)
        if scattered:
            return self.scatter(assignment, section)
        rhs = assignment.rhs.xreplace({TIME_STEP: sp.Integer(1)})
        comment = self.comment(assignment, rhs)
        labels = self.labels(assignment.lhs)
        if rhs == 0:  # no assignment reaches the parameter (its operator only in branches of weight 0)
            like = next(name for name, tensor in self.tensors.items()
                        if tensor.role == "param" and tensor.parameter == info.parameter)
            self.ops.append(ZerosLike(assignment.target, labels, like=like).with_comment(comment, section))
            return
        terms = sp.Add.make_args(rhs)
        parts = [self.batch_sum(assignment.target if len(terms) == 1 else f"{assignment.target}_{n}",
                                labels, term, info, section) for n, term in enumerate(terms)]
        if len(terms) > 1:
            total = sp.Add(*(entry(name, assignment.lhs.indices) for name in parts))  # a 0-d gradient too
            self.ops.append(Elementwise(assignment.target, labels, expr=total))
        self.ops[-1] = self.ops[-1].with_comment(comment, section)

    def batch_sum(self, out: str, labels: tuple[str, ...], term: sp.Expr, info: TensorInfo, section: str) -> str:
        """``out = Σ_b term`` for one term ``c Σ_K body`` of a control's gradient."""
        if out != info.name:
            self.tensors[out] = replace(info, name=out)
        scale, total = sp.Integer(1), None
        for factor in sp.Mul.make_args(nested_sums(term, frozenset(self.masks))):
            if isinstance(factor, sp.Sum) and total is None:
                total = flattened_sums(factor)  # a sum times a sum: one contraction (a low-rank map's gradients)
            else:
                scale *= factor
        body, summed = (total.function, tuple(limit[0] for limit in total.limits)) if total is not None else (term, ())
        if total is None or scale.has(sp.Indexed):
            body, scale = scale * body if total is not None else body, sp.Integer(1)
        factors = sp.Mul.make_args(body)
        if all(isinstance(factor, sp.Indexed) for factor in factors):
            operands = tuple(self.operand(factor) for factor in factors)
        else:  # materialize the summand over the batch, then contract it
            self.temporaries += 1
            name = f"t{self.temporaries}"
            body_labels = (BATCH,) + labels + tuple(str(index) for index in summed)
            self.ops.append(Elementwise(name, body_labels, section=section,
                                        expr=self.hoist_sums(body, body_labels)))
            operands = (Operand(name, body_labels),)
        self.ops.append(Contraction(out, labels, section=section, operands=operands, scale=scale))
        return out

    def scatter(self, assignment: Assignment, section: str) -> None:
        """``x̄[pattern] = value``: the value per coarse node (and offset), then folded into ``x̄``."""
        target, like = assignment.target, self.shapes[assignment.target]
        if self.scatter_rows(assignment, like, section):
            return
        kept, offsets, axes, points, shapes = shifted_axes(assignment.lhs.indices)
        if len(shapes) > 1 or (shapes and any(isinstance(p, int) for p in points)):
            raise SplitformerError(f"{target}: an adjoint written at windows of different shapes, or at windows and points")
        blocks = f"{target}_blocks"
        self.formula(replace(assignment, lhs=sp.IndexedBase(blocks)[tuple(kept + offsets)]), section)
        self.ops[-1] = self.ops[-1].with_comment("the value at each coarse node and offset", section)
        labels = (BATCH,) + tuple(str(index) for index in self.program.tensors[like].indices)
        if shapes:
            (size, stride, padding), = shapes
            op = Fold(target, labels, source=blocks, like=like, axes=tuple(axes), size=size, stride=stride,
                      padding=padding)
        else:
            op = Place(target, labels, source=blocks, like=like, index=tuple(points))
        self.ops.append(op.with_comment(self.comment(assignment), section))

    def scatter_rows(self, assignment: Assignment, like: str, section: str) -> bool:
        """``x̄[o + N_2 p + q, l] = value`` (the adjoint of a ``Rows`` view): the value per grid point,
        written back at those token nodes (``PlaceRows``); whether it was one."""
        rows = [(axis, flattened_index(index)) for axis, index in enumerate(assignment.lhs.indices)
                if not isinstance(index, sp.Idx) and not index.is_Integer]
        if len(rows) != 1 or rows[0][1] is None:
            return False
        (axis, (offset, atoms)), = rows
        kept = [index for entry in assignment.lhs.indices
                for index in (atoms if not isinstance(entry, sp.Idx) else (entry,))]
        blocks = f"{assignment.target}_rows"
        self.formula(replace(assignment, lhs=sp.IndexedBase(blocks)[tuple(kept)]), section)
        self.ops[-1] = self.ops[-1].with_comment("the value at each grid point", section)
        labels = (BATCH,) + tuple(str(index) for index in self.program.tensors[like].indices)
        self.ops.append(PlaceRows(assignment.target, labels, source=blocks, like=like, axis=axis + 1,
                                  offset=offset).with_comment(self.comment(assignment), section))
        return True


def _token_pair(op) -> bool:
    """Whether ``op`` writes an array over two token axes (``B·H·N²`` entries: a kernel)."""
    return sum(label in _TOKEN_LABELS for label in op.labels) >= 2


def _recompute_token_kernels(forward_ops: list, adjoint_ops: list) -> list:
    """Recompute in the adjoint, from their inputs, the forward arrays over two token axes.

    The attention kernel and its scores are ``N²`` per head and row; keeping ``Q``, ``K`` and
    recomputing them costs one product and one softmax, and keeps the activations at the
    size of the states (as a flash-attention backward does).
    """
    producers = {name: op for op in forward_ops for name in op.writes()}
    needed = [name for name in dict.fromkeys(n for op in adjoint_ops for n in op.reads())
              if name in producers and _token_pair(producers[name])]
    chosen: list = []

    def visit(name: str) -> None:
        op = producers[name]
        if op in chosen:
            return
        for read in op.reads():
            if read in producers and _token_pair(producers[read]):
                visit(read)
        chosen.append(op)

    for name in needed:
        visit(name)
    order = {id(op): position for position, op in enumerate(forward_ops)}
    recomputed = [replace(op, section=f"recomputed from the kept arrays: {op.section}")
                  for op in sorted(chosen, key=lambda op: order[id(op)])]
    if not recomputed:
        return adjoint_ops
    # just before the first adjoint statement that reads them, so they live no longer than needed
    names = {name for op in recomputed for name in op.writes()}
    first = next(position for position, op in enumerate(adjoint_ops) if names & set(op.reads()))
    return adjoint_ops[:first] + recomputed + adjoint_ops[first:]


def _refuse_attention(module: Module, forward_ops: list, read: set[str], passes) -> list:
    """The forward's attention fused again once the adjoint recomputes its kernel (if the pass is on)."""
    from .passes import fused_attention

    if fused_attention not in passes:
        return forward_ops
    fused = fused_attention(replace(module, ops=forward_ops)).ops
    written = {name for op in fused for name in op.writes()}
    kept = {name for op in forward_ops for name in op.writes()} & read
    return fused if kept <= written else forward_ops


def lower_adjoint(adjoint: Adjoint, passes=None) -> Backward:
    """Lower forward and adjoint together, run the passes, split them."""
    from .passes import DEFAULT, run_passes

    lowering = AdjointLowering(adjoint)
    program = lowering.program
    for record in program.records:
        lowering.record(record.assignments, record.title)
    module = Module(program.name, lowering.tensors, lowering.ops, program.output,
                    inputs=program.inputs, constants=program.constants)
    module = run_passes(module, DEFAULT if passes is None else passes)
    forward_ops = [op for op in module.ops if not op.section.startswith(ADJOINT_SECTION)]
    adjoint_ops = [op for op in module.ops if op.section.startswith(ADJOINT_SECTION)]
    written = {name for op in forward_ops for name in op.writes()} | {"u0", "chi"}
    # a saved forward array is never updated in place by the adjoint (it may be needed again)
    adjoint_ops = [replace(op, reuse=None) if isinstance(op, Elementwise) and op.reuse in written else op
                   for op in adjoint_ops]
    adjoint_ops = [with_dtype_of(op, adjoint.seed) for op in _recompute_token_kernels(forward_ops, adjoint_ops)]
    read, produced = set(), set()  # what the adjoint reads before producing it itself
    for op in adjoint_ops:
        read |= set(op.reads()) - produced
        produced |= set(op.writes())
    forward_ops = _refuse_attention(module, forward_ops, read, DEFAULT if passes is None else passes)
    saved = [name for name in dict.fromkeys(name for op in [*forward_ops] for name in op.writes())
             if name in read]
    saved = [name for name in ("u0", *(field.name for field in differentiated_inputs(module))) if name in read] + saved
    arguments = {field.name: field.argument for field in program.inputs}
    gradients = {}
    for name, bar in adjoint.gradients.items():
        tensor = program.tensors[name]
        gradients["u" if tensor.role == "input" else arguments.get(name, tensor.parameter)] = bar
    return Backward(
        forward=replace(module, ops=forward_ops, output=program.output),
        adjoint=replace(module, ops=adjoint_ops, output=adjoint.gradients.get("u0", "")),
        saved=saved, seed=adjoint.seed, gradients=gradients, symbolic=adjoint,
    )


def lower_stage_adjoint(adjoint: Adjoint, forward: Module, input_name: str) -> Backward:
    """The adjoint of a network program lowered after its forward (``forward``, the program's own
    lowering): the forward statements the adjoint reads, then the adjoint, from the costate of the
    output to that of ``input_name`` and the gradients of the controls."""
    lowering = AdjointLowering(adjoint, forward.tensors, network=True)
    for record in adjoint.records:
        lowering.record(record.assignments, record.title)
    adjoint_module = Module(adjoint.forward.name, lowering.tensors, lowering.ops, adjoint.gradients.get(input_name, ""))
    read = {name for op in adjoint_module.ops for name in op.reads()}
    producers = {name: op for op in forward.ops for name in op.writes()}
    needed, stack = [], [name for name in read if name in producers]
    while stack:
        op = producers[stack.pop()]
        if op not in needed:
            needed.append(op)
            stack.extend(name for name in op.reads() if name in producers)
    forward_ops = [op for op in forward.ops if op in needed]
    tensors = lowering.program.tensors
    gradients = {tensors[name].parameter if tensors[name].role == "param" else name: bar
                 for name, bar in adjoint.gradients.items()}
    saved = [name for op in forward_ops for name in op.writes() if name in read]
    return Backward(replace(forward, ops=forward_ops), adjoint_module, saved, adjoint.seed, gradients, adjoint)
